//! The agent's textfile metrics and its last-run report as a monitoring
//! check (`agent/src/metrics.rs`, docs/operating.md#agent-metrics): after a good
//! and after a failed run the textfile is valid for Debian's `promtool`,
//! the failed run keeps the last success time, `pluginsync-agent report`
//! says FAILED and exits 1 after the failed run, and the failed run's
//! error line carries the err priority under the journal; a run skipped
//! for another one leaves the textfile alone. The textfile
//! path the shipped agent.toml shows is one the packaged unit may write.

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, config_toml, parse_config, promtool_accepts, repo_root,
};

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_textfile_follows_good_and_failed_runs() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/a.rb", b"a = 1\n", 0o644);
    tree.file("production", "m", "lib/facter/b.rb", b"b = 2\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        "[metrics]\ntextfile = \"node.prom\"\n",
    );
    let textfile = home.path().join("node.prom");

    let good = home.sync(&[]);
    assert_eq!(good.code, 0, "{}", good.stderr);
    let text = std::fs::read_to_string(&textfile).expect("written after a good run");
    promtool_accepts(&text, "agent_metrics");
    assert_eq!(value(&text, "pluginsync_agent_last_run_success"), Some(1.0));
    assert_eq!(
        value(
            &text,
            "pluginsync_agent_last_run_changes{action=\"created\",mount=\"plugins\"}"
        ),
        Some(3.0),
        "the directory and its two files: {text}"
    );
    let success = value(&text, "pluginsync_agent_last_success_timestamp_seconds").unwrap();
    assert!(
        value(
            &text,
            "pluginsync_agent_client_certificate_expiry_timestamp_seconds"
        )
        .is_some()
    );
    let report = home.run(&["report"]);
    assert_eq!(report.code, 0, "{}", report.stdout);

    // A run skipped because another holds the lock (exit 75) leaves the
    // textfile to the running one: it is not rewritten as a failure.
    let lock = std::fs::File::open(home.vardir().join("agent.lock")).unwrap();
    lock.try_lock().unwrap();
    let busy = home.sync(&[]);
    assert_eq!(busy.code, 75, "{busy:?}");
    assert_eq!(std::fs::read_to_string(&textfile).unwrap(), text);
    drop(lock);

    // The master goes away: the run fails.
    drop(master);
    std::thread::sleep(std::time::Duration::from_secs(1));
    // Under the journal (stderr is the stream JOURNAL_STREAM names), the
    // failure's line carries the err priority.
    let log = home.path().join("stderr.log");
    let stream = std::fs::File::create(&log).unwrap();
    let m = stream.metadata().unwrap();
    let failed = Command::new(pluginsync_tests::bin_path("pluginsync-agent"))
        .args(["sync", "--config"])
        .arg(home.path().join("agent.toml"))
        .env_remove("RUST_LOG")
        .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stream)
        .status()
        .unwrap();
    assert_eq!(failed.code(), Some(1));
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.starts_with("<3>error: "), "{err:?}");

    let text = std::fs::read_to_string(&textfile).expect("written after a failed run");
    promtool_accepts(&text, "agent_metrics");
    assert_eq!(
        value(&text, "pluginsync_agent_last_run_success"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "pluginsync_agent_last_run_exit_code"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "pluginsync_agent_last_success_timestamp_seconds"),
        Some(success),
        "a failed run keeps the last success: {text}"
    );

    let report = home.run(&["report"]);
    assert_eq!(report.code, 1, "report exits 1 after a failed run");
    assert!(report.stdout.contains("FAILED"), "{}", report.stdout);
}

/// The directories `packaging/pluginsync-agent.service` lets the agent
/// write under `ProtectSystem=strict`: its `ReadWritePaths=` (a leading
/// `-` only makes a missing one skipped) and its `StateDirectory=` (under
/// `/var/lib`).
pub(crate) fn unit_writable_paths(unit: &str) -> Vec<std::path::PathBuf> {
    assert!(
        unit.lines().any(|l| l.trim() == "ProtectSystem=strict"),
        "{unit}"
    );
    let mut paths = Vec::new();
    for line in unit.lines().map(str::trim) {
        if let Some(list) = line.strip_prefix("ReadWritePaths=") {
            paths.extend(
                list.split_whitespace()
                    .map(|p| p.trim_start_matches('-').into()),
            );
        }
        if let Some(list) = line.strip_prefix("StateDirectory=") {
            paths.extend(
                list.split_whitespace()
                    .map(|d| std::path::Path::new("/var/lib").join(d)),
            );
        }
    }
    paths
}

/// The metrics textfile path etc/agent.toml shows (and the README
/// recommends) is written atomically through a temporary file beside it:
/// its directory must be writable under the packaged unit's sandbox, or
/// every timer run warns and the textfile never changes
/// (`packaging/test-install.sh` writes it under those settings).
#[test]
fn the_shipped_textfile_path_is_writable_under_the_agent_unit() {
    let conf = std::fs::read_to_string(repo_root().join("etc/agent.toml")).unwrap();
    let textfile = conf
        .lines()
        .find_map(|l| l.strip_prefix("# textfile = "))
        .expect("etc/agent.toml shows a [metrics] textfile");
    let textfile = std::path::PathBuf::from(textfile.trim_matches('"'));
    let dir = textfile.parent().unwrap();
    let unit =
        std::fs::read_to_string(repo_root().join("packaging/pluginsync-agent.service")).unwrap();
    let writable = unit_writable_paths(&unit);
    assert!(
        writable.iter().any(|w| dir.starts_with(w)),
        "{} is not under the unit's writable paths {writable:?}",
        dir.display()
    );
}
