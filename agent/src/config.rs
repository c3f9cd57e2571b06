//! `agent.toml`: where to sync from, where to, and with what identity.
//!
//! Unknown keys are refused, so a typo never silently becomes a default. `etc/agent.toml` lists
//! every key at its default and a test parses it. TLS material comes either as explicit
//! `ca`/`cert`/`key`/`crl` paths or as a Puppet ssldir plus certname (Puppet's layout, so a node
//! that already runs Puppet can reuse its certificate).
//!
//! Parse, then resolve: [`AgentConfig`] is the file as written; [`AgentConfig::load`] checks it
//! once and keeps every value in working form ([`AgentFile`]: the ignore globs and the loader
//! table compiled, the constraints parsed, the servers and the environment checked), which
//! `settings.rs` resolves with the command line and puppet.conf and nothing downstream parses
//! again. `[load]` and `[[loader]]` are `loaders.rs`'s, `[facts]` is `facts.rs`'s.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::config::{ConfigFile, RelativeTo};
use pluginsync_common::envname::EnvName;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::tls::SslDirPaths;
use serde::Deserialize;

use crate::loaders::{LoadConfig, LoaderConfig, LoaderTable};

mod check;
pub mod switch;

use check::destinations_apart;
pub use check::{ServerError, environment, real_path, servers, validate_server};
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

/// `[tls]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// CA bundle the master's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// This node's certificate.
    pub cert: Option<PathBuf>,
    /// This node's private key.
    pub key: Option<PathBuf>,
    /// CRL bundle checked against the master's certificate.
    pub crl: Option<PathBuf>,
    /// A Puppet ssldir (`certs/ca.pem`, `certs/<certname>.pem`,
    /// `private_keys/<certname>.pem`, `crl.pem`), instead of the four paths.
    pub ssldir: Option<PathBuf>,
    /// The certname of this node in `ssldir`.
    pub certname: Option<String>,
    /// Warn this long before this node's certificate expires (default 30
    /// days; docs/tls.md#certificate-checks).
    #[serde(default, with = "humantime_serde")]
    pub cert_expiry_warning: Option<Duration>,
}

/// Default of `[tls] cert_expiry_warning`: 30 days.
pub const DEFAULT_CERT_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// TLS files after resolving `ssldir`/`certname`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle.
    pub ca: PathBuf,
    /// Client certificate.
    pub cert: PathBuf,
    /// Client key.
    pub key: PathBuf,
    /// Optional CRL.
    pub crl: Option<PathBuf>,
    /// Warn this long before `cert` expires.
    pub cert_expiry_warning: Duration,
}

/// The whole agent config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Masters, tried in this order; unset: puppet.conf's, else
    /// [`DEFAULT_SERVER`] (`settings.rs` resolves it).
    #[serde(default)]
    pub servers: Option<Vec<String>>,
    /// The environment to sync; unset: puppet.conf's, else [`DEFAULT_ENVIRONMENT`].
    #[serde(default)]
    pub environment: Option<String>,
    /// Puppet's settings file read for what this file leaves unset
    /// (docs/agent.md#on-a-puppet-node); unset: the first that exists of
    /// [`DEFAULT_PUPPET_CONFS`]; `""`: none.
    #[serde(default)]
    pub puppet_conf: Option<PathBuf>,
    /// Where the environment comes from: this config (`"config"`) or the
    /// servers' node endpoint (`"server"`, docs/protocol.md §4.10).
    #[serde(default)]
    pub environment_source: EnvironmentSource,
    /// Destination of the `plugins` mount.
    #[serde(default = "default_libdir")]
    pub libdir: PathBuf,
    /// Destination of the `pluginfacts` mount; unset: `<vardir>/facts.d`
    /// ([`default_factsdir`]); `""`: no pluginfacts pass.
    #[serde(default)]
    pub factsdir: Option<PathBuf>,
    /// State: the run lock and the last report.
    #[serde(default = "default_vardir")]
    pub vardir: PathBuf,
    /// Basename globs never synced, purged or descended into (Puppet's
    /// `pluginsignore`, with its fnmatch semantics).
    #[serde(default = "default_ignore")]
    pub ignore: Vec<String>,
    /// Deadline for the whole run, retries and failover included.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts per server before failing over to the next one.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Downloads in flight at once.
    #[serde(default = "default_parallel")]
    pub parallel_downloads: usize,
    /// The removal guard (docs/agent.md#the-removal-guard): a run that would
    /// remove more than this percentage of a destination's files refuses
    /// and changes nothing, unless `--allow-mass-removal`; 100 turns it off.
    #[serde(default = "default_max_removal_percent")]
    pub max_removal_percent: u8,
    /// One generation per run where a master serves them (docs/protocol.md §4.11); unset: yes.
    pub generations: Option<bool>,
    /// TLS identity and trust.
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
    #[serde(default)]
    pub switch: switch::SwitchConfig,
    /// Fact health (docs/loading.md#fact-health), kept in `load.facts`.
    #[serde(default)]
    pub facts: crate::facts::FactsConfig,
    /// The top-level keys the file sets (`config` tells a file's value from a default).
    #[serde(skip)]
    pub keys: BTreeSet<String>,
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

fn default_libdir() -> PathBuf {
    "/var/lib/pluginsync/lib".into()
}
fn default_vardir() -> PathBuf {
    "/var/lib/pluginsync".into()
}

/// `factsdir` when agent.toml leaves it unset: `<vardir>/facts.d`, as
/// Puppet's `pluginfactdest` is `$vardir/facts.d`, so external facts are
/// synced by default as Puppet's pluginsync syncs them
/// (docs/agent.md#configuration). The agent's own vardir, not Puppet's: like `libdir`, it is a
/// directory of pluginsync's, which the agent unit may write and Puppet's
/// own pluginsync does not purge; puppet.conf's `pluginfactdest` is not
/// read, for the same reasons.
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
fn default_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_retries() -> u32 {
    3
}
/// Default of `max_removal_percent`: a run may take away at most half of a
/// destination's files (rsync's `--max-delete`, as a share).
pub const DEFAULT_MAX_REMOVAL_PERCENT: u8 = 50;

fn default_max_removal_percent() -> u8 {
    DEFAULT_MAX_REMOVAL_PERCENT
}

/// `parallel_downloads` when the config names none; also the agent's idle
/// connections kept per server.
pub const DEFAULT_PARALLEL_DOWNLOADS: usize = 16;

fn default_parallel() -> usize {
    DEFAULT_PARALLEL_DOWNLOADS
}

/// agent.toml in working form: every value checked once, when the file is
/// loaded, and kept as the run uses it (ripgrep's low-level arguments
/// turned into high-level ones): the servers checked, the environment an
/// [`EnvName`], the ignore globs and the loaders compiled, the constraints
/// parsed, the TLS files resolved when `[tls]` names them. `settings.rs`
/// lays the command line over it and puppet.conf under it.
#[derive(Debug, Clone)]
pub struct AgentFile {
    /// `servers`, each `https://host[:port]` without a trailing slash.
    pub servers: Option<Vec<String>>,
    /// `environment`.
    pub environment: Option<EnvName>,
    /// `environment_source`.
    pub environment_source: EnvironmentSource,
    /// `puppet_conf` (`""`: none).
    pub puppet_conf: Option<PathBuf>,
    /// `libdir`.
    pub libdir: PathBuf,
    /// `factsdir` (its default when unset), neither inside `libdir` nor
    /// around it; `None`: no pluginfacts pass (`factsdir = ""`).
    pub factsdir: Option<PathBuf>,
    /// `vardir`.
    pub vardir: PathBuf,
    /// `ignore`, compiled.
    pub ignore: IgnoreSet,
    /// `timeout`.
    pub timeout: Duration,
    /// `retries`.
    pub retries: u32,
    /// `parallel_downloads`, at least 1.
    pub parallel_downloads: usize,
    /// `max_removal_percent`, at most 100.
    pub max_removal_percent: u8,
    /// `generations`.
    pub generations: bool,
    /// `[tls]`.
    pub tls: TlsSource,
    /// `[plugins] source_permissions`.
    pub plugins_permissions: SourcePermissions,
    /// `[pluginfacts] source_permissions`.
    pub pluginfacts_permissions: SourcePermissions,
    /// `[load]` (its constraints are parsed into `loaders`).
    pub load: LoadConfig,
    /// `[[loader]]` and `[load.constraints]`, compiled.
    pub loaders: LoaderTable,
    /// `[metrics] textfile`.
    pub metrics_textfile: Option<PathBuf>,
    /// `[puppet_lock]`.
    pub puppet_lock: crate::lock::PuppetLockConfig,
    /// `[switch]`.
    pub switch: switch::SwitchConfig,
    /// The top-level keys the file sets.
    pub keys: BTreeSet<String>,
}

/// Where the TLS files come from, as `[tls]` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// `ca`, `cert`, `key` and maybe `crl`, named.
    Files(TlsFiles),
    /// A Puppet ssldir and a certname: `[tls]`'s when set, else
    /// puppet.conf's, else Puppet's defaults (`settings.rs`).
    SslDir {
        /// `[tls] ssldir`.
        ssldir: Option<PathBuf>,
        /// `[tls] certname`.
        certname: Option<String>,
        /// `[tls] cert_expiry_warning`, or its default.
        cert_expiry_warning: Duration,
    },
}

impl AgentConfig {
    /// Reads, parses and checks `path`, into working values.
    pub fn load(path: &Path) -> Result<AgentFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)?.compile()
    }

    /// Parses TOML; relative paths are relative to the config's directory.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut config: Self = pluginsync_common::config::parse(text, path)?;
        config.load.facts = config.facts.clone();
        config.keys = toml::from_str::<toml::Table>(text)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        Ok(config)
    }

    /// Checks every value of the file, alone and across fields, and keeps
    /// each in the form the run uses ([`servers`] and [`environment`] are
    /// the rules the command line's values go through too, in
    /// `settings.rs`). The first problem, in the file's order, is the error.
    pub fn compile(&self) -> Result<AgentFile, ConfigError> {
        let servers = self.servers.as_deref().map(servers).transpose()?;
        let environment = self.environment.as_deref().map(environment).transpose()?;
        if self.max_removal_percent > 100 {
            return Err(ConfigError::Invalid(format!(
                "max_removal_percent must be between 0 and 100, not {}",
                self.max_removal_percent
            )));
        }
        let ignore =
            IgnoreSet::new(&self.ignore).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let factsdir = self.factsdir()?;
        let loaders = LoaderTable::compile(&self.loaders, &self.load.constraints)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.parallel_downloads == 0 {
            return Err(ConfigError::Invalid(
                "parallel_downloads must be at least 1".into(),
            ));
        }
        let tls = self.tls_source()?;
        Ok(AgentFile {
            servers,
            environment,
            environment_source: self.environment_source,
            puppet_conf: self.puppet_conf.clone(),
            libdir: self.libdir.clone(),
            factsdir,
            vardir: self.vardir.clone(),
            ignore,
            timeout: self.timeout,
            retries: self.retries,
            parallel_downloads: self.parallel_downloads,
            max_removal_percent: self.max_removal_percent,
            generations: self.generations.unwrap_or(true),
            tls,
            plugins_permissions: self.plugins.source_permissions,
            pluginfacts_permissions: self.pluginfacts.source_permissions,
            load: self.load.clone(),
            loaders,
            metrics_textfile: self.metrics.textfile.clone(),
            puppet_lock: self.puppet_lock.clone(),
            switch: self.switch.clone(),
            keys: self.keys.clone(),
        })
    }

    /// The pluginfacts destination: `factsdir`, else [`default_factsdir`];
    /// `None` for `factsdir = ""`. It must be apart from `libdir`; a
    /// default that is not says how to set it.
    fn factsdir(&self) -> Result<Option<PathBuf>, ConfigError> {
        let (factsdir, defaulted) = match &self.factsdir {
            Some(f) if f.as_os_str().is_empty() => return Ok(None),
            Some(f) => (f.clone(), false),
            None => (default_factsdir(&self.vardir), true),
        };
        match destinations_apart(&self.libdir, &factsdir) {
            Err(ConfigError::Invalid(e)) if defaulted => Err(ConfigError::Invalid(format!(
                "{e} (factsdir is unset, so <vardir>/facts.d: set factsdir, or factsdir = \"\" for no pluginfacts pass)"
            ))),
            other => other.map(|()| Some(factsdir)),
        }
    }

    /// `[tls]`: the files when it names them explicitly (`ca`/`cert`/`key`
    /// and maybe `crl`), else an ssldir and a certname, maybe unset
    /// (`settings.rs`: then puppet.conf's, else Puppet's defaults).
    fn tls_source(&self) -> Result<TlsSource, ConfigError> {
        let t = &self.tls;
        let cert_expiry_warning = t.cert_expiry_warning.unwrap_or(DEFAULT_CERT_EXPIRY_WARNING);
        let explicit = t.ca.is_some() || t.cert.is_some() || t.key.is_some() || t.crl.is_some();
        if !explicit {
            return Ok(TlsSource::SslDir {
                ssldir: t.ssldir.clone(),
                certname: t.certname.clone(),
                cert_expiry_warning,
            });
        }
        if t.ssldir.is_some() || t.certname.is_some() {
            return Err(ConfigError::Invalid(
                "[tls] takes either ssldir + certname or ca/cert/key/crl, not both".into(),
            ));
        }
        match (&t.ca, &t.cert, &t.key) {
            (Some(ca), Some(cert), Some(key)) => Ok(TlsSource::Files(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: t.crl.clone(),
                cert_expiry_warning,
            })),
            _ => Err(ConfigError::Invalid(
                "[tls] needs ca, cert and key (or ssldir and certname)".into(),
            )),
        }
    }
}

/// The TLS files of a Puppet ssldir for `certname` (Puppet's layout:
/// `certs/ca.pem`, `certs/<certname>.pem`, `private_keys/<certname>.pem`,
/// `crl.pem` when present).
pub fn ssldir_files(ssldir: &Path, certname: &str, cert_expiry_warning: Duration) -> TlsFiles {
    let p = SslDirPaths::new(ssldir, certname);
    TlsFiles {
        ca: p.ca,
        cert: p.cert,
        key: p.key,
        crl: p.crl.exists().then_some(p.crl),
        cert_expiry_warning,
    }
}

impl ConfigFile for AgentConfig {
    fn resolve_paths(&mut self, base: &RelativeTo) {
        let fix = |p: &mut PathBuf| base.fix(p);
        fix(&mut self.libdir);
        fix(&mut self.vardir);
        // `factsdir = ""` means no pluginfacts pass: it stays empty.
        if let Some(f) = self.factsdir.as_mut().filter(|p| !p.as_os_str().is_empty()) {
            fix(f);
        }
        if let Some(t) = self.metrics.textfile.as_mut() {
            fix(t);
        }
        // `puppet_conf = ""` and `[puppet_lock] file = ""` mean none: they stay empty.
        for p in [self.puppet_conf.as_mut(), self.puppet_lock.file.as_mut()]
            .into_iter()
            .flatten()
            .filter(|p| !p.as_os_str().is_empty())
        {
            fix(p);
        }
        for p in [
            &mut self.tls.ca,
            &mut self.tls.cert,
            &mut self.tls.key,
            &mut self.tls.crl,
            &mut self.tls.ssldir,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.compile().map(drop)
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
        assert_eq!(c.environment_source, EnvironmentSource::Config);
        assert_eq!(c.puppet_conf, None);
        assert_eq!(c.ignore, vec![".svn", "CVS", ".git", ".hg"]);
        assert_eq!(c.plugins.source_permissions, SourcePermissions::Use);
        assert_eq!(c.pluginfacts.source_permissions, SourcePermissions::Use);
        assert!(c.factsdir.is_none());
        assert!(matches!(
            c.compile().unwrap().tls,
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
            c.compile()
                .unwrap_err()
                .to_string()
                .contains("must start with https://")
        );
        let c = parse(&format!("environment = \"bad-name\"\n{MIN}")).unwrap();
        assert!(c.compile().unwrap_err().to_string().contains("bad-name"));
        let c = parse("[tls]\nca = \"/ca.pem\"\n").unwrap();
        assert!(
            c.compile()
                .unwrap_err()
                .to_string()
                .contains("needs ca, cert and key")
        );
        let c = parse(&format!("libdir = \"/a\"\nfactsdir = \"/a/facts\"\n{MIN}")).unwrap();
        assert!(
            c.compile()
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
        let e = c.compile().unwrap_err();
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
        assert_eq!(c.timeout, default_timeout());
        assert_eq!(c.retries, default_retries());
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
        assert!(c.keys.is_empty(), "{:?}", c.keys);
        let file = c.compile().unwrap();
        assert_eq!(
            file.tls,
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

    /// External facts are synced by default, into `<vardir>/facts.d`, as
    /// Puppet syncs them into `$vardir/facts.d`; `factsdir = ""` turns the
    /// pass off.
    #[test]
    fn factsdir_defaults_to_the_vardirs_facts_d_and_empty_turns_it_off() {
        let c = parse(&format!("vardir = \"/srv/ps\"\n{MIN}")).unwrap();
        assert_eq!(
            c.compile().unwrap().factsdir,
            Some(PathBuf::from("/srv/ps/facts.d"))
        );
        let c = parse(MIN).unwrap().compile().unwrap();
        assert_eq!(
            c.factsdir,
            Some(PathBuf::from("/var/lib/pluginsync/facts.d"))
        );
        let c = parse(&format!("factsdir = \"\"\n{MIN}")).unwrap();
        assert_eq!(c.compile().unwrap().factsdir, None);
        let c = parse(&format!("factsdir = \"f\"\n{MIN}")).unwrap();
        assert_eq!(
            c.compile().unwrap().factsdir,
            Some(PathBuf::from("/etc/pluginsync/f"))
        );
        // A default that falls inside the libdir says how to set it.
        let c = parse(&format!("vardir = \"/srv/ps\"\nlibdir = \"/srv\"\n{MIN}")).unwrap();
        let e = c.compile().unwrap_err().to_string();
        assert!(
            e.contains("contain each other") && e.contains("factsdir = \"\""),
            "{e}"
        );
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
            c.libdir = root.join("lib");
            c.factsdir = Some(facts.to_owned());
            c.compile()
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
