//! The master's rustls server config: ring only, client certificates per
//! `tls.client_auth`, CRLs when configured (checked for the whole chain),
//! ALPN h2 + http/1.1, and session resumption (docs/tls.md#session-resumption) from a
//! bounded in-memory session cache: nothing of it is ever on disk.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use pluginsync_common::tls::{self as ptls, TlsError};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use serde::Deserialize;

use crate::ca_chain;

/// `[tls]`: the served certificate and the client-certificate policy,
/// as `config.rs` parses it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server certificate chain (PEM).
    pub cert: PathBuf,
    /// The server private key (PEM).
    pub key: PathBuf,
    /// The CA bundle that client certificates must chain to (PEM).
    pub ca: PathBuf,
    /// Optional CRL bundle (PEM); revoked client certificates are refused.
    #[serde(default)]
    pub crl: Option<PathBuf>,
    /// Whether clients must present a certificate.
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// Warn this long before the server certificate expires (`check`
    /// prints it, `serve` logs it daily).
    #[serde(default = "default_expiry_warning", with = "humantime_serde")]
    pub cert_expiry_warning: Duration,
}

/// Default of `[tls] cert_expiry_warning`: 30 days.
pub const DEFAULT_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

fn default_expiry_warning() -> Duration {
    DEFAULT_EXPIRY_WARNING
}

/// `tls.client_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// The TLS handshake fails without a valid client certificate (the
    /// load balancer's health check then needs one too).
    Required,
    /// Puppet Server's model: a certificate is asked for, not demanded; the
    /// file endpoints answer 403 without one, `/status/v1/simple` works.
    #[default]
    Optional,
    /// No client certificates at all: every client may read every
    /// environment. Only for a master behind a TLS-terminating proxy that
    /// does its own authentication.
    None,
}

/// The TLS setup failed; the message names the file or the reason.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    /// A file could not be loaded.
    #[error(transparent)]
    File(#[from] TlsError),
    /// rustls refused the combination.
    #[error("TLS setup: {0}")]
    Rustls(String),
}

/// Sessions the master remembers for resumption (TLS 1.3 tickets and
/// TLS 1.2 session IDs name an entry; the oldest entry goes first). An
/// entry holds the session's secret and its client certificate chain, about
/// 2.5 KB with a Puppet CA's RSA 4,096-bit certificates, so this is ~20 MB
/// at most; an agent needs its entries only for the seconds of its run, and
/// 8,192 cover several seconds of a master at full load (~1,000 runs/s).
const SESSION_CACHE: usize = 8192;

/// TLS 1.3 tickets sent after each handshake (rustls' default): each is one
/// cache entry, and a ticket is used once, so this is how many connections
/// a client can open in parallel and still resume all of them.
const TLS13_TICKETS: usize = 2;

/// How long a session may be resumed after its full handshake. A resumed
/// handshake does not verify the client certificate again (the session
/// carries it), so this bounds how long a certificate that expired since
/// can still get in; an agent resumes only within its run, which takes
/// seconds. (A revocation needs a SIGHUP to load the CRL, which empties the
/// cache.) rustls itself bounds a stored session by nothing but eviction.
const SESSION_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// A server config and the client verifier inside it.
#[derive(Debug)]
pub struct ServerTls {
    /// What new handshakes use.
    pub config: ServerConfig,
    /// The client-certificate verifier `config` uses (`None` with
    /// `client_auth = "none"`), kept to re-check the certificates of open
    /// connections after a reload (docs/protocol.md §5.2).
    pub client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// The served leaf certificate's `notBefore` and `notAfter` (Unix
    /// seconds), for the health check ([`Validity`]); `None` if it does
    /// not parse.
    pub validity: Option<(i64, i64)>,
}

/// Builds the server config from `[tls]`.
pub fn server_config(tls: &TlsConfig) -> Result<ServerConfig, ServerTlsError> {
    server_tls(tls).map(|t| t.config)
}

/// Builds the server config from `[tls]`, with its client verifier.
pub fn server_tls(tls: &TlsConfig) -> Result<ServerTls, ServerTlsError> {
    let provider = ptls::provider();
    let (certs, key) = ptls::load_identity("server certificate", &tls.cert, &tls.key)?;
    let validity = certs.first().and_then(|leaf| {
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        let v = cert.validity();
        Some((v.not_before.timestamp(), v.not_after.timestamp()))
    });
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerTlsError::Rustls(e.to_string()))?;
    let mut client_verifier: Option<Arc<dyn ClientCertVerifier>> = None;
    let builder = if tls.client_auth == ClientAuth::None {
        builder.with_no_client_auth()
    } else {
        let verifier = client_verifier_for(tls, tls.client_auth == ClientAuth::Optional)?;
        client_verifier = Some(verifier.clone());
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        ServerTlsError::Rustls(format!(
            "server certificate and key do not fit together: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    resumption(&mut config);
    Ok(ServerTls {
        config,
        client_verifier,
        validity,
    })
}

/// The validity window of the certificate the master serves now (Unix
/// seconds), set at startup and on every SIGHUP reload: the health check
/// answers 503 outside it, since every agent refuses the certificate then
/// (docs/master.md#endpoints). Unknown (never set, or unparsable): always
/// valid, as before.
#[derive(Debug)]
pub struct Validity {
    not_before: AtomicI64,
    not_after: AtomicI64,
}

impl Default for Validity {
    fn default() -> Self {
        Validity {
            not_before: AtomicI64::new(i64::MIN),
            not_after: AtomicI64::new(i64::MAX),
        }
    }
}

impl Validity {
    /// Records the window of the certificate just installed.
    pub fn set(&self, window: Option<(i64, i64)>) {
        let (from, until) = window.unwrap_or((i64::MIN, i64::MAX));
        self.not_before.store(from, Ordering::Relaxed);
        self.not_after.store(until, Ordering::Relaxed);
    }

    /// Why agents refuse the served certificate at `now`, if they do.
    pub fn refused_at(&self, now: std::time::SystemTime) -> Option<OutOfDate> {
        let now = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let at = |t: i64| time::OffsetDateTime::from_unix_timestamp(t).ok();
        let until = self.not_after.load(Ordering::Relaxed);
        let from = self.not_before.load(Ordering::Relaxed);
        if now > until {
            at(until).map(OutOfDate::Expired)
        } else if now < from {
            at(from).map(OutOfDate::NotYetValid)
        } else {
            None
        }
    }
}

/// The served certificate is outside its validity window: every agent
/// refuses it. Shown as the health check's 503 body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutOfDate {
    /// Past its `notAfter` (when, UTC).
    #[error("expired: the server certificate expired on {}; agents refuse it", utc(.0))]
    Expired(time::OffsetDateTime),
    /// Before its `notBefore` (when, UTC).
    #[error("not yet valid: the server certificate is valid from {}; agents refuse it", utc(.0))]
    NotYetValid(time::OffsetDateTime),
}

/// `2026-11-26 14:56:23 UTC`.
fn utc(t: &time::OffsetDateTime) -> String {
    let (h, m, s) = t.to_offset(time::UtcOffset::UTC).to_hms();
    format!("{} {h:02}:{m:02}:{s:02} UTC", t.date())
}

/// Session resumption (docs/tls.md#session-resumption): a resumed handshake skips the
/// master's certificate signature, the expensive part of a full one with a
/// Puppet CA's RSA keys (docs/tls.md#a-p-256-key-for-the-master has the figures). The sessions are
/// kept in the master's memory ([`SESSION_CACHE`], [`SESSION_MAX_AGE`] each
/// at most) and a ticket only names
/// one, so a restart — and every reload: each builds a new config with an
/// empty cache — forgets them, and the client does a full handshake.
///
/// Stateless tickets (rustls' `Ticketer`: the session sealed into the
/// ticket with rotating in-memory keys) were measured and not taken: a
/// ticket then carries the client's certificate chain, ~2.7 KB each with
/// RSA 4,096-bit certificates, and the master sends two after every
/// handshake — 7.3 KB from the master per connection instead of 1.7 KB —
/// while an agent process uses its tickets only within its own run (rustls
/// 0.23 cannot export them to the next run), for which a cache entry that
/// lives seconds is enough.
///
/// A resumed session keeps the client certificate chain of its full
/// handshake (rustls restores it), which `server/conns.rs` records as for
/// any connection; the metrics count full and resumed handshakes apart.
fn resumption(config: &mut ServerConfig) {
    // The builder's `ticketer` seals nothing (rustls' default): with
    // session storage, a TLS 1.3 ticket is then the key of a cache entry.
    config.session_storage = Arc::new(MaxAge {
        inner: rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE),
        max_age: SESSION_MAX_AGE,
        clock: unix_now,
    });
    config.send_tls13_tickets = TLS13_TICKETS;
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A session store whose entries expire `max_age` after they were stored:
/// each value is kept behind the time it was stored (8 bytes, big endian
/// Unix seconds), and one found older is not handed out.
#[derive(Debug)]
struct MaxAge {
    inner: Arc<dyn rustls::server::StoresServerSessions>,
    max_age: std::time::Duration,
    clock: fn() -> u64,
}

impl MaxAge {
    fn fresh(&self, stored: Vec<u8>) -> Option<Vec<u8>> {
        let (at, value) = stored.split_first_chunk::<8>()?;
        let age = (self.clock)().saturating_sub(u64::from_be_bytes(*at));
        (age <= self.max_age.as_secs()).then(|| value.to_vec())
    }
}

impl rustls::server::StoresServerSessions for MaxAge {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let mut stamped = (self.clock)().to_be_bytes().to_vec();
        stamped.extend_from_slice(&value);
        self.inner.put(key, stamped)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key).and_then(|v| self.fresh(v))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(key).and_then(|v| self.fresh(v))
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// The client-certificate verifier of `[tls]`: `ca` as the trust anchor,
/// the CRL when set. The mTLS listener's handshakes use it (with
/// `allow_unauthenticated` for `client_auth = "optional"`), and the
/// `[proxy]` listener checks the certificate header with it (strict), so
/// both accept exactly the same certificates (docs/protocol.md §5.5).
pub fn client_verifier_for(
    tls: &TlsConfig,
    allow_unauthenticated: bool,
) -> Result<Arc<dyn ClientCertVerifier>, ServerTlsError> {
    let provider = ptls::provider();
    let mut roots = ptls::load_roots(&tls.ca)?;
    let mut bundled = Vec::new();
    if tls.crl.is_some() {
        // The bundle's intermediate CAs are not anchors, so that they are
        // checked against their root's CRL too
        // (docs/tls.md#revocation-and-intermediate-cas).
        let split = ca_chain::split(ptls::load_certs("CA bundle", &tls.ca)?);
        if !split.intermediates.is_empty() {
            roots = anchors(&tls.ca, split.anchors)?;
            bundled = split.intermediates;
        }
    }
    let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .add_root_hint_subjects(ca_chain::subjects(&bundled));
    if let Some(crl) = &tls.crl {
        // Every certificate of the client's chain below the trust anchor
        // (the leaf and any intermediate CA) is checked against its
        // issuer's CRL (rustls' default depth, `Chain`), as Puppet's
        // `certificate_revocation = chain`: an intermediate CA that the
        // root revoked takes its certificates with it. A CRL bundle that
        // does not cover an issuer in the chain refuses the client (fail
        // closed).
        verifier = verifier.with_crls(ptls::load_crls(crl)?);
    }
    if allow_unauthenticated {
        verifier = verifier.allow_unauthenticated();
    }
    let verifier = verifier
        .build()
        .map_err(|e| ServerTlsError::Rustls(format!("client verifier: {e}")))?;
    if bundled.is_empty() {
        return Ok(verifier);
    }
    Ok(Arc::new(ca_chain::WithIntermediates {
        inner: verifier,
        intermediates: bundled,
    }))
}

/// The trust anchors `certs` of the CA bundle at `path`.
fn anchors(
    path: &std::path::Path,
    certs: Vec<rustls_pki_types::CertificateDer<'static>>,
) -> Result<rustls::RootCertStore, ServerTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::Invalid {
            what: "CA bundle",
            path: path.to_owned(),
            reason: format!("holds an unusable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// When the first certificate of the PEM file `path` expires (Unix
/// seconds), or `None` if it cannot be read.
pub fn certificate_expiry(path: &std::path::Path) -> Option<i64> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_file(path).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The earliest `nextUpdate` of the CRLs in the PEM file `path` (Unix
/// seconds), or `None` if it cannot be read or no CRL has one.
pub fn crl_next_update(path: &std::path::Path) -> Option<i64> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateRevocationListDer::pem_file_iter(path)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|der| {
            let (_, crl) = x509_parser::parse_x509_crl(&der).ok()?;
            crl.next_update().map(|t| t.timestamp())
        })
        .min()
}

/// A server certificate agents would refuse, or that cannot be checked
/// ([`server_certificate_check`]).
#[derive(Debug, thiserror::Error)]
pub enum CertificateRefused {
    /// The certificate or the CA file could not be loaded.
    #[error(transparent)]
    File(#[from] TlsError),
    /// The certificate file holds no certificate.
    #[error("server certificate '{}' is empty", .0.display())]
    Empty(PathBuf),
    /// The leaf certificate is not X.509.
    #[error("server certificate '{}' cannot be parsed: {source}", path.display())]
    Unparsable {
        /// `[tls] cert`.
        path: PathBuf,
        /// What x509-parser said.
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },
    /// Past its `notAfter`.
    #[error("server certificate '{}' expired on {on}: agents refuse it", path.display())]
    Expired {
        /// `[tls] cert`.
        path: PathBuf,
        /// The day it expired (UTC).
        on: time::Date,
    },
    /// Before its `notBefore`.
    #[error("server certificate '{}' is not valid until {on}: agents refuse it", path.display())]
    NotYetValid {
        /// `[tls] cert`.
        path: PathBuf,
        /// The day it becomes valid (UTC).
        on: time::Date,
    },
    /// `[tls] ca` cannot make a verifier.
    #[error("[tls] ca '{}': {source}", path.display())]
    BadCa {
        /// `[tls] ca`.
        path: PathBuf,
        /// What rustls said.
        source: rustls::client::VerifierBuilderError,
    },
    /// Not issued by `[tls] ca` (through the chain in the file).
    #[error("server certificate '{}' does not verify against [tls] ca '{}': {source}", cert.display(), ca.display())]
    Unverified {
        /// `[tls] cert`.
        cert: PathBuf,
        /// `[tls] ca`.
        ca: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

/// The server certificate expires within `[tls] cert_expiry_warning`: a
/// warning (`check`'s output, `serve`'s daily log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiresSoon {
    /// `[tls] cert`.
    pub path: PathBuf,
    /// The day it expires (UTC).
    pub on: time::Date,
    /// Whole days left.
    pub days: i64,
}

impl std::fmt::Display for ExpiresSoon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server certificate '{}' expires on {} (in {} days)",
            self.path.display(),
            self.on,
            self.days
        )
    }
}

/// What is wrong with the server certificate now, beyond what loading it
/// checks: `Err` when it cannot work (expired, not yet valid, not issued by
/// `[tls] ca` — every agent would refuse it: the classic Puppet fleet
/// outage), `Ok(Some(warning))` when it expires within `warn_within`.
/// `pluginsync-master check` fails on the first and prints the second;
/// `serve` refuses to start on the first and logs the second daily
/// (docs/tls.md#certificate-checks).
pub fn server_certificate_check(
    tls: &TlsConfig,
    now: std::time::SystemTime,
    warn_within: std::time::Duration,
) -> Result<Option<ExpiresSoon>, CertificateRefused> {
    let (certs, _key) = ptls::load_identity("server certificate", &tls.cert, &tls.key)?;
    let leaf = certs
        .first()
        .ok_or_else(|| CertificateRefused::Empty(tls.cert.clone()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|source| {
        CertificateRefused::Unparsable {
            path: tls.cert.clone(),
            source,
        }
    })?;
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    };
    let now_s = unix(now);
    let validity = cert.validity();
    let day = |t: &x509_parser::time::ASN1Time| t.to_datetime().date();
    if now_s > validity.not_after.timestamp() {
        return Err(CertificateRefused::Expired {
            path: tls.cert.clone(),
            on: day(&validity.not_after),
        });
    }
    if now_s < validity.not_before.timestamp() {
        return Err(CertificateRefused::NotYetValid {
            path: tls.cert.clone(),
            on: day(&validity.not_before),
        });
    }
    issued_by_ca(tls, &certs, now_s)?;
    let left = validity.not_after.timestamp() - now_s;
    Ok((left < warn_within.as_secs() as i64).then(|| ExpiresSoon {
        path: tls.cert.clone(),
        on: day(&validity.not_after),
        days: left / 86_400,
    }))
}

/// Whether the chain `certs` (leaf first) is issued by `[tls] ca` at `now_s`:
/// agents trust that CA, so a certificate from another one is refused by
/// every agent. Which names agents use is theirs to say; only the issuer
/// matters.
fn issued_by_ca(
    tls: &TlsConfig,
    certs: &[rustls::pki_types::CertificateDer<'static>],
    now_s: i64,
) -> Result<(), CertificateRefused> {
    let roots = Arc::new(ptls::load_roots(&tls.ca)?);
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, ptls::provider())
            .build()
            .map_err(|source| CertificateRefused::BadCa {
                path: tls.ca.clone(),
                source,
            })?;
    let name = rustls::pki_types::ServerName::try_from("pluginsync-check.invalid")
        .expect("a valid DNS name");
    let at = rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        now_s.max(0) as u64,
    ));
    use rustls::client::danger::ServerCertVerifier;
    let Some((leaf, intermediates)) = certs.split_first() else {
        return Err(CertificateRefused::Empty(tls.cert.clone()));
    };
    match verifier.verify_server_cert(leaf, intermediates, &name, &[], at) {
        Ok(_)
        | Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => Ok(()),
        Err(source) => Err(CertificateRefused::Unverified {
            cert: tls.cert.clone(),
            ca: tls.ca.clone(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A CA and a server certificate it issued, valid from `from` to
    /// `until` days from now, written as PEM files under `dir`; returns
    /// the `[tls]` table.
    fn issued(dir: &std::path::Path, from: i64, until: i64, foreign: bool) -> TlsConfig {
        let now = time::OffsetDateTime::now_utc();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec!["puppet".to_owned()]).unwrap();
        leaf.not_before = now + time::Duration::days(from);
        leaf.not_after = now + time::Duration::days(until);
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let trusted = if foreign {
            let other = rcgen::KeyPair::generate().unwrap();
            rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap()
                .self_signed(&other)
                .unwrap()
                .pem()
        } else {
            ca_cert.pem()
        };
        std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("ca.pem"), trusted).unwrap();
        TlsConfig {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: dir.join("ca.pem"),
            crl: None,
            client_auth: ClientAuth::Optional,
            cert_expiry_warning: DEFAULT_EXPIRY_WARNING,
        }
    }

    static NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1_000);

    #[test]
    fn a_stored_session_expires_after_its_max_age() {
        use rustls::server::StoresServerSessions;
        use std::sync::atomic::Ordering::SeqCst;
        let store = MaxAge {
            inner: rustls::server::ServerSessionMemoryCache::new(4),
            max_age: Duration::from_secs(600),
            clock: || NOW.load(SeqCst),
        };
        assert!(store.put(b"a".to_vec(), b"session a".to_vec()));
        assert!(store.put(b"b".to_vec(), b"session b".to_vec()));
        NOW.fetch_add(600, SeqCst);
        assert_eq!(store.get(b"a").as_deref(), Some(&b"session a"[..]));
        assert_eq!(store.take(b"a").as_deref(), Some(&b"session a"[..]));
        assert_eq!(store.take(b"a"), None, "taken once");
        NOW.fetch_add(1, SeqCst);
        assert_eq!(store.take(b"b"), None, "older than its max age");
    }

    /// The check's verdict as the texts `check` prints and `serve` logs.
    fn check(tls: &TlsConfig) -> Result<Option<String>, String> {
        server_certificate_check(tls, SystemTime::now(), DEFAULT_EXPIRY_WARNING)
            .map(|soon| soon.map(|w| w.to_string()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_health_check_validity_refuses_outside_the_window_only() {
        let v = Validity::default();
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(v.refused_at(SystemTime::now()), None);
        v.set(Some((1_000, 2_000)));
        assert_eq!(v.refused_at(at(1_500)), None);
        let expired = v.refused_at(at(2_001)).unwrap().to_string();
        assert_eq!(
            expired,
            "expired: the server certificate expired on 1970-01-01 00:33:20 UTC; agents refuse it"
        );
        let early = v.refused_at(at(999)).unwrap().to_string();
        assert!(early.starts_with("not yet valid: "), "{early}");
        v.set(None);
        assert_eq!(v.refused_at(at(0)), None);
        let dir = tempfile::tempdir().unwrap();
        let served = server_tls(&issued(dir.path(), -30, -1, false)).unwrap();
        v.set(served.validity);
        assert!(matches!(
            v.refused_at(SystemTime::now()),
            Some(OutOfDate::Expired(_))
        ));
    }

    #[test]
    fn a_certificate_agents_would_refuse_fails_and_one_expiring_soon_warns() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(&issued(dir.path(), -1, 365, false)), Ok(None));
        let soon = check(&issued(dir.path(), -1, 10, false)).unwrap().unwrap();
        assert!(
            soon.contains("expires on") && soon.contains(" days)"),
            "{soon}"
        );
        let expired = check(&issued(dir.path(), -30, -1, false)).unwrap_err();
        assert!(expired.contains("expired on"), "{expired}");
        let early = check(&issued(dir.path(), 2, 365, false)).unwrap_err();
        assert!(early.contains("not valid until"), "{early}");
        let foreign = check(&issued(dir.path(), -1, 365, true)).unwrap_err();
        assert!(
            foreign.contains("does not verify against [tls] ca"),
            "{foreign}"
        );
        let later = SystemTime::now() + Duration::from_secs(400 * 86_400);
        assert!(
            server_certificate_check(
                &issued(dir.path(), -1, 365, false),
                later,
                DEFAULT_EXPIRY_WARNING
            )
            .is_err()
        );
    }
}
