//! `pluginsync-master reindex [ENV]`: asks the running master to re-index
//! now (docs/deploys.md#the-explicit-signal), for `index.publish = "explicit"` and for
//! r10k's `postrun` hook.
//!
//! It speaks the admin API the master already serves (`DELETE
//! /puppet-admin-api/v1/environment-cache`, docs/protocol.md §1.10) over the
//! master's own mTLS port, presenting the master's own certificate and key
//! from its config — which the admin API always allows. So there is no
//! second listener, socket file or credential to secure: whoever can read
//! the master's private key can already be the master. The master's
//! certificate is checked against `tls.ca` under the name the certificate
//! itself carries (its first DNS name, or its CN), or the host of
//! `--server`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use pluginsync_common::config::ConfigError;
use pluginsync_common::envname::{EnvName, InvalidEnvName};
use pluginsync_common::tls::TlsError;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::MasterConfig;
use crate::handlers::admin::ENVIRONMENT_CACHE;

/// The whole call may take this long (the master answers once the index is
/// rebuilt, which for a large tree takes seconds).
const DEADLINE: Duration = Duration::from_secs(300);

/// Why the re-index was not done. Printed by the binary as one line, each
/// cause after `: `.
#[derive(Debug, thiserror::Error)]
pub enum ReindexError {
    /// `ENV` is not an environment name.
    #[error(transparent)]
    Environment(#[from] InvalidEnvName),
    /// The master's certificate, key or CA could not be loaded.
    #[error(transparent)]
    Files(#[from] TlsError),
    /// The config names no usable address.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `listen` is empty.
    #[error("listen names no address")]
    NoListen,
    /// `listen`'s port is 0: only the running master knows its port.
    #[error("listen port is 0: name the master with --server https://HOST:PORT")]
    PortZero,
    /// `--server` is not `https://HOST:PORT`.
    #[error("--server '{0}' must be https://HOST:PORT")]
    BadServer(String),
    /// `--server`'s host does not resolve.
    #[error("cannot resolve '{host}'")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// `--server`'s host resolves to nothing.
    #[error("'{0}' resolves to no address")]
    NoAddress(String),
    /// The master's own certificate is not X.509.
    #[error("the master's certificate does not parse: {0}")]
    CertUnparsable(x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// The master's own certificate has neither a DNS name nor a CN.
    #[error("the master's certificate names no host: {0}")]
    NoHost(crate::auth::NoIdentity),
    /// The name to check the master's certificate against is no host name.
    #[error("'{0}' is not a host name")]
    NotAHost(String),
    /// rustls refused the protocol versions.
    #[error(transparent)]
    Tls(rustls::Error),
    /// The certificate and key of the config are not a pair.
    #[error("the master's certificate and key do not match")]
    KeyMismatch(#[source] rustls::Error),
    /// No address of the master took the connection.
    #[error("cannot connect to the master at {addrs}")]
    Connect {
        /// The addresses tried.
        addrs: String,
        /// The last connection error.
        source: std::io::Error,
    },
    /// The TLS handshake with the master failed.
    #[error("TLS with the master at {addr} ({name})")]
    Handshake {
        /// The master's address.
        addr: String,
        /// The name its certificate was checked against.
        name: String,
        /// What failed.
        source: std::io::Error,
    },
    /// Sending the request or reading the answer failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// No answer within [`DEADLINE`].
    #[error("the master at {addr} did not answer in {} s", DEADLINE.as_secs())]
    Timeout {
        /// The master's addresses.
        addr: String,
    },
    /// The answer is not HTTP.
    #[error("the master at {addr} sent no HTTP answer")]
    NoAnswer {
        /// The master's addresses.
        addr: String,
    },
    /// 403: the admin API does not take this certificate as the master's.
    #[error(
        "the master at {addr} refused the re-index (403): its certificate is not the one in this config"
    )]
    Refused {
        /// The master's addresses.
        addr: String,
    },
    /// Any other status.
    #[error("the master at {addr} answered {status}: {body}")]
    Status {
        /// The master's addresses.
        addr: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body, control characters removed.
        body: String,
    },
}

/// Re-indexes `env` (every environment for `None`) on the master that
/// `config` describes, or on `server` (`https://host:port`). Returns what
/// to print.
pub async fn run(
    config: &MasterConfig,
    env: Option<&str>,
    server: Option<&str>,
) -> Result<String, ReindexError> {
    let env: Option<EnvName> = env.map(str::parse).transpose()?;
    let target = match &env {
        Some(e) => format!("{ENVIRONMENT_CACHE}?environment={e}"),
        None => ENVIRONMENT_CACHE.to_owned(),
    };
    let Answer { addr, status, body } = call(config, server, "DELETE", &target).await?;
    let what = env.as_ref().map_or("every environment", EnvName::as_str);
    match status {
        204 => Ok(format!("re-indexed {what}")),
        403 => Err(ReindexError::Refused { addr }),
        status => {
            let body: String = body.chars().filter(|c| !c.is_control()).take(200).collect();
            Err(ReindexError::Status { addr, status, body })
        }
    }
}

/// A master's answer to an admin API call.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The address that answered.
    pub addr: String,
    /// The HTTP status.
    pub status: u16,
    /// The body (at most 64 KiB, lossily UTF-8).
    pub body: String,
}

/// Sends `METHOD target` (no body) to the master that `config` describes,
/// or to `server` (`https://host:port`), as the master's own certificate
/// (the admin API always allows it), and reads the whole answer.
pub async fn call(
    config: &MasterConfig,
    server: Option<&str>,
    method: &str,
    target: &str,
) -> Result<Answer, ReindexError> {
    // The answer is a status line, headers and a short body; 64 KiB is
    // plenty.
    call_bounded(config, server, method, target, 64 * 1024).await
}

/// [`call`], reading at most `max_bytes` of the answer (an inventory
/// page is larger than a status).
pub async fn call_bounded(
    config: &MasterConfig,
    server: Option<&str>,
    method: &str,
    target: &str,
    max_bytes: u64,
) -> Result<Answer, ReindexError> {
    pluginsync_common::tls::install_default_provider();
    let (certs, key) =
        pluginsync_common::tls::load_identity("certificate", &config.tls.cert, &config.tls.key)?;
    let roots = pluginsync_common::tls::load_roots(&config.tls.ca)?;
    let (addrs, name) = match server {
        Some(url) => target_of_url(url)?,
        None => (vec![local_addr(config)?], own_name(&certs[0])?),
    };
    let tls = rustls::ClientConfig::builder_with_provider(pluginsync_common::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(ReindexError::Tls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(ReindexError::KeyMismatch)?;
    let server_name =
        ServerName::try_from(name.clone()).map_err(|_| ReindexError::NotAHost(name.clone()))?;
    let call = async {
        // Every address the name resolves to, in turn: `localhost` is
        // `::1` first on some systems while the master listens on
        // 127.0.0.1.
        let tcp = tokio::net::TcpStream::connect(&addrs[..])
            .await
            .map_err(|source| ReindexError::Connect {
                addrs: shown(&addrs),
                source,
            })?;
        let addr = tcp
            .peer_addr()
            .map_or_else(|_| shown(&addrs), |a| a.to_string());
        let mut stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(server_name, tcp)
            .await
            .map_err(|source| ReindexError::Handshake {
                addr,
                name: name.clone(),
                source,
            })?;
        let request =
            format!("{method} {target} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(max_bytes)
            .read_to_end(&mut answer)
            .await?;
        Ok::<_, ReindexError>(answer)
    };
    let addr = shown(&addrs);
    let answer = tokio::time::timeout(DEADLINE, call)
        .await
        .map_err(|_| ReindexError::Timeout { addr: addr.clone() })??;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| ReindexError::NoAnswer { addr: addr.clone() })?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok(Answer { addr, status, body })
}

/// The first `listen` address, a wildcard taken as loopback.
fn local_addr(config: &MasterConfig) -> Result<SocketAddr, ReindexError> {
    let mut addr = *config
        .listen_addrs()?
        .first()
        .ok_or(ReindexError::NoListen)?;
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
        IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
        _ => {}
    }
    if addr.port() == 0 {
        return Err(ReindexError::PortZero);
    }
    Ok(addr)
}

/// Addresses as an error message names them.
fn shown(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `https://host:port` → the addresses to try and the name to check.
fn target_of_url(url: &str) -> Result<(Vec<SocketAddr>, String), ReindexError> {
    let bad = || ReindexError::BadServer(url.to_owned());
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(bad)?
        .trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|source| ReindexError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(ReindexError::NoAddress(host.to_owned()));
    }
    Ok((addrs, host.to_owned()))
}

/// The name the master's certificate is for: its first DNS name, else its
/// CN.
fn own_name(der: &[u8]) -> Result<String, ReindexError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(ReindexError::CertUnparsable)?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                return Ok((*d).to_owned());
            }
        }
    }
    crate::auth::certname_of(der).map_err(ReindexError::NoHost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        let (addrs, name) = target_of_url("https://127.0.0.1:8140/").unwrap();
        assert_eq!((addrs[0].port(), name.as_str()), (8140, "127.0.0.1"));
        assert!(target_of_url("http://localhost:8140").is_err());
        assert!(target_of_url("https://localhost").is_err());
    }
}
