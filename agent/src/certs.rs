//! Certificate problems in words an operator acts on
//! (docs/tls.md#certificate-checks): this node's certificate is checked before
//! any
//! connection (expired, not yet valid, expiring within `[tls]
//! cert_expiry_warning`), and a failed TLS handshake is turned into one
//! line naming its cause — the master refused this node's certificate
//! (expired, revoked, from a CA it does not trust), or the master's own
//! certificate is expired, not yet valid, not for that name, revoked or not
//! from `[tls] ca` — instead of `connection closed` or `DecryptError`.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rustls::{AlertDescription as A, CertificateError as C, Error as R};

use crate::config::TlsFiles;

/// This node's certificate cannot be used now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// The validity of the first certificate of the PEM file `path`, as Unix
/// seconds (not before, not after), if it can be read.
pub fn validity(path: &Path) -> Option<(i64, i64)> {
    let pem = std::fs::read(path).ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// A Unix time as a UTC date and time, e.g. `2026-11-24 00:00:00 UTC`.
pub fn date(unix: i64) -> String {
    pluginsync_common::tls::utc(unix)
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Checks this node's certificate at `cert` before connecting: `Err` when
/// it is expired or not yet valid (no master would accept it), `Ok(Some)`
/// with a warning when it expires within `warn_within`. A certificate that
/// cannot be parsed is left to the TLS stack's own error.
pub fn check_own(
    cert: &Path,
    now: SystemTime,
    warn_within: Duration,
) -> Result<Option<String>, Unusable> {
    let Some((not_before, not_after)) = validity(cert) else {
        return Ok(None);
    };
    let now = unix(now);
    if now > not_after {
        return Err(Unusable(format!(
            "this node's certificate '{}' expired on {}: renew it (e.g. `puppet ssl clean` then `puppet ssl bootstrap`)",
            cert.display(),
            date(not_after)
        )));
    }
    if now < not_before {
        return Err(Unusable(format!(
            "this node's certificate '{}' is not valid until {}: check this node's clock",
            cert.display(),
            date(not_before)
        )));
    }
    let left = not_after - now;
    Ok((left < warn_within.as_secs() as i64).then(|| {
        format!(
            "this node's certificate '{}' expires on {} (in {} days)",
            cert.display(),
            date(not_after),
            left / 86_400
        )
    }))
}

/// The cause of a failed TLS handshake in `e`'s chain, in words, if it is
/// a TLS error.
pub fn explain(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(tls) = err.downcast_ref::<R>() {
            return Some(explain_rustls(tls));
        }
        // An `io::Error`'s `source()` skips the error it wraps.
        if let Some(tls) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<R>())
        {
            return Some(explain_rustls(tls));
        }
        cur = err.source();
    }
    None
}

fn explain_rustls(e: &R) -> String {
    match e {
        R::AlertReceived(A::CertificateExpired) => {
            "the master refused this node's certificate as expired (check this node's clock and the certificate's dates)".into()
        }
        R::AlertReceived(A::CertificateRevoked) => {
            "the master refused this node's certificate: it is revoked".into()
        }
        // rustls answers a client certificate from another CA with
        // `decrypt_error`, Java (Puppet Server) with `certificate_unknown`
        // or `bad_certificate`.
        R::AlertReceived(
            A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::DecryptError | A::AccessDenied,
        ) => "the master does not trust this node's certificate (not issued by the master's CA)"
            .into(),
        R::AlertReceived(A::CertificateRequired) => {
            "the master requires a client certificate and got none".into()
        }
        R::AlertReceived(other) => format!(
            "the master ended the TLS handshake ({})",
            pluginsync_common::tls::alert_name(other)
        ),
        R::InvalidCertificate(c) => match c {
            C::Expired => "the master's certificate has expired".into(),
            C::ExpiredContext { not_after, .. } => format!(
                "the master's certificate expired on {}",
                date(not_after.as_secs() as i64)
            ),
            C::NotValidYet => "the master's certificate is not valid yet".into(),
            C::NotValidYetContext { not_before, .. } => format!(
                "the master's certificate is not valid until {} (check this node's clock)",
                date(not_before.as_secs() as i64)
            ),
            C::NotValidForName => "the master's certificate is not for the server name in `servers`".into(),
            C::NotValidForNameContext { expected, presented } => format!(
                "the master's certificate is not for {} (it names {})",
                expected.to_str(),
                pluginsync_common::tls::plain_names(presented)
            ),
            C::Revoked => "the master's certificate is revoked (by the CRL)".into(),
            C::UnknownIssuer | C::BadSignature => {
                "the master's certificate is not issued by the CA of [tls] ca".into()
            }
            C::UnknownRevocationStatus => {
                "the master's certificate has no CRL in the bundle to check it against".into()
            }
            other => format!(
                "the master's certificate is invalid: {}",
                pluginsync_common::tls::describe_certificate(other)
            ),
        },
        other => format!(
            "TLS handshake failed: {}",
            pluginsync_common::tls::describe(other)
        ),
    }
}

/// Asks `server` once more, over a plain TLS connection with the run's
/// files, why it closed the connection: a master that refuses a client
/// certificate under TLS 1.3 does so after the handshake, with an alert
/// that the HTTP client only reports as "connection closed". Returns the
/// cause in words when the probe meets a TLS error; bounded to 5 s.
pub async fn probe(server: &str, tls: &TlsFiles) -> Option<String> {
    use pluginsync_common::tls::{load_identity, load_roots, provider};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = reqwest::Url::parse(server).ok()?;
    let host = url.host_str()?.trim_matches(['[', ']']).to_owned();
    let port = url.port_or_known_default()?;
    let (certs, key) = load_identity("certificate", &tls.cert, &tls.key).ok()?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(load_roots(&tls.ca).ok()?)
        .with_client_auth_cert(certs, key)
        .ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(host.clone()).ok()?;
    let ask = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .ok()?;
        let mut s = match connector.connect(name, tcp).await {
            Ok(s) => s,
            Err(e) => return explain(&e),
        };
        let request =
            format!("GET /status/v1/simple HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        if let Err(e) = s.write_all(request.as_bytes()).await {
            return explain(&e);
        }
        let mut byte = [0u8; 1];
        match s.read(&mut byte).await {
            Err(e) => explain(&e),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_named() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            R::InvalidCertificate(C::UnknownIssuer),
        );
        assert_eq!(
            explain(&io).unwrap(),
            "the master's certificate is not issued by the CA of [tls] ca"
        );
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            R::AlertReceived(A::UnknownCA),
        );
        assert!(
            explain(&alert)
                .unwrap()
                .contains("does not trust this node")
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(explain(&plain), None);
    }

    #[test]
    fn dates_read_as_dates() {
        assert_eq!(date(0), "1970-01-01 00:00:00 UTC");
    }
}
