//! [`Interceptor`]: a TLS server in front of a real master that relays each
//! request to it (over TLS, with a client certificate of its own) and
//! lets a test act between requests: change the tree and wait for the
//! master to republish before a request passes ([`Hook::before`]), or
//! tamper with an answer on its way back ([`Hook::after`]). HTTP/1.1, one
//! request per connection (`Connection: close` both ways), requests
//! without a body (the agent only sends `GET`s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::conn::{identity, tls_config, tls_connect};
use crate::pki::Pki;

/// What a test does around the requests an [`Interceptor`] relays.
pub trait Hook: Send + Sync + 'static {
    /// Called with the request target (and its number, from 0) before the
    /// request is relayed; it may block (a deploy, a re-index).
    fn before(&self, _n: usize, _target: &str) {}
    /// Called with the master's raw answer before it is sent back; may
    /// change it.
    fn after(&self, _target: &str, _response: &mut Vec<u8>) {}
}

/// A relay in front of a master; see the module docs.
pub struct Interceptor {
    /// The bound address.
    pub addr: SocketAddr,
    /// The request targets relayed so far, in order of arrival.
    pub seen: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Interceptor {
    /// Listens on 127.0.0.1 with `pki`'s `localhost` certificate and
    /// relays to `master`, presenting `certname`'s certificate there.
    pub fn start(pki: &Pki, master: SocketAddr, certname: &str, hook: Arc<dyn Hook>) -> Self {
        use pluginsync_common::tls as ptls;
        let server = rustls::ServerConfig::builder_with_provider(ptls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                ptls::load_certs("cert", &pki.cert("localhost")).expect("cert"),
                ptls::load_key(&pki.key("localhost")).expect("key"),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let upstream = tls_config(pki, Some(identity(pki, certname)), &["http/1.1"]);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let count = Arc::new(AtomicUsize::new(0));
        let seen2 = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (tcp, _) = tokio::select! {
                        r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                        _ = &mut stop_rx => break,
                    };
                    let (acceptor, upstream, hook) =
                        (acceptor.clone(), upstream.clone(), hook.clone());
                    let (count, seen) = (count.clone(), seen2.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let Some(head) = read_head(&mut tls).await else {
                            return;
                        };
                        let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        seen.lock().expect("seen").push(target.clone());
                        let hook2 = hook.clone();
                        let t2 = target.clone();
                        tokio::task::spawn_blocking(move || hook2.before(n, &t2))
                            .await
                            .expect("hook");
                        let Ok(mut response) = relay(master, upstream, &head).await else {
                            return;
                        };
                        hook.after(&target, &mut response);
                        let _ = tls.write_all(&response).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
        });
        Interceptor {
            addr,
            seen,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for Interceptor {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The request head (up to the blank line), bounded.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > 65536 {
            return None;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Sends `head` to the master with `Connection: close` and reads its
/// whole answer.
async fn relay(
    master: SocketAddr,
    upstream: Arc<rustls::ClientConfig>,
    head: &str,
) -> std::io::Result<Vec<u8>> {
    let mut lines: Vec<&str> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    let request = format!("{}\r\n\r\n", lines.join("\r\n"));
    let mut tls = tls_connect(master, upstream).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // A TLS close without close_notify still ends the answer.
    let _ = tls.read_to_end(&mut response).await;
    Ok(response)
}

/// Flips the first byte of the body of `response` (after the chunk-size
/// line when it is chunked): the answer keeps its framing, its content is
/// wrong.
pub fn flip_first_body_byte(response: &mut [u8]) {
    let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return;
    };
    let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
    let mut at = end + 4;
    if head.contains("transfer-encoding: chunked") {
        match response[at..].windows(2).position(|w| w == b"\r\n") {
            Some(p) => at += p + 2,
            None => return,
        }
    }
    if let Some(b) = response.get_mut(at) {
        *b ^= 0x01;
    }
}
