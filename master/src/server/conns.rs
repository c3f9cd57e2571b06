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
//! - **How many of one client** (`max_connections_per_client`, mTLS
//!   listeners): once its handshake is done, a connection is claimed for
//!   its client ([`ClientKey`]: the certificate's public key, or the address
//!   without one); past the limit the client's oldest idle connection is
//!   shed, and when every one of them is busy the new one is closed. One
//!   node's unread HTTP/2 streams then pin at most that many connections'
//!   worth (docs/master.md#connection-limits).
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
//! This file is the registry and its decisions (who is shed, who timed
//! out, whose certificate is now refused); one reaper task
//! ([`Connections::reap`]) applies the timeouts. The mechanism sits in two
//! other places: `server/accept.rs` admits each TCP stream and wraps it
//! (under TLS) in a socket that fails every read and write once the
//! connection is condemned, so hyper and rustls drop it whatever state
//! they are in, and records the peer certificate after the handshake;
//! `server/inflight.rs` wraps the connection's service so its response
//! bodies count requests in flight and record progress.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use pluginsync_common::digest::Sha256;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;

/// The error of a connection refused at `max_connections`.
pub(super) const REFUSED_AT_LIMIT: &str = "max_connections reached and every connection is busy";

/// The error of a connection refused at `max_connections_per_client`.
pub(super) const REFUSED_PER_CLIENT: &str =
    "max_connections_per_client reached and every connection of this client is busy";

/// The limits a [`Connections`] registry enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most (already capped to the descriptor limit).
    pub max_connections: usize,
    /// Open connections of one client at most ([`Connections::claim`]);
    /// 0: no bound.
    pub max_per_client: usize,
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
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) epoch: Instant,
    /// `OPEN`, a `Close` reason, or `GONE`.
    pub(super) state: AtomicU8,
    /// Requests whose response is not finished (body not dropped).
    pub(super) in_flight: AtomicUsize,
    /// When `in_flight` last dropped to 0 (ms since `epoch`).
    pub(super) idle_since: AtomicU64,
    /// Responses that handed hyper a frame and were not asked for the next.
    pub(super) waiting: AtomicUsize,
    /// When a response body on this connection last moved (ms since `epoch`).
    pub(super) last_progress: AtomicU64,
    /// The client's certificate chain, leaf first, once the handshake is done.
    pub(super) peer: OnceLock<Vec<CertificateDer<'static>>>,
    /// Whose it is, once claimed ([`Connections::claim`]).
    pub(super) client: OnceLock<ClientKey>,
    pub(super) read_waker: AtomicWaker,
    pub(super) write_waker: AtomicWaker,
}

impl Conn {
    pub(super) fn now_ms(&self) -> u64 {
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
    pub(super) fn condemned(&self) -> Option<io::Error> {
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

/// Who a connection belongs to, for `max_connections_per_client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKey {
    /// The SHA-256 of the client certificate's `SubjectPublicKeyInfo`: one
    /// node, whichever name or serial its certificate carries.
    PublicKey(Sha256),
    /// The address of a client that sent no certificate.
    Address(IpAddr),
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
    refused_per_client: AtomicU64,
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
    /// Closed after the handshake: its client was at
    /// `max_connections_per_client` with every connection busy.
    pub refused_per_client: u64,
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
            refused_per_client: AtomicU64::new(0),
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
            refused_per_client: self.refused_per_client.load(Ordering::Relaxed),
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
    pub(super) fn admit(&self) -> io::Result<Arc<Conn>> {
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
            client: OnceLock::new(),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
        });
        table.insert(id, conn.clone());
        self.live.fetch_add(1, Ordering::AcqRel);
        Ok(conn)
    }

    /// Claims `conn` for `client` and applies `max_connections_per_client`:
    /// past it, the client's oldest connections with no request in flight
    /// are shed; an error (the connection is then closed) when too many of
    /// them are busy. The other clients' connections are never touched.
    pub(super) fn claim(&self, conn: &Conn, client: ClientKey) -> io::Result<()> {
        let max = self.limits.max_per_client;
        let table = self.lock();
        let client = conn.client.get_or_init(|| client);
        if max == 0 {
            return Ok(());
        }
        // Oldest first (ids only grow).
        let theirs: Vec<&Arc<Conn>> = table
            .values()
            .filter(|c| c.id != conn.id && c.is_open() && c.client.get() == Some(client))
            .collect();
        let Some(excess) = (theirs.len() + 1).checked_sub(max).filter(|&n| n > 0) else {
            return Ok(());
        };
        let idle: Vec<&Arc<Conn>> = theirs
            .into_iter()
            .filter(|c| c.in_flight.load(Ordering::Acquire) == 0)
            .take(excess)
            .collect();
        if idle.len() < excess {
            self.refused_per_client.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::other(REFUSED_PER_CLIENT));
        }
        for c in idle {
            self.kill(c, Close::Evicted);
        }
        Ok(())
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
    pub(super) fn remove(&self, conn: &Conn) {
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
        let certified: Vec<Arc<Conn>> = self
            .lock()
            .values()
            .filter(|c| c.is_open() && c.has_cert())
            .cloned()
            .collect();
        let mut closed = 0;
        for c in certified {
            let Some((leaf, intermediates)) = c.peer.get().and_then(|p| p.split_first()) else {
                continue;
            };
            if let Err(e) = verifier.verify_client_cert(leaf, intermediates, now) {
                tracing::debug!(error = %pluginsync_common::tls::describe(&e), "closing a connection: its certificate is now refused");
                if self.kill(&c, Close::Revoked) {
                    closed += 1;
                }
            }
        }
        closed
    }
}

/// The connection registry for `wanted` (`[http]`'s limits):
/// `max_connections` capped to the descriptor limit less `elsewhere` (the
/// metrics listener's connections; a warning when that lowers it), the
/// rest as asked; the limits in force logged once.
pub fn registry(wanted: Limits, elsewhere: usize) -> Arc<Connections> {
    let (max_connections, nofile) = effective_max_connections(wanted.max_connections, elsewhere);
    if max_connections < wanted.max_connections {
        tracing::warn!(
            max_connections,
            configured = wanted.max_connections,
            nofile = nofile.unwrap_or_default(),
            "http.max_connections lowered to fit the descriptor limit (LimitNOFILE)"
        );
    }
    tracing::info!(
        max_connections,
        max_connections_per_client = wanted.max_per_client,
        idle_timeout_ms = wanted.idle_timeout.as_millis() as u64,
        write_timeout_ms = wanted.write_timeout.as_millis() as u64,
        "connection limits"
    );
    Connections::new(Limits {
        max_connections,
        ..wanted
    })
}

/// `max_connections` capped to what the process's descriptor limit allows:
/// the soft `RLIMIT_NOFILE` minus a reserve for the index, served files,
/// inotify and logs (an eighth of the limit, at least 64, at most 1024)
/// and minus `elsewhere`, the connections another registry may hold (the
/// metrics listener's). Returns the cap and the soft limit (`None`:
/// unlimited or unknown).
pub fn effective_max_connections(configured: usize, elsewhere: usize) -> (usize, Option<u64>) {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    match soft {
        Some(soft) => {
            let reserve = (soft / 8).clamp(64, 1024) + elsewhere as u64;
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
            max_per_client: 2,
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
    fn one_client_past_its_limit_sheds_its_own_idle_connection_or_is_refused() {
        let r = registry(10);
        let node = || ClientKey::PublicKey(Sha256::of(b"node1 key"));
        let other = r.admit().unwrap();
        r.claim(&other, ClientKey::PublicKey(Sha256::of(b"node2 key")))
            .unwrap();
        let a = r.admit().unwrap();
        r.claim(&a, node()).unwrap();
        let b = r.admit().unwrap();
        r.claim(&b, node()).unwrap();
        b.in_flight.fetch_add(1, Ordering::AcqRel);
        // Third of node1 (limit 2): a, idle, goes; b, busy, stays.
        let c = r.admit().unwrap();
        r.claim(&c, node()).unwrap();
        assert!(!a.is_open() && b.is_open() && c.is_open() && other.is_open());
        c.in_flight.fetch_add(1, Ordering::AcqRel);
        // Both busy: the next one of node1 is refused; node2 and another
        // address are not affected.
        let d = r.admit().unwrap();
        assert!(r.claim(&d, node()).is_err());
        r.remove(&d);
        let e = r.admit().unwrap();
        r.claim(&e, ClientKey::Address(IpAddr::from([127, 0, 0, 1])))
            .unwrap();
        assert!(b.is_open() && c.is_open() && other.is_open() && e.is_open());
        let s = r.stats();
        assert_eq!((s.refused_per_client, s.evicted, s.open), (1, 1, 4));
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
        let (cap, soft) = effective_max_connections(usize::MAX, 0);
        if let Some(soft) = soft {
            assert!((cap as u64) < soft, "{cap} vs {soft}");
            let (fewer, _) = effective_max_connections(usize::MAX, 16);
            assert_eq!(fewer, cap.saturating_sub(16).max(1));
        }
        assert_eq!(effective_max_connections(5, 0).0, 5);
    }
}
