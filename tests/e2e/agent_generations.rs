//! The agent syncs both mounts from one generation (docs/protocol.md §4.11,
//! §7.6): a deploy landing between its requests never leaves a node with
//! facts from one deploy and plugins from another; content is verified
//! against the generation's manifest whoever delivered it; a bundle
//! (`sync --from-bundle`) commits what a network sync of the same
//! generation commits, and a flipped byte changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pluginsync_tests::{
    AgentHome, EnvTree, Hook, Interceptor, Pki, TestMaster, client, config_toml,
    flip_first_body_byte, parse_config, tree_snapshot,
};

/// One module serving a fact and a plugin: `fact` is the fact's content
/// and mode, `plugin` the plugin's version.
fn deploy(tree: &EnvTree, fact: (&str, u32), plugin: &str) {
    tree.file(
        "production",
        "alpha",
        "facts.d/version.sh",
        format!("#!/bin/sh\necho version={}\n", fact.0),
        fact.1,
    );
    tree.file(
        "production",
        "alpha",
        "lib/facter/version.rb",
        format!("# version {plugin}\n"),
        0o644,
    );
}

/// A master that publishes only on the admin call (`node2` may make it).
fn explicit_master(tree: &EnvTree, pki: &Pki) -> TestMaster {
    let tables = "[index]\npublish = \"explicit\"\n[admin]\ncertnames = [\"node2\"]\n";
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", tables)))
}

/// The admin re-index, answered once the new index is served; from a
/// thread of its own (hooks run inside the interceptor's runtime).
fn reindex(pki: &Pki, master: &str) {
    let c = client(pki, Some("node2"));
    let url = format!("{master}/puppet-admin-api/v1/environment-cache?environment=production");
    let status = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async { c.delete(url).send().await.expect("admin").status() })
    })
    .join()
    .expect("admin thread");
    assert_eq!(status.as_u16(), 204);
}

/// Whether `target` asks for a view of the environment's tree (a listing,
/// the per-node answer or a manifest), not for content.
fn asks_for_the_tree(target: &str) -> bool {
    ["/puppet/v3/file_metadatas/", "/pluginsync/v1/"]
        .iter()
        .any(|p| target.starts_with(p))
        && !target.starts_with("/pluginsync/v1/blobs")
}

/// Deploys `v2` and waits for the master to publish it, once, before the
/// second request that asks for the tree passes.
struct DeployBetween {
    tree: Arc<EnvTree>,
    pki: Arc<Pki>,
    master: String,
    asked: std::sync::atomic::AtomicUsize,
    done: AtomicBool,
}

impl Hook for DeployBetween {
    fn before(&self, _n: usize, target: &str) {
        if !asks_for_the_tree(target) {
            return;
        }
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        if n == 1 && !self.done.swap(true, Ordering::SeqCst) {
            // The fact keeps its content (its blob stays servable), only
            // its mode changes: the stale half of a mix is still fetchable.
            deploy(&self.tree, ("v1", 0o700), "v2");
            reindex(&self.pki, &self.master);
        }
    }
}

/// Points `home` at `to` instead of `from`.
fn behind(home: &AgentHome, from: &str, to: &str) {
    let path = home.path().join("agent.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, toml.replace(from, to)).unwrap();
}

/// What a node holds: its facts and plugins (content and modes).
fn node(home: &AgentHome) -> Vec<std::collections::BTreeMap<String, String>> {
    vec![
        tree_snapshot(&home.factsdir()),
        tree_snapshot(&home.libdir()),
    ]
}

/// What a node holds after a clean sync of the master's current tree.
fn reference(pki: &Pki, master: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let home = AgentHome::new(pki, &[master.to_owned()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    node(&home)
}

#[test]
fn a_deploy_between_the_agents_requests_never_leaves_a_mix() {
    let pki = Arc::new(Pki::new());
    let tree = Arc::new(EnvTree::new());
    deploy(&tree, ("v0", 0o755), "v0");
    let master = explicit_master(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    // v1 is published; the node's run starts while it is current, and v2
    // lands between the run's first and second look at the tree.
    deploy(&tree, ("v1", 0o755), "v1");
    reindex(&pki, &master.url());
    let old = reference(&pki, &master.url());
    let hook = Arc::new(DeployBetween {
        tree,
        pki: pki.clone(),
        master: master.url(),
        asked: Default::default(),
        done: AtomicBool::new(false),
    });
    let relay = Interceptor::start(&pki, master.addr, "node1", hook.clone());
    behind(&home, &master.url(), &relay.url());
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        hook.done.load(Ordering::SeqCst),
        "the deploy landed during the run: {:?}",
        relay.seen.lock().unwrap()
    );
    let new = reference(&pki, &master.url());
    assert_ne!(old, new);
    let got = node(&home);
    assert!(
        got == old || got == new,
        "the node holds one deploy, the old or the new, never a mix:\n{got:#?}\nold {old:#?}\nnew {new:#?}\nrequests {:?}",
        relay.seen.lock().unwrap()
    );
    // And the next run converges on the new one.
    behind(&home, &relay.url(), &master.url());
    let again = home.sync(&[]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(node(&home), new);
}

/// Flips the first byte of every single blob answered.
struct LyingCache;

impl Hook for LyingCache {
    fn after(&self, target: &str, response: &mut Vec<u8>) {
        if target.starts_with("/pluginsync/v1/blobs/sha256/") {
            flip_first_body_byte(response);
        }
    }
}

#[test]
fn a_wrong_blob_from_whoever_delivered_it_fails_the_run_and_changes_nothing() {
    let pki = Pki::new();
    let tree = EnvTree::new();
    deploy(&tree, ("v1", 0o755), "v1");
    let master = explicit_master(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    let before = node(&home);
    // One changed file: fetched singly, by its digest.
    tree.file(
        "production",
        "alpha",
        "lib/facter/version.rb",
        "# version v2\n",
        0o644,
    );
    reindex(&pki, &master.url());
    let relay = Interceptor::start(&pki, master.addr, "node1", Arc::new(LyingCache));
    // The same node, now behind the lying relay.
    behind(&home, &master.url(), &relay.url());
    let run = home.sync(&[]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "one line: {}", run.stderr);
    assert!(
        lines[0].contains("does not match"),
        "the wrong blob is named: {}",
        run.stderr
    );
    assert!(
        relay
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|t| t.starts_with("/pluginsync/v1/blobs/sha256/")),
        "the content came by digest: {:?}",
        relay.seen.lock().unwrap()
    );
    assert!(
        relay
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|t| t.starts_with("/pluginsync/v1/assignment")),
        "the run synced a generation: {:?}",
        relay.seen.lock().unwrap()
    );
    assert_eq!(node(&home), before, "nothing changed");
    // Through a clean path again, it converges.
    behind(&home, &relay.url(), &master.url());
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(node(&home), reference(&pki, &master.url()));
}
