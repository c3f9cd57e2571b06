//! Puppet's own inventory learns which generation each node runs
//! (docs/puppet-fleet.md#puppets-own-inventory), with nothing of ours in
//! PuppetDB: a throwaway PuppetDB 7 on the suite's PostgreSQL, Puppet
//! Server 7 its `storeconfigs` client (facts through the PuppetDB
//! terminus), one pluginsync master and HAProxy with
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
//! Skipped with a message where `puppet`, `puppetserver`, `puppetdb`,
//! `haproxy` or PostgreSQL is missing, or the tests do not run as root,
//! except under CI.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pluginsync_tests::balancer::{Backends, Balancer, ProxyBackend};
use pluginsync_tests::Postgres;
use pluginsync_tests::puppet::{PuppetAgent, PuppetServer};
use pluginsync_tests::puppetdb::PuppetDb;
use pluginsync_tests::{bin_path, closed_port, require, running_as_root, skipped};
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
fn agent_home(dir: &Path, ssldir: &Path, lb_port: u16) -> std::path::PathBuf {
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

/// The node's `pluginsync` fact as PuppetDB answers it (at most 120 s:
/// PuppetDB stores a command's facts asynchronously).
fn wait_fact(pdb: &PuppetDb) -> Value {
    let pql = r#"facts[certname, value] { name = "pluginsync" }"#;
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let answer = pdb.query(pql);
        let row = answer
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["certname"] == NODE).cloned());
        if let Some(row) = row {
            return row["value"].clone();
        }
        assert!(
            Instant::now() < end,
            "PuppetDB has no pluginsync fact for {NODE}: {answer}\n{}",
            pdb.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn puppetdb_answers_each_nodes_generation_from_the_pluginsync_fact() {
    let Some(puppet) = require("puppet", "puppet", TEST) else {
        return;
    };
    if !PuppetServer::required(TEST) || !PuppetDb::required(TEST) {
        return;
    }
    let Some(haproxy) = require("haproxy", "haproxy", TEST) else {
        return;
    };
    if !running_as_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{TEST} runs as root under CI"
        );
        skipped(
            TEST,
            "not root: the stock run reads Facter's /etc/facter/facts.d through a mount namespace",
        );
        return;
    }
    let Some(pg) = Postgres::launch(TEST) else {
        return;
    };
    let pdb_port = PuppetDb::port();
    let http_port = closed_port().to_string();
    let pdb_url = format!("https://localhost:{pdb_port}");
    let mut held: Option<(ProxyBackend, Balancer)> = None;
    let server = PuppetServer::start_with(
        &[
            "--http-port",
            &http_port,
            "--header-identity",
            "--certs",
            NODE,
            "--puppetdb",
            &pdb_url,
        ],
        |envpath| {
            put(envpath, "lib/facter/inv_role.rb", "Facter.add(:inv_role) { setcode { 'web' } }\n");
            put(envpath, "facts.d/inv.txt", "inv_ext=1\n");
            let root = envpath.parent().unwrap().parent().unwrap();
            let ssl = root.join("ssl");
            let (cert, key) = (
                ssl.join("certs/localhost.pem"),
                ssl.join("private_keys/localhost.pem"),
            );
            let (ca, crl) = (ssl.join("certs/ca.pem"), ssl.join("crl.pem"));
            let base = envpath.parent().unwrap().join("modules");
            let master = ProxyBackend::spawn_with(envpath, &base, [&cert, &key, &ca, &crl], "");
            let backends = Backends {
                cert,
                key,
                ca,
                crl,
                puppetserver: format!("127.0.0.1:{http_port}"),
                pluginsync: vec![master.proxy.clone(), master.proxy.clone()],
            };
            let lb = Balancer::haproxy(&haproxy, &backends);
            held = Some((master, lb));
        },
    );
    let (master, lb) = held.expect("master and balancer");
    let pdb = PuppetDb::start(&pg, &server.ssldir(), "localhost", pdb_port);
    let work = tempfile::tempdir().unwrap();
    let node_ssl = node_ssldir(&server, work.path(), NODE);

    // Our agent: a generation, its fact where Facter reads external facts.
    let home = tempfile::tempdir().unwrap();
    let toml = agent_home(home.path(), &node_ssl, lb.port);
    let out = Command::new(bin_path("pluginsync-agent"))
        .args(["sync", "--format", "json", "--config"])
        .arg(&toml)
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
    let facter_dir = home.path().join("facter");
    let written: Value = serde_json::from_slice(
        &std::fs::read(facter_dir.join("pluginsync.json")).expect("the agent wrote its fact"),
    )
    .expect("the fact is JSON");
    let committed = written["pluginsync"]["production"]["generation"]
        .as_str()
        .expect("a generation in the fact")
        .to_owned();

    // The master's inventory names the same generation for the node.
    let end = Instant::now() + Duration::from_secs(60);
    let reported = loop {
        let inv = inventory(&master.tls_url(), &server.ssldir());
        let entry = inv["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["certname"] == NODE).cloned());
        if let Some(g) = entry.and_then(|e| e["generation"].as_str().map(str::to_owned)) {
            break g;
        }
        assert!(Instant::now() < end, "{NODE} not in the inventory: {inv}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        committed.starts_with(&reported),
        "the fact names {committed}, the master's inventory {reported}"
    );

    // One stock run uploads the node's facts; PuppetDB answers the fact.
    let stock = PuppetAgent::new(&puppet, work.path(), &node_ssl, NODE, lb.port);
    let run = stock.agent_test_with_facter_dir("production", &facter_dir);
    assert!(matches!(run.code, 0 | 2), "puppet agent -t:\n{}", run.output);
    let fact = wait_fact(&pdb);
    assert_eq!(
        fact["production"]["generation"].as_str(),
        Some(committed.as_str()),
        "PuppetDB's pluginsync fact: {fact}"
    );
    assert_eq!(fact["production"]["failing"], serde_json::json!([]), "{fact}");
    assert!(
        fact["production"]["committed"].is_string(),
        "PuppetDB's pluginsync fact: {fact}"
    );
}
