//! Fault injection: the agent killed with SIGKILL at random points of a
//! sync (`scripts/fault-inject.sh` for hundreds; docs/protocol.md §4.8). For
//! initial syncs (empty destinations) and incremental ones (the old tree to the
//! new: changed, added, removed files and a changed mode), straight from a
//! master and through a throttled [`CutProxy`] (so kills land in the
//! staging too), three runs are measured, then runs are killed at uniform
//! random fractions of their median duration. After every kill:
//!
//! - every file under a final name in either destination has the content
//!   of the old or the new tree at that path (sha256 compared against
//!   both; the staging directory is not a final name);
//! - each destination is the old tree or the new one exactly, never a mix
//!   (docs/internals.md#the-switch), and so is every previous generation
//!   kept beside it in `.<name>.pluginsync/`;
//! - nothing was written outside the destinations, their
//!   `.<name>.pluginsync/` and the vardir;
//! - the next uninterrupted run converges to the new tree exactly (what
//!   it should purge is gone, the staging directory too).
//!
//! `FAULT_POINTS` kills per scenario (default 12, four scenarios: 48 in
//! CI); `scripts/fault-inject.sh` runs hundreds. Every fourth kill is
//! aimed at the switch: a few milliseconds after the run's debug line
//! `commit started`, which comes right before it. The seed is printed with
//! every failure; `FAULT_SEED=<seed>` replays it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, CutProxy, EnvTree, Lcg, Pki, TestMaster, bin_path, config_toml, merged_mount,
    parse_config, tree_snapshot,
};

/// The old tree (`new = false`) or the new one: the same generated
/// modules, then in the new one a third of the files changed, a seventh
/// removed, a directory of new files, a fact changed, one removed, one
/// added, and a mode changed.
fn tree(new: bool) -> EnvTree {
    let t = EnvTree::new();
    let files = t.generate("production", 6, 20, 5);
    t.file("production", "mod00", "facts.d/kept.txt", "kept=1\n", 0o644);
    t.file(
        "production",
        "mod00",
        "lib/facter/mode.rb",
        "# mode\n",
        0o644,
    );
    if !new {
        t.file("production", "mod00", "facts.d/gone.txt", "gone=1\n", 0o644);
        t.file("production", "mod01", "lib/old_only/a.rb", "# old\n", 0o644);
        return t;
    }
    for (i, f) in files.iter().enumerate() {
        if i % 7 == 0 {
            std::fs::remove_file(f).unwrap();
        } else if i % 3 == 0 {
            std::fs::write(f, format!("# changed {i}\n").repeat(i % 11 + 1)).unwrap();
        }
    }
    for i in 0..10 {
        t.file(
            "production",
            "mod02",
            &format!("lib/added/dir{}/new_{i}.rb", i % 3),
            format!("# added {i}\n"),
            0o644,
        );
    }
    t.file("production", "mod00", "facts.d/kept.txt", "kept=2\n", 0o644);
    t.file(
        "production",
        "mod00",
        "facts.d/added.sh",
        "#!/bin/sh\necho added=1\n",
        0o755,
    );
    t.file(
        "production",
        "mod00",
        "lib/facter/mode.rb",
        "# mode\n",
        0o755,
    );
    t
}

/// Both mounts of a tree, as `tree_snapshot` pictures the destinations.
fn mounts(t: &EnvTree) -> [BTreeMap<String, String>; 2] {
    let env = t.envpath().join("production");
    [merged_mount(&env, "lib"), merged_mount(&env, "facts.d")]
}

/// A file entry's sha256 (`file <mode> <sha256>`).
fn sha(entry: &str) -> Option<&str> {
    entry
        .strip_prefix("file ")
        .and_then(|e| e.split(' ').nth(1))
}

/// `<parent>/.<name>.pluginsync`, where `dest`'s standby trees are kept.
fn container(dest: &std::path::Path) -> PathBuf {
    let name = dest.file_name().unwrap().to_string_lossy();
    dest.with_file_name(format!(".{name}.pluginsync"))
}

/// The world one scenario runs in.
struct World {
    old: TestMaster,
    new: TestMaster,
    old_mounts: [BTreeMap<String, String>; 2],
    new_mounts: [BTreeMap<String, String>; 2],
    home: AgentHome,
    _trees: (EnvTree, EnvTree),
}

impl World {
    fn new(pki: &Pki) -> World {
        let (t_old, t_new) = (tree(false), tree(true));
        let start =
            |t: &EnvTree| TestMaster::start(parse_config(&config_toml(&t.envpath(), pki, "", "")));
        let (old, new) = (start(&t_old), start(&t_new));
        let home = AgentHome::new(pki, &[new.url()], "");
        std::fs::create_dir_all(home.path().join("outside")).unwrap();
        std::fs::write(home.path().join("outside/sentinel"), "untouched").unwrap();
        World {
            old_mounts: mounts(&t_old),
            new_mounts: mounts(&t_new),
            old,
            new,
            home,
            _trees: (t_old, t_new),
        }
    }

    fn dests(&self) -> [PathBuf; 2] {
        [self.home.libdir(), self.home.factsdir()]
    }

    fn synced(&self) -> [BTreeMap<String, String>; 2] {
        self.dests().map(|d| tree_snapshot(&d))
    }

    /// An uninterrupted run from `server` that must converge to `want`.
    fn converge(&self, server: &str, want: &[BTreeMap<String, String>; 2], ctx: &str) {
        let run = self.home.sync(&["--server", server]);
        assert_eq!(run.code, 0, "{ctx}: {run:?}");
        assert_eq!(&self.synced(), want, "{ctx}: the run did not converge");
    }

    /// Empties both destinations, their standby containers and the
    /// vardir (an initial sync).
    fn wipe(&self) {
        let [lib, facts] = self.dests().map(|d| container(&d));
        for d in [
            self.home.libdir(),
            self.home.factsdir(),
            self.home.vardir(),
            lib,
            facts,
        ] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// What is on disk for both destinations: each root's mode, and the
    /// entries of each destination and its standby container together,
    /// its trash aside (the destination's root is part of the tree, and a
    /// run leaves no more copies than it keeps: docs/agent.md).
    fn on_disk(&self) -> ([u32; 2], usize) {
        use std::os::unix::fs::PermissionsExt;
        let dests = self.dests();
        let mode =
            |d: &PathBuf| std::fs::metadata(d).map_or(0, |m| m.permissions().mode() & 0o7777);
        // The trash is left out: it holds what the last run replaced,
        // freed by the next one on a thread of its own (docs/agent.md).
        let kept = |d: &PathBuf| {
            let c = tree_snapshot(&container(d));
            c.keys().filter(|k| !k.starts_with("trash/")).count()
        };
        let entries = dests.iter().map(|d| tree_snapshot(d).len() + kept(d)).sum();
        (dests.each_ref().map(mode), entries)
    }

    /// A run from `server` killed with SIGKILL after `delay` (or ended
    /// by itself before); returns whether it was killed.
    fn killed_run(&self, server: &str, delay: Duration) -> bool {
        let mut child = Command::new(bin_path("pluginsync-agent"))
            .args(["sync", "--server", server, "--config"])
            .arg(self.home.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agent");
        let start = Instant::now();
        while start.elapsed() < delay {
            if child.try_wait().expect("wait").is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    /// A run from `server` killed with SIGKILL `delay` after its debug
    /// line `commit started` (the switch comes next); returns whether it
    /// was killed (false: it ended before).
    fn aimed_run(&self, server: &str, delay: Duration) -> bool {
        let mut agent = self
            .home
            .spawn_sync(&["--server", server], "pluginsync_agent=debug");
        if !agent.stderr_until("commit started") {
            agent.finish();
            return false;
        }
        std::thread::sleep(delay);
        agent.signal(rustix::process::Signal::KILL);
        agent.finish();
        true
    }

    /// Each destination, without its staging directory, is `old` or the
    /// new tree exactly; so is every previous generation kept beside it,
    /// and its container holds nothing but the agent's trees.
    fn check_whole(&self, old: &[BTreeMap<String, String>; 2], ctx: &str) {
        let whole = |snap: &BTreeMap<String, String>, i: usize| {
            let mut snap = snap.clone();
            snap.retain(|rel, _| {
                rel != ".pluginsync-staging" && !rel.starts_with(".pluginsync-staging/")
            });
            snap == old[i] || snap == self.new_mounts[i] || snap == self.old_mounts[i]
        };
        for (i, dest) in self.dests().iter().enumerate() {
            assert!(
                whole(&tree_snapshot(dest), i),
                "{ctx}: {} is a mix of the old and the new tree",
                dest.display()
            );
            let name = dest.file_name().unwrap().to_string_lossy();
            let container = self.home.path().join(format!(".{name}.pluginsync"));
            let Ok(entries) = std::fs::read_dir(&container) else {
                continue;
            };
            for e in entries {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                if n.starts_with("prev.") && n.ends_with(".state")
                    || n.starts_with(".pluginsync-tmp-")
                {
                    // A generation's record, or one a kill cut (removed
                    // by the next run, as in the vardir).
                    continue;
                }
                if n.starts_with("prev.") {
                    let kept = tree_snapshot(&container.join(&n));
                    assert!(
                        whole(&kept, i) || kept.is_empty(),
                        "{ctx}: {n} beside {} is not a generation",
                        dest.display()
                    );
                } else {
                    // `trash`: the files a standby's commit replaced,
                    // freed by the next run (docs/internals.md#the-switch).
                    assert!(
                        ["next", "probe.a", "probe.b", "trash"].contains(&n.as_str()),
                        "{ctx}: '{n}' written in {}",
                        container.display()
                    );
                }
            }
        }
    }

    /// The invariants after a kill; returns where the kill landed, by the
    /// destinations' state: `before` (as they were), `staging` (a staging
    /// directory left), `commit` (new files beside a staging directory or
    /// beside old ones), `after` (the new tree).
    fn check(&self, before: &[BTreeMap<String, String>; 2], ctx: &str) -> &'static str {
        let (mut old_only, mut new_only, mut staging) = (false, false, false);
        for (i, snap) in self.synced().iter().enumerate() {
            for (rel, entry) in snap {
                if rel == ".pluginsync-staging" || rel.starts_with(".pluginsync-staging/") {
                    staging = true;
                    continue;
                }
                if entry.starts_with("dir ") {
                    continue;
                }
                let got = sha(entry).unwrap_or_else(|| {
                    panic!("{ctx}: '{rel}' is not a file or directory: {entry}")
                });
                let in_old = self.old_mounts[i].get(rel).and_then(|e| sha(e)) == Some(got);
                let in_new = self.new_mounts[i].get(rel).and_then(|e| sha(e)) == Some(got);
                assert!(
                    in_old || in_new,
                    "{ctx}: '{rel}' in {} has the content of neither tree ({entry})",
                    self.dests()[i].display()
                );
                old_only |= in_old && !in_new;
                new_only |= in_new && !in_old;
            }
        }
        let mut top: Vec<String> = std::fs::read_dir(self.home.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        for name in &top {
            assert!(
                [
                    ".facts.d.pluginsync",
                    ".lib.pluginsync",
                    "agent.toml",
                    "facts.d",
                    "lib",
                    "outside",
                    "var"
                ]
                .contains(&name.as_str()),
                "{ctx}: '{name}' written outside the destinations"
            );
        }
        assert_eq!(
            tree_snapshot(&self.home.path().join("outside")).len(),
            1,
            "{ctx}: written outside the destinations"
        );
        let now = self.synced();
        if staging && new_only {
            "commit"
        } else if staging {
            "staging"
        } else if old_only && new_only {
            "commit"
        } else if &now == before {
            "before"
        } else {
            "after"
        }
    }
}

/// `FAULT_POINTS` (default 12) kills of initial syncs, then as many of
/// incremental ones, from `via` (the new master, direct or through a
/// proxy).
fn kill_at_random_points(label: &str, world: &World, via: &str) {
    let points: usize = std::env::var("FAULT_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let seed = Lcg::seed_from_env();
    let mut rng = Lcg::new(seed);
    let old = world.old.url();
    let empty = [BTreeMap::new(), BTreeMap::new()];
    let started = Instant::now();
    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    for incremental in [false, true] {
        // Uninterrupted runs, measured, set the range of kill points: the
        // median of three (a shared machine's syncfs varies).
        let mut took = Vec::new();
        for _ in 0..3 {
            world.wipe();
            if incremental {
                world.converge(&old, &world.old_mounts, "setup");
            }
            let t = Instant::now();
            world.converge(via, &world.new_mounts, "measured run");
            took.push(t.elapsed());
        }
        took.sort();
        let duration = took[1];
        // What unkilled runs leave, in the order the kills below follow
        // (incremental: old, new, again and again, so the standby keeps
        // its previous generations): every next run must leave the same
        // root modes and no more entries.
        if incremental {
            for _ in 0..2 {
                world.converge(&old, &world.old_mounts, "steady state");
                world.converge(via, &world.new_mounts, "steady state");
            }
        }
        let (modes, entries) = world.on_disk();
        assert_eq!(modes, [0o755; 2], "{label}: an unkilled run's roots");
        eprintln!("{label}: measured runs took {took:?}");
        for k in 0..points {
            let ctx = format!(
                "{label}, {} kill {k} (seed {seed})",
                if incremental {
                    "incremental"
                } else {
                    "initial"
                }
            );
            let before = if incremental {
                world.converge(&old, &world.old_mounts, &ctx);
                world.old_mounts.clone()
            } else {
                world.wipe();
                empty.clone()
            };
            let killed = if k % 4 == 3 {
                let delay = Duration::from_micros((rng.fraction() * 4000.0) as u64);
                world.aimed_run(via, delay)
            } else {
                world.killed_run(via, duration.mul_f64(rng.fraction() * 1.1))
            };
            let at = world.check(&before, &ctx);
            world.check_whole(&before, &ctx);
            *landed
                .entry(format!("{}{at}", if killed { "" } else { "(ended) " }))
                .or_default() += 1;
            world.converge(via, &world.new_mounts, &ctx);
            world.check_whole(&world.new_mounts, &ctx);
            let (now_modes, now_entries) = world.on_disk();
            assert_eq!(now_modes, modes, "{ctx}: the roots' modes did not converge");
            assert!(
                now_entries <= entries,
                "{ctx}: {now_entries} entries on disk, an unkilled run leaves {entries}"
            );
            for d in world.dests() {
                assert!(!d.join(".pluginsync-staging").exists(), "{ctx}");
            }
        }
    }
    eprintln!(
        "{label}: {} kills (seed {seed}) in {:.1} s, landed: {landed:?}",
        2 * points,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn an_agent_killed_anywhere_leaves_old_or_new_files_and_converges() {
    let pki = Pki::new();
    let world = World::new(&pki);
    let new = world.new.url();
    kill_at_random_points("direct", &world, &new);
}

#[test]
fn an_agent_killed_anywhere_in_a_throttled_sync_leaves_old_or_new_files_and_converges() {
    let pki = Pki::new();
    let world = World::new(&pki);
    let proxy = CutProxy::start(world.new.addr);
    // ~250 KB of listings and content at 1 MB/s per connection: the
    // downloads take a good part of the run.
    proxy.throttle(1 << 20);
    kill_at_random_points("throttled", &world, &proxy.url());
}

#[test]
fn the_checks_catch_a_partial_file_and_a_write_outside() {
    let pki = Pki::new();
    let world = World::new(&pki);
    let none = [BTreeMap::new(), BTreeMap::new()];
    world.converge(&world.new.url(), &world.new_mounts, "setup");
    assert_eq!(world.check(&none, "converged"), "after");
    let catches = |what: &str| {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            world.check(&none, what);
        }));
        assert!(caught.is_err(), "{what} not caught");
    };
    // Half of a file under its final name.
    let f = world.home.libdir().join("facter/mode.rb");
    let full = std::fs::read(&f).unwrap();
    std::fs::write(&f, &full[..full.len() / 2]).unwrap();
    catches("a partial file");
    std::fs::write(&f, &full).unwrap();
    // A file beside the destinations.
    std::fs::write(world.home.path().join("stray.rb"), "x").unwrap();
    catches("a write outside");
    std::fs::remove_file(world.home.path().join("stray.rb")).unwrap();
    assert_eq!(world.check(&none, "restored"), "after");
    world.check_whole(&none, "restored");
    let whole_catches = |what: &str| {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            world.check_whole(&none, what);
        }));
        assert!(caught.is_err(), "{what} not caught");
    };
    // A mixed tree: one fact back to its old content, every file whole.
    let fact = world.home.factsdir().join("kept.txt");
    std::fs::write(&fact, "kept=1\n").unwrap();
    world.check(&none, "a mixed tree");
    whole_catches("a mixed tree");
    std::fs::write(&fact, "kept=2\n").unwrap();
    // Something else beside the generations.
    let junk = world.home.path().join(".lib.pluginsync/junk");
    std::fs::write(&junk, "x").unwrap();
    whole_catches("a write beside the generations");
    std::fs::remove_file(&junk).unwrap();
    world.check_whole(&none, "restored again");
}
