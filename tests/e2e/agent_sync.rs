//! The agent against a real master over TLS (docs/agent.md#what-a-run-does):
//! mirroring with modes, silence when in sync, exact change reports, purge
//! with ignores, no change at all on any error, cut downloads, hostile
//! listings, noop, the run lock and failover. Every run is the real
//! `pluginsync-agent` binary.

use pluginsync_common::protocol;
use std::sync::Arc;
use std::time::Duration;

use pluginsync_tests::{
    AgentHome, EnvTree, FakeMaster, Pki, TestMaster, client, closed_port, config_toml,
    http_response, merged_mount, parse_config, sha256_hex, tree_snapshot, wait_for,
};

fn tree() -> EnvTree {
    let t = EnvTree::new();
    t.generate("production", 5, 12, 11);
    t.file(
        "production",
        "alpha",
        "lib/facter/common.rb",
        "# alpha wins\n",
        0o644,
    );
    t.file(
        "production",
        "beta",
        "lib/facter/common.rb",
        "# beta is hidden\n",
        0o644,
    );
    t.file(
        "production",
        "alpha",
        "lib/bin/pluginsync-plugin-hello",
        "#!/bin/sh\necho hello\n",
        0o755,
    );
    t.dir("production", "alpha", "lib/private", 0o750);
    t.file(
        "production",
        "alpha",
        "lib/private/key.rb",
        "# secret\n",
        0o600,
    );
    t.dir("production", "alpha", "facts.d", 0o755);
    t.file(
        "production",
        "alpha",
        "facts.d/exec_fact.sh",
        "#!/bin/sh\necho alpha=1\n",
        0o755,
    );
    t.file(
        "production",
        "alpha",
        "facts.d/static.yaml",
        "a: 1\n",
        0o640,
    );
    t.file(
        "production",
        "beta",
        "facts.d/exec_fact.sh",
        "#!/bin/sh\necho hidden=1\n",
        0o700,
    );
    t
}

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

/// Both destinations and the vardir, for byte-identical comparisons.
fn snapshot(home: &AgentHome) -> Vec<std::collections::BTreeMap<String, String>> {
    vec![
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
        tree_snapshot(&home.path().join("outside")),
    ]
}

/// Waits until the master lists (or no longer lists) `rel` in plugins.
async fn master_lists(master: &TestMaster, pki: &Pki, rel: &str, present: bool) {
    let c = client(pki, Some("node1"));
    let url = format!(
        "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
        master.url()
    );
    let needle = format!("\"relative_path\":\"{rel}\"");
    let ok = wait_for(Duration::from_secs(5), || {
        let (c, url, needle) = (c.clone(), url.clone(), needle.clone());
        async move {
            (c.get(url)
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?
                .contains(&needle)
                == present)
                .then_some(())
        }
    })
    .await;
    assert!(ok.is_some(), "master did not catch up with {rel}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_mirrors_the_merged_mounts_and_a_second_run_is_silent() {
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let env_dir = tree.envpath().join("production");

    let first = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(first.code, 2, "{first:?}");
    assert_eq!(first.stderr, "", "logs stay quiet at the default level");
    assert_eq!(
        tree_snapshot(&home.libdir()),
        merged_mount(&env_dir, "lib"),
        "libdir = merged plugins mount"
    );
    assert_eq!(
        tree_snapshot(&home.factsdir()),
        merged_mount(&env_dir, "facts.d"),
        "facts.d = merged pluginfacts mount"
    );
    assert_eq!(
        std::fs::read_to_string(home.libdir().join("facter/common.rb")).unwrap(),
        "# alpha wins\n"
    );
    // Executables stay executable; private stays private.
    let mode = |p: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(
        mode(&home.libdir().join("bin/pluginsync-plugin-hello")),
        0o755
    );
    assert_eq!(mode(&home.libdir().join("private")), 0o750);
    assert_eq!(mode(&home.factsdir().join("exec_fact.sh")), 0o755);
    let lines: Vec<&str> = first.stdout.lines().collect();
    assert!(
        lines.contains(&"created  plugins/facter/common.rb"),
        "{}",
        first.stdout
    );
    assert!(lines.contains(&"created  pluginfacts/exec_fact.sh"));
    assert!(lines.last().unwrap().starts_with("pluginsync: "));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["server"], master.url());
    assert_eq!(report["changes"].as_array().unwrap().len(), lines.len() - 1);

    // Second run: nothing printed, exit 0.
    let second = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(
        (second.code, second.stdout.as_str(), second.stderr.as_str()),
        (0, "", "")
    );
    assert_eq!(home.sync(&[]).code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_changed_files_are_reported() {
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);

    tree.file(
        "production",
        "alpha",
        "lib/facter/common.rb",
        "# alpha changed\n",
        0o644,
    );
    tree.file(
        "production",
        "gamma",
        "lib/facter/added.rb",
        "# added\n",
        0o644,
    );
    std::fs::remove_file(
        tree.module("production", "alpha")
            .join("lib/private/key.rb"),
    )
    .unwrap();
    std::fs::set_permissions(
        tree.module("production", "alpha")
            .join("facts.d/static.yaml"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    master_lists(&master, &pki, "facter/added.rb", true).await;
    master_lists(&master, &pki, "private/key.rb", false).await;
    let c = client(&pki, Some("node1"));
    let want = format!("{{sha256}}{}", sha256_hex(b"# alpha changed\n"));
    let url = format!(
        "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
        master.url()
    );
    assert!(
        wait_for(Duration::from_secs(5), || {
            let (c, url, want) = (c.clone(), url.clone(), want.clone());
            async move {
                c.get(url)
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?
                    .contains(&want)
                    .then_some(())
            }
        })
        .await
        .is_some()
    );

    let run = home.sync(&["--detailed-exitcodes", "--format", "json"]);
    assert_eq!(run.code, 2, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let mut changes: Vec<(String, String)> = report["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    changes.sort();
    assert_eq!(
        changes,
        vec![
            ("pluginfacts/static.yaml".into(), "mode".into()),
            ("plugins/facter/added.rb".into(), "created".into()),
            ("plugins/facter/common.rb".into(), "updated".into()),
            ("plugins/private/key.rb".into(), "removed".into()),
        ]
    );
    assert_eq!(report["failures"].as_array().unwrap().len(), 0);
    assert_eq!(report["environment"], "production");
    assert!(report["unchanged"].as_u64().unwrap() > 50);
    let env_dir = tree.envpath().join("production");
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env_dir, "lib"));
    assert_eq!(
        tree_snapshot(&home.factsdir()),
        merged_mount(&env_dir, "facts.d")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_junk_is_purged_and_ignored_names_are_kept() {
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    let lib = home.libdir();
    std::fs::create_dir_all(lib.join("junkdir/deeper")).unwrap();
    std::fs::write(lib.join("junkdir/deeper/x.rb"), "junk").unwrap();
    std::fs::write(lib.join("facter/stray.rb"), "stray").unwrap();
    std::fs::create_dir_all(lib.join(".git/objects")).unwrap();
    std::fs::write(lib.join(".git/HEAD"), "ref").unwrap();
    std::fs::write(lib.join("facter/CVS"), "cvs").unwrap();
    std::fs::write(home.factsdir().join("old_fact.txt"), "old=1").unwrap();

    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let mut lines: Vec<&str> = run.stdout.lines().collect();
    let summary = lines.pop().unwrap();
    assert!(
        summary.starts_with("pluginsync: 0 created, 0 updated, 3 removed"),
        "{summary}"
    );
    lines.sort();
    assert_eq!(
        lines,
        [
            "removed  pluginfacts/old_fact.txt",
            "removed  plugins/facter/stray.rb",
            "removed  plugins/junkdir"
        ]
    );
    assert!(!lib.join("junkdir").exists() && !lib.join("facter/stray.rb").exists());
    assert!(
        lib.join(".git/HEAD").exists() && lib.join("facter/CVS").exists(),
        "ignored names are kept"
    );
    assert!(!home.factsdir().join("old_fact.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_leaves_the_destinations_byte_identical_with_one_line() {
    let (tree, pki) = (tree(), Pki::new());
    // node1 may read production and unknown names (so those get their
    // honest 404), but not `restricted` (403).
    let rules =
        "[[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\", \"NOT*\"]\n";
    tree.file("restricted", "alpha", "lib/x.rb", "x\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    std::fs::write(
        home.libdir().join("local_junk.rb"),
        "would be purged by a bad run",
    )
    .unwrap();
    let before = snapshot(&home);

    let other_pki = Pki::new();
    let untrusted = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &other_pki,
        "",
        "",
    )));
    let fake = |body: &'static [u8]| {
        FakeMaster::start(
            &pki,
            Arc::new(move |_target: &str| http_response("200 OK", "application/json", body)),
        )
    };
    let truncated = fake(br#"[{"path":"/m/lib","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{"type":"ctime","value":"{ctime}x"},"type":"directory","destination":null},{"path":"/m/l"#);
    let not_json = fake(b"<html>proxy error</html>");
    let no_root = fake(br#"[{"path":"/m/lib","relative_path":"a.rb","links":"follow","owner":0,"group":0,"mode":420,"checksum":{"type":"sha256","value":"{sha256}0000000000000000000000000000000000000000000000000000000000000000"},"type":"file","destination":null}]"#);
    let empty = fake(b"[]");
    let server_error = FakeMaster::start(
        &pki,
        Arc::new(|_t: &str| http_response("500 Internal Server Error", "text/plain", b"boom")),
    );

    let port = master.addr.port();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--server".into(),
                format!("https://localhost:{}", closed_port()),
            ],
            "cannot reach",
        ),
        (vec!["--server".into(), untrusted.url()], "cannot reach"),
        (
            vec!["--environment".into(), "NOTANENVIRONMENT".into()],
            "error: environment 'NOTANENVIRONMENT' not found on https://localhost:",
        ),
        (vec!["--environment".into(), "restricted".into()], "403"),
        (vec!["--environment".into(), "bad-name".into()], "bad-name"),
        (
            vec!["--server".into(), truncated.url()],
            "malformed listing",
        ),
        (vec!["--server".into(), not_json.url()], "malformed listing"),
        (vec!["--server".into(), no_root.url()], "no \".\" entry"),
        (vec!["--server".into(), empty.url()], "no \".\" entry"),
        (vec!["--server".into(), server_error.url()], "500"),
    ];
    for (args, expect) in cases {
        let mut flags: Vec<&str> = args.iter().map(String::as_str).collect();
        flags.push("--detailed-exitcodes");
        let run = home.sync(&flags);
        // A name that cannot be an environment is a bad command line (64,
        // agent/src/exit.rs); everything else is a failed run (1).
        let want = if args.iter().any(|a| a == "bad-name") {
            64
        } else {
            1
        };
        assert_eq!(run.code, want, "{args:?}: {run:?}");
        assert_eq!(run.stdout, "", "{args:?}");
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: exactly one line on stderr: {:?}",
            run.stderr
        );
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(expect),
            "{args:?}: {}",
            lines[0]
        );
        assert_eq!(snapshot(&home), before, "{args:?} changed the destinations");
    }
    let nf = home.sync(&["--environment", "NOTANENVIRONMENT"]);
    assert_eq!(
        nf.stderr.trim(),
        format!("error: environment 'NOTANENVIRONMENT' not found on https://localhost:{port}")
    );
    // The failed run's report says why.
    let report = home.run(&["report", "--format", "json"]);
    let report: serde_json::Value = serde_json::from_str(report.stdout.trim()).unwrap();
    assert_eq!(report["applied"], false);
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("NOTANENVIRONMENT")
    );
}

/// A fake master with a valid listing of one file whose content is cut
/// after `cut` of its bytes.
fn cutting_master(pki: &Pki, content: &'static [u8], cut: usize) -> FakeMaster {
    let sum = sha256_hex(content);
    FakeMaster::start(
        pki,
        Arc::new(move |target: &str| {
            if target.contains("/file_metadatas/") {
                let body = format!(
                    r#"[{{"path":"/m/lib","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{{"type":"ctime","value":"{{ctime}}x"}},"type":"directory","destination":null}},{{"path":"/m/lib","relative_path":"big.rb","links":"follow","owner":0,"group":0,"mode":420,"checksum":{{"type":"sha256","value":"{{sha256}}{sum}"}},"type":"file","destination":null}}]"#
                );
                http_response("200 OK", "application/json", body.as_bytes())
            } else {
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    content.len()
                )
                .into_bytes();
                r.extend_from_slice(&content[..cut]);
                r
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_download_leaves_no_file_under_a_final_name() {
    let pki = Pki::new();
    static CONTENT: [u8; 200_000] = [b'z'; 200_000];
    let fake = cutting_master(&pki, &CONTENT, 50_000);
    let home = AgentHome::new(&pki, &[fake.url()], "");
    std::fs::create_dir_all(home.libdir()).unwrap();
    std::fs::write(
        home.libdir().join("old.rb"),
        "kept: a failed run purges nothing",
    )
    .unwrap();
    let before = tree_snapshot(&home.libdir());
    let run = home.sync(&[]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("big.rb") && run.stderr.contains("nothing was changed"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1);
    assert!(!home.libdir().join("big.rb").exists());
    assert_eq!(
        tree_snapshot(&home.libdir()),
        before,
        "no file under a final name, no staging left"
    );
    assert!(!home.libdir().join(".pluginsync-staging").exists());

    // A run killed mid-download leaves staged files; the next run (here
    // against a master that delivers) removes them.
    let staging = home.libdir().join(".pluginsync-staging");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("0"), "half a file").unwrap();
    let good = cutting_master(&pki, &CONTENT, CONTENT.len());
    let run = home.sync(&["--server", &good.url()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        std::fs::read(home.libdir().join("big.rb")).unwrap(),
        CONTENT
    );
    assert!(!staging.exists(), "stale staged files removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_listings_and_local_symlinks_never_reach_outside() {
    let pki = Pki::new();
    let home = AgentHome::new(&pki, &["https://localhost:1".into()], "");
    let outside = home.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), "do not touch").unwrap();
    let entry = |rel: &str| {
        format!(
            r#"{{"path":"/m/lib","relative_path":"{rel}","links":"follow","owner":0,"group":0,"mode":420,"checksum":{{"type":"sha256","value":"{{sha256}}{}"}},"type":"file","destination":null}}"#,
            sha256_hex(b"evil")
        )
    };
    let root = r#"{"path":"/m/lib","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{"type":"ctime","value":"{ctime}x"},"type":"directory","destination":null}"#;
    let abs_target = outside.join("abs_evil");
    for rel in [
        "../outside/evil".to_owned(),
        abs_target.display().to_string(),
        "a/../../outside/evil".to_owned(),
    ] {
        let body = format!("[{root},{}]", entry(&rel));
        let fake = FakeMaster::start(
            &pki,
            Arc::new(move |t: &str| {
                if t.contains("file_metadatas") {
                    http_response("200 OK", "application/json", body.as_bytes())
                } else {
                    http_response("200 OK", "application/octet-stream", b"evil")
                }
            }),
        );
        let run = home.sync(&["--server", &fake.url()]);
        assert_eq!(run.code, 1, "{rel}: {run:?}");
        assert!(run.stderr.contains("hostile path"), "{rel}: {}", run.stderr);
        assert!(
            !outside.join("evil").exists() && !abs_target.exists(),
            "{rel} wrote outside"
        );
    }

    // Local symlinks pointing outside: one where the master has a
    // directory (replaced by a real directory), one that is junk (the link
    // is removed, not what it points to).
    let (tree, pki2) = (EnvTree::new(), &pki);
    tree.file("production", "alpha", "lib/facter/x.rb", "x\n", 0o644);
    let master = start(&tree, pki2);
    std::fs::create_dir_all(home.libdir()).unwrap();
    std::os::unix::fs::symlink(&outside, home.libdir().join("facter")).unwrap();
    std::os::unix::fs::symlink(&outside, home.libdir().join("junk_link")).unwrap();
    let run = home.sync(&["--server", &master.url()]);
    assert_eq!(run.code, 0, "{run:?}");
    let facter = std::fs::symlink_metadata(home.libdir().join("facter")).unwrap();
    assert!(facter.is_dir() && !facter.file_type().is_symlink());
    assert_eq!(
        std::fs::read_to_string(home.libdir().join("facter/x.rb")).unwrap(),
        "x\n"
    );
    assert!(!home.libdir().join("junk_link").exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("precious")).unwrap(),
        "do not touch"
    );
    assert!(
        !outside.join("x.rb").exists(),
        "nothing written through the link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noop_lock_and_failover() {
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let down = format!("https://localhost:{}", closed_port());
    let home = AgentHome::new(&pki, &[down, master.url()], "");

    // --noop prints the plan and changes nothing at all.
    let noop = home.sync(&["--noop", "--detailed-exitcodes"]);
    assert_eq!(noop.code, 2, "{noop:?}");
    assert!(noop.stdout.contains("created  plugins/facter/common.rb"));
    assert!(
        noop.stdout
            .lines()
            .last()
            .unwrap()
            .contains("nothing was changed")
    );
    assert!(!home.libdir().exists() && !home.factsdir().exists() && !home.vardir().exists());

    // Failover: the first server is down, the second serves the run.
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(report["server"], master.url());
    assert_eq!(run.stderr, "");

    // The lock: a run while another holds it is skipped: it exits 75
    // (EX_TEMPFAIL, in the agent unit's SuccessExitStatus=, never 1, which
    // would mark the unit failed) with one warning line, changes nothing
    // and leaves the last report alone.
    std::fs::write(home.libdir().join("junk.rb"), "junk").unwrap();
    let report = std::fs::read(home.vardir().join("last_run_report.json")).unwrap();
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(home.vardir().join("agent.lock"))
        .unwrap();
    lock.try_lock().unwrap();
    std::fs::write(home.vardir().join("agent.lock"), "4242\n").unwrap();
    let busy = home.sync(&[]);
    assert_eq!(busy.code, 75);
    assert_eq!(
        busy.stderr.trim(),
        "warning: another sync is running (pid 4242): this run is skipped, nothing was changed"
    );
    assert!(home.libdir().join("junk.rb").exists());
    assert_eq!(
        std::fs::read(home.vardir().join("last_run_report.json")).unwrap(),
        report
    );
    // Released (as when the holder dies): the next run takes it.
    drop(lock);
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!home.libdir().join("junk.rb").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_op_run_is_two_304s_and_local_edits_are_still_caught() {
    use std::sync::atomic::Ordering::SeqCst;
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    // Puppet's listings (the no-op of a generation is one 304:
    // agent_generations.rs).
    let home = AgentHome::new(&pki, &[master.url()], "generations = false");
    let stats = &master.store.stats;
    assert_eq!(home.sync(&[]).code, 0);
    let contents = stats.contents_sent.load(SeqCst);
    assert!(
        contents > 60,
        "the first run downloaded through blobs or file_content"
    );
    let sent = stats.listings_sent.load(SeqCst);

    // In sync on both sides: one conditional listing per mount, both 304,
    // nothing else asked for.
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    assert_eq!(stats.listings_not_modified.load(SeqCst), 2);
    assert_eq!(stats.listings_sent.load(SeqCst), sent);
    assert_eq!(stats.contents_sent.load(SeqCst), contents);

    // The stat cache is a hint: a local edit that keeps the size and the
    // mtime still changes the ctime, so it is hashed, found wrong, repaired.
    let f = home.libdir().join("facter/common.rb");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::fs::write(&f, "# alpha_wins\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .starts_with("updated  plugins/facter/common.rb\n"),
        "{}",
        run.stdout
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "# alpha wins\n");
    assert_eq!(
        stats.listings_sent.load(SeqCst),
        sent,
        "the cached listing served the plan"
    );
    assert_eq!(stats.contents_sent.load(SeqCst), contents + 1);

    // A change on the master: a fresh listing (200), one download.
    tree.file("production", "alpha", "lib/facter/new.rb", "# new\n", 0o644);
    master_lists(&master, &pki, "facter/new.rb", true).await;
    let run = home.sync(&[]);
    assert_eq!(
        run.stdout.lines().next(),
        Some("created  plugins/facter/new.rb"),
        "{run:?}"
    );
    assert_eq!(stats.contents_sent.load(SeqCst), contents + 2);
    // The state recorded after those changes matches a fresh scan: the
    // next run is again two 304s and nothing else.
    let (nm, sent_now) = (
        stats.listings_not_modified.load(SeqCst),
        stats.listings_sent.load(SeqCst),
    );
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    assert_eq!(stats.listings_not_modified.load(SeqCst), nm + 2);
    assert_eq!(stats.listings_sent.load(SeqCst), sent_now);
    // Purges and mode fixes are recorded as precisely.
    std::fs::write(home.libdir().join("facter/stray.rb"), "stray").unwrap();
    std::fs::create_dir_all(home.libdir().join("junk/deep")).unwrap();
    let run = home.sync(&[]);
    assert!(run.stdout.contains("removed  plugins/junk"), "{run:?}");
    let nm = stats.listings_not_modified.load(SeqCst);
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    assert_eq!(stats.listings_not_modified.load(SeqCst), nm + 2);
    assert_eq!(stats.listings_sent.load(SeqCst), sent_now);
    // A lost cache only costs time.
    std::fs::remove_dir_all(home.vardir().join("cache")).unwrap();
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_batch_falls_back_to_single_downloads() {
    let pki = Pki::new();
    static A: &[u8] = b"first file\n";
    static B: [u8; 300_000] = [b'q'; 300_000];
    let (sa, sb) = (sha256_hex(A), sha256_hex(&B));
    let listing = format!(
        r#"[{{"path":"/m/lib","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{{"type":"ctime","value":"{{ctime}}x"}},"type":"directory","destination":null}},{{"path":"/m/lib","relative_path":"a.rb","links":"follow","owner":0,"group":0,"mode":420,"checksum":{{"type":"sha256","value":"{{sha256}}{sa}"}},"type":"file","destination":null}},{{"path":"/m/lib","relative_path":"b.bin","links":"follow","owner":0,"group":0,"mode":420,"checksum":{{"type":"sha256","value":"{{sha256}}{sb}"}},"type":"file","destination":null}}]"#
    );
    let batch_calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls = batch_calls.clone();
    let fake = FakeMaster::start(
        &pki,
        Arc::new(move |target: &str| {
            if target.contains("/file_metadatas/") {
                let mut r = http_response("200 OK", "application/json", listing.as_bytes());
                let head_end = r.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                r.splice(
                    head_end..head_end,
                    format!(
                        "\r\n{}: {}",
                        protocol::HEADER_BLOB_BATCH,
                        protocol::BATCH_PATH
                    )
                    .into_bytes(),
                );
                r
            } else if target.starts_with(&format!("{}?", protocol::BATCH_PATH)) {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Whatever was asked: a whole first frame for A if asked,
                // then B's frame cut after 1,000 of its bytes.
                let mut body = Vec::new();
                if target.contains(&sa) {
                    body.extend_from_slice(format!("{sa} {}\n", A.len()).as_bytes());
                    body.extend_from_slice(A);
                }
                body.extend_from_slice(format!("{sb} {}\n", B.len()).as_bytes());
                body.extend_from_slice(&B[..1000]);
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    protocol::BLOBS_MEDIA_TYPE,
                    body.len() + 10_000
                )
                .into_bytes();
                r.extend_from_slice(&body);
                r
            } else if target.contains("/file_content/") && target.contains("/b.bin?") {
                http_response("200 OK", "application/octet-stream", &B)
            } else {
                http_response(
                    "404 Not Found",
                    "application/json",
                    br#"{"message":"Not Found: nothing","issue_kind":"RESOURCE_NOT_FOUND"}"#,
                )
            }
        }),
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        batch_calls.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the batch endpoint was used"
    );
    assert_eq!(std::fs::read(home.libdir().join("a.rb")).unwrap(), A);
    assert_eq!(
        std::fs::read(home.libdir().join("b.bin")).unwrap(),
        B.to_vec(),
        "fetched singly after the cut"
    );
    assert!(!home.libdir().join(".pluginsync-staging").exists());
}

/// A reader that goes away (`pluginsync-agent sync | head -1`) does not
/// turn a good sync into a crash: the exit code still says what the sync
/// did, and the destinations are complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_leaves_the_exit_code_alone() {
    let (tree, pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let mut child = std::process::Command::new(pluginsync_tests::bin_path("pluginsync-agent"))
        .args(["sync", "--detailed-exitcodes", "--config"])
        .arg(home.path().join("agent.toml"))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the agent writes its report.
    drop(child.stdout.take());
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "agent hung");
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = err.join().unwrap();
    assert_eq!(status.code(), Some(2), "changes made: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let env_dir = tree.envpath().join("production");
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env_dir, "lib"));
}

/// Files downloaded in one batch with the same content are staged as
/// copies of one frame's file: two groups of equal files (here, three
/// markers with one content and three with another) must each keep their
/// own copies, so every file lands with its own content and none fails.
#[test]
fn two_groups_of_equal_files_in_one_batch_each_land_with_their_content() {
    let pki = Pki::new();
    let t = EnvTree::new();
    for m in ["a", "b", "c"] {
        t.file(
            "production",
            m,
            &format!("lib/{m}/one.rb"),
            "# one\n",
            0o644,
        );
        t.file(
            "production",
            m,
            &format!("lib/{m}/two.rb"),
            "# two\n",
            0o644,
        );
    }
    let master = start(&t, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        tree_snapshot(&home.libdir()),
        merged_mount(&t.envpath().join("production"), "lib")
    );
}

/// Above a few hundred files a batch's files get their modes as they are
/// written, each from the first path of its content: equal contents
/// whose paths want other modes (0755, 0600 beside 0644) must still land
/// with each path's own mode.
#[test]
fn a_big_first_sync_gives_every_path_its_own_mode_even_for_equal_contents() {
    let pki = Pki::new();
    let t = EnvTree::new();
    let modes = [0o644, 0o755, 0o600];
    for i in 0..300 {
        t.file(
            "production",
            "big",
            &format!("lib/puppet/type/t{i:03}.rb"),
            format!("# type {i}\n"),
            modes[i % 3],
        );
    }
    for (i, m) in ["a", "b", "c"].into_iter().enumerate() {
        t.file(
            "production",
            m,
            &format!("lib/{m}/same.rb"),
            "# same\n",
            modes[i],
        );
    }
    let master = start(&t, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let want = merged_mount(&t.envpath().join("production"), "lib");
    assert_eq!(tree_snapshot(&home.libdir()), want);
    assert!(
        want.values().filter(|v| v.contains("755")).count() >= 100,
        "the tree has the modes it should test: {want:?}"
    );
}
