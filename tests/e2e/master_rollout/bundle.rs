//! `pluginsync-master bundle` respects placement (docs/master.md,
//! docs/rollouts.md#placement): during a 20 % first wave it writes the
//! generation everyone is on and says why; `--generation` writes the one
//! asked for; `--certname` the one that node is placed on. Run both ways:
//! as is, and with `[trust] root` on the master, every tree signed by the
//! emulated pipeline (`Signing`), the bundles then signed (format 2).

use super::*;

/// `pluginsync-master bundle production ARGS --out OUT`: its stdout and
/// the generation the bundle holds.
fn bundle(cfg: &Path, out: &Path, args: &[&str]) -> (String, String) {
    let done = Command::new(bin_path("pluginsync-master"))
        .args(["bundle", "production", "--config"])
        .arg(cfg)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(
        done.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let bytes = std::fs::read(out).unwrap();
    let read = pluginsync_common::bundle::read_bundle(&bytes[..], 1 << 20, |_, _| Ok(())).unwrap();
    (stdout, read.header.generation.to_hex())
}

/// The first certname of `node000…` inside (or outside) a 20 % wave.
fn one(inside: bool) -> String {
    (0..)
        .map(|n| format!("node{n:03}.example.org"))
        .find(|n| in_share(position("production", n), 20.0) == inside)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_during_a_first_wave_holds_the_generation_everyone_is_on() {
    bundle_during_a_first_wave(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_bundle_during_a_first_wave_holds_the_generation_everyone_is_on() {
    bundle_during_a_first_wave(true).await;
}

async fn bundle_during_a_first_wave(trust: bool) {
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let plain = config_toml(&tree.envpath(), &pki, "", "");
    let signing = pluginsync_tests::Signing::new(trust, &plain, &["production"]);
    let policy = "[[rollout]]\nenvironments = [\"production\"]\n\
        waves = [ { after = \"0s\", percent = 20 }, { promote = true, percent = 100 } ]\n"
        .to_owned()
        + &signing.master_tables();
    let a = replica(dir.path(), "a", (&tree, &pki), closed_port(), &policy);
    let _master = MasterProcess::spawn(&a.config);
    let a = &a;
    let ids = |n: usize| async move {
        wait_for(PATIENCE, || async {
            let s = rollout(&a.config, "status", &[a]);
            let g = s[0]["generations"].as_array().cloned().unwrap_or_default();
            (g.len() == n).then(|| {
                g.iter()
                    .map(|g| g["id"].as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
            })
        })
        .await
        .unwrap_or_else(|| panic!("{n} generations"))
    };
    let old = ids(1).await.remove(0);
    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    let new = ids(2).await.remove(0);
    let out = dir.path().join("b.tar");

    let (said, held) = bundle(&a.config, &out, &[]);
    assert_eq!(held, old, "everyone's, not the wave's: {said}");
    let bytes = std::fs::read(&out).unwrap();
    let read = pluginsync_common::bundle::read_bundle(&bytes[..], 1 << 20, |_, _| Ok(())).unwrap();
    assert_eq!(
        !read.trust.is_empty(),
        trust,
        "signed when the master signs"
    );
    let why = format!(
        "bundle: generation {} (everyone's: {} is in wave 1 at 20 %)",
        &old[..12],
        &new[..12]
    );
    assert!(said.contains(&why), "{said}");

    let (said, held) = bundle(&a.config, &out, &["--generation", &new[..10]]);
    assert_eq!(held, new, "{said}");
    assert!(
        said.contains(&format!("bundle: generation {} (asked for)", &new[..12])),
        "{said}"
    );

    let (said, held) = bundle(&a.config, &out, &["--certname", &one(true)]);
    assert_eq!(held, new, "a first-wave node's placement: {said}");
    let (said, held) = bundle(&a.config, &out, &["--certname", &one(false)]);
    assert_eq!(held, old, "a node outside the wave: {said}");
    assert!(said.contains("'s placement: "), "{said}");

    // Promoted: the new one is everyone's.
    rollout(&a.config, "promote", &[a]);
    let (said, held) = bundle(&a.config, &out, &[]);
    assert_eq!(held, new, "{said}");
    assert!(said.contains("(everyone's: the newest)"), "{said}");
}
