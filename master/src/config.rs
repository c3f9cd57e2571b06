//! `master.toml`: what the master serves, where it listens, who may read.
//!
//! Parsed with unknown keys rejected (a typo must not silently fall back to a
//! default), then [`MasterConfig::validate`] checks what serde cannot: that
//! the listen addresses parse, the environment directories exist, the TLS
//! files are named, the authorization globs compile. `etc/master.toml` lists
//! every key at its default and a test parses it, so the example cannot drift
//! from this file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::config::{ConfigFile, RelativeTo};
use serde::Deserialize;

use crate::auth;
use crate::tls::ClientAuth;
pub use crate::tls::{DEFAULT_EXPIRY_WARNING, TlsConfig};

/// The default config path.
pub const DEFAULT_CONFIG: &str = "/etc/pluginsync/master.toml";

pub use pluginsync_common::config::ConfigError;

/// The whole master config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MasterConfig {
    /// Addresses to listen on, e.g. `"0.0.0.0:8140"` or `"[::]:8140"`.
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Directories holding environments (`<dir>/<name>/modules/...`).
    pub environmentpath: Vec<PathBuf>,
    /// Module directories appended to every environment's modulepath.
    #[serde(default)]
    pub basemodulepath: Vec<PathBuf>,
    /// TLS material and client-certificate policy.
    pub tls: TlsConfig,
    /// HTTP limits.
    #[serde(default)]
    pub http: HttpConfig,
    /// Index refresh.
    #[serde(default)]
    pub index: crate::index::Settings,
    /// Which client certnames may read which environments; empty = any
    /// authenticated client may read every environment.
    #[serde(default)]
    pub authorization: Vec<auth::AuthRule>,
    /// Prometheus metrics.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// Puppet Server's admin API (`DELETE /puppet-admin-api/v1/environment-cache`).
    #[serde(default)]
    pub admin: AdminConfig,
    /// The plain-HTTP listener behind a TLS-terminating proxy, with the
    /// client's identity in headers (docs/protocol.md §5.5).
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// The generations kept per environment and their content store
    /// (docs/deploys.md#generations).
    #[serde(default)]
    pub generations: crate::generations::Limits,
    /// Rollout policies (docs/rollouts.md).
    #[serde(default)]
    pub rollout: Vec<crate::rollout::RolloutRule>,
    /// The nodes' last reports kept in memory (docs/operating.md#the-fleet).
    #[serde(default)]
    pub fleet: FleetConfig,
    /// Stock agents' run reports from Puppet Server
    /// (docs/operating.md#stock-agents-reports).
    #[serde(default)]
    pub reports: crate::puppet_report::ReportsConfig,
    /// The signed generations' metadata served (docs/trust.md).
    #[serde(default)]
    pub trust: TrustConfig,
    /// Where rollout commands, node reports and what was served are kept
    /// (docs/operating.md#the-state-store).
    #[serde(default)]
    pub state: StateConfig,
}

/// `[trust]`: where the deploy pipeline puts the TUF repository's
/// metadata (docs/trust.md#what-the-masters-serve), and the root a
/// generation must be signed under to be published.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrustConfig {
    /// The directory of `N.root.json`, `timestamp.json`, `N.snapshot.json`
    /// and `N.targets.json`, served read-only; unset: none served.
    pub metadata: Option<PathBuf>,
    /// The root metadata (as installed on the nodes); set: a generation
    /// is published only once `metadata` signs it.
    pub root: Option<PathBuf>,
    /// How long past its expiry metadata still signs a generation.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig {
            metadata: None,
            root: None,
            grace: Duration::from_secs(3600), // the agents' default
        }
    }
}

impl TrustConfig {
    /// `trust.root` needs `trust.metadata`, and a root that reads.
    fn validate(&self) -> Result<(), ConfigError> {
        match (&self.root, &self.metadata) {
            (Some(_), None) => Err(ConfigError::Invalid(
                "trust.root needs trust.metadata: the directory the signed metadata is read from"
                    .into(),
            )),
            (Some(root), Some(_)) if !root.is_file() => Err(ConfigError::Invalid(format!(
                "trust.root '{}' is not a file",
                root.display()
            ))),
            _ => Ok(()),
        }
    }

    /// What the store's signature check reads (`None`: no `trust.root`).
    pub fn signed_settings(&self) -> Option<crate::trust::signed::Settings> {
        Some(crate::trust::signed::Settings {
            root: self.root.clone()?,
            metadata: self.metadata.clone()?,
            grace: self.grace,
        })
    }
}

/// `[state]`: the state store's database (docs/operating.md#the-state-store).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// `postgresql://…` (libpq's form); unset: the embedded file under the
    /// generation store's directory.
    pub url: Option<String>,
    /// Connections to the database open at most.
    pub max_connections: u32,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            url: None,
            max_connections: 8,
        }
    }
}

/// `[fleet]`: how many nodes' last reports the master keeps
/// (docs/operating.md#the-fleet). Its `Default` and its checks are in
/// `fleet/mod.rs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// Nodes kept at most; beyond, the least recently seen are forgotten.
    pub max_nodes: usize,
    /// Ignored, with a warning: replicas no longer send each other what
    /// they heard (docs/rollouts.md#replicas).
    #[serde(with = "humantime_serde")]
    pub push_interval: Option<Duration>,
    /// Ignored, with a warning, as `push_interval`.
    #[serde(with = "humantime_serde")]
    pub pull_interval: Option<Duration>,
}

/// `[proxy]`: a second kind of listener, plain HTTP, for a balancer that
/// terminates TLS and forwards the client's identity in headers as Puppet
/// Server's `allow-header-cert-info` reads them (docs/protocol.md §5.5).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Plain-HTTP addresses, e.g. `"127.0.0.1:8141"`; empty (default): no
    /// proxy listener.
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    /// CIDRs of the proxies (`"10.0.0.0/8"`, `"::1/128"`; a bare address is
    /// one host); required with `listen`. Any request from elsewhere is
    /// answered 403, whatever its headers.
    #[serde(default)]
    pub trusted: Vec<String>,
    /// Says whether the proxy verified a client certificate: `SUCCESS`.
    #[serde(default = "default_verify_header")]
    pub verify_header: String,
    /// The client certificate's subject DN (`/CN=…` or `CN=…,…`).
    #[serde(default = "default_dn_header")]
    pub dn_header: String,
    /// The client certificate, URL-encoded PEM; when present it is
    /// verified against `[tls] ca` and the CRL and decides alone.
    #[serde(default = "default_cert_header")]
    pub cert_header: String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: Vec::new(),
            trusted: Vec::new(),
            verify_header: default_verify_header(),
            dn_header: default_dn_header(),
            cert_header: default_cert_header(),
        }
    }
}

fn default_verify_header() -> String {
    "X-Client-Verify".into()
}
fn default_dn_header() -> String {
    "X-Client-DN".into()
}
fn default_cert_header() -> String {
    "X-Client-Cert".into()
}

/// What `serve` and `check` say of a config whose `[admin] peers` names
/// replicas: they share their state through PostgreSQL instead
/// (docs/rollouts.md#replicas).
pub const RETIRED_PEERS: &str = "admin.peers: replicas no longer send each other their state; \
     give every replica the same [state] url = \"postgresql://…\" (docs/rollouts.md#replicas)";

/// `[admin]`: who may call the admin API (docs/protocol.md §1.10).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Certnames allowed to call it (exact names, as Puppet Server's
    /// `puppet-admin` allowlist); empty (the default): everyone gets 403.
    /// The master's own certificate is always allowed (`pluginsync-master
    /// reindex` uses it).
    #[serde(default)]
    pub certnames: Vec<String>,
    /// Retired: read only so that a config naming peers is refused with
    /// the line that says what replaces them ([`RETIRED_PEERS`]).
    #[serde(default)]
    pub peers: Vec<String>,
}

/// `[log]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// The access log: `"off"` (default), `"text"` or `"json"`.
    #[serde(default)]
    pub access: crate::access::AccessFormat,
}

/// `[metrics]` (docs/operating.md#master-metrics).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Plain-HTTP address of `GET /metrics`, e.g. `"127.0.0.1:9140"`; unset:
    /// no metrics listener. Apart from the mTLS port: keep it on loopback
    /// or a management network.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Time a client has to complete the TLS handshake.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Time a client has to send a request's headers.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time the master has to produce a response's headers.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// On SIGTERM/SIGINT: `/status/v1/simple` answers 503 for this long
    /// (so load balancers stop sending), then connections get this long
    /// again to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// A connection with no request in flight for this long is closed:
    /// after the TLS handshake with no HTTP byte, between keep-alive
    /// requests, on an idle HTTP/2 connection.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A connection whose client stops taking response data (nothing
    /// written, no HTTP/2 window opened) for this long is closed, and the
    /// responses it held are freed.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Open connections at most; at the limit a new connection sheds the
    /// oldest idle one (anonymous first). Capped below the process's
    /// descriptor limit (`LimitNOFILE`).
    pub max_connections: usize,
    /// Open connections of one client at most on the mTLS listeners: one
    /// certificate (its public key), or one address for clients without a
    /// certificate. At the limit a new connection of that client sheds its
    /// oldest idle one, or is closed when every one is busy; `0`: no bound
    /// (docs/master.md#connection-limits).
    pub max_connections_per_client: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_connections: 8192,
            max_connections_per_client: 4,
            max_concurrent_streams: 64,
        }
    }
}

impl From<ClientAuth> for auth::Policy {
    /// `required` and `optional` both mean "no certificate, no files";
    /// `none` opens every environment to every client (docs/protocol.md
    /// §5.1).
    fn from(client_auth: ClientAuth) -> Self {
        match client_auth {
            ClientAuth::Required | ClientAuth::Optional => auth::Policy::Certificates,
            ClientAuth::None => auth::Policy::Open,
        }
    }
}

fn default_listen() -> Vec<String> {
    vec!["0.0.0.0:8140".to_owned()]
}

impl MasterConfig {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        pluginsync_common::config::load(path)
    }

    /// Parses TOML text without validating (relative paths are taken
    /// relative to the config file's directory).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        pluginsync_common::config::parse(text, path)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError::Invalid(
                "listen must name at least one address".into(),
            ));
        }
        self.listen_addrs()?;
        if self.environmentpath.is_empty() {
            return Err(ConfigError::Invalid(
                "environmentpath must name at least one directory".into(),
            ));
        }
        for dir in &self.environmentpath {
            if !dir.is_dir() {
                return Err(ConfigError::Invalid(format!(
                    "environmentpath entry '{}' is not a directory",
                    dir.display()
                )));
            }
        }
        for dir in &self.basemodulepath {
            if !dir.is_dir() {
                return Err(ConfigError::Invalid(format!(
                    "basemodulepath entry '{}' is not a directory",
                    dir.display()
                )));
            }
        }
        if self.http.max_connections == 0 || self.http.max_concurrent_streams == 0 {
            return Err(ConfigError::Invalid(
                "http.max_connections and http.max_concurrent_streams must be at least 1".into(),
            ));
        }
        for (key, d) in [
            ("idle_timeout", self.http.idle_timeout),
            ("write_timeout", self.http.write_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "http.{key} must be longer than 0s"
                )));
            }
        }
        auth::Authorizer::new(&self.authorization)?;
        self.index.external_roots()?; // index.allow_external_roots
        for w in self.index.warm.iter().filter(|w| *w != "*") {
            if w.parse::<pluginsync_common::envname::EnvName>().is_err() {
                return Err(ConfigError::Invalid(format!(
                    "index.warm: '{w}' is not an environment name (nor \"*\")"
                )));
            }
        }
        if self.index.settle.is_zero() || self.index.settle_max < self.index.settle {
            return Err(ConfigError::Invalid(
                "index.settle must be longer than 0s and index.settle_max at least index.settle"
                    .into(),
            ));
        }
        if let Some(bad) = self
            .admin
            .certnames
            .iter()
            .find(|c| !auth::is_valid_certname(c))
        {
            return Err(ConfigError::Invalid(format!(
                "admin.certnames: '{bad}' is not a certname"
            )));
        }
        crate::rollout::Policies::new(&self.rollout)?;
        self.proxy.validate()?; // proxy.rs
        if !self.admin.peers.is_empty() {
            return Err(ConfigError::Invalid(RETIRED_PEERS.into()));
        }
        self.fleet.validate()?; // fleet/mod.rs
        self.reports.validate()?; // puppet_report/mod.rs
        self.trust.validate()?;
        (self.state_settings(Path::new("/"))).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.generations.keep == 0 || self.generations.max_mib == 0 {
            return Err(ConfigError::Invalid(
                "generations.keep and generations.max_mib must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Where the environments and their modules are, as the environments
    /// module reads it.
    pub fn layout(&self) -> crate::environments::Layout {
        crate::environments::Layout {
            environmentpath: self.environmentpath.clone(),
            basemodulepath: self.basemodulepath.clone(),
            allow_external_roots: self.index.allow_external_roots.clone(),
        }
    }

    /// What the store of indexes and generations reads of the config.
    pub fn store_settings(&self) -> crate::store::Settings {
        crate::store::Settings {
            layout: self.layout(),
            index: self.index.clone(),
            generations: self.generations.clone(),
            trust: self.trust.signed_settings(),
        }
    }

    /// What the state store reads of the config: `[state]`, its embedded
    /// file under `dir` (the generation store's directory) by default.
    pub fn state_settings(
        &self,
        dir: &Path,
    ) -> Result<crate::statestore::Settings, crate::statestore::SettingsError> {
        crate::statestore::Settings::parse(
            self.state.url.as_deref(),
            self.state.max_connections,
            dir,
        )
    }

    /// The listen addresses, parsed.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.listen
            .iter()
            .map(|a| {
                a.parse::<SocketAddr>().map_err(|_| {
                    ConfigError::Invalid(format!("listen address '{a}' is not IP:PORT"))
                })
            })
            .collect()
    }

    /// Problems that are legal but probably not meant.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.tls.client_auth == ClientAuth::None {
            w.push("tls.client_auth = \"none\": every client may read every environment".into());
            if !self.authorization.is_empty() {
                w.push(
                    "[[authorization]] rules are ignored with tls.client_auth = \"none\"".into(),
                );
            }
        }
        if self.tls.crl.is_none() && self.tls.client_auth != ClientAuth::None {
            w.push("tls.crl is not set: revoked client certificates will be accepted".into());
        }
        if self
            .proxy
            .trusted_nets()
            .unwrap_or_default()
            .iter()
            .any(|n| n.prefix_len() == 0)
        {
            w.push("proxy.trusted includes every address: any client can claim any identity on the proxy listener".into());
        }
        if !self.index.watch && self.index.rescan_interval.is_zero() {
            w.push("index.watch = false and index.rescan_interval = \"0s\": changes are never picked up".into());
        }
        for (key, set) in [
            ("push_interval", self.fleet.push_interval),
            ("pull_interval", self.fleet.pull_interval),
        ] {
            if set.is_some() {
                w.push(format!("fleet.{key} is ignored: replicas share their state through [state] url (docs/rollouts.md#replicas)"));
            }
        }
        w
    }
}

impl ConfigFile for MasterConfig {
    fn resolve_paths(&mut self, base: &RelativeTo) {
        let fix = |p: &mut PathBuf| base.fix(p);
        self.environmentpath.iter_mut().for_each(fix);
        self.basemodulepath.iter_mut().for_each(fix);
        fix(&mut self.tls.cert);
        fix(&mut self.tls.key);
        fix(&mut self.tls.ca);
        if let Some(crl) = self.tls.crl.as_mut() {
            fix(crl);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<MasterConfig, ConfigError> {
        MasterConfig::parse(text, Path::new("/etc/pluginsync/master.toml"))
    }

    const MIN: &str = "environmentpath = [\"/srv/envs\"]\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nca = \"/ssl/ca.pem\"\n";

    #[test]
    fn the_store_gets_the_keys_it_reads_in_its_own_types() {
        let c = parse(&format!(
            "basemodulepath = [\"/srv/base\"]\n{MIN}\
             [index]\ncache_mib = 7\npublish = \"explicit\"\nallow_external_roots = [\"/opt/*\"]\n\
             [generations]\nkeep = 3\npin = \"2m\"\n"
        ))
        .unwrap();
        let s = c.store_settings();
        assert_eq!(s.layout.environmentpath, [PathBuf::from("/srv/envs")]);
        assert_eq!(s.layout.basemodulepath, [PathBuf::from("/srv/base")]);
        assert_eq!(s.layout.allow_external_roots, ["/opt/*"]);
        assert_eq!(s.index.cache_mib, 7);
        assert_eq!(s.index.publish, crate::index::Publish::Explicit);
        assert_eq!(s.generations.keep, 3);
        assert_eq!(s.generations.pin, Duration::from_secs(120));
    }

    #[test]
    fn proxy_needs_trusted_cidrs_and_header_names() {
        let proxy = |tables: &str| parse(&format!("{MIN}[proxy]\n{tables}")).unwrap().proxy;
        let off = parse(MIN).unwrap().proxy;
        assert!(off.listen.is_empty() && off.validate().is_ok());
        assert_eq!(off.verify_header, "X-Client-Verify");
        assert_eq!(off.dn_header, "X-Client-DN");
        assert_eq!(off.cert_header, "X-Client-Cert");
        let ok = proxy(
            "listen = [\"127.0.0.1:8141\"]\ntrusted = [\"10.0.0.0/8\", \"::1/128\", \"192.0.2.7\"]",
        );
        assert!(ok.validate().is_ok());
        let nets = ok.trusted_nets().unwrap();
        let mut open = parse(MIN).unwrap();
        open.proxy.trusted = vec!["0.0.0.0/0".into()];
        assert!(
            open.warnings()
                .iter()
                .any(|w| w.contains("any client can claim any identity"))
        );
        assert!(nets[0].contains(&"10.1.2.3".parse::<std::net::IpAddr>().unwrap()));
        assert!(nets[1].contains(&"::1".parse::<std::net::IpAddr>().unwrap()));
        assert!(nets[2].contains(&"192.0.2.7".parse::<std::net::IpAddr>().unwrap()));
        for (tables, message) in [
            (
                "listen = [\"127.0.0.1:8141\"]",
                "proxy.trusted must name the proxies' addresses when proxy.listen is set",
            ),
            (
                "listen = [\"127.0.0.1:8141\"]\ntrusted = [\"10.0.0.0/33\"]",
                "proxy.trusted: '10.0.0.0/33' is not a CIDR (like \"10.0.0.0/8\" or \"::1/128\")",
            ),
            (
                "trusted = [\"::1\"]\ndn_header = \"X Client DN\"",
                "proxy.dn_header: 'X Client DN' is not an HTTP header name",
            ),
        ] {
            let e = proxy(tables).validate().unwrap_err().to_string();
            assert!(e.contains(message), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn peers_are_refused_with_one_line_and_the_fleet_intervals_only_warned_of() {
        let envs = tempfile::tempdir().unwrap();
        let valid = |tables: &str| {
            let mut c = parse(&format!("{MIN}{tables}")).unwrap();
            c.environmentpath = vec![envs.path().to_owned()];
            c
        };
        let c = valid("[admin]\npeers = [\"https://m2.example.org:8140\"]\n");
        let e = c.validate().unwrap_err().to_string();
        assert_eq!(e, format!("invalid config: {RETIRED_PEERS}"));
        assert!(e.contains("[state] url") && e.lines().count() == 1, "{e}");
        let none = valid("[admin]\npeers = []\n");
        assert!(none.validate().is_ok(), "an empty list names no replica");
        assert!(none.warnings().iter().all(|w| !w.contains("fleet.")));
        let old = valid("[fleet]\npush_interval = \"200ms\"\npull_interval = \"10m\"\n");
        assert!(old.validate().is_ok(), "accepted");
        let w: Vec<_> = (old.warnings().into_iter())
            .filter(|w| w.contains("is ignored: replicas share their state through [state] url"))
            .collect();
        assert_eq!(w.len(), 2, "{w:?}");
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.listen, vec!["0.0.0.0:8140"]);
        assert_eq!(c.tls.client_auth, ClientAuth::Optional);
        assert_eq!(c.tls.cert, PathBuf::from("/etc/pluginsync/c.pem"));
        assert_eq!(c.tls.ca, PathBuf::from("/ssl/ca.pem"));
        assert!(c.authorization.is_empty());
        assert_eq!(c.index.debounce, Duration::from_millis(200));
    }

    #[test]
    fn unknown_keys_are_refused_on_one_line() {
        let e = parse(&format!("{MIN}enviromentpath = []\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("enviromentpath") && !e.contains('\n'), "{e}");
        let e = parse(&format!("{MIN}client_auth = \"maybe\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("client_auth"), "{e}");
    }

    #[test]
    fn example_config_parses_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/master.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = MasterConfig::parse(&text, &path).unwrap();
        assert_eq!(c.listen, default_listen());
        assert_eq!(
            c.http.request_timeout,
            HttpConfig::default().request_timeout
        );
        let d = HttpConfig::default();
        let all_http = |c: &HttpConfig| {
            (
                c.idle_timeout,
                c.write_timeout,
                c.max_connections,
                c.max_connections_per_client,
                c.max_concurrent_streams,
            )
        };
        assert_eq!(
            c.index.rescan_interval,
            crate::index::Settings::default().rescan_interval
        );
        // Every commented-out key in the example must be a real key: uncomment
        // them all and parse again.
        let uncommented: String = text
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.contains(" = ") || r.starts_with('['))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let all = MasterConfig::parse(&uncommented, &path)
            .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(all.authorization.len(), 1);
        // The documented connection limits are the defaults.
        assert_eq!(all_http(&all.http), all_http(&d));
        assert!(all.tls.crl.is_some());
    }

    #[test]
    fn index_warm_names_environments_and_idle_drop_has_a_default() {
        let d = parse(MIN).unwrap();
        assert_eq!(d.index.warm, ["production", "*"]);
        assert_eq!(d.index.idle_drop, crate::index::DEFAULT_IDLE_DROP);
        let c = parse(&format!(
            "{MIN}[index]\nwarm = [\"main\"]\nidle_drop = \"10m\"\n"
        ))
        .unwrap();
        assert_eq!(c.index.warm, ["main"]);
        assert_eq!(c.index.idle_drop, Duration::from_secs(600));
        let envs = tempfile::tempdir().unwrap();
        let mut bad = parse(MIN).unwrap();
        bad.environmentpath = vec![envs.path().to_owned()];
        assert!(bad.validate().is_ok());
        bad.index.warm = vec!["*".into(), "no such!".into()];
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("index.warm: 'no such!'"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
