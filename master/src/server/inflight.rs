//! What is in flight on a connection, and whether it moves: the
//! registry's `idle_timeout` and `write_timeout` (`server/conns.rs`) read
//! what this records.
//!
//! [`Counted`] wraps a connection's service: each request is in flight
//! until its response body ([`CountedBody`]) is dropped, and the last one
//! done starts the idle clock. The body hands hyper large frames in pieces
//! of [`CHUNK`] and records, for each piece, that it waits on the client
//! until hyper asks for the next: progress, or a stall.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tower::Service;

use super::conns::Conn;
use crate::auth::PeerIdentity;

/// A connection's service: each request is in flight until its response
/// body is dropped, and carries the connection's [`PeerIdentity`] when
/// its TLS handshake gave one.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    conn: Arc<Conn>,
    identity: Option<Arc<PeerIdentity>>,
}

impl<S> Counted<S> {
    /// Counts the requests `inner` serves on `conn`.
    pub(super) fn new(inner: S, conn: Arc<Conn>) -> Self {
        Counted {
            inner,
            conn,
            identity: None,
        }
    }

    /// Also hands every request the identity the connection's TLS
    /// handshake gave, worked out once for the connection rather than
    /// from its certificate on every request (`routes.rs`'s
    /// `tls_identity` takes it; docs/internals.md#server).
    pub(super) fn with_identity(mut self, identity: PeerIdentity) -> Self {
        self.identity = Some(Arc::new(identity));
        self
    }
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

impl<S, RB, B> Service<Request<RB>> for Counted<S>
where
    S: Service<Request<RB>, Response = Response<B>>,
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

    fn call(&mut self, mut req: Request<RB>) -> Self::Future {
        if let Some(identity) = &self.identity {
            req.extensions_mut().insert(identity.clone());
        }
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
/// no progress (`Limits::write_timeout`).
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
