//! Puppet compatibility by a real client: a
//! stock `puppet plugin download` (Debian's `puppet` 7.x) pluginsyncs from
//! our master; its libdir and facts.d end identical to the environment's
//! merged mounts (content, and modes for facts.d), computed here
//! independently of the master's code.
//!
//! The same stock agent against the control-repository fixture
//! (docs/master.md#code-trees-as-r10k-and-code-manager-deploy-them:
//! `environment.conf`, site-modules before modules, a glob, a missing entry,
//! `$basemodulepath`): libdir and facts.d end as the fixture says, the site
//! module's fact and executable external fact included.
//!
//! Each scenario runs twice: as is, and with `[trust] root` on the master,
//! every tree it deploys signed by the emulated pipeline (`Signing`,
//! docs/trust.md#publishing-only-signed-generations).
//!
//! Skipped with a message when `puppet` is not installed, except under CI
//! (`CI` set), where `.ci/run` installs it and a missing agent is a failure.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use pluginsync_tests::puppet::PuppetAgent;
use pluginsync_tests::{
    ControlRepo, EnvTree, Pki, Signing, TestMaster, client, config_toml, parse_config, require,
    tree_snapshot, wait_for,
};

/// The harness's independent merged mount, with or without modes (Puppet
/// applies source modes only to facts.d: docs/protocol.md §4.5).
fn expected_mount(env_dir: &Path, subdir: &str, modes: bool) -> BTreeMap<String, String> {
    pluginsync_tests::merged_mount(env_dir, subdir)
        .into_iter()
        .map(|(k, v)| (k, notation(&v, modes)))
        .collect()
}

/// What puppet left on disk, in the same notation.
fn actual(dir: &Path, modes: bool) -> BTreeMap<String, String> {
    tree_snapshot(dir)
        .into_iter()
        .map(|(k, v)| (k, notation(&v, modes)))
        .collect()
}

/// `dir <mode>` / `file <mode> <sha>` → the same without modes, if asked.
fn notation(v: &str, modes: bool) -> String {
    let parts: Vec<&str> = v.split(' ').collect();
    match (parts[0], modes) {
        (_, true) => v.to_owned(),
        ("dir", false) => "dir".to_owned(),
        ("file", false) => format!("file {}", parts[2]),
        (other, _) => format!("unexpected {other}"),
    }
}

fn tree() -> EnvTree {
    let t = EnvTree::new();
    t.generate("production", 6, 20, 5);
    t.file(
        "production",
        "alpha",
        "lib/facter/common.rb",
        "# alpha wins\n",
        0o644,
    );
    t.file(
        "production",
        "beta",
        "lib/facter/common.rb",
        "# beta is hidden\n",
        0o644,
    );
    t.file(
        "production",
        "alpha",
        "lib/facter/with space ünï.rb",
        "# odd name\n",
        0o644,
    );
    t.file("production", "alpha", "lib/.git/HEAD", "ref: x\n", 0o644);
    t.dir("production", "alpha", "facts.d", 0o755);
    t.file(
        "production",
        "alpha",
        "facts.d/exec_fact.sh",
        "#!/bin/sh\necho alpha=1\n",
        0o755,
    );
    t.file(
        "production",
        "alpha",
        "facts.d/static.yaml",
        "a: 1\n",
        0o640,
    );
    t.file("production", "beta", "facts.d/private.txt", "b=2\n", 0o600);
    t.file(
        "production",
        "beta",
        "facts.d/exec_fact.sh",
        "#!/bin/sh\necho hidden=1\n",
        0o700,
    );
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_puppet_plugin_download_syncs_from_our_master() {
    plugin_download_syncs(false).await;
}

/// The same scenario with `[trust] root` on the master, every tree the
/// test deploys signed by the emulated pipeline (`Signing`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_puppet_plugin_download_syncs_signed_trees() {
    plugin_download_syncs(true).await;
}

async fn plugin_download_syncs(trust: bool) {
    let Some(puppet) = require("puppet", "puppet", "puppet_compat") else {
        return;
    };
    let (tree, pki) = (tree(), Pki::new());
    let toml = config_toml(&tree.envpath(), &pki, "", "");
    let signing = Signing::new(trust, &toml, &["production"]);
    let master = TestMaster::start(parse_config(&(toml + &signing.master_tables())));
    let work = tempfile::tempdir().unwrap();
    let env_dir = tree.envpath().join("production");
    let agent = std::sync::Arc::new(PuppetAgent::new(
        &puppet,
        work.path(),
        &pki.ssldir,
        "node1",
        master.addr.port(),
    ));
    let (lib, facts) = (agent.libdir(), agent.factsdir());

    let run = |env: &'static str| {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            let r = agent.plugin_download(env);
            (r.code, r.output)
        })
    };

    let (code, out) = run("production").await.unwrap();
    assert_eq!(code, 0, "puppet plugin download failed:\n{out}");
    assert!(out.contains("Downloaded these plugins"), "{out}");
    assert_eq!(
        actual(&lib, false),
        expected_mount(&env_dir, "lib", false),
        "libdir differs from the merged plugins mount"
    );
    assert_eq!(
        actual(&facts, true),
        expected_mount(&env_dir, "facts.d", true),
        "facts.d differs (content or modes)"
    );
    assert!(
        std::fs::read_to_string(lib.join("facter/common.rb"))
            .unwrap()
            .contains("alpha wins")
    );

    // A second run changes nothing.
    let (code, out) = run("production").await.unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("No plugins downloaded"), "{out}");

    // Change, add and remove on the master; once the index has caught up,
    // puppet converges and purges.
    tree.file(
        "production",
        "alpha",
        "lib/facter/common.rb",
        "# alpha changed\n",
        0o644,
    );
    tree.file("production", "gamma", "lib/facter/new.rb", "# new\n", 0o644);
    tree.file(
        "production",
        "gamma",
        "facts.d/new.sh",
        "#!/bin/sh\necho g=1\n",
        0o750,
    );
    std::fs::remove_file(
        tree.module("production", "alpha")
            .join("lib/facter/with space ünï.rb"),
    )
    .unwrap();
    let c = client(&pki, Some("node1"));
    let url = master.url();
    let caught_up = wait_for(Duration::from_secs(5), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let body = c
                .get(format!(
                    "{url}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production"
                ))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (body.contains("facter/new.rb") && !body.contains("with space")).then_some(())
        }
    })
    .await;
    assert!(caught_up.is_some(), "master did not pick up the change");
    let (code, out) = run("production").await.unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(actual(&lib, false), expected_mount(&env_dir, "lib", false));
    assert_eq!(
        actual(&facts, true),
        expected_mount(&env_dir, "facts.d", true)
    );
    assert!(!lib.join("facter/with space ünï.rb").exists(), "purged");

    // An unknown environment fails and touches nothing.
    let before = (tree_snapshot(&lib), tree_snapshot(&facts));
    let (code, out) = run("nosuchenv").await.unwrap();
    assert_ne!(code, 0, "{out}");
    assert_eq!((tree_snapshot(&lib), tree_snapshot(&facts)), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_puppet_plugin_download_syncs_a_control_repo() {
    control_repo_syncs(false).await;
}

/// The same with `[trust] root` on the master, the tree signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_puppet_plugin_download_syncs_a_signed_control_repo() {
    control_repo_syncs(true).await;
}

async fn control_repo_syncs(trust: bool) {
    let Some(puppet) = require("puppet", "puppet", "puppet_compat") else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let base = tree.outside().join("base");
    ControlRepo::write(&tree.envpath().join("production"), &base);
    let toml = config_toml(
        &tree.envpath(),
        &pki,
        &format!("basemodulepath = [{base:?}]"),
        "",
    );
    let signing = Signing::new(trust, &toml, &["production"]);
    let master = TestMaster::start(parse_config(&(toml + &signing.master_tables())));
    let work = tempfile::tempdir().unwrap();
    let agent = std::sync::Arc::new(PuppetAgent::new(
        &puppet,
        work.path(),
        &pki.ssldir,
        "node1",
        master.addr.port(),
    ));
    let run = {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || agent.plugin_download("production"))
            .await
            .unwrap()
    };
    assert_eq!(
        run.code, 0,
        "puppet plugin download failed:\n{}",
        run.output
    );
    assert_eq!(
        actual(&agent.libdir(), false),
        ControlRepo::expected("lib", false),
        "libdir is not the first-wins union over the effective modulepath"
    );
    let facts = tree_snapshot(&agent.factsdir());
    assert_eq!(
        facts,
        ControlRepo::expected("facts.d", true),
        "facts.d differs (content or modes)"
    );
    // The site module's executable external fact runs.
    let out = std::process::Command::new(agent.factsdir().join("site_env.sh"))
        .output()
        .expect("run the external fact");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "site_env=control\n");
}
