//! The node report right after the commit (docs/protocol.md §7.8), with
//! the real agent binary against a real master:
//!
//! - after one `sync` of a generation whose load fails, the master's
//!   inventory (`GET /pluginsync/v1/inventory`, as an admin) lists the
//!   node on that generation with the failure, before any second run;
//! - a `sync --noop` after that leaves the node's record as it was
//!   (`X-Pluginsync-Noop`: nothing of it recorded, not even its time);
//! - a body that is not a report is refused with a 400 and records
//!   nothing.

use std::collections::BTreeMap;

use pluginsync_tests::{AgentHome, EnvTree, Pki, TestMaster, client, config_toml, parse_config};
use serde_json::Value;

/// A loader that fails on `facter/x.rb`.
const FAILING: &str = "[load]\nenabled = true\n\n[[loader]]\nname = \"refuses x\"\nmatch = \"facter/x.rb\"\nkind = \"command\"\ncommand = [\"false\"]\n";

/// Runs `fut` to its end on a runtime of its own.
fn block_on<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(fut)
}

/// The inventory's nodes by certname, as the admin `node2` reads them.
fn inventory(pki: &Pki, master: &str) -> BTreeMap<String, Value> {
    let c = client(pki, Some("node2"));
    let url = format!("{master}/pluginsync/v1/inventory");
    let body: Value = block_on(async { c.get(url).send().await.expect("inventory").json().await })
        .expect("inventory JSON");
    let nodes = body["nodes"].as_array().expect("nodes").iter();
    nodes
        .map(|n| (n["certname"].as_str().unwrap().to_owned(), n.clone()))
        .collect()
}

/// A master (admin: `node2`) serving one plugin, and `node1` syncing
/// from it with a loader that refuses that plugin.
fn node() -> (Pki, EnvTree, TestMaster, AgentHome) {
    let pki = Pki::new();
    let t = EnvTree::new();
    t.file("production", "m", "lib/facter/x.rb", "# x\n", 0o644);
    let tables = "[admin]\ncertnames = [\"node2\"]\n";
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", tables)));
    let home = AgentHome::new(&pki, &[master.url()], FAILING);
    (pki, t, master, home)
}

#[test]
fn the_inventory_shows_a_sync_and_its_failed_load_before_the_next_run_and_noop_changes_nothing() {
    let (pki, _t, master, home) = node();
    home.sync(&[]);
    let text = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
    let report: Value = serde_json::from_str(&text).unwrap();
    let generation = report["generation"].as_str().expect("a generation");
    // No second run: what the inventory says came right after the commit.
    let nodes = inventory(&pki, &master.url());
    let n = nodes.get("node1").unwrap_or_else(|| panic!("{nodes:?}"));
    assert_eq!(n["generation"], generation, "{n}");
    assert_eq!(n["source"], "report", "{n}");
    assert_eq!(n["load_failures"], 1, "{n}");
    assert_eq!(n["failed_plugins"][0], "plugins/facter/x.rb", "{n}");

    // A `--noop` run records nothing, not even when it was seen.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let run = home.sync(&["--noop"]);
    assert!(
        run.stderr.is_empty() || !run.stderr.contains("error"),
        "{run:?}"
    );
    let after = inventory(&pki, &master.url());
    assert_eq!(
        after.get("node1"),
        Some(n),
        "a --noop run changed the record"
    );
}

#[test]
fn a_body_that_is_not_a_report_is_refused_and_records_nothing() {
    let (pki, _t, master, _home) = node();
    let c = client(&pki, Some("node1"));
    let url = format!(
        "{}/pluginsync/v1/report?environment=production",
        master.url()
    );
    let post = |body: String| {
        let (c, url) = (c.clone(), url.clone());
        block_on(async move {
            c.post(url)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    assert_eq!(
        post("{\"loads_failed\":3}".to_owned()),
        400,
        "counted, not named"
    );
    assert_eq!(post("x".repeat(5000)), 400, "over 4,096 bytes");
    assert!(!inventory(&pki, &master.url()).contains_key("node1"));
    // A report as the header carries it is recorded (204).
    assert_eq!(post("{\"loads_ok\":2}".to_owned()), 204);
    let nodes = inventory(&pki, &master.url());
    assert_eq!(nodes["node1"]["loads_ok"], 2, "{nodes:?}");
}
