//! A fleet behind the shipped cache (docs/cache.md):
//! nginx with `packaging/nginx-pluginsync-cache.conf` as written, in front
//! of two masters' `[proxy]` listeners serving one tree, and a hundred
//! pluginsync agents with certnames of their own, 8 at a time.
//!
//! Every node syncs the tree, then a 1 % change: every node ends with the
//! new tree, quietly (the cache declines batches; the agent fetches by
//! digest); each changed file's content left the masters at most twice
//! (their access logs, and nginx's log with `$upstream_cache_status`),
//! while every node's own request (its per-node answer, or its listings
//! from a master without generations) reached a master with the node's
//! identity. Asked by hand through the cache, every node's per-node answer
//! and its revalidation (a `304`) reach a master, while the manifest it
//! names leaves the masters at most twice.
//! Then a wrong blob swapped into nginx's cache directory is refused by the
//! agent (one line, nothing changed), and the next run, the entry removed,
//! converges. Under an `[[authorization]]` rule the masters mark blobs
//! `private`: nginx stores none, and every request reaches a master. Over
//! TLS to a master through `packaging/nginx-pluginsync-hop.conf`, a node
//! syncs with its own identity, and the hop admits the cache's certificate
//! only. The fleet runs both ways: as is, and with `[trust]` on the masters
//! and every node.
//!
//! Skipped with a message where nginx is missing, except under CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use pluginsync_common::protocol::{
    ASSIGNMENT_PATH, BATCH_PATH, BATCH_QUERY_KEY, BLOB_PREFIX, CACHE_IMMUTABLE, GENERATIONS_PREFIX,
    MANIFEST_MEDIA_TYPE,
};
use pluginsync_tests::balancer::{Balancer, ProxyBackend, wait_served};
use pluginsync_tests::{
    AgentHome, AgentRun, EnvTree, Pki, client, merged_mount, require, sha256_hex, tree_snapshot,
};

const TEST: &str = "nginx_cache";
/// Nodes in the fleet, and how many run at once.
const NODES: usize = 100;
const PARALLEL: usize = 8;
/// How often the masters may send one changed file's content in all.
const AT_MOST: usize = 2;

/// What every test here starts from: certificates for `names` and the
/// server `localhost` (which nginx and the masters present), a generated
/// production environment, an empty basemodulepath.
struct Setup {
    pki: Pki,
    tree: EnvTree,
    /// The environment's lib files.
    libs: Vec<PathBuf>,
    base: tempfile::TempDir,
    /// `localhost`'s certificate and key, the CA, the CRL.
    files: [PathBuf; 4],
}

impl Setup {
    /// `modules` modules of `files` lib files each, from `seed`.
    fn new(names: &[String], modules: usize, files: usize, seed: u64) -> Setup {
        let pki = Pki::with_agents(names);
        let tree = EnvTree::new();
        let libs = tree.generate("production", modules, files, seed);
        let files = [
            pki.cert("localhost"),
            pki.key("localhost"),
            pki.ca(),
            pki.crl(),
        ];
        Setup {
            pki,
            tree,
            libs,
            base: tempfile::tempdir().expect("tempdir"),
            files,
        }
    }

    /// The TLS files as nginx and [`ProxyBackend`] take them.
    fn tls(&self) -> [&Path; 4] {
        self.files.each_ref().map(PathBuf::as_path)
    }

    /// A master with a `[proxy]` listener serving the environment, plus
    /// `extra` config.
    fn master(&self, extra: &str) -> ProxyBackend {
        ProxyBackend::spawn_with(&self.tree.envpath(), self.base.path(), self.tls(), extra)
    }

    fn env_dir(&self) -> PathBuf {
        self.tree.envpath().join("production")
    }

    /// Waits until `master` serves mod00's first lib file to `node000`;
    /// that file's text.
    fn wait_first_served(&self, master: &ProxyBackend) -> String {
        let lib = self.env_dir().join("modules/mod00/lib");
        let rel = self.libs[0].strip_prefix(&lib).expect("mod00's");
        let rel = rel.to_str().expect("utf-8");
        let text = std::fs::read_to_string(&self.libs[0]).expect("read a lib file");
        wait_served(
            std::slice::from_ref(master),
            "node000",
            "plugins",
            rel,
            &text,
        );
        text
    }
}

/// Runs `f` on a runtime of its own (reqwest's clients need one).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Runs `sync` on every home, [`PARALLEL`] at a time; the runs in the
/// homes' order.
fn sync_all(homes: &[AgentHome]) -> Vec<AgentRun> {
    let next = AtomicUsize::new(0);
    let mut runs: Vec<(usize, AgentRun)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..PARALLEL)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(home) = homes.get(i) else {
                            break mine;
                        };
                        mine.push((i, home.sync(&[])));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    runs.sort_by_key(|(i, _)| *i);
    runs.into_iter().map(|(_, r)| r).collect()
}

/// What a node holds: its libdir and factsdir.
fn node_state(home: &AgentHome) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
    )
}

/// What the environment serves: its plugins and pluginfacts mounts.
fn served_state(env_dir: &Path) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        merged_mount(env_dir, "lib"),
        merged_mount(env_dir, "facts.d"),
    )
}

/// Every run exited 0 without a line on stderr and every node holds what
/// the environment serves.
fn assert_converged(what: &str, homes: &[AgentHome], runs: &[AgentRun], env_dir: &Path) {
    let want = served_state(env_dir);
    for (i, (home, run)) in homes.iter().zip(runs).enumerate() {
        assert_eq!(
            run.code, 0,
            "{what}: node {i}'s run failed:\n{}",
            run.stderr
        );
        // Quiet: the cache declining batches costs no warning.
        assert_eq!(run.stderr, "", "{what}: node {i}'s run logged");
        assert!(
            node_state(home) == want,
            "{what}: node {i} does not hold the environment's tree"
        );
    }
}

/// The masters' access-log entries from `skip[i]` on.
fn master_entries(masters: &[ProxyBackend], skip: &[usize]) -> Vec<serde_json::Value> {
    masters
        .iter()
        .zip(skip)
        .flat_map(|(m, &n)| m.access_log().into_iter().skip(n))
        .collect()
}

/// How many of `entries` sent the content of a file with sha256 `hex`: by
/// digest, singly or in a batch, or by path (`rel` in a `file_content`
/// target), with a 200.
fn content_answers(entries: &[serde_json::Value], hex: &str, rel: &str) -> usize {
    let blob = format!("{BLOB_PREFIX}{hex}");
    let in_batch = format!("{BATCH_QUERY_KEY}={hex}");
    entries
        .iter()
        .filter(|e| e["status"] == 200)
        .filter(|e| {
            let t = e["target"].as_str().unwrap_or_default();
            t == blob
                || (t.starts_with(BATCH_PATH) && t.contains(&in_batch))
                || (t.starts_with("/puppet/v3/file_content/") && t.contains(rel))
        })
        .count()
}

/// The file in nginx's cache directory that holds the entry for `key`.
fn cache_file(dir: &Path, key: &str) -> Option<PathBuf> {
    let needle = format!("\nKEY: {key}\n");
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                return Some(path);
            }
        }
    }
    None
}

/// What one node saw asking the cache for its per-node answer, the
/// manifest it names, and the answer again with its `ETag`.
struct Asked {
    generation: String,
    manifest_digest: String,
    manifest_cache_control: String,
    revalidated: u16,
}

/// Every node in `names`, with its own certificate, asks `server` (the
/// cache) for production's per-node answer, then the manifest of the
/// generation it names (docs/protocol.md §7.6), then the answer again
/// with `If-None-Match` (a no-op run).
fn ask_generations(pki: &Pki, server: &str, names: &[String]) -> Vec<Asked> {
    let assignment = format!("{server}{ASSIGNMENT_PATH}?environment=production");
    block_on(async {
        let mut out = Vec::new();
        for name in names {
            let c = client(pki, Some(name));
            let answer = c
                .get(&assignment)
                .header("Accept", "application/json")
                .send()
                .await
                .expect("the per-node answer through the cache");
            assert_eq!(answer.status(), 200, "{name}'s per-node answer");
            let etag = answer.headers()["etag"].clone();
            let json: serde_json::Value = answer.json().await.expect("its JSON");
            let generation = json["generation"]
                .as_str()
                .expect("a generation")
                .to_owned();
            let manifest = c
                .get(format!(
                    "{server}{GENERATIONS_PREFIX}{generation}?environment=production"
                ))
                .header("Accept", MANIFEST_MEDIA_TYPE)
                .send()
                .await
                .expect("the manifest through the cache");
            assert_eq!(manifest.status(), 200, "{name}'s manifest");
            let manifest_cache_control = manifest.headers()["cache-control"]
                .to_str()
                .unwrap_or_default()
                .to_owned();
            let body = manifest.bytes().await.expect("the manifest's body");
            let again = c
                .get(&assignment)
                .header("Accept", "application/json")
                .header("If-None-Match", etag)
                .send()
                .await
                .expect("the per-node answer again");
            out.push(Asked {
                generation,
                manifest_digest: sha256_hex(&body),
                manifest_cache_control,
                revalidated: again.status().as_u16(),
            });
        }
        out
    })
}

/// Replaces the body of the cache file `path` with as many wrong bytes:
/// nginx keeps the key, the upstream's headers (its `Content-Length`),
/// then the body.
fn corrupt_body(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read cache file");
    let key = bytes
        .windows(5)
        .position(|w| w == b"KEY: ")
        .expect("key line");
    let body = key
        + bytes[key..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("end of the stored headers")
        + 4;
    assert!(body < bytes.len(), "the cached blob has a body");
    for b in &mut bytes[body..] {
        *b = if *b == b'X' { b'Y' } else { b'X' };
    }
    std::fs::write(path, bytes).expect("write cache file");
}

#[test]
fn a_fleet_syncs_a_change_through_the_cache_and_refuses_a_wrong_blob() {
    fleet_through_the_cache(false);
}

/// The same with `[trust]` on both masters and every node, each tree
/// signed by the emulated pipeline (`Signing`): the TUF metadata passes
/// the cache too, and the cache's economy holds (docs/trust.md).
#[test]
fn a_signed_fleet_syncs_a_change_through_the_cache_and_refuses_a_wrong_blob() {
    fleet_through_the_cache(true);
}

fn fleet_through_the_cache(trust: bool) {
    let Some(nginx) = require("nginx", "nginx", TEST) else {
        return;
    };
    let names: Vec<String> = (0..NODES).map(|i| format!("node{i:03}")).collect();
    let setup = Setup::new(&names, 10, 30, 24);
    let (pki, libs, env_dir) = (&setup.pki, &setup.libs, setup.env_dir());
    let toml = pluginsync_tests::config_toml(
        &setup.tree.envpath(),
        pki,
        &format!("basemodulepath = [{:?}]", setup.base.path()),
        "",
    );
    let signing = pluginsync_tests::Signing::new(trust, &toml, &["production"]);
    let masters: Vec<ProxyBackend> = (0..2)
        .map(|_| setup.master(&signing.master_tables()))
        .collect();
    let proxies: Vec<String> = masters.iter().map(|m| m.proxy.clone()).collect();
    let cache = Balancer::nginx_cache(&nginx, setup.tls(), &proxies);
    // Both masters have published the tree before the first node asks: a
    // generation one names must be one the other keeps (the cache may ask
    // either for its manifest).
    let lib = env_dir.join("modules/mod00/lib");
    let first = libs[0]
        .strip_prefix(&lib)
        .expect("mod00's")
        .to_str()
        .expect("utf-8");
    let text = std::fs::read_to_string(&libs[0]).expect("read a lib file");
    wait_served(&masters, "node000", "plugins", first, &text);
    let server = format!("https://localhost:{}", cache.port);
    let homes: Vec<AgentHome> = names
        .iter()
        .map(|n| {
            let trust = signing.agent_table();
            AgentHome::with_ssldir(&pki.ssldir, n, std::slice::from_ref(&server), &trust)
        })
        .collect();

    // Every node syncs the tree through the cache.
    let runs = sync_all(&homes);
    assert_converged("initial sync", &homes, &runs, &env_dir);

    // A 1 % change: two plugins and one external fact of 309 files.
    let lib = env_dir.join("modules/mod01/lib");
    let rel_of = |p: &Path| {
        p.strip_prefix(&lib)
            .expect("mod01's")
            .to_str()
            .expect("utf-8")
            .to_owned()
    };
    let changes = [
        (
            "plugins",
            rel_of(&libs[37]),
            libs[37].clone(),
            "# changed behind the cache\n",
        ),
        (
            "plugins",
            rel_of(&libs[38]),
            libs[38].clone(),
            "# changed too\n",
        ),
        (
            "pluginfacts",
            "mod01_0.txt".to_owned(),
            env_dir.join("modules/mod01/facts.d/mod01_0.txt"),
            "mod01_0=changed\n",
        ),
    ];
    for (mount, rel, path, text) in &changes {
        std::fs::write(path, text).expect("change a file");
        wait_served(&masters, "node000", mount, rel, text);
    }
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let log_skip = cache.cache_log().len();
    let runs = sync_all(&homes);
    assert_converged("after a 1 % change", &homes, &runs, &env_dir);

    // Each changed file's content left the masters at most twice in all.
    let entries = master_entries(&masters, &skip);
    let nginx_log: Vec<serde_json::Value> = cache.cache_log().into_iter().skip(log_skip).collect();
    for (_, rel, _, text) in &changes {
        let hex = sha256_hex(text.as_bytes());
        let from_masters = content_answers(&entries, &hex, rel);
        assert!(
            (1..=AT_MOST).contains(&from_masters),
            "{rel}: the masters sent its content {from_masters} times for {NODES} nodes"
        );
        let uri = format!("{BLOB_PREFIX}{hex}");
        let status = |s: &str| {
            nginx_log
                .iter()
                .filter(|e| e["uri"] == uri.as_str() && e["cache"] == s)
                .count()
        };
        assert!(
            status("MISS") <= AT_MOST && status("HIT") >= NODES - AT_MOST,
            "{rel}: nginx's log: {} MISS, {} HIT for {NODES} nodes",
            status("MISS"),
            status("HIT")
        );
    }
    // Every node's own request reached a master with its identity: its
    // per-node answer where the masters serve generations (our agent then
    // asks nothing else of a master), else both its listings.
    let reached = |name: &str, prefix: &str| {
        entries.iter().any(|e| {
            e["certname"] == name && e["target"].as_str().is_some_and(|t| t.starts_with(prefix))
        })
    };
    for name in &names {
        assert!(
            reached(name, ASSIGNMENT_PATH)
                || (reached(name, "/puppet/v3/file_metadatas/plugins")
                    && reached(name, "/puppet/v3/file_metadatas/pluginfacts")),
            "neither {name}'s per-node answer nor its listings reached a master"
        );
    }

    // The generation flow through the cache: every node's per-node answer
    // (and its revalidation, a 304) reaches a master with the node's
    // identity; the manifest it names is immutable, content-addressed, and
    // leaves the masters at most twice.
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let log_skip = cache.cache_log().len();
    let asked = ask_generations(pki, &server, &names);
    let generation = &asked[0].generation;
    for (name, a) in names.iter().zip(&asked) {
        assert_eq!(
            &a.generation, generation,
            "{name} was told another generation"
        );
        assert_eq!(
            &a.manifest_digest, generation,
            "{name}'s manifest does not hash to its id"
        );
        assert_eq!(
            a.manifest_cache_control, CACHE_IMMUTABLE,
            "{name}'s manifest"
        );
        assert_eq!(a.revalidated, 304, "{name}'s no-op revalidation");
    }
    let entries = master_entries(&masters, &skip);
    for name in &names {
        for status in [200, 304] {
            assert!(
                entries.iter().any(|e| e["certname"] == name.as_str()
                    && e["status"] == status
                    && e["target"]
                        .as_str()
                        .is_some_and(|t| t.starts_with(ASSIGNMENT_PATH))),
                "{name}'s per-node answer ({status}) did not reach a master"
            );
        }
    }
    let manifest = format!("{GENERATIONS_PREFIX}{generation}?environment=production");
    let from_masters = entries
        .iter()
        .filter(|e| e["target"] == manifest.as_str())
        .count();
    assert!(
        (1..=AT_MOST).contains(&from_masters),
        "the masters sent the manifest {from_masters} times for {NODES} nodes"
    );
    let hits = cache
        .cache_log()
        .into_iter()
        .skip(log_skip)
        .filter(|e| e["uri"] == manifest.as_str() && e["cache"] == "HIT")
        .count();
    assert!(
        hits >= NODES - AT_MOST,
        "nginx served the manifest {hits} times from its cache"
    );

    // A wrong blob in the cache: the first node's run fills the entry,
    // the test swaps its bytes, the second node refuses it.
    let (_, rel, path, _) = &changes[0];
    let next_text = "# changed again\n";
    std::fs::write(path, next_text).expect("change a plugin again");
    wait_served(&masters, "node000", "plugins", rel, next_text);
    let filled = homes[0].sync(&[]);
    assert_eq!(filled.code, 0, "{}", filled.stderr);
    let key = format!("{BLOB_PREFIX}{}", sha256_hex(next_text.as_bytes()));
    let entry = cache_file(&cache.cache_dir(), &key).expect("the new blob is in nginx's cache");
    corrupt_body(&entry);
    // docs/cache.md#a-wrong-entry's grep names that file and no other.
    let grep = std::process::Command::new("grep")
        .arg("-rl")
        .arg(format!("^KEY: {key}$"))
        .arg(cache.cache_dir())
        .output()
        .expect("grep");
    assert_eq!(
        String::from_utf8_lossy(&grep.stdout).trim(),
        entry.display().to_string(),
        "the documented grep"
    );
    let victim = &homes[1];
    let before = node_state(victim);
    let refused = victim.sync(&[]);
    assert_ne!(
        refused.code, 0,
        "a wrong blob was accepted:\n{}",
        refused.stderr
    );
    let lines: Vec<&str> = refused.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].contains("does not match its listed checksum"),
        "the refusal is not one line naming the checksum:\n{}",
        refused.stderr
    );
    assert!(
        node_state(victim) == before,
        "a refused run changed the node"
    );
    // With a master after the cache (`servers = [cache, master]`) the same
    // wrong blob fails no run: that blob comes from the master (verified
    // all the same), and one warning names the cache.
    let both = &homes[2];
    let config = both.path().join("agent.toml");
    let toml = std::fs::read_to_string(&config).expect("agent.toml");
    let servers = format!("servers = [{server:?}, {:?}]", masters[0].tls_url());
    let first_line = toml.lines().next().expect("a servers line").to_owned();
    std::fs::write(&config, toml.replacen(&first_line, &servers, 1)).expect("agent.toml");
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let recovered = both.sync(&[]);
    assert_eq!(recovered.code, 0, "{}", recovered.stderr);
    let warned: Vec<&str> = recovered
        .stderr
        .lines()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert!(
        warned.len() == 1
            && warned[0].contains(&format!("{server} served bad content"))
            && warned[0].contains("does not match its listed checksum"),
        "not one warning naming the cache:\n{}",
        recovered.stderr
    );
    assert!(
        node_state(both) == served_state(&env_dir),
        "with the master after the cache, the node does not hold the tree"
    );
    let blob = format!("{BLOB_PREFIX}{}", sha256_hex(next_text.as_bytes()));
    assert!(
        master_entries(&masters, &skip)
            .iter()
            .any(|e| e["target"] == blob.as_str() && e["status"] == 200),
        "the blob did not come from the master"
    );
    // Through a clean path (the entry removed) the next run converges.
    std::fs::remove_file(&entry).expect("remove the cache entry");
    let clean = victim.sync(&[]);
    assert_converged(
        "through a clean cache",
        std::slice::from_ref(victim),
        &[clean],
        &env_dir,
    );
}

/// An initial sync of a few hundred files through the cache (batches of
/// them, which the cache answers 404 itself) sends nginx no request line
/// longer than it reads: nginx answers one over its 8 KiB
/// `large_client_header_buffers` with `414` and closes the connection
/// mid-request (docs/protocol.md §7.2.1), so a batch that long costs a
/// connection, and a reset can overtake that answer.
#[test]
fn batches_fit_the_request_line_a_cache_reads() {
    let Some(nginx) = require("nginx", "nginx", TEST) else {
        return;
    };
    let names = vec!["node000".to_owned()];
    let setup = Setup::new(&names, 4, 80, 11);
    let master = setup.master("");
    let cache = Balancer::nginx_cache(&nginx, setup.tls(), std::slice::from_ref(&master.proxy));
    setup.wait_first_served(&master);
    let server = format!("https://localhost:{}", cache.port);
    let home = AgentHome::with_ssldir(&setup.pki.ssldir, "node000", &[server], "");
    let runs = sync_all(std::slice::from_ref(&home));
    assert_converged(
        "initial sync",
        std::slice::from_ref(&home),
        &runs,
        &setup.env_dir(),
    );
    let log = cache.cache_log();
    let batches = log
        .iter()
        .filter(|e| e["uri"].as_str().is_some_and(|u| u.starts_with(BATCH_PATH)))
        .count();
    assert!(
        batches >= 3,
        "{batches} batch requests reached nginx: the tree is too small to test"
    );
    let too_long: Vec<_> = log.iter().filter(|e| e["status"] == 414).collect();
    assert!(
        too_long.is_empty(),
        "nginx refused {} of {} requests as too long (414), e.g. {}",
        too_long.len(),
        log.len(),
        too_long[0]
    );
}

#[test]
fn private_answers_always_reach_a_master() {
    let Some(nginx) = require("nginx", "nginx", TEST) else {
        return;
    };
    let names: Vec<String> = (0..2).map(|i| format!("node{i:03}")).collect();
    let setup = Setup::new(&names, 1, 3, 5);
    // One rule restricting environments: blobs are `private` (docs/protocol.md §7.4).
    let rule = "[[authorization]]\ncertname = \"node*\"\nenvironments = [\"production\"]\n";
    let master = setup.master(rule);
    let cache = Balancer::nginx_cache(&nginx, setup.tls(), std::slice::from_ref(&master.proxy));
    // Blobs are looked up in the environments indexed: wait for it.
    let text = setup.wait_first_served(&master);
    let hex = sha256_hex(text.as_bytes());
    let url = format!("https://localhost:{}{BLOB_PREFIX}{hex}", cache.port);
    for name in names.iter().chain(&names) {
        let resp = block_on(async { client(&setup.pki, Some(name)).get(&url).send().await })
            .expect("a blob through the cache");
        assert_eq!(resp.status(), 200, "{name}");
        let header = |h: &str| {
            resp.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(header("cache-control").starts_with("private"), "{name}");
        assert_ne!(
            header("x-cache-status"),
            "HIT",
            "{name}: a private blob came from the cache"
        );
    }
    let asked = master
        .access_log()
        .iter()
        .filter(|e| e["target"] == format!("{BLOB_PREFIX}{hex}").as_str() && e["status"] == 200)
        .count();
    assert_eq!(
        asked, 4,
        "every request for a private blob reached the master"
    );
    assert!(
        cache_file(&cache.cache_dir(), &format!("{BLOB_PREFIX}{hex}")).is_none(),
        "a private blob was stored in the cache directory"
    );
}

#[test]
fn the_hop_to_the_masters_runs_over_tls_and_admits_only_the_caches() {
    let Some(nginx) = require("nginx", "nginx", TEST) else {
        return;
    };
    // The cache's own certificate comes from the same CA as the nodes'.
    let names: Vec<String> = ["node000", "plugins-site1"].map(str::to_owned).to_vec();
    let setup = Setup::new(&names, 2, 5, 9);
    let (pki, tls) = (&setup.pki, setup.tls());
    let master = setup.master("");
    let hop = Balancer::nginx_hop(&nginx, tls, &["plugins-site1"], &master.proxy);
    let (hop_cert, hop_key) = (pki.cert("plugins-site1"), pki.key("plugins-site1"));
    let cache = Balancer::nginx_cache_over_tls(
        &nginx,
        tls,
        &[format!("127.0.0.1:{}", hop.port)],
        [hop_cert.as_path(), hop_key.as_path()],
    );

    // A node syncs through the cache and the TLS hop; the master saw its
    // certname, not the cache's.
    let home = AgentHome::with_ssldir(
        &pki.ssldir,
        "node000",
        &[format!("https://localhost:{}", cache.port)],
        "",
    );
    let run = home.sync(&[]);
    assert_converged(
        "through the TLS hop",
        std::slice::from_ref(&home),
        &[run],
        &setup.env_dir(),
    );
    let log = master.access_log();
    assert!(
        !log.is_empty() && log.iter().all(|e| e["certname"] == "node000"),
        "the master did not see node000's identity: {log:#?}"
    );

    // Straight at the hop, a node's certificate is refused, whatever
    // identity headers it sends; the cache's is admitted.
    let status = |certname: &str| {
        block_on(async {
            client(pki, Some(certname))
                .get(format!("https://localhost:{}/status/v1/simple", hop.port))
                .header("X-Client-Verify", "SUCCESS")
                .header("X-Client-DN", "CN=node000")
                .send()
                .await
                .expect("a request to the hop")
                .status()
                .as_u16()
        })
    };
    assert_eq!(
        status("node000"),
        403,
        "a node's certificate passed the hop"
    );
    assert_eq!(
        status("plugins-site1"),
        200,
        "the cache's certificate was refused"
    );
    assert_eq!(
        master.access_log().len(),
        log.len() + 1,
        "a refused request reached the master"
    );
}

/// Attack (b) under `[trust]` (docs/trust.md#threat-model): the cache
/// serves a tampered manifest, then a tampered blob, edited in its
/// directory. A node with `[trust]` and `servers = [cache]` refuses the
/// manifest with one line (a failure, nothing changed); with `servers =
/// [cache, master]` a tampered blob is caught by the per-file check and
/// fetched from the master, the node holding the signed tree.
#[test]
fn a_tampering_cache_is_refused_under_trust() {
    let Some(nginx) = require("nginx", "nginx", TEST) else {
        return;
    };
    let names: Vec<String> = (0..3).map(|i| format!("node{i:03}")).collect();
    let setup = Setup::new(&names, 2, 4, 13);
    let repo = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut signer = rt.block_on(pluginsync_tests::TufSigner::new(repo.path()));
    let toml = pluginsync_tests::config_toml(
        &setup.tree.envpath(),
        &setup.pki,
        &format!("basemodulepath = [{:?}]", setup.base.path()),
        "",
    );
    let id = signer.sign_tree(&pluginsync_tests::parse_config(&toml), "production");
    rt.block_on(signer.publish(std::time::Duration::from_secs(86400)));
    let master = setup.master(&format!("[trust]\nmetadata = {:?}\n", signer.metadata));
    let cache = Balancer::nginx_cache(&nginx, setup.tls(), std::slice::from_ref(&master.proxy));
    setup.wait_first_served(&master);
    let trust = format!("[trust]\nroot = {:?}\n", signer.root_file());
    let via = |name: &str, servers: &[String]| {
        AgentHome::with_ssldir(&setup.pki.ssldir, name, servers, &trust)
    };
    let cached = [format!("https://localhost:{}", cache.port)];
    let filled = via("node000", &cached).sync(&[]);
    assert_eq!(filled.code, 0, "{}", filled.stderr);

    // The manifest, as the cache stored it, tampered.
    let key = format!("{GENERATIONS_PREFIX}{}?environment=production", id.to_hex());
    let entry = cache_file(&cache.cache_dir(), &key).expect("the manifest is in nginx's cache");
    let stored = std::fs::read(&entry).expect("read the cache entry");
    corrupt_body(&entry);
    let victim = via("node001", &cached);
    let before = node_state(&victim);
    let refused = victim.sync(&[]);
    let lines: Vec<&str> = refused.stderr.lines().collect();
    // Refused before the signed metadata is even asked: its sha256 is
    // not the generation id the master's per-node answer named.
    assert!(
        ![0, 2, 75].contains(&refused.code)
            && lines.len() == 1
            && lines[0].contains("refused: manifest does not match generation"),
        "the tampered manifest was not refused with one line: {refused:?}"
    );
    assert!(
        node_state(&victim) == before,
        "a refused run changed the node"
    );
    std::fs::write(&entry, stored).expect("restore the entry");

    // A blob, as the cache stored it, tampered: caught by its digest; the
    // master after the cache serves it.
    let text = std::fs::read_to_string(&setup.libs[0]).expect("a lib file");
    let blob = format!("{BLOB_PREFIX}{}", sha256_hex(text.as_bytes()));
    let entry = cache_file(&cache.cache_dir(), &blob).expect("the blob is in nginx's cache");
    corrupt_body(&entry);
    let both = via("node002", &[cached[0].clone(), master.tls_url()]);
    let run = both.sync(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("does not match its listed checksum"),
        "{}",
        run.stderr
    );
    assert!(
        node_state(&both) == served_state(&setup.env_dir()),
        "the node does not hold the signed tree"
    );
}
