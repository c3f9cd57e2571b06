//! The health gate believes what was served, not what was claimed
//! (docs/rollouts.md#the-health-gate): one certificate placed on the old
//! generation that claims the new one with a failing load halts nothing,
//! with `min_nodes` at its default and even at 1; the inventory records
//! the claim as such; a node that was served the new generation and
//! fails does halt. Replicas on one PostgreSQL count the whole fleet's
//! served nodes from it ([`whole_fleet`]).

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
    let m = replica(dir, "a", (&tree, &pki), closed_port(), &policy);
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

/// Replicas on one PostgreSQL count the whole fleet from it
/// (docs/rollouts.md#replicas): a first wave failing, its reports split
/// between the replicas so neither heard enough to trip the gate alone,
/// halts both before the second wave; `pluginsync-master inventory`
/// against either replica lists every node, its failures included.
mod whole_fleet {
    use super::super::*;

    /// `pluginsync-master inventory --format json` against `m`: every node.
    fn inventory(config: &Path, m: &Replica) -> Vec<Value> {
        let out = Command::new(bin_path("pluginsync-master"))
            .args(["inventory", "--config"])
            .arg(config)
            .args(["--master", &m.url(), "--format", "json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "inventory: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&text).expect("JSON")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_on_one_postgresql_gate_on_the_whole_fleet_and_list_every_node() {
        let Some(pg) = pluginsync_tests::Postgres::launch("replicas_gate_on_the_whole_fleet")
        else {
            return;
        };
        let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
        tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
        // The first wave, and how many of its nodes report to each replica:
        // the gate needs one failing node more than either replica heard.
        let wave1: Vec<bool> = (0..NODES)
            .map(|i| in_share(position("production", &certname(i)), 20.0))
            .collect();
        let to_a = (wave1.iter().step_by(2)).filter(|x| **x).count();
        let to_b = wave1.iter().filter(|x| **x).count() - to_a;
        assert!(to_a > 0 && to_b > 0, "{to_a} and {to_b}");
        let min_nodes = to_a.max(to_b) + 1;
        let policy = format!(
            "[[rollout]]\nenvironments = [\"production\"]\n\
             waves = [ {{ after = \"0s\", percent = 20 }}, {{ after = \"30s\", percent = 100 }} ]\n\
             halt_on_load_failures = {{ percent = 50, min_nodes = {min_nodes} }}\n"
        );
        let (a, b) = two_replicas(dir.path(), (&tree, &pki), &pg.database(), "", &policy);
        let cfg = a.config.clone();
        let _masters = (
            MasterProcess::spawn(&a.config),
            MasterProcess::spawn(&b.config),
        );
        pluginsync_common::tls::install_default_provider();
        let c = reqwest::Client::new();
        newest_on_both(&cfg, &a, &b, 1).await;
        tree.file(
            "production",
            "app",
            "lib/facter/app.rb",
            "raise 'x'\n",
            0o644,
        );
        let new = newest_on_both(&cfg, &a, &b, 2).await;
        assert_eq!(census(&c, &a, &b, &new).await, wave1);
        for (i, _) in wave1.iter().enumerate().filter(|(_, x)| **x) {
            let r = NodeReport {
                generation: Some(new.parse().unwrap()),
                loads_ok: 3,
                loads_failed: 1,
                failed: vec!["facter/app.rb".into()],
            };
            let proxy = if i % 2 == 0 { a.proxy } else { b.proxy };
            assert_eq!(report(&c, proxy, &certname(i), &r).await, 200);
        }
        let halted = wait_for(PATIENCE, || async {
            let s = rollout(&cfg, "status", &[&a, &b]);
            s.iter().all(|s| s["halted"] == true).then_some(s)
        })
        .await
        .expect("both replicas halt on the whole fleet's failures");
        let failing = to_a + to_b;
        for s in &halted {
            // The reason is the count when the gate tripped, which may be
            // before every report was written: more failing nodes than
            // either replica heard, of no more than the wave.
            let reason = s["reason"].as_str().unwrap_or_default();
            let (seen, of) = reason
                .split_once(" nodes on generation")
                .and_then(|(head, _)| head.split_once(" of "))
                .and_then(|(n, m)| Some((n.parse::<usize>().ok()?, m.parse::<usize>().ok()?)))
                .unwrap_or_else(|| panic!("no count in the reason: {s}"));
            assert!(seen > to_a.max(to_b) && seen <= of && of <= failing, "{s}");
            assert_eq!(s["generations"][0]["waves_open"], 1, "before wave 2: {s}");
        }
        // Every report reaches the store: both replicas count them all.
        let counted = wait_for(PATIENCE, || async {
            let s = rollout(&cfg, "status", &[&a, &b]);
            s.iter()
                .all(|s| {
                    s["generations"][0]["failing_nodes"] == failing
                        && s["generations"][0]["nodes"] == failing
                })
                .then_some(())
        })
        .await;
        assert!(counted.is_some(), "{failing} failing nodes on both");
        for m in [&a, &b] {
            let nodes = inventory(&cfg, m);
            let names: std::collections::BTreeSet<&str> = nodes
                .iter()
                .filter_map(|n| n["certname"].as_str())
                .collect();
            assert_eq!(names.len(), NODES, "every node on {}", m.url());
            let failing_here = (nodes.iter())
                .filter(|n| {
                    n["failing_plugins"]
                        .as_array()
                        .is_some_and(|f| !f.is_empty())
                })
                .count();
            assert_eq!(failing_here, failing, "every failure on {}", m.url());
        }
    }
}
