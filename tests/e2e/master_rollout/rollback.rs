//! `rollout rollback` withdraws the newest generation and promotes nothing
//! (docs/rollouts.md#commands), with real `pluginsync-agent` runs: the
//! nodes of a halted 20 % first wave return to the generation each had on
//! their next run, and every other node's next run changes no file, both
//! when the generation under it is everyone's (promoted) and when it is
//! itself only in its first wave (then it is not promoted either). Run
//! both ways: as is, and with `[trust]` on the master and every agent,
//! every tree signed by the emulated pipeline (`Signing`): a rollback is
//! to an earlier signed generation (docs/trust.md#waves-and-a-signed-floor).

use super::*;
use pluginsync_tests::AgentHome;

/// The first wave's share; the rest waits for a promote.
const FIRST: f64 = 20.0;
/// Our agents in the first wave.
const IN: usize = 4;
/// Our agents outside it.
const OUT: usize = 12;

/// Certnames: [`IN`] placed in the first wave, then [`OUT`] outside it.
fn names() -> Vec<String> {
    let (mut i, mut o) = (Vec::new(), Vec::new());
    for n in 0.. {
        let name = format!("node{n:03}.example.org");
        match in_share(position("production", &name), FIRST) {
            true if i.len() < IN => i.push(name),
            false if o.len() < OUT => o.push(name),
            _ => {}
        }
        if i.len() == IN && o.len() == OUT {
            break;
        }
    }
    i.into_iter().chain(o).collect()
}

/// One run of every node: its `app.rb` and how many changes it made.
fn round(homes: &[AgentHome]) -> Vec<(String, usize)> {
    homes
        .iter()
        .map(|h| {
            let run = h.sync(&[]);
            assert_eq!(run.code, 0, "{}", run.stderr);
            let report = h.run(&["report", "--format", "json"]);
            let report: Value = serde_json::from_str(&report.stdout).expect("report");
            let changes = report["changes"].as_array().map_or(0, Vec::len);
            let app = std::fs::read_to_string(h.libdir().join("facter/app.rb")).unwrap();
            (app, changes)
        })
        .collect()
}

/// Publishes `text` as `app.rb` and waits for the `n`th generation.
async fn publish(tree: &EnvTree, cfg: &Path, a: &Replica, text: &str, n: usize) {
    tree.file("production", "app", "lib/facter/app.rb", text, 0o644);
    wait_for(PATIENCE, || async {
        let s = rollout(cfg, "status", &[a]);
        (s[0]["generations"].as_array().map_or(0, Vec::len) == n).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("generation {n} kept"));
}

/// Every node's `(app.rb, changes)` after one round is `want(in wave)`.
fn expect(got: &[(String, usize)], want: impl Fn(bool) -> (&'static str, bool), when: &str) {
    for (i, (app, changes)) in got.iter().enumerate() {
        let (text, changed) = want(i < IN);
        assert_eq!(
            app,
            text,
            "node {i} ({} wave) {when}",
            ["out of", "in"][usize::from(i < IN)]
        );
        assert_eq!(*changes > 0, changed, "node {i}: {changes} changes {when}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_returns_the_first_wave_and_moves_no_other_node() {
    rollback_returns_the_first_wave(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_among_signed_generations_returns_the_first_wave() {
    rollback_returns_the_first_wave(true).await;
}

async fn rollback_returns_the_first_wave(trust: bool) {
    let all = names();
    let (tree, pki, dir) = (
        EnvTree::new(),
        Pki::with_agents(&all),
        tempfile::tempdir().unwrap(),
    );
    tree.file("production", "app", "lib/facter/app.rb", "g0\n", 0o644);
    let plain = config_toml(&tree.envpath(), &pki, "", "");
    let signing = pluginsync_tests::Signing::new(trust, &plain, &["production"]);
    let policy = format!(
        "[[rollout]]\nenvironments = [\"production\"]\n\
         waves = [ {{ after = \"0s\", percent = {FIRST} }}, {{ promote = true, percent = 100 }} ]\n{}",
        signing.master_tables()
    );
    let a = replica(dir.path(), "a", (&tree, &pki), closed_port(), &policy);
    let cfg = a.config.clone();
    let _master = MasterProcess::spawn(&a.config);
    let homes: Vec<AgentHome> = (all.iter())
        .map(|n| AgentHome::with_ssldir(&pki.ssldir, n, &[a.url()], &signing.agent_table()))
        .collect();
    publish(&tree, &cfg, &a, "g0\n", 1).await;
    round(&homes);

    // G1 everywhere (promoted), then G2 in its first wave, halted.
    publish(&tree, &cfg, &a, "g1\n", 2).await;
    rollout(&cfg, "promote", &[&a]);
    expect(&round(&homes), |_| ("g1\n", true), "G1 promoted");
    publish(&tree, &cfg, &a, "g2\n", 3).await;
    expect(
        &round(&homes),
        |w| if w { ("g2\n", true) } else { ("g1\n", false) },
        "G2's wave",
    );
    rollout(&cfg, "halt", &[&a]);
    let back = rollout(&cfg, "rollback", &[&a]);
    assert_eq!(back[0]["generations"][0]["withdrawn"], true, "{back:?}");
    assert_eq!(
        back[0]["generations"][1]["promoted"], true,
        "G1 stays promoted"
    );
    expect(&round(&homes), |w| ("g1\n", w), "after the rollback of G2");

    // G3 in its first wave (not promoted), G4 in the same wave, rolled
    // back: the wave returns to G3, the others stay on G1.
    publish(&tree, &cfg, &a, "g3\n", 4).await;
    expect(
        &round(&homes),
        |w| if w { ("g3\n", true) } else { ("g1\n", false) },
        "G3's wave",
    );
    publish(&tree, &cfg, &a, "g4\n", 5).await;
    expect(
        &round(&homes),
        |w| if w { ("g4\n", true) } else { ("g1\n", false) },
        "G4's wave",
    );
    let back = rollout(&cfg, "rollback", &[&a]);
    let promoted: Vec<&Value> = (back[0]["generations"].as_array().unwrap().iter())
        .filter(|g| g["promoted"] == true)
        .collect();
    assert_eq!(promoted.len(), 1, "only G1, promoted before: {back:?}");
    expect(
        &round(&homes),
        |w| if w { ("g3\n", true) } else { ("g1\n", false) },
        "after the rollback of G4",
    );
}
