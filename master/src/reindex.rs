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

use anyhow::{Context, anyhow, bail};
use pluginsync_common::envname::EnvName;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::MasterConfig;
use crate::handlers::admin::ENVIRONMENT_CACHE;

/// The whole call may take this long (the master answers once the index is
/// rebuilt, which for a large tree takes seconds).
const DEADLINE: Duration = Duration::from_secs(300);

/// Re-indexes `env` (every environment for `None`) on the master that
/// `config` describes, or on `server` (`https://host:port`). Returns what
/// to print.
pub async fn run(
    config: &MasterConfig,
    env: Option<&str>,
    server: Option<&str>,
) -> anyhow::Result<String> {
    pluginsync_common::tls::install_default_provider();
    let env: Option<EnvName> = env
        .map(|e| e.parse().map_err(|err| anyhow!("{err}")))
        .transpose()?;
    let certs = pluginsync_common::tls::load_certs("certificate", &config.tls.cert)?;
    let key = pluginsync_common::tls::load_key(&config.tls.key)?;
    let roots = pluginsync_common::tls::load_roots(&config.tls.ca)?;
    let (addrs, name) = match server {
        Some(url) => target_of_url(url)?,
        None => (vec![local_addr(config)?], own_name(&certs[0])?),
    };
    let tls = rustls::ClientConfig::builder_with_provider(pluginsync_common::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .context("the master's certificate and key do not match")?;
    let server_name =
        ServerName::try_from(name.clone()).map_err(|_| anyhow!("'{name}' is not a host name"))?;
    let target = match &env {
        Some(e) => format!("{ENVIRONMENT_CACHE}?environment={e}"),
        None => ENVIRONMENT_CACHE.to_owned(),
    };
    let call = async {
        // Every address the name resolves to, in turn: `localhost` is
        // `::1` first on some systems while the master listens on
        // 127.0.0.1.
        let tcp = tokio::net::TcpStream::connect(&addrs[..])
            .await
            .with_context(|| format!("cannot connect to the master at {}", shown(&addrs)))?;
        let addr = tcp
            .peer_addr()
            .map_or_else(|_| shown(&addrs), |a| a.to_string());
        let mut stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(server_name, tcp)
            .await
            .with_context(|| format!("TLS with the master at {addr} ({name})"))?;
        let request =
            format!("DELETE {target} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        // The answer is a status line, headers and at most a short error
        // body; 64 KiB is plenty.
        (&mut stream)
            .take(64 * 1024)
            .read_to_end(&mut answer)
            .await?;
        anyhow::Ok(answer)
    };
    let addr = shown(&addrs);
    let answer = tokio::time::timeout(DEADLINE, call)
        .await
        .map_err(|_| anyhow!("the master at {addr} did not answer in {DEADLINE:?}"))??;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("the master at {addr} sent no HTTP answer"))?;
    let what = env.as_ref().map_or("every environment", EnvName::as_str);
    match status {
        204 => Ok(format!("re-indexed {what}")),
        403 => bail!(
            "the master at {addr} refused the re-index (403): its certificate is not the one in this config"
        ),
        other => {
            let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
            let body: String = body.chars().filter(|c| !c.is_control()).take(200).collect();
            bail!("the master at {addr} answered {other}: {body}")
        }
    }
}

/// The first `listen` address, a wildcard taken as loopback.
fn local_addr(config: &MasterConfig) -> anyhow::Result<SocketAddr> {
    let mut addr = *config
        .listen_addrs()?
        .first()
        .ok_or_else(|| anyhow!("listen names no address"))?;
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
        IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
        _ => {}
    }
    if addr.port() == 0 {
        bail!("listen port is 0: name the master with --server https://HOST:PORT");
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
fn target_of_url(url: &str) -> anyhow::Result<(Vec<SocketAddr>, String)> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| anyhow!("--server '{url}' must be https://HOST:PORT"))?
        .trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| anyhow!("--server '{url}' must be https://HOST:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .with_context(|| format!("cannot resolve '{host}'"))?
        .collect();
    if addrs.is_empty() {
        bail!("'{host}' resolves to no address");
    }
    Ok((addrs, host.to_owned()))
}

/// The name the master's certificate is for: its first DNS name, else its
/// CN.
fn own_name(der: &[u8]) -> anyhow::Result<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| anyhow!("the master's certificate does not parse: {e}"))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                return Ok((*d).to_owned());
            }
        }
    }
    crate::auth::certname_of(der)
        .map_err(|e| anyhow!("the master's certificate names no host: {e:?}"))
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
