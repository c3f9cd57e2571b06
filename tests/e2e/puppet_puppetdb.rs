//! Puppet's own inventory learns which generation each node runs
//! (docs/puppet-fleet.md#the-pluginsync-fact-in-puppetdb), with nothing of
//! ours in PuppetDB: a throwaway PuppetDB 7 on the test's PostgreSQL,
//! Puppet Server 7 its `storeconfigs` client (facts through Debian's
//! PuppetDB terminus), one pluginsync master and HAProxy with
//! `packaging/haproxy-puppet.cfg` in front of both.
//!
//! The node runs our agent (puppet.conf naming the balancer) with
//! `[facts] external_dir` where Facter reads external facts, then one
//! stock `puppet agent -t`: PQL's
//! `facts[certname, value] { name = "pluginsync" }` answers the node's
//! fact, naming the generation the master's inventory reports for it.
//! Facter reads `/etc/facter/facts.d` as root (Debian's Facter); the stock
//! run sees the node's directory there through a mount namespace of its
//! own, so the host's directory stays as it was.
//!
//! SKIPPED with a message where `puppet`, `puppetserver`, `puppetdb`,
//! `haproxy` or PostgreSQL is missing, or the tests do not run as root,
//! except under CI. Two JVMs (Puppet Server and PuppetDB start side by
//! side).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pluginsync_tests::balancer::{Backends, Balancer, ProxyBackend};
use pluginsync_tests::puppet::{PuppetAgent, PuppetServer};
use pluginsync_tests::puppetdb::PuppetDb;
use pluginsync_tests::{Postgres, bin_path, closed_port, require, running_as_root, skipped};
use serde_json::Value;

use crate::puppet_fleet::{inventory, node_ssldir};

const TEST: &str = "puppet_puppetdb";
const NODE: &str = "node1";

fn put(envpath: &Path, rel: &str, text: &str) {
    let path = envpath.join("production/modules/inv").join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
}

/// Our agent's home: puppet.conf naming the balancer and the node's
/// certificate, agent.toml its vardir, puppet.conf and Facter's
/// external directory (`facter/`).
fn agent_home(dir: &Path, ssldir: &Path, lb_port: u16) -> PathBuf {
    let home = dir.display();
    let conf = dir.join("puppet.conf");
    std::fs::write(
        &conf,
        format!(
            "[main]\nssldir = {ssldir}\nserver_list = localhost:{lb_port}\n\
             logdir = {home}/plog\nrundir = {home}/prun\nlibdir = {home}/plib\n\n\
             [agent]\ncertname = {NODE}\npluginfactdest = {home}/pfacts\n",
            ssldir = ssldir.display(),
        ),
    )
    .unwrap();
    let toml = dir.join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "vardir = \"var\"\npuppet_conf = {conf:?}\n\n[facts]\nexternal_dir = {:?}\n",
            dir.join("facter").display().to_string()
        ),
    )
    .unwrap();
    toml
}

/// Our agent's sync; the generation its `pluginsync` fact names.
fn sync(toml: &Path, facter_dir: &Path) -> String {
    let out = Command::new(bin_path("pluginsync-agent"))
        .args(["sync", "--format", "json", "--config"])
        .arg(toml)
        .env_remove("RUST_LOG")
        .output()
        .expect("run pluginsync-agent");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Value = serde_json::from_slice(
        &std::fs::read(facter_dir.join("pluginsync.json")).expect("the agent wrote its fact"),
    )
    .expect("the fact is JSON");
    written["pluginsync"]["production"]["generation"]
        .as_str()
        .unwrap_or_else(|| panic!("no generation in the agent's fact: {written}"))
        .to_owned()
}

/// The generation the master's inventory reports for the node (at most
/// 60 s: the agent's report is written behind its request).
fn inventory_generation(master: &ProxyBackend, ssl: &Path) -> String {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let inv = inventory(&master.tls_url(), ssl);
        let entry = inv["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["certname"] == NODE).cloned());
        if let Some(g) = entry.and_then(|e| e["generation"].as_str().map(str::to_owned)) {
            return g;
        }
        assert!(Instant::now() < end, "{NODE} not in the inventory: {inv}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The node's row of `facts[certname, value] { name = "pluginsync" }` as
/// PuppetDB answers it (at most 120 s: PuppetDB stores a command's facts
/// asynchronously).
fn wait_fact(pdb: &PuppetDb) -> Value {
    let pql = r#"facts[certname, value] { name = "pluginsync" }"#;
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let answer = pdb.query(pql);
        let row = answer
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["certname"] == NODE).cloned());
        if let Some(row) = row {
            return row;
        }
        assert!(
            Instant::now() < end,
            "PuppetDB has no pluginsync fact for {NODE}: {answer}\n{}",
            pdb.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether everything the test needs is here (else a visible SKIPPED
/// line, or a failure under CI): `puppet` and `haproxy`'s paths.
fn needs() -> Option<(PathBuf, PathBuf)> {
    let puppet = require("puppet", "puppet", TEST)?;
    if !PuppetServer::required(TEST) || !PuppetDb::required(TEST) {
        return None;
    }
    let haproxy = require("haproxy", "haproxy", TEST)?;
    if !running_as_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{TEST} runs as root under CI"
        );
        skipped(
            TEST,
            "not root: the stock run reads Facter's /etc/facter/facts.d through a mount namespace",
        );
        return None;
    }
    Some((puppet, haproxy))
}

/// Puppet Server storing facts in a PuppetDB started beside it, one
/// pluginsync master serving a module with a custom and an external fact,
/// HAProxy in front of both.
fn peers(pg: &Postgres, haproxy: &Path) -> (PuppetServer, PuppetDb, ProxyBackend, Balancer) {
    let pdb_port = closed_port();
    let http_port = closed_port().to_string();
    let pdb_url = format!("https://localhost:{pdb_port}");
    let setup = [
        "--http-port",
        &http_port,
        "--header-identity",
        "--certs",
        NODE,
        "--puppetdb",
        &pdb_url,
    ];
    let mut held = None;
    let server = PuppetServer::start_with(&setup, |envpath| {
        put(
            envpath,
            "lib/facter/inv_role.rb",
            "Facter.add(:inv_role) { setcode { 'web' } }\n",
        );
        put(envpath, "facts.d/inv.txt", "inv_ext=1\n");
        let ssl = envpath.parent().unwrap().parent().unwrap().join("ssl");
        let pdb = PuppetDb::spawn(pg, &ssl, "localhost", pdb_port);
        let (cert, key) = (
            ssl.join("certs/localhost.pem"),
            ssl.join("private_keys/localhost.pem"),
        );
        let (ca, crl) = (ssl.join("certs/ca.pem"), ssl.join("crl.pem"));
        let base = envpath.parent().unwrap().join("modules");
        let master = ProxyBackend::spawn(envpath, &base, [&cert, &key, &ca, &crl]);
        let backends = Backends {
            cert,
            key,
            ca,
            crl,
            puppetserver: format!("127.0.0.1:{http_port}"),
            pluginsync: vec![master.proxy.clone(), master.proxy.clone()],
        };
        let lb = Balancer::haproxy(haproxy, &backends);
        held = Some((pdb, master, lb));
    });
    let (mut pdb, master, lb) = held.expect("PuppetDB, master and balancer");
    lb.wait_puppetserver(&server.ssldir());
    let started = Instant::now();
    pdb.wait_running(Duration::from_secs(300));
    eprintln!(
        "{TEST}: PuppetDB running {:?} after Puppet Server",
        started.elapsed()
    );
    (server, pdb, master, lb)
}

#[test]
fn puppetdb_answers_each_nodes_generation_from_the_pluginsync_fact() {
    let Some((puppet, haproxy)) = needs() else {
        return;
    };
    let Some(pg) = Postgres::launch(TEST) else {
        return;
    };
    let started = Instant::now();
    let (server, pdb, master, lb) = peers(&pg, &haproxy);
    let work = tempfile::tempdir().unwrap();
    let node_ssl = node_ssldir(&server, work.path(), NODE);
    eprintln!("{TEST}: peers up in {:?}", started.elapsed());

    // Our agent: a generation, its fact where Facter reads external facts;
    // the master's inventory names the same generation for the node.
    let home = tempfile::tempdir().unwrap();
    let toml = agent_home(home.path(), &node_ssl, lb.port);
    let facter_dir = home.path().join("facter");
    let committed = sync(&toml, &facter_dir);
    let reported = inventory_generation(&master, &server.ssldir());
    assert_eq!(
        committed, reported,
        "the fact names {committed}, the master's inventory {reported}"
    );

    // One stock run uploads the node's facts through Puppet Server;
    // PuppetDB answers the fact, the generation the master reports.
    let stock = PuppetAgent::new(&puppet, work.path(), &node_ssl, NODE, lb.port);
    let run = stock.agent_test_with_facter_dir("production", &facter_dir);
    assert!(
        matches!(run.code, 0 | 2),
        "puppet agent -t:\n{}",
        run.output
    );
    let row = wait_fact(&pdb);
    eprintln!("{TEST}: PQL answered {row}");
    let fact = &row["value"]["production"];
    assert_eq!(
        fact["generation"].as_str(),
        Some(reported.as_str()),
        "PuppetDB's pluginsync fact against the master's inventory: {row}"
    );
    assert_eq!(fact["failing"], serde_json::json!([]), "{row}");
    assert!(fact["committed"].is_string(), "{row}");
    eprintln!("{TEST}: {:?} in all", started.elapsed());
}
