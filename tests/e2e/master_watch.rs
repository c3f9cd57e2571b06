//! The index follows the disk (docs/protocol.md §3.5): a change is
//! served with its new checksum within 2 s, and only the changed file is
//! read again (asserted with the index's hash counter, not with timing).

use std::sync::atomic::Ordering;
use std::time::Duration;

use pluginsync_tests::{
    ChildMaster, EnvTree, Pki, TestMaster, client, config_file, config_toml, parse_config,
    sha256_hex, wait_for,
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
