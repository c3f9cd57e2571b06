//! Talking to a master as a client: an mTLS reqwest [`client()`] (and
//! [`ssldir_client`] for a Puppet site's ssldir), a raw
//! HTTP/1.1 request over TLS ([`raw_get`], [`RawResponse`]) for paths a URL
//! library would normalise (`..`), and [`wait_for`] to poll until an answer
//! shows a change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pki::Pki;

/// An mTLS client trusting only the test CA, presenting `certname`'s
/// certificate (none for `None`).
pub fn client(pki: &Pki, certname: Option<&str>) -> reqwest::Client {
    pluginsync_common::tls::install_default_provider();
    let ca = std::fs::read(pki.ca()).expect("ca");
    let mut b = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("ca pem"))
        .https_only(true)
        .timeout(Duration::from_secs(30))
        .no_gzip();
    if let Some(name) = certname {
        let mut pem = std::fs::read(pki.cert(name)).expect("cert");
        pem.extend(std::fs::read(pki.key(name)).expect("key"));
        b = b.identity(reqwest::Identity::from_pem(&pem).expect("identity"));
    }
    b.build().expect("client")
}

/// A client of a Puppet site's TLS (a Puppet ssldir `ssl`: `certs/ca.pem`,
/// `certs/<name>.pem`, `private_keys/<name>.pem`) trusting only its CA,
/// presenting `certname`'s certificate (none for `None`), and a runtime to
/// drive it from a synchronous test.
pub fn ssldir_client(
    ssl: &std::path::Path,
    certname: Option<&str>,
) -> (reqwest::Client, tokio::runtime::Runtime) {
    pluginsync_common::tls::install_default_provider();
    let ca = std::fs::read(ssl.join("certs/ca.pem")).expect("ca");
    let mut b = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("ca pem"))
        .https_only(true)
        .timeout(Duration::from_secs(30));
    if let Some(name) = certname {
        let mut pem = std::fs::read(ssl.join(format!("certs/{name}.pem"))).expect("cert");
        pem.extend(std::fs::read(ssl.join(format!("private_keys/{name}.pem"))).expect("key"));
        b = b.identity(reqwest::Identity::from_pem(&pem).expect("identity"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (b.build().expect("client"), rt)
}

/// A raw response.
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Header lines, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding is not decoded; the master sends
    /// Content-Length for everything these tests ask).
    pub body: Vec<u8>,
}

/// Sends `GET <target>` verbatim (no URL normalisation) over TLS with
/// `certname`'s certificate, HTTP/1.1, `Connection: close`.
pub async fn raw_get(
    addr: SocketAddr,
    pki: &Pki,
    certname: Option<&str>,
    target: &str,
) -> std::io::Result<RawResponse> {
    use pluginsync_common::tls as ptls;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let roots = ptls::load_roots(&pki.ca()).map_err(std::io::Error::other)?;
    let builder = rustls::ClientConfig::builder_with_provider(ptls::provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots);
    let config = match certname {
        Some(n) => builder
            .with_client_auth_cert(
                ptls::load_certs("cert", &pki.cert(n)).map_err(std::io::Error::other)?,
                ptls::load_key(&pki.key(n)).map_err(std::io::Error::other)?,
            )
            .map_err(std::io::Error::other)?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name =
        rustls_pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let mut tls = connector.connect(name, tcp).await?;
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("raw_get timed out"))??;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(RawResponse {
        status,
        headers,
        body: buf[split + 4..].to_vec(),
    })
}

/// Waits (at most 60 s) until the master at `base` (`https://host:port`)
/// answers its health check `200`: a master listens before the
/// environments of `index.warm` are indexed and answers `503 starting`
/// until then (docs/master.md#many-environments). Panics if it never does.
pub async fn wait_ready(c: &reqwest::Client, base: &str) {
    let url = format!("{base}/status/v1/simple");
    let up = wait_for(Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let status = c.get(&url).send().await.ok()?.status();
            (status == reqwest::StatusCode::OK).then_some(())
        }
    })
    .await;
    assert!(up.is_some(), "{base} never answered ready");
}

/// Polls `f` every 25 ms until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
