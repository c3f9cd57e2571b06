//! Masters that misbehave or are not there: [`FakeMaster`], a scripted TLS
//! server for answers a real master never gives, [`http_response`] to build
//! those answers, and [`closed_port`], a port with nothing listening.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::pki::Pki;

/// A scriptable TLS server for answers a real master never gives
/// (malformed or hostile listings, cut transfers). HTTP/1.1, one request
/// per connection; `respond` maps the request target to the raw response
/// bytes (status line, headers, body: written as given, then the
/// connection is closed).
pub struct FakeMaster {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The responder of a [`FakeMaster`].
pub type Responder = Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// A responder that also sees the request's head: `(target, head)`, the
/// head being the request line and header lines as received (for answers
/// that depend on a request header, such as a delta listing).
pub type HeadResponder = Arc<dyn Fn(&str, &str) -> Vec<u8> + Send + Sync>;

impl FakeMaster {
    /// Serves with `pki`'s `localhost` certificate.
    pub fn start(pki: &Pki, respond: Responder) -> FakeMaster {
        FakeMaster::start_with_head(pki, Arc::new(move |target: &str, _: &str| respond(target)))
    }

    /// Like [`FakeMaster::start`], with a responder that sees the
    /// request's headers too.
    pub fn start_with_head(pki: &Pki, respond: HeadResponder) -> FakeMaster {
        let acceptor = localhost_acceptor(pki);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
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
                    let (acceptor, respond) = (acceptor.clone(), respond.clone());
                    tokio::spawn(async move {
                        use tokio::io::AsyncWriteExt;
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let Some(head) = read_head(&mut tls).await else {
                            return;
                        };
                        let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                        let _ = tls.write_all(&respond(&target, &head)).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
        });
        FakeMaster {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TLS acceptor with `pki`'s `localhost` certificate, asking no client
/// certificate.
pub(crate) fn localhost_acceptor(pki: &Pki) -> tokio_rustls::TlsAcceptor {
    use pluginsync_common::tls as ptls;
    let config = rustls::ServerConfig::builder_with_provider(ptls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            ptls::load_certs("cert", &pki.cert("localhost")).expect("cert"),
            ptls::load_key(&pki.key("localhost")).expect("key"),
        )
        .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A request's head, up to its blank line (at most 64 KiB read); `None`
/// when the peer closed or failed before it ended.
pub(crate) async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// A raw HTTP/1.1 response with `Connection: close`.
pub fn http_response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A 127.0.0.1 port with nothing listening (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}
