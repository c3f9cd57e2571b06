//! The index follows the disk (docs/protocol.md §3.5): a change is
//! served with its new checksum within 2 s, and only the changed file is
//! read again (asserted with the index's hash counter, not with timing).

use std::sync::atomic::Ordering;
use std::time::Duration;

use pluginsync_tests::{
    EnvTree, Pki, TestMaster, client, config_toml, parse_config, sha256_hex, wait_for,
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
