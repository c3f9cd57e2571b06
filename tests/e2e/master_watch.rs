//! The index follows the disk (docs/protocol.md §3.5): a change is
//! served with its new checksum within 2 s, and only the changed file is
//! read again (asserted with the index's hash counter, not with timing).

use std::sync::atomic::Ordering;
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;

use pluginsync_tests::{
    ChildMaster, EnvTree, Pki, TestMaster, bin_path, client, config_file, config_toml, hand_over,
    parse_config, sha256_hex, unprivileged, wait_for,
};

use crate::common::{entry, listing};

const Q: &str = "recurse=true&links=follow&checksum_type=sha256&environment=production";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_served_within_two_seconds_without_rehashing_the_rest() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let files = tree.generate("production", 5, 20, 3);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let c = client(&pki, Some("node1"));
    let url = master.url();
    let hashed = &master.store.stats.files_hashed;
    assert!(hashed.load(Ordering::SeqCst) >= files.len() as u64);

    // Warm: the listing exists and the counter is stable.
    let (_, _, before) = listing(&c, &url, "plugins", Q).await;
    let target = &files[7];
    let rel_of = |file: &std::path::Path| {
        before
            .iter()
            .find(|e| {
                std::path::Path::new(&e.path).join(e.relative_path.as_deref().unwrap()) == file
            })
            .and_then(|e| e.relative_path.clone())
            .unwrap_or_else(|| panic!("{} not listed", file.display()))
    };
    let rel = rel_of(target);
    let count_before = hashed.load(Ordering::SeqCst);

    let new_content = b"# rewritten by the test\nFacter.add(:x) { setcode { 1 } }\n";
    std::fs::write(target, new_content).unwrap();
    let want = format!("{{sha256}}{}", sha256_hex(new_content));
    let seen = wait_for(Duration::from_secs(2), || {
        let (c, url, rel, want) = (c.clone(), url.clone(), rel.clone(), want.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", Q).await;
            (entry(&now, &rel)?.checksum.as_ref()?.value == want).then_some(())
        }
    })
    .await;
    assert!(
        seen.is_some(),
        "new checksum of {rel} not served within 2 s"
    );
    // Content matches the new listing too.
    let body = c
        .get(format!(
            "{url}/puppet/v3/file_content/plugins/{rel}?environment=production"
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&body[..], new_content);
    assert_eq!(
        hashed.load(Ordering::SeqCst) - count_before,
        1,
        "exactly the changed file was hashed again"
    );

    // Added and removed files show up too.
    tree.file(
        "production",
        "mod01",
        "lib/facter/added.rb",
        "added\n",
        0o644,
    );
    std::fs::remove_file(&files[0]).unwrap();
    let removed_rel = rel_of(&files[0]);
    let seen = wait_for(Duration::from_secs(2), || {
        let (c, url, removed_rel) = (c.clone(), url.clone(), removed_rel.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", Q).await;
            (entry(&now, "facter/added.rb").is_some() && entry(&now, &removed_rel).is_none())
                .then_some(())
        }
    })
    .await;
    assert!(
        seen.is_some(),
        "added/removed files not reflected within 2 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environments_created_and_removed_after_start() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "a", "lib/a.rb", "a\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let c = client(&pki, Some("node1"));
    let url = master.url();
    let q = "recurse=true&environment=feature_x";
    assert_eq!(listing(&c, &url, "plugins", q).await.0, 404);
    tree.file("feature_x", "a", "lib/b.rb", "b\n", 0o644);
    // Served at once on request, even before the watcher catches up.
    let (s, _, entries) = listing(&c, &url, "plugins", q).await;
    assert_eq!(s, 200);
    assert!(entry(&entries, "b.rb").is_some());
    std::fs::remove_dir_all(tree.envpath().join("feature_x")).unwrap();
    let gone = wait_for(Duration::from_secs(2), || {
        let (c, url) = (c.clone(), url.clone());
        async move { (listing(&c, &url, "plugins", q).await.0 == 404).then_some(()) }
    })
    .await;
    assert!(gone.is_some(), "removed environment still served");
}

/// Files written while the master builds its first index (in the first
/// 100 ms after it listens, then nothing) are served after the usual
/// debounce. Before, the change the watcher saw during that build was
/// dropped (the environment was not indexed yet) while the build had
/// already read the directory, so such a file was missing until the next
/// rescan (`rescan_interval`, 10 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_during_the_first_build_are_served_without_a_rescan() {
    const DEBOUNCE: Duration = Duration::from_millis(50);
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 8, 1000, 11);
    let config = config_toml(
        &tree.envpath(),
        &pki,
        "",
        &format!("[index]\ndebounce = \"{}ms\"", DEBOUNCE.as_millis()),
    );
    let master = TestMaster::listening(parse_config(&config));
    let started = std::time::Instant::now();
    let mut written = Vec::new();
    for i in 0..5 {
        tree.file(
            "production",
            "mod00",
            &format!("lib/facter/late_{i}.rb"),
            "late\n",
            0o644,
        );
        written.push(format!("facter/late_{i}.rb"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The watcher's burst ends a debounce after the last write: the build
    // must outlast it for the test to show anything.
    tokio::time::sleep(DEBOUNCE * 4).await;
    let outlasted = !master.store.is_warmed();
    for _ in 0..3000 {
        if master.store.is_warmed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("first build done {:?} after listening", started.elapsed());
    assert!(
        outlasted,
        "the first build was over before the watcher acted: the test proves nothing"
    );
    let (c, url) = (client(&pki, Some("node1")), master.url());
    let missing = || {
        let (c, url, written) = (c.clone(), url.clone(), written.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", Q).await;
            written
                .into_iter()
                .filter(|rel| entry(&now, rel).is_none())
                .collect::<Vec<_>>()
        }
    };
    // The rebuild waits for the first build, then reads the tree again
    // (stat only) and serialises the listings anew: seconds on a busy
    // machine in a debug build; the rescan would be 10 min.
    let seen = wait_for(Duration::from_secs(20), || {
        let missing = missing();
        async move { missing.await.is_empty().then_some(()) }
    })
    .await;
    assert!(
        seen.is_some(),
        "files written during the first build are not served after 20 s: {:?}",
        missing().await
    );
}

/// An untouched tree is indexed exactly once per environment at startup:
/// one `index built` line each, counted in the real master's log. The
/// watch that covers the first build (docs/master.md#many-environments)
/// must not rebuild a tree nothing changed in (a second build of every
/// environment doubled the startup work and moved the master's memory
/// under `master_limits::clients_that_stop_reading_are_closed_and_their_memory_freed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untouched_tree_is_indexed_once_at_startup() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    for (i, env) in ["production", "staging", "dev"].into_iter().enumerate() {
        tree.generate(env, 8, 400, 40 + i as u64);
    }
    let (_dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\ndebounce = \"50ms\"",
    ));
    let master = ChildMaster::spawn(&cfg, None);
    let done = wait_for(Duration::from_secs(60), || {
        let log = master.log();
        async move { log.contains("background indexing done").then_some(()) }
    })
    .await;
    assert!(
        done.is_some(),
        "the warmer never finished:\n{}",
        master.log()
    );
    // Every burst the watcher could act on is long over by then (10 ×
    // debounce at most), and so is its initial setup on three small trees.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = master.log();
    for env in ["production", "staging", "dev"] {
        let builds = log
            .lines()
            .filter(|l| l.contains("index built") && l.contains(&format!("env={env} ")))
            .count();
        assert_eq!(builds, 1, "{env} built {builds} times:\n{log}");
    }
}

/// A module the master cannot read (`chmod 0700` by another user, as a
/// deploy under umask 077 leaves it; here mode 000, and the master run as
/// `nobody` when the tests run as root) is an error for its environment,
/// never a smaller tree (docs/master.md#unreadable-files): the previous
/// index stays served (agents would remove the module's plugins
/// otherwise), the error is logged naming the path, counted in
/// `/metrics`, and `check` fails naming it; an environment whose first
/// build cannot read its tree answers 503, not a listing without the
/// module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_module_keeps_the_previous_index_and_fails_check() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let stdlib = ["puppet/functions/stdlib/a.rb", "facter/b.rb"];
    for rel in stdlib {
        tree.file("production", "stdlib", &format!("lib/{rel}"), "s\n", 0o644);
    }
    tree.file("production", "other", "lib/facter/c.rb", "c\n", 0o644);
    tree.file("staging", "secret", "lib/facter/d.rb", "d\n", 0o644);
    tree.file("staging", "open", "lib/facter/e.rb", "e\n", 0o644);
    let (dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\ndebounce = \"50ms\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    ));
    let envpath = tree.envpath();
    let ssldir_parent = pki.ssldir.parent().expect("pki dir").to_owned();
    hand_over(&[
        envpath.parent().expect("tree dir"),
        &ssldir_parent,
        dir.path(),
    ]);
    let unreadable = |module: &std::path::Path, mode: u32| {
        std::fs::set_permissions(module, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    let (stdlib_dir, secret_dir) = (
        tree.module("production", "stdlib"),
        tree.module("staging", "secret"),
    );
    unreadable(&secret_dir, 0o000);
    let master = ChildMaster::spawn_unprivileged(&cfg);
    let (c, url) = (client(&pki, Some("node1")), master.url());
    let q = Q;
    let served = |env: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let q = q.replace("production", env);
            let (status, _, entries) = listing(&c, &url, "plugins", &q).await;
            (status, crate::common::paths(&entries))
        }
    };
    let (status, before) = served("production").await;
    assert_eq!(status, 200);
    for rel in stdlib {
        assert!(before.iter().any(|p| p == rel), "{rel} in {before:?}");
    }

    // The module turns unreadable: the watcher sees it (its mode changed)
    // and rebuilds; the rebuild cannot read it.
    unreadable(&stdlib_dir, 0o000);
    let metrics = format!("http://{}/metrics", master.metrics_addr());
    let counted = "pluginsync_master_index_errors_total{environment=\"production\"}";
    let rebuilt = wait_for(Duration::from_secs(20), || {
        let (metrics, log) = (metrics.clone(), master.log());
        async move {
            let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
            let builds = log.matches("index built env=production ").count();
            (text.contains(counted) || builds > 1).then_some(text)
        }
    })
    .await;
    let (_, after) = served("production").await;
    unreadable(&stdlib_dir, 0o755);
    unreadable(&secret_dir, 0o755);
    let log = master.log();
    assert_eq!(
        after, before,
        "a permission error must not shrink the served tree:\n{log}"
    );
    let text = rebuilt.unwrap_or_else(|| panic!("no rebuild and no error counted:\n{log}"));
    assert!(text.contains(&format!("{counted} 1")), "{text}");
    let lib = stdlib_dir.join("lib");
    let error_line = log
        .lines()
        .find(|l| l.contains("cannot read a served path") && l.contains("env=production"));
    let error_line = error_line.unwrap_or_else(|| panic!("no error line:\n{log}"));
    assert!(
        error_line.contains("ERROR") && error_line.contains(&lib.display().to_string()),
        "{error_line}"
    );
    assert!(log.contains("still serving its previous index"), "{log}");

    // An environment whose first build could not read its tree serves
    // nothing (503, Retry-After), not a listing without the module.
    assert!(log.contains("not served until it can be"), "{log}");
    unreadable(&secret_dir, 0o000);
    let (status, entries) = served("staging").await;
    assert_eq!(status, 503, "{entries:?}");

    // `check` fails and names the path.
    let mut check = unprivileged(&bin_path("pluginsync-master"));
    check.args(["check", "--config"]).arg(&cfg);
    let out = check.output().expect("run check");
    unreadable(&secret_dir, 0o755);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(78), "{stdout}{stderr}");
    let secret_lib = secret_dir.join("lib").display().to_string();
    assert!(
        stdout.contains(&format!("error: cannot read {secret_lib}"))
            && stderr.contains(&secret_lib),
        "check names the path:\n{stdout}{stderr}"
    );
}

/// With `index.watch = false` the periodic rescan still picks changes up
/// (docs/troubleshooting.md#very-large-trees recommends exactly that for
/// trees too large to watch): a file written after startup is served after
/// the next `rescan_interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_watch_the_rescan_still_picks_changes_up() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "a", "lib/facter/a.rb", "a\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\nwatch = false\nrescan_interval = \"1s\"",
    )));
    let (c, url) = (client(&pki, Some("node1")), master.url());
    assert!(entry(&listing(&c, &url, "plugins", Q).await.2, "facter/a.rb").is_some());
    tree.file("production", "a", "lib/facter/b.rb", "b\n", 0o644);
    let seen = wait_for(Duration::from_secs(10), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", Q).await;
            entry(&now, "facter/b.rb").map(|_| ())
        }
    })
    .await;
    assert!(
        seen.is_some(),
        "not served 10 s after a 1 s rescan_interval"
    );
}
