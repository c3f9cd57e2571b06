//! Where a connection enters: the acceptors of the master's listeners.
//!
//! [`Admit`] sets TCP_NODELAY and admits each TCP stream into the registry
//! (`server/conns.rs`: at `max_connections` it sheds an idle connection or
//! refuses the new one), wrapped in [`Tracked`], the socket whose reads and
//! writes fail once the registry condemns the connection and whose drop
//! frees its slot. On the mTLS listener, [`Identify`] then waits for the
//! TLS handshake, counts it (`full` or `resumed`, or why it failed, in the
//! metrics; docs/tls.md#session-resumption), records the client's certificate chain for the
//! SIGHUP re-check, claims the connection for its client (its
//! certificate's public key, or its address without one) under
//! `max_connections_per_client` (docs/master.md#connection-limits), and
//! wraps the service in `server/inflight.rs`'s [`Counted`]; on the
//! `[proxy]` listener, [`AdmitPlain`] does the same without TLS and
//! without the per-client claim (its peer is the balancer, whose
//! connections carry many nodes).

use std::future::{Future, Ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_server::accept::Accept;
use pluginsync_common::digest::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::conns::{ClientKey, Conn, Connections, REFUSED_AT_LIMIT};
use super::inflight::Counted;
use crate::auth::{PeerIdentity, Unidentified};
use crate::sample::Sampler;
use crate::store::Store;

/// The inner acceptor: TCP_NODELAY, then admission into the registry.
#[derive(Debug, Clone)]
pub struct Admit {
    registry: Arc<Connections>,
}

impl Admit {
    /// Admits connections into `registry`.
    pub fn new(registry: Arc<Connections>) -> Self {
        Admit { registry }
    }
}

impl<S> Accept<TcpStream, S> for Admit {
    type Stream = Tracked<TcpStream>;
    type Service = S;
    type Future = Ready<io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        std::future::ready((|| {
            // TCP_NODELAY: without it the client's small writes after the
            // handshake can meet a delayed ACK and stall a connection ~40 ms.
            stream.set_nodelay(true)?;
            let conn = self.registry.admit()?;
            Ok((
                Tracked {
                    inner: stream,
                    conn,
                    registry: self.registry.clone(),
                },
                service,
            ))
        })())
    }
}

/// The `[proxy]` listener's acceptor (docs/protocol.md §5.5): [`Admit`],
/// then each request counted in flight as on the mTLS listener, so
/// `idle_timeout`, `write_timeout` and shedding at `max_connections` treat
/// a busy proxy connection as busy. No TLS, so no certificate is recorded
/// (a SIGHUP re-check leaves these connections alone).
#[derive(Debug, Clone)]
pub struct AdmitPlain(Admit);

impl AdmitPlain {
    /// Admits plain connections into `registry`.
    pub fn new(registry: Arc<Connections>) -> Self {
        AdmitPlain(Admit::new(registry))
    }
}

impl<S> Accept<TcpStream, S> for AdmitPlain {
    type Stream = Tracked<TcpStream>;
    type Service = Counted<S>;
    type Future = Ready<io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        std::future::ready(
            self.0
                .accept(stream, service)
                .into_inner()
                .map(|(tracked, inner)| {
                    let conn = tracked.conn.clone();
                    (tracked, Counted::new(inner, conn))
                }),
        )
    }
}

/// A socket in the registry: reads and writes fail once the connection is
/// condemned; dropping it frees its slot.
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
    registry: Arc<Connections>,
}

impl<S> Drop for Tracked<S> {
    fn drop(&mut self) {
        self.registry.remove(&self.conn);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.conn.read_waker.register(cx.waker());
        if let Some(e) = self.conn.condemned() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.conn.write_waker.register(cx.waker());
        if let Some(e) = self.conn.condemned() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.conn.write_waker.register(cx.waker());
        if let Some(e) = self.conn.condemned() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.conn.write_waker.register(cx.waker());
        if let Some(e) = self.conn.condemned() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.conn.condemned() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The outer acceptor: after the TLS handshake, records the client's
/// certificate chain and counts the connection's requests.
#[derive(Debug, Clone)]
pub struct Identify<A> {
    inner: A,
    store: Arc<Store>,
    failures: Arc<Sampler>,
    /// Connections closed at `max_connections_per_client`, for the log.
    over_limit: Arc<Sampler>,
}

impl<A> Identify<A> {
    /// Wraps the TLS acceptor `inner`; failed handshakes are counted in
    /// `store`'s metrics and logged as a sample.
    pub fn new(inner: A, store: Arc<Store>) -> Self {
        Identify {
            inner,
            store,
            failures: Arc::default(),
            over_limit: Arc::default(),
        }
    }
}

impl<A, S> Accept<TcpStream, S> for Identify<A>
where
    A: Accept<TcpStream, S, Stream = TlsStream<Tracked<TcpStream>>>,
    A::Future: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = TlsStream<Tracked<TcpStream>>;
    type Service = Counted<A::Service>;
    type Future =
        Pin<Box<dyn Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send + 'static>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let peer = stream.peer_addr().ok();
        let handshake = self.inner.accept(stream, service);
        let (store, failures) = (self.store.clone(), self.failures.clone());
        let over_limit = self.over_limit.clone();
        Box::pin(async move {
            let (tls, service) = match handshake.await {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(reason) = handshake_failure(&e) {
                        store.metrics.handshake_failure(reason);
                        if let Some(n) = failures.note() {
                            tracing::warn!(
                                peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
                                reason,
                                error = %pluginsync_common::tls::describe_io(&e),
                                failed_since_last_line = n,
                                "TLS handshake failed"
                            );
                        }
                    }
                    return Err(e);
                }
            };
            let (tracked, session) = tls.get_ref();
            store
                .metrics
                .handshake(handshake_kind(session.handshake_kind()));
            let conn = tracked.conn.clone();
            let chain: Vec<rustls_pki_types::CertificateDer<'static>> = session
                .peer_certificates()
                .map(|c| c.iter().map(|d| d.clone().into_owned()).collect())
                .unwrap_or_default();
            let leaf = chain.first().map(|c| c.as_ref());
            let (identity, public_key) = PeerIdentity::with_public_key(leaf);
            let client = client_key(leaf, public_key.as_deref(), peer);
            let _ = conn.peer.set(chain);
            if let Err(e) = tracked.registry.claim(&conn, client) {
                if let Some(n) = over_limit.note() {
                    tracing::warn!(
                        client = %client_name(&identity, peer),
                        max_connections_per_client = tracked.registry.limits().max_per_client,
                        refused_since_last_line = n,
                        "connection closed: this client has its limit of busy connections open"
                    );
                }
                return Err(e);
            }
            Ok((tls, Counted::new(service, conn).with_identity(identity)))
        })
    }
}

/// Whose a connection is: the public key of its client certificate
/// `leaf` (`public_key`, read with its identity; the whole certificate if
/// that could not be parsed), or without one its peer address (`None`:
/// unknown, all such share one key).
fn client_key(
    leaf: Option<&[u8]>,
    public_key: Option<&[u8]>,
    peer: Option<std::net::SocketAddr>,
) -> ClientKey {
    match (leaf, public_key) {
        (Some(_), Some(spki)) => ClientKey::PublicKey(Sha256::of(spki)),
        (Some(der), None) => ClientKey::PublicKey(Sha256::of(der)),
        (None, _) => ClientKey::Address(peer.map_or([0u8; 4].into(), |p| p.ip())),
    }
}

/// A connection's client as a log line names it: the certificate's
/// certname, or the peer address.
fn client_name(identity: &PeerIdentity, peer: Option<std::net::SocketAddr>) -> String {
    match &identity.certname {
        Ok(name) => name.clone(),
        Err(Unidentified::NoCertificate) => peer.map(|p| p.ip().to_string()).unwrap_or_default(),
        Err(_) => "(certificate without a certname)".into(),
    }
}

/// The metrics' label for a completed handshake: `resumed` when the client
/// resumed a session (docs/tls.md#session-resumption), else `full`.
pub fn handshake_kind(kind: Option<rustls::HandshakeKind>) -> &'static str {
    match kind {
        Some(rustls::HandshakeKind::Resumed) => "resumed",
        _ => "full",
    }
}

/// The metrics' reason for a failed handshake (a bounded set), or `None`
/// when the connection was refused before its handshake (at
/// `max_connections`, counted apart).
pub fn handshake_failure(e: &io::Error) -> Option<&'static str> {
    use rustls::{CertificateError as C, Error as R};
    if let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<R>()) {
        return Some(match tls {
            R::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => "certificate_expired",
            R::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
                "certificate_not_yet_valid"
            }
            R::InvalidCertificate(C::Revoked) => "certificate_revoked",
            R::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => "unknown_ca",
            R::InvalidCertificate(_) => "certificate_invalid",
            R::NoCertificatesPresented => "no_certificate",
            R::AlertReceived(_) => "alert_received",
            R::InvalidMessage(_) | R::PeerIncompatible(_) | R::PeerMisbehaved(_) => "protocol",
            _ => "other",
        });
    }
    match e.kind() {
        io::ErrorKind::TimedOut => Some("timeout"),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Some("connection_closed"),
        _ if e.to_string().contains(REFUSED_AT_LIMIT) => None,
        _ => Some("other"),
    }
}
