//! The inventory for humans (docs/operating.md#the-fleet, docs/protocol.md
//! §7.11): 2,400 nodes heard through the `[proxy]` listener (the identity
//! a balancer forwards), some on another generation, some without one,
//! some failing, in two environments. `GET /pluginsync/v1/inventory`
//! pages them in certname order (default 1,000, a `next` cursor, `limit`
//! bounded: 400 outside 1 to 10,000) and filters them; `pluginsync-master
//! inventory` prints the table an operator reads (per generation nodes,
//! failing, lagging; the nodes that lag or fail, bounded, saying how many
//! were left out) and, with `--format json`, every node matched. The
//! Grafana dashboard shipped in `packaging/` queries only metrics a
//! running master exports.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use pluginsync_common::digest::Sha256;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{HEADER_REPORT, NodeReport};
use pluginsync_tests::{
    EnvTree, Pki, TestMaster, bin_path, client, config_file, config_toml, parse_config, wait_for,
};
use serde_json::Value;

/// Nodes heard.
const NODES: usize = 2400;
/// The commit r10k deployed `production` from (its `.r10k-deploy.json`).
const SIGNATURE: &str = "c0ffee1234567890abcdef0123456789abcdef01";
const INVENTORY: &str = "/pluginsync/v1/inventory";

/// A master with a `[proxy]` listener, a metrics listener, `node2` as
/// admin, a rollout policy on `production`; its config file.
pub(crate) struct Fleet {
    pub(crate) master: TestMaster,
    pub(crate) config: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _tree: EnvTree,
    pub(crate) pki: Pki,
}

impl Fleet {
    pub(crate) fn start() -> Fleet {
        let (tree, pki) = (EnvTree::new(), Pki::new());
        tree.file("production", "m", "lib/facter/a.rb", "# a\n", 0o644);
        tree.file("test", "m", "lib/facter/t.rb", "# t\n", 0o644);
        // As r10k 3 writes it after a deploy (environment.info and more).
        let deploy = format!(
            "{{\n  \"name\": \"production\",\n  \"signature\": \"{SIGNATURE}\",\n  \
             \"started_at\": \"2026-11-29 00:00:00 +0000\",\n  \"deploy_success\": true,\n  \
             \"module_deploys\": []\n}}\n"
        );
        std::fs::write(tree.envpath().join("production/.r10k-deploy.json"), deploy).unwrap();
        let store = tree.outside().join("store");
        let text = config_toml(
            &tree.envpath(),
            &pki,
            "",
            &format!(
                "[generations]\ndir = {store:?}\n[admin]\ncertnames = [\"node2\"]\n\
                 [proxy]\nlisten = [\"127.0.0.1:0\"]\ntrusted = [\"127.0.0.1/32\"]\n\
                 [metrics]\nlisten = \"127.0.0.1:0\"\n\
                 [[rollout]]\nenvironments = [\"production\"]\n\
                 waves = [ {{ after = \"0s\", percent = 20 }}, {{ promote = true, percent = 100 }} ]\n"
            ),
        );
        let (dir, config) = config_file(&text);
        let master = TestMaster::start(parse_config(&text));
        Fleet {
            master,
            config,
            _dir: dir,
            _tree: tree,
            pki,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("https://localhost:{}", self.master.addr.port())
    }
}

/// The current generation of `env`, from the per-node answer.
async fn current(f: &Fleet, env: &str) -> GenerationId {
    let c = client(&f.pki, Some("node1"));
    let url = format!("{}/pluginsync/v1/assignment?environment={env}", f.url());
    wait_for(Duration::from_secs(60), || async {
        let r = c
            .get(&url)
            .header("accept", "application/json")
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        v["generation"].as_str()?.parse::<GenerationId>().ok()
    })
    .await
    .expect("a generation")
}

/// What node `i` reports: every 6th is in `test`; every 10th is on
/// another generation, every 25th on none; every 7th fails `bad.rb`.
fn node(i: usize, prod: GenerationId, test: GenerationId) -> (String, &'static str, NodeReport) {
    let env = if i.is_multiple_of(6) {
        "test"
    } else {
        "production"
    };
    let own = if env == "test" { test } else { prod };
    let generation = match i {
        _ if i.is_multiple_of(25) => None,
        _ if i.is_multiple_of(10) => Some(GenerationId(Sha256::of(b"elsewhere"))),
        _ => Some(own),
    };
    let failing = i.is_multiple_of(7);
    let report = NodeReport {
        generation,
        loads_ok: 1,
        loads_failed: u32::from(failing),
        failed: if failing {
            vec!["plugins/facter/bad.rb".into()]
        } else {
            vec![]
        },
    };
    (format!("n{i:05}.example.org"), env, report)
}

/// Every node's per-node request through the `[proxy]` listener.
pub(crate) async fn hear_all(f: &Fleet) -> (GenerationId, GenerationId) {
    let (prod, test) = (current(f, "production").await, current(f, "test").await);
    let port = f.master.proxy[0].port();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        tasks.spawn(async move {
            let http = reqwest::Client::new();
            for i in (w..NODES).step_by(8) {
                let (name, env, report) = node(i, prod, test);
                let status = http
                    .get(format!(
                        "http://127.0.0.1:{port}/pluginsync/v1/assignment?environment={env}"
                    ))
                    .header("accept", "application/json")
                    .header("X-Client-Verify", "SUCCESS")
                    .header("X-Client-DN", format!("CN={name}"))
                    .header(HEADER_REPORT, report.to_header())
                    .send()
                    .await
                    .expect("assignment")
                    .status();
                assert_eq!(status.as_u16(), 200, "{name}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("reporter");
    }
    (prod, test)
}

/// `GET {INVENTORY}?query` as the admin `node2`: status and body.
async fn get(f: &Fleet, query: &str) -> (u16, Value) {
    let resp = client(&f.pki, Some("node2"))
        .get(format!("{}{INVENTORY}?{query}", f.url()))
        .send()
        .await
        .expect("inventory");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The certnames of our simulated nodes in a page.
fn names(page: &Value) -> Vec<String> {
    (page["nodes"].as_array().unwrap().iter())
        .map(|n| n["certname"].as_str().unwrap().to_owned())
        .filter(|n| n.starts_with('n') && n.ends_with(".example.org"))
        .collect()
}

/// Every page of `query`, following `next`: the certnames.
async fn all(f: &Fleet, query: &str) -> Vec<String> {
    let (mut out, mut after) = (Vec::new(), String::new());
    loop {
        let (status, page) = get(f, &format!("{query}&after={after}")).await;
        assert_eq!(status, 200, "{page}");
        out.extend(names(&page));
        match page["next"].as_str() {
            Some(n) => after = n.to_owned(),
            None => return out,
        }
    }
}

/// `pluginsync-master inventory ARGS` against the fleet's master.
fn command(f: &Fleet, args: &[&str]) -> String {
    let out = Command::new(bin_path("pluginsync-master"))
        .args(["inventory", "--config"])
        .arg(&f.config)
        .args(["--master", &f.url()])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_pages_filters_and_reads_as_a_table() {
    let f = Fleet::start();
    let (prod, _) = hear_all(&f).await;
    let want: Vec<String> = (0..NODES).map(|i| node(i, prod, prod).0).collect();

    // Pages: 1,000 by default, a cursor, certname order, every node once.
    let (status, first) = get(&f, "").await;
    assert_eq!(status, 200);
    assert_eq!(first["nodes"].as_array().unwrap().len(), 1000);
    assert!(first["next"].is_string(), "more to come");
    let paged = all(&f, "limit=700").await;
    assert_eq!(paged, want, "every node once, in certname order");
    let (_, one) = get(&f, "limit=1").await;
    assert_eq!(one["nodes"].as_array().unwrap().len(), 1);
    let (_, max) = get(&f, "limit=10000").await;
    assert!(max["next"].is_null(), "one page holds them all");
    for bad in [
        "limit=0",
        "limit=10001",
        "limit=x",
        "failing=maybe",
        "generation=xyz",
        "environment=no%2Fsuch",
    ] {
        let (status, body) = get(&f, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }

    // Filters: environment, failing, generation (a prefix), together.
    let count = |p: fn(usize) -> bool| (0..NODES).filter(|i| p(*i)).count();
    let test = all(&f, "environment=test&limit=500").await;
    assert_eq!(test.len(), count(|i| i.is_multiple_of(6)));
    let failing = all(&f, "failing=true").await;
    assert_eq!(failing.len(), count(|i| i.is_multiple_of(7)));
    let on_prod = all(
        &f,
        &format!("environment=production&generation={}", &prod.to_hex()[..10]),
    )
    .await;
    assert_eq!(
        on_prod.len(),
        count(|i| !i.is_multiple_of(6) && !i.is_multiple_of(10) && !i.is_multiple_of(25))
    );
    let (_, lag) = get(&f, "limit=10000&environment=production").await;
    for n in lag["nodes"].as_array().unwrap() {
        let on = n["generation"].as_str() == Some(&prod.to_hex());
        assert_eq!(n["lagging"], !on, "{n}");
        assert_eq!(n["placed"].as_str(), Some(prod.to_hex().as_str()), "{n}");
    }

    // The command's table.
    let lagging = count(|i| !i.is_multiple_of(6) && (i.is_multiple_of(10) || i.is_multiple_of(25)));
    let table = command(&f, &["production"]);
    let head = format!(
        "production: {} nodes, {} failing, {lagging} lagging",
        count(|i| !i.is_multiple_of(6)),
        count(|i| !i.is_multiple_of(6) && i.is_multiple_of(7))
    );
    assert!(table.contains(&head), "{table}");
    assert!(table.contains(&prod.short()), "{table}");
    assert!(table.contains(&SIGNATURE[..20]), "r10k's label: {table}");
    let trouble = count(|i| {
        !i.is_multiple_of(6)
            && (i.is_multiple_of(7) || i.is_multiple_of(10) || i.is_multiple_of(25))
    });
    let left = format!(
        "nodes that lag or fail: {trouble} (the first 25 listed, {} left out",
        trouble - 25
    );
    assert!(table.contains(&left), "{table}");
    assert!(
        table.lines().count() < 40,
        "a table an operator reads: {table}"
    );

    // --format json: every node matched, with the fields an operator uses.
    let json: Vec<Value> = serde_json::from_str(&command(&f, &["--format", "json"])).unwrap();
    let listed: BTreeSet<&str> = (json.iter())
        .filter_map(|n| n["certname"].as_str())
        .collect();
    assert!(
        want.iter().all(|w| listed.contains(w.as_str())),
        "every node listed"
    );
    for key in [
        "certname",
        "environment",
        "generation",
        "label",
        "last_seen",
        "failing_plugins",
    ] {
        assert!(json[0].get(key).is_some(), "{key}: {}", json[0]);
    }
    let labelled = (json.iter()).filter(|n| n["label"] == SIGNATURE).count();
    assert_eq!(
        labelled,
        count(|i| !i.is_multiple_of(6) && !i.is_multiple_of(10) && !i.is_multiple_of(25))
    );
    // The label in `bundle`'s line too.
    let out = f.config.with_file_name("b.tar");
    let bundle = Command::new(bin_path("pluginsync-master"))
        .args(["bundle", "production", "--config"])
        .arg(&f.config)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bundle.stdout);
    assert!(
        said.contains(&format!(
            "bundle: generation {} [{SIGNATURE}]",
            prod.short()
        )),
        "{said}"
    );
    let failing: Vec<Value> = serde_json::from_str(&command(
        &f,
        &["production", "--failing", "--format", "json"],
    ))
    .unwrap();
    assert_eq!(
        failing.len(),
        count(|i| !i.is_multiple_of(6) && i.is_multiple_of(7))
    );
    assert!(
        failing
            .iter()
            .all(|n| n["failing_plugins"][0] == "plugins/facter/bad.rb")
    );
    let not: Vec<Value> = serde_json::from_str(&command(
        &f,
        &[
            "production",
            "--not-generation",
            &prod.to_hex()[..8],
            "--format",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(not.len(), lagging, "another generation, or none");
    assert!(command(&f, &["--stale", "1h"]).contains("no node matched"));
}

/// Every metric name a query of `packaging/grafana-pluginsync.json` uses
/// is one a running master exports (scraped from its `/metrics` with a
/// rollout policy, nodes heard and requests answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_master_exports() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/grafana-pluginsync.json");
    let dashboard: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("JSON");
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    let used: BTreeSet<String> = (exprs.iter())
        .flat_map(|e| {
            let mut names = Vec::new();
            let mut rest = e.as_str();
            while let Some(i) = rest.find("pluginsync_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.push(tail[..end].to_owned());
                rest = &tail[end..];
            }
            names
        })
        .collect();
    for want in [
        "pluginsync_rollout_open_percent",
        "pluginsync_rollout_wave",
        "pluginsync_rollout_halted",
        "pluginsync_fleet_nodes",
        "pluginsync_fleet_load_failures",
    ] {
        assert!(used.contains(want), "the dashboard shows {want}: {used:?}");
    }

    let f = Fleet::start();
    hear_all(&f).await;
    let port = f.master.metrics.expect("metrics").port();
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: BTreeSet<&str> = (text.lines())
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried but not exported: {missing:?}\n{text}"
    );
    assert!(
        text.contains("pluginsync_rollout_open_percent{environment=\"production\"} 100"),
        "{text}"
    );
}
