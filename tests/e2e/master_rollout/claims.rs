//! The health gate believes what was served, not what was claimed
//! (docs/rollouts.md#the-health-gate): one certificate placed on the old
//! generation that claims the new one with a failing load halts nothing,
//! with `min_nodes` at its default and even at 1; the inventory records
//! the claim as such; a node that was served the new generation and
//! fails does halt.

use pluginsync_common::rollout::{NodeReport, in_share, position};
use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, closed_port, wait_for};
use serde_json::Value;

use super::{PATIENCE, Replica, certname, replica, report, rollout};

/// The newest generation's id once the master keeps `n`.
async fn newest(m: &Replica, n: usize) -> String {
    wait_for(PATIENCE, || async {
        let s = rollout(&m.config, "status", &[m]).remove(0);
        let gens = s["generations"].as_array()?;
        (gens.len() == n).then(|| gens[0]["id"].as_str().unwrap_or_default().to_owned())
    })
    .await
    .unwrap_or_else(|| panic!("{n} generations"))
}

/// A report of `generation` with one failing load.
fn failing(generation: &str) -> NodeReport {
    NodeReport {
        generation: Some(generation.parse().unwrap()),
        loads_ok: 1,
        loads_failed: 1,
        failed: vec!["facter/app.rb".into()],
    }
}

/// The first certname in (`inside`) or out of the first wave of 20 %.
fn in_wave(inside: bool) -> String {
    (0..)
        .map(certname)
        .find(|c| in_share(position("production", c), 20.0) == inside)
        .unwrap()
}

/// A master whose gate is `halt_on` with a first wave of 20 % open for an
/// hour, two generations published: its tree, PKI, process and newest id.
struct Gated {
    _tree: EnvTree,
    pki: Pki,
    m: Replica,
    _master: MasterProcess,
    new: String,
}

async fn two_generations(dir: &std::path::Path, halt_on: &str) -> Gated {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let policy = format!(
        "[[rollout]]\nenvironments = [\"production\"]\n\
         waves = [ {{ after = \"0s\", percent = 20 }}, {{ after = \"1h\", percent = 100 }} ]\n\
         halt_on_load_failures = {halt_on}\n"
    );
    let m = replica(dir, "a", (&tree, &pki), closed_port(), &[], &policy);
    let master = MasterProcess::spawn(&m.config);
    newest(&m, 1).await;
    tree.file(
        "production",
        "app",
        "lib/facter/app.rb",
        "raise 'x'\n",
        0o644,
    );
    let new = newest(&m, 2).await;
    Gated {
        _tree: tree,
        pki,
        m,
        _master: master,
        new,
    }
}

/// `certname`'s inventory record.
async fn record(g: &Gated, certname: &str) -> Value {
    let url = format!("{}/pluginsync/v1/inventory", g.m.url());
    let c = client(&g.pki, Some("localhost"));
    let body: Value = c.get(url).send().await.unwrap().json().await.unwrap();
    let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
    nodes
        .into_iter()
        .find(|n| n["certname"] == certname)
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claiming_a_generation_it_was_never_served_halts_nothing() {
    pluginsync_common::tls::install_default_provider();
    let c = reqwest::Client::new();
    let (outside, inside) = (in_wave(false), in_wave(true));
    for halt_on in ["{ percent = 50 }", "{ percent = 50, min_nodes = 1 }"] {
        let dir = tempfile::tempdir().unwrap();
        let g = two_generations(dir.path(), halt_on).await;
        let m = &g.m;
        // Placed on the old generation, it claims the new one, failing.
        assert_eq!(report(&c, m.proxy, &outside, &failing(&g.new)).await, 200);
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let s = rollout(&m.config, "status", &[m]).remove(0);
        assert_eq!(
            s["halted"], false,
            "{halt_on}: one claim halts nothing: {s}"
        );
        assert_eq!(s["generations"][0]["failing_nodes"], 0, "{s}");
        let claimed = record(&g, &outside).await;
        assert_eq!(claimed["generation"], g.new.as_str(), "recorded: {claimed}");
        assert_eq!(claimed["verified"], false, "as a claim: {claimed}");
        if halt_on.contains("min_nodes = 1") {
            // Served the new generation (in the wave), a failing node halts.
            assert_eq!(report(&c, m.proxy, &inside, &failing(&g.new)).await, 200);
            let halted = wait_for(PATIENCE, || async {
                let s = rollout(&m.config, "status", &[m]).remove(0);
                (s["halted"] == true).then_some(s)
            })
            .await
            .expect("a node served the generation trips the gate");
            let reason = halted["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("1 of 1 nodes"), "{halted}");
            assert_eq!(record(&g, &inside).await["verified"], true);
        }
    }
}
