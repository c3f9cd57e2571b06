//! `[tls]` of agent.toml: which certificate, key, CA and CRL the agent uses, named as four
//! files or as a Puppet ssldir and a certname (Puppet's layout, so a node that already runs
//! Puppet reuses its certificate); an ssldir or certname left unset comes from puppet.conf or
//! Puppet's defaults (`settings.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::config::ConfigError;
use pluginsync_common::tls::SslDirPaths;
use serde::Deserialize;

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
    /// The certname of this node in `ssldir` (also `--certname`'s and
    /// puppet.conf's layer of the settings).
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

impl TlsConfig {
    /// The files when `[tls]` names them explicitly (`ca`/`cert`/`key`
    /// and maybe `crl`), else an ssldir and a certname, maybe unset
    /// (`settings.rs`: then puppet.conf's, else Puppet's defaults).
    pub fn source(&self) -> Result<TlsSource, ConfigError> {
        let cert_expiry_warning = (self.cert_expiry_warning).unwrap_or(DEFAULT_CERT_EXPIRY_WARNING);
        let explicit =
            self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.crl.is_some();
        if !explicit {
            return Ok(TlsSource::SslDir {
                ssldir: self.ssldir.clone(),
                certname: self.certname.clone(),
                cert_expiry_warning,
            });
        }
        if self.ssldir.is_some() || self.certname.is_some() {
            return Err(ConfigError::Invalid(
                "[tls] takes either ssldir + certname or ca/cert/key/crl, not both".into(),
            ));
        }
        match (&self.ca, &self.cert, &self.key) {
            (Some(ca), Some(cert), Some(key)) => Ok(TlsSource::Files(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: self.crl.clone(),
                cert_expiry_warning,
            })),
            _ => Err(ConfigError::Invalid(
                "[tls] needs ca, cert and key (or ssldir and certname)".into(),
            )),
        }
    }

    /// Every path of `[tls]`, for making them relative to the config.
    pub(super) fn paths_mut(&mut self) -> [&mut Option<PathBuf>; 5] {
        [
            &mut self.ca,
            &mut self.cert,
            &mut self.key,
            &mut self.crl,
            &mut self.ssldir,
        ]
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
