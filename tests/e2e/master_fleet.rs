//! The fleet (docs/operating.md#the-fleet, docs/protocol.md §7.8): two
//! replicas sharing one PostgreSQL, each hearing about half the nodes;
//! both inventories list every node with its generation and its load
//! failures, the fleet series agree and pass `promtool check metrics`; a
//! replica started (or restarted) after the other heard nodes lists them
//! at once; 10,000 certnames keep the series' cardinality bounded; a
//! malformed or oversized report is ignored and never applied to another
//! node; the inventory is refused to a certname outside `[admin]
//! certnames` and takes no `POST` (405).

use std::net::TcpListener;
use std::time::Duration;

use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{HEADER_REPORT, NodeReport};
use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, client, config_toml, parse_config, promtool_accepts,
    require, wait_for,
};
use serde_json::Value;

/// Long enough for any bounded wait here on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);
const INVENTORY: &str = "/pluginsync/v1/inventory";
/// The plugin whose loader fails on every node.
const BAD: &str = "plugins/facter/bad.rb";

/// `production` with a fact that loads and one whose loader fails.
fn tree() -> EnvTree {
    let t = EnvTree::new();
    t.file(
        "production",
        "m",
        "lib/facter/ok.rb",
        "Facter.add(:ok) {}\n",
        0o644,
    );
    t.file(
        "production",
        "m",
        "lib/facter/bad.rb",
        "Facter.add(:bad) {\n",
        0o644,
    );
    t
}

/// Loaders: `bad.rb` fails, anything else loads.
const LOADERS: &str = r#"
[load]
enabled = true

[[loader]]
name = "broken"
match = "facter/bad.rb"
kind = "command"
command = ["sh", "-c", "echo syntax error >&2; exit 1"]

[[loader]]
name = "ruby"
match = "facter/*.rb"
kind = "command"
command = ["true"]
"#;

/// A replica on `listener` presenting `cert`, admitting `admins`, its
/// state in the PostgreSQL at `state` (else its embedded store), with a
/// `[proxy]` listener (loopback trusted) and metrics.
struct Replica {
    master: TestMaster,
    proxy: u16,
    metrics: u16,
}

fn replica(
    tree: &EnvTree,
    pki: &Pki,
    listener: TcpListener,
    cert: &str,
    admins: &[&str],
    state: Option<&str>,
) -> Replica {
    let q = |v: &[String]| {
        v.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let admins: Vec<String> = admins.iter().map(|s| s.to_string()).collect();
    let text = config_toml(
        &tree.envpath(),
        pki,
        "",
        &format!(
            "[admin]\ncertnames = [{}]\n{}\
             [proxy]\nlisten = [\"127.0.0.1:0\"]\ntrusted = [\"127.0.0.1/32\", \"::1/128\"]\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n",
            q(&admins),
            state
                .map(|url| format!("[state]\nurl = {url:?}\n"))
                .unwrap_or_default()
        ),
    )
    .replace(
        &format!(
            "cert = {:?}\nkey = {:?}",
            pki.cert("localhost"),
            pki.key("localhost")
        ),
        &format!("cert = {:?}\nkey = {:?}", pki.cert(cert), pki.key(cert)),
    );
    let master = TestMaster::listening_on(parse_config(&text), listener);
    // Port 0 in the config: the ports the kernel chose.
    let proxy = master.proxy[0].port();
    let metrics = master.metrics.expect("metrics configured").port();
    Replica {
        master,
        proxy,
        metrics,
    }
}

/// Replica 1 (`localhost`'s certificate) or 2 (`master2`'s), both on the
/// PostgreSQL database at `state`, each admitting the other and `node2`.
fn shared(n: u8, tree: &EnvTree, pki: &Pki, listener: TcpListener, state: &str) -> Replica {
    let (cert, admins) = match n {
        1 => ("localhost", ["master2", "node2"]),
        _ => ("master2", ["localhost", "node2"]),
    };
    replica(tree, pki, listener, cert, &admins, Some(state))
}

/// The inventory as `certname` sees it, every page of it (the endpoint
/// pages, docs/protocol.md §7.11): status and nodes by certname.
async fn inventory(
    pki: &Pki,
    certname: Option<&str>,
    base: &str,
) -> (u16, std::collections::BTreeMap<String, Value>) {
    let (mut nodes, mut after) = (std::collections::BTreeMap::new(), String::new());
    loop {
        let resp = client(pki, certname)
            .get(format!("{base}{INVENTORY}?limit=10000&after={after}"))
            .send()
            .await
            .expect("inventory request");
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        for n in body["nodes"].as_array().into_iter().flatten() {
            nodes.insert(n["certname"].as_str().unwrap_or("").to_owned(), n.clone());
        }
        match body["next"].as_str() {
            Some(n) if status == 200 => after = n.to_owned(),
            _ => return (status, nodes),
        }
    }
}

/// The per-node request as a balancer forwards it to the `[proxy]`
/// listener: the identity `certname` in headers, `report` as sent.
async fn report_via_proxy(
    http: &reqwest::Client,
    port: u16,
    certname: &str,
    report: Option<&str>,
) -> u16 {
    let mut req = http
        .get(format!(
            "http://127.0.0.1:{port}/pluginsync/v1/assignment?environment=production"
        ))
        .header("accept", "application/json")
        .header("X-Client-Verify", "SUCCESS")
        .header("X-Client-DN", format!("CN={certname}"));
    if let Some(r) = report {
        req = req.header(HEADER_REPORT, r);
    }
    req.send().await.expect("assignment").status().as_u16()
}

/// The current generation of `production`, as the per-node answer says.
async fn current(pki: &Pki, base: &str) -> GenerationId {
    let c = client(pki, Some("node1"));
    let url = format!("{base}/pluginsync/v1/assignment?environment=production");
    let got = wait_for(PATIENCE, || async {
        let r = c
            .get(&url)
            .header("accept", "application/json")
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        v["generation"].as_str()?.parse::<GenerationId>().ok()
    })
    .await;
    got.expect("production has a generation")
}

async fn scrape(port: u16) -> String {
    reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text")
}

/// The value of the series `name{labels}` in `text`.
fn series(text: &str, name_labels: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_labels)?.trim().parse().ok())
}

/// Our agents, request-level nodes and stock agents (where Puppet is
/// installed) spread over two replicas; both inventories list all of
/// them, with the generation and the failing loader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_inventory_every_node_with_its_generation_and_load_failures() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_fleet::two_replicas_inventory")
    else {
        return;
    };
    let state = pg.database();
    const AGENTS: usize = 120;
    const REQUESTS: usize = 76;
    let names: Vec<String> = (0..AGENTS)
        .map(|i| format!("agent{i:03}.example"))
        .collect();
    let mut stock: Vec<String> = vec!["stock1.example".into(), "stock2.example".into()];
    let mut all = names.clone();
    all.extend(stock.iter().cloned());
    let pki = Pki::with_agents(&all);
    pki.add_server("master2");
    let tree = tree();
    let (l1, l2) = (
        TcpListener::bind("127.0.0.1:0").unwrap(),
        TcpListener::bind("127.0.0.1:0").unwrap(),
    );
    let url = |l: &TcpListener| format!("https://localhost:{}", l.local_addr().unwrap().port());
    let (u1, u2) = (url(&l1), url(&l2));
    let r1 = shared(1, &tree, &pki, l1, &state);
    let r2 = shared(2, &tree, &pki, l2, &state);
    let generation = current(&pki, &u1).await;
    assert_eq!(current(&pki, &u2).await, generation, "one tree, one id");

    // Our agents, half to each replica, 8 at a time; two runs each: the
    // first commits and loads (bad.rb fails), the second reports it.
    let homes: Vec<AgentHome> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let server = if i % 2 == 0 { &u1 } else { &u2 };
            AgentHome::with_ssldir(&pki.ssldir, n, std::slice::from_ref(server), LOADERS)
        })
        .collect();
    let homes = std::sync::Arc::new(homes);
    let runs = tokio::task::spawn_blocking({
        let homes = homes.clone();
        move || {
            let next = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(home) = homes.get(i) else { break };
                            for _ in 0..2 {
                                let run = home.sync(&[]);
                                assert!(run.code == 0 || run.code == 2, "agent {i}: {run:?}");
                            }
                        }
                    });
                }
            })
        }
    });
    // Request-level nodes through each replica's [proxy] listener.
    let http = reqwest::Client::new();
    let report = NodeReport {
        generation: Some(generation),
        loads_ok: 1,
        loads_failed: 1,
        failed: vec![BAD.into()],
    }
    .to_header();
    for i in 0..REQUESTS {
        let port = if i % 2 == 0 { r1.proxy } else { r2.proxy };
        let status =
            report_via_proxy(&http, port, &format!("req{i:03}.example"), Some(&report)).await;
        assert_eq!(status, 200);
    }
    // Stock agents, where Puppet is installed: recorded with what they
    // were served.
    if let Some(puppet) = require("puppet", "puppet", "master_fleet::stock_agents") {
        for (i, name) in stock.iter().enumerate() {
            let work = tempfile::tempdir().unwrap();
            let port = [&r1, &r2][i % 2].master.addr.port();
            let agent = pluginsync_tests::puppet::PuppetAgent::new(
                &puppet,
                work.path(),
                &pki.ssldir,
                name,
                port,
            );
            let done = tokio::task::spawn_blocking(move || agent.plugin_download("production"))
                .await
                .unwrap();
            assert_eq!(done.code, 0, "puppet plugin download: {}", done.output);
        }
    } else {
        stock.clear();
    }
    runs.await.expect("agents ran");

    // And node1, which asked each replica for the current generation.
    let expected = AGENTS + REQUESTS + stock.len() + 1;
    let reporters: Vec<String> = names
        .iter()
        .cloned()
        .chain((0..REQUESTS).map(|i| format!("req{i:03}.example")))
        .collect();
    for base in [&u1, &u2] {
        // Every node listed, and every reporter's latest report arrived: a
        // node's run heard by the other replica is in the store within its
        // writer's 200 ms (docs/operating.md#the-fleet), so wait, bounded.
        let nodes = wait_for(PATIENCE, || async {
            let (status, nodes) = inventory(&pki, Some("node2"), base).await;
            assert_eq!(status, 200);
            let settled = nodes.len() == expected
                && reporters.iter().all(|n| {
                    nodes.get(n).is_some_and(|node| {
                        node["generation"] == generation.to_hex() && node["load_failures"] == 1
                    })
                });
            settled.then_some(nodes)
        })
        .await
        .unwrap_or_else(|| panic!("{base}: the inventory lists all {expected} nodes"));
        for n in names.iter().chain(
            (0..REQUESTS)
                .map(|i| format!("req{i:03}.example"))
                .collect::<Vec<_>>()
                .iter(),
        ) {
            let node = &nodes[n];
            assert_eq!(
                node["generation"],
                generation.to_hex(),
                "{base} {n}: {node}"
            );
            assert_eq!(node["environment"], "production");
            assert_eq!(node["source"], "report");
            assert_eq!(node["load_failures"], 1, "{base} {n}: {node}");
            assert_eq!(
                node["failed_plugins"],
                serde_json::json!([BAD]),
                "{base} {n}"
            );
            assert!(node["last_seen"].as_str().is_some_and(|t| t.ends_with('Z')));
        }
        for n in &stock {
            let node = &nodes[n];
            assert_eq!(node["generation"], generation.to_hex(), "{n}: {node}");
            assert_eq!(node["source"], "served");
            assert_eq!(node["load_failures"], 0);
        }
    }
    // Our agents' first runs reported no generation yet; by now the
    // second runs' reports won, on both replicas: the series agree once
    // each replica's counts have been read again (every second,
    // docs/operating.md#the-fleet), so wait for it, bounded.
    let label = format!(
        "{{environment=\"production\",generation=\"{}\"}}",
        generation.to_hex()
    );
    let want = (Some(expected as u64), Some((AGENTS + REQUESTS) as u64));
    let counts = |text: &str| {
        (
            series(text, &format!("pluginsync_fleet_nodes{label}")),
            series(text, &format!("pluginsync_fleet_load_failures{label}")),
        )
    };
    for r in [&r1, &r2] {
        let settled = wait_for(Duration::from_secs(30), || async {
            let text = scrape(r.metrics).await;
            (counts(&text) == want).then_some(text)
        })
        .await;
        let Some(text) = settled else {
            let text = scrape(r.metrics).await;
            panic!(
                "{want:?} nodes and failing nodes, not {:?}: {text}",
                counts(&text)
            );
        };
        promtool_accepts(&text, "master_fleet::promtool");
    }
    // The inventory is the admin API's: a node's certname, or none, is
    // refused; and it takes no POST (what a peer heard, retired:
    // docs/rollouts.md#replicas), from anyone.
    assert_eq!(inventory(&pki, Some("node1"), &u1).await.0, 403);
    assert_eq!(inventory(&pki, None, &u2).await.0, 403);
    for who in ["node1", "node2"] {
        let refused = client(&pki, Some(who))
            .post(format!("{u1}{INVENTORY}"))
            .body("{\"nodes\":[]}")
            .send()
            .await
            .unwrap();
        assert_eq!(
            refused.status().as_u16(),
            405,
            "{who}: no one speaks for the fleet"
        );
    }
}

/// 10,000 certnames reporting (request-level) keep the series bounded by
/// the kept generations; bad reports are ignored, never applied to
/// another node; a report's content never names the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_nodes_keep_the_series_bounded_and_bad_reports_change_nothing() {
    let pki = Pki::new();
    let tree = tree();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let r = replica(&tree, &pki, listener, "localhost", &["node2"], None);
    let generation = current(&pki, &base).await;
    let http = reqwest::Client::new();
    // Every node reports a generation of its own: none kept but one.
    let total = 10_000usize;
    let port = r.proxy;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16 {
        let http = http.clone();
        tasks.spawn(async move {
            for i in (w..total).step_by(16) {
                let g = if i % 10 == 0 {
                    generation
                } else {
                    GenerationId(pluginsync_common::digest::Sha256::of(
                        format!("g{i}").as_bytes(),
                    ))
                };
                let report = NodeReport {
                    generation: Some(g),
                    loads_ok: 1,
                    loads_failed: u32::from(i % 3 == 0),
                    failed: if i % 3 == 0 { vec![BAD.into()] } else { vec![] },
                }
                .to_header();
                let status =
                    report_via_proxy(&http, port, &format!("n{i:05}"), Some(&report)).await;
                assert_eq!(status, 200);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("reporter");
    }
    let text = scrape(r.metrics).await;
    let fleet: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pluginsync_fleet_nodes{"))
        .collect();
    assert!(fleet.len() <= 5 + 2, "at most keep + 2 series: {fleet:?}");
    let label = format!(
        "{{environment=\"production\",generation=\"{}\"}}",
        generation.to_hex()
    );
    // One in ten, and node1, which asked for the current generation.
    assert_eq!(
        series(&text, &format!("pluginsync_fleet_nodes{label}")),
        Some(1001)
    );
    let other = "{environment=\"production\",generation=\"other\"}";
    assert_eq!(
        series(&text, &format!("pluginsync_fleet_nodes{other}")),
        Some(9000)
    );
    promtool_accepts(&text, "master_fleet::promtool");
    let (_, nodes) = inventory(&pki, Some("node2"), &base).await;
    assert_eq!(nodes.len(), total + 1);

    // Bad reports from n00001: malformed, oversized, over its bounds; and
    // one that claims another certname inside. Nothing changes for
    // n00002 (nor for n00001, but its own report).
    let before = nodes["n00002"].clone();
    let own_before = nodes["n00001"].clone();
    let oversized = "a".repeat(5000);
    // Visible ASCII without spaces needs no escaping (docs/protocol.md §7.8).
    let many = format!("{{\"failed\":[{}]}}", vec!["\"x\""; 17].join(","));
    for bad in ["%7Bnot%20json", oversized.as_str(), many.as_str()] {
        assert_eq!(
            report_via_proxy(&http, port, "n00001", Some(bad)).await,
            200,
            "the request is answered"
        );
    }
    let (_, nodes) = inventory(&pki, Some("node2"), &base).await;
    assert_eq!(nodes["n00002"], before);
    assert_eq!(
        nodes["n00001"], own_before,
        "an ignored report changes nothing"
    );
    let claims = "{\"certname\":\"n00002\",\"loads_ok\":7,\"loads_failed\":0}";
    assert_eq!(
        report_via_proxy(&http, port, "n00001", Some(claims)).await,
        200
    );
    let (_, nodes) = inventory(&pki, Some("node2"), &base).await;
    assert_eq!(
        nodes["n00002"], before,
        "a report never speaks for another node"
    );
    assert_eq!(nodes["n00001"]["loads_ok"], 7, "it is the sender's own");

    // Nor does an admin: the inventory takes no POST (what a peer heard,
    // retired: docs/rollouts.md#replicas), and nothing changes.
    let admin = client(&pki, Some("node2"));
    let post = async |body: String| {
        let resp = admin
            .post(format!("{base}{INVENTORY}"))
            .body(body)
            .send()
            .await;
        resp.expect("post").status().as_u16()
    };
    assert_eq!(post("{\"nodes\": 7}".into()).await, 405);
    let mut entry = nodes["n00002"].clone();
    entry["loads_ok"] = 99.into();
    assert_eq!(post(format!("{{\"nodes\":[{entry}]}}")).await, 405);
    let (_, after) = inventory(&pki, Some("node2"), &base).await;
    assert_eq!(after["n00002"], before);
}

/// A replica that was not there when the nodes reported lists them at
/// once: started after the other replica heard them, its inventory is the
/// shared store's (docs/rollouts.md#replicas); restarted while nodes
/// report to the other, it lists those too. Nothing is sent between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_started_late_lists_what_the_other_heard_at_once() {
    let Some(pg) = pluginsync_tests::Postgres::launch("master_fleet::a_replica_started_late")
    else {
        return;
    };
    let state = pg.database();
    let pki = Pki::new();
    pki.add_server("master2");
    let tree = tree();
    let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
    let u1 = format!("https://localhost:{}", l1.local_addr().unwrap().port());
    let r1 = shared(1, &tree, &pki, l1, &state);
    let generation = current(&pki, &u1).await;
    let http = reqwest::Client::new();
    let report = NodeReport {
        generation: Some(generation),
        ..NodeReport::default()
    }
    .to_header();
    let heard = async |from: usize, to: usize| {
        for i in from..to {
            let status =
                report_via_proxy(&http, r1.proxy, &format!("n{i:03}"), Some(&report)).await;
            assert_eq!(status, 200);
        }
    };
    let lists = |nodes: &std::collections::BTreeMap<String, Value>, n: usize| {
        nodes.len() == n + 1 && (0..n).all(|i| nodes.contains_key(&format!("n{i:03}")))
    };
    // n nodes, and node1, which asked replica 1 for the current
    // generation, in the store: replica 1's own inventory is the store's.
    let stored = async |n: usize| {
        wait_for(PATIENCE, || async {
            let (_, nodes) = inventory(&pki, Some("node2"), &u1).await;
            lists(&nodes, n).then_some(())
        })
        .await
        .is_some()
    };
    let start2 = || {
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let u2 = format!("https://localhost:{}", l2.local_addr().unwrap().port());
        (shared(2, &tree, &pki, l2, &state), u2)
    };
    heard(0, 50).await;
    assert!(stored(50).await, "replica 1's reports are in the store");
    let (r2, u2) = start2();
    let (status, nodes) = inventory(&pki, Some("node2"), &u2).await;
    assert_eq!(status, 200);
    assert!(
        lists(&nodes, 50),
        "a replica started late lists them on its first answer: {:?}",
        nodes.keys().collect::<Vec<_>>()
    );
    drop(r2);
    heard(50, 100).await;
    assert!(stored(100).await);
    let (_r2, u2) = start2();
    let (_, nodes) = inventory(&pki, Some("node2"), &u2).await;
    assert!(lists(&nodes, 100), "a restarted replica lists them too");
}
