//! Masters that die and come back, for the failover and fault-injection
//! tests: [`CutProxy`], a TCP proxy in front of a master that can stop
//! forwarding at an exact byte count (so a kill lands mid-download, not
//! at a time that depends on the machine), throttle, go down (its port
//! then refuses, as a killed master's does) and come back on the same
//! port; [`kill9`] (SIGKILL by pid); [`Lcg`], a seeded random sequence
//! whose seed a failing test prints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy's tasks share with the test.
struct Shared {
    /// Where connections go.
    upstream: Mutex<SocketAddr>,
    /// Bytes forwarded master → agent, over every connection.
    sent: AtomicU64,
    /// Forward master → agent bytes up to this count, then hold them.
    hold_at: AtomicU64,
    /// Set once a connection held bytes back at `hold_at`.
    held: AtomicBool,
    /// Master → agent bytes per second per connection (0: unlimited).
    rate: AtomicU64,
    /// Connections opened so far.
    connections: AtomicU64,
    /// Bumped by [`CutProxy::down`]: every connection of an older
    /// generation is dropped.
    generation: tokio::sync::watch::Sender<u64>,
}

/// A TCP proxy on `127.0.0.1` in front of a master (TLS passes through
/// untouched: the agent's certificate reaches the master), on its own
/// thread and runtime, stopped on drop.
pub struct CutProxy {
    /// The port it listens on (the same after [`CutProxy::up`]).
    pub port: u16,
    shared: Arc<Shared>,
    handle: tokio::runtime::Handle,
    accept: Option<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CutProxy {
    /// A proxy to `upstream` on a free port, forwarding everything.
    pub fn start(upstream: SocketAddr) -> CutProxy {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            let _ = handle_tx.send(rt.handle().clone());
            rt.block_on(async move {
                let _ = stop_rx.await;
            });
            rt.shutdown_background();
        });
        let handle = handle_rx.recv().expect("proxy runtime");
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            sent: AtomicU64::new(0),
            hold_at: AtomicU64::new(u64::MAX),
            held: AtomicBool::new(false),
            rate: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            generation: tokio::sync::watch::channel(0).0,
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut proxy = CutProxy {
            port,
            shared,
            handle,
            accept: None,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        proxy.listen(listener);
        proxy
    }

    fn listen(&mut self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = self.shared.clone();
        let handle = self.handle.clone();
        self.accept = Some(self.handle.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let generation = *shared.generation.borrow();
                handle.spawn(relay(client, shared.clone(), generation));
            }
        }));
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    /// From now on, forward master → agent bytes only up to `total` bytes
    /// since the start (counting what was already forwarded), then hold
    /// the rest: the agent waits mid-transfer until [`CutProxy::down`].
    pub fn hold_at(&self, total: u64) {
        self.shared.hold_at.store(total, Ordering::SeqCst);
    }

    /// Master → agent bytes per second, per connection (0: unlimited).
    pub fn throttle(&self, bytes_per_second: u64) {
        self.shared.rate.store(bytes_per_second, Ordering::SeqCst);
    }

    /// Bytes forwarded master → agent so far.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Waits (polling, at most `limit`) until a connection is holding
    /// bytes at the [`CutProxy::hold_at`] mark; false if none did.
    pub fn wait_held(&self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.shared.held.load(Ordering::SeqCst) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Goes down as a killed master does: every open connection is
    /// dropped and the port refuses new ones.
    pub fn down(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        self.shared.generation.send_modify(|g| *g += 1);
        // The listener is closed once the aborted task is dropped; wait
        // until the port refuses (bounded).
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Comes back on the same port, forwarding everything to `upstream`.
    pub fn up(&mut self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = upstream;
        self.shared.hold_at.store(u64::MAX, Ordering::SeqCst);
        self.shared.held.store(false, Ordering::SeqCst);
        let listener = (0..500)
            .find_map(|_| {
                std::net::TcpListener::bind(("127.0.0.1", self.port))
                    .map_err(|_| std::thread::sleep(Duration::from_millis(10)))
                    .ok()
            })
            .expect("the proxy's port is free again");
        self.listen(listener);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        self.shared.generation.send_modify(|g| *g += 1);
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection: agent → master as it comes, master → agent counted,
/// throttled and held as [`Shared`] says; dropped when the generation
/// changes.
async fn relay(client: TcpStream, shared: Arc<Shared>, born: u64) {
    let mut generation = shared.generation.subscribe();
    let upstream = *shared.upstream.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
        let _ = sw.shutdown().await;
        // Half-closed: keep relaying the answer.
        std::future::pending::<()>().await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let before = shared.sent.fetch_add(n as u64, Ordering::SeqCst);
            let hold = shared.hold_at.load(Ordering::SeqCst);
            let allowed = hold.saturating_sub(before).min(n as u64) as usize;
            if allowed > 0 && cw.write_all(&buf[..allowed]).await.is_err() {
                break;
            }
            if allowed < n {
                shared.held.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            let rate = shared.rate.load(Ordering::SeqCst);
            if rate > 0 {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = generation.wait_for(|g| *g != born) => {}
    }
}

/// Sends SIGKILL to `pid` (a child this test started).
pub fn kill9(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
}

/// A seeded pseudo-random sequence (PCG-style LCG): tests print its seed
/// so a failure can be replayed (`FAULT_SEED=<seed>`).
#[derive(Debug, Clone)]
pub struct Lcg(u64);

impl Lcg {
    /// The sequence for `seed`.
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// A seed from `FAULT_SEED` if set, else from the clock.
    pub fn seed_from_env() -> u64 {
        std::env::var("FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos() as u64
            })
    }

    /// The next value, uniform in `0..2^32`.
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }

    /// Uniform in `[0, 1)`.
    pub fn fraction(&mut self) -> f64 {
        f64::from(self.next_u32()) / 4_294_967_296.0
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + (self.fraction() * (hi - lo) as f64) as u64
    }
}
