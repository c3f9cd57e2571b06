//! The switch of generations on the node (docs/internals.md#the-switch,
//! docs/agent.md#generations-and-rollback), with the real agent binary
//! against a real master:
//!
//! - a reader that opens the libdir once per walk and reads every
//!   module's marker relative to it, in a loop while `SWITCH_CHANGES`
//!   (default 200) changes are committed, never sees two generations in
//!   one walk;
//! - `rollback` brings the previous tree back byte for byte and mode for
//!   mode with the master stopped, and reports it; a second one goes
//!   forward again; the next `sync` converges back;
//! - `[load] rollback_on_failure` rolls back after a failing load;
//! - `rollback` with no previous generation says so in one line and
//!   changes nothing;
//! - without `RENAME_EXCHANGE` (the test hook `PLUGINSYNC_TEST_NO_EXCHANGE`)
//!   the run commits in place, warns once and says so in its report;
//! - the switch waits for a Puppet run holding its lock, its next
//!   generation prepared and the live tree the old one meanwhile;
//! - edits by hand and ignored names follow every switch; `[switch]
//!   keep_previous` keeps that many whole generations;
//! - a standby brought to the live tree by the paths of the last change
//!   alone (the fast path) leaves every previous generation whole, through
//!   changed, added, removed files and mode-only changes.
//!
//! Each state of the node is an environment of one tree; the agent moves
//! between them with `--environment`, so the master never re-indexes.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, config_toml, merged_mount, parse_config, tree_snapshot,
};

/// Modules per generation in the reader test.
const MODULES: usize = 12;

/// The last report, as JSON.
fn last_report(home: &AgentHome) -> serde_json::Value {
    let text = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
    serde_json::from_str(&text).expect(&text)
}

/// `g<k>`: every module's marker says `g<k>`; a shared file stays.
fn generations(t: &EnvTree, count: usize) {
    for k in 0..count {
        let env = format!("g{k:03}");
        for m in 0..MODULES {
            let module = format!("mod{m:02}");
            t.file(
                &env,
                &module,
                &format!("lib/{module}/marker.txt"),
                format!("{env} {module}\n"),
                0o644,
            );
            t.file(
                &env,
                &module,
                &format!("lib/{module}/shared.rb"),
                "# the same in every generation\n",
                0o644,
            );
        }
    }
}

/// One walk: the libdir opened once, every marker read relative to it;
/// the distinct ids seen (empty when the libdir is not there yet).
fn walk(libdir: &Path) -> Vec<String> {
    use rustix::fs::{Mode, OFlags};
    let Ok(dir) = rustix::fs::open(libdir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    else {
        return Vec::new();
    };
    let mut ids: Vec<String> = Vec::new();
    for m in 0..MODULES {
        let name = format!("mod{m:02}/marker.txt");
        let Ok(fd) = rustix::fs::openat(dir.as_fd(), name.as_str(), OFlags::RDONLY, Mode::empty())
        else {
            ids.push("(missing)".into());
            continue;
        };
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).unwrap();
        ids.push(text.split(' ').next().unwrap_or_default().to_owned());
    }
    ids.sort();
    ids.dedup();
    ids
}

#[test]
fn a_reader_never_sees_two_generations_in_one_walk() {
    let changes: usize = std::env::var("SWITCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let pki = Pki::new();
    let t = EnvTree::new();
    generations(&t, changes);
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], "");
    let run = home.sync(&["--environment", "g000"]);
    assert_eq!(run.code, 0, "{run:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, libdir) = (stop.clone(), home.libdir());
        std::thread::spawn(move || {
            let (mut walks, mut mixed) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let ids = walk(&libdir);
                walks += 1;
                if ids.len() > 1 {
                    mixed.push(ids);
                }
            }
            (walks, mixed)
        })
    };
    let mut switches = Vec::new();
    for k in 1..changes {
        let env = format!("g{k:03}");
        let run = home.sync(&["--environment", &env]);
        assert_eq!(run.code, 0, "{env}: {run:?}");
        switches.push(last_report(&home)["switch"].clone());
        let want = merged_mount(&t.envpath().join(&env), "lib");
        assert_eq!(tree_snapshot(&home.libdir()), want, "{env}");
    }
    stop.store(true, Ordering::Relaxed);
    let (walks, mixed) = reader.join().unwrap();
    eprintln!("{changes} changes, {walks} walks, {} mixed", mixed.len());
    assert!(walks > changes, "the reader hardly ran: {walks} walks");
    assert!(
        mixed.is_empty(),
        "{} of {walks} walks saw two generations, e.g. {:?}",
        mixed.len(),
        &mixed[..mixed.len().min(5)]
    );
    assert_eq!(walk(&home.libdir()), [format!("g{:03}", changes - 1)]);
    assert!(switches.iter().all(|s| s == "exchange"), "{switches:?}");
}

/// `one` and `two`: a changed file, a removed one, an added one, a file
/// and a directory whose modes change, a fact changed.
fn two_states() -> EnvTree {
    let t = EnvTree::new();
    for (env, second) in [("one", false), ("two", true)] {
        t.file(env, "a", "lib/a/kept.rb", "# kept\n", 0o644);
        t.file(
            env,
            "a",
            "lib/a/changed.rb",
            if second { "# two\n" } else { "# one\n" },
            0o644,
        );
        t.file(
            env,
            "a",
            "lib/a/mode.rb",
            "# mode\n",
            if second { 0o755 } else { 0o644 },
        );
        t.dir(
            env,
            "a",
            "lib/a/private",
            if second { 0o700 } else { 0o755 },
        );
        t.file(env, "a", "lib/a/private/key.rb", "# key\n", 0o600);
        if second {
            t.file(env, "b", "lib/b/added.rb", "# added\n", 0o644);
        } else {
            t.file(env, "b", "lib/b/removed.rb", "# removed\n", 0o644);
        }
        t.file(
            env,
            "a",
            "facts.d/fact.txt",
            if second { "f=2\n" } else { "f=1\n" },
            0o644,
        );
    }
    t
}

/// A master serving [`two_states`], and an agent home syncing from it with
/// `extra` in its agent.toml.
fn two_state_node(extra: &str) -> (Pki, EnvTree, TestMaster, AgentHome) {
    let pki = Pki::new();
    let t = two_states();
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], extra);
    (pki, t, master, home)
}

/// Both destinations.
fn synced(home: &AgentHome) -> [BTreeMap<String, String>; 2] {
    [
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
    ]
}

/// Both mounts of environment `env`.
fn mounts(t: &EnvTree, env: &str) -> [BTreeMap<String, String>; 2] {
    let dir = t.envpath().join(env);
    [merged_mount(&dir, "lib"), merged_mount(&dir, "facts.d")]
}

#[test]
fn rollback_restores_the_previous_tree_offline_and_reports_it() {
    let (pki, t, master, home) = two_state_node("");
    for env in ["one", "two"] {
        let run = home.sync(&["--environment", env]);
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(synced(&home), mounts(&t, env), "{env}");
    }
    let (one, two) = (mounts(&t, "one"), mounts(&t, "two"));
    // Offline: no master to ask.
    drop(master);
    let run = home.run(&["rollback", "--environment", "one"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), one, "not the previous tree byte for byte");
    for line in [
        "updated  plugins/a/changed.rb",
        "created  plugins/b/removed.rb",
        "removed  plugins/b/added.rb",
        "mode     plugins/a/mode.rb",
        "updated  pluginfacts/fact.txt",
    ] {
        assert!(run.stdout.contains(line), "{line}: {run:?}");
    }
    let report = last_report(&home);
    assert_eq!(report["rolled_back"], true, "{report}");
    assert!(report["error"].is_null(), "{report}");
    // A second rollback goes forward again, a third back.
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), two);
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), one);
    // The next sync converges back to the master's generation.
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let run = home.sync(&["--environment", "two", "--server", &master.url()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), two);
}

#[test]
fn a_failing_load_rolls_back_with_rollback_on_failure() {
    let loaders = "[load]\nenabled = true\nrollback_on_failure = true\n\n[[loader]]\nname = \"refuses added.rb\"\nmatch = \"b/added.rb\"\nkind = \"command\"\ncommand = [\"false\"]\n";
    let (_pki, t, _master, home) = two_state_node(loaders);
    let run = home.sync(&["--environment", "one"]);
    assert_eq!(run.code, 0, "{run:?}");
    let run = home.sync(&["--environment", "two"]);
    let report = last_report(&home);
    assert_eq!(report["rolled_back"], true, "{run:?} {report}");
    let added = report["loads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["path"] == "plugins/b/added.rb")
        .expect("the load of b/added.rb");
    assert_eq!(added["status"], "failed", "{report}");
    assert_eq!(synced(&home)[0], mounts(&t, "one")[0], "not rolled back");
    assert!(
        run.stderr.contains("the previous generation is live again"),
        "{run:?}"
    );
}

#[test]
fn rollback_without_a_previous_generation_says_so_and_changes_nothing() {
    let pki = Pki::new();
    let home = AgentHome::new(&pki, &["https://localhost:1".to_owned()], "");
    std::fs::create_dir_all(home.libdir().join("mine")).unwrap();
    std::fs::write(home.libdir().join("mine/local.rb"), "# mine\n").unwrap();
    let before = synced(&home);
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(
        run.stderr
            .contains("no previous generation to roll back to"),
        "{run:?}"
    );
    assert_eq!(synced(&home), before);
    let names: Vec<String> = std::fs::read_dir(home.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pluginsync"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn without_rename_exchange_the_run_commits_in_place_and_says_so() {
    let (_pki, t, _master, home) = two_state_node("");
    let hook = [("PLUGINSYNC_TEST_NO_EXCHANGE", "1")];
    for env in ["one", "two"] {
        let run = home.run_env(&["sync", "--environment", env], &hook);
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(synced(&home), mounts(&t, env), "{env}");
        let warnings: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.contains("RENAME_EXCHANGE"))
            .collect();
        assert_eq!(warnings.len(), 2, "one per destination: {run:?}");
        assert_eq!(last_report(&home)["switch"], "in-place");
    }
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 1, "no generation kept in place: {run:?}");
    assert_eq!(synced(&home), mounts(&t, "two"));
    // The same node with the exchange: switched, and kept.
    let run = home.sync(&["--environment", "one"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(last_report(&home)["switch"], "exchange");
    assert!(!run.stderr.contains("RENAME_EXCHANGE"), "{run:?}");
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), mounts(&t, "two"));
}

/// The switch waits while a Puppet run holds its lock
/// (docs/agent.md#a-puppet-run-in-progress), and comes right after the
/// wait: while the lock is held the next generation is already prepared
/// beside the libdir and the live tree is the old one; once the holder is
/// gone the run switches, and its report says it waited and exchanged.
#[test]
fn the_switch_waits_for_a_puppet_run_holding_its_lock() {
    let (_pki, t, _master, home) = two_state_node("");
    let lock = home.path().join("puppet/agent_catalog_run.lock");
    let toml = std::fs::read_to_string(home.path().join("agent.toml")).unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        toml.replacen(
            "[tls]",
            &format!("[puppet_lock]\nwait = \"60s\"\nfile = {lock:?}\n\n[tls]"),
            1,
        ),
    )
    .unwrap();
    let run = home.sync(&["--environment", "one"]);
    assert_eq!(run.code, 0, "{run:?}");
    let mut holder = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    std::fs::write(&lock, format!("{}\n", holder.id())).unwrap();
    let mut agent = home.spawn_sync(&["--environment", "two"], "pluginsync_agent=info");
    assert!(
        agent.stderr_until("a Puppet run holds its lock"),
        "{:?}",
        agent.lines
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (one, two) = (mounts(&t, "one"), mounts(&t, "two"));
    let mut live = synced(&home);
    for snap in &mut live {
        snap.retain(|rel, _| !rel.starts_with(".pluginsync-staging"));
    }
    assert_eq!(live, one, "the libdir changed under a Puppet run");
    let mut prepared = tree_snapshot(&home.path().join(".lib.pluginsync/next"));
    prepared.retain(|rel, _| !rel.starts_with(".pluginsync-staging"));
    assert_eq!(prepared, two[0], "not prepared before the wait");
    holder.kill().unwrap();
    holder.wait().unwrap();
    std::fs::remove_file(&lock).unwrap();
    let run = agent.finish();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), two);
    let report = last_report(&home);
    assert_eq!(report["switch"], "exchange", "{report}");
    assert!(
        report["puppet_lock_waited_ms"].as_u64().unwrap() >= 500,
        "{report}"
    );
}

/// What the agent does not manage survives every switch with its latest
/// content (docs/internals.md#what-the-switch-trusts): an ignored `.git/`
/// edited between runs, and a managed file edited by hand is put back.
#[test]
fn local_edits_and_ignored_names_follow_every_switch() {
    let (_pki, t, _master, home) = two_state_node("");
    let git = home.libdir().join(".git/HEAD");
    for (k, env) in ["one", "two", "one", "two", "one"].into_iter().enumerate() {
        let run = home.sync(&["--environment", env]);
        assert_eq!(run.code, 0, "{run:?}");
        let mut live = synced(&home);
        live[0].retain(|rel, _| !rel.starts_with(".git"));
        assert_eq!(live, mounts(&t, env), "run {k} ({env})");
        if k > 0 {
            assert_eq!(
                std::fs::read_to_string(&git).unwrap(),
                format!("ref {}\n", k - 1)
            );
        }
        std::fs::create_dir_all(git.parent().unwrap()).unwrap();
        std::fs::write(&git, format!("ref {k}\n")).unwrap();
        // A managed file edited by hand: the next run puts it back.
        std::fs::write(home.libdir().join("a/kept.rb"), format!("# edited {k}\n")).unwrap();
    }
}

/// `[switch] keep_previous`: that many previous generations, each a whole
/// tree, the newest the one `rollback` brings back; 0 is refused.
#[test]
fn keep_previous_keeps_that_many_whole_generations() {
    let (_pki, t, _master, home) = two_state_node("[switch]\nkeep_previous = 2\n");
    for env in ["one", "two", "one", "two"] {
        let run = home.sync(&["--environment", env]);
        assert_eq!(run.code, 0, "{run:?}");
    }
    let kept = home.path().join(".lib.pluginsync");
    let mut prev: Vec<String> = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("prev.") && !n.ends_with(".state"))
        .collect();
    prev.sort();
    assert_eq!(prev.len(), 2, "{prev:?}");
    let (one, two) = (mounts(&t, "one"), mounts(&t, "two"));
    for p in &prev {
        let snap = tree_snapshot(&kept.join(p));
        assert!(snap == one[0] || snap == two[0], "{p} is no generation");
    }
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), one);
    let toml = std::fs::read_to_string(home.path().join("agent.toml")).unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        toml.replace("keep_previous = 2", "keep_previous = 0"),
    )
    .unwrap();
    let run = home.run(&["config"]);
    assert_eq!(run.code, 78, "{run:?}");
    assert!(
        run.stderr
            .contains("keep_previous must be between 1 and 16, not 0"),
        "{run:?}"
    );
}

/// The newest previous generation of `dest` (`prev.<n>`, highest `n`).
fn newest_previous(dest: &Path) -> std::path::PathBuf {
    let name = dest.file_name().unwrap().to_string_lossy();
    let kept = dest.parent().unwrap().join(format!(".{name}.pluginsync"));
    let newest = std::fs::read_dir(&kept)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_prefix("prev.")?.parse::<u64>().ok()
        })
        .max()
        .expect("a previous generation");
    kept.join(format!("prev.{newest}"))
}

#[test]
fn the_fast_path_leaves_every_previous_generation_whole() {
    let (_pki, t, _master, home) = two_state_node("");
    let mut before: Option<&str> = None;
    for (k, env) in ["one", "two", "one", "two", "one", "two"]
        .into_iter()
        .enumerate()
    {
        let run = home.run(&["-vv", "sync", "--environment", env]);
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(synced(&home), mounts(&t, env), "run {k} ({env})");
        // Everything the preparation touched is its own (no false alarm
        // of a foreign entry, which would cost the next run its cache).
        assert!(
            !run.stderr.contains("another process wrote"),
            "run {k}: {}",
            run.stderr
        );
        let Some(was) = before.replace(env) else {
            continue;
        };
        // Only the paths of the change before were mirrored: the standby
        // was the generation before that one.
        assert!(
            run.stderr.contains("standby mirrored") && !run.stderr.contains("fast=false"),
            "run {k} did not take the fast path: {}",
            run.stderr
        );
        let previous = [
            tree_snapshot(&newest_previous(&home.libdir())),
            tree_snapshot(&newest_previous(&home.factsdir())),
        ];
        assert_eq!(previous, mounts(&t, was), "run {k}: the generation retired");
    }
}

#[test]
fn a_replaced_file_waits_in_the_trash_until_the_next_run_frees_it() {
    let (_pki, t, _master, home) = two_state_node("");
    for env in ["one", "two", "one"] {
        let run = home.sync(&["--environment", env]);
        assert_eq!(run.code, 0, "{run:?}");
    }
    assert_eq!(synced(&home), mounts(&t, "one"));
    // The third run's standby was the first tree: its copies of what the
    // change writes were moved aside, not freed in the commit.
    let trash = home.path().join(".lib.pluginsync/trash");
    let trashed = |trash: &Path| -> Vec<String> {
        let mut all: Vec<String> = std::fs::read_dir(trash)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        all.sort();
        all
    };
    assert_eq!(trashed(&trash), vec!["# one\n".to_owned()]);
    let facts = home.path().join(".facts.d.pluginsync/trash");
    assert_eq!(trashed(&facts), vec!["f=1\n".to_owned()]);
    // The next run frees them off its own path (a thread its exit may cut
    // short: what is left, the run after it frees).
    let mut runs = 0;
    while !(trashed(&trash).is_empty() && trashed(&facts).is_empty()) {
        runs += 1;
        assert!(runs <= 5, "the trash is never emptied");
        let run = home.sync(&["--environment", "one"]);
        assert_eq!(run.code, 0, "{run:?}");
    }
    assert_eq!(synced(&home), mounts(&t, "one"));
    assert_eq!(
        tree_snapshot(&newest_previous(&home.libdir())),
        mounts(&t, "two")[0],
        "the kept generation is whole"
    );
}

/// A user racing the switch (a path taken, or a descriptor held, before
/// the first tree was retired) changes the kept generation: a file no
/// change touched renamed (its directory's times move), or a directory
/// made at the generation's root (no directory of the record moves: the
/// root's names are compared). Either way the next change walks it
/// whole, and no stale or foreign entry goes live.
#[test]
fn a_kept_generation_changed_after_its_record_is_walked_whole() {
    type Tamper = fn(&std::path::Path);
    let tampers: [(&str, Tamper); 2] = [
        ("a file renamed", |kept| {
            std::fs::rename(kept.join("a/kept.rb"), kept.join("a/kept.rb.away")).unwrap();
        }),
        ("a directory made at the root", |kept| {
            std::fs::create_dir(kept.join("zz.away")).unwrap();
            std::fs::write(kept.join("zz.away/foreign.rb"), "foreign\n").unwrap();
        }),
    ];
    for (what, tamper) in tampers {
        let (_pki, t, _master, home) = two_state_node("");
        for env in ["one", "two"] {
            let run = home.sync(&["--environment", env]);
            assert_eq!(run.code, 0, "{what}: {run:?}");
        }
        tamper(&newest_previous(&home.libdir()));
        let run = home.run(&["-vv", "sync", "--environment", "one"]);
        assert_eq!(run.code, 0, "{what}: {run:?}");
        assert!(
            run.stderr.contains("fast=false"),
            "{what}: the standby was trusted: {}",
            run.stderr
        );
        assert_eq!(
            synced(&home),
            mounts(&t, "one"),
            "{what}: a stale tree went live"
        );
    }
}

/// The destination's root is part of the tree (docs/agent.md): a first
/// sync into an existing, empty 0755 libdir (as a package makes it)
/// leaves it 0755, not the standby's 0700, and a run after a wrong mode
/// was given to it puts the master's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_empty_destination_keeps_the_masters_mode_and_a_wrong_one_is_fixed() {
    use std::os::unix::fs::PermissionsExt;
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/a.rb", "# a\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], "");
    let libdir = home.libdir();
    let mode = || std::fs::metadata(&libdir).unwrap().permissions().mode() & 0o7777;
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::set_permissions(&libdir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(libdir.join("facter/a.rb").is_file());
    assert_eq!(mode(), 0o755, "the first sync into an empty 0755 libdir");
    std::fs::set_permissions(&libdir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(mode(), 0o755, "the next run converges");
}
