//! A live Puppet fleet split by a layer-7 balancer (a full Puppet run
//! through the split, and the server-assigned environment;
//! docs/puppet-fleet.md#running-in-a-puppet-fleet):
//! one throwaway Puppet Server 7 in header-identity mode
//! (`allow-header-cert-info`, plain HTTP behind the balancer, an ENC),
//! two pluginsync masters serving the same code tree from their `[proxy]`
//! listeners (docs/protocol.md §5.5), and in front of them HAProxy with
//! `packaging/haproxy-puppet.cfg`, then nginx with
//! `packaging/nginx-puppet.conf`, both as written.
//!
//! Through each balancer a stock `puppet agent -t` completes a run: exit 2
//! (changes), the manifest's file applied at the path a synced plugin's
//! fact names, plugins and external facts on the node; every plugins and
//! pluginfacts request was answered by a pluginsync master (their access
//! logs) and none by Puppet Server (its access log); a changed plugin
//! reaches the node on the next run. Then pluginsync's agent with
//! `environment_source = "server"` syncs the environment Puppet Server's
//! ENC assigns. (Its fallback against a pluginsync master alone is in
//! agent_puppetconf.rs.) Through each balancer pluginsync's agent also
//! takes a generation (per-node answer, manifest and blobs from the
//! masters) and its node report reaches them (a master's inventory lists
//! it); through HAProxy with the `/pluginsync/v1/` route removed it syncs
//! listings and warns once per run that the balancer lacks that route.
//!
//! Skipped with a message where `puppet`, `puppetserver` or both balancers
//! are missing (one balancer missing skips its part), except under CI. One
//! JVM for the whole module: it takes a minute or more to start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_tests::balancer::{Backends, Balancer, ProxyBackend, wait_served};
use pluginsync_tests::puppet::{PuppetAgent, PuppetServer};
use pluginsync_tests::{
    AgentHome, closed_port, merged_mount, repo_root, require, tree_snapshot, without_modes,
};

const TEST: &str = "puppet_fleet";

/// The plugin whose fact names where the manifest's file goes: the run
/// that applies the catalog must have loaded it.
const TARGET_FACT: &str =
    "Facter.add(:fleet_target) { setcode { File.join(Puppet[:vardir], 'fleet-applied.txt') } }\n";
/// The plugin the tests change between runs.
const VERSION_RB: &str = "lib/fleet/version.rb";

/// The code tree both Puppet Server and the masters serve: `production`
/// (two modules, plugins and external facts; its site.pp comes from the
/// sandbox's `--manifest`) and `assigned`, the ENC's environment.
fn populate(envpath: &Path) {
    let put = |rel: &str, text: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let path = envpath.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let prod = "production/modules";
    put(
        &format!("{prod}/fleet/lib/facter/fleet_target.rb"),
        TARGET_FACT,
        0o644,
    );
    put(&format!("{prod}/fleet/{VERSION_RB}"), "# v1\n", 0o644);
    put(
        &format!("{prod}/fleet/facts.d/fleet.txt"),
        "fleet_fact=one\n",
        0o644,
    );
    put(
        &format!("{prod}/tools/lib/puppet/functions/tools/hello.rb"),
        "Puppet::Functions.create_function(:'tools::hello') { def hello; 'hi'; end }\n",
        0o644,
    );
    put(
        &format!("{prod}/tools/facts.d/tools.sh"),
        "#!/bin/sh\necho tools_fact=two\n",
        0o755,
    );
    put(
        "assigned/modules/fleet/lib/assigned.rb",
        "# assigned\n",
        0o644,
    );
}

/// An ssldir of the agent's own holding only what a node has: the CA
/// bundle, the CRL, its certificate and key (copied from the sandbox's).
pub(crate) fn node_ssldir(server: &PuppetServer, work: &Path, certname: &str) -> PathBuf {
    let (from, to) = (server.ssldir(), work.join("ssl"));
    for rel in [
        "certs/ca.pem".to_owned(),
        "crl.pem".to_owned(),
        format!("certs/{certname}.pem"),
        format!("private_keys/{certname}.pem"),
    ] {
        std::fs::create_dir_all(to.join(&rel).parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), to.join(&rel)).unwrap();
    }
    to
}

/// The masters' access-log entries from `skip[i]` on, for the plugin
/// mounts: (certname, target, status).
fn plugin_requests(masters: &[ProxyBackend], skip: &[usize]) -> Vec<(String, String, u64)> {
    masters
        .iter()
        .zip(skip)
        .flat_map(|(m, &n)| m.access_log().into_iter().skip(n))
        .filter(|v| {
            v["target"].as_str().is_some_and(|t| {
                t.starts_with("/puppet/v3/file_") || t.starts_with("/pluginsync/v1/")
            })
        })
        .map(|v| {
            (
                v["certname"].as_str().unwrap_or("-").to_owned(),
                v["target"].as_str().unwrap_or_default().to_owned(),
                v["status"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Lines of Puppet Server's access log that asked for a plugin mount or
/// a `/pluginsync/v1/` path.
fn puppetserver_plugin_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains(" /pluginsync/v1/")
                || ["file_metadatas", "file_metadata", "file_content"]
                    .iter()
                    .any(|e| {
                        ["plugins", "pluginfacts"]
                            .iter()
                            .any(|m| l.contains(&format!("/puppet/v3/{e}/{m}")))
                    })
        })
        .collect()
}

/// Status of a GET of `target` through the balancer without a client
/// certificate but with forged identity headers naming `node1`.
fn forged_get(lb: &Balancer, ca: &Path, target: &str) -> u16 {
    pluginsync_common::tls::install_default_provider();
    let ca = std::fs::read(ca).expect("ca");
    let client = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("ca pem"))
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        client
            .get(format!("https://localhost:{}{target}", lb.port))
            .header("X-Client-Verify", "SUCCESS")
            .header("X-Client-DN", "CN=node1")
            .header("X-Client-Cert", "forged")
            .send()
            .await
            .expect("request through the balancer")
            .status()
            .as_u16()
    })
}

/// `GET /pluginsync/v1/inventory` of the master at `url` (its mTLS
/// listener), as the master itself (its own certificate may ask):
/// `Null` when it cannot be had.
pub(crate) fn inventory(url: &str, ssl: &Path) -> serde_json::Value {
    let (client, rt) = pluginsync_tests::ssldir_client(ssl, Some("localhost"));
    rt.block_on(async {
        let resp = client
            .get(format!("{url}/pluginsync/v1/inventory"))
            .send()
            .await
            .ok()?;
        resp.json::<serde_json::Value>().await.ok()
    })
    .unwrap_or(serde_json::Value::Null)
}

/// One balancer's part: the stock agent's full run, what answered its
/// plugin requests, and a changed plugin on the next run.
fn full_run_through(
    name: &str,
    lb: &Balancer,
    server: &PuppetServer,
    masters: &[ProxyBackend],
    puppet: &Path,
) {
    let work = tempfile::tempdir().unwrap();
    let ssldir = node_ssldir(server, work.path(), "node1");
    let agent = PuppetAgent::new(puppet, work.path(), &ssldir, "node1", lb.port);
    let env_dir = server.envpath().join("production");
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let server_before = server.access_log().lines().count();

    let run = agent.agent_test("production");
    assert_eq!(
        run.code, 2,
        "{name}: puppet agent -t did not exit 2 (changes applied):\n{}",
        run.output
    );
    // The catalog was compiled by Puppet Server and applied, at the path
    // the synced plugin's fact gives.
    assert_eq!(
        std::fs::read_to_string(work.path().join("var/fleet-applied.txt")).ok(),
        Some("applied from environment production\n".to_owned()),
        "{name}: the manifest's file was not applied:\n{}",
        run.output
    );
    assert_eq!(
        without_modes(tree_snapshot(&agent.libdir())),
        without_modes(merged_mount(&env_dir, "lib")),
        "{name}: libdir is not the environment's plugins"
    );
    assert_eq!(
        without_modes(tree_snapshot(&agent.factsdir())),
        without_modes(merged_mount(&env_dir, "facts.d")),
        "{name}: pluginfactdest is not the environment's external facts"
    );

    // Who answered what.
    let served = plugin_requests(masters, &skip);
    let count = |prefix: &str| {
        served
            .iter()
            .filter(|(_, t, _)| t.starts_with(prefix))
            .count()
    };
    assert!(
        count("/puppet/v3/file_metadatas/plugins") >= 1
            && count("/puppet/v3/file_metadatas/pluginfacts") >= 1,
        "{name}: the masters did not answer both listings: {served:#?}"
    );
    // Every file of both mounts was downloaded once, from a master.
    let files = [("lib", "plugins"), ("facts.d", "pluginfacts")]
        .iter()
        .map(|(sub, _)| {
            merged_mount(&env_dir, sub)
                .values()
                .filter(|v| v.starts_with("file"))
                .count()
        })
        .sum::<usize>();
    assert_eq!(
        count("/puppet/v3/file_content/"),
        files,
        "{name}: {served:#?}"
    );
    assert!(
        served
            .iter()
            .all(|(c, _, status)| c == "node1" && *status == 200),
        "{name}: every plugin request carries node1's identity and succeeds: {served:#?}"
    );
    let server_log = server.access_log();
    let new: Vec<&str> = server_log.lines().skip(server_before).collect();
    let new = new.join("\n");
    assert_eq!(
        puppetserver_plugin_lines(&new),
        Vec::<&str>::new(),
        "{name}: Puppet Server answered plugin requests"
    );
    assert!(
        new.contains("\"POST /puppet/v3/catalog/node1?environment=production HTTP/1.1\" 200"),
        "{name}: Puppet Server did not compile node1's catalog:\n{new}"
    );

    // The balancer replaces a client's own identity headers: without a
    // certificate, forged ones count for neither backend.
    let ca = server.ssldir().join("certs/ca.pem");
    assert_eq!(
        forged_get(
            lb,
            &ca,
            "/puppet/v3/file_content/plugins/facter/fleet_target.rb?environment=production"
        ),
        403,
        "{name}: a pluginsync master took forged identity headers"
    );
    assert_eq!(
        forged_get(lb, &ca, "/puppet/v3/node/node1?environment=production"),
        403,
        "{name}: Puppet Server took forged identity headers"
    );

    // A changed plugin on the code tree reaches the node on the next run.
    let changed = format!("# changed for the run through {name}\n");
    std::fs::write(env_dir.join("modules/fleet").join(VERSION_RB), &changed).unwrap();
    let rel = VERSION_RB.strip_prefix("lib/").unwrap();
    wait_served(masters, "node1", "plugins", rel, &changed);
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let server_before = server.access_log().lines().count();
    let run = agent.agent_test("production");
    // Pluginsync changed a file, the catalog nothing: Puppet's detailed
    // exit code says only the catalog's changes.
    assert_eq!(run.code, 0, "{name}: second run:\n{}", run.output);
    assert_eq!(
        std::fs::read_to_string(agent.libdir().join(rel)).unwrap(),
        changed,
        "{name}: the changed plugin did not reach the node:\n{}",
        run.output
    );
    let served = plugin_requests(masters, &skip);
    let content: Vec<&String> = served
        .iter()
        .filter(|(_, t, _)| t.starts_with("/puppet/v3/file_content/"))
        .map(|(_, t, _)| t)
        .collect();
    // Only the changed file moves (Puppet's agent may ask for it more
    // than once: seen twice with Puppet 7.23).
    assert!(
        !content.is_empty() && content.iter().all(|t| t.contains(rel)),
        "{name}: {served:#?}"
    );
    let log = server.access_log();
    let new: Vec<&str> = log.lines().skip(server_before).collect();
    assert_eq!(
        puppetserver_plugin_lines(&new.join("\n")),
        Vec::<&str>::new(),
        "{name}: Puppet Server answered plugin requests on the second run"
    );
}

/// pluginsync's agent with `environment_source = "server"` through the
/// balancer: Puppet Server's ENC assigns `assigned` to `enc-node`, whose
/// plugins (different from production's) come from the masters; `node1`,
/// which the ENC leaves alone, keeps production.
fn enc_through(name: &str, lb: &Balancer, server: &PuppetServer, masters: &[ProxyBackend]) {
    let url = format!("https://localhost:{}", lb.port);
    let extra = "environment = \"production\"\nenvironment_source = \"server\"";
    let server_before = server.access_log().lines().count();
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let home = AgentHome::with_ssldir(
        &server.ssldir(),
        "enc-node",
        std::slice::from_ref(&url),
        extra,
    );
    let run = home.sync(&["-v"]);
    assert_eq!(run.code, 0, "{name}: {run:?}");
    assert!(
        run.stderr
            .contains("switching to the environment the server assigns"),
        "{name}: {run:?}"
    );
    assert_eq!(
        without_modes(tree_snapshot(&home.libdir())),
        without_modes(merged_mount(&server.envpath().join("assigned"), "lib")),
        "{name}: enc-node did not get the assigned environment's plugins: {run:?}"
    );
    let log = server.access_log();
    let new: Vec<&str> = log.lines().skip(server_before).collect();
    assert!(
        new.iter().any(
            |l| l.contains("\"GET /puppet/v3/node/enc-node?environment=production")
                && l.contains("HTTP/1.1\" 200")
        ),
        "{name}: Puppet Server did not answer the node request:\n{}",
        new.join("\n")
    );
    let served = plugin_requests(masters, &skip);
    assert!(
        !served.is_empty()
            && served.iter().all(|(c, t, s)| c == "enc-node"
                && (t.contains("environment=assigned") || !t.contains("environment="))
                // The node report after the commit is recorded: 204.
                && (*s == 200 || (t.starts_with("/pluginsync/v1/report?") && *s == 204))),
        "{name}: {served:#?}"
    );

    let home = AgentHome::with_ssldir(&server.ssldir(), "node1", &[url], extra);
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{name}: {run:?}");
    assert_eq!(
        without_modes(tree_snapshot(&home.libdir())),
        without_modes(merged_mount(&server.envpath().join("production"), "lib")),
        "{name}: node1 left its configured environment: {run:?}"
    );
}

/// pluginsync's agent through the balancer takes a generation: the
/// per-node answer, the manifest and the blobs come from the masters and
/// none from Puppet Server, and its node report (on the next run's
/// per-node request) reaches them: a master's inventory lists the node on
/// that generation.
fn generation_through(name: &str, lb: &Balancer, server: &PuppetServer, masters: &[ProxyBackend]) {
    let url = format!("https://localhost:{}", lb.port);
    let certname = format!("gen-{name}");
    let home = AgentHome::with_ssldir(
        &server.ssldir(),
        &certname,
        &[url],
        "environment = \"production\"",
    );
    let skip: Vec<usize> = masters.iter().map(|m| m.access_log().len()).collect();
    let server_before = server.access_log().lines().count();
    let run = home.sync(&["-v", "--format", "json"]);
    assert_eq!(run.code, 0, "{name}: {run:?}");
    assert!(
        run.stderr.contains("retrieving generation") && !run.stderr.contains("WARN"),
        "{name}: no generation, or a warning: {run:?}"
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("report");
    let generation = report["generation"]
        .as_str()
        .expect("a generation")
        .to_owned();
    let env_dir = server.envpath().join("production");
    assert_eq!(
        without_modes(tree_snapshot(&home.libdir())),
        without_modes(merged_mount(&env_dir, "lib")),
        "{name}: {run:?}"
    );
    let served = plugin_requests(masters, &skip);
    for path in ["/pluginsync/v1/assignment", "/pluginsync/v1/generations/"] {
        assert!(
            served
                .iter()
                .any(|(c, t, s)| *c == certname && t.starts_with(path) && *s == 200),
            "{name}: no {path} answered by a master: {served:#?}"
        );
    }
    let log = server.access_log();
    let new: Vec<&str> = log.lines().skip(server_before).collect();
    assert_eq!(
        puppetserver_plugin_lines(&new.join("\n")),
        Vec::<&str>::new(),
        "{name}: Puppet Server answered pluginsync's agent"
    );
    // The next run's per-node request carries the report.
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{name}: {run:?}");
    let ssl = server.ssldir();
    let listed = masters.iter().any(|m| {
        let inventory = inventory(&m.tls_url(), &ssl);
        inventory["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| {
                n["certname"] == certname.as_str() && n["generation"] == generation.as_str()
            })
        })
    });
    assert!(listed, "{name}: no master lists {certname} on {generation}");
}

/// HAProxy with the shipped file minus its `/pluginsync/v1/` route (the
/// routing gap of a balancer set up before that route existed): the
/// per-node answer is Puppet Server's 404 while the listings come from a
/// master, and the agent says so at warning level, once per run, naming
/// the missing route; the sync itself succeeds from the listings.
fn routing_gap(haproxy: &Path, backends: &Backends, server: &PuppetServer) {
    let shipped =
        std::fs::read_to_string(repo_root().join("packaging/haproxy-puppet.cfg")).unwrap();
    let gap: String = shipped
        .lines()
        .filter(|l| l.trim() != "use_backend pluginsync if pluginsync_api")
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(
        gap.lines().count(),
        shipped.lines().count(),
        "the route is gone from the file"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("haproxy-gap.cfg");
    std::fs::write(&config, gap).unwrap();
    let lb = Balancer::haproxy_with(haproxy, backends, &config);
    let url = format!("https://localhost:{}", lb.port);
    let home = AgentHome::with_ssldir(
        &server.ssldir(),
        "node1",
        &[url],
        "environment = \"production\"",
    );
    for round in ["first", "second"] {
        let run = home.sync(&[]);
        assert_eq!(run.code, 0, "{round} run: {run:?}");
        let warned: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("does not route /pluginsync/v1/"))
            .collect();
        assert_eq!(warned.len(), 1, "{round} run: one warning: {run:?}");
        assert_eq!(
            without_modes(tree_snapshot(&home.libdir())),
            without_modes(merged_mount(&server.envpath().join("production"), "lib")),
            "{round} run: {run:?}"
        );
    }
}

#[test]
fn stock_agents_run_through_the_split_and_the_enc_assigns_the_environment() {
    let Some(puppet) = require("puppet", "puppet", TEST) else {
        return;
    };
    if !PuppetServer::required(TEST) {
        return;
    }
    let haproxy = require("haproxy", "haproxy", TEST);
    let nginx = require("nginx", "nginx", TEST);
    if haproxy.is_none() && nginx.is_none() {
        return;
    }
    let http_port = closed_port().to_string();
    let server = PuppetServer::start_with(
        &[
            "--http-port",
            &http_port,
            "--header-identity",
            "--certs",
            "node1,enc-node,gen-haproxy,gen-nginx",
            "--enc",
            "enc-node=assigned",
            "--manifest",
            "production",
        ],
        populate,
    );
    let ssl = server.ssldir();
    let (cert, key) = (
        ssl.join("certs/localhost.pem"),
        ssl.join("private_keys/localhost.pem"),
    );
    let (ca, crl) = (ssl.join("certs/ca.pem"), ssl.join("crl.pem"));
    let base = server.envpath().parent().unwrap().join("modules");
    let masters: Vec<ProxyBackend> = (0..2)
        .map(|_| ProxyBackend::spawn(&server.envpath(), &base, [&cert, &key, &ca, &crl]))
        .collect();
    let backends = Backends {
        cert,
        key,
        ca,
        crl,
        puppetserver: format!("127.0.0.1:{http_port}"),
        pluginsync: masters.iter().map(|m| m.proxy.clone()).collect(),
    };
    if let Some(haproxy) = haproxy {
        let lb = Balancer::haproxy(&haproxy, &backends);
        full_run_through("haproxy", &lb, &server, &masters, &puppet);
        enc_through("haproxy", &lb, &server, &masters);
        generation_through("haproxy", &lb, &server, &masters);
        drop(lb);
        routing_gap(&haproxy, &backends, &server);
    }
    if let Some(nginx) = nginx {
        let lb = Balancer::nginx(&nginx, &backends);
        full_run_through("nginx", &lb, &server, &masters, &puppet);
        enc_through("nginx", &lb, &server, &masters);
        generation_through("nginx", &lb, &server, &masters);
    }
}
