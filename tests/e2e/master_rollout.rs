//! Rollouts on the master (docs/rollouts.md): a policy refused with one
//! line by `check` and `serve`, and so is `[admin] peers`; 200 certnames
//! placed in waves alike by two replicas sharing one PostgreSQL within
//! binomial bounds; `pluginsync-master rollout` halting, resuming, rolling
//! back and promoting on both; a restarted replica keeping its state; a
//! command issued to one replica reaching the other; a replica that never
//! held a node's generation answering 503. Stock agents placed like ours: `master_rollout/stock.rs`;
//! real `pluginsync-agent` runs through a rollout: `master_rollout/agents.rs`;
//! a single master's state across restarts: `master_rollout/store.rs`;
//! the gate counting only what was served, on one master and on replicas
//! sharing PostgreSQL: `master_rollout/claims.rs`.

mod agents;
mod bundle;
mod claims;
mod rollback;
mod status;
mod stock;
mod store;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pluginsync_common::digest::Sha256;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{HEADER_REPORT, NodeReport, in_share, position};
use pluginsync_tests::{EnvTree, MasterProcess, Pki, bin_path, closed_port, config_toml, wait_for};
use serde_json::Value;

/// Long enough for any bounded wait here on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);
/// The simulated fleet.
const NODES: usize = 200;
/// Waves 5 s apart: a round of 400 answers takes well under a second.
const WAVES: &str = "waves = [ { after = \"0s\", percent = 10 }, { after = \"6s\", percent = 50 }, { after = \"12s\", percent = 100 } ]";

/// One replica's ports and files.
struct Replica {
    tls: u16,
    proxy: u16,
    config: PathBuf,
}

impl Replica {
    fn url(&self) -> String {
        format!("https://localhost:{}", self.tls)
    }
}

/// A config for a replica listening on port `tls` (and a proxy port),
/// its store under `dir`, with `rollout` appended.
fn replica(
    dir: &Path,
    name: &str,
    (tree, pki): (&EnvTree, &Pki),
    tls: u16,
    rollout: &str,
) -> Replica {
    let proxy = closed_port();
    let store = dir.join(format!("store-{name}"));
    let tables = format!(
        "[generations]\ndir = {store:?}\n\
         [proxy]\nlisten = [\"127.0.0.1:{proxy}\"]\ntrusted = [\"127.0.0.1\"]\n{rollout}\n"
    );
    let text = config_toml(&tree.envpath(), pki, "", &tables)
        .replace("127.0.0.1:0", &format!("127.0.0.1:{tls}"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, text).unwrap();
    Replica { tls, proxy, config }
}

/// `pluginsync-master rollout ACTION production --format json` against
/// `masters`: each master's status (panics on any error).
fn rollout(config: &Path, action: &str, masters: &[&Replica]) -> Vec<Value> {
    let mut cmd = Command::new(bin_path("pluginsync-master"));
    cmd.args(["rollout", "--config"]).arg(config);
    for m in masters {
        cmd.args(["--master", &m.url()]);
    }
    let out = cmd
        .args(["--format", "json", action, "production"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rollout {action}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<Value> = serde_json::from_str(&text).expect("JSON");
    assert_eq!(list.len(), masters.len(), "{text}");
    list.into_iter().map(|v| v["status"].clone()).collect()
}

/// `rollout rollback` issued naming both replicas, and both replicas'
/// statuses once each says the newest generation is withdrawn: the
/// command is applied once, by the first (docs/rollouts.md#commands), so
/// the generation before the newest stays served.
async fn rolled_back(cfg: &Path, a: &Replica, b: &Replica) -> Vec<Value> {
    let answered = rollout(cfg, "rollback", &[a, b]);
    for s in &answered {
        assert_eq!(s["generations"][1]["withdrawn"], false, "one rollback: {s}");
    }
    wait_for(PATIENCE, || async {
        let s = rollout(cfg, "status", &[a, b]);
        (s.iter())
            .all(|s| s["generations"][0]["withdrawn"] == true)
            .then_some(s)
    })
    .await
    .expect("the rollback reaches both replicas")
}

/// The newest generation's id once both replicas keep `n` generations
/// (the same id on both: it is the digest of the tree).
async fn newest_on_both(cfg: &Path, a: &Replica, b: &Replica, n: usize) -> String {
    let s = wait_for(PATIENCE, || async {
        let s = rollout(cfg, "status", &[a, b]);
        s.iter()
            .all(|s| s["generations"].as_array().is_some_and(|g| g.len() == n))
            .then_some(s)
    })
    .await
    .unwrap_or_else(|| panic!("{n} generations on both"));
    let newest = s[0]["generations"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        s[1]["generations"][0]["id"],
        newest.as_str(),
        "one id on both"
    );
    newest
}

/// Two replicas on `tree` sharing the PostgreSQL database at `url`
/// (docs/rollouts.md#replicas), with `policy` (and `extra_a` before it on
/// the first).
fn two_replicas(
    dir: &Path,
    (tree, pki): (&EnvTree, &Pki),
    url: &str,
    extra_a: &str,
    policy: &str,
) -> (Replica, Replica) {
    let state = format!("[state]\nurl = {url:?}\n{policy}");
    let first = format!("{extra_a}{state}");
    let a = replica(dir, "a", (tree, pki), closed_port(), &first);
    let b = replica(dir, "b", (tree, pki), closed_port(), &state);
    (a, b)
}

/// The generation a replica's proxy listener serves `certname`.
async fn served(c: &reqwest::Client, proxy: u16, certname: &str) -> String {
    let r = c
        .get(format!(
            "http://127.0.0.1:{proxy}/pluginsync/v1/assignment?environment=production"
        ))
        .header("X-Client-Verify", "SUCCESS")
        .header("X-Client-DN", format!("/CN={certname}"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200, "{certname}");
    let v: Value = r.json().await.expect("JSON");
    v["generation"].as_str().unwrap().to_owned()
}

fn certname(i: usize) -> String {
    format!("node{i:03}.example.org")
}

/// Every certname's generation on both replicas: asserts they agree and
/// returns how many have `new`.
async fn census(c: &reqwest::Client, a: &Replica, b: &Replica, new: &str) -> Vec<bool> {
    let mut on_new = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let (x, y) = (
            served(c, a.proxy, &certname(i)).await,
            served(c, b.proxy, &certname(i)).await,
        );
        assert_eq!(x, y, "both replicas answer {} alike", certname(i));
        on_new.push(x == new);
    }
    on_new
}

/// The share `percent` as placement gives it, checked against `got` node
/// by node, and the count within 4.5 standard deviations of the binomial.
fn check_wave(got: &[bool], percent: f64) {
    let want: Vec<bool> = (0..NODES)
        .map(|i| in_share(position("production", &certname(i)), percent))
        .collect();
    assert_eq!(got, &want[..], "nodes on the new generation at {percent} %");
    let n = got.iter().filter(|x| **x).count() as f64;
    let (mean, p) = (NODES as f64 * percent / 100.0, percent / 100.0);
    let sd = (NODES as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (n - mean).abs() <= 4.5 * sd + 0.5,
        "{n} of {NODES} at {percent} %"
    );
}

/// Waits until both replicas report their newest generation's waves at
/// `waves` open, then takes the census (again if a wave opened meanwhile).
async fn census_at(
    cfg: &Path,
    c: &reqwest::Client,
    a: &Replica,
    b: &Replica,
    waves: u64,
) -> Vec<bool> {
    for _ in 0..5 {
        let both = |s: &[Value]| s.iter().all(|s| s["generations"][0]["waves_open"] == waves);
        let ok = wait_for(PATIENCE, || async {
            both(&rollout(cfg, "status", &[a, b])).then_some(())
        })
        .await;
        assert!(ok.is_some(), "wave {waves} opens on both");
        let new = rollout(cfg, "status", &[a])[0]["generations"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let got = census(c, a, b, &new).await;
        if both(&rollout(cfg, "status", &[a, b])) {
            return got;
        }
    }
    panic!("the census never fit inside wave {waves}");
}

/// 200 certnames on two replicas sharing one PostgreSQL through a change:
/// each wave's share as placement says, alike on both; halt freezes it
/// past the last wave, resume opens it, rollback brings everyone back and
/// survives a re-index and a restart, a halt sent to one replica reaches
/// the other, promote gives everyone the new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_place_two_hundred_nodes_alike_and_the_commands_steer_both_replicas() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::waves_place") else {
        return;
    };
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    // Waves 20 s apart: each replica publishes in its own time, and two
    // censuses of 200 nodes must fit in a wave on a loaded machine.
    let policy = format!("[[rollout]]\nenvironments = [\"prod*\"]\n{SHARED_WAVES}\n");
    let (a, b) = two_replicas(dir.path(), (&tree, &pki), &pg.database(), "", &policy);
    let cfg = a.config.clone();
    let ma = MasterProcess::spawn(&a.config);
    let mut mb = MasterProcess::spawn(&b.config);
    pluginsync_common::tls::install_default_provider();
    let c = reqwest::Client::new();

    // The first generation reaches everyone.
    let first = newest_on_both(&cfg, &a, &b, 1).await;
    assert!(census(&c, &a, &b, &first).await.iter().all(|x| *x));

    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    let new = newest_on_both(&cfg, &a, &b, 2).await;

    check_wave(&census_at(&cfg, &c, &a, &b, 1).await, 10.0);
    let second = census_at(&cfg, &c, &a, &b, 2).await;
    check_wave(&second, 50.0);

    let halted = rollout(&cfg, "halt", &[&a, &b]);
    assert!(halted.iter().all(|s| s["halted"] == true), "{halted:?}");
    // Halted at least 20 s after publication: past the last wave's 40 s.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let status = rollout(&cfg, "status", &[&a, &b]);
    assert!(
        status
            .iter()
            .all(|s| s["halted"] == true && s["generations"][0]["waves_open"] == 2),
        "{status:?}"
    );
    assert_eq!(
        census(&c, &a, &b, &new).await,
        second,
        "halted: no node moves"
    );

    let resumed = rollout(&cfg, "resume", &[&a, &b]);
    assert!(resumed.iter().all(|s| s["halted"] == false));
    assert!(
        census(&c, &a, &b, &new).await.iter().all(|x| *x),
        "resumed: the last wave is open"
    );

    let rolled = rolled_back(&cfg, &a, &b).await;
    assert!(
        rolled
            .iter()
            .all(|s| s["generations"][0]["withdrawn"] == true),
        "{rolled:?}"
    );
    // The same rollback again through the admin API, to each replica,
    // naming what it withdraws (a retry, a script sending it to every
    // master): nothing more is withdrawn.
    let admin = pluginsync_tests::client(&pki, Some("localhost"));
    for r in [&a, &b] {
        let url = format!(
            "{}/pluginsync/v1/admin/rollout?environment=production&action=rollback&generation={}",
            r.url(),
            &new[..12]
        );
        let answer = admin.post(url).send().await.expect("admin API");
        assert_eq!(answer.status(), 200, "a named rollback again");
        let s: Value = answer.json().await.expect("status");
        assert_eq!(s["generations"][1]["withdrawn"], false, "still served: {s}");
    }
    assert!(
        census(&c, &a, &b, &first).await.iter().all(|x| *x),
        "rolled back: everyone on the first"
    );
    let reindex = Command::new(bin_path("pluginsync-master"))
        .args(["reindex", "--config"])
        .arg(&cfg)
        .args(["--server", &a.url(), "production"])
        .output()
        .unwrap();
    assert!(reindex.status.success(), "{reindex:?}");
    drop(mb);
    mb = MasterProcess::spawn(&b.config);
    let after = rollout(&cfg, "status", &[&a, &b]);
    assert!(
        after
            .iter()
            .all(|s| s["generations"][0]["withdrawn"] == true),
        "a re-index and a restart keep the rollback: {after:?}"
    );
    assert!(census(&c, &a, &b, &first).await.iter().all(|x| *x));

    // A command only one replica heard reaches the other through the
    // database they share.
    rollout(&cfg, "halt", &[&a]);
    let converged = wait_for(PATIENCE, || async {
        (rollout(&cfg, "status", &[&b])[0]["halted"] == true).then_some(())
    })
    .await;
    assert!(
        converged.is_some(),
        "the halt reached the replica that missed it"
    );

    let promoted = rollout(&cfg, "promote", &[&a, &b]);
    assert!(
        promoted
            .iter()
            .all(|s| s["halted"] == false && s["generations"][0]["promoted"] == true),
        "{promoted:?}"
    );
    assert!(
        census(&c, &a, &b, &new).await.iter().all(|x| *x),
        "promoted: everyone on the new"
    );
    drop((ma, mb));
}

/// On replicas sharing one PostgreSQL, a node that reports a generation
/// this replica never held (another replica's, or anyone's) gets 503 and
/// `Retry-After` (so the shipped nginx configuration and our agent ask
/// another replica); one on a generation it holds is served, and so is
/// any node by the replica that holds it, by a lone master on its
/// embedded store (no other replica to ask), or without a policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_held_a_nodes_generation_answers_503() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::answers_503") else {
        return;
    };
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    // The other replica's tree has one more change: a generation the
    // first never holds.
    let other_tree = EnvTree::new();
    other_tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    let policy = format!("[[rollout]]\nenvironments = [\"production\"]\n{WAVES}\n");
    let state = format!("[state]\nurl = {:?}\n{policy}", pg.database());
    let with = replica(dir.path(), "with", (&tree, &pki), closed_port(), &state);
    let other = replica(
        dir.path(),
        "other",
        (&other_tree, &pki),
        closed_port(),
        &state,
    );
    let without = replica(dir.path(), "without", (&tree, &pki), closed_port(), "");
    let lone = replica(dir.path(), "lone", (&tree, &pki), closed_port(), &policy);
    let _m3 = MasterProcess::spawn(&lone.config);
    let (_m1, _m2) = (
        MasterProcess::spawn(&with.config),
        MasterProcess::spawn(&without.config),
    );
    pluginsync_common::tls::install_default_provider();
    let c = reqwest::Client::new();
    let ask = |proxy: u16, report: Option<GenerationId>| {
        let mut r = c
            .get(format!(
                "http://127.0.0.1:{proxy}/pluginsync/v1/assignment?environment=production"
            ))
            .header("X-Client-Verify", "SUCCESS")
            .header("X-Client-DN", "/CN=node1");
        if let Some(g) = report {
            let rep = NodeReport {
                generation: Some(g),
                ..NodeReport::default()
            };
            r = r.header(HEADER_REPORT, rep.to_header());
        }
        r.send()
    };
    let held_by = async |proxy: u16| {
        wait_for(PATIENCE, || async {
            let r = ask(proxy, None).await.ok()?;
            if r.status() != 200 {
                return None;
            }
            let v: Value = r.json().await.ok()?;
            v["generation"].as_str()?.parse::<GenerationId>().ok()
        })
        .await
        .expect("served")
    };
    // The other replica starts once the first serves: what the first
    // holds is read at its start (docs/rollouts.md#a-replica-that-lacks-a-generation).
    let held = held_by(with.proxy).await;
    let _m4 = MasterProcess::spawn(&other.config);
    let theirs = held_by(other.proxy).await;
    assert_ne!(held, theirs, "two trees, two generations");
    let nowhere = GenerationId(Sha256::of(b"a generation published elsewhere"));
    for g in [theirs, nowhere] {
        let r = ask(with.proxy, Some(g)).await.unwrap();
        assert_eq!(r.status(), 503, "{}", g.to_hex());
        assert_eq!(r.headers()["retry-after"], "5");
        let body = r.text().await.unwrap();
        assert!(body.contains("does not hold generation"), "{body}");
    }
    assert_eq!(ask(with.proxy, Some(held)).await.unwrap().status(), 200);
    assert_eq!(
        ask(other.proxy, Some(theirs)).await.unwrap().status(),
        200,
        "the replica that holds it serves it"
    );
    let plain = wait_for(PATIENCE, || async {
        let s = ask(without.proxy, Some(nowhere)).await.ok()?.status();
        (s != 503).then_some(s)
    })
    .await;
    assert_eq!(
        plain.map(|s| s.as_u16()),
        Some(200),
        "no policy: today's answer"
    );
    let alone = wait_for(PATIENCE, || async {
        let s = ask(lone.proxy, Some(nowhere)).await.ok()?.status();
        (s != 503).then_some(s)
    })
    .await;
    assert_eq!(
        alone.map(|s| s.as_u16()),
        Some(200),
        "a master on its embedded store has no other replica to send the node to"
    );
}

/// `[admin] peers` naming a replica is refused by `check` and `serve` with
/// one line naming `[state] url` (78, as any bad config); an empty list,
/// and the retired `[fleet]` intervals, are accepted, the intervals with
/// a warning (docs/rollouts.md#replicas).
#[test]
fn admin_peers_is_refused_with_one_line_naming_the_state_url() {
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let run = |verb: &str, tables: &str| {
        let text = config_toml(&tree.envpath(), &pki, "", tables);
        let cfg = dir.path().join("master.toml");
        std::fs::write(&cfg, text).unwrap();
        Command::new(bin_path("pluginsync-master"))
            .args([verb, "--config"])
            .arg(&cfg)
            .output()
            .unwrap()
    };
    let peers = "[admin]\npeers = [\"https://master2.example.org:8140\"]\n";
    for verb in ["check", "serve"] {
        let out = run(verb, peers);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{verb}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{verb}, one line: {err}");
        assert!(
            err.contains(
                "admin.peers: replicas no longer send each other their state; \
                 give every replica the same [state] url = \"postgresql://"
            ) && err.contains("docs/rollouts.md#replicas"),
            "{verb}: {err}"
        );
    }
    let retired = "[admin]\npeers = []\n[fleet]\npush_interval = \"1s\"\npull_interval = \"10m\"\n";
    let out = run("check", retired);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in ["push_interval", "pull_interval"] {
        assert!(
            said.contains(&format!("warning: fleet.{key} is ignored")),
            "{key}: {said}"
        );
    }
    // And serves, warning at start of what it ignores.
    let cfg = dir.path().join("serving.toml");
    std::fs::write(&cfg, config_toml(&tree.envpath(), &pki, "", retired)).unwrap();
    let m = MasterProcess::spawn(&cfg);
    assert!(
        m.log.contains("fleet.push_interval is ignored"),
        "{}",
        m.log
    );
}

/// A policy whose shares do not increase, or whose last wave is not 100,
/// is refused by `check` and `serve` with one line (78); a good one passes
/// `check`.
#[test]
fn a_bad_policy_is_refused_with_one_line_by_check_and_serve() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            WAVES.replace("percent = 50", "percent = 10"),
            Some("[[rollout]] #1: wave shares must increase (10 then 10)"),
        ),
        (
            WAVES.replace("percent = 100", "percent = 90"),
            Some("[[rollout]] #1: the last wave opens 90 percent, not 100"),
        ),
        (
            WAVES.replace("\"6s\"", "\"1h\""),
            Some("[[rollout]] #1: wave after must not decrease (1h then 12s)"),
        ),
        (WAVES.to_owned(), None),
    ];
    for (waves, refused) in cases {
        let text = config_toml(
            &tree.envpath(),
            &pki,
            "",
            &format!("[[rollout]]\nenvironments = [\"production\"]\n{waves}\n"),
        );
        let cfg = dir.path().join("master.toml");
        std::fs::write(&cfg, text).unwrap();
        for verb in ["check", "serve"] {
            if refused.is_none() && verb == "serve" {
                continue;
            }
            let out = Command::new(bin_path("pluginsync-master"))
                .args([verb, "--config"])
                .arg(&cfg)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            match refused {
                Some(line) => {
                    assert_eq!(out.status.code(), Some(78), "{verb} {waves}: {err}");
                    assert_eq!(err.lines().count(), 1, "one line: {err}");
                    assert!(err.contains(line), "{verb}: {err}");
                }
                None => assert!(out.status.success(), "{verb} {waves}: {err}"),
            }
        }
    }
}

/// The per-node answer for `certname` from `proxy`, sending `report`.
async fn report(c: &reqwest::Client, proxy: u16, certname: &str, report: &NodeReport) -> u16 {
    c.get(format!(
        "http://127.0.0.1:{proxy}/pluginsync/v1/assignment?environment=production"
    ))
    .header("X-Client-Verify", "SUCCESS")
    .header("X-Client-DN", format!("/CN={certname}"))
    .header(HEADER_REPORT, report.to_header())
    .send()
    .await
    .expect("request")
    .status()
    .as_u16()
}

/// A change whose plugin fails on every node that takes it: the first
/// wave's nodes report it, half to each replica (sharing one PostgreSQL);
/// both replicas halt from the fleet-wide counts before the next wave
/// opens (no node moves), and `rollback` brings the first wave back to
/// the old generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_failures_halt_the_rollout_on_both_replicas_and_rollback_restores_the_first_wave() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_rollout::load_failures_halt") else {
        return;
    };
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let policy = "[[rollout]]\nenvironments = [\"production\"]\n\
        waves = [ { after = \"0s\", percent = 20 }, { after = \"25s\", percent = 100 } ]\n\
        halt_on_load_failures = { percent = 50, min_nodes = 3 }\n";
    let metrics = closed_port();
    let extra = format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n");
    let (a, b) = two_replicas(dir.path(), (&tree, &pki), &pg.database(), &extra, policy);
    let cfg = a.config.clone();
    let (_ma, _mb) = (
        MasterProcess::spawn(&a.config),
        MasterProcess::spawn(&b.config),
    );
    let halted_series = || async {
        let url = format!("http://127.0.0.1:{metrics}/metrics");
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        text.lines()
            .find(|l| l.starts_with("pluginsync_rollout_halted{environment=\"production\"}"))
            .map(str::to_owned)
    };
    pluginsync_common::tls::install_default_provider();
    let c = reqwest::Client::new();
    let first = newest_on_both(&cfg, &a, &b, 1).await;
    tree.file(
        "production",
        "app",
        "lib/facter/app.rb",
        "raise 'broken'\n",
        0o644,
    );
    let new = newest_on_both(&cfg, &a, &b, 2).await;
    let wave1: Vec<bool> = census(&c, &a, &b, &new).await;
    assert_eq!(
        halted_series().await.as_deref(),
        Some("pluginsync_rollout_halted{environment=\"production\"} 0")
    );
    check_wave(&wave1, 20.0);
    // Each node of the first wave reports the failing load, alternately
    // to each replica; the others report the old generation, healthy.
    for (i, on_new) in wave1.iter().enumerate() {
        let (generation, failed) = if *on_new { (&new, 1) } else { (&first, 0) };
        let r = NodeReport {
            generation: Some(generation.parse().unwrap()),
            loads_ok: 3,
            loads_failed: failed,
            failed: if failed > 0 {
                vec!["facter/app.rb".into()]
            } else {
                vec![]
            },
        };
        let proxy = if i % 2 == 0 { a.proxy } else { b.proxy };
        assert_eq!(report(&c, proxy, &certname(i), &r).await, 200);
    }
    let halted = wait_for(PATIENCE, || async {
        let s = rollout(&cfg, "status", &[&a, &b]);
        s.iter().all(|s| s["halted"] == true).then_some(s)
    })
    .await
    .expect("both replicas halt");
    for s in &halted {
        let reason = s["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("report load failures"), "{s}");
        assert_eq!(
            s["generations"][0]["waves_open"], 1,
            "halted before the second wave: {s}"
        );
    }
    assert_eq!(
        halted_series().await.as_deref(),
        Some("pluginsync_rollout_halted{environment=\"production\"} 1")
    );
    tokio::time::sleep(Duration::from_secs(26)).await;
    assert_eq!(
        census(&c, &a, &b, &new).await,
        wave1,
        "halted: no node moves past the second wave's time"
    );
    rolled_back(&cfg, &a, &b).await;
    assert!(
        census(&c, &a, &b, &first).await.iter().all(|x| *x),
        "rolled back: the first wave is on the old generation again"
    );
}

/// Waves far enough apart that the first wave's census (200 nodes on two
/// replicas, on a loaded machine) is over well before the second opens.
const SHARED_WAVES: &str = "waves = [ { after = \"0s\", percent = 10 }, { after = \"20s\", percent = 50 }, { after = \"40s\", percent = 100 } ]";

/// Two replicas on one PostgreSQL, a new generation in its first wave:
/// the replicas' configs, the masters, and the first wave's census.
struct SharedRollout {
    a: Replica,
    b: Replica,
    masters: (MasterProcess, MasterProcess),
    client: reqwest::Client,
    first: String,
    new: String,
    first_wave: Vec<bool>,
    _keep: (EnvTree, Pki, tempfile::TempDir),
}

async fn shared_rollout(url: &str, extra_a: &str) -> SharedRollout {
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let policy = format!("[[rollout]]\nenvironments = [\"production\"]\n{SHARED_WAVES}\n");
    let (a, b) = two_replicas(dir.path(), (&tree, &pki), url, extra_a, &policy);
    let masters = (
        MasterProcess::spawn(&a.config),
        MasterProcess::spawn(&b.config),
    );
    pluginsync_common::tls::install_default_provider();
    let client = reqwest::Client::new();
    let first = newest_on_both(&a.config, &a, &b, 1).await;
    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    let new = newest_on_both(&a.config, &a, &b, 2).await;
    let first_wave = census_at(&a.config, &client, &a, &b, 1).await;
    check_wave(&first_wave, 10.0);
    SharedRollout {
        a,
        b,
        masters,
        client,
        first,
        new,
        first_wave,
        _keep: (tree, pki, dir),
    }
}

/// Two replicas on one PostgreSQL and no peers: waves alike on both, a
/// halt issued to one stops the other within 2 s (no node moves past the
/// next wave), a resume and a rollback issued to the other reach the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_postgresql_agree_and_a_halt_on_one_stops_the_other_within_2_s() {
    let Some(pg) = pluginsync_tests::Postgres::launch("replicas_on_one_postgresql_agree") else {
        return;
    };
    let s = shared_rollout(&pg.database(), "").await;
    let (a, b, cfg) = (&s.a, &s.b, &s.a.config);
    let issued = std::time::Instant::now();
    rollout(cfg, "halt", &[a]);
    let reached = wait_for(Duration::from_secs(10), || async {
        (rollout(cfg, "status", &[b])[0]["halted"] == true).then(|| issued.elapsed())
    })
    .await
    .expect("the halt reaches the other replica");
    assert!(reached <= Duration::from_secs(2), "{reached:?}");
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert_eq!(
        census(&s.client, a, b, &s.new).await,
        s.first_wave,
        "halted on one replica: neither widens past the second wave's time"
    );
    rollout(cfg, "resume", &[b]);
    let resumed = wait_for(PATIENCE, || async {
        (rollout(cfg, "status", &[a])[0]["halted"] == false).then_some(())
    })
    .await;
    assert!(resumed.is_some(), "the resume reaches the first replica");
    let rolled = rollout(cfg, "rollback", &[b]);
    assert_eq!(rolled[0]["generations"][0]["withdrawn"], true, "{rolled:?}");
    let back = wait_for(PATIENCE, || async {
        let s = rollout(cfg, "status", &[a]);
        (s[0]["generations"][0]["withdrawn"] == true).then_some(())
    })
    .await;
    assert!(back.is_some(), "the rollback reaches the first replica");
    assert!(
        census(&s.client, a, b, &s.first).await.iter().all(|x| *x),
        "rolled back: everyone on the first"
    );
    drop(s.masters);
}

/// PostgreSQL stopped for 30 s while the next wave is due: every node is
/// still answered, none moves, `/status/v1/simple` stays `running`, a
/// command fails with one line naming the database within 5 s; back, the
/// replicas take commands again within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_away_for_30_s_widens_nothing_and_refuses_commands_with_one_line() {
    let Some(pg) = pluginsync_tests::Postgres::launch("postgresql_away_for_30_s") else {
        return;
    };
    let metrics = closed_port();
    let extra = format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n");
    let url = pg.database();
    let s = shared_rollout(&url, &extra).await;
    let (a, b, cfg) = (&s.a, &s.b, &s.a.config);
    let up_series = || async {
        let url = format!("http://127.0.0.1:{metrics}/metrics");
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        text.lines()
            .find(|l| l.starts_with("pluginsync_state_store_up "))
            .map(str::to_owned)
    };
    assert_eq!(
        up_series().await.as_deref(),
        Some("pluginsync_state_store_up 1")
    );
    pg.stop();
    let stopped = std::time::Instant::now();
    let out = Command::new(bin_path("pluginsync-master"))
        .args(["rollout", "--config"])
        .arg(cfg)
        .args(["--master", &a.url(), "promote", "production"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        stopped.elapsed() < Duration::from_secs(7),
        "{:?}",
        stopped.elapsed()
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("state store postgresql://"), "{err}");
    let c = pluginsync_tests::client(&s._keep.1, None);
    let gone = wait_for(Duration::from_secs(10), || async {
        (up_series().await.as_deref() == Some("pluginsync_state_store_up 0")).then_some(())
    })
    .await;
    assert!(gone.is_some(), "pluginsync_state_store_up says 0");
    let check = || {
        let out = Command::new(bin_path("pluginsync-master"))
            .args(["check", "--config"])
            .arg(cfg)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = check();
    assert!(
        said.contains("warning: degraded: state store postgresql://"),
        "{said}"
    );
    let status = rollout(cfg, "status", &[a]);
    let why = status[0]["degraded"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("state store postgresql://") && why.contains("not answering"),
        "the rollout status says degraded and why: {status:?}"
    );
    let meanwhile = NodeReport {
        generation: Some(s.first.parse().unwrap()),
        loads_ok: 2,
        loads_failed: 0,
        failed: vec![],
    };
    assert_eq!(
        report(&s.client, b.proxy, "meanwhile.example.org", &meanwhile).await,
        200
    );
    while stopped.elapsed() < Duration::from_secs(30) {
        assert_eq!(
            census(&s.client, a, b, &s.new).await,
            s.first_wave,
            "the database away: no node moves"
        );
        for r in [a, b] {
            let simple = c
                .get(format!("{}/status/v1/simple", r.url()))
                .send()
                .await
                .unwrap();
            assert_eq!(simple.text().await.unwrap(), "running");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    pg.start();
    let back = std::time::Instant::now();
    let taken = wait_for(Duration::from_secs(10), || async {
        let out = Command::new(bin_path("pluginsync-master"))
            .args(["rollout", "--config"])
            .arg(cfg)
            .args(["--master", &a.url(), "promote", "production"])
            .output()
            .unwrap();
        out.status.success().then(|| back.elapsed())
    })
    .await
    .expect("a command taken once the database is back");
    assert!(taken <= Duration::from_secs(6), "{taken:?}");
    let on_b = wait_for(PATIENCE, || async {
        let s = rollout(cfg, "status", &[b]);
        (s[0]["generations"][0]["promoted"] == true).then_some(())
    })
    .await;
    assert!(on_b.is_some(), "the promotion reaches the other replica");
    assert!(
        rollout(cfg, "status", &[a])[0]["degraded"].is_null(),
        "no longer degraded"
    );
    let written = wait_for(Duration::from_secs(10), || async {
        let q = "SELECT count(*) FROM node_reports WHERE certname = 'meanwhile.example.org'";
        (pg.sql(&url, q) == "1").then_some(())
    })
    .await;
    assert!(
        written.is_some(),
        "a report sent meanwhile is written once the database is back"
    );
    assert!(
        census(&s.client, a, b, &s.new).await.iter().all(|x| *x),
        "promoted: everyone on the new"
    );
    drop(s.masters);
}

/// A master on PostgreSQL killed (SIGKILL) at a random instant of each of
/// 20 commands (halt and resume in turn): each command is in the database
/// whole or not at all — the state's clock counts exactly the history's
/// rows, and the state's halt is the last history row's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_command_leaves_each_command_whole_or_absent() {
    let Some(pg) = pluginsync_tests::Postgres::launch("a_master_killed_mid_command") else {
        return;
    };
    let seed = pluginsync_tests::Lcg::seed_from_env();
    eprintln!("FAULT_SEED={seed}");
    let mut lcg = pluginsync_tests::Lcg::new(seed);
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let url = pg.database();
    let policy =
        format!("[state]\nurl = {url:?}\n[[rollout]]\nenvironments = [\"production\"]\n{WAVES}\n");
    let m = replica(dir.path(), "k", (&tree, &pki), closed_port(), &policy);
    let state = "SELECT clock, halted_at IS NOT NULL FROM rollout_commands WHERE environment = 'production'";
    for i in 0..20 {
        let master = MasterProcess::spawn(&m.config);
        let kept = wait_for(PATIENCE, || async {
            let s = rollout(&m.config, "status", &[&m]);
            s[0]["generations"]
                .as_array()
                .is_some_and(|g| !g.is_empty())
                .then_some(())
        })
        .await;
        assert!(kept.is_some(), "the master keeps its generation");
        let action = if i % 2 == 0 { "halt" } else { "resume" };
        let mut client = Command::new(bin_path("pluginsync-master"))
            .args(["rollout", "--config"])
            .arg(&m.config)
            .args(["--master", &m.url(), action, "production"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(lcg.range(0, 60))).await;
        drop(master); // SIGKILL
        let _ = client.wait();
        let row = pg.sql(&url, state);
        let history = pg.sql(
            &url,
            "SELECT count(*) FROM rollout_history WHERE environment = 'production'",
        );
        let last = pg.sql(
            &url,
            "SELECT halted_at IS NOT NULL FROM rollout_history
             WHERE environment = 'production' ORDER BY id DESC LIMIT 1",
        );
        match row.split_once('|') {
            None => assert_eq!(history, "0", "no state, no history (command {i})"),
            Some((clock, halted)) => {
                assert_eq!(clock, history, "the clock counts the history (command {i})");
                assert_eq!(
                    halted, last,
                    "the state is the last command's (command {i})"
                );
            }
        }
    }
    let applied = pg.sql(
        &url,
        "SELECT count(*) FROM rollout_history WHERE environment = 'production'",
    );
    eprintln!("{applied} of 20 commands applied before their master was killed");
}
