//! A single master keeps its state in the embedded state store
//! (docs/operating.md#the-state-store): killed and started again, its
//! inventory and its rollout state are as before, and the health gate
//! decides from the reports it heard before the restart.

use pluginsync_common::rollout::{NodeReport, in_share, position};
use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, closed_port, wait_for};
use serde_json::Value;

use super::{PATIENCE, Replica, certname, replica, report, rollout};

/// A first wave of 20% that stays open alone for an hour, halted when 3
/// nodes, and half of those on the new generation, fail a load.
const GATED: &str = "[[rollout]]\nenvironments = [\"production\"]\n\
    waves = [ { after = \"0s\", percent = 20 }, { after = \"1h\", percent = 100 } ]\n\
    halt_on_load_failures = { percent = 50, min_nodes = 3 }\n";

/// A report of `generation` with `failed` failing loads.
fn on(generation: &str, failed: u32) -> NodeReport {
    NodeReport {
        generation: Some(generation.parse().unwrap()),
        loads_ok: 2,
        loads_failed: failed,
        failed: (0..failed).map(|_| "facter/app.rb".to_owned()).collect(),
    }
}

/// The `n`th certname the first wave (20 %) serves the new generation:
/// only such nodes count for the gate (docs/rollouts.md#the-health-gate).
fn in_wave(n: usize) -> String {
    (0..)
        .map(certname)
        .filter(|c| in_share(position("production", c), 20.0))
        .nth(n)
        .unwrap()
}

/// `production`'s status once the master keeps `n` generations.
async fn with_generations(m: &Replica, n: usize) -> Value {
    wait_for(PATIENCE, || async {
        let s = rollout(&m.config, "status", &[m]).remove(0);
        (s["generations"].as_array().map(Vec::len) == Some(n)).then_some(s)
    })
    .await
    .unwrap_or_else(|| panic!("{n} generations"))
}

/// The inventory by certname: `(generation, load_failures)`.
async fn inventory(pki: &Pki, m: &Replica) -> Vec<(String, String, u64)> {
    let url = format!("{}/pluginsync/v1/inventory", m.url());
    let c = client(pki, Some("localhost"));
    let body: Value = c.get(url).send().await.unwrap().json().await.unwrap();
    let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
    (nodes.iter())
        .map(|n| {
            let name = n["certname"].as_str().unwrap_or_default().to_owned();
            let generation = n["generation"].as_str().unwrap_or_default().to_owned();
            (name, generation, n["load_failures"].as_u64().unwrap_or(0))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_keeps_its_inventory_and_rollout_state_and_the_gate_counts_them() {
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let m = replica(dir.path(), "a", (&tree, &pki), closed_port(), GATED);
    pluginsync_common::tls::install_default_provider();
    let c = reqwest::Client::new();
    let master = MasterProcess::spawn(&m.config);
    let first = with_generations(&m, 1).await["generations"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    tree.file(
        "production",
        "app",
        "lib/facter/app.rb",
        "raise 'x'\n",
        0o644,
    );
    let new = with_generations(&m, 2).await["generations"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Two nodes fail on the new generation (under min_nodes), one is
    // healthy on the first: no halt.
    let healthy = (0..)
        .map(certname)
        .find(|c| !in_share(position("production", c), 20.0));
    let reports = [
        (in_wave(0), on(&new, 1)),
        (in_wave(1), on(&new, 1)),
        (healthy.unwrap(), on(&first, 0)),
    ];
    for (name, r) in &reports {
        assert_eq!(report(&c, m.proxy, name, r).await, 200);
    }
    let heard = inventory(&pki, &m).await;
    assert_eq!(heard.len(), 3, "{heard:?}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(rollout(&m.config, "status", &[&m])[0]["halted"], false);
    // Killed (no shutdown: what was heard a second ago is on disk) and
    // started again: the same inventory.
    drop(master);
    let master = MasterProcess::spawn(&m.config);
    assert_eq!(
        inventory(&pki, &m).await,
        heard,
        "a restart keeps the inventory"
    );
    // A third failing node: 3 of 3 on the new generation, two of them
    // heard before the restart, trip the gate.
    assert_eq!(report(&c, m.proxy, &in_wave(2), &on(&new, 1)).await, 200);
    let halted = wait_for(PATIENCE, || async {
        let s = rollout(&m.config, "status", &[&m]).remove(0);
        (s["halted"] == true).then_some(s)
    })
    .await
    .expect("the gate halts from the reports heard before the restart");
    let reason = halted["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("3 of 3 nodes"), "{halted}");
    drop(master);
    let _master = MasterProcess::spawn(&m.config);
    let again = rollout(&m.config, "status", &[&m]).remove(0);
    assert_eq!(
        (
            &again["halted"],
            &again["reason"],
            &again["generations"][0]["waves_open"]
        ),
        (
            &Value::Bool(true),
            &Value::String(reason),
            &halted["generations"][0]["waves_open"]
        ),
        "a restart keeps the halt: {again}"
    );
}
