//! Signed generations (docs/trust.md): the manifest the deploy pipeline
//! signs is the one the masters serve; TUF metadata made by the tests'
//! signer with `tough`'s editor, verified as a node verifies it, on disk
//! and through a master: what is accepted, and each attack refused with
//! one line naming it.

use std::path::Path;
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{Assignment, GenerationId, assignment_url, manifest_url};
use pluginsync_common::trust::{self, Expiry};
use pluginsync_tests::{
    EnvTree, Pki, TestMaster, TufSigner, bin_path, client, config_file, config_toml, parse_config,
    sha256_hex, wait_for,
};

/// `pluginsync-master manifest ENV` prints the manifest of the tree as it
/// is: its sha256 is the generation id the running master serves, its
/// bytes the manifest it serves; an unknown environment exits 66 with one
/// line and prints nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_command_prints_what_the_master_serves() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 3, 15, 4);
    let toml = config_toml(&tree.envpath(), &pki, "", "");
    let (_cfg_dir, cfg) = config_file(&toml);
    let m = TestMaster::start(parse_config(&toml));
    let c = client(&pki, Some("node1"));
    let served = assigned(&c, &m.url()).await;
    let manifest = |env: &str| {
        std::process::Command::new(bin_path("pluginsync-master"))
            .args(["manifest", env, "--config"])
            .arg(&cfg)
            .output()
            .unwrap()
    };
    let printed = manifest("production");
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert_eq!(
        sha256_hex(&printed.stdout),
        served.generation.to_hex(),
        "the printed manifest's sha256 is the generation id served"
    );
    let url = manifest_url(&m.url(), "production", &served.generation, None);
    let body = c.get(&url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(
        printed.stdout,
        body.to_vec(),
        "byte for byte what is served"
    );
    let none = manifest("nosuch");
    let err = String::from_utf8_lossy(&none.stderr);
    assert_eq!(
        (
            none.status.code(),
            err.trim().lines().count(),
            none.stdout.len()
        ),
        (Some(66), 1, 0),
        "{err}"
    );
}

/// A node's view of the signed metadata in `signer.metadata`, its
/// datastore in `node`: what the agent will load before staging.
async fn load(
    signer: &TufSigner,
    node: &Path,
    expiry: Expiry,
) -> Result<trust::Trusted, trust::TrustError> {
    let url = url::Url::from_directory_path(&signer.metadata).unwrap();
    trust::load(
        &signer.root_file(),
        &node.join("trust"),
        url,
        tough::FilesystemTransport,
        expiry,
    )
    .await
}

const STRICT: Expiry = Expiry {
    grace: Duration::ZERO,
    ignore: false,
};
const DAY: Duration = Duration::from_secs(86400);

/// A manifest's bytes and what the node checks of it.
fn manifest(n: u8) -> (Vec<u8>, GenerationId) {
    let bytes = format!("pluginsync-manifest 1\nfake {n}\n").into_bytes();
    let id = GenerationId::of(&bytes);
    (bytes, id)
}

/// A signed manifest is accepted; another generation, a manifest of
/// another length, another environment are refused, each naming what.
#[tokio::test]
async fn only_a_signed_manifest_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let ((m1, id1), (_, id2)) = (manifest(1), manifest(2));
    signer.sign_manifest("production", &m1);
    signer.publish(DAY).await;
    let prod: EnvName = "production".parse().unwrap();
    let t = load(&signer, dir.path(), STRICT).await.expect("trusted");
    t.check(&prod, &id1, m1.len() as u64).expect("signed");
    assert_eq!(t.signed(&prod), vec![id1]);
    let unsigned = t.check(&prod, &id2, 10).unwrap_err().to_string();
    assert!(unsigned.contains("is not signed"), "{unsigned}");
    let longer = t.check(&prod, &id1, m1.len() as u64 + 1).unwrap_err();
    assert!(
        longer
            .to_string()
            .contains("does not match its signed target")
    );
    let other = t.check(&"staging".parse().unwrap(), &id1, m1.len() as u64);
    assert!(other.unwrap_err().to_string().contains("is not signed"));
}

/// Metadata older than the node saw is refused (rollback), and a
/// generation the signers withdrew is refused even when its old, signed
/// metadata is still served beside the new.
#[tokio::test]
async fn older_metadata_and_withdrawn_generations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let (m1, id1) = manifest(1);
    let name = signer.sign_manifest("production", &m1);
    signer.publish(DAY).await;
    let old = dir.path().join("old");
    copy_dir(&signer.metadata, &old);
    signer.withdraw(&name);
    signer.publish(DAY).await;
    let prod: EnvName = "production".parse().unwrap();
    let t = load(&signer, dir.path(), STRICT).await.expect("trusted");
    assert_eq!(t.versions()[1..], [2, 2, 2]);
    let withdrawn = t.check(&prod, &id1, m1.len() as u64).unwrap_err();
    assert!(withdrawn.to_string().contains("withdrawn"), "{withdrawn}");
    // A master replays the first timestamp (the one that signed it).
    copy_dir(&old, &signer.metadata);
    let replayed = load(&signer, dir.path(), STRICT).await.unwrap_err();
    assert!(
        matches!(replayed, trust::TrustError::Rollback(_)),
        "{replayed}"
    );
    assert_eq!(replayed.to_string().lines().count(), 1);
}

/// A timestamp past its expiry is refused (freeze), unless within the
/// grace or expiry is explicitly ignored (air-gapped bundles).
#[tokio::test]
async fn an_expired_timestamp_is_refused_unless_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    signer.sign_manifest("production", &manifest(1).0);
    signer.publish(Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let frozen = load(&signer, dir.path(), STRICT).await.unwrap_err();
    assert!(
        frozen
            .to_string()
            .starts_with("freeze refused: the timestamp metadata expired at"),
        "{frozen}"
    );
    let grace = Expiry {
        grace: Duration::from_secs(3600),
        ignore: false,
    };
    load(&signer, dir.path(), grace)
        .await
        .expect("within the grace");
    let ignored = Expiry {
        grace: Duration::ZERO,
        ignore: true,
    };
    load(&signer, dir.path(), ignored).await.expect("ignored");
}

/// The targets key rotated out by root version 2: the node, installed
/// with version 1, follows the chain and accepts the new key's targets;
/// targets forged with the old key are refused, even once the masters
/// stop serving `2.root.json` (the node keeps the newest root it trusted).
/// A `3.root.json` signed by one root key of three does not verify.
#[tokio::test]
async fn a_rotated_out_targets_key_is_refused_and_the_root_chain_must_verify() {
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let (m1, id1) = manifest(1);
    signer.sign_manifest("production", &m1);
    signer.publish(DAY).await;
    load(&signer, dir.path(), STRICT).await.expect("v1");
    let old_key = signer.rotate_targets_key().await;
    signer.publish(DAY).await;
    let prod: EnvName = "production".parse().unwrap();
    let t = load(&signer, dir.path(), STRICT).await.expect("followed");
    assert_eq!(t.versions()[0], 2, "the node follows the root chain");
    t.check(&prod, &id1, m1.len() as u64)
        .expect("new key's target");
    signer.forge_with(old_key);
    signer.publish(DAY).await;
    std::fs::remove_file(signer.metadata.join("2.root.json")).unwrap();
    let forged = load(&signer, dir.path(), STRICT).await.unwrap_err();
    assert!(
        matches!(forged, trust::TrustError::Signature(_)),
        "{forged}"
    );
    // A root version 3 with one of the two signatures it needs dropped.
    let v2 = dir.path().join("v2.root.json");
    let mut root: serde_json::Value =
        serde_json::from_slice(&std::fs::read(signer.metadata.join("1.root.json")).unwrap())
            .unwrap();
    root["signed"]["version"] = serde_json::json!(2);
    root["signatures"].as_array_mut().unwrap().truncate(1);
    std::fs::write(&v2, serde_json::to_vec(&root).unwrap()).unwrap();
    let fresh = dir.path().join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::copy(&v2, signer.metadata.join("2.root.json")).unwrap();
    let broken = load(&signer, &fresh, STRICT).await.unwrap_err();
    assert!(
        matches!(broken, trust::TrustError::Signature(_)),
        "{broken}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A master with `[trust] metadata` carries what the pipeline signed: the
/// timestamp revalidated (an ETag, 304), versioned files immutable, no
/// other name served; a node loads the repository through it over mTLS
/// and trusts the generation the master serves once it is signed, and not
/// after the signers withdraw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_carries_the_metadata_and_a_node_verifies_through_it() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 3);
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let tables = format!("[trust]\nmetadata = {:?}\n", signer.metadata);
    let m = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        &tables,
    )));
    let c = client(&pki, Some("node1"));
    let served = assigned(&c, &m.url()).await;
    let url = manifest_url(&m.url(), "production", &served.generation, None);
    let bytes = c.get(&url).send().await.unwrap().bytes().await.unwrap();
    let name = signer.sign_manifest("production", &bytes);
    signer.publish(DAY).await;

    let base = format!("{}{}", m.url(), trust::METADATA_PREFIX);
    let ts = c.get(format!("{base}timestamp.json")).send().await.unwrap();
    assert_eq!(
        (
            ts.status().as_u16(),
            ts.headers()["cache-control"].to_str().unwrap()
        ),
        (200, "no-cache")
    );
    let tag = ts.headers()["etag"].clone();
    let again = c
        .get(format!("{base}timestamp.json"))
        .header("If-None-Match", tag);
    assert_eq!(again.send().await.unwrap().status().as_u16(), 304);
    let root = c.get(format!("{base}1.root.json")).send().await.unwrap();
    assert!(
        root.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("immutable")
    );
    for bad in ["root.json", "..%2F1.root.json", "1.root.json.bak", "keys"] {
        let r = c.get(format!("{base}{bad}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "{bad}");
    }

    let node = tempfile::tempdir().unwrap();
    let prod: EnvName = "production".parse().unwrap();
    let root = signer.root_file();
    let over_master = |node: &Path| {
        let (root, store, url) = (
            root.clone(),
            node.join("trust"),
            url::Url::parse(&base).unwrap(),
        );
        let files = node.join("trust/files");
        let transport = pluginsync_agent::trust::MasterTransport::new(c.clone(), files);
        async move { trust::load(&root, &store, url, transport, STRICT).await }
    };
    let t = over_master(node.path())
        .await
        .expect("verified through the master");
    t.check(&prod, &served.generation, bytes.len() as u64)
        .expect("the served generation is signed");
    signer.withdraw(&name);
    signer.publish(DAY).await;
    let t = over_master(node.path())
        .await
        .expect("verified through the master");
    let withdrawn = t.check(&prod, &served.generation, bytes.len() as u64);
    assert!(withdrawn.unwrap_err().to_string().contains("withdrawn"));
}

/// The per-node answer for `production`, once the master has one.
async fn assigned(c: &reqwest::Client, base: &str) -> Assignment {
    let url = assignment_url(base, "production");
    wait_for(Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            serde_json::from_slice::<Assignment>(&r.bytes().await.ok()?).ok()
        }
    })
    .await
    .expect("the master answers the assignment")
}
