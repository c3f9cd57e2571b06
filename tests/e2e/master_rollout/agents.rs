//! A fleet of 200 through a rollout on two replicas sharing one PostgreSQL
//! (docs/rollouts.md): 196 real `pluginsync-agent` nodes (each asking the
//! replicas in its own order) and 4 stock `puppet plugin download` nodes
//! (two placed in the first wave, two not; skipped with a message when
//! `puppet` is missing). A change whose new plugin fails its loader
//! reaches exactly the nodes placement puts in the first wave, a share
//! within binomial bounds, stock nodes placed like ours; those agents' next
//! runs report the failures (half to each replica) and both replicas halt;
//! `rollout rollback` brings them back to the old files on their next run,
//! where the loads pass again; nodes outside the wave never leave the old
//! generation. Promote waves keep it off the wall clock. Run both ways: as
//! is, and with `[trust]` on the replicas and every agent of ours.

use std::path::Path;

use super::*;
use pluginsync_tests::puppet::PuppetAgent;
use pluginsync_tests::{AgentHome, require};

/// The first wave's share.
const FIRST: f64 = 20.0;
/// A loader that refuses the change's new plugin and accepts the rest.
const LOADERS: &str = "[load]\nenabled = true\n\n[[loader]]\nname = \"refuses bad.rb\"\n\
    match = \"facter/bad.rb\"\nkind = \"command\"\ncommand = [\"false\"]\n\n[[loader]]\n\
    name = \"accepts the rest\"\nmatch = \"**\"\nkind = \"command\"\ncommand = [\"true\"]\n";

/// Our agents in the fleet; the rest of [`NODES`] are stock agents.
const OURS: usize = NODES - 4;

/// Two stock certnames in the first wave and two not, by the placement
/// every replica computes.
fn stock_names() -> Vec<String> {
    let (mut i, mut o) = (Vec::new(), Vec::new());
    for n in 0..1000 {
        let name = format!("stock{n:03}.example.org");
        let side = if in_share(position("production", &name), FIRST) {
            &mut i
        } else {
            &mut o
        };
        if side.len() < 2 {
            side.push(name);
        }
    }
    assert_eq!((i.len(), o.len()), (2, 2));
    i.into_iter().chain(o).collect()
}

/// A stock node: its certname and its own directory.
struct Stock {
    certname: String,
    work: std::path::PathBuf,
}

/// Every stock node's `puppet plugin download`, each through replica A or
/// B in turn: what each left of the change (app.rb, bad.rb present).
async fn stock_runs(
    puppet: &Path,
    ssldir: &Path,
    nodes: &[Stock],
    ports: [u16; 2],
) -> Vec<(String, bool)> {
    let runs: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let agent = PuppetAgent::new(puppet, &n.work, ssldir, &n.certname, ports[i % 2]);
            tokio::task::spawn_blocking(move || {
                let run = agent.plugin_download("production");
                assert_eq!(run.code, 0, "{}", run.output);
                let lib = agent.libdir();
                (
                    std::fs::read_to_string(lib.join("facter/app.rb")).unwrap_or_default(),
                    lib.join("facter/bad.rb").exists(),
                )
            })
        })
        .collect();
    let mut out = Vec::new();
    for r in runs {
        out.push(r.await.unwrap());
    }
    out
}

/// One run of every node; what each has of the change: (app.rb, bad.rb
/// present), and the run's report.
fn run_all(homes: &[AgentHome]) -> Vec<((String, bool), Value)> {
    homes
        .iter()
        .map(|h| {
            let run = h.sync(&[]);
            assert!(
                !run.stderr.contains("error:"),
                "{}: {}",
                h.path().display(),
                run.stderr
            );
            let app = std::fs::read_to_string(h.libdir().join("facter/app.rb")).unwrap();
            let bad = h.libdir().join("facter/bad.rb").exists();
            let report = h.run(&["report", "--format", "json"]);
            (
                (app, bad),
                serde_json::from_str(&report.stdout).expect("report"),
            )
        })
        .collect()
}

/// Failed loads in a run's report.
fn failed_loads(report: &Value) -> usize {
    report["loads"]
        .as_array()
        .map(|l| l.iter().filter(|l| l["status"] == "failed").count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_agents_halts_a_failing_first_wave_and_comes_back_on_rollback() {
    fleet_through_a_failing_first_wave(false).await;
}

/// The same with `[trust]` on both replicas and every agent of ours, each
/// tree signed by the emulated pipeline (`Signing`): placement, the gate
/// and the rollback work among signed generations
/// (docs/trust.md#waves-and-a-signed-floor); the stock nodes get only
/// signed trees, as the replicas publish no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_fleet_halts_a_failing_first_wave_and_comes_back_on_rollback() {
    fleet_through_a_failing_first_wave(true).await;
}

async fn fleet_through_a_failing_first_wave(trust: bool) {
    let puppet = require("puppet", "puppet", "master_rollout::agents");
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::agents") else {
        return;
    };
    let ours: Vec<String> = (0..OURS)
        .map(|n| format!("agent{n:03}.example.org"))
        .collect();
    let stock_certs = stock_names();
    let all: Vec<String> = ours.iter().chain(&stock_certs).cloned().collect();
    let (tree, pki, dir) = (
        EnvTree::new(),
        Pki::with_agents(&all),
        tempfile::tempdir().unwrap(),
    );
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let plain = config_toml(&tree.envpath(), &pki, "", "");
    let signing = pluginsync_tests::Signing::new(trust, &plain, &["production"]);
    let policy = format!(
        "[[rollout]]\nenvironments = [\"production\"]\n\
         waves = [ {{ after = \"0s\", percent = {FIRST} }}, {{ promote = true, percent = 100 }} ]\n\
         halt_on_load_failures = {{ percent = 50, min_nodes = 3 }}\n{}",
        signing.master_tables()
    );
    let agent_tables = format!("{LOADERS}{}", signing.agent_table());
    let (a, b) = two_replicas(dir.path(), (&tree, &pki), &pg.database(), "", &policy);
    let cfg = a.config.clone();
    let (_ma, _mb) = (
        MasterProcess::spawn(&a.config),
        MasterProcess::spawn(&b.config),
    );
    newest_on_both(&cfg, &a, &b, 1).await;
    // Every other node asks replica B first: the reports reach both.
    let homes: Vec<AgentHome> = ours
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let servers = if i % 2 == 0 {
                [a.url(), b.url()]
            } else {
                [b.url(), a.url()]
            };
            AgentHome::with_ssldir(&pki.ssldir, name, &servers, &agent_tables)
        })
        .collect();
    let stock: Vec<Stock> = stock_certs
        .iter()
        .map(|c| Stock {
            certname: c.clone(),
            work: dir.path().join(c),
        })
        .collect();
    // Without puppet the stock nodes are left out (SKIPPED above).
    let stock_round = || async {
        match &puppet {
            Some(p) => stock_runs(p, &pki.ssldir, &stock, [a.tls, b.tls]).await,
            None => Vec::new(),
        }
    };
    let old = ("# one\n".to_owned(), false);
    for (got, _) in run_all(&homes) {
        assert_eq!(got, old, "every node starts on the first generation");
    }
    for got in stock_round().await {
        assert_eq!(got, old, "every stock node starts on the first generation");
    }
    // The change: a new plugin every loader run refuses.
    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    tree.file("production", "app", "lib/facter/bad.rb", "# bad\n", 0o644);
    newest_on_both(&cfg, &a, &b, 2).await;
    let new = ("# two\n".to_owned(), true);
    let placed = |name: &str| in_share(position("production", name), FIRST);
    let mut on_new = 0usize;
    for (name, (got, report)) in ours.iter().zip(run_all(&homes)) {
        if placed(name) {
            on_new += 1;
            assert_eq!(got, new, "{name}: in the first wave");
            assert_eq!(failed_loads(&report), 1, "{name}: {report}");
        } else {
            assert_eq!(got, old, "{name}: outside the first wave");
            assert_eq!(failed_loads(&report), 0, "{name}: {report}");
        }
    }
    for (name, got) in stock_certs.iter().zip(stock_round().await) {
        let want = if placed(name) { &new } else { &old };
        on_new += usize::from(placed(name));
        assert_eq!(&got, want, "stock {name}: placed like ours");
    }
    // The share: within 4.5 standard deviations of the binomial.
    let n = if puppet.is_some() { NODES } else { OURS } as f64;
    let p = FIRST / 100.0;
    let sd = (n * p * (1.0 - p)).sqrt();
    assert!(
        (on_new as f64 - n * p).abs() <= 4.5 * sd + 0.5,
        "{on_new} of {n} nodes in a {FIRST} % wave"
    );
    // The next runs carry those failures to the masters, half to each.
    run_all(&homes);
    let halted = wait_for(PATIENCE, || async {
        let s = rollout(&cfg, "status", &[&a, &b]);
        s.iter().all(|s| s["halted"] == true).then_some(s)
    })
    .await
    .expect("both replicas halt on the agents' reports");
    for s in &halted {
        let reason = s["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("report load failures"), "{s}");
        assert_eq!(s["generations"][0]["waves_open"], 1, "{s}");
    }
    rolled_back(&cfg, &a, &b).await;
    for (name, (got, report)) in ours.iter().zip(run_all(&homes)) {
        assert_eq!(got, old, "{name}: rolled back");
        assert_eq!(failed_loads(&report), 0, "{name}: {report}");
        if placed(name) {
            assert!(
                !report["changes"].as_array().unwrap().is_empty(),
                "{name}: the rollback is a change of its own: {report}"
            );
        }
    }
    for (name, got) in stock_certs.iter().zip(stock_round().await) {
        assert_eq!(got, old, "stock {name}: rolled back");
    }
}
