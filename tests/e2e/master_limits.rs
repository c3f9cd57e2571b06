//! What clients can hold on the master: idle TLS connections
//! without a certificate must not lock agents out when descriptors run
//! short, idle connections of every kind are closed after `idle_timeout`, a
//! client that stops reading is closed after `write_timeout` and the memory
//! its responses pinned is freed, a certificate revoked on SIGHUP loses its
//! open connections, and a revoked intermediate CA takes its clients with
//! it, the `[metrics]` listener is held to the same limits, an unread
//! identity (not gzipped) listing costs no inflated copy per stream, and
//! one node holds at most `max_connections_per_client` busy connections,
//! and the packaged units cap memory and tasks (docs/protocol.md §5.2;
//! docs/operating.md#master-metrics; docs/operating.md#memory-and-tasks;
//! docs/master.md#connection-limits; `[http]` in etc/master.toml).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pluginsync_tests::{
    AgentHome, ChainedClient, ChildMaster, EnvTree, H2, Pki, TestMaster, client, closed_within,
    config_file, config_toml, h1_get, identity, parse_config, refused, rss_kib_of, tls_config,
    tls_connect, write_root_crl,
};

use crate::common::pluginsync_query;

fn listing_path() -> String {
    format!(
        "/puppet/v3/file_metadatas/plugins?{}",
        pluginsync_query("ignore", "manage", "production")
    )
}

fn small_tree() -> EnvTree {
    let tree = EnvTree::new();
    tree.file("production", "m", "lib/facter/a.rb", b"a = 1\n", 0o644);
    tree.file("production", "m", "lib/puppet/type/b.rb", b"b = 2\n", 0o644);
    tree
}

async fn health(c: &reqwest::Client, url: &str) -> Option<u16> {
    c.get(format!("{url}/status/v1/simple"))
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// M-2: 300 anonymous TLS connections that never send an HTTP byte, against
/// a master with 256 descriptors (the default config). Before, they used up
/// its descriptors and nobody else got in; now `max_connections` (capped
/// below the descriptor limit) sheds the oldest idle ones, and an agent and
/// the health check still get through.
/// The health check answers and an agent syncs while `open` (what the
/// test holds) is open on `master`; the agent, for more checks.
async fn agents_get_in(pki: &Pki, master: &ChildMaster, open: &str) -> AgentHome {
    let c = client(pki, Some("node1"));
    assert_eq!(
        health(&c, &master.url()).await,
        Some(200),
        "the health check must answer with {open} open\n{}",
        master.log()
    );
    let agent = AgentHome::new(pki, &[master.url()], "");
    let run = agent.sync(&[]);
    assert!(
        run.code == 0 || run.code == 2,
        "agent sync failed ({}):\n{}\n{}\nmaster log:\n{}",
        run.code,
        run.stdout,
        run.stderr,
        master.log()
    );
    agent
}

/// How many of `held` the master closed (each given 3 s).
async fn closed_by_the_master<S>(held: Vec<S>) -> u64
where
    S: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let mut probes = tokio::task::JoinSet::new();
    for mut s in held {
        probes.spawn(async move { closed_within(&mut s, Duration::from_secs(3)).await });
    }
    let mut shed = 0u64;
    while let Some(closed) = probes.join_next().await {
        shed += u64::from(closed.expect("join"));
    }
    shed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_anonymous_connections_do_not_lock_out_agents() {
    const NOFILE: u64 = 256;
    const IDLE: usize = 300;
    let pki = Pki::new();
    let tree = small_tree();
    let (_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", ""));
    let master = ChildMaster::spawn(&cfg, Some(NOFILE));

    let anonymous = tls_config(&pki, None, &["h2", "http/1.1"]);
    let mut held = Vec::new();
    let mut failed = 0;
    // Batches of 50 at a time; each handshake gives up after 10 s.
    for _ in 0..IDLE / 50 {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..50 {
            batch.spawn(tls_connect(master.addr, anonymous.clone()));
        }
        while let Some(r) = batch.join_next().await {
            match r.expect("join") {
                Ok(s) => held.push(s),
                Err(_) => failed += 1,
            }
        }
    }
    eprintln!(
        "{} of {IDLE} idle handshakes completed, {failed} failed",
        held.len()
    );

    let c = client(&pki, Some("node1"));
    let agent = agents_get_in(&pki, &master, &format!("{IDLE} idle connections")).await;
    assert!(agent.libdir().join("facter/a.rb").is_file());

    // The master shed idle connections to stay under its descriptor limit.
    let shed = closed_by_the_master(held).await;
    eprintln!("{shed} idle connections were closed by the master");
    assert!(
        shed >= IDLE as u64 - NOFILE,
        "only {shed} of {IDLE} idle connections were shed"
    );
    assert_eq!(health(&c, &master.url()).await, Some(200));
}

/// M-2: with `idle_timeout = "1s"`, a TLS connection that never sends an
/// HTTP byte, an HTTP/1.1 keep-alive connection after its request and an
/// HTTP/2 connection after its request are all closed by the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_idle_timeout() {
    let pki = Pki::new();
    let tree = small_tree();
    let master = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "idle_timeout = \"1s\"",
    )));
    let limit = Duration::from_secs(6);

    let mut silent = tls_connect(master.addr, tls_config(&pki, None, &["h2", "http/1.1"]))
        .await
        .expect("handshake");
    let mut h1 = tls_connect(
        master.addr,
        tls_config(&pki, Some(identity(&pki, "node1")), &["http/1.1"]),
    )
    .await
    .expect("handshake");
    let (status, _) = h1_get(&mut h1, &listing_path()).await.expect("listing");
    assert_eq!(status, 200);
    let mut h2 = H2::connect(
        master.addr,
        tls_config(&pki, Some(identity(&pki, "node1")), &["h2"]),
    )
    .await
    .expect("h2");
    h2.get(1, "/status/v1/simple", &[]).await.expect("request");
    h2.response(1).await.expect("response");

    assert!(
        closed_within(&mut silent, limit).await,
        "a TLS connection without any HTTP byte stayed open"
    );
    assert!(
        closed_within(&mut h1, limit).await,
        "an idle HTTP/1.1 keep-alive connection stayed open"
    );
    assert!(
        h2.closed_within(limit).await,
        "an idle HTTP/2 connection stayed open"
    );
    let c = client(&pki, Some("node1"));
    assert_eq!(health(&c, &master.url()).await, Some(200));
}

/// A master serving a listing of more than 4 MiB (kept gzipped only), with
/// `http` added to its `[http]` table; its RSS once one full read of the
/// listing is done (the idle figure includes what a request leaves behind).
struct LargeListing {
    pki: Pki,
    _tree: EnvTree,
    _dir: tempfile::TempDir,
    master: ChildMaster,
    idle: u64,
    body_len: usize,
}

impl LargeListing {
    async fn start(http: &str) -> LargeListing {
        let pki = Pki::new();
        let tree = EnvTree::new();
        tree.generate("production", 16, 1000, 17);
        let (dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", http));
        let master = ChildMaster::spawn(&cfg, None);
        let body = client(&pki, Some("node1"))
            .get(format!("{}{}", master.url(), listing_path()))
            .send()
            .await
            .expect("listing")
            .bytes()
            .await
            .expect("body");
        assert!(
            body.len() >= 4 << 20,
            "the listing must be at least 4 MiB to be kept gzipped only: {} bytes",
            body.len()
        );
        let body_len = body.len();
        drop(body);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = master.rss_kib();
        LargeListing {
            pki,
            _tree: tree,
            _dir: dir,
            master,
            idle,
            body_len,
        }
    }

    /// An HTTP/2 connection of `node` with `streams` requests for the
    /// listing without gzip, whose windows are never opened; returned once
    /// the master answers the first (its requests are then in flight).
    async fn stalled(&self, node: &str, streams: u32) -> std::io::Result<H2> {
        let config = tls_config(&self.pki, Some(identity(&self.pki, node)), &["h2"]);
        let mut h2 = H2::connect(self.master.addr, config).await?;
        for i in 0..streams {
            h2.get(
                2 * i + 1,
                &listing_path(),
                &[("accept", "application/json")],
            )
            .await?;
        }
        for _ in 0..256 {
            if h2.read_frame().await?.kind == 1 {
                return Ok(h2);
            }
        }
        Err(std::io::Error::other("no response headers"))
    }

    /// `connections` × `streams` stalled as [`Self::stalled`], until the
    /// master closes every connection (after `write_timeout`, 60 s at most).
    async fn stall_until_closed(&self, connections: usize, streams: u32) {
        let mut waits = tokio::task::JoinSet::new();
        for _ in 0..connections {
            let mut h2 = self.stalled("node1", streams).await.expect("h2 connection");
            waits.spawn(async move { h2.closed_within(Duration::from_secs(60)).await });
        }
        let mut closed = 0;
        while let Some(r) = waits.join_next().await {
            closed += usize::from(r.expect("join"));
        }
        assert_eq!(
            closed,
            connections,
            "connections whose client never reads must be closed\n{}",
            self.master.log()
        );
    }
}

/// The peak RSS of a process, sampled every 100 ms until [`PeakRss::stop`].
struct PeakRss {
    peak: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    fn start(master: &ChildMaster) -> PeakRss {
        let peak = Arc::new(AtomicU64::new(master.rss_kib()));
        let sampling = Arc::new(AtomicBool::new(true));
        let (p, s, pid) = (peak.clone(), sampling.clone(), master.pid());
        let task = tokio::spawn(async move {
            while s.load(Ordering::Relaxed) {
                p.fetch_max(rss_kib_of(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        PeakRss {
            peak,
            sampling,
            task,
        }
    }

    async fn stop(self) -> u64 {
        self.sampling.store(false, Ordering::Relaxed);
        self.task.await.expect("sampler");
        self.peak.load(Ordering::Relaxed)
    }
}

/// M-3: 200 HTTP/2 streams (4 connections × 50) ask for a listing of more
/// than 4 MiB without gzip and never open a flow-control window. Each
/// stream holds at most what a gzip answer holds (the listing is inflated
/// as it is sent, not copied whole per stream: before, the 200 inflated
/// copies were over 800 MiB), but it holds something: at least 64 KiB (the
/// inflater's window and buffers, the HTTP/2 stream). After
/// `write_timeout` the master closes the connections and what they held is
/// freed: RSS comes back within the bound below, and a second burst like
/// the first reuses that memory instead of adding as much again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_are_closed_and_their_memory_freed() {
    const CONNECTIONS: usize = 4;
    const STREAMS: u32 = 50;
    let big = LargeListing::start("write_timeout = \"2s\"\nidle_timeout = \"3s\"").await;
    let (master, idle) = (&big.master, big.idle);

    let sampler = PeakRss::start(master);
    // Never opening a window: the master closes them after write_timeout.
    big.stall_until_closed(CONNECTIONS, STREAMS).await;
    // By the write timeout (the streams were in flight, so not as idle).
    assert!(
        master.log().contains("clients stopped reading"),
        "{}",
        master.log()
    );

    // The bound: idle RSS + 32 MiB + one listing per malloc arena. What
    // may stay resident once what the streams held is freed is allocator
    // state: glibc keeps up to 8 arenas per core, and each may keep freed
    // pages at its top; the blocking threads the burst started (and their
    // stacks) exit after tokio's 10 s keep-alive, so the wait is up to 30 s.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let listing_kib = (big.body_len as u64).div_ceil(1024);
    let bound = idle + 32 * 1024 + 8 * cores * listing_kib;
    let mut after = master.rss_kib();
    for _ in 0..120 {
        if after <= bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = master.rss_kib();
    }
    let peak = sampler.stop().await;
    eprintln!(
        "RSS: idle {} MiB, peak {} MiB, after the write timeout {} MiB (bound {} MiB)",
        idle / 1024,
        peak / 1024,
        after / 1024,
        bound / 1024
    );
    let streams = CONNECTIONS as u64 * u64::from(STREAMS);
    let pinned = peak.saturating_sub(idle);
    assert!(
        pinned >= streams * 64,
        "the stalled streams did not pin memory (idle {idle} KiB, peak {peak} KiB): the test proves nothing"
    );
    assert!(
        pinned / streams <= 1536,
        "the stalled streams pinned {} KiB each (idle {idle} KiB, peak {peak} KiB; bound 1536 KiB)",
        pinned / streams
    );
    assert!(
        after <= bound,
        "RSS {after} KiB did not come back within {} KiB of idle ({idle} KiB)",
        bound - idle
    );

    // Freed, not only unused: the same burst again fits in what the first
    // one left free (a leak would add as much again as the first pinned).
    let sampler = PeakRss::start(master);
    big.stall_until_closed(CONNECTIONS, STREAMS).await;
    let again = sampler.stop().await;
    eprintln!("RSS: peak of a second burst {} MiB", again / 1024);
    assert!(
        again <= peak + pinned / 2,
        "a second burst took RSS from {peak} to {again} KiB: what the first pinned ({pinned} KiB) was not freed"
    );
    let c = client(&big.pki, Some("node1"));
    assert_eq!(health(&c, &master.url()).await, Some(200));
}

/// M-7: node1 reads over an HTTP/1.1 keep-alive connection and an HTTP/2
/// connection; node1 is revoked and the master gets SIGHUP. Both open
/// connections are closed, a new handshake is refused, and node2's open
/// connection keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_clients_lose_their_open_connections_on_sighup() {
    let pki = Pki::new();
    let tree = small_tree();
    let (_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", ""));
    let master = ChildMaster::spawn(&cfg, None);
    let node1 = tls_config(&pki, Some(identity(&pki, "node1")), &["http/1.1"]);
    let node2 = tls_config(&pki, Some(identity(&pki, "node2")), &["http/1.1"]);

    let mut n1 = tls_connect(master.addr, node1.clone())
        .await
        .expect("node1");
    let mut n2 = tls_connect(master.addr, node2).await.expect("node2");
    for s in [&mut n1, &mut n2] {
        let (status, _) = h1_get(s, &listing_path()).await.expect("listing");
        assert_eq!(status, 200);
    }
    let mut n1_h2 = H2::connect(
        master.addr,
        tls_config(&pki, Some(identity(&pki, "node1")), &["h2"]),
    )
    .await
    .expect("node1 h2");
    n1_h2.get(1, &listing_path(), &[]).await.expect("request");
    n1_h2.response(1).await.expect("response");

    write_root_crl(&pki, &["revoked", "node1"]);
    master.sighup();

    // The same keep-alive connection: its next request fails once the
    // master has reloaded (a request may still pass before the signal is
    // handled; 10 s at most).
    let mut answered = 0;
    let mut closed = false;
    for _ in 0..50 {
        match h1_get(&mut n1, &listing_path()).await {
            Ok(_) => answered += 1,
            Err(_) => {
                closed = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        closed,
        "node1's keep-alive connection still answered {answered} requests after SIGHUP\n{}",
        master.log()
    );
    assert!(
        n1_h2.closed_within(Duration::from_secs(10)).await,
        "node1's HTTP/2 connection stayed open after SIGHUP"
    );
    assert!(
        refused(master.addr, node1).await,
        "a new handshake with node1's revoked certificate must fail"
    );
    let (status, _) = h1_get(&mut n2, &listing_path())
        .await
        .expect("node2's open connection keeps working");
    assert_eq!(status, 200);
}

/// M-6: a client certificate issued by an intermediate CA. With a CRL
/// bundle covering the chain it is accepted; once the root's CRL revokes
/// the intermediate, its handshake is refused, while a client issued by
/// the root directly is still accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_under_a_revoked_intermediate_ca_is_refused() {
    let pki = Pki::new();
    let tree = small_tree();
    let chained = ChainedClient::new(&pki, "chained1");
    let config = config_toml(&tree.envpath(), &pki, "", "");
    let chained_tls = tls_config(&pki, Some(chained.identity()), &["http/1.1"]);
    let node1_tls = tls_config(&pki, Some(identity(&pki, "node1")), &["http/1.1"]);

    chained.write_crls(&pki, &pki.crl(), false);
    {
        let master = TestMaster::start(parse_config(&config));
        let mut s = tls_connect(master.addr, chained_tls.clone())
            .await
            .expect("handshake");
        let (status, _) = h1_get(&mut s, &listing_path())
            .await
            .expect("a valid chain is accepted");
        assert_eq!(status, 200);
        assert!(!refused(master.addr, node1_tls.clone()).await);
    }

    chained.write_crls(&pki, &pki.crl(), true);
    let master = TestMaster::start(parse_config(&config));
    assert!(
        refused(master.addr, chained_tls).await,
        "a client under a revoked intermediate CA must be refused"
    );
    assert!(
        !refused(master.addr, node1_tls).await,
        "a client of the root is not affected"
    );
}

/// The `[metrics]` listener is admitted like the others: 300 idle TCP
/// connections to it, against a master with 256 descriptors. Before, they
/// took every descriptor (agents failed for as long as they stayed open);
/// now they are shed like idle TLS connections, in a registry of their own
/// (16 at most), and the health check, an agent and a scrape get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_metrics_connections_do_not_lock_out_agents() {
    const NOFILE: u64 = 256;
    const IDLE: usize = 300;
    let pki = Pki::new();
    let tree = small_tree();
    let (_dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[metrics]\nlisten = \"127.0.0.1:0\"",
    ));
    let master = ChildMaster::spawn(&cfg, Some(NOFILE));
    let metrics = master.metrics_addr();

    let mut held = Vec::new();
    for _ in 0..IDLE {
        match tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(metrics),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            _ => break,
        }
    }
    assert_eq!(held.len(), IDLE, "the kernel queues every connection");
    // Let the master accept what it will.
    tokio::time::sleep(Duration::from_millis(500)).await;

    agents_get_in(&pki, &master, &format!("{IDLE} idle metrics connections")).await;
    let mut scrape = tokio::net::TcpStream::connect(metrics)
        .await
        .expect("connect");
    let (status, body) = h1_get(&mut scrape, "/metrics").await.expect("scrape");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("pluginsync_master_open_connections"));

    let shed = closed_by_the_master(held).await;
    eprintln!("{shed} idle metrics connections were closed by the master");
    assert!(
        shed >= IDLE as u64 - NOFILE,
        "only {shed} of {IDLE} idle metrics connections were shed"
    );
}

/// A request header on the `[metrics]` listener sent one byte at a time
/// (every 250 ms) is cut off at `header_timeout` (1 s here), as on the
/// other listeners. Before, it stayed open for as long as bytes came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dribbled_header_on_the_metrics_listener_is_cut_at_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let tree = small_tree();
    let (_dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "header_timeout = \"1s\"\n[metrics]\nlisten = \"127.0.0.1:0\"",
    ));
    let master = ChildMaster::spawn(&cfg, None);
    let mut s = tokio::net::TcpStream::connect(master.metrics_addr())
        .await
        .expect("connect");
    let header = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let started = std::time::Instant::now();
    let mut closed = None;
    let mut buf = [0u8; 1024];
    'dribble: for byte in header.iter().take(32) {
        if s.write_all(&[*byte]).await.is_err() {
            closed = Some(started.elapsed());
            break;
        }
        let pause = tokio::time::sleep(Duration::from_millis(250));
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                r = s.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) {
                    closed = Some(started.elapsed());
                    break 'dribble;
                },
            }
        }
    }
    let closed = closed.expect("a header dribbled for 8 s was still open");
    assert!(
        closed < Duration::from_secs(4),
        "closed only after {closed:?} (header_timeout is 1 s)"
    );
}

/// 64 HTTP/2 streams of one node ask for a listing of more than 4 MiB
/// (kept gzipped only) without `Accept-Encoding: gzip` and never read.
/// Before, each stream held a whole inflated copy (the listing's size,
/// 5.4 MB in the field: 347 MB for 64 streams); now the listing is
/// inflated as it is sent, and each stream holds what a gzip answer holds:
/// within 1.5 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_listings_cost_no_inflated_copy_per_unread_stream() {
    const STREAMS: u32 = 64;
    const PER_STREAM_KIB: u64 = 1536;
    let big = LargeListing::start("").await;
    let sampler = PeakRss::start(&big.master);
    let h2 = big.stalled("node1", STREAMS).await.expect("h2 connection");
    // Each stream's answer is started (its first window sent) well within
    // this; sample the peak meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = sampler.stop().await;
    let per_stream = peak.saturating_sub(big.idle) / u64::from(STREAMS);
    eprintln!(
        "RSS: idle {} MiB, peak {} MiB, {per_stream} KiB per unread identity stream",
        big.idle / 1024,
        peak / 1024
    );
    assert!(
        per_stream <= PER_STREAM_KIB,
        "{per_stream} KiB per unread identity stream (bound {PER_STREAM_KIB} KiB)"
    );
    drop(h2);
    let c = client(&big.pki, Some("node1"));
    assert_eq!(health(&c, &big.master.url()).await, Some(200));
}

/// One node opens 8 HTTP/2 connections, each with 64 unread streams asking
/// for a listing of more than 4 MiB (default `[http]`, so `write_timeout`
/// is 30 s). Before, every connection was served: in the field the master
/// went from 10 to 1,505 MB in 8 s. Now at most `max_connections_per_client`
/// (4 by default) of them are: the others are closed after their
/// handshake, counted in `connections_refused_per_client_total` and
/// logged, and what the node pins is bounded by what 4 connections of 64
/// streams may hold (1.5 MiB a stream, the bound of
/// `identity_listings_cost_no_inflated_copy_per_unread_stream`) — while
/// another node is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_the_master_with_many_connections() {
    const CONNECTIONS: usize = 8;
    const STREAMS: u32 = 64;
    const PER_CLIENT: usize = 4;
    const PER_STREAM_KIB: u64 = 1536;
    let big = LargeListing::start("[metrics]\nlisten = \"127.0.0.1:0\"").await;
    let master = &big.master;
    let sampler = PeakRss::start(master);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..CONNECTIONS {
        match big.stalled("node1", STREAMS).await {
            Ok(h2) => held.push(h2),
            Err(_) => refused += 1,
        }
    }
    // Let what was accepted pin what it will.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Another node is served meanwhile, a whole listing.
    let other = client(&big.pki, Some("node2"));
    let listing = other
        .get(format!("{}{}", master.url(), listing_path()))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("node2's listing");
    assert_eq!(listing.status(), 200);
    assert_eq!(
        listing.bytes().await.expect("node2's body").len(),
        big.body_len
    );
    assert_eq!(health(&other, &master.url()).await, Some(200));
    let peak = sampler.stop().await;

    // Of node1's connections, those the master kept are still open.
    let mut open = 0;
    for mut h2 in held {
        open += usize::from(!h2.closed_within(Duration::from_millis(500)).await);
    }
    let bound = PER_CLIENT as u64 * u64::from(STREAMS) * PER_STREAM_KIB;
    eprintln!(
        "node1: {open} of {CONNECTIONS} connections kept ({refused} refused at the handshake); RSS: idle {} MiB, peak {} MiB (bound idle + {} MiB)",
        big.idle / 1024,
        peak / 1024,
        bound / 1024
    );
    assert!(
        peak <= big.idle + bound,
        "one node's unread streams took RSS from {} to {peak} KiB (bound {bound} KiB more)",
        big.idle
    );
    assert!(
        open <= PER_CLIENT,
        "the master kept {open} busy connections of one node open (max_connections_per_client is {PER_CLIENT})"
    );
    assert!(
        master
            .log()
            .contains("connection closed: this client has its limit of busy connections open"),
        "{}",
        master.log()
    );
    let mut scrape = tokio::net::TcpStream::connect(master.metrics_addr())
        .await
        .expect("connect");
    let (status, body) = h1_get(&mut scrape, "/metrics").await.expect("scrape");
    assert_eq!(status, 200);
    let expected = format!(
        "pluginsync_master_connections_refused_per_client_total {}",
        CONNECTIONS - PER_CLIENT
    );
    assert!(
        String::from_utf8_lossy(&body).contains(&expected),
        "no {expected:?} in:\n{}",
        String::from_utf8_lossy(&body)
    );
}

/// A `KEY=` value of a systemd unit file, the last one set.
fn unit_value(unit: &str, key: &str) -> Option<String> {
    unit.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

/// systemd's size (`512M`, `1G`, bytes without a suffix) in MiB; `None`
/// for `infinity` or a percentage, which bound nothing the unit knows.
fn mib(size: &str) -> Option<u64> {
    let (n, unit) = size.split_at(
        size.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(size.len()),
    );
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "" => n >> 20,
        "K" => n >> 10,
        "M" => n,
        "G" => n << 10,
        "T" => n << 20,
        _ => return None,
    })
}

/// Both packaged units cap memory and tasks with finite values, so
/// neither binary can take the host, and the caps leave room for what the
/// binaries legitimately hold (docs/operating.md#memory-and-tasks): the
/// master at least twice the 256 MiB its 100 environments are held to by
/// the bench (`bench/envs.py`), and more tasks than tokio's blocking pool (512) with its
/// workers; the agent at least twice the largest listing it accepts
/// (`MAX_LISTING_BYTES`, parsed beside its JSON). `packaging/test-install.sh`
/// checks the installed units too.
#[test]
fn the_packaged_units_cap_memory_and_tasks() {
    let listing_mib = (pluginsync_agent::client::MAX_LISTING_BYTES >> 20) as u64;
    for (unit, min_memory_mib, min_tasks) in [
        ("pluginsync-master.service", 2 * 256, 512 + 64),
        ("pluginsync-agent.service", 2 * listing_mib, 64),
    ] {
        let path = pluginsync_tests::repo_root().join("packaging").join(unit);
        let text = std::fs::read_to_string(&path).expect("unit file");
        let memory =
            unit_value(&text, "MemoryMax").unwrap_or_else(|| panic!("{unit} sets no MemoryMax="));
        let memory =
            mib(&memory).unwrap_or_else(|| panic!("{unit}: MemoryMax={memory} is not a size"));
        assert!(
            memory >= min_memory_mib,
            "{unit}: MemoryMax= {memory} MiB, below {min_memory_mib} MiB"
        );
        let tasks =
            unit_value(&text, "TasksMax").unwrap_or_else(|| panic!("{unit} sets no TasksMax="));
        let tasks: u64 = tasks
            .parse()
            .unwrap_or_else(|_| panic!("{unit}: TasksMax={tasks} is not a number"));
        assert!(
            tasks >= min_tasks,
            "{unit}: TasksMax={tasks}, below {min_tasks}"
        );
    }
}
