//! Stock Puppet agents placed like ours (docs/rollouts.md#stock-puppet-agents):
//! with a policy whose first wave holds half the fleet and whose second
//! waits for an operator, the v3 answers to a certname outside the wave
//! (listings of every checksum type, one entry, the content) stay the old
//! generation's, byte for byte, after the tree changed in place; a
//! certname inside gets the new; both replicas answer alike, the fleet
//! records what each was served, a restarted replica answers from the
//! stored index, and one without it answers 503, never another
//! generation. Then stock
//! `puppet plugin download` nodes: those in the wave get the new plugin,
//! the others keep the old, through either replica (skipped with a
//! message when `puppet` is missing).

use std::path::Path;

use pluginsync_common::rollout::{in_share, position};
use pluginsync_tests::puppet::PuppetAgent;
use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, require};

use super::{Replica, newest_on_both, rollout, two_replicas};

/// Half the fleet at once, the rest on `rollout promote`: nothing moves
/// with time while the test looks.
const HALF: &str = "[[rollout]]\nenvironments = [\"production\"]\n\
    waves = [ { after = \"0s\", percent = 50 }, { promote = true, percent = 100 } ]\n";

/// The v3 requests a stock agent makes, and a few it could.
const TARGETS: [&str; 7] = [
    "file_metadatas/pluginfacts?recurse=true&links=follow&checksum_type=sha256&source_permissions=use&ignore=.svn&ignore=CVS&ignore=.git&ignore=.hg&environment=production",
    "file_metadatas/plugins?recurse=true&links=follow&checksum_type=sha256&source_permissions=ignore&ignore=.svn&ignore=CVS&ignore=.git&ignore=.hg&environment=production",
    "file_metadatas/plugins?recurse=true&links=manage&checksum_type=md5&environment=production",
    "file_metadatas/plugins?recurse=true&checksum_type=mtime&source_permissions=use&environment=production",
    "file_metadata/plugins/facter/app.rb?environment=production",
    "file_content/plugins/facter/app.rb?environment=production",
    "file_content/pluginfacts/app.txt?environment=production",
];

/// `n` certnames inside the first wave (50 %) and `n` outside it.
fn split(n: usize) -> (Vec<String>, Vec<String>) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for i in 0..1000 {
        let c = format!("stock{i:03}.example.org");
        let side = if in_share(position("production", &c), 50.0) {
            &mut inside
        } else {
            &mut outside
        };
        if side.len() < n {
            side.push(c);
        }
    }
    assert!(inside.len() == n && outside.len() == n);
    (inside, outside)
}

fn tree() -> EnvTree {
    let tree = EnvTree::new();
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    tree.file("production", "app", "facts.d/app.txt", "app=one\n", 0o644);
    tree.file(
        "production",
        "base",
        "lib/facter/base.rb",
        "# base\n",
        0o644,
    );
    tree.symlink("production", "base", "lib/facter/link.rb", "base.rb");
    tree
}

/// The new generation: a plugin and a fact changed in place (the old
/// bytes are gone from the tree), a plugin added.
fn change(tree: &EnvTree) {
    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    tree.file("production", "app", "facts.d/app.txt", "app=two\n", 0o644);
    tree.file("production", "app", "lib/facter/new.rb", "# new\n", 0o644);
}

/// Two replicas ([`HALF`]) on [`tree`] sharing the PostgreSQL database at
/// `url`, with certificates for `names`.
fn setup(names: &[String], url: &str) -> (EnvTree, Pki, tempfile::TempDir, Replica, Replica) {
    let (tree, pki, dir) = (
        tree(),
        Pki::with_agents(names),
        tempfile::tempdir().unwrap(),
    );
    let (a, b) = two_replicas(dir.path(), (&tree, &pki), url, "", HALF);
    (tree, pki, dir, a, b)
}

/// Every target's status and body for `certname` from `replica`, as a
/// stock agent asks (its `User-Agent`).
async fn answers(pki: &Pki, replica: &Replica, certname: &str) -> Vec<(u16, Vec<u8>)> {
    let c = client(pki, Some(certname));
    let mut out = Vec::new();
    for t in TARGETS {
        let r = c
            .get(format!("{}/puppet/v3/{t}", replica.url()))
            .header("User-Agent", "Puppet/7.23.0 Ruby/3.1.2-p20 (x86_64-linux)")
            .send()
            .await
            .expect("request");
        out.push((r.status().as_u16(), r.bytes().await.expect("body").to_vec()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3_client_outside_the_wave_keeps_the_old_generation_byte_for_byte() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::a_v3_client_outside") else {
        return;
    };
    let (inside, outside) = split(1);
    let names: Vec<String> = inside.iter().chain(&outside).cloned().collect();
    let (tree, pki, dir, a, b) = setup(&names, &pg.database());
    let (_ma, mut mb) = (
        MasterProcess::spawn(&a.config),
        MasterProcess::spawn(&b.config),
    );
    let first = newest_on_both(&a.config, &a, &b, 1).await;
    let old = answers(&pki, &a, &outside[0]).await;
    assert!(old.iter().all(|(s, _)| *s == 200), "{old:?}");
    assert_eq!(answers(&pki, &b, &outside[0]).await, old, "replicas alike");

    change(&tree);
    let second = newest_on_both(&a.config, &a, &b, 2).await;
    for r in [&a, &b] {
        let got = answers(&pki, r, &outside[0]).await;
        for ((t, want), got) in TARGETS.iter().zip(&old).zip(&got) {
            assert_eq!(
                (got.0, String::from_utf8_lossy(&got.1)),
                (want.0, String::from_utf8_lossy(&want.1)),
                "{t} for {} outside the wave, from {}",
                outside[0],
                r.url()
            );
        }
        let new = answers(&pki, r, &inside[0]).await;
        let listing = String::from_utf8_lossy(&new[1].1);
        assert!(listing.contains("facter/new.rb"), "inside: {listing}");
        assert_eq!(
            new[5],
            (200, b"# two\n".to_vec()),
            "inside: the new content"
        );
    }
    assert_eq!(
        answers(&pki, &a, &inside[0]).await,
        answers(&pki, &b, &inside[0]).await,
        "replicas alike inside the wave"
    );
    // The fleet records what each stock node was served (written behind
    // the requests, within 200 ms: read until both are there, bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (fleet, on) = loop {
        let fleet = client(&pki, Some("localhost"))
            .get(format!("{}/pluginsync/v1/inventory", a.url()))
            .send()
            .await
            .expect("inventory");
        let fleet: serde_json::Value = fleet.json().await.expect("JSON");
        let on = |c: &str| {
            let nodes = fleet["nodes"].as_array().expect("nodes");
            let node = nodes.iter().find(|n| n["certname"] == c);
            node.map(|n| n["generation"].clone())
        };
        let both = [on(&outside[0]), on(&inside[0])];
        if both.iter().all(Option::is_some) || std::time::Instant::now() > deadline {
            break (fleet, both);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(on[0], Some(first.as_str().into()), "{fleet}");
    assert_eq!(on[1], Some(second.as_str().into()), "{fleet}");
    // The old generation's index is on disk beside it: a restarted replica
    // answers from it too (the old bytes are in no tree any more).
    let stored = dir.path().join("store-b/indexes/production");
    assert_eq!(std::fs::read_dir(&stored).unwrap().count(), 2, "one each");
    drop(mb);
    mb = MasterProcess::spawn(&b.config);
    assert_eq!(answers(&pki, &b, &outside[0]).await, old, "after a restart");
    // Without the old generation's index (a store from before indexes were
    // kept), a replica never answers that node from another generation.
    drop(mb);
    std::fs::remove_file(stored.join(&first)).unwrap();
    mb = MasterProcess::spawn(&b.config);
    let refused = answers(&pki, &b, &outside[0]).await;
    for (t, (status, body)) in TARGETS.iter().zip(&refused) {
        let body = String::from_utf8_lossy(body);
        assert_eq!(*status, 503, "{t}: {body}");
        assert!(body.contains("cannot serve generation"), "{t}: {body}");
    }
    assert_eq!(
        answers(&pki, &b, &inside[0]).await[5].0,
        200,
        "inside: served"
    );
    let promoted = rollout(&a.config, "promote", &[&a, &b]);
    assert!(promoted.iter().all(|s| s["halted"] == false));
    let after = answers(&pki, &a, &outside[0]).await;
    assert_eq!(after[5], (200, b"# two\n".to_vec()), "promoted: the new");
    drop(mb);
}

/// What `puppet plugin download` left in `agent`'s libdir and facts.d for
/// the files the change touches.
fn synced(agent: &PuppetAgent) -> (String, String, bool) {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (
        read(&agent.libdir().join("facter/app.rb")),
        read(&agent.factsdir().join("app.txt")),
        agent.libdir().join("facter/new.rb").exists(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_agents_in_the_wave_get_the_new_plugins_and_the_others_keep_the_old() {
    let Some(puppet) = require("puppet", "puppet", "master_rollout") else {
        return;
    };
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::stock_agents_in_the_wave")
    else {
        return;
    };
    let (inside, outside) = split(2);
    let names: Vec<String> = inside.iter().chain(&outside).cloned().collect();
    let (tree, pki, dir, a, b) = setup(&names, &pg.database());
    let (_ma, _mb) = (
        MasterProcess::spawn(&a.config),
        MasterProcess::spawn(&b.config),
    );
    newest_on_both(&a.config, &a, &b, 1).await;
    // Every node runs `puppet plugin download` through the replica on `port`.
    let run_all = |port: u16| {
        let runs: Vec<_> = names
            .iter()
            .map(|n| {
                let agent = PuppetAgent::new(&puppet, &dir.path().join(n), &pki.ssldir, n, port);
                tokio::task::spawn_blocking(move || (agent.plugin_download("production"), agent))
            })
            .collect();
        async move {
            let mut agents = Vec::new();
            for r in runs {
                let (run, agent) = r.await.unwrap();
                assert_eq!(run.code, 0, "{}", run.output);
                agents.push(agent);
            }
            agents
        }
    };
    let old = ("# one\n".to_owned(), "app=one\n".to_owned(), false);
    for (n, agent) in names.iter().zip(run_all(a.tls).await) {
        assert_eq!(synced(&agent), old, "{n} before the change");
    }

    change(&tree);
    newest_on_both(&a.config, &a, &b, 2).await;
    let new = ("# two\n".to_owned(), "app=two\n".to_owned(), true);
    for replica in [a.tls, b.tls] {
        for (n, agent) in names.iter().zip(run_all(replica).await) {
            let want = if inside.contains(n) { &new } else { &old };
            assert_eq!(&synced(&agent), want, "{n} through port {replica}");
        }
    }
}
