//! Stock agents' health through Puppet's own run reports
//! (docs/puppet-fleet.md#stock-agents-reports): one throwaway Puppet Server
//! 7 with `reports = store,http` and `reporturl` naming
//! `/pluginsync/v1/reports/puppet` through HAProxy with
//! `packaging/haproxy-puppet.cfg` (both of its masters one pluginsync
//! master, `[reports] puppetserver_certnames` naming Puppet Server), and a
//! stock `puppet agent -t` node syncing through the same balancer.
//!
//! A clean generation first: the node is listed on it, failing nothing.
//! Then a generation with a custom fact that does not load (syntax error),
//! one that raises in `setcode`, a facts.d script exiting 3 after writing
//! to stderr, and a fact raising in a file not named after it (its error
//! names no file of the generation: not counted): the master's inventory
//! shows the node failing exactly the three plugins on the generation it
//! was served, the rollout's gate (every node at once, halting on one
//! failing) halts on it, and the master's log never carries the
//! messages' text.
//! Puppet Server's stored copy of the report (the same YAML the `http`
//! processor posts) reads with the master's parser. The facts fixed, the
//! next run's clean report clears the failures.
//!
//! Skipped with a message where `puppet`, `puppetserver` or `haproxy` is
//! missing, except under CI. The endpoint's refusals and bounds (403 by
//! default, 413, YAML bombs in bounded memory) are tested alone, without
//! Puppet.

use std::path::Path;
use std::time::{Duration, Instant};

use pluginsync_tests::balancer::{Backends, Balancer, ProxyBackend, wait_served};
use pluginsync_tests::puppet::{PuppetAgent, PuppetServer};
use pluginsync_tests::{EnvTree, Pki, closed_port, require};

use crate::puppet_fleet::{inventory, node_ssldir};

const TEST: &str = "puppet_reports";
const SECRET: &str = "secret-7f3a";
const GOOD: &str = "Facter.add(:good) { setcode { 'fine' } }\n";
const BROKEN: &str = "Facter.add(:broken) { setcode { 'x' \n";
const RAISES: &str = "Facter.add(:raises) { setcode { raise 'the token secret-7f3a is wrong' } }\n";
const MISNAMED: &str = "Facter.add(:elsewhere) { setcode { raise 'secret-7f3a elsewhere' } }\n";
const BAD_SH: &str = "#!/bin/sh\necho 'failing with secret-7f3a' >&2\nexit 3\n";

/// Every node takes a new generation at once; the gate halts when one of
/// them fails.
const POLICY: &str = "[[rollout]]\nenvironments = [\"production\"]\n\
    waves = [ { after = \"0s\", percent = 100 } ]\n\
    halt_on_load_failures = { percent = 20, min_nodes = 1 }\n";

/// `method` of the rollout admin call for production (`query` appended),
/// as the master itself: the status as JSON, `Null` when it cannot be had.
fn rollout(master: &ProxyBackend, ssl: &Path, post: bool, query: &str) -> serde_json::Value {
    let (client, rt) = pluginsync_tests::ssldir_client(ssl, Some("localhost"));
    let url = format!(
        "{}/pluginsync/v1/admin/rollout?environment=production{query}",
        master.tls_url()
    );
    rt.block_on(async {
        let req = if post {
            client.post(url)
        } else {
            client.get(url)
        };
        req.send()
            .await
            .ok()?
            .json::<serde_json::Value>()
            .await
            .ok()
    })
    .unwrap_or(serde_json::Value::Null)
}

fn put(envpath: &Path, rel: &str, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let path = envpath.join("production/modules/health").join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The node's inventory entry once `ready` holds for it (at most 90 s).
fn wait_entry(
    master: &ProxyBackend,
    ssl: &Path,
    what: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let inv = inventory(&master.tls_url(), ssl);
        let entry = inv["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["certname"] == "stock1").cloned());
        if let Some(e) = entry.filter(|e| ready(e)) {
            return e;
        }
        assert!(
            Instant::now() < end,
            "{what}: not in the inventory: {inv}\n{}",
            master.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn failed(entry: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = entry["failed_plugins"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn stock_agents_run_reports_put_their_plugin_failures_in_the_inventory() {
    let Some(puppet) = require("puppet", "puppet", TEST) else {
        return;
    };
    if !PuppetServer::required(TEST) {
        return;
    }
    let Some(haproxy) = require("haproxy", "haproxy", TEST) else {
        return;
    };
    let http_port = closed_port().to_string();
    // The master and the balancer start between the sandbox's setup (the
    // CA exists) and the JVM (which reads `reporturl` once).
    let mut held: Option<(ProxyBackend, Balancer)> = None;
    let server = PuppetServer::start_with(
        &[
            "--http-port",
            &http_port,
            "--header-identity",
            "--certs",
            "stock1",
        ],
        |envpath| {
            put(envpath, "lib/facter/good.rb", GOOD, 0o644);
            put(envpath, "facts.d/good.txt", "good_ext=1\n", 0o644);
            let root = envpath.parent().unwrap().parent().unwrap();
            let ssl = root.join("ssl");
            let (cert, key) = (
                ssl.join("certs/localhost.pem"),
                ssl.join("private_keys/localhost.pem"),
            );
            let (ca, crl) = (ssl.join("certs/ca.pem"), ssl.join("crl.pem"));
            let base = envpath.parent().unwrap().join("modules");
            let master = ProxyBackend::spawn_with(
                envpath,
                &base,
                [&cert, &key, &ca, &crl],
                &format!("[reports]\npuppetserver_certnames = [\"localhost\"]\n{POLICY}"),
            );
            let backends = Backends {
                cert,
                key,
                ca,
                crl,
                puppetserver: format!("127.0.0.1:{http_port}"),
                pluginsync: vec![master.proxy.clone(), master.proxy.clone()],
            };
            let lb = Balancer::haproxy(&haproxy, &backends);
            let conf = root.join("conf/puppet.conf");
            let mut text = std::fs::read_to_string(&conf).unwrap();
            assert!(text.contains("[server]"), "{text}");
            // Appended to the file's last section, [server].
            text.push_str(&format!(
                "reports = store,http\nreporturl = https://localhost:{}/pluginsync/v1/reports/puppet\n",
                lb.port
            ));
            std::fs::write(&conf, text).unwrap();
            held = Some((master, lb));
        },
    );
    let (master, lb) = held.expect("master and balancer");
    let ssl = server.ssldir();
    lb.wait_puppetserver(&ssl);
    let work = tempfile::tempdir().unwrap();
    let node_ssl = node_ssldir(&server, work.path(), "stock1");
    let agent = PuppetAgent::new(&puppet, work.path(), &node_ssl, "stock1", lb.port);

    // A clean generation: listed, failing nothing.
    let run = agent.agent_test_reporting("production");
    assert!(matches!(run.code, 0 | 2), "first run:\n{}", run.output);
    let clean = wait_entry(&master, &ssl, "the clean run", |e| {
        e["generation"].is_string() && master.log_text().contains("Puppet run report recorded")
    });
    assert_eq!(clean["load_failures"], 0, "{clean}");
    let first = clean["generation"].as_str().unwrap().to_owned();

    // The broken facts.
    let envpath = server.envpath();
    put(&envpath, "lib/facter/broken.rb", BROKEN, 0o644);
    put(&envpath, "lib/facter/raises.rb", RAISES, 0o644);
    put(&envpath, "lib/facter/misnamed.rb", MISNAMED, 0o644);
    put(&envpath, "facts.d/bad.sh", BAD_SH, 0o755);
    wait_served(
        std::slice::from_ref(&master),
        "stock1",
        "pluginfacts",
        "bad.sh",
        BAD_SH,
    );
    let run = agent.agent_test_reporting("production");
    assert!(
        run.output.contains("Error loading fact") && run.output.contains("fact='raises'"),
        "the broken facts did not fail on the node:\n{}",
        run.output
    );
    let broken = wait_entry(&master, &ssl, "the broken run", |e| {
        e["generation"].as_str().is_some_and(|g| g != first) && e["load_failures"] != 0
    });
    assert_eq!(
        failed(&broken),
        [
            "pluginfacts/bad.sh",
            "plugins/facter/broken.rb",
            "plugins/facter/raises.rb"
        ],
        "{broken}\n{}",
        run.output
    );
    assert_eq!(broken["load_failures"], 3, "{broken}");
    assert_eq!(broken["source"], "served", "{broken}");
    let log = master.log_text();
    assert!(
        !log.contains(SECRET),
        "the master logged a message's text:\n{log}"
    );

    // The gate counts the stock node's failures: the rollout halts.
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = rollout(&master, &ssl, false, "");
        if status["halted"] == true || Instant::now() > end {
            break status;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(status["halted"], true, "{status}");
    assert!(
        status["reason"]
            .as_str()
            .is_some_and(|r| r.contains("1 of 1 nodes")),
        "{status}"
    );
    let resumed = rollout(&master, &ssl, true, "&action=resume");
    assert_eq!(resumed["halted"], false, "{resumed}");

    // Puppet Server's stored copy reads as what it posted.
    let root = envpath.parent().unwrap().parent().unwrap();
    let mut stored: Vec<_> = ["server-var", "var"]
        .iter()
        .filter_map(|v| std::fs::read_dir(root.join(v).join("reports/stock1")).ok())
        .flatten()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!stored.is_empty(), "Puppet Server stored no report");
    stored.sort();
    let yaml = std::fs::read_to_string(stored.last().unwrap()).unwrap();
    if let Some(dir) = std::env::var_os("PLUGINSYNC_CAPTURE_REPORT") {
        std::fs::write(Path::new(&dir).join("puppet-run-report.yaml"), &yaml).unwrap();
    }
    let parsed = pluginsync_master::puppet_report::parse(&yaml).expect("the stored report");
    assert_eq!(parsed.host, "stock1");
    assert!(
        parsed
            .logs
            .iter()
            .any(|l| l.is_error() && l.message.contains("broken.rb")),
        "{parsed:?}"
    );

    // Fixed: the next run's clean report clears the failures.
    for rel in [
        "lib/facter/broken.rb",
        "lib/facter/raises.rb",
        "lib/facter/misnamed.rb",
    ] {
        std::fs::remove_file(envpath.join("production/modules/health").join(rel)).unwrap();
    }
    put(&envpath, "facts.d/bad.sh", "#!/bin/sh\necho bad=0\n", 0o755);
    wait_served(
        std::slice::from_ref(&master),
        "stock1",
        "pluginfacts",
        "bad.sh",
        "#!/bin/sh\necho bad=0\n",
    );
    let broken_generation = broken["generation"].as_str().unwrap().to_owned();
    let recorded = || {
        master
            .log_text()
            .matches("Puppet run report recorded")
            .count()
    };
    let before = recorded();
    let run = agent.agent_test_reporting("production");
    assert!(matches!(run.code, 0 | 2), "fixed run:\n{}", run.output);
    let fixed = wait_entry(&master, &ssl, "the fixed run", |e| {
        e["generation"]
            .as_str()
            .is_some_and(|g| g != broken_generation)
            && recorded() > before
    });
    assert_eq!(fixed["load_failures"], 0, "{fixed}");
    assert_eq!(failed(&fixed), Vec::<String>::new(), "{fixed}");
}

/// `POST /pluginsync/v1/reports/puppet` of `body` to `master` as
/// `certname`: the status and the body.
fn post(pki: &Pki, master: &ProxyBackend, certname: &str, body: Vec<u8>) -> (u16, String) {
    let client = pluginsync_tests::client(pki, Some(certname));
    let url = format!("{}/pluginsync/v1/reports/puppet", master.tls_url());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let resp = client
            .post(url)
            .header("Content-Type", "application/x-yaml")
            .body(body)
            .send()
            .await
            .expect("post");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    })
}

/// The peak resident set of process `pid` (`VmHWM`), in bytes.
fn peak(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// The endpoint alone (no Puppet needed): refused to everyone by default
/// and to a certname not listed, one log line each; a body over
/// `max_body_mib` is 413; YAML bombs of 16 MiB (deep flow and block
/// nesting; billion laughs, 100,000 aliases) are refused or harmless
/// with the master's peak memory growing by less than 128 MiB; nothing of
/// a body is echoed.
#[test]
fn the_report_endpoint_refuses_strangers_oversized_bodies_and_bombs() {
    let pki = Pki::new();
    let tree = EnvTree::new();
    tree.file("production", "m", "lib/facter/a.rb", "# a\n", 0o644);
    let base = tree.outside();
    std::fs::create_dir_all(&base).unwrap();
    let tls = [
        pki.cert("localhost"),
        pki.key("localhost"),
        pki.ca(),
        pki.crl(),
    ];
    let tls = [
        tls[0].as_path(),
        tls[1].as_path(),
        tls[2].as_path(),
        tls[3].as_path(),
    ];
    let default = ProxyBackend::spawn(&tree.envpath(), &base, tls);
    let (status, body) = post(&pki, &default, "node2", b"host: node1\n".to_vec());
    assert_eq!(status, 403, "{body}");
    let reports = "[reports]\npuppetserver_certnames = [\"node2\"]\nmax_body_mib = 17\n";
    let master = ProxyBackend::spawn_with(&tree.envpath(), &base, tls, reports);
    let (status, body) = post(&pki, &master, "node1", b"host: node1\n".to_vec());
    assert_eq!(status, 403, "{body}");
    let refused = |m: &ProxyBackend| {
        m.log_text()
            .lines()
            .filter(|l| l.contains("not in [reports] puppetserver_certnames"))
            .count()
    };
    assert_eq!((refused(&default), refused(&master)), (1, 1));
    // A node nobody served: accepted, recorded nowhere.
    let (status, _) = post(&pki, &master, "node2", b"host: node1\nlogs: []\n".to_vec());
    assert_eq!(status, 204);
    let (status, _) = post(&pki, &master, "node2", vec![b'#'; 18 << 20]);
    assert_eq!(status, 413);

    let before = peak(master.pid());
    let sixteen = 16usize << 20;
    let deep_flow = format!("host: x\nlogs: {}", "[".repeat(sixteen - 20));
    let deep_block: String = (0..2000)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let mut lol = String::from("a0: &a0 [secret-lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        lol.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    lol.push_str("host: node1\nlogs: [*a9, *a9, *a9]\n");
    let aliases = format!(
        "host: node1\nx: &x [secret-lol]\nlogs: [{}*x]\n",
        "*x, ".repeat(100_000)
    );
    for (name, body, want) in [
        ("deep flow", deep_flow, 400),
        ("deep block", deep_block, 400),
        ("billion laughs", lol, 204),
        ("100,000 aliases", aliases, 204),
    ] {
        let started = Instant::now();
        let (status, text) = post(&pki, &master, "node2", body.into_bytes());
        assert_eq!(status, want, "{name}: {text}");
        assert!(
            !text.contains("secret-lol") && !text.contains('\n'),
            "{name}: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: {:?}",
            started.elapsed()
        );
    }
    let grown = peak(master.pid()).saturating_sub(before);
    assert!(grown < 128 << 20, "the master's peak grew by {grown} bytes");
    assert!(!master.log_text().contains("secret-lol"));
}
