//! Generations on the master (docs/protocol.md §7.6,
//! docs/deploys.md#generations): the per-node answer and the manifests,
//! a kept generation served byte for byte after its tree is deleted and
//! after a restart, one id for one tree on every replica, the store holding
//! identical files once, immutable answers public or private, and a 304
//! for an unchanged per-node answer.

use std::path::Path;
use std::time::Duration;

use pluginsync_common::generation::{
    Assignment, EntryKind, GenerationId, Manifest, ManifestDelta, assignment_url, manifest_url,
};
use pluginsync_common::protocol;
use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, config_file, config_toml, wait_for};

/// Long enough for any bounded wait here on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// A GET's status, headers and body.
async fn get(
    c: &reqwest::Client,
    url: &str,
    inm: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut r = c.get(url);
    if let Some(tag) = inm {
        r = r.header("If-None-Match", tag);
    }
    let resp = r.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.expect("body").to_vec())
}

/// The per-node answer for `env`, once the master has one.
async fn assigned(c: &reqwest::Client, base: &str, env: &str) -> Assignment {
    let got = wait_for(PATIENCE, || {
        let (c, url) = (c.clone(), assignment_url(base, env));
        async move {
            let (s, _, body) = get(&c, &url, None).await;
            (s == 200).then(|| serde_json::from_slice::<Assignment>(&body).expect("JSON"))
        }
    })
    .await;
    got.expect("the master answers the assignment")
}

/// Waits until `env`'s assignment names another generation than `old`.
async fn assigned_other(
    c: &reqwest::Client,
    base: &str,
    env: &str,
    old: GenerationId,
) -> Assignment {
    let got = wait_for(PATIENCE, || {
        let (c, base) = (c.clone(), base.to_owned());
        async move {
            let a = assigned(&c, &base, env).await;
            (a.generation != old).then_some(a)
        }
    })
    .await;
    got.expect("a new generation was published")
}

/// Generation `id`'s manifest bytes as served, checked against its id.
async fn manifest(c: &reqwest::Client, base: &str, env: &str, id: &GenerationId) -> Vec<u8> {
    let (s, h, body) = get(c, &manifest_url(base, env, id, None), None).await;
    assert_eq!(s, 200, "manifest {id}: {}", String::from_utf8_lossy(&body));
    assert_eq!(h[protocol::HEADER_GENERATION], id.to_hex().as_str());
    assert_eq!(h["content-type"], protocol::MANIFEST_MEDIA_TYPE);
    Manifest::parse(&body, id).expect("the manifest proves itself");
    body
}

/// Every file of `m` fetched by digest from `base`: (path, bytes).
async fn blobs(c: &reqwest::Client, base: &str, m: &Manifest) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in m.entries() {
        if let EntryKind::File { sha256, .. } = e.kind {
            let (s, _, body) =
                get(c, &format!("{base}{}{sha256}", protocol::BLOB_PREFIX), None).await;
            assert_eq!(s, 200, "blob of {}", e.path);
            out.push((format!("{}/{}", e.mount, e.path), body));
        }
    }
    out
}

/// A release of `production` under `releases/<n>`: a plugin and a fact.
fn release(releases: &Path, n: &str, plugin: &str) {
    let m = releases.join(n).join("modules/app");
    std::fs::create_dir_all(m.join("lib/facter")).unwrap();
    std::fs::create_dir_all(m.join("facts.d")).unwrap();
    std::fs::write(m.join("lib/facter/app.rb"), plugin).unwrap();
    std::fs::write(m.join("facts.d/site.txt"), "site=one\n").unwrap();
}

/// Points `link` at `target` atomically, as Code Manager does.
fn flip(link: &Path, target: &Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// Code Manager's deploy: release 2 written, the link flipped, release 1
/// deleted. The first generation's manifest and blobs are still served
/// byte for byte, as a delta to the second too, and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_outlives_its_tree_and_a_restart() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let releases = tree.outside().join("releases");
    release(&releases, "1", "# release 1\n");
    let link = tree.envpath().join("production");
    std::os::unix::fs::symlink(releases.join("1"), &link).unwrap();
    let store = tree.outside().join("generations");
    let tables = format!("[generations]\ndir = {store:?}\n");
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", &tables));
    let c = client(&pki, Some("node1"));

    let master = MasterProcess::spawn(&cfg);
    let first = assigned(&c, &master.url(), "production").await;
    assert_eq!((first.files, first.bytes), (2, 12 + 9));
    let first_manifest = manifest(&c, &master.url(), "production", &first.generation).await;
    let parsed = Manifest::parse(&first_manifest, &first.generation).unwrap();
    let first_blobs = blobs(&c, &master.url(), &parsed).await;
    assert!(
        first_blobs.contains(&("plugins/facter/app.rb".into(), b"# release 1\n".to_vec())),
        "{first_blobs:?}"
    );

    release(&releases, "2", "# release 2, longer\n");
    flip(&link, &releases.join("2"));
    std::fs::remove_dir_all(releases.join("1")).unwrap();
    let second = assigned_other(&c, &master.url(), "production", first.generation).await;

    let kept = Kept {
        first: &first,
        second: &second,
        manifest: &first_manifest,
        parsed: &parsed,
        blobs: &first_blobs,
    };
    kept.still_served(&c, &master.url(), "after the deletion")
        .await;
    drop(master);
    let master = MasterProcess::spawn(&cfg);
    assert_eq!(
        assigned(&c, &master.url(), "production").await.generation,
        second.generation
    );
    kept.still_served(&c, &master.url(), "after a restart")
        .await;
    // A generation never kept: 404.
    let unknown = GenerationId(pluginsync_common::digest::Sha256::of(b"no such generation"));
    let (s, _, _) = get(
        &c,
        &manifest_url(&master.url(), "production", &unknown, None),
        None,
    )
    .await;
    assert_eq!(s, 404);
}

/// What a master must still serve of a first generation once a second
/// replaced it and its tree is gone.
struct Kept<'a> {
    first: &'a Assignment,
    second: &'a Assignment,
    manifest: &'a [u8],
    parsed: &'a Manifest,
    blobs: &'a [(String, Vec<u8>)],
}

impl Kept<'_> {
    async fn still_served(&self, c: &reqwest::Client, base: &str, when: &str) {
        let (first, second) = (self.first.generation, self.second.generation);
        assert_eq!(
            manifest(c, base, "production", &first).await,
            self.manifest,
            "{when}"
        );
        assert_eq!(blobs(c, base, self.parsed).await, self.blobs, "{when}");
        // The second as a delta from the first: applied, it is the second.
        let url = manifest_url(base, "production", &second, Some(&first));
        let (s, h, body) = get(c, &url, None).await;
        assert_eq!(s, 200, "{when}");
        assert_eq!(
            h["content-type"],
            protocol::MANIFEST_DELTA_MEDIA_TYPE,
            "{when}"
        );
        let delta = ManifestDelta::parse(&body).unwrap();
        let (_, bytes) = delta.apply(self.parsed, first).unwrap();
        assert_eq!(
            bytes,
            manifest(c, base, "production", &second).await,
            "{when}"
        );
    }
}
