//! How the PostgreSQL backend connects (docs/operating.md#the-state-store):
//! a `postgresql://` URL read with libpq's meaning of `sslmode` and
//! `sslrootcert`, the TLS that follows from them (the project's rustls
//! with ring), and the bounded pool.
//!
//! | `sslmode` | TLS | plaintext | certificate |
//! |---|---|---|---|
//! | `disable` | never | yes | — |
//! | `prefer` (libpq's default) | tried first | if the server has no TLS | not verified |
//! | `require` | always | no | not verified (verified as `verify-ca` with `sslrootcert`, as libpq) |
//! | `verify-ca` | always | no | chain to `sslrootcert` |
//! | `verify-full` | always | no | chain to `sslrootcert` and the host's name |
//!
//! A host that is a directory (`host=/run/postgresql`) is a Unix socket,
//! never TLS (as libpq).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};

/// A PostgreSQL failure, as one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PgError(pub String);

impl From<String> for PgError {
    fn from(s: String) -> PgError {
        PgError(s)
    }
}

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What the URL asks of the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    /// Nothing (`disable`, `prefer`, `require` without `sslrootcert`).
    No,
    /// The chain to the CA file.
    Ca,
    /// The chain and the host's name.
    Full,
}

/// The URL split into what tokio-postgres reads and what we do.
#[derive(Debug)]
pub struct Target {
    config: tokio_postgres::Config,
    verify: Verify,
    root: Option<String>,
}

/// `url` read with libpq's `sslmode`/`sslrootcert`; the error is one line
/// (without the password).
pub fn parse(url: &str) -> Result<Target, PgError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut rest = Vec::new();
    let (mut mode, mut root) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslmode", v)) => mode = Some(v.to_owned()),
            Some(("sslrootcert", v)) => root = Some(decode(v)),
            _ => rest.push(pair),
        }
    }
    let plain = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config = tokio_postgres::Config::from_str(&plain).map_err(|e| e.to_string())?;
    let (ssl, verify) = match mode.as_deref().unwrap_or("prefer") {
        "disable" => (SslMode::Disable, Verify::No),
        "prefer" => (SslMode::Prefer, Verify::No),
        "require" if root.is_some() => (SslMode::Require, Verify::Ca),
        "require" => (SslMode::Require, Verify::No),
        "verify-ca" => (SslMode::Require, Verify::Ca),
        "verify-full" => (SslMode::Require, Verify::Full),
        other => {
            return Err(format!(
                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            )
            .into());
        }
    };
    if verify != Verify::No && root.is_none() {
        return Err(format!(
            "sslmode={} needs sslrootcert=FILE (the CA that signed the server's certificate)",
            mode.unwrap_or_default()
        )
        .into());
    }
    // A Unix socket is never TLS (libpq ignores sslmode there).
    let unix = (config.get_hosts().iter()).all(|h| matches!(h, Host::Unix(_)));
    config.ssl_mode(if unix { SslMode::Disable } else { ssl });
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    Ok(Target {
        config,
        verify,
        root,
    })
}

/// `%XX` escapes decoded (a path in a URL).
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pool of at most `max` connections to `target`, each checkout
/// bounded by `timeout`.
pub fn pool(target: Target, max: u32, timeout: Duration) -> Result<Pool, PgError> {
    let recycle = || ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    // No TLS connector at all for a Unix socket (tokio-postgres would ask
    // one for the socket's name).
    let manager = if target.config.get_ssl_mode() == SslMode::Disable {
        Manager::from_config(target.config, tokio_postgres::NoTls, recycle())
    } else {
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_tls(&target)?);
        Manager::from_config(target.config, tls, recycle())
    };
    Pool::builder(manager)
        .max_size(max as usize)
        .runtime(Runtime::Tokio1)
        .timeouts(Timeouts {
            wait: Some(timeout),
            create: Some(timeout),
            recycle: Some(timeout),
        })
        .build()
        .map_err(|e| PgError(e.to_string()))
}

/// The rustls client configuration for `target` (module docs' table).
fn client_tls(target: &Target) -> Result<rustls::ClientConfig, PgError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match (&target.root, target.verify) {
        (Some(path), verify) if verify != Verify::No => {
            let roots = roots(path)?;
            let webpki =
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| format!("sslrootcert={path}: {e}"))?;
            let verifier: Arc<dyn ServerCertVerifier> = if verify == Verify::Full {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider))),
    };
    Ok(config.with_no_client_auth())
}

/// The CA certificates of `path` (PEM).
fn roots(path: &str) -> Result<Arc<rustls::RootCertStore>, PgError> {
    use rustls::pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    let certs =
        CertificateDer::pem_file_iter(path).map_err(|e| format!("sslrootcert={path}: {e}"))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("sslrootcert={path}: {e}"))?;
        store
            .add(cert)
            .map_err(|e| format!("sslrootcert={path}: {e}"))?;
    }
    if store.is_empty() {
        return Err(format!("sslrootcert={path}: no certificate in it").into());
    }
    Ok(Arc::new(store))
}

/// `verify-ca` (and `require` with a root): the chain is checked, the name
/// is not (libpq's meaning).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root: encrypted, the certificate not
/// checked (libpq's meaning; the URL said so), the handshake's signatures
/// still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_read_as_libpq_reads_it() {
        let t = parse("postgresql://ps@127.0.0.1:5432/ps").unwrap();
        assert_eq!(
            (t.config.get_ssl_mode(), t.verify),
            (SslMode::Prefer, Verify::No)
        );
        let t = parse("postgresql://ps@db/ps?sslmode=disable&application_name=m").unwrap();
        assert_eq!(
            (t.config.get_ssl_mode(), t.verify),
            (SslMode::Disable, Verify::No)
        );
        let t =
            parse("postgresql://ps@db/ps?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem").unwrap();
        assert_eq!(
            (t.config.get_ssl_mode(), t.verify),
            (SslMode::Require, Verify::Full)
        );
        assert_eq!(t.root.as_deref(), Some("/etc/ca.pem"));
        let t = parse("postgresql://ps@db/ps?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(
            t.verify,
            Verify::Ca,
            "require with a root verifies as libpq does"
        );
        let e = parse("postgresql://ps@db/ps?sslmode=verify-ca")
            .unwrap_err()
            .0;
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = parse("postgresql://ps@db/ps?sslmode=allow-anything")
            .unwrap_err()
            .0;
        assert!(e.contains("sslmode=allow-anything"), "{e}");
        let t = parse("postgresql://ps@%2Frun%2Fpostgresql/ps").unwrap();
        assert!(matches!(
            t.config.get_hosts(),
            [Host::Unix(p)] if p.as_os_str() == "/run/postgresql"
        ));
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
    }

    #[test]
    fn a_verifying_mode_reads_its_ca_or_fails_with_one_line() {
        let t = parse("postgresql://ps@db/ps?sslmode=verify-full&sslrootcert=/nonexistent.pem")
            .unwrap();
        let e = client_tls(&t).unwrap_err().0;
        assert!(e.starts_with("sslrootcert=/nonexistent.pem"), "{e}");
        assert!(!e.contains('\n'));
    }
}
