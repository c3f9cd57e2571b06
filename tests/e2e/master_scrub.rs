//! The background scrub of the generation store (docs/deploys.md#scrubbing-the-store),
//! through a real master process with `scrub_interval = "1s"`: a kept blob
//! rewritten in the store is found within a bounded time, logged in one
//! line naming the file (never its bytes), copied again from the tree, and
//! a stock agent's `file_content` is the file's bytes again; a blob whose
//! bytes no tree holds any more has its generation withdrawn; both are
//! counted in the metrics.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::digest::Sha256;
use pluginsync_tests::{ChildMaster, EnvTree, Pki, client, config_file, config_toml, wait_for};

/// Long enough for any bounded wait here on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// A stock agent's `file_content` of `plugins/facter/<name>`: status, body.
async fn stock_content(pki: &Pki, url: &str, name: &str) -> (u16, Vec<u8>) {
    let r = client(pki, Some("node1"))
        .get(format!(
            "{url}/puppet/v3/file_content/plugins/facter/{name}?environment=production"
        ))
        .header("User-Agent", "Puppet/7.23.0 Ruby/3.1.2-p20 (x86_64-linux)")
        .send()
        .await
        .expect("request");
    (r.status().as_u16(), r.bytes().await.expect("body").to_vec())
}

/// The blob of `content` in the store at `store`.
fn blob(store: &Path, content: &str) -> PathBuf {
    let hex = Sha256::of(content.as_bytes()).to_hex();
    store.join("blobs").join(&hex[..2]).join(hex)
}

/// Rewrites the sealed file `path` with `bytes`.
fn rewrite(path: &Path, bytes: &str) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The value of the series `name` in the master's metrics.
async fn series(master: &ChildMaster, name: &str) -> Option<u64> {
    let text = reqwest::get(format!("http://{}/metrics", master.metrics_addr()))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_rewritten_in_the_store_is_found_and_repaired_or_its_generation_withdrawn() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/a.rb", "# a\n", 0o644);
    tree.file("production", "alpha", "lib/facter/b.rb", "# b\n", 0o644);
    let store = tree.outside().join("generations");
    let tables = format!(
        "[generations]\ndir = {store:?}\nscrub_interval = \"1s\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n"
    );
    let (_cfg_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", &tables));
    let master = ChildMaster::spawn(&cfg, None);
    let url = master.url();
    let served = |name: &'static str, want: &'static str| {
        let (pki, url) = (&pki, &url);
        async move {
            wait_for(PATIENCE, || async {
                (stock_content(pki, url, name).await == (200, want.as_bytes().to_vec()))
                    .then_some(())
            })
            .await
            .is_some()
        }
    };
    assert!(served("a.rb", "# a\n").await, "{}", master.log());

    // Repaired from the tree, which still holds the bytes.
    let a = blob(&store, "# a\n");
    rewrite(&a, "# EVIL-BYTES\n");
    let line = corrupt_line(&master, &a).await;
    assert!(
        line.contains("copied again from") && !line.contains("EVIL"),
        "{line}"
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "# a\n");
    assert!(served("a.rb", "# a\n").await, "{}", master.log());
    let corrupt = "pluginsync_master_generation_store_corrupt_total";
    assert_eq!(series(&master, corrupt).await, Some(1));
    let scrubbed = "pluginsync_master_generation_store_scrubbed_bytes_total";
    assert!(series(&master, scrubbed).await.unwrap_or(0) > 0);

    // The tree moved on: the old generation's blob is in no tree, so the
    // generation naming it is withdrawn and the blob never served again.
    tree.file("production", "alpha", "lib/facter/b.rb", "# b two\n", 0o644);
    assert!(served("b.rb", "# b two\n").await, "{}", master.log());
    let kept = "pluginsync_master_generations_kept{environment=\"production\"}";
    assert_eq!(series(&master, kept).await, Some(2));
    let b = blob(&store, "# b\n");
    rewrite(&b, "# EVIL-BYTES\n");
    let line = corrupt_line(&master, &b).await;
    assert!(
        line.contains("generations withdrawn: production ") && !line.contains("EVIL"),
        "{line}"
    );
    assert!(!b.exists(), "the corrupt blob is gone");
    assert_eq!(series(&master, kept).await, Some(1));
    assert_eq!(series(&master, corrupt).await, Some(2));
    assert!(served("b.rb", "# b two\n").await);
}

/// The master's log line saying the scrub found `path` corrupt, once it
/// has said so (within [`PATIENCE`]).
async fn corrupt_line(master: &ChildMaster, path: &Path) -> String {
    let said = format!("{} was corrupt", path.display());
    let found = wait_for(PATIENCE, || async {
        master
            .log()
            .lines()
            .find(|l| l.contains(&said))
            .map(str::to_owned)
    })
    .await;
    found.unwrap_or_else(|| panic!("no {said:?} in\n{}", master.log()))
}
