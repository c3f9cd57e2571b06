//! `agent.toml`: where to sync from, where to, and with what identity.
//!
//! Unknown keys are refused, so a typo never silently becomes a default.
//! `etc/agent.toml` lists every key at its default and a test parses it.
//! TLS material comes either as explicit `ca`/`cert`/`key`/`crl` paths or as
//! a Puppet ssldir plus certname (Puppet's layout, so a node that already
//! runs Puppet can reuse its certificate).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::config::{ConfigFile, RelativeTo};
use pluginsync_common::envname::EnvName;
use pluginsync_common::tls::SslDirPaths;
use serde::Deserialize;

/// The default config path.
pub const DEFAULT_CONFIG: &str = "/etc/pluginsync/agent.toml";

pub use pluginsync_common::config::ConfigError;

/// `source_permissions` of one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourcePermissions {
    /// Apply the listing's permission bits (`mode & 0o777`) to files and
    /// directories, on every run.
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
    /// The environment to sync; unset: puppet.conf's, else
    /// [`DEFAULT_ENVIRONMENT`].
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
    /// Destination of the `pluginfacts` mount; no pluginfacts pass if unset.
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
    /// The top-level keys the file sets (`pluginsync-agent config` tells
    /// a value from the file from a default).
    #[serde(skip)]
    pub keys: std::collections::BTreeSet<String>,
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

/// `[load]`: nothing is executed unless `enabled` (or `--load`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadConfig {
    /// Run loaders at all (kustomize's stance: an explicit opt-in before
    /// any plugin code runs).
    pub enabled: bool,
    /// Load failures set the 4 bit of `--detailed-exitcodes`.
    pub failures_are_errors: bool,
    /// Run once per sync when at least one file loaded, e.g.
    /// `["systemctl", "reload", "myservice"]`.
    pub after_load: Vec<String>,
    /// Deadline of `after_load` (its process group is killed then).
    #[serde(with = "humantime_serde")]
    pub after_load_timeout: Duration,
    /// Name prefix of describe plugins: `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
    pub plugin_prefix: String,
    /// Version constraints per plugin name, e.g. `hello = ">=1.0, <2"`.
    pub constraints: std::collections::BTreeMap<String, String>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            enabled: false,
            failures_are_errors: false,
            after_load: Vec::new(),
            after_load_timeout: Duration::from_secs(10),
            plugin_prefix: "pluginsync-plugin".into(),
            constraints: Default::default(),
        }
    }
}

/// How a loader loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoaderKind {
    /// Run `command` with the file's path.
    Command,
    /// Packer-style: check the name, the `_SHA256SUM` sidecar and the
    /// `describe` handshake, then register the plugin.
    Describe,
}

/// One `[[loader]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderConfig {
    /// A name for reports; defaults to the `match` glob.
    #[serde(default)]
    pub name: Option<String>,
    /// Glob on the changed file's path relative to the libdir
    /// (`*` stays within a directory, `**` crosses them).
    #[serde(rename = "match")]
    pub pattern: String,
    /// `command` or `describe`.
    pub kind: LoaderKind,
    /// The destination whose files this loader matches: `plugins` (the
    /// libdir, the default) or `pluginfacts` (the factsdir).
    #[serde(default = "default_loader_mount")]
    pub mount: pluginsync_common::protocol::Mount,
    /// For `command`: argv, with `{path}` (absolute), `{relpath}` and
    /// `{environment}` replaced.
    #[serde(default)]
    pub command: Vec<String>,
    /// Deadline of one launch; the child and its process group are killed.
    #[serde(default = "default_loader_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Launches tried before the load counts as failed; unset: 5 for
    /// `layout = "celerity"` (Celerity's launch attempt limit), else 1
    /// ([`LoaderConfig::attempts`]).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// For `describe`: run the `describe` handshake; unset: on for every
    /// layout but `kustomize`, whose exec plugins only take their
    /// configuration file ([`LoaderConfig::handshake`]).
    #[serde(default)]
    pub handshake: Option<bool>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// For `describe`: the plugin system whose file layout gives each
    /// plugin's identity and version (docs/loading.md#plugin-layouts).
    #[serde(default)]
    pub layout: Layout,
    /// For `describe`: directories relative to the libdir, searched in
    /// order; a file outside them is not loaded, and an identity held by an
    /// earlier root shadows the same identity in a later one. Empty: the
    /// whole libdir, one root.
    #[serde(default)]
    pub roots: Vec<String>,
    /// For `layout = "terraform"`: the directory (relative to the libdir)
    /// of the host program; an unversioned `terraform-provider-<name>`
    /// there is a local build, preferred over installed releases.
    #[serde(default)]
    pub host_dir: Option<String>,
}

/// How `describe` plugins are laid out and named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
    #[default]
    Packer,
    /// `terraform-provider-<name>_v<X.Y.Z>[_x<api>]` releases, in an
    /// optional `<os>_<arch>` directory, and unversioned local builds in
    /// `host_dir`.
    Terraform,
    /// Celerity's Deploy Engine:
    /// `{providers,transformers}/[<host>/]<namespace>/<name>/<version>/plugin`.
    Celerity,
    /// kustomize's exec plugins: `<apiVersion>/<lowercase kind>/<Kind>`.
    Kustomize,
}

impl LoaderConfig {
    /// Launch attempts per load: `attempts`, or the layout's default (5
    /// for Celerity, whose Deploy Engine relaunches a plugin that did not
    /// register up to 4 times; 1 otherwise).
    pub fn attempts(&self) -> u32 {
        self.attempts.unwrap_or(match self.layout {
            Layout::Celerity if self.kind == LoaderKind::Describe => 5,
            _ => 1,
        })
    }

    /// Whether a `describe` load runs the handshake: `handshake`, or on
    /// for every layout but kustomize.
    pub fn handshake(&self) -> bool {
        self.handshake.unwrap_or(self.layout != Layout::Kustomize)
    }
}

fn default_loader_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_loader_mount() -> pluginsync_common::protocol::Mount {
    pluginsync_common::protocol::Mount::Plugins
}

fn default_libdir() -> PathBuf {
    "/var/lib/pluginsync/lib".into()
}
fn default_vardir() -> PathBuf {
    "/var/lib/pluginsync".into()
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

impl AgentConfig {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::parse(&text, path)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML; relative paths are relative to the config's directory.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut config: Self = pluginsync_common::config::parse(text, path)?;
        config.keys = toml::from_str::<toml::Table>(text)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        Ok(config)
    }

    /// Checks the file: every value in it, alone and across fields
    /// ([`servers`], [`environment`] and [`AgentConfig::tls_files`] are
    /// the rules the command line's values go through too, in
    /// `settings.rs`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(s) = &self.servers {
            servers(s)?;
        }
        if let Some(e) = &self.environment {
            environment(e)?;
        }
        if self.max_removal_percent > 100 {
            return Err(ConfigError::Invalid(format!(
                "max_removal_percent must be between 0 and 100, not {}",
                self.max_removal_percent
            )));
        }
        pluginsync_common::ignore::IgnoreSet::new(&self.ignore)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if let Some(f) = &self.factsdir {
            // Compared as the filesystem resolves them: `..` and symlinks
            // must not hide one destination inside the other (each purge
            // would delete the other's files).
            let (facts, lib) = (real_path(f), real_path(&self.libdir));
            if facts == lib {
                return Err(ConfigError::Invalid(
                    "libdir and factsdir must differ".into(),
                ));
            }
            if facts.starts_with(&lib) || lib.starts_with(&facts) {
                return Err(ConfigError::Invalid(format!(
                    "libdir and factsdir must not contain each other ('{}' and '{}' resolve to '{}' and '{}')",
                    self.libdir.display(),
                    f.display(),
                    lib.display(),
                    facts.display()
                )));
            }
        }
        for (i, l) in self.loaders.iter().enumerate() {
            globset::GlobBuilder::new(&l.pattern)
                .literal_separator(true)
                .build()
                .map_err(|e| {
                    ConfigError::Invalid(format!(
                        "[[loader]] {} match '{}': {}",
                        i + 1,
                        l.pattern,
                        e.kind()
                    ))
                })?;
            for r in l.roots.iter().chain(&l.host_dir) {
                if pluginsync_common::relpath::RelPath::parse(r.trim_end_matches('/')).is_err() {
                    return Err(ConfigError::Invalid(format!(
                        "[[loader]] {}: root '{r}' must be a relative path inside the destination",
                        i + 1
                    )));
                }
            }
            if l.kind == LoaderKind::Command && l.command.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "[[loader]] {} (kind = \"command\") needs a command",
                    i + 1
                )));
            }
            if l.attempts == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "[[loader]] {}: attempts must be at least 1",
                    i + 1
                )));
            }
        }
        for (name, c) in &self.load.constraints {
            crate::plugins::Constraint::parse(c).map_err(|e| {
                ConfigError::Invalid(format!("[load.constraints] {name} = '{c}': {e}"))
            })?;
        }
        if self.parallel_downloads == 0 {
            return Err(ConfigError::Invalid(
                "parallel_downloads must be at least 1".into(),
            ));
        }
        self.tls_files()?;
        Ok(())
    }

    /// The TLS files when `[tls]` names them explicitly (`ca`/`cert`/`key`
    /// and maybe `crl`), `None` when it does not (they then come from an
    /// ssldir and a certname, `settings.rs`: `[tls]`'s, else puppet.conf's,
    /// else Puppet's defaults).
    pub fn tls_files(&self) -> Result<Option<TlsFiles>, ConfigError> {
        let t = &self.tls;
        let explicit = t.ca.is_some() || t.cert.is_some() || t.key.is_some() || t.crl.is_some();
        if !explicit {
            return Ok(None);
        }
        if t.ssldir.is_some() || t.certname.is_some() {
            return Err(ConfigError::Invalid(
                "[tls] takes either ssldir + certname or ca/cert/key/crl, not both".into(),
            ));
        }
        match (&t.ca, &t.cert, &t.key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: t.crl.clone(),
                cert_expiry_warning: t.cert_expiry_warning.unwrap_or(DEFAULT_CERT_EXPIRY_WARNING),
            })),
            _ => Err(ConfigError::Invalid(
                "[tls] needs ca, cert and key (or ssldir and certname)".into(),
            )),
        }
    }

    /// The TLS files of a Puppet ssldir for `certname` (Puppet's layout:
    /// `certs/ca.pem`, `certs/<certname>.pem`, `private_keys/<certname>.pem`,
    /// `crl.pem` when present).
    pub fn ssldir_files(&self, ssldir: &Path, certname: &str) -> TlsFiles {
        let p = SslDirPaths::new(ssldir, certname);
        TlsFiles {
            ca: p.ca,
            cert: p.cert,
            key: p.key,
            crl: p.crl.exists().then_some(p.crl),
            cert_expiry_warning: self
                .tls
                .cert_expiry_warning
                .unwrap_or(DEFAULT_CERT_EXPIRY_WARNING),
        }
    }
}

/// The masters of a run: at least one, each `https://host[:port]`
/// ([`validate_server`]); returned without trailing slashes.
pub fn servers(list: &[String]) -> Result<Vec<String>, ConfigError> {
    if list.is_empty() {
        return Err(ConfigError::Invalid(
            "servers must name at least one master".into(),
        ));
    }
    list.iter()
        .map(|s| {
            validate_server(s).map_err(ConfigError::Invalid)?;
            Ok(s.trim_end_matches('/').to_owned())
        })
        .collect()
}

/// The environment of a run, checked as Puppet names environments.
pub fn environment(name: &str) -> Result<EnvName, ConfigError> {
    name.parse::<EnvName>()
        .map_err(|e| ConfigError::Invalid(format!("environment: {e}")))
}

/// A server URL must be `https://host[:port]`, with no path.
pub fn validate_server(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("https://")
        .ok_or_else(|| format!("server '{s}' must start with https://"))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains('?') || rest.contains('@') {
        return Err(format!(
            "server '{s}' must be https://host[:port] with no path"
        ));
    }
    Ok(())
}

impl ConfigFile for AgentConfig {
    fn resolve_paths(&mut self, base: &RelativeTo) {
        let fix = |p: &mut PathBuf| base.fix(p);
        fix(&mut self.libdir);
        fix(&mut self.vardir);
        if let Some(f) = self.factsdir.as_mut() {
            fix(f);
        }
        if let Some(t) = self.metrics.textfile.as_mut() {
            fix(t);
        }
        // `puppet_conf = ""` means none: it stays empty.
        if let Some(p) = self
            .puppet_conf
            .as_mut()
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
        self.validate()
    }
}

/// `p` as the filesystem resolves it: its longest existing prefix made
/// canonical (symlinks followed), the rest applied lexically (`..` pops,
/// `.` is skipped), so paths that do not exist yet compare correctly too.
pub fn real_path(p: &Path) -> PathBuf {
    use std::path::Component;
    let parts: Vec<Component<'_>> = p.components().collect();
    for i in (0..=parts.len()).rev() {
        let prefix: PathBuf = parts[..i].iter().collect();
        let base = if prefix.as_os_str().is_empty() {
            std::env::current_dir().ok()
        } else {
            prefix.canonicalize().ok()
        };
        let Some(mut out) = base else { continue };
        for c in &parts[i..] {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::CurDir => {}
                other => out.push(other.as_os_str()),
            }
        }
        return out;
    }
    p.to_owned()
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
        assert!(c.tls_files().unwrap().is_none());
        let tls = c.ssldir_files(c.tls.ssldir.as_deref().unwrap(), "node1");
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
