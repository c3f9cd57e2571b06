//! What the agent makes durable, and how
//! (docs/internals.md#caches-without-fsync; `agent/src/stage.rs`,
//! `agent/src/commit.rs`, `common/src/fsutil.rs`): the real agent binary under
//! `strace -f -y -e trace=syncfs,fsync,fdatasync` against a real master,
//! each sync call read back with the path of its descriptor.
//!
//! - a run that changes nothing makes no sync call at all;
//! - a small change syncs exactly what it touched — each staged file
//!   (once renamed into the standby, with it), the directories renamed
//!   into, made, purged from in the standby, the staging directory, the
//!   container and the parent for the switch (docs/internals.md#the-switch)
//!   — and never the whole filesystem;
//! - a change above `SYNCFS_ABOVE` files syncs its staged files and the
//!   standby with one `syncfs` of their filesystem, and no staged file one
//!   by one;
//! - on a quiet machine (`[switch] syncfs_below_dirty_mib`), a small
//!   change is synced with one `syncfs` too.
//!
//! Each environment of one tree is a state of the node's libdir; the agent
//! moves between them with `--environment`, so the master never has to
//! re-index. Needs `strace` (Debian's `strace`): skipped with a `SKIPPED`
//! line without it, a failure under CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pluginsync_common::fsutil::SYNCFS_ABOVE;
use pluginsync_tests::{
    AgentHome, AgentRun, EnvTree, Pki, TestMaster, bin_path, config_toml, parse_config, require,
};

/// One sync call: the syscall and the path of its descriptor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    name: String,
    path: PathBuf,
}

/// The sync calls in an `strace -f -y` output: `PID name(FD</path>...`
/// (a call cut by another thread's line is printed `<unfinished ...>`
/// first, with its name and descriptor, and resumed later without them).
fn calls(trace: &str) -> Vec<Call> {
    trace
        .lines()
        .filter_map(|line| {
            let (_pid, rest) = line.trim_start().split_once(char::is_whitespace)?;
            let rest = rest.trim_start();
            let (name, args) = rest.split_once('(')?;
            if !["syncfs", "fsync", "fdatasync"].contains(&name) {
                return None;
            }
            let path = args.split_once('<')?.1.split_once('>')?.0;
            Some(Call {
                name: name.to_owned(),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// Runs `sync --environment <env>` under strace; returns the run and its
/// sync calls.
fn traced_sync(strace: &Path, home: &AgentHome, env: &str) -> (AgentRun, Vec<Call>) {
    let out = home.path().join(format!("strace-{env}.txt"));
    let run = Command::new(strace)
        .args(["-f", "-y", "-qq", "-e", "signal=none"])
        .args(["-e", "trace=syncfs,fsync,fdatasync", "-o"])
        .arg(&out)
        .arg(bin_path("pluginsync-agent"))
        .args(["sync", "--environment", env, "--config"])
        .arg(home.path().join("agent.toml"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run strace");
    let run = AgentRun {
        code: run.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&run.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&run.stderr).into_owned(),
    };
    let trace = std::fs::read_to_string(&out).expect("strace output");
    (run, calls(&trace))
}

/// `calls` as `name path` strings, paths relative to `root`, every
/// staged file shown as `<staged>`, the generations' container beside
/// `root` as `standby:` (docs/internals.md#the-switch) and `root`'s
/// parent as `<parent>`, sorted.
fn picture(calls: &[Call], root: &Path) -> Vec<String> {
    let staging = root.join(".pluginsync-staging");
    let parent = root.parent().unwrap();
    let name = root.file_name().unwrap().to_string_lossy();
    let standby = parent.join(format!(".{name}.pluginsync"));
    let mut all: Vec<String> = calls
        .iter()
        .map(|c| {
            let path = if c.path.parent() == Some(staging.as_path()) {
                "<staged>".to_owned()
            } else if c.path == parent {
                "<parent>".to_owned()
            } else if let Ok(rel) = c.path.strip_prefix(&standby) {
                format!("standby:{}", rel.display())
            } else {
                match c.path.strip_prefix(root) {
                    Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
                    Ok(rel) => rel.display().to_string(),
                    Err(_) => c.path.display().to_string(),
                }
            };
            format!("{} {path}", c.name)
        })
        .collect();
    all.sort();
    all
}

/// The agent's setting that syncs every set of up to `SYNCFS_ABOVE`
/// members one by one, whatever the machine's dirty data: these tests
/// picture each call, which must not depend on what else the machine
/// writes meanwhile.
const ONE_BY_ONE: &str = "[switch]\nsyncfs_below_dirty_mib = 0\n";

/// The node's first state (`production`): a few modules' plugins and facts.
fn base(tree: &EnvTree, env: &str) {
    for (rel, body) in [
        ("lib/facter/a.rb", "# a\n"),
        ("lib/facter/b.rb", "# b\n"),
        ("lib/puppet/type/widget.rb", "# widget\n"),
        ("lib/puppet/type/gadget.rb", "# gadget\n"),
        ("facts.d/site.txt", "site=1\n"),
    ] {
        tree.file(env, "m", rel, body, 0o644);
    }
}

/// A master serving `production` and the other states of `tree`, and an
/// agent synced to `production` through `warm` first: the standby beside
/// the libdir then holds the last of them, as on a node that changes
/// between states (docs/internals.md#the-switch).
fn synced_node(tree: &EnvTree, pki: &Pki, warm: &[&str], extra: &str) -> (TestMaster, AgentHome) {
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")));
    let home = AgentHome::new(pki, &[master.url()], extra);
    for env in warm.iter().chain(&["production"]) {
        let run = home.sync(&["--environment", env, "--allow-mass-removal"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    (master, home)
}

/// A node synced to `production`, and `changed`: three files change,
/// one updated in place, one created in a new directory, one removed.
/// The tree and the certificates are returned to be kept: their
/// directories go when they are dropped.
fn changed_node(extra: &str) -> (EnvTree, Pki, TestMaster, AgentHome) {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    base(&tree, "production");
    base(&tree, "changed");
    tree.file("changed", "m", "lib/facter/a.rb", "# a, changed\n", 0o644);
    tree.file("changed", "m", "lib/newdir/c.rb", "# c\n", 0o644);
    let gadget = tree
        .module("changed", "m")
        .join("lib/puppet/type/gadget.rb");
    std::fs::remove_file(gadget).unwrap();
    let (master, home) = synced_node(&tree, &pki, &["production", "changed"], extra);
    (tree, pki, master, home)
}

#[test]
fn a_run_that_changes_nothing_makes_no_sync_call() {
    let Some(strace) = require("strace", "strace", "agent_durable") else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    base(&tree, "production");
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    // With the metrics textfile: every file a run writes is written.
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        &format!("[metrics]\ntextfile = \"node.prom\"\n{ONE_BY_ONE}"),
    );

    // The first run changes the node: it syncs (the trace sees the calls).
    let (run, first) = traced_sync(&strace, &home, "production");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!first.is_empty(), "the first sync made no sync call");
    assert!(first.iter().all(|c| c.name != "syncfs"), "{first:?}");

    // The same environment again, from the cache (304s) and with a fresh
    // listing (no cache): nothing to change, nothing synced.
    let (run, again) = traced_sync(&strace, &home, "production");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(again, vec![], "a no-op run synced");
    std::fs::remove_dir_all(home.vardir().join("cache")).unwrap();
    let (run, uncached) = traced_sync(&strace, &home, "production");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(uncached, vec![], "a no-op run without its cache synced");
    assert!(home.path().join("node.prom").is_file());
    assert!(home.vardir().join("last_run_report.json").is_file());
}

#[test]
fn a_small_change_syncs_exactly_what_it_touched() {
    let Some(strace) = require("strace", "strace", "agent_durable") else {
        return;
    };
    let (_tree, _pki, _master, home) = changed_node(ONE_BY_ONE);

    let (run, calls) = traced_sync(&strace, &home, "changed");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(home.libdir().join("newdir/c.rb")).unwrap(),
        "# c\n"
    );
    // In the standby (`next`, the generation before, equal to the live
    // tree but for what changed): both staged files (content and mode),
    // renamed into it and synced with it before the exchange; the
    // directory each was renamed into, the directory made and its parent,
    // the directory purged from; the staging directory renamed out of;
    // the container, when the standby is taken (it is no generation from
    // then on) and after the exchange, and the libdir's parent (the
    // exchange): each once, and nothing else — no syncfs, no file copied
    // whole, nothing in the vardir (the report is not synced).
    assert_eq!(
        picture(&calls, &home.libdir()),
        [
            "fsync .pluginsync-staging",
            "fsync <parent>",
            "fsync standby:",
            "fsync standby:",
            "fsync standby:next",
            "fsync standby:next/facter",
            "fsync standby:next/facter/a.rb",
            "fsync standby:next/newdir",
            "fsync standby:next/newdir/c.rb",
            "fsync standby:next/puppet/type",
        ],
        "{calls:#?}"
    );
    // Synced before the exchange: under their names in the standby, so
    // the files of the live tree now.
    let staging = home.libdir().join(".pluginsync-staging");
    let staged: BTreeSet<_> = calls
        .iter()
        .filter(|c| c.path.parent() == Some(staging.as_path()))
        .collect();
    assert!(
        staged.is_empty(),
        "a staged file synced by itself: {calls:#?}"
    );
}

#[test]
fn a_change_above_the_threshold_syncs_its_filesystem_once() {
    let Some(strace) = require("strace", "strace", "agent_durable") else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    base(&tree, "production");
    base(&tree, "big");
    for i in 0..=SYNCFS_ABOVE {
        tree.file(
            "big",
            "m",
            &format!("lib/many/f{i}.rb"),
            format!("# {i}\n"),
            if i % 2 == 0 { 0o755 } else { 0o644 },
        );
    }
    let (_master, home) = synced_node(&tree, &pki, &["production", "big"], ONE_BY_ONE);

    let (run, calls) = traced_sync(&strace, &home, "big");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        std::fs::read_dir(home.libdir().join("many"))
            .unwrap()
            .count(),
        SYNCFS_ABOVE + 1
    );
    // Their modes were set by name in the staging directory (no descriptor
    // per file on this path): still each file's own.
    for i in 0..=SYNCFS_ABOVE {
        use std::os::unix::fs::PermissionsExt;
        let path = home.libdir().join(format!("many/f{i}.rb"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        let want = if i % 2 == 0 { 0o755 } else { 0o644 };
        assert_eq!(mode, want, "{}", path.display());
    }
    // One syncfs for the staged files and the directories the commit
    // changed in the standby (on the libdir's filesystem, through the
    // staging directory: no staged file is opened for it), none of them
    // synced by itself; then the container, when the standby is taken and
    // after the exchange, and the libdir's parent for the switch.
    assert_eq!(
        picture(&calls, &home.libdir()),
        [
            "fsync <parent>",
            "fsync standby:",
            "fsync standby:",
            "syncfs .pluginsync-staging",
        ],
        "{calls:#?}"
    );
}

#[test]
fn a_small_change_on_a_quiet_machine_syncs_its_filesystem_once() {
    let Some(strace) = require("strace", "strace", "agent_durable") else {
        return;
    };
    // Any dirty data counts as quiet: the standby's files and directories
    // go to the disk with one syncfs of their filesystem.
    let (_tree, _pki, _master, home) = changed_node("[switch]\nsyncfs_below_dirty_mib = 1048576\n");

    let (run, calls) = traced_sync(&strace, &home, "changed");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(home.libdir().join("newdir/c.rb")).unwrap(),
        "# c\n"
    );
    let picture = picture(&calls, &home.libdir());
    assert!(
        picture.iter().any(|c| c.starts_with("syncfs ")),
        "{picture:#?}"
    );
    // Nothing of the standby's tree, and no staged file, synced by itself:
    // only a set of one member still gets its own fsync (the container
    // when the standby is taken, say).
    assert!(
        picture
            .iter()
            .all(|c| c.starts_with("syncfs ") || c == "fsync <parent>" || c == "fsync standby:"),
        "{picture:#?}"
    );
}

#[test]
fn strace_lines_are_read_with_their_paths() {
    let trace = "\
101   fsync(7</var/lib/x/lib/facter>) = 0
102   syncfs(9</var/lib/x/lib/.pluginsync-staging/b0.3>) = 0
103   fsync(5</a b/c> <unfinished ...>
104   openat(AT_FDCWD</>, \"x\") = 3</x>
103   <... fsync resumed>)  = 0
";
    assert_eq!(
        calls(trace),
        [
            Call {
                name: "fsync".into(),
                path: "/var/lib/x/lib/facter".into()
            },
            Call {
                name: "syncfs".into(),
                path: "/var/lib/x/lib/.pluginsync-staging/b0.3".into()
            },
            Call {
                name: "fsync".into(),
                path: "/a b/c".into()
            },
        ]
    );
}
