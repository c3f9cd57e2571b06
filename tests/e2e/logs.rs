//! Log lines an operator can use under systemd (`common/src/logging.rs`,
//! docs/operating.md#logs): when stderr is the journal's stream (`JOURNAL_STREAM`
//! names its device and inode), every line the master writes starts with
//! its syslog priority and carries no timestamp of its own, so `journalctl
//! -p err` shows a failure's cause; on any other stderr nothing changes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pluginsync_tests::{EnvTree, Pki, bin_path, config_toml};

/// Runs the master with `args`, stderr to `log` and `JOURNAL_STREAM` set to
/// `stream`; returns the child.
fn master(args: &[&str], log: &Path, stream: &str) -> std::process::Child {
    Command::new(bin_path("pluginsync-master"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("JOURNAL_STREAM", stream)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn the master")
}

/// Waits (at most 10 s) for the master's "listening" line in `log`, stops
/// it with SIGTERM (through rustix: a minimal root has no `kill` binary)
/// and returns what it logged.
fn stop_once_listening(child: &mut std::process::Child, log: &Path) -> String {
    let mut text = String::new();
    for _ in 0..200 {
        text = std::fs::read_to_string(log).unwrap();
        if text.contains("listening") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let _ = child.wait();
    text
}

/// `<device>:<inode>` of `path`, as systemd writes `JOURNAL_STREAM`.
fn stream_of(path: &Path) -> String {
    let m = std::fs::metadata(path).expect("stat");
    format!("{}:{}", m.dev(), m.ino())
}

#[test]
fn under_the_journal_every_line_carries_its_priority() {
    let dir = tempfile::tempdir().unwrap();

    // A config error: the final line is an error, priority 3.
    let log = dir.path().join("bad.log");
    std::fs::File::create(&log).unwrap();
    let missing = dir.path().join("missing.toml");
    let status = master(
        &["serve", "--config", missing.to_str().unwrap()],
        &log,
        &stream_of(&log),
    )
    .wait()
    .unwrap();
    assert_eq!(status.code(), Some(78));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("<3>error: cannot read config"), "{text:?}");
    assert_eq!(
        text.matches("os error 2").count(),
        1,
        "the cause once: {text:?}"
    );

    // A serving master: info lines are priority 6, none has a timestamp.
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/a.rb", b"a\n", 0o644);
    let config = dir.path().join("master.toml");
    std::fs::write(&config, config_toml(&tree.envpath(), &pki, "", "")).unwrap();
    let log = dir.path().join("serve.log");
    std::fs::File::create(&log).unwrap();
    let mut child = master(
        &["serve", "--config", config.to_str().unwrap()],
        &log,
        &stream_of(&log),
    );
    let text = stop_once_listening(&mut child, &log);
    assert!(
        text.contains("listening"),
        "the master logged its start: {text:?}"
    );
    for line in text.lines() {
        let priority = line.strip_prefix('<').and_then(|l| l.get(..2));
        assert!(
            matches!(priority, Some("3>" | "4>" | "6>" | "7>")),
            "every line starts with a priority: {line:?}"
        );
        assert!(
            !line[3..].starts_with("20"),
            "journald adds the time; the line does not: {line:?}"
        );
    }
    assert!(text.contains("<6>"), "{text:?}");
}

#[test]
fn on_any_other_stderr_lines_are_unprefixed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bad.log");
    let other = dir.path().join("other");
    std::fs::File::create(&other).unwrap();
    std::fs::File::create(&log).unwrap();
    // JOURNAL_STREAM inherited from a unit, but stderr was redirected.
    let missing = dir.path().join("missing.toml");
    master(
        &["serve", "--config", missing.to_str().unwrap()],
        &log,
        &stream_of(&other),
    )
    .wait()
    .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("error: cannot read config"), "{text:?}");
}

/// `[log] access = "text"`: one line per request with the client's
/// certname (or `-`), the environment, the endpoint and the status; `json`
/// gives the same fields as objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_line_per_request() {
    use pluginsync_tests::{ChildMaster, client};
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/a.rb", b"a\n", 0o644);
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("master.toml");
        let table = format!("[log]\naccess = \"{format}\"\n");
        std::fs::write(&cfg, config_toml(&tree.envpath(), &pki, "", &table)).unwrap();
        let master = ChildMaster::spawn(&cfg, None);
        let listing = format!(
            "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
            master.url()
        );
        let node = client(&pki, Some("node1"));
        for _ in 0..3 {
            let r = node.get(&listing).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
        let r = client(&pki, None).get(&listing).send().await.unwrap();
        assert_eq!(r.status(), 403);
        r.bytes().await.unwrap();
        let mut lines = Vec::new();
        for _ in 0..100 {
            lines = master
                .log()
                .lines()
                .filter(|l| l.contains("GET /puppet/v3/file_metadatas") || l.starts_with('{'))
                .map(str::to_owned)
                .collect();
            if lines.len() >= 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(lines.len(), 4, "one line per request: {lines:#?}");
        // The refusal's own log line names the listener in words.
        let log = master.log();
        let refused = log
            .lines()
            .find(|l| l.contains("refused"))
            .unwrap_or_else(|| panic!("a refusal line: {log}"));
        assert!(
            refused.contains("via=tls") || refused.contains("\"via\":\"tls\""),
            "{refused}"
        );
        assert!(!refused.contains("Some("), "{refused}");
        for (i, line) in lines.iter().enumerate() {
            let (certname, status) = if i < 3 { ("node1", 200) } else { ("-", 403) };
            if format == "text" {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f[1].split(':').next(), Some("127.0.0.1"), "{line}");
                assert_eq!(
                    (f[2], f[3], f[4], f[5]),
                    (
                        certname,
                        "production",
                        "file_metadatas",
                        &*status.to_string()
                    ),
                    "{line}"
                );
            } else {
                let v: serde_json::Value = serde_json::from_str(line).expect(line);
                // The field name of the JSON log lines (`--log-format
                // json`), so one parser reads both; `time` stays.
                let stamp = v["timestamp"].as_str().expect(line);
                assert!(
                    time::OffsetDateTime::parse(
                        stamp,
                        &time::format_description::well_known::Rfc3339
                    )
                    .is_ok(),
                    "{line}"
                );
                assert_eq!(v["time"].as_str(), Some(stamp), "{line}");
                let certname = (certname != "-").then_some(certname);
                assert_eq!(v["certname"].as_str(), certname, "{line}");
                assert_eq!(v["status"], status, "{line}");
                assert_eq!(v["environment"], "production", "{line}");
            }
        }
    }
}

/// `--log-format json`: every line the master logs is one JSON object with
/// its level and message.
#[test]
fn json_log_lines_are_json() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/a.rb", b"a\n", 0o644);
    let config = dir.path().join("master.toml");
    std::fs::write(&config, config_toml(&tree.envpath(), &pki, "", "")).unwrap();
    let log = dir.path().join("serve.log");
    std::fs::File::create(&log).unwrap();
    let mut child = master(
        &[
            "--log-format",
            "json",
            "serve",
            "--config",
            config.to_str().unwrap(),
        ],
        &log,
        "0:0",
    );
    let text = stop_once_listening(&mut child, &log);
    assert!(text.contains("listening"), "{text}");
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{line}"
        );
    }
}

/// Runs `bin` with `args` until it exits (the master: until it listens,
/// then SIGTERM); returns its stderr.
fn stderr_of(bin: &str, args: &[&str], dir: &Path) -> String {
    let log = dir.join(format!("{bin}.log"));
    let mut child = Command::new(bin_path(bin))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn");
    if bin == "pluginsync-master" {
        stop_once_listening(&mut child, &log);
    } else {
        let _ = child.wait();
    }
    // Everything, up to the exit (the master logs on until it stops).
    std::fs::read_to_string(&log).unwrap()
}

/// The levels of each line of `text` (text format: the word after the
/// timestamp).
fn levels(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|w| ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(w))
        .map(str::to_owned)
        .collect()
}

/// `-v` is info, `-vv` debug and `-vvv` trace in both binaries
/// (docs/operating.md#logs); before, `-v` was debug in the master and the
/// agent had no trace.
#[test]
fn each_v_means_the_same_level_in_both_binaries() {
    use pluginsync_tests::{AgentHome, TestMaster, parse_config};
    let dir = tempfile::tempdir().unwrap();
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/a.rb", b"a\n", 0o644);
    let config = dir.path().join("master.toml");
    std::fs::write(&config, config_toml(&tree.envpath(), &pki, "", "")).unwrap();
    let config = config.to_str().unwrap();
    let master = |v: &str| {
        let args: Vec<&str> = [v, "serve", "--config", config]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        levels(&stderr_of("pluginsync-master", &args, dir.path()))
    };
    let at_v = master("-v");
    assert!(
        at_v.contains("INFO") && !at_v.contains("DEBUG"),
        "master -v: {at_v:?}"
    );
    let at_vv = master("-vv");
    assert!(
        at_vv.contains("DEBUG") && !at_vv.contains("TRACE"),
        "master -vv: {at_vv:?}"
    );

    let m = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let agent = |v: &str| {
        // A fresh home each time, so every run commits (trace lines).
        let home = AgentHome::new(&pki, &[m.url()], "");
        let run = home.sync(&[v]);
        assert_eq!(run.code, 0, "{run:?}");
        levels(&run.stderr)
    };
    let at_v = agent("-v");
    assert!(
        at_v.contains("INFO") && !at_v.contains("DEBUG"),
        "agent -v: {at_v:?}"
    );
    let at_vv = agent("-vv");
    assert!(
        at_vv.contains("DEBUG") && !at_vv.contains("TRACE"),
        "agent -vv: {at_vv:?}"
    );
    let at_vvv = agent("-vvv");
    assert!(at_vvv.contains("TRACE"), "agent -vvv: {at_vvv:?}");
}
