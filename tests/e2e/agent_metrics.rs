//! The agent's textfile metrics and its last-run report as a monitoring
//! check (`agent/src/metrics.rs`, docs/operating.md#agent-metrics): after a good
//! and after a failed run the textfile is valid for Debian's `promtool`,
//! the failed run keeps the last success time, `pluginsync-agent report`
//! says FAILED and exits 1 after the failed run, and the failed run's
//! error line carries the err priority under the journal.

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, config_toml, parse_config, promtool_accepts,
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
