//! Connection limits: every connection the master accepts is in one
//! registry ([`Connections`]) from its TCP accept until its socket closes.
//!
//! The registry is what lets the master bound what clients can hold
//! (docs/internals.md#server; `[http]` in `etc/master.toml`):
//!
//! - **How many** (`max_connections`, capped below the descriptor limit):
//!   at the limit, a new connection sheds the oldest connection that has no
//!   request in flight, anonymous ones (no client certificate yet, or none
//!   at all) first. Only when every connection is busy is the new one closed
//!   at once. So idle sockets — a flood of TLS handshakes that never send an
//!   HTTP byte, idle keep-alive or HTTP/2 connections — can never lock out
//!   an agent or the health check.
//! - **How long idle** (`idle_timeout`): a connection with no request in
//!   flight for that long is closed: after the TLS handshake with no HTTP
//!   byte, between HTTP/1.1 keep-alive requests, on an idle HTTP/2
//!   connection.
//! - **How long stalled** (`write_timeout`): a connection that has response
//!   data its client does not take (TCP send buffer full, or HTTP/2 flow
//!   control windows never reopened), with no response on it making
//!   progress for that long, is closed, and the response bodies it pinned
//!   are dropped. Progress is hyper asking a response body for its next
//!   piece of at most 64 KiB, so the minimum rate a client must read at is
//!   one piece per `write_timeout`.
//! - **Whose** (SIGHUP): each connection keeps its client's certificate
//!   chain; [`Connections::recheck`] runs it through the reloaded client
//!   verifier (the new CA and CRL) and closes the connections a new
//!   handshake would refuse (docs/protocol.md §5.2).
//!
//! The mechanism sits at two places: [`Admit`] wraps each TCP stream
//! (under TLS) in [`Tracked`], which fails every read and write once the
//! connection is condemned, so hyper and rustls drop it whatever state they
//! are in; [`Identify`] records the peer certificate after the handshake and
//! wraps the connection's service in [`Counted`], whose response bodies
//! ([`CountedBody`]) count requests in flight and record progress. One
//! reaper task ([`Connections::reap`]) applies the timeouts.

use std::collections::BTreeMap;
use std::future::{Future, Ready};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::Response;
use axum_server::accept::Accept;
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tower::Service;

use crate::sample::Sampler;
use crate::store::Store;

/// The error of a connection refused at `max_connections`.
const REFUSED_AT_LIMIT: &str = "max_connections reached and every connection is busy";

/// The limits a [`Connections`] registry enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most (already capped to the descriptor limit).
    pub max_connections: usize,
    /// No request in flight for this long: closed.
    pub idle_timeout: Duration,
    /// Response data waiting on the client, nothing taken for this long:
    /// closed.
    pub write_timeout: Duration,
}

/// Why the master closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Close {
    Idle = 1,
    Stalled = 2,
    Evicted = 3,
    Revoked = 4,
}

/// `Conn::state` while the connection is open.
const OPEN: u8 = 0;
/// `Conn::state` once its stream was dropped.
const GONE: u8 = 255;

/// One connection's entry.
#[derive(Debug)]
struct Conn {
    id: u64,
    epoch: Instant,
    /// `OPEN`, a `Close` reason, or `GONE`.
    state: AtomicU8,
    /// Requests whose response is not finished (body not dropped).
    in_flight: AtomicUsize,
    /// When `in_flight` last dropped to 0 (ms since `epoch`).
    idle_since: AtomicU64,
    /// Responses that handed hyper a frame and were not asked for the next.
    waiting: AtomicUsize,
    /// When a response body on this connection last moved (ms since `epoch`).
    last_progress: AtomicU64,
    /// The client's certificate chain, leaf first, once the handshake is done.
    peer: OnceLock<Vec<CertificateDer<'static>>>,
    read_waker: AtomicWaker,
    write_waker: AtomicWaker,
}

impl Conn {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    fn has_cert(&self) -> bool {
        self.peer.get().is_some_and(|c| !c.is_empty())
    }

    /// The error every read and write returns once the connection is
    /// condemned (after registering the waker, so a kill in between is seen).
    fn condemned(&self) -> Option<io::Error> {
        match self.state.load(Ordering::Acquire) {
            OPEN => None,
            s if s == Close::Idle as u8 || s == Close::Stalled as u8 => Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection closed by the master: idle or stalled",
            )),
            _ => Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed by the master",
            )),
        }
    }
}

/// The registry of open connections and the counters of what it closed.
#[derive(Debug)]
pub struct Connections {
    limits: Limits,
    epoch: Instant,
    next_id: AtomicU64,
    /// Open (not condemned) connections.
    live: AtomicUsize,
    table: Mutex<BTreeMap<u64, Arc<Conn>>>,
    closed_idle: AtomicU64,
    closed_stalled: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
    closed_revoked: AtomicU64,
    last_limit_warning: AtomicU64,
}

/// What a [`Connections`] registry holds and has done, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnStats {
    /// Connections open now (condemned ones excluded).
    pub open: usize,
    /// Closed after `idle_timeout` with no request in flight.
    pub closed_idle: u64,
    /// Closed after `write_timeout` without progress.
    pub closed_stalled: u64,
    /// Shed at `max_connections` to admit a newer one.
    pub evicted: u64,
    /// Closed on arrival: at the limit with every connection busy.
    pub refused: u64,
    /// Closed on SIGHUP: their certificate is no longer accepted.
    pub closed_revoked: u64,
}

impl Connections {
    /// An empty registry enforcing `limits`.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Connections {
            limits,
            epoch: Instant::now(),
            next_id: AtomicU64::new(1),
            live: AtomicUsize::new(0),
            table: Mutex::new(BTreeMap::new()),
            closed_idle: AtomicU64::new(0),
            closed_stalled: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            closed_revoked: AtomicU64::new(0),
            last_limit_warning: AtomicU64::new(0),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Counters so far.
    pub fn stats(&self) -> ConnStats {
        ConnStats {
            open: self.live.load(Ordering::Relaxed),
            closed_idle: self.closed_idle.load(Ordering::Relaxed),
            closed_stalled: self.closed_stalled.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            closed_revoked: self.closed_revoked.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        // A panic while holding the lock leaves the map consistent (every
        // update is a single insert or remove), so poisoning is ignored.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Condemns `conn` for `why`: every later read or write on it fails,
    /// and the task driving it is woken to notice. False if it was already
    /// closing.
    fn kill(&self, conn: &Conn, why: Close) -> bool {
        if conn
            .state
            .compare_exchange(OPEN, why as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.live.fetch_sub(1, Ordering::AcqRel);
        let counter = match why {
            Close::Idle => &self.closed_idle,
            Close::Stalled => &self.closed_stalled,
            Close::Evicted => &self.evicted,
            Close::Revoked => &self.closed_revoked,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        conn.read_waker.wake();
        conn.write_waker.wake();
        true
    }

    /// Registers a newly accepted connection, shedding an idle one at the
    /// limit; an error (the socket is then closed) when every connection is
    /// busy.
    fn admit(&self) -> io::Result<Arc<Conn>> {
        let mut table = self.lock();
        if self.live.load(Ordering::Acquire) >= self.limits.max_connections {
            // Oldest first (ids only grow); anonymous before authenticated.
            let idle = |c: &&Arc<Conn>| c.is_open() && c.in_flight.load(Ordering::Acquire) == 0;
            let victim = table
                .values()
                .filter(idle)
                .find(|c| !c.has_cert())
                .or_else(|| table.values().find(idle))
                .cloned();
            self.warn_at_limit();
            match victim {
                Some(v) => {
                    self.kill(&v, Close::Evicted);
                }
                None => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(io::Error::other(REFUSED_AT_LIMIT));
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64;
        let conn = Arc::new(Conn {
            id,
            epoch: self.epoch,
            state: AtomicU8::new(OPEN),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(now),
            waiting: AtomicUsize::new(0),
            last_progress: AtomicU64::new(now),
            peer: OnceLock::new(),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
        });
        table.insert(id, conn.clone());
        self.live.fetch_add(1, Ordering::AcqRel);
        Ok(conn)
    }

    /// At most one warning every 10 s while connections are shed.
    fn warn_at_limit(&self) {
        // Seconds since `epoch` of the last warning, plus 1 (0: never).
        let now = self.epoch.elapsed().as_secs() + 1;
        let last = self.last_limit_warning.load(Ordering::Relaxed);
        if (last == 0 || now >= last + 10)
            && self
                .last_limit_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let s = self.stats();
            tracing::warn!(
                max_connections = self.limits.max_connections,
                evicted = s.evicted,
                refused = s.refused,
                "connection limit reached: shedding idle connections"
            );
        }
    }

    /// The stream was dropped: its slot is free.
    fn remove(&self, conn: &Conn) {
        if conn.state.swap(GONE, Ordering::AcqRel) == OPEN {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        self.lock().remove(&conn.id);
    }

    /// One pass of the timeouts over every connection; returns how many
    /// were closed (idle, stalled).
    fn reap_once(&self) -> (usize, usize) {
        let idle_ms = self.limits.idle_timeout.as_millis() as u64;
        let write_ms = self.limits.write_timeout.as_millis() as u64;
        let now = self.epoch.elapsed().as_millis() as u64;
        let (mut idle, mut stalled) = (0, 0);
        let table = self.lock();
        for c in table.values().filter(|c| c.is_open()) {
            if c.in_flight.load(Ordering::Acquire) == 0 {
                if now.saturating_sub(c.idle_since.load(Ordering::Acquire)) >= idle_ms
                    && self.kill(c, Close::Idle)
                {
                    idle += 1;
                }
            } else if c.waiting.load(Ordering::Acquire) > 0
                && now.saturating_sub(c.last_progress.load(Ordering::Acquire)) >= write_ms
                && self.kill(c, Close::Stalled)
            {
                stalled += 1;
            }
        }
        (idle, stalled)
    }

    /// Applies `idle_timeout` and `write_timeout` until the registry is
    /// dropped; spawn it once per registry.
    pub async fn reap(registry: Weak<Connections>) {
        let tick = match registry.upgrade() {
            Some(r) => (r.limits.idle_timeout.min(r.limits.write_timeout) / 4)
                .clamp(Duration::from_millis(50), Duration::from_secs(1)),
            None => return,
        };
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let Some(r) = registry.upgrade() else { return };
            let (idle, stalled) = r.reap_once();
            if stalled > 0 {
                tracing::info!(
                    stalled,
                    write_timeout_ms = r.limits.write_timeout.as_millis() as u64,
                    "closed connections whose clients stopped reading"
                );
            }
            if idle > 0 {
                tracing::debug!(idle, "closed idle connections");
            }
        }
    }

    /// Runs every open connection's client certificate chain through
    /// `verifier` (the one a new handshake now uses) and closes those it
    /// refuses; returns how many were closed. Blocking (signature checks):
    /// call it on the blocking pool.
    pub fn recheck(&self, verifier: &dyn ClientCertVerifier) -> usize {
        let now = UnixTime::now();
        let peers: Vec<Arc<Conn>> = self
            .lock()
            .values()
            .filter(|c| c.is_open() && c.has_cert())
            .cloned()
            .collect();
        let mut closed = 0;
        for c in peers {
            let Some((leaf, intermediates)) = c.peer.get().and_then(|p| p.split_first()) else {
                continue;
            };
            if let Err(e) = verifier.verify_client_cert(leaf, intermediates, now) {
                tracing::debug!(error = %e, "closing a connection: its certificate is now refused");
                if self.kill(&c, Close::Revoked) {
                    closed += 1;
                }
            }
        }
        closed
    }
}

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
                    (tracked, Counted { inner, conn })
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
}

impl<A> Identify<A> {
    /// Wraps the TLS acceptor `inner`; failed handshakes are counted in
    /// `store`'s metrics and logged as a sample.
    pub fn new(inner: A, store: Arc<Store>) -> Self {
        Identify {
            inner,
            store,
            failures: Arc::default(),
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
                                error = %e,
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
            let chain = session
                .peer_certificates()
                .map(|c| c.iter().map(|d| d.clone().into_owned()).collect())
                .unwrap_or_default();
            let _ = conn.peer.set(chain);
            Ok((
                tls,
                Counted {
                    inner: service,
                    conn,
                },
            ))
        })
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

/// A connection's service: each request is in flight until its response
/// body is dropped.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    conn: Arc<Conn>,
}

/// One request in flight; dropping it may start the idle clock.
#[derive(Debug)]
struct InFlight(Arc<Conn>);

impl InFlight {
    fn new(conn: Arc<Conn>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.0.now_ms();
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_since.store(now, Ordering::Release);
        }
    }
}

impl<S, R, B> Service<R> for Counted<S>
where
    S: Service<R, Response = Response<B>>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Response = Response<CountedBody<B>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let guard = InFlight::new(self.conn.clone());
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| CountedBody {
                inner,
                rest: None,
                guard,
                waiting: false,
            }))
        })
    }
}

/// Largest data frame handed to hyper at once. A bigger frame (a whole
/// listing is one `Bytes`) is handed over in pieces of this size, so hyper
/// asks for the next piece only when the socket or the client's HTTP/2
/// window took the previous ones: the request stays in flight while its
/// data is still ours to send, and a client that stops reading shows as
/// no progress ([`Limits::write_timeout`]).
const CHUNK: usize = 64 * 1024;

/// A response body that keeps its request in flight until dropped and
/// records whether it waits on the client: it handed hyper a frame and
/// was not asked for the next one.
#[derive(Debug)]
pub struct CountedBody<B> {
    inner: B,
    /// The rest of a large data frame, handed over [`CHUNK`] by [`CHUNK`].
    rest: Option<Bytes>,
    guard: InFlight,
    waiting: bool,
}

impl<B> CountedBody<B> {
    fn set_waiting(&mut self, waiting: bool) {
        let conn = &self.guard.0;
        if waiting != self.waiting {
            self.waiting = waiting;
            if waiting {
                conn.waiting.fetch_add(1, Ordering::AcqRel);
            } else {
                conn.waiting.fetch_sub(1, Ordering::AcqRel);
            }
        }
        conn.last_progress.store(conn.now_ms(), Ordering::Release);
    }

    /// The next piece of `data`, keeping the remainder in `rest`.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > CHUNK {
            let head = data.split_to(CHUNK);
            self.rest = Some(data);
            head
        } else {
            data
        }
    }
}

impl<B> Drop for CountedBody<B> {
    fn drop(&mut self) {
        if self.waiting {
            self.guard.0.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for CountedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        this.set_waiting(false);
        if let Some(rest) = this.rest.take() {
            let piece = this.piece(rest);
            this.set_waiting(true);
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => Frame::data(this.piece(data)),
                    Err(other) => other,
                };
                this.set_waiting(true);
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(rest) = &self.rest {
            let n = rest.len() as u64;
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + n);
            }
            hint.set_lower(hint.lower() + n);
        }
        hint
    }
}

/// `max_connections` capped to what the process's descriptor limit allows:
/// the soft `RLIMIT_NOFILE` minus a reserve for the index, served files,
/// inotify and logs (an eighth of the limit, at least 64, at most 1024).
/// Returns the cap and the soft limit (`None`: unlimited or unknown).
pub fn effective_max_connections(configured: usize) -> (usize, Option<u64>) {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    match soft {
        Some(soft) => {
            let reserve = (soft / 8).clamp(64, 1024);
            let cap = usize::try_from(soft.saturating_sub(reserve)).unwrap_or(usize::MAX);
            (configured.min(cap).max(1), Some(soft))
        }
        None => (configured.max(1), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(max: usize) -> Arc<Connections> {
        Connections::new(Limits {
            max_connections: max,
            idle_timeout: Duration::from_millis(0),
            write_timeout: Duration::from_millis(0),
        })
    }

    #[test]
    fn at_the_limit_the_oldest_idle_anonymous_connection_goes_first() {
        let r = registry(3);
        let a = r.admit().unwrap();
        let _ = a.peer.set(vec![CertificateDer::from(vec![1u8])]);
        let b = r.admit().unwrap();
        let c = r.admit().unwrap();
        c.in_flight.fetch_add(1, Ordering::AcqRel);
        // b: oldest anonymous idle one; a has a certificate.
        let d = r.admit().unwrap();
        assert!(a.is_open() && !b.is_open() && c.is_open());
        // d would go next (anonymous); once busy, a (idle, certified) goes
        // before c and d (busy).
        d.in_flight.fetch_add(1, Ordering::AcqRel);
        let _e = r.admit().unwrap();
        assert!(!a.is_open() && c.is_open() && d.is_open());
        assert_eq!(r.stats().evicted, 2);
        assert_eq!(r.stats().open, 3);
    }

    #[test]
    fn when_every_connection_is_busy_the_new_one_is_refused() {
        let r = registry(1);
        let a = r.admit().unwrap();
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        assert!(r.admit().is_err());
        assert_eq!(r.stats().refused, 1);
        assert!(a.is_open());
    }

    #[test]
    fn timeouts_close_idle_and_stalled_but_not_busy_connections() {
        let r = registry(10);
        let idle = r.admit().unwrap();
        let busy = r.admit().unwrap();
        busy.in_flight.fetch_add(1, Ordering::AcqRel);
        assert_eq!(r.reap_once(), (1, 0));
        assert!(!idle.is_open() && busy.is_open());
        busy.waiting.fetch_add(1, Ordering::AcqRel);
        assert_eq!(r.reap_once(), (0, 1));
        assert!(!busy.is_open());
        assert_eq!(r.stats().open, 0);
    }

    #[test]
    fn the_cap_leaves_descriptors_for_everything_else() {
        let (cap, soft) = effective_max_connections(usize::MAX);
        if let Some(soft) = soft {
            assert!((cap as u64) < soft, "{cap} vs {soft}");
        }
        assert_eq!(effective_max_connections(5).0, 5);
    }
}
