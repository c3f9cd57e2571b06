//! `agent.toml`: where to sync from, where to, and with what identity.
//!
//! Unknown keys are refused, so a typo never silently becomes a default. `etc/agent.toml` lists
//! every key at its default and a test parses it. TLS material comes either as explicit
//! `ca`/`cert`/`key`/`crl` paths or as a Puppet ssldir plus certname (`config/tls.rs`).
//!
//! Each setting is declared once, in [`AgentConfig`]: one layer of the settings, every value
//! optional (uv's `Combine`, ripgrep's low-level arguments). agent.toml fills it through serde,
//! the command line's from clap (`settings/layers.rs`), puppet.conf from what it says (`settings/layers.rs`);
//! `settings.rs` resolves the layers once, the first that sets a value winning, into `Settings`,
//! which the run reads. [`AgentConfig::load`] checks the file's own values when it is read (a bad
//! file is a config error before anything else); the command line's and puppet.conf's are
//! checked by the same rules where they are resolved. `[load]` and `[[loader]]` are
//! `loaders.rs`'s, `[facts]` is `facts.rs`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::config::{ConfigFile, RelativeTo};
use pluginsync_common::ignore::IgnoreSet;
use serde::Deserialize;

use crate::loaders::{LoadConfig, LoaderConfig, LoaderTable};

mod check;
pub mod switch;
pub mod tls;

pub use check::apart;
pub use check::{ServerError, environment, real_path, servers, validate_server};
pub use tls::{DEFAULT_CERT_EXPIRY_WARNING, TlsConfig, TlsFiles, TlsSource, ssldir_files};
/// The default config path.
pub const DEFAULT_CONFIG: &str = "/etc/pluginsync/agent.toml";

pub use pluginsync_common::config::ConfigError;

/// `source_permissions` of one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourcePermissions {
    /// Apply the listing's permission bits (`mode & 0o777`) to files and directories, on every run.
    #[default]
    Use,
    /// New files get 0644 and new directories 0755; existing modes are left
    /// alone (Puppet's behaviour for plugins).
    Ignore,
}

/// Per-destination settings (`[plugins]`, `[pluginfacts]`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DestConfig {
    /// How modes are carried over.
    #[serde(default)]
    pub source_permissions: SourcePermissions,
}

/// `environment_source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EnvironmentSource {
    /// The configured environment (command line, agent.toml, puppet.conf).
    #[default]
    Config,
    /// The environment the servers' node classifier assigns, asked with
    /// `GET /puppet/v3/node/<certname>` as Puppet's agent does; the
    /// configured one when the node endpoint is not served.
    Server,
}

/// The puppet.conf files looked for, in order, when `puppet_conf` is unset:
/// Puppet's AIO packages, then Debian's.
pub const DEFAULT_PUPPET_CONFS: [&str; 2] = [
    "/etc/puppetlabs/puppet/puppet.conf",
    "/etc/puppet/puppet.conf",
];

/// The master when neither agent.toml nor puppet.conf names one (Puppet's
/// `server` default, on `serverport` 8140).
pub const DEFAULT_SERVER: &str = "https://puppet:8140";

/// The environment when neither agent.toml nor puppet.conf names one.
pub const DEFAULT_ENVIRONMENT: &str = "production";

/// `[trust]` (docs/agent.md#signed-generations), declared beside what reads it.
pub use crate::trust::TrustConfig;

/// One layer of the settings, every setting optional (unset: a lower
/// layer's, else its default): agent.toml as written, or what the command
/// line or puppet.conf says.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Masters, tried in this order; unset: puppet.conf's, else
    /// [`DEFAULT_SERVER`].
    pub servers: Option<Vec<String>>,
    /// The environment to sync; unset: puppet.conf's, else [`DEFAULT_ENVIRONMENT`].
    pub environment: Option<String>,
    /// Puppet's settings file read for what this file leaves unset
    /// (docs/agent.md#on-a-puppet-node); unset: the first that exists of
    /// [`DEFAULT_PUPPET_CONFS`]; `""`: none.
    pub puppet_conf: Option<PathBuf>,
    /// Where the environment comes from: this config (`"config"`, the
    /// default) or the servers' node endpoint (`"server"`, docs/protocol.md §4.10).
    pub environment_source: Option<EnvironmentSource>,
    /// Destination of the `plugins` mount; unset: puppet.conf's `libdir`
    /// when agent.toml names no destination, else [`DEFAULT_LIBDIR`].
    pub libdir: Option<PathBuf>,
    /// Destination of the `pluginfacts` mount; unset: puppet.conf's
    /// `pluginfactdest` when agent.toml names no destination, else
    /// `<vardir>/facts.d` ([`default_factsdir`]); `""`: no pluginfacts pass.
    pub factsdir: Option<PathBuf>,
    /// State: the run lock and the last report; unset: [`DEFAULT_VARDIR`].
    pub vardir: Option<PathBuf>,
    /// Basename globs never synced, purged or descended into (Puppet's
    /// `pluginsignore`, with its fnmatch semantics); unset: [`default_ignore`].
    pub ignore: Option<Vec<String>>,
    /// Deadline for the whole run, retries and failover included; unset:
    /// [`DEFAULT_TIMEOUT`].
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Attempts per server before failing over to the next one; unset:
    /// [`DEFAULT_RETRIES`].
    pub retries: Option<u32>,
    /// Downloads in flight at once; unset: [`DEFAULT_PARALLEL_DOWNLOADS`].
    pub parallel_downloads: Option<usize>,
    /// The removal guard (docs/agent.md#the-removal-guard): a run that would
    /// remove more than this percentage of a destination's files refuses
    /// and changes nothing, unless `--allow-mass-removal`; 100 turns it
    /// off; unset: [`DEFAULT_MAX_REMOVAL_PERCENT`].
    pub max_removal_percent: Option<u8>,
    /// One generation per run where a master serves them (docs/protocol.md §4.11); unset: yes.
    pub generations: Option<bool>,
    /// TLS identity and trust (`--certname` sets `certname`).
    #[serde(default)]
    pub tls: TlsConfig,
    /// The `plugins` destination.
    #[serde(default)]
    pub plugins: DestConfig,
    /// The `pluginfacts` destination.
    #[serde(default)]
    pub pluginfacts: DestConfig,
    /// Loading changed plugins after a sync.
    #[serde(default)]
    pub load: LoadConfig,
    /// Loaders, first match wins for each changed file.
    #[serde(default, rename = "loader")]
    pub loaders: Vec<LoaderConfig>,
    /// Metrics for node_exporter's textfile collector.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Puppet's run lock, waited for before a commit.
    #[serde(default)]
    pub puppet_lock: crate::lock::PuppetLockConfig,
    /// The switch of generations (docs/agent.md#generations-and-rollback).
    pub switch: Option<switch::SwitchConfig>,
    /// Fact health (docs/loading.md#fact-health), kept in `load.facts`.
    pub facts: Option<crate::facts::FactsConfig>,
    /// Signed generations (docs/agent.md#signed-generations); unset: off.
    pub trust: Option<TrustConfig>,
}

/// `[metrics]` (docs/operating.md#agent-metrics).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where every run (not `--noop`) writes its metrics, atomically, e.g.
    /// `/var/lib/prometheus/node-exporter/pluginsync.prom`; unset: off.
    #[serde(default)]
    pub textfile: Option<PathBuf>,
}

/// Default of `libdir` where puppet.conf does not give Puppet's.
pub const DEFAULT_LIBDIR: &str = "/var/lib/pluginsync/lib";
/// Default of `vardir`.
pub const DEFAULT_VARDIR: &str = "/var/lib/pluginsync";

/// `factsdir` when no layer sets it: `<vardir>/facts.d`, as Puppet's
/// `pluginfactdest` is `$vardir/facts.d`, so external facts are synced by
/// default as Puppet's pluginsync syncs them (docs/agent.md#configuration).
pub fn default_factsdir(vardir: &Path) -> PathBuf {
    vardir.join("facts.d")
}
/// Puppet's `pluginsignore` default.
pub fn default_ignore() -> Vec<String> {
    pluginsync_common::DEFAULT_IGNORE
        .iter()
        .map(|s| s.to_string())
        .collect()
}
/// Default of `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default of `retries`.
pub const DEFAULT_RETRIES: u32 = 3;
/// Default of `max_removal_percent`: a run may take away at most half of a
/// destination's files (rsync's `--max-delete`, as a share).
pub const DEFAULT_MAX_REMOVAL_PERCENT: u8 = 50;

/// `parallel_downloads` when the config names none; also the agent's idle
/// connections kept per server.
pub const DEFAULT_PARALLEL_DOWNLOADS: usize = 16;

impl AgentConfig {
    /// Reads, parses and checks `path`.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::parse(&text, path)?;
        config.check()?;
        Ok(config)
    }

    /// Parses TOML; relative paths are relative to the config's directory.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut config: Self = pluginsync_common::config::parse(text, path)?;
        config.load.facts = config.facts.clone().unwrap_or_default();
        Ok(config)
    }

    /// Checks every value the file sets, alone and across fields
    /// ([`servers`] and [`environment`] are the rules the command line's
    /// and puppet.conf's values go through too, in `settings.rs`). The
    /// first problem, in the file's order, is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.servers.as_deref().map(servers).transpose()?;
        self.environment.as_deref().map(environment).transpose()?;
        if let Some(p) = self.max_removal_percent.filter(|p| *p > 100) {
            return Err(ConfigError::Invalid(format!(
                "max_removal_percent must be between 0 and 100, not {p}"
            )));
        }
        self.ignore_set()?;
        self.destinations_apart()?;
        self.loader_table()?;
        if self.parallel_downloads == Some(0) {
            return Err(ConfigError::Invalid(
                "parallel_downloads must be at least 1".into(),
            ));
        }
        self.tls.source().map(drop)
    }

    /// `ignore` (or its default), compiled.
    pub fn ignore_set(&self) -> Result<IgnoreSet, ConfigError> {
        let globs = self.ignore.clone().unwrap_or_else(default_ignore);
        IgnoreSet::new(&globs).map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// `[[loader]]` and `[load.constraints]`, compiled.
    pub fn loader_table(&self) -> Result<LoaderTable, ConfigError> {
        LoaderTable::compile(&self.loaders, &self.load.constraints)
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// The file's destinations, when it names one, must be apart
    /// (each unset one at its default); a default `factsdir` that is not
    /// says how to set it. Puppet's, when the file names none, are
    /// checked where they are resolved (`settings.rs`).
    fn destinations_apart(&self) -> Result<(), ConfigError> {
        let vardir = self.vardir.clone().unwrap_or_else(|| DEFAULT_VARDIR.into());
        let libdir = self.libdir.clone().unwrap_or_else(|| DEFAULT_LIBDIR.into());
        let (factsdir, defaulted) = match &self.factsdir {
            Some(f) if f.as_os_str().is_empty() => return Ok(()),
            Some(f) => (f.clone(), false),
            None => (default_factsdir(&vardir), true),
        };
        apart(&libdir, &factsdir, defaulted)
    }
}

impl ConfigFile for AgentConfig {
    fn resolve_paths(&mut self, base: &RelativeTo) {
        let fix = |p: &mut PathBuf| base.fix(p);
        // `factsdir = ""`, `puppet_conf = ""`, `[puppet_lock] file = ""`
        // and `[facts] external_dir = ""` mean none: they stay empty.
        for p in [
            self.libdir.as_mut(),
            self.vardir.as_mut(),
            self.factsdir.as_mut(),
            self.metrics.textfile.as_mut(),
            self.puppet_conf.as_mut(),
            self.puppet_lock.file.as_mut(),
            self.trust.as_mut().map(|t| &mut t.root),
            (self.facts.as_mut()).and_then(|f| match &mut f.external_dir {
                Some(crate::facts::ExternalDir::Dir(d)) => Some(d),
                _ => None,
            }),
        ]
        .into_iter()
        .flatten()
        .filter(|p| !p.as_os_str().is_empty())
        {
            fix(p);
        }
        for p in self.tls.paths_mut().into_iter().flatten() {
            fix(p);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "servers = [\"https://puppet.example.org:8140\"]\n[tls]\nssldir = \"ssl\"\ncertname = \"node1\"\n";

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("/etc/pluginsync/agent.toml"))
    }

    #[test]
    fn defaults() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.environment, None);
        assert_eq!(c.environment_source, None);
        assert_eq!(c.puppet_conf, None);
        assert_eq!(c.ignore, None);
        assert_eq!(
            c.ignore_set().unwrap().patterns(),
            [".svn", "CVS", ".git", ".hg"]
        );
        assert_eq!(c.plugins.source_permissions, SourcePermissions::Use);
        assert_eq!(c.pluginfacts.source_permissions, SourcePermissions::Use);
        assert!(c.factsdir.is_none());
        assert!(matches!(
            c.tls.source().unwrap(),
            TlsSource::SslDir { certname: Some(ref n), .. } if n == "node1"
        ));
        let tls = ssldir_files(
            c.tls.ssldir.as_deref().unwrap(),
            "node1",
            DEFAULT_CERT_EXPIRY_WARNING,
        );
        assert_eq!(
            tls.cert,
            PathBuf::from("/etc/pluginsync/ssl/certs/node1.pem")
        );
        assert_eq!(
            tls.key,
            PathBuf::from("/etc/pluginsync/ssl/private_keys/node1.pem")
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let e = parse(&format!("{MIN}libdirr = \"/x\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("libdirr") && !e.contains('\n'), "{e}");
        let c = parse(&MIN.replace("https://puppet.example.org:8140", "http://x")).unwrap();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("must start with https://")
        );
        let c = parse(&format!("environment = \"bad-name\"\n{MIN}")).unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("bad-name"));
        let c = parse("[tls]\nca = \"/ca.pem\"\n").unwrap();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("needs ca, cert and key")
        );
        let c = parse(&format!("libdir = \"/a\"\nfactsdir = \"/a/facts\"\n{MIN}")).unwrap();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("contain each other")
        );
    }

    #[test]
    fn a_bad_constraint_is_a_config_error_naming_its_key() {
        let c = parse(&format!(
            "{MIN}[load.constraints]\nhello = \">= 1.0\"\nworld = \"=> 1\"\n"
        ))
        .unwrap();
        let e = c.validate().unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "invalid config: [load.constraints] world = '=> 1': unknown operator '=>'"
        );
    }

    #[test]
    fn example_config_parses_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/agent.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = AgentConfig::parse(&text, &path).unwrap();
        assert_eq!((c.timeout, c.retries), (None, None));
        // Uncomment every commented key and parse again: each must exist.
        let all: String = text
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.contains(" = ") || r.starts_with('['))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let all = AgentConfig::parse(&all, &path).unwrap_or_else(|e| panic!("{e}\n{all}"));
        assert!(all.factsdir.is_some());
        // The values the file lists are the defaults.
        assert_eq!(all.timeout, Some(DEFAULT_TIMEOUT));
        assert_eq!(all.retries, Some(DEFAULT_RETRIES));
        assert_eq!(all.max_removal_percent, Some(DEFAULT_MAX_REMOVAL_PERCENT));
        assert_eq!(all.parallel_downloads, Some(DEFAULT_PARALLEL_DOWNLOADS));
        assert_eq!(all.puppet_lock.wait, crate::lock::DEFAULT_PUPPET_WAIT);
        assert!(all.puppet_lock.file.is_some());
    }

    /// The shipped file sets nothing, so puppet.conf and the defaults
    /// decide (`settings.rs`); a key appended at its end, as an operator
    /// appends `servers`, is a top-level key.
    #[test]
    fn example_config_sets_nothing_and_takes_an_appended_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/agent.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = AgentConfig::parse(&text, &path).unwrap();
        let empty = AgentConfig::parse("", &path).unwrap();
        assert_eq!(format!("{c:?}"), format!("{empty:?}"));
        assert_eq!(
            c.tls.source().unwrap(),
            TlsSource::SslDir {
                ssldir: None,
                certname: None,
                cert_expiry_warning: DEFAULT_CERT_EXPIRY_WARNING
            }
        );
        let appended = format!("{text}servers = [\"https://puppet.example.org:8140\"]\n");
        let c = AgentConfig::parse(&appended, &path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.servers.as_deref(),
            Some(&["https://puppet.example.org:8140".to_owned()][..])
        );
    }

    /// `[trust]`: a relative `root` is the config directory's, `grace`
    /// defaults to an hour, a table without `root` is refused.
    #[test]
    fn trust_root_is_relative_to_the_config_and_required() {
        let c = parse("[trust]\nroot = \"trust/root.json\"\n").unwrap();
        let t = c.trust.unwrap();
        assert_eq!(t.root, Path::new("/etc/pluginsync/trust/root.json"));
        assert_eq!(t.grace, crate::trust::DEFAULT_GRACE);
        let e = parse("[trust]\ngrace = \"5m\"\n").unwrap_err();
        assert!(e.to_string().contains("root"), "{e}");
        assert!(parse(MIN).unwrap().trust.is_none());
    }

    /// `[puppet_lock]`: a relative `file` is the config directory's, `""`
    /// stays empty (no check), a `wait` is a duration.
    #[test]
    fn puppet_lock_file_is_relative_to_the_config_and_empty_stays_empty() {
        let lock = |t: &str| parse(&format!("{MIN}[puppet_lock]\n{t}\n")).map(|c| c.puppet_lock);
        let c = lock("file = \"p.lock\"\nwait = \"0s\"").unwrap();
        assert_eq!(c.file, Some(PathBuf::from("/etc/pluginsync/p.lock")));
        assert_eq!(c.wait, Duration::ZERO);
        assert_eq!(lock("file = \"\"").unwrap().file, Some(PathBuf::new()));
        assert_eq!(
            parse(MIN).unwrap().puppet_lock,
            crate::lock::PuppetLockConfig::default()
        );
        assert!(lock("wait = \"soon\"").is_err());
        assert!(lock("wiat = \"1s\"").is_err());
    }

    #[test]
    fn destinations_inside_each_other_are_refused_through_dotdot_and_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        std::os::unix::fs::symlink(root.join("lib"), root.join("link")).unwrap();
        let with = |facts: &Path| {
            let mut c = parse(MIN).unwrap();
            c.libdir = Some(root.join("lib"));
            c.factsdir = Some(facts.to_owned());
            c.validate()
        };
        for inside in [
            root.join("other/../lib/facts.d"),
            root.join("link/facts.d"),
            root.join("link/./new/../facts.d"),
        ] {
            let e = with(&inside).unwrap_err().to_string();
            assert!(e.contains("must not contain each other"), "{inside:?}: {e}");
        }
        let e = with(&root.join("link")).unwrap_err().to_string();
        assert!(e.contains("must differ"), "{e}");
        with(&root.join("facts.d")).unwrap();
        with(&root.join("other/facts.d")).unwrap();
    }
}
