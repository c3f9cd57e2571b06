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
use pluginsync_tests::{
    EnvTree, MasterProcess, Pki, TestMaster, bin_path, client, config_file, config_toml,
    parse_config, wait_for,
};

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
    kept.bundles(&cfg, tree.outside().as_path());
    // `check` lists both, newest first, the current one marked.
    let check = std::process::Command::new(bin_path("pluginsync-master"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{text}");
    let (new, old) = (second.generation.short(), first.generation.short());
    let at = |id: &str| {
        text.find(id)
            .unwrap_or_else(|| panic!("{id} not in:\n{text}"))
    };
    assert!(at(&new) < at(&old), "{text}");
    assert!(
        text.contains("generations (2 kept, newest first):"),
        "{text}"
    );
    let line = format!(
        "{new}  {}  2 files, {} bytes  (current)",
        second.published, second.bytes
    );
    assert!(text.contains(&line), "{line} not in:\n{text}");
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
    /// `bundle --generation` of the first (by a prefix of its id), its
    /// tree gone: twice the same bytes, which read back as the first's
    /// manifest and files; an unknown id is one line and exit 66.
    fn bundles(&self, cfg: &Path, scratch: &Path) {
        let bundle = |out: &Path, id: &str| {
            std::process::Command::new(bin_path("pluginsync-master"))
                .args(["bundle", "production", "--generation", id, "--config"])
                .arg(cfg)
                .arg("--out")
                .arg(out)
                .output()
                .unwrap()
        };
        let prefix = &self.first.generation.to_hex()[..10];
        let (a, b) = (scratch.join("a.tar"), scratch.join("b.tar"));
        for out in [&a, &b] {
            let done = bundle(out, prefix);
            assert!(
                done.status.success(),
                "{}",
                String::from_utf8_lossy(&done.stderr)
            );
        }
        let bytes = std::fs::read(&a).unwrap();
        assert_eq!(
            bytes,
            std::fs::read(&b).unwrap(),
            "one generation, one bundle"
        );
        let mut contents = Vec::new();
        let read = pluginsync_common::bundle::read_bundle(&bytes[..], 1 << 20, |d, body| {
            contents.push((*d, body.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(read.manifest_bytes, self.manifest);
        assert_eq!(read.header.generation, self.first.generation);
        assert_eq!(read.header.published, self.first.published);
        let mut want: Vec<_> = self
            .blobs
            .iter()
            .map(|(_, b)| (pluginsync_common::digest::Sha256::of(b), b.clone()))
            .collect();
        want.sort();
        want.dedup();
        assert_eq!(contents, want);

        let missing = bundle(&scratch.join("c.tar"), "0123456789");
        let err = String::from_utf8_lossy(&missing.stderr);
        assert_eq!(missing.status.code(), Some(66), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("keeps no generation '0123456789'"), "{err}");
        assert!(!scratch.join("c.tar").exists());
    }

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

/// Files of a mount's listing.
async fn listed_files(c: &reqwest::Client, base: &str, mount: &str) -> usize {
    let q = crate::common::pluginsync_query("use", "follow", "production");
    let (status, _, entries) = crate::common::listing(c, base, mount, &q).await;
    assert_eq!(status, 200);
    entries
        .iter()
        .filter(|e| e.kind == pluginsync_common::metadata::FileType::File)
        .count()
}

/// Code Manager flips `production` between two releases every 100–200 ms
/// while the master re-indexes it: no published `pluginfacts` listing, and
/// no generation, ever lacks a file both releases have (a build that
/// spans a flip is not published: docs/deploys.md#consistent-builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_across_a_link_flip_is_never_published() {
    let (tree, pki, releases) = (EnvTree::new(), Pki::new(), EnvTree::new());
    releases.generate("r1", 11, 150, 7);
    releases.generate("r2", 11, 150, 7);
    releases.file("r2", "mod00", "lib/facter/only_r2.rb", "# r2\n", 0o644);
    let link = tree.envpath().join("production");
    std::os::unix::fs::symlink(releases.envpath().join("r1"), &link).unwrap();
    let facts = pluginsync_tests::merged_mount(&link, "facts.d")
        .values()
        .filter(|v| v.starts_with("file "))
        .count();
    assert!(facts >= 10, "{facts} facts");
    let m = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\npublish = \"explicit\"\nsettle = \"300ms\"\n",
    )));
    let c = client(&pki, Some("node1"));
    assert_eq!(listed_files(&c, &m.url(), "pluginfacts").await, facts);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, link, targets) = (stop.clone(), link.clone(), releases.envpath());
        std::thread::spawn(move || {
            for i in 0u64.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                flip(&link, &targets.join(if i % 2 == 0 { "r2" } else { "r1" }));
                std::thread::sleep(Duration::from_millis(100 + (i * 37) % 101));
            }
        })
    };
    let inconsistent = || {
        m.store
            .stats
            .inconsistent_builds
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..60 {
        m.store
            .reindex(Some("production".parse().unwrap()), "test")
            .await;
        assert_eq!(
            listed_files(&c, &m.url(), "pluginfacts").await,
            facts,
            "round {round}: a pluginfacts listing without files both releases have"
        );
        let a = assigned(&c, &m.url(), "production").await;
        if seen.insert(a.generation) {
            let bytes = manifest(&c, &m.url(), "production", &a.generation).await;
            let parsed = Manifest::parse(&bytes, &a.generation).unwrap();
            let files = parsed
                .mount(protocol::Mount::Pluginfacts)
                .filter(|e| matches!(e.kind, EntryKind::File { .. }))
                .count();
            assert_eq!(
                files,
                facts,
                "round {round}: generation {}",
                a.generation.short()
            );
        }
        if round >= 20 && inconsistent() >= 3 && seen.len() >= 2 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    flipper.join().unwrap();
    assert!(
        inconsistent() >= 1,
        "no build spanned a flip: the test did not test anything"
    );
    assert!(seen.len() <= 2, "more generations than releases: {seen:?}");
}

/// Bytes of the files under `dir`, recursively.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        total += if md.is_dir() {
            bytes_under(&e.path())
        } else {
            md.len()
        };
    }
    total
}

/// 20 environments, each one file apart from the others: the store holds
/// one tree plus the differences (and a manifest each); a second master on
/// the same tree names every generation the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_holds_identical_files_once() {
    const ENVS: usize = 20;
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let names: Vec<String> = (0..ENVS).map(|i| format!("env{i:02}")).collect();
    let mut diffs = 0u64;
    for name in &names {
        tree.generate(name, 4, 40, 11);
        let own = format!("# only in {name}\n");
        diffs += own.len() as u64;
        tree.file(name, "mod00", "lib/facter/own.rb", own, 0o644);
    }
    let one_tree = bytes_under(&tree.envpath().join("env00/modules")) - diffs / ENVS as u64;
    let dir = tree.outside().join("generations");
    let tables = format!("[generations]\ndir = {dir:?}\n");
    let m = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        &tables,
    )));
    let replica = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let c = client(&pki, Some("node1"));
    let mut manifests = 0u64;
    for name in &names {
        let a = assigned(&c, &m.url(), name).await;
        let b = assigned(&c, &replica.url(), name).await;
        assert_eq!(a.generation, b.generation, "{name}: one tree, one id");
        manifests += manifest(&c, &m.url(), name, &a.generation).await.len() as u64;
    }
    let stored = bytes_under(&dir.join("blobs"));
    assert_eq!(stored + manifests, m.store.generations.bytes());
    assert!(
        stored >= one_tree && stored <= one_tree + diffs,
        "{stored} bytes of blobs for a tree of {one_tree} bytes and {diffs} bytes of differences"
    );
}

/// Manifests are immutable: `public` without `[[authorization]]` rules,
/// `private` with them; the per-node answer is `private, no-cache`, a
/// revalidation with its ETag is a 304 (from a second master on the same
/// tree too), and a client a rule refuses gets 403 from both endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_answers_are_public_or_private_and_the_assignment_revalidates() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "app", "lib/facter/app.rb", "# app\n", 0o644);
    tree.file("dmz", "app", "lib/facter/dmz.rb", "# dmz\n", 0o644);
    let rules = "[[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\"]\n";
    let open = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let ruled = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let c = client(&pki, Some("node1"));
    for (m, policy) in [
        (&open, protocol::CACHE_IMMUTABLE),
        (&ruled, protocol::CACHE_IMMUTABLE_PRIVATE),
    ] {
        let (s, h, body) = get(&c, &assignment_url(&m.url(), "production"), None).await;
        assert_eq!(s, 200);
        assert_eq!(h["cache-control"], "private, no-cache");
        let a: Assignment = serde_json::from_slice(&body).unwrap();
        let url = manifest_url(&m.url(), "production", &a.generation, None);
        let (s, h, _) = get(&c, &url, None).await;
        assert_eq!((s, h["cache-control"].to_str().unwrap()), (200, policy));
        let etag = h["etag"].to_str().unwrap().to_owned();
        assert_eq!(get(&c, &url, Some(&etag)).await.0, 304);
        let sha = pluginsync_common::digest::Sha256::of(b"# app\n");
        let (s, h, _) = get(
            &c,
            &format!("{}{}{sha}", m.url(), protocol::BLOB_PREFIX),
            None,
        )
        .await;
        assert_eq!((s, h["cache-control"].to_str().unwrap()), (200, policy));
    }
    // The assignment revalidates on either master: one 304 per no-op run.
    let (_, h, _) = get(&c, &assignment_url(&open.url(), "production"), None).await;
    let etag = h["etag"].to_str().unwrap().to_owned();
    for m in [&open, &ruled] {
        let (s, h, body) = get(&c, &assignment_url(&m.url(), "production"), Some(&etag)).await;
        assert_eq!((s, body.len()), (304, 0));
        assert_eq!(h["cache-control"], "private, no-cache");
    }
    // dmz is not node1's: refused before anything is looked up.
    let (s, _, body) = get(&c, &assignment_url(&open.url(), "dmz"), None).await;
    assert_eq!(s, 200, "no rules: every environment");
    let dmz: Assignment = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        get(&c, &assignment_url(&ruled.url(), "dmz"), None).await.0,
        403
    );
    let url = manifest_url(&ruled.url(), "dmz", &dmz.generation, None);
    assert_eq!(get(&c, &url, None).await.0, 403);
}

/// A picture of a mount's files, path → sha256, from the `merged_mount`
/// or `tree_snapshot` notation (`file <mode> <sha>`).
fn shas(picture: std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    picture
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.strip_prefix("file ")?.rsplit(' ').next()?.to_owned())))
        .collect()
}

/// A Code Manager deploy (link flipped, old release deleted) lands while
/// a stock `puppet plugin download` is downloading its `pluginfacts`: the
/// run's `plugins` are still the old generation's, content included (from
/// the store: the old release is gone); the next run gets the new one
/// (docs/protocol.md §7.6: one generation per stock agent run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_agent_run_sees_one_generation() {
    const TEST: &str = "master_generations::a_stock_agent_run_sees_one_generation";
    let Some(puppet) = pluginsync_tests::require("puppet", "puppet", TEST) else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let releases = tree.outside().join("releases");
    for (n, body) in [("1", "# release 1\n"), ("2", "# release 2\n")] {
        release(&releases, n, body);
        let facts = releases.join(n).join("modules/app/facts.d");
        for i in 0..400 {
            std::fs::write(facts.join(format!("f{i:03}.txt")), format!("f{i}=1\n")).unwrap();
        }
    }
    std::fs::write(releases.join("2/modules/app/lib/facter/new.rb"), "# new\n").unwrap();
    let link = tree.envpath().join("production");
    std::os::unix::fs::symlink(releases.join("1"), &link).unwrap();
    let (old_lib, new_lib) = (
        shas(pluginsync_tests::merged_mount(&link, "lib")),
        shas(pluginsync_tests::merged_mount(&releases.join("2"), "lib")),
    );
    let m = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\npublish = \"explicit\"\n[generations]\npin = \"60s\"\n",
    )));
    let download = |certname: &str| {
        let work = tempfile::tempdir().unwrap();
        let agent = pluginsync_tests::puppet::PuppetAgent::new(
            &puppet,
            work.path(),
            &pki.ssldir,
            certname,
            m.addr.port(),
        );
        let (lib, facts) = (agent.libdir(), agent.factsdir());
        let run = tokio::task::spawn_blocking(move || agent.plugin_download("production"));
        (work, lib, facts, run)
    };

    let (_work, lib, facts, run) = download("node1");
    let mid_run = wait_for(PATIENCE, || {
        let facts = facts.clone();
        async move {
            let n = std::fs::read_dir(&facts).map_or(0, |d| d.count());
            (n >= 20).then_some(())
        }
    })
    .await;
    assert!(mid_run.is_some(), "puppet never started on its pluginfacts");
    flip(&link, &releases.join("2"));
    std::fs::remove_dir_all(releases.join("1")).unwrap();
    m.store
        .reindex(Some("production".parse().unwrap()), "test")
        .await;
    assert!(
        !lib.exists() || std::fs::read_dir(&lib).unwrap().count() == 0,
        "the deploy came after puppet's plugins: nothing was tested"
    );
    let done = run.await.unwrap();
    assert_eq!(done.code, 0, "node1: {}", done.output);
    assert_eq!(
        shas(pluginsync_tests::tree_snapshot(&lib)),
        old_lib,
        "node1"
    );

    let (_work, lib, _, run) = download("node2");
    let done = run.await.unwrap();
    assert_eq!(done.code, 0, "node2: {}", done.output);
    assert_eq!(
        shas(pluginsync_tests::tree_snapshot(&lib)),
        new_lib,
        "node2"
    );
}

/// `bundle` of the current generation with no store configured indexes the
/// tree as the master would: the generation a master serving it publishes,
/// the same bytes twice, never a publication time (the Unix epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_of_the_tree_is_the_generation_a_master_publishes() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 3, 15, 4);
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", ""));
    let m = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let served = assigned(&client(&pki, Some("node1")), &m.url(), "production").await;
    let out = tree.outside();
    let bundle = |name: &str, env: &str| {
        std::process::Command::new(bin_path("pluginsync-master"))
            .args(["bundle", env, "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(out.join(name))
            .output()
            .unwrap()
    };
    for name in ["a.tar", "b.tar"] {
        let done = bundle(name, "production");
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    let bytes = std::fs::read(out.join("a.tar")).unwrap();
    assert_eq!(bytes, std::fs::read(out.join("b.tar")).unwrap());
    let read = pluginsync_common::bundle::read_bundle(&bytes[..], 1 << 20, |_, _| Ok(())).unwrap();
    assert_eq!(read.header.generation, served.generation);
    assert_eq!(read.header.published, "1970-01-01T00:00:00Z");
    let none = bundle("c.tar", "nosuch");
    let err = String::from_utf8_lossy(&none.stderr);
    assert_eq!(
        (none.status.code(), err.trim().lines().count()),
        (Some(66), 1),
        "{err}"
    );
}

/// A store the master cannot create (here under a regular file; on a host,
/// a directory the master's user may not write) fails `check` (78) with one
/// line naming it, and `serve` exits at once with that line rather than
/// listening without a store.
#[test]
fn a_store_that_cannot_be_written_fails_check_and_serve() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 1, 2, 3);
    let file = tree.outside().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let store = file.join("generations");
    let tables = format!("[generations]\ndir = {store:?}\n");
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", &tables));
    let check = std::process::Command::new(bin_path("pluginsync-master"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(78), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("generation store {}", store.display())),
        "{err}"
    );
    let mut serve = std::process::Command::new(bin_path("pluginsync-master"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = serve.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            serve.kill().ok();
            panic!("serve kept running without a store");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("generation store"), "{err}");
}

/// The store is the master user's (docs/deploys.md#generations): after a
/// master filled it, nothing in it is open to other users, and `check`
/// warns about a root an operator opened. `check --store`
/// (docs/deploys.md#scrubbing-the-store) passes a sound store and names a
/// blob rewritten in place, exit 78.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_private_and_check_store_finds_a_rewritten_blob() {
    use std::os::unix::fs::PermissionsExt;
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/a.rb", "# a\n", 0o644);
    let store = tree.outside().join("generations");
    let tables = format!("[generations]\ndir = {store:?}\n");
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", &tables));
    let master = MasterProcess::spawn(&cfg);
    let c = client(&pki, Some("node1"));
    assigned(&c, &master.url(), "production").await;
    drop(master);
    let mut blobs = Vec::new();
    for e in walkdir_all(&store) {
        let mode = std::fs::symlink_metadata(&e).unwrap().permissions().mode();
        assert_eq!(mode & 0o027, 0, "{} is {mode:o}", e.display());
        if e.parent().and_then(|p| p.parent()) == Some(&store.join("blobs")) {
            blobs.push(e);
        }
    }
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin_path("pluginsync-master"))
            .args(args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            text + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = run(&["check", "--store"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("{} blobs", blobs.len())), "{text}");
    let (code, text) = run(&["check"]);
    assert!(code == Some(0) && !text.contains("is mode"), "{text}");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, text) = run(&["check"]);
    assert!(text.contains("is mode 0755"), "{text}");
    let blob = &blobs[0];
    std::fs::set_permissions(blob, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(blob, "rewritten").unwrap();
    let (code, text) = run(&["check", "--store"]);
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains(&format!("corrupt: {}", blob.display())),
        "{text}"
    );
}

/// Every path under `root`, depth first.
fn walkdir_all(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walkdir_all(&p));
        }
        out.push(p);
    }
    out
}
