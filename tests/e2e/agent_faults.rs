//! The agent's commit under faults: a local user swapping the
//! libdir's directories for symlinks while runs commit, a
//! destination whose inodes run out at the commit, and SIGTERM/SIGINT
//! before and during the commit (docs/operating.md#signals). Every run is the
//! real `pluginsync-agent` binary against a real master or a scripted
//! [`FakeMaster`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, EnvTree, FakeMaster, Pki, Racer, TestMaster, config_toml, http_response,
    listing_json, merged_mount, on_small_tmpfs, parse_config, skipped, tree_snapshot,
};
use rustix::process::Signal;

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

/// Environment `env` of module `m`: `lib/d<d>/top.rb` and
/// `lib/d<d>/s<s>/f<f>.rb` for `s` in `subs`, contents naming the
/// environment (so every file differs between two of them).
fn nested(tree: &EnvTree, env: &str, subs: std::ops::Range<usize>) {
    for d in 0..12 {
        tree.file(
            env,
            "m",
            &format!("lib/d{d}/top.rb"),
            format!("{env} {d}\n"),
            0o644,
        );
        for s in subs.clone() {
            for f in 0..4 {
                tree.file(
                    env,
                    "m",
                    &format!("lib/d{d}/s{s}/f{f}.rb"),
                    format!("{env} {d} {s} {f}\n"),
                    0o644,
                );
            }
        }
    }
}

/// A-2: during 50 commits that alternate between two trees (each run
/// creates, updates and purges files in nested directories), a racing
/// user keeps swapping the libdir's directories for symlinks to a sentinel
/// directory outside it. Nothing outside the libdir is written or removed,
/// and a quiet run afterwards converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racing_user_never_redirects_the_commit() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    nested(&tree, "alpha", 0..3);
    nested(&tree, "beta", 1..4);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    // The sentinel holds every name a redirected step could touch there.
    let sentinel = home.path().join("sentinel");
    for s in 0..4 {
        for f in 0..4 {
            let p = sentinel.join(format!("s{s}/f{f}.rb"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "sentinel\n").unwrap();
            std::fs::write(sentinel.join(format!("f{f}.rb")), "sentinel\n").unwrap();
        }
    }
    std::fs::write(sentinel.join("top.rb"), "sentinel\n").unwrap();
    let before = tree_snapshot(&sentinel);
    let first = home.sync(&["--environment", "alpha"]);
    assert_eq!(first.code, 0, "{first:?}");

    let racer = Racer::start(&home.libdir(), &sentinel);
    let (mut failed_runs, mut foreign_runs) = (0, 0);
    for i in 0..50 {
        let env = if i % 2 == 0 { "beta" } else { "alpha" };
        let run = home.sync(&["--environment", env]);
        assert!(run.code == 0 || run.code == 1, "run {i}: {run:?}");
        assert!(!run.stderr.contains("panicked"), "run {i}: {run:?}");
        failed_runs += usize::from(run.code != 0);
        foreign_runs += usize::from(run.stderr.contains("another process wrote"));
        assert_eq!(
            tree_snapshot(&sentinel),
            before,
            "run {i} changed the sentinel outside the libdir: {run:?}"
        );
    }
    let swaps = racer.stop();
    assert!(swaps > 0, "the racer never planted a symlink");
    eprintln!(
        "racer: {swaps} symlinks planted; {failed_runs} of 50 runs failed a step; \
         {foreign_runs} found the racer's entries in their standby"
    );
    assert_eq!(tree_snapshot(&sentinel), before, "the sentinel changed");

    // Quiet: one run converges, the next has nothing to do.
    let run = home.sync(&["--environment", "beta"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        tree_snapshot(&home.libdir()),
        merged_mount(&tree.envpath().join("beta"), "lib"),
        "the quiet run: {run:?}"
    );
    let again = home.sync(&["--environment", "beta"]);
    assert_eq!((again.code, again.stdout.as_str()), (0, ""), "{again:?}");
}

/// A disk that fills at the commit: the staged files fit, the
/// 61 new directories do not (a tmpfs of 24 inodes). The run is refused
/// before its first step with one line naming the destination and what is
/// short; nothing changed, no staging left. With enough inodes the same
/// run succeeds (the check is not over-eager).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_out_of_inodes_is_refused_before_the_commit() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let deep: String = (0..60).map(|i| format!("d{i}/")).collect();
    tree.file(
        "production",
        "m",
        &format!("lib/deep/{deep}f.rb"),
        "f\n",
        0o644,
    );
    tree.file("production", "m", "lib/a.rb", "a\n", 0o644);
    tree.file("production", "m", "lib/b.rb", "b\n", 0o644);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let seed = home.path().join("seed");
    std::fs::create_dir_all(seed.join("old")).unwrap();
    std::fs::write(seed.join("old/x.rb"), "old\n").unwrap();
    std::fs::write(seed.join("keep.rb"), "purged if committed\n").unwrap();
    std::fs::create_dir_all(home.libdir()).unwrap();
    let (small, large) = (home.path().join("small"), home.path().join("large"));
    std::fs::create_dir_all(&small).unwrap();
    std::fs::create_dir_all(&large).unwrap();

    let run = match on_small_tmpfs(&home, &seed, &small, 24) {
        Ok(run) => run,
        Err(why) => {
            return skipped(
                "a_destination_out_of_inodes_is_refused_before_the_commit",
                &why,
            );
        }
    };
    assert_eq!(run.code, 1, "{run:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{run:?}");
    assert!(
        lines[0].starts_with(&format!(
            "error: not enough room for the commit in '{}': ",
            home.libdir().display()
        )) && lines[0].contains(" inodes short (")
            && lines[0].ends_with("; nothing was changed"),
        "{run:?}"
    );
    assert_eq!(
        tree_snapshot(&small),
        tree_snapshot(&seed),
        "the destination changed"
    );

    let run = on_small_tmpfs(&home, &seed, &large, 400).expect("the same mount, larger");
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        tree_snapshot(&large),
        merged_mount(&tree.envpath().join("production"), "lib")
    );
}

/// SIGTERM (and SIGINT) while the agent is staging: the run stops at once
/// with one line and 143 (130), the staging is rolled back and the
/// destination is as it was. The fake master stalls every download, so the
/// agent is certainly before its commit when the signal comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_before_the_commit_changes_nothing() {
    for (signal, code, name) in [(Signal::TERM, 143, "SIGTERM"), (Signal::INT, 130, "SIGINT")] {
        let pki = Pki::new();
        let (stalled, release) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, r) = (stalled.clone(), release.clone());
        let plugins = listing_json(&[("new.rb", Some(b"new\n"), 0o644)]);
        let facts = listing_json(&[]);
        let fake = FakeMaster::start(
            &pki,
            Arc::new(move |t: &str| {
                if t.contains("/file_metadatas/plugins?") {
                    return http_response("200 OK", "application/json", plugins.as_bytes());
                }
                if t.contains("/file_metadatas/pluginfacts?") {
                    return http_response("200 OK", "application/json", facts.as_bytes());
                }
                // A download: stall until released (60 s at most).
                s.store(true, Ordering::SeqCst);
                let start = Instant::now();
                while !r.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                http_response("503 Service Unavailable", "text/plain", b"released")
            }),
        );
        // The fake serves listings and stalls everything else.
        let home = AgentHome::new(&pki, &[fake.url()], "generations = false");
        std::fs::create_dir_all(home.libdir().join("old")).unwrap();
        std::fs::write(home.libdir().join("old/x.rb"), "old\n").unwrap();
        let before = tree_snapshot(&home.libdir());

        let agent = home.spawn_sync(&[], "");
        let staging = home.libdir().join(".pluginsync-staging");
        let start = Instant::now();
        while !(stalled.load(Ordering::SeqCst) && staging.is_dir()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the agent never staged"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        agent.signal(signal);
        let run = agent.finish();
        release.store(true, Ordering::SeqCst);
        assert_eq!(run.code, code, "{run:?}");
        assert_eq!(
            run.stderr.lines().collect::<Vec<_>>(),
            [format!(
                "error: interrupted by {name} before the commit; nothing was changed"
            )],
            "{run:?}"
        );
        assert_eq!(
            tree_snapshot(&home.libdir()),
            before,
            "{name}: the destination changed"
        );
        let report = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
        assert!(report.contains("\"applied\": false"), "{report}");
    }
}

/// SIGTERM once the commit has started: the commit finishes (the tree is
/// wholly the new one), the report and cache are saved, the run exits 143
/// without running its loads, and the next run loads them. The commit is
/// held open by its own trace lines: the test stops reading the agent's
/// stderr at `commit started`, so the pipe fills and the agent blocks
/// mid-commit (its trace of 2,000 files is far more than a pipe holds)
/// until the signal has been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_commit_lets_it_finish_and_leaves_the_loads() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    for i in 0..2000 {
        tree.file(
            "production",
            "m",
            &format!("lib/g{}/h{}/f{i}.rb", i % 40, i % 7),
            format!("{i}\n"),
            0o644,
        );
    }
    tree.file("production", "m", "lib/loaders/ok.rb", "ok\n", 0o644);
    let master = start(&tree, &pki);
    let marker = tree.outside().join("loaded");
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        &format!(
            r#"
[load]
enabled = true

[[loader]]
name = "marker"
match = "loaders/*.rb"
kind = "command"
command = ["sh", "-c", "echo \"$0\" >> {}", "{{relpath}}"]
"#,
            marker.display()
        ),
    );
    std::fs::create_dir_all(home.libdir().join("stale")).unwrap();
    std::fs::write(home.libdir().join("stale/x.rb"), "purged\n").unwrap();

    let mut agent = home.spawn_sync(&[], "pluginsync_agent=debug,pluginsync_agent::commit=trace");
    assert!(agent.stderr_until("commit started"), "{:?}", agent.lines);
    agent.signal(Signal::TERM);
    let run = agent.finish();
    assert_eq!(run.code, 143, "{}", run.stdout);
    assert_eq!(
        run.stderr.lines().last(),
        Some(
            "error: interrupted by SIGTERM during the run; the commit was finished, its loads are left to the next run"
        ),
    );
    let expected = merged_mount(&tree.envpath().join("production"), "lib");
    assert_eq!(
        tree_snapshot(&home.libdir()),
        expected,
        "the commit was not finished"
    );
    assert!(!marker.exists(), "a load ran after the signal");
    let pending = std::fs::read_to_string(home.vardir().join("pending_loads.json")).unwrap();
    assert!(pending.contains("loaders/ok.rb"), "{pending}");
    let report = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
    assert!(report.contains("\"applied\": true"), "{report}");

    // The next run loads what was left and has nothing else to do.
    let next = home.sync(&[]);
    assert_eq!(next.code, 0, "{next:?}");
    assert!(!next.stdout.contains("created"), "{next:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "loaders/ok.rb\n");
    assert!(!home.vardir().join("pending_loads.json").exists());
    assert_eq!(tree_snapshot(&home.libdir()), expected);
}

/// SIGTERM while a loader runs: the loader's whole process group (the
/// loader and what it started) is killed, the run exits 143 (its commit
/// was finished) and the load is left to the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_loads_kills_the_loaders_process_groups() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/loaders/hang.rb", "hang\n", 0o644);
    let master = start(&tree, &pki);
    let pid_file = tree.outside().join("pid");
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        &format!(
            r#"
[load]
enabled = true

[[loader]]
name = "hangs"
match = "loaders/*.rb"
kind = "command"
command = ["sh", "-c", "sleep 300 & echo $! > {}; wait"]
timeout = "600s"
"#,
            pid_file.display()
        ),
    );
    let agent = home.spawn_sync(&[], "");
    let start = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the loader never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // `/proc/<pid>/stat` after the command name: the state, and the start
    // time (field 22 of the line), which tells the loader's child from a
    // later process given the same pid.
    let stat = || {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = s.rsplit_once(") ")?.1.to_owned();
        let started = rest.split_whitespace().nth(19)?.to_owned();
        Some((rest.starts_with('Z'), started))
    };
    let (_, started) = stat().expect("the loader's child is running");
    agent.signal(Signal::TERM);
    let run = agent.finish();
    assert_eq!(run.code, 143, "{run:?}");
    assert!(home.libdir().join("loaders/hang.rb").is_file());
    assert!(home.vardir().join("pending_loads.json").is_file());
    // The loader's child is gone (or a zombie waiting for its reaper).
    let start = Instant::now();
    while let Some((false, s)) = stat()
        && s == started
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the loader's child {pid} survived the agent's SIGTERM: {:?}",
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
