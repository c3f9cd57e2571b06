//! Signed generations (docs/trust.md): the manifest the deploy pipeline
//! signs is the one the masters serve.

use pluginsync_common::generation::{Assignment, assignment_url, manifest_url};
use pluginsync_tests::{
    EnvTree, Pki, TestMaster, bin_path, client, config_file, config_toml, parse_config, sha256_hex,
    wait_for,
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
    let url = assignment_url(&m.url(), "production");
    let served = wait_for(std::time::Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            serde_json::from_slice::<Assignment>(&r.bytes().await.ok()?).ok()
        }
    })
    .await
    .expect("the master answers the assignment");
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
