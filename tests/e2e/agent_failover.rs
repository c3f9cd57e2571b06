//! Listings and downloads that fail over across replicas and outlast a
//! restart (docs/protocol.md §4.7). Masters are real (the first one a
//! child process killed with SIGKILL); a [`CutProxy`] in front of it holds
//! the answer at an exact byte count, so every kill lands where the test
//! means it to (mid-download, mid-listing) whatever the machine's speed.
//!
//! - `a_master_killed_mid_download_fails_over_to_its_replica`: two masters
//!   on one tree, the first killed mid-download, `FAILOVER_RUNS` runs
//!   (default 100): every run succeeds with the whole tree.
//! - `a_master_restarted_within_seconds_is_waited_for`: one master, killed
//!   mid-download and restarted on the same port 2 s later: the run
//!   succeeds.
//! - `a_replica_with_another_tree_is_never_mixed_in`: the second master's
//!   listing ETag differs: it serves no content (its counters), and the run
//!   either waits for the first (success, its tree) or fails with one
//!   line and nothing changed.
//! - `a_master_killed_during_the_listings_fails_over_to_its_replica`: the
//!   same two masters, the first killed at a random byte of the listing
//!   phase (a handshake, the first or the second listing), 30 runs: every
//!   run succeeds (the listings fail over too, docs/protocol.md §4.7).
//! - `a_master_restarted_during_the_listings_is_waited_for`: one master,
//!   killed at a random byte of the run (every other run in the listing
//!   phase) and restarted 2 s later, 20 runs: every run succeeds.
//! - `the_listings_of_a_run_are_never_from_two_trees`: the second master
//!   serves another tree, the first is killed at a random byte of the
//!   listing phase and back 2 s later: every run ends with one tree whole,
//!   never plugins of one and facts of the other.

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, AgentRun, ChildMaster, CutProxy, EnvTree, Lcg, Pki, TestMaster, config_toml, kill9,
    merged_mount, parse_config, tree_snapshot,
};

/// An environment whose content dominates its listings: `files` plugins of
/// 64 KiB of incompressible bytes, two facts, one file that is `variant`
/// dependent in each mount (so two variants have different ETags for both
/// mounts but share most blobs).
fn content_tree(files: usize, variant: &str) -> EnvTree {
    let t = EnvTree::new();
    let mut rng = Lcg::new(17);
    for i in 0..files {
        let body: Vec<u8> = (0..64 * 1024).map(|_| rng.next_u32() as u8).collect();
        t.file(
            "production",
            "big",
            &format!("lib/facter/blob{i:02}.rb"),
            body,
            0o644,
        );
    }
    t.file(
        "production",
        "big",
        "lib/puppet/variant.rb",
        format!("# {variant}\n"),
        0o644,
    );
    t.file("production", "big", "facts.d/site.txt", "site=one\n", 0o644);
    t.file(
        "production",
        "big",
        "facts.d/variant.txt",
        format!("variant={variant}\n"),
        0o755,
    );
    t
}

/// What the agent's destinations must hold after a run against `tree`.
fn expected(tree: &EnvTree) -> [std::collections::BTreeMap<String, String>; 2] {
    let env = tree.envpath().join("production");
    [merged_mount(&env, "lib"), merged_mount(&env, "facts.d")]
}

fn synced(home: &AgentHome) -> [std::collections::BTreeMap<String, String>; 2] {
    [
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
    ]
}

fn master_config(dir: &Path, tree: &EnvTree, pki: &Pki) -> std::path::PathBuf {
    let cfg = dir.join(format!("master-{}.toml", std::process::id()));
    std::fs::write(&cfg, config_toml(&tree.envpath(), pki, "", "")).unwrap();
    cfg
}

/// Master → agent bytes through `proxy` of a `--noop` run (handshake and
/// both listings) and of a full first sync: a hold mark between the two
/// is mid-download.
/// Agents that sync Puppet's listings even from masters serving
/// generations: these tests are about the listings' failover rules
/// (by digest, any master with a generation's blob may serve it,
/// docs/protocol.md §4.11).
const LISTINGS: &str = "generations = false";

fn calibrate(proxy: &CutProxy, pki: &Pki, servers: &[String], tree: &EnvTree) -> (u64, u64) {
    calibrate_with(proxy, pki, servers, tree, "")
}

/// [`calibrate`] for agents configured with `extra` (`generations = false`:
/// the tests of Puppet's listings, docs/protocol.md §4.7).
fn calibrate_with(
    proxy: &CutProxy,
    pki: &Pki,
    servers: &[String],
    tree: &EnvTree,
    extra: &str,
) -> (u64, u64) {
    let before = proxy.sent();
    let home = AgentHome::new(pki, servers, extra);
    let noop = home.sync(&["--noop"]);
    assert_eq!(noop.code, 0, "{noop:?}");
    let listings = proxy.sent() - before;
    let home = AgentHome::new(pki, servers, extra);
    let before = proxy.sent();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), expected(tree));
    let full = proxy.sent() - before;
    assert!(
        full > listings + 256 * 1024,
        "the downloads must dominate: {listings} bytes of listings, {full} in all"
    );
    (listings, full)
}

/// Runs a sync of `home` on another thread while `during` runs here.
fn sync_while(home: &AgentHome, during: impl FnOnce()) -> AgentRun {
    std::thread::scope(|s| {
        let run = s.spawn(|| home.sync(&[]));
        during();
        run.join().expect("agent thread")
    })
}

#[test]
fn a_master_killed_mid_download_fails_over_to_its_replica() {
    let runs: usize = std::env::var("FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let (tree, pki) = (content_tree(16, "one"), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let cfg = master_config(dir.path(), &tree, &pki);
    let second = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let mut first = ChildMaster::spawn(&cfg, None);
    let mut proxy = CutProxy::start(first.addr);
    let servers = [proxy.url(), second.url()];
    let (listings, full) = calibrate(&proxy, &pki, &servers, &tree);
    all_succeed(runs, "the first master killed mid-download", seed, |i| {
        // Somewhere in the downloads: past the listings, before the end.
        let mark = proxy.sent() + rng.range(listings + 2048, full - 16 * 1024);
        proxy.hold_at(mark);
        let home = AgentHome::new(&pki, &servers, "");
        let mut held = false;
        let run = sync_while(&home, || {
            held = proxy.wait_held(Duration::from_secs(60));
            kill9(first.pid());
            proxy.down();
        });
        assert!(
            held,
            "run {i} (seed {seed}): the agent never reached byte {mark}"
        );
        let result = match run.code != 0 || synced(&home) != expected(&tree) {
            true => Err(format!("run {i}: {run:?}")),
            false => Ok(()),
        };
        first = ChildMaster::spawn(&cfg, None);
        proxy.up(first.addr);
        result
    });
    // The replica served the rest of every run.
    assert!(second.store.stats.contents_sent.load(SeqCst) > 0);
}

#[test]
fn a_master_restarted_within_seconds_is_waited_for() {
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let (tree, pki) = (content_tree(16, "one"), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let cfg = master_config(dir.path(), &tree, &pki);
    let mut master = ChildMaster::spawn(&cfg, None);
    let mut proxy = CutProxy::start(master.addr);
    let servers = [proxy.url()];
    let (listings, full) = calibrate(&proxy, &pki, &servers, &tree);
    for i in 0..3 {
        let mark = proxy.sent() + rng.range(listings + 2048, full - 16 * 1024);
        proxy.hold_at(mark);
        let home = AgentHome::new(&pki, &servers, "");
        let mut held = false;
        let run = sync_while(&home, || {
            held = proxy.wait_held(Duration::from_secs(60));
            kill9(master.pid());
            proxy.down();
            std::thread::sleep(Duration::from_secs(2));
            master = ChildMaster::spawn(&cfg, None);
            proxy.up(master.addr);
        });
        assert!(
            held,
            "restart {i} (seed {seed}): the agent never reached byte {mark}"
        );
        assert_eq!(run.code, 0, "restart {i} (seed {seed}): {run:?}");
        assert_eq!(run.stderr, "", "restart {i}");
        assert_eq!(synced(&home), expected(&tree), "restart {i}");
    }
}

#[test]
fn a_replica_with_another_tree_is_never_mixed_in() {
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let pki = Pki::new();
    let (tree_a, tree_b) = (content_tree(16, "one"), content_tree(16, "two"));
    let start =
        |t: &EnvTree| TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let (first, other) = (start(&tree_a), start(&tree_b));
    let mut proxy = CutProxy::start(first.addr);
    let servers = [proxy.url(), other.url()];
    let (listings, full) = calibrate_with(&proxy, &pki, &servers, &tree_a, LISTINGS);
    let stats = &other.store.stats;
    assert_eq!(stats.contents_sent.load(SeqCst), 0);

    // The first master goes for good: the run can only wait for it, then
    // fail with one line, its destinations as they were.
    let home = AgentHome::new(&pki, &servers, LISTINGS);
    let config = home.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("timeout = \"60s\"", "timeout = \"4s\""),
    )
    .unwrap();
    std::fs::create_dir_all(home.libdir()).unwrap();
    std::fs::write(
        home.libdir().join("old.rb"),
        "kept: nothing is purged on error",
    )
    .unwrap();
    let before = synced(&home);
    let probes = stats.listings_sent.load(SeqCst) + stats.listings_not_modified.load(SeqCst);
    proxy.hold_at(proxy.sent() + rng.range(listings + 2048, full - 16 * 1024));
    let run = sync_while(&home, || {
        assert!(proxy.wait_held(Duration::from_secs(60)), "seed {seed}");
        proxy.down();
    });
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("nothing was changed"), "{}", run.stderr);
    assert_eq!(synced(&home), before, "nothing changed, nothing purged");
    assert!(!home.libdir().join(".pluginsync-staging").exists());
    assert_eq!(
        stats.contents_sent.load(SeqCst),
        0,
        "no content from the other tree"
    );
    assert!(
        stats.listings_sent.load(SeqCst) + stats.listings_not_modified.load(SeqCst) > probes,
        "the other master was asked for its listing, and refused"
    );

    // The first master comes back while the agent waits: the run
    // succeeds with the first tree, still nothing from the other.
    proxy.up(first.addr);
    let home = AgentHome::new(&pki, &servers, LISTINGS);
    let probes = stats.listings_sent.load(SeqCst) + stats.listings_not_modified.load(SeqCst);
    proxy.hold_at(proxy.sent() + rng.range(listings + 2048, full - 16 * 1024));
    let run = sync_while(&home, || {
        assert!(proxy.wait_held(Duration::from_secs(60)), "seed {seed}");
        proxy.down();
        // Back once the agent has looked at the other master (bounded).
        let asked = Instant::now();
        while stats.listings_sent.load(SeqCst) + stats.listings_not_modified.load(SeqCst) == probes
            && asked.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        proxy.up(first.addr);
    });
    assert_eq!(run.code, 0, "seed {seed}: {run:?}");
    assert_eq!(synced(&home), expected(&tree_a));
    assert_eq!(
        stats.contents_sent.load(SeqCst),
        0,
        "no content from the other tree"
    );
}

/// Where a run's kill lands, in master → agent bytes from the run's
/// start: in the listing phase (handshakes and both listings, the first
/// `listings` bytes of a run) or anywhere in the run (`full` bytes).
fn kill_mark(rng: &mut Lcg, listings: u64, full: u64, listing_phase: bool) -> u64 {
    let end = if listing_phase { listings } else { full };
    rng.range(1, end.saturating_sub(1).max(2))
}

/// The first master of the listing-phase tests: a child process behind a
/// [`CutProxy`], killed at an exact byte of a run and brought back.
struct Killable {
    master: ChildMaster,
    proxy: CutProxy,
    cfg: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Killable {
    fn start(tree: &EnvTree, pki: &Pki) -> Killable {
        let dir = tempfile::tempdir().unwrap();
        let cfg = master_config(dir.path(), tree, pki);
        let master = ChildMaster::spawn(&cfg, None);
        let proxy = CutProxy::start(master.addr);
        Killable {
            master,
            proxy,
            cfg,
            _dir: dir,
        }
    }

    /// One sync of `home` during which the master is SIGKILLed once the
    /// agent has received `mark` bytes of it (its port refuses from then
    /// on), and restarted on the same port `restart_after` later while the
    /// agent runs — or, with `None`, once the run is over.
    fn killed_run(
        &mut self,
        home: &AgentHome,
        mark: u64,
        restart_after: Option<Duration>,
        context: &str,
    ) -> AgentRun {
        self.proxy.hold_at(self.proxy.sent() + mark);
        let mut held = false;
        let run = sync_while(home, || {
            held = self.proxy.wait_held(Duration::from_secs(60));
            self.proxy.down();
            kill9(self.master.pid());
            if let Some(pause) = restart_after {
                std::thread::sleep(pause);
                self.restart();
            }
        });
        if restart_after.is_none() {
            self.restart();
        }
        assert!(held, "{context}: the agent never reached byte {mark}");
        run
    }

    fn restart(&mut self) {
        self.master = ChildMaster::spawn(&self.cfg, None);
        self.proxy.up(self.master.addr);
    }
}

/// Runs `run(i)` for each of `runs` runs; prints how many failed (`Err`,
/// with why) and how long they took, and fails the test, with the seed to
/// replay it, if any did.
fn all_succeed(
    runs: usize,
    what: &str,
    seed: u64,
    mut run: impl FnMut(usize) -> Result<(), String>,
) {
    let started = Instant::now();
    let failed: Vec<String> = (0..runs).filter_map(|i| run(i).err()).collect();
    eprintln!(
        "{runs} runs with {what}: {} failed, {:.1} s",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {runs} runs failed (seed {seed}):\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// `Err` unless `run` succeeded silently and `home` holds `tree`.
fn whole(run: &AgentRun, home: &AgentHome, tree: &EnvTree, context: String) -> Result<(), String> {
    match run.code == 0 && run.stderr.is_empty() && synced(home) == expected(tree) {
        true => Ok(()),
        false => Err(format!("{context}: {run:?}")),
    }
}

#[test]
fn a_master_killed_during_the_listings_fails_over_to_its_replica() {
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let (tree, pki) = (content_tree(6, "one"), Pki::new());
    let second = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let mut first = Killable::start(&tree, &pki);
    let servers = [first.proxy.url(), second.url()];
    let (listings, full) = calibrate_with(&first.proxy, &pki, &servers, &tree, LISTINGS);
    let stats = &second.store.stats;
    let listed = || stats.listings_sent.load(SeqCst) + stats.listings_not_modified.load(SeqCst);
    let before = listed();
    all_succeed(30, "the first master killed in the listings", seed, |i| {
        // Anywhere from the first handshake to the last listing byte.
        let mark = kill_mark(&mut rng, listings, full, true);
        let home = AgentHome::new(&pki, &servers, LISTINGS);
        let context = format!("run {i} (byte {mark} of {listings}, seed {seed})");
        let run = first.killed_run(&home, mark, None, &context);
        whole(&run, &home, &tree, context)
    });
    // The replica answered the listings the first could not.
    assert!(listed() > before);
}

#[test]
fn a_master_restarted_during_the_listings_is_waited_for() {
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let (tree, pki) = (content_tree(6, "one"), Pki::new());
    let mut master = Killable::start(&tree, &pki);
    let servers = [master.proxy.url()];
    let (listings, full) = calibrate(&master.proxy, &pki, &servers, &tree);
    let pause = Some(Duration::from_secs(2));
    all_succeed(20, "the master restarted 2 s after a kill", seed, |i| {
        // Every other run in the listing phase, the others anywhere.
        let mark = kill_mark(&mut rng, listings, full, i % 2 == 0);
        let home = AgentHome::new(&pki, &servers, "");
        let context = format!("restart {i} (byte {mark} of {full}, seed {seed})");
        let run = master.killed_run(&home, mark, pause, &context);
        whole(&run, &home, &tree, context)
    });
}

#[test]
fn the_listings_of_a_run_are_never_from_two_trees() {
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let pki = Pki::new();
    let (tree_a, tree_b) = (content_tree(6, "one"), content_tree(6, "two"));
    let other = TestMaster::start(parse_config(&config_toml(&tree_b.envpath(), &pki, "", "")));
    let mut first = Killable::start(&tree_a, &pki);
    let servers = [first.proxy.url(), other.url()];
    let (listings, full) = calibrate(&first.proxy, &pki, &servers, &tree_a);
    let mut seen = [0; 2];
    all_succeed(
        12,
        "the first master killed in the listings, two trees",
        seed,
        |i| {
            // Killed in the first listing: the other master is the run's
            // origin (tree b); in the second: it serves another plugins
            // listing, so the run waits for the first master, back 2 s later
            // (tree a). Never plugins of one and facts of the other.
            let mark = kill_mark(&mut rng, listings, full, true);
            let home = AgentHome::new(&pki, &servers, "");
            let context = format!("run {i} (byte {mark} of {listings}, seed {seed})");
            let run = first.killed_run(&home, mark, Some(Duration::from_secs(2)), &context);
            let which = [&tree_a, &tree_b]
                .iter()
                .position(|t| whole(&run, &home, t, String::new()).is_ok());
            let which = which.ok_or_else(|| format!("{context}: neither tree whole: {run:?}"))?;
            seen[which] += 1;
            Ok(())
        },
    );
    eprintln!("of the first tree: {}, of the other: {}", seen[0], seen[1]);
}
