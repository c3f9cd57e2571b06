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
    flip_first_body_byte, gzip_lines, parse_config, response_with, tree_snapshot,
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

/// Flips the first byte of every answer to a target with this prefix: a
/// cache in front of the master serving wrong bytes.
struct Lying(&'static str);

impl Hook for Lying {
    fn after(&self, target: &str, response: &mut Vec<u8>) {
        if target.starts_with(self.0) {
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
    // A wrong manifest (or delta) first: refused, nothing changed.
    let lying = Lying("/pluginsync/v1/generations/");
    let relay = Interceptor::start(&pki, master.addr, "node1", Arc::new(lying));
    behind(&home, &master.url(), &relay.url());
    let run = home.sync(&[]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("refused: manifest"), "{}", run.stderr);
    assert_eq!(node(&home), before, "nothing changed");
    behind(&home, &relay.url(), &master.url());
    drop(relay);
    // Then a wrong blob.
    let relay = Interceptor::start(
        &pki,
        master.addr,
        "node1",
        Arc::new(Lying("/pluginsync/v1/blobs/sha256/")),
    );
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
    let seen = relay.seen.lock().unwrap().clone();
    let asked = |prefix: &str| seen.iter().any(|t| t.starts_with(prefix));
    assert!(
        asked("/pluginsync/v1/assignment") && asked("/pluginsync/v1/blobs/sha256/"),
        "a generation, its content by digest: {seen:?}"
    );
    assert_eq!(node(&home), before, "nothing changed");
    // Through a clean path again, it converges.
    behind(&home, &relay.url(), &master.url());
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(node(&home), reference(&pki, &master.url()));
}

/// The master's current generation of `production` as a bundle written
/// with the common `BundleWriter`: the per-node answer, the manifest and
/// every blob, each asked of the master over TLS.
async fn bundle_of(pki: &Pki, master: &str, out: &std::path::Path) -> String {
    use pluginsync_common::bundle::{BUNDLE_FORMAT, BundleHeader, BundleWriter};
    use pluginsync_common::generation::{Assignment, assignment_url, manifest_url};
    let c = client(pki, Some("node1"));
    let get = async |url: String| {
        let r = c.get(&url).send().await.expect("get");
        assert_eq!(r.status().as_u16(), 200, "{url}");
        r.bytes().await.expect("body")
    };
    let a: Assignment =
        serde_json::from_slice(&get(assignment_url(master, "production")).await).unwrap();
    let manifest = get(manifest_url(master, "production", &a.generation, None)).await;
    let header = BundleHeader {
        format: BUNDLE_FORMAT,
        environment: "production".into(),
        generation: a.generation,
        published: a.published.clone(),
        trust: Vec::new(),
    };
    let mut w = BundleWriter::new(Vec::new(), &header, &manifest).unwrap();
    while let Some(d) = w.remaining().first().copied() {
        let blob = get(format!("{master}/pluginsync/v1/blobs/sha256/{d}")).await;
        w.add_blob(&d, blob.len() as u64, &blob[..]).unwrap();
    }
    std::fs::write(out, w.finish().unwrap()).unwrap();
    a.generation.to_hex()
}

/// The `generation` of a JSON report.
fn generation_of(stdout: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(stdout).ok()?;
    v["generation"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_commits_what_a_network_sync_of_its_generation_commits_and_a_flipped_byte_nothing()
{
    let pki = Pki::new();
    let tree = EnvTree::new();
    tree.generate("production", 3, 8, 24);
    deploy(&tree, ("v1", 0o755), "v1");
    let master = explicit_master(&tree, &pki);
    let file = tree.outside().join("production.bundle");
    let id = bundle_of(&pki, &master.url(), &file).await;
    let bundle = file.to_str().unwrap().to_owned();

    let online = AgentHome::new(&pki, &[master.url()], "");
    let run = online.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(generation_of(&run.stdout).as_deref(), Some(id.as_str()));

    // No master reachable: the bundle alone.
    let nowhere = format!("https://localhost:{}", pluginsync_tests::closed_port());
    let offline = AgentHome::new(&pki, std::slice::from_ref(&nowhere), "");
    let run = offline.sync(&["--from-bundle", &bundle, "--format", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(generation_of(&run.stdout).as_deref(), Some(id.as_str()));
    assert_eq!(node(&offline), node(&online));
    assert!(!offline.vardir().join("bundle-blobs").exists());
    // The same bundle again: nothing to do.
    let again = offline.sync(&["--from-bundle", &bundle]);
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, ""),
        "{}",
        again.stderr
    );

    // One flipped byte anywhere: refused with one line, nothing changed.
    tree.file(
        "production",
        "alpha",
        "lib/facter/version.rb",
        "# v2\n",
        0o644,
    );
    reindex(&pki, &master.url());
    let newer = tree.outside().join("newer.bundle");
    bundle_of(&pki, &master.url(), &newer).await;
    let before = node(&offline);
    let mut bytes = std::fs::read(&newer).unwrap();
    for at in [100, bytes.len() / 2, bytes.len() - 700] {
        bytes[at] ^= 0x20;
        std::fs::write(&newer, &bytes).unwrap();
        let run = offline.sync(&["--from-bundle", newer.to_str().unwrap()]);
        assert_eq!(run.code, 1, "byte {at}: {}\n{}", run.stdout, run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "byte {at}: {}", run.stderr);
        assert!(run.stderr.contains("refused"), "{}", run.stderr);
        assert_eq!(node(&offline), before, "byte {at}: nothing changed");
        bytes[at] ^= 0x20;
    }
    // Another environment than --environment: refused.
    let run = offline.sync(&["--from-bundle", &bundle, "--environment", "staging"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("is of environment 'production'"),
        "{}",
        run.stderr
    );
    // Back online, the node converges from where the bundle left it.
    let toml = std::fs::read_to_string(offline.path().join("agent.toml")).unwrap();
    std::fs::write(
        offline.path().join("agent.toml"),
        toml.replace(&nowhere, &master.url()),
    )
    .unwrap();
    let run = offline.sync(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(node(&offline), reference(&pki, &master.url()));
}

/// Relays as is.
struct Plain;

impl Hook for Plain {}

#[test]
fn a_no_op_run_is_one_304_and_writes_nothing_and_a_change_comes_as_a_manifest_delta() {
    let pki = Pki::new();
    let tree = EnvTree::new();
    tree.generate("production", 3, 8, 7);
    deploy(&tree, ("v1", 0o755), "v1");
    let master = explicit_master(&tree, &pki);
    let relay = Interceptor::start(&pki, master.addr, "node1", Arc::new(Plain));
    let home = AgentHome::new(&pki, &[relay.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    let seen = |f: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut s = relay.seen.lock().unwrap();
        let got = s.iter().filter(|t| f(t)).cloned().collect();
        s.clear();
        got
    };
    seen(&|_| true);
    let cache = || tree_snapshot(&home.vardir().join("cache"));
    let before = cache();
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{}", run.stderr);
    let asked = seen(&|_| true);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].starts_with("/pluginsync/v1/assignment?"),
        "{asked:?}"
    );
    assert_eq!(cache(), before, "a no-op run writes nothing in the cache");

    tree.file(
        "production",
        "alpha",
        "lib/facter/version.rb",
        "# v2\n",
        0o644,
    );
    reindex(&pki, &master.url());
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let manifests = seen(&|t| t.starts_with("/pluginsync/v1/generations/"));
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert!(manifests[0].contains("&since="), "{manifests:?}");
    assert_eq!(node(&home), reference(&pki, &master.url()));
    let id = generation_of(&run.stdout).expect("the report names the generation");
    assert!(manifests[0].contains(&id), "{manifests:?} {id}");
}

/// Answers a manifest asked as a delta with a hostile one: 255 MiB of
/// removals (gzipped, ~250 KiB) of a manifest that holds a handful.
struct DeltaBomb;

impl Hook for DeltaBomb {
    fn after(&self, target: &str, response: &mut Vec<u8>) {
        let Some(rest) = target.strip_prefix("/pluginsync/v1/generations/") else {
            return;
        };
        let Some((_, since)) = rest.split_once("since=") else {
            return;
        };
        let id = &rest[..64];
        let head = format!("pluginsync-manifest-delta 1\nbase {since}\ntarget {id}\n");
        let line = "-plugins\ta\n";
        let gz = gzip_lines(&head, line, (255 << 20) / line.len(), "");
        let ctype = pluginsync_common::protocol::MANIFEST_DELTA_MEDIA_TYPE;
        let headers = [("Content-Type", ctype), ("Content-Encoding", "gzip")];
        *response = response_with("200 OK", &headers, &gz);
    }
}

/// A-9's generation-manifest path: a hostile manifest delta removing far
/// more entries than the held manifest has is refused at the first line
/// past them (docs/protocol.md §7.6), under a 1 GiB address-space limit
/// with a peak resident set under 512 MB; the whole manifest is taken
/// instead and the node converges.
#[test]
fn a_manifest_delta_of_a_quarter_gigabyte_of_lines_is_refused_in_bounded_memory() {
    // The peak is read by /usr/bin/time (Debian's `time`, which .ci/run installs).
    if pluginsync_tests::require(
        "time",
        "time",
        "a_manifest_delta_of_a_quarter_gigabyte_of_lines_is_refused_in_bounded_memory",
    )
    .is_none()
    {
        return;
    }
    let pki = Pki::new();
    let tree = EnvTree::new();
    deploy(&tree, ("v1", 0o755), "v1");
    let master = explicit_master(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    deploy(&tree, ("v1", 0o755), "v2");
    reindex(&pki, &master.url());
    let relay = Interceptor::start(&pki, master.addr, "node1", Arc::new(DeltaBomb));
    behind(&home, &master.url(), &relay.url());
    let m = home.sync_measured(&["-v"], 1 << 30);
    assert_eq!(m.run.code, 0, "refused, not aborted: {:?}", m.run);
    assert!(m.peak < 512 << 20, "peak {} MB", m.peak >> 20);
    assert!(
        m.run.stderr.contains("manifest delta not used"),
        "{}",
        m.run.stderr
    );
    let seen = relay.seen.lock().unwrap().clone();
    let manifests: Vec<_> = (seen.iter())
        .filter(|t| t.starts_with("/pluginsync/v1/generations/"))
        .collect();
    assert_eq!(manifests.len(), 2, "the delta, then the whole: {seen:?}");
    assert_eq!(node(&home), reference(&pki, &master.url()));
}

/// A `--from-bundle` path that is a symlink to a secret (a copy of a
/// shadow line), or a bundle whose second tar header is that secret, is
/// refused with one line naming the file and what is wrong, never what it
/// holds; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_that_is_a_secret_is_named_never_quoted() {
    let pki = Pki::new();
    let tree = EnvTree::new();
    deploy(&tree, ("v1", 0o755), "v1");
    let master = explicit_master(&tree, &pki);
    let real = tree.outside().join("real.bundle");
    bundle_of(&pki, &master.url(), &real).await;
    let shadow = "root:*:SECRET-HASH:0:99999:7:::\n".repeat(40);
    let secret = tree.outside().join("shadow");
    std::fs::write(&secret, &shadow).unwrap();
    let link = tree.outside().join("link.bundle");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let mut spliced = std::fs::read(&real).unwrap()[..1024].to_vec();
    spliced.extend_from_slice(shadow.as_bytes());
    let spliced_path = tree.outside().join("spliced.bundle");
    std::fs::write(&spliced_path, spliced).unwrap();
    let nowhere = format!("https://localhost:{}", pluginsync_tests::closed_port());
    let home = AgentHome::new(&pki, std::slice::from_ref(&nowhere), "");
    for path in [&link, &spliced_path] {
        let run = home.sync(&["--from-bundle", path.to_str().unwrap()]);
        assert_eq!(run.code, 1, "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(!run.stderr.contains("SECRET"), "{}", run.stderr);
        assert!(!run.stderr.contains("root:"), "{}", run.stderr);
        assert!(
            run.stderr.contains(path.to_str().unwrap()),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("not a pluginsync bundle") || run.stderr.contains("corrupt"),
            "{}",
            run.stderr
        );
    }
    assert!(tree_snapshot(&home.libdir()).is_empty(), "nothing synced");
}
