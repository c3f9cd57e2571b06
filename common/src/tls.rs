//! Loading PEM material for rustls, with errors that name the file.
//!
//! Both sides read the same kinds of files (a CA bundle, a certificate chain,
//! a private key, an optional CRL), either from explicit paths or from a
//! Puppet-style ssldir. Only rustls' ring provider is ever used:
//! [`provider`] is the one place it is chosen.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// A TLS file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {what} '{}': {source}", path.display())]
    Read {
        /// What the file was supposed to be.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but holds no usable PEM item of the expected kind.
    #[error("{what} '{}' {reason}", path.display())]
    Invalid {
        /// What the file was supposed to be.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The private key is not the certificate's (rustls' `KeyMismatch`).
    #[error(
        "private key '{}' does not match certificate '{}': the key must be the one the certificate was issued for",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
    },
}

/// The one crypto provider pluginsync uses: ring, its cipher suites with
/// AES-128-GCM/SHA-256 first ([`cheap_first`]).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(cheap_first(rustls::crypto::ring::default_provider()))
}

/// Installs [`provider`] as the process default (needed by reqwest's
/// `rustls-no-provider`). Safe to call more than once.
pub fn install_default_provider() {
    let _already_installed =
        cheap_first(rustls::crypto::ring::default_provider()).install_default();
}

/// Orders `provider`'s cipher suites so that those hashing with SHA-256
/// come first: ring's default offers `TLS13_AES_256_GCM_SHA384` first, and
/// a TLS 1.3 handshake runs its whole key schedule and transcript through
/// the suite's hash — SHA-384 in software, where SHA-256 runs on the CPU's
/// SHA extensions. With it first, every handshake between our agent and our
/// master (the client's order decides; the master keeps rustls' default
/// of honouring it, so a stock agent gets the suite it prefers) costs the
/// master less CPU per run (docs/internals.md#sha-256-suites-first). The
/// set of suites is unchanged: AES-128-GCM is one of TLS 1.3's mandatory
/// suites, and every suite of ring's default stays on offer.
fn cheap_first(mut provider: CryptoProvider) -> CryptoProvider {
    use rustls::CipherSuite::{
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        TLS13_AES_128_GCM_SHA256,
    };
    let cheap = |s: &rustls::SupportedCipherSuite| {
        matches!(
            s.suite(),
            TLS13_AES_128_GCM_SHA256
                | TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    };
    // Stable: otherwise ring's order (TLS 1.3 suites before TLS 1.2 ones).
    provider
        .cipher_suites
        .sort_by_key(|s| (s.version() != &rustls::version::TLS13, !cheap(s)));
    provider
}

/// Reads a PEM file whole, for a TLS stack that parses it itself (the
/// agent hands these bytes to reqwest); the error names `what` and the file.
pub fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Reads a client identity as one PEM buffer: the certificate (chain), a
/// newline, then the private key, as reqwest's `Identity::from_pem` takes
/// it. A key that parses but is not the certificate's is
/// [`TlsError::KeyMismatch`]; files that do not parse are left to the TLS
/// stack to report.
pub fn read_identity_pem(cert: &Path, key: &Path) -> Result<Vec<u8>, TlsError> {
    let cert_pem = read_pem("certificate", cert)?;
    let key_pem = read_pem("private key", key)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<Vec<_>, _>>();
    if let (Ok(certs), Ok(private)) = (certs, PrivateKeyDer::from_pem_slice(&key_pem)) {
        check_pair(cert, &certs, key, &private)?;
    }
    let mut pem = cert_pem;
    pem.push(b'\n');
    pem.extend(key_pem);
    Ok(pem)
}

/// Reads a certificate chain (`what`, at `cert`) and its private key and
/// checks that they are a pair ([`TlsError::KeyMismatch`] otherwise).
pub fn load_identity(
    what: &'static str,
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let certs = load_certs(what, cert)?;
    let private = load_key(key)?;
    check_pair(cert, &certs, key, &private)?;
    Ok((certs, private))
}

/// [`TlsError::KeyMismatch`] when `key` is not the private key of the
/// first certificate of `certs`; a key or certificate whose public key
/// cannot be compared passes (the TLS stack reports it when used).
fn check_pair(
    cert_path: &Path,
    certs: &[CertificateDer<'_>],
    key_path: &Path,
    key: &PrivateKeyDer<'_>,
) -> Result<(), TlsError> {
    let Ok(signer) = provider().key_provider.load_private_key(key.clone_key()) else {
        return Ok(());
    };
    let chain = certs.iter().map(|c| c.clone().into_owned()).collect();
    match rustls::sign::CertifiedKey::new(chain, signer).keys_match() {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// A Unix time as a date in UTC, `2026-11-24 09:30:00 UTC`, for every
/// line that names a certificate's dates.
pub fn utc(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map(|t| {
            format!(
                "{} {:02}:{:02}:{:02} UTC",
                t.date(),
                t.hour(),
                t.minute(),
                t.second()
            )
        })
        .unwrap_or_else(|_| format!("{unix} (Unix time)"))
}

/// A rustls error in words for a log line or an error line: dates in UTC
/// instead of seconds since 1970, names as they were typed instead of
/// `DnsName("…")`, alerts by their TLS name (docs/tls.md#certificate-checks).
pub fn describe(e: &rustls::Error) -> String {
    use rustls::Error as R;
    match e {
        R::InvalidCertificate(c) => {
            format!("invalid peer certificate: {}", describe_certificate(c))
        }
        R::AlertReceived(a) => format!("received fatal alert: {}", alert_name(a)),
        R::InconsistentKeys(_) => "the private key does not match the certificate".into(),
        other => other.to_string(),
    }
}

/// [`describe`] for the rustls error inside an I/O error (a handshake's);
/// any other error as it displays.
pub fn describe_io(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => describe(tls),
        None => e.to_string(),
    }
}

/// A certificate error in words ([`describe`]).
pub fn describe_certificate(c: &rustls::CertificateError) -> String {
    use rustls::CertificateError as C;
    match c {
        C::ExpiredContext { time, not_after } => format!(
            "certificate expired on {} (checked at {})",
            utc(not_after.as_secs() as i64),
            utc(time.as_secs() as i64)
        ),
        C::NotValidYetContext { time, not_before } => format!(
            "certificate is not valid until {} (checked at {})",
            utc(not_before.as_secs() as i64),
            utc(time.as_secs() as i64)
        ),
        C::ExpiredRevocationListContext { time, next_update } => format!(
            "the CRL expired on {} (checked at {})",
            utc(next_update.as_secs() as i64),
            utc(time.as_secs() as i64)
        ),
        C::NotValidForNameContext {
            expected,
            presented,
        } => format!(
            "certificate is not for {} (it names {})",
            expected.to_str(),
            plain_names(presented)
        ),
        other => other.to_string(),
    }
}

/// The names of a certificate as rustls lists them (`DnsName("puppet")`,
/// `IpAddress(10.0.0.1)`), as an operator writes them: `puppet, 10.0.0.1`.
pub fn plain_names(presented: &[String]) -> String {
    if presented.is_empty() {
        return "no name".into();
    }
    let plain = |n: &str| -> String {
        for wrapper in ["DnsName(", "IpAddress(", "UniformResourceIdentifier("] {
            if let Some(inner) = n.strip_prefix(wrapper).and_then(|r| r.strip_suffix(')')) {
                return inner.trim_matches('"').to_owned();
            }
        }
        n.to_owned()
    };
    presented
        .iter()
        .map(|n| plain(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A TLS alert by its name in the TLS specification (`handshake_failure`,
/// `unknown_ca`), from rustls' variant name.
pub fn alert_name(a: &rustls::AlertDescription) -> String {
    let camel = format!("{a:?}");
    let mut out = String::with_capacity(camel.len() + 4);
    let mut previous_lower = false;
    for ch in camel.chars() {
        if ch.is_ascii_uppercase() && previous_lower {
            out.push('_');
        }
        previous_lower = ch.is_ascii_lowercase() || ch.is_ascii_digit();
        out.push(ch.to_ascii_lowercase());
    }
    out
}

fn invalid(what: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        what,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Reads every certificate of a PEM file (a chain or a CA bundle).
pub fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "holds no CERTIFICATE block"));
    }
    Ok(certs)
}

/// Reads a private key (PKCS#8, PKCS#1 or SEC1 PEM).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_pem("private key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        invalid(
            "private key",
            path,
            format!("holds no usable private key: {e}"),
        )
    })
}

/// Reads every CRL of a PEM file.
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let pem = read_pem("CRL", path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("CRL", path, format!("is not valid PEM: {e}")))?;
    if crls.is_empty() {
        return Err(invalid("CRL", path, "holds no X509 CRL block"));
    }
    Ok(crls)
}

/// Builds a root store holding exactly the CA bundle at `path`.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs("CA bundle", path)? {
        roots.add(cert).map_err(|e| {
            invalid(
                "CA bundle",
                path,
                format!("holds an unusable CA certificate: {e}"),
            )
        })?;
    }
    Ok(roots)
}

/// The files of a Puppet-style ssldir for one certname (docs/protocol.md §5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslDirPaths {
    /// `certs/ca.pem`.
    pub ca: PathBuf,
    /// `certs/<certname>.pem`.
    pub cert: PathBuf,
    /// `private_keys/<certname>.pem`.
    pub key: PathBuf,
    /// `crl.pem`.
    pub crl: PathBuf,
}

impl SslDirPaths {
    /// The paths of `certname`'s files under `ssldir`.
    pub fn new(ssldir: &Path, certname: &str) -> Self {
        SslDirPaths {
            ca: ssldir.join("certs").join("ca.pem"),
            cert: ssldir.join("certs").join(format!("{certname}.pem")),
            key: ssldir.join("private_keys").join(format!("{certname}.pem")),
            crl: ssldir.join("crl.pem"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_suites_are_offered_first_and_none_is_dropped() {
        let ring = rustls::crypto::ring::default_provider();
        let ours = provider();
        let names = |p: &CryptoProvider| {
            let mut v: Vec<_> = p.cipher_suites.iter().map(|s| s.suite()).collect();
            v.sort_by_key(|s| u16::from(*s));
            v
        };
        assert_eq!(names(&ring), names(&ours));
        let order: Vec<_> = ours.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(order[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        // TLS 1.3 suites still come before every TLS 1.2 one.
        let last13 = ours
            .cipher_suites
            .iter()
            .rposition(|s| s.version() == &rustls::version::TLS13)
            .unwrap();
        assert!(
            ours.cipher_suites[..=last13]
                .iter()
                .all(|s| s.version() == &rustls::version::TLS13)
        );
        assert_eq!(
            order[last13 + 1],
            rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        );
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let e = load_certs("CA bundle", &missing).unwrap_err().to_string();
        assert!(
            e.contains("nope.pem") && e.starts_with("cannot read CA bundle"),
            "{e}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "hello\n").unwrap();
        let e = load_certs("certificate", &empty).unwrap_err().to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no CERTIFICATE"),
            "{e}"
        );
        assert!(
            load_key(&empty)
                .unwrap_err()
                .to_string()
                .contains("no usable private key")
        );
        assert!(
            load_crls(&empty)
                .unwrap_err()
                .to_string()
                .contains("no X509 CRL")
        );
    }

    #[test]
    fn identity_is_the_certificate_then_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, "C").unwrap();
        let e = read_identity_pem(&cert, &key).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot read private key") && e.contains("key.pem"),
            "{e}"
        );
        std::fs::write(&key, "K").unwrap();
        assert_eq!(read_identity_pem(&cert, &key).unwrap(), b"C\nK");
    }

    #[test]
    fn rustls_errors_read_in_words() {
        use rustls::pki_types::{ServerName, UnixTime};
        use rustls::{AlertDescription as A, CertificateError as C, Error as R};
        let at = |s: u64| UnixTime::since_unix_epoch(std::time::Duration::from_secs(s));
        let expired = R::InvalidCertificate(C::ExpiredContext {
            time: at(86_400 * 2),
            not_after: at(86_400),
        });
        assert_eq!(
            describe(&expired),
            "invalid peer certificate: certificate expired on 1970-01-02 00:00:00 UTC (checked at 1970-01-03 00:00:00 UTC)"
        );
        let name = C::NotValidForNameContext {
            expected: ServerName::try_from("localhost").unwrap().to_owned(),
            presented: vec!["DnsName(\"puppet\")".into(), "IpAddress(10.0.0.1)".into()],
        };
        assert_eq!(
            describe_certificate(&name),
            "certificate is not for localhost (it names puppet, 10.0.0.1)"
        );
        assert_eq!(alert_name(&A::HandshakeFailure), "handshake_failure");
        assert_eq!(alert_name(&A::UnknownCA), "unknown_ca");
        assert_eq!(
            describe(&R::AlertReceived(A::DecryptError)),
            "received fatal alert: decrypt_error"
        );
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, expired);
        assert!(describe_io(&io).contains("expired on 1970-01-02"));
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    }

    #[test]
    fn ssldir_layout() {
        let p = SslDirPaths::new(Path::new("/ssl"), "node1");
        assert_eq!(p.cert, PathBuf::from("/ssl/certs/node1.pem"));
        assert_eq!(p.key, PathBuf::from("/ssl/private_keys/node1.pem"));
        assert_eq!(p.ca, PathBuf::from("/ssl/certs/ca.pem"));
        assert_eq!(p.crl, PathBuf::from("/ssl/crl.pem"));
    }
}
