//! Real Puppet peers on both sides, with one throwaway Puppet Server 7
//! (Debian's `puppetserver`) on 127.0.0.1 serving the bench's generated
//! environment:
//!
//! 1. Puppet Server as the source: its CA signs `node1`; pluginsync's agent
//!    syncs with that Puppet ssldir (`[tls] ssldir, certname`) and gets
//!    exactly what a stock `puppet plugin download` gets from the same
//!    server; its second run sends no `file_content` request (read from
//!    Puppet Server's access log); a change on the server moves exactly the
//!    changed file.
//! 2. A stock Puppet agent as the client of pluginsync's master, whose
//!    certificate the same Puppet CA signed: `puppet plugin download` gets
//!    what it got from Puppet Server, and `puppet agent -t` passes the
//!    environment probe and pluginsyncs (its catalog request fails: only
//!    what pluginsync did is asserted).
//!
//! 3. The control-repository fixture
//!    (docs/master.md#code-trees-as-r10k-and-code-manager-deploy-them;
//!    environment `control`: `environment.conf` with site-modules before
//!    modules, a glob, a missing entry and `$basemodulepath`, which is
//!    `code/modules` on both servers): Puppet Server serves what the
//!    fixture says, and the stock agent and ours get identical trees
//!    (content, and facts.d modes) from Puppet Server and from pluginsync's
//!    master.
//!
//! Skipped with a message where `puppet` or `puppetserver` is missing,
//! except under CI. One JVM for both parts: it takes ~20 s to start.

use std::collections::BTreeMap;
use std::path::Path;

use pluginsync_tests::puppet::{PuppetAgent, PuppetServer, gen_tree, requests};
use pluginsync_tests::{
    AgentHome, ControlRepo, TestMaster, merged_mount, parse_config, require, tree_snapshot,
    without_modes,
};

const TEST: &str = "puppet_server";

/// Asserts two trees are equal; on failure names only the paths that
/// differ (the trees hold hundreds of files).
#[track_caller]
fn assert_same(left: &BTreeMap<String, String>, right: &BTreeMap<String, String>, what: &str) {
    let diff: Vec<String> = left
        .keys()
        .chain(right.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| left.get(*k) != right.get(*k))
        .map(|k| format!("  {k}: {:?} vs {:?}", left.get(k), right.get(k)))
        .collect();
    assert!(diff.is_empty(), "{what}:\n{}", diff.join("\n"));
}

/// What is in `dir`, without modes.
fn contents(dir: &Path) -> BTreeMap<String, String> {
    without_modes(tree_snapshot(dir))
}

/// The environment's merged `subdir` mount, computed independently (the
/// generated environment's `environment.conf` says `modulepath = modules`,
/// so the basemodulepath, where the control fixture's base modules are, is
/// not part of it).
fn expected_contents(env_dir: &Path, subdir: &str) -> BTreeMap<String, String> {
    without_modes(merged_mount(env_dir, subdir))
}

/// Changes by action (`created`, `updated`, `removed`, `mode`) and the
/// failure count of a JSON report.
fn counts(stdout: &str) -> BTreeMap<String, usize> {
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let mut out = BTreeMap::new();
    for c in report["changes"].as_array().expect("changes") {
        *out.entry(c["action"].as_str().expect("action").to_owned())
            .or_default() += 1;
    }
    out.insert(
        "failed".to_owned(),
        report["failures"].as_array().expect("failures").len(),
    );
    out
}

#[test]
fn puppet_server_as_source_and_stock_agent_as_client() {
    let Some(puppet) = require("puppet", "puppet", TEST) else {
        return;
    };
    if !PuppetServer::required(TEST) {
        return;
    }
    let server = PuppetServer::start(|envpath| {
        gen_tree(&envpath.join("production"), 10, 300, 2, 1);
        ControlRepo::write(
            &envpath.join("control"),
            &envpath.parent().expect("codedir").join("modules"),
        );
    });
    let base = server.envpath().parent().unwrap().join("modules");
    let env_dir = server.envpath().join("production");
    server.generate("node1", None);
    let work = tempfile::tempdir().unwrap();

    // ---- 1. Puppet Server as the source of pluginsync's agent.
    let home = AgentHome::with_ssldir(
        &server.ssldir(),
        "node1",
        &[server.url()],
        "environment = \"production\"",
    );
    let first = home.sync(&["--format", "json"]);
    assert_eq!(first.code, 0, "{first:?}");
    let summary = counts(&first.stdout);
    assert!(
        summary.get("created").copied().unwrap_or(0) > 300,
        "{summary:?}"
    );
    assert_eq!(summary["failed"], 0, "{summary:?}");
    assert_same(
        &contents(&home.libdir()),
        &expected_contents(&env_dir, "lib"),
        "pluginsync's libdir differs from the environment's merged lib/",
    );

    // The stock agent, from the same server.
    let stock = PuppetAgent::new(
        &puppet,
        &work.path().join("stock"),
        &server.ssldir(),
        "node1",
        server.port,
    );
    let run = stock.plugin_download("production");
    assert_eq!(
        run.code, 0,
        "puppet plugin download failed:\n{}",
        run.output
    );
    assert_eq!(
        contents(&home.libdir()),
        contents(&stock.libdir()),
        "libdir differs from what puppet plugin download got"
    );
    // facts.d with modes: both sides apply the source's permissions there.
    assert_eq!(
        tree_snapshot(&home.factsdir()),
        tree_snapshot(&stock.factsdir()),
        "facts.d differs (content or modes) from what puppet plugin download got"
    );

    // Second run: two listings, no file_content.
    let before = server.access_log().lines().count();
    let second = home.sync(&["--format", "json", "--detailed-exitcodes"]);
    assert_eq!(second.code, 0, "{second:?}");
    let log = server.access_log();
    let new: String = log.lines().skip(before).map(|l| format!("{l}\n")).collect();
    assert_eq!(
        requests(&new, "/puppet/v3/file_metadatas/").len(),
        2,
        "expected the two listings in the access log:\n{new}"
    );
    assert_eq!(
        requests(&new, "/puppet/v3/file_content/"),
        Vec::<&str>::new(),
        "the second run downloaded content"
    );

    // A change on the server: exactly that file moves, a removal purges.
    let lib_files: Vec<_> = merged_mount(&env_dir, "lib")
        .into_iter()
        .filter(|(_, v)| v.starts_with("file"))
        .map(|(k, _)| k)
        .collect();
    let (changed, removed) = (&lib_files[0], &lib_files[1]);
    let find = |rel: &str| {
        std::fs::read_dir(env_dir.join("modules"))
            .unwrap()
            .flatten()
            .map(|m| m.path().join("lib").join(rel))
            .find(|p| p.is_file())
            .unwrap()
    };
    std::fs::write(find(changed), "# changed on the Puppet Server\n").unwrap();
    std::fs::remove_file(find(removed)).unwrap();
    let before = server.access_log().lines().count();
    let third = home.sync(&["--format", "json"]);
    assert_eq!(third.code, 0, "{third:?}");
    let expected: BTreeMap<String, usize> = [("updated", 1), ("removed", 1), ("failed", 0)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(counts(&third.stdout), expected, "{}", third.stdout);
    let log = server.access_log();
    let new: String = log.lines().skip(before).map(|l| format!("{l}\n")).collect();
    assert_eq!(requests(&new, "/puppet/v3/file_content/").len(), 1, "{new}");
    assert_eq!(contents(&home.libdir()), expected_contents(&env_dir, "lib"));

    // The control repository from Puppet Server: what the fixture says,
    // to the stock agent and to ours.
    let stock_control = PuppetAgent::new(
        &puppet,
        &work.path().join("stock-control"),
        &server.ssldir(),
        "node1",
        server.port,
    );
    let run = stock_control.plugin_download("control");
    assert_eq!(run.code, 0, "{}", run.output);
    assert_eq!(
        contents(&stock_control.libdir()),
        ControlRepo::expected("lib", false),
        "Puppet Server's control libdir is not what the fixture says"
    );
    assert_eq!(
        tree_snapshot(&stock_control.factsdir()),
        ControlRepo::expected("facts.d", true),
        "Puppet Server's control facts.d is not what the fixture says"
    );
    let home_control = AgentHome::with_ssldir(
        &server.ssldir(),
        "node1",
        &[server.url()],
        "environment = \"control\"",
    );
    let run = home_control.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        contents(&home_control.libdir()),
        contents(&stock_control.libdir())
    );
    assert_eq!(
        tree_snapshot(&home_control.factsdir()),
        tree_snapshot(&stock_control.factsdir())
    );

    // ---- 2. A stock Puppet agent against pluginsync's master, whose
    // certificate the Puppet CA signed.
    server.generate("pluginsync-master", Some("localhost,127.0.0.1"));
    let ssl = server.ssldir();
    let master = TestMaster::start(parse_config(&format!(
        "listen = [\"127.0.0.1:0\"]\nenvironmentpath = [{envpath:?}]\n\
         basemodulepath = [{base:?}]\n\
         [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\ncrl = {crl:?}\n\
         [http]\nshutdown_grace = \"0s\"\n",
        envpath = server.envpath(),
        cert = ssl.join("certs/pluginsync-master.pem"),
        key = ssl.join("private_keys/pluginsync-master.pem"),
        ca = ssl.join("certs/ca.pem"),
        crl = ssl.join("crl.pem"),
    )));
    let port = master.addr.port();

    // ---- 3. The control repository from our master: the same trees as
    // from Puppet Server, through the stock agent and through ours.
    let ours_control = PuppetAgent::new(
        &puppet,
        &work.path().join("ours-control"),
        &ssl,
        "node1",
        port,
    );
    let run = ours_control.plugin_download("control");
    assert_eq!(run.code, 0, "{}", run.output);
    assert_eq!(
        tree_snapshot(&ours_control.libdir()),
        tree_snapshot(&stock_control.libdir()),
        "stock agent: our master's control libdir differs from Puppet Server's"
    );
    assert_eq!(
        tree_snapshot(&ours_control.factsdir()),
        tree_snapshot(&stock_control.factsdir()),
        "stock agent: our master's control facts.d differs from Puppet Server's"
    );
    let home_ours =
        AgentHome::with_ssldir(&ssl, "node1", &[master.url()], "environment = \"control\"");
    let run = home_ours.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        tree_snapshot(&home_ours.libdir()),
        tree_snapshot(&home_control.libdir()),
        "our agent: our master's control libdir differs from Puppet Server's"
    );
    assert_eq!(
        tree_snapshot(&home_ours.factsdir()),
        tree_snapshot(&home_control.factsdir()),
        "our agent: our master's control facts.d differs from Puppet Server's"
    );

    // The stock agent again from Puppet Server (after the change), then
    // a fresh one from our master: the same trees, modes included.
    assert_eq!(stock.plugin_download("production").code, 0);
    let ours = PuppetAgent::new(&puppet, &work.path().join("ours"), &ssl, "node1", port);
    let run = ours.plugin_download("production");
    assert_eq!(
        run.code, 0,
        "puppet plugin download from our master:\n{}",
        run.output
    );
    assert!(
        run.output.contains("Downloaded these plugins"),
        "{}",
        run.output
    );
    assert_eq!(
        tree_snapshot(&ours.libdir()),
        tree_snapshot(&stock.libdir())
    );
    assert_eq!(
        tree_snapshot(&ours.factsdir()),
        tree_snapshot(&stock.factsdir())
    );

    // `puppet agent -t`: the environment probe passes and pluginsync runs;
    // the catalog request then fails (we serve no catalogs).
    let full = PuppetAgent::new(&puppet, &work.path().join("full"), &ssl, "node1", port);
    let run = full.agent_test("production");
    assert!(
        run.output.contains("Retrieving plugin")
            && !run.output.contains("skipping initial pluginsync"),
        "{}",
        run.output
    );
    // It went on to ask for a catalog: pluginsync did not stop the run.
    assert!(
        run.output
            .contains("/puppet/v3/catalog/node1 resulted in 404"),
        "{}",
        run.output
    );
    assert_eq!(
        tree_snapshot(&full.libdir()),
        tree_snapshot(&stock.libdir()),
        "puppet agent -t did not pluginsync:\n{}",
        run.output
    );
    assert_eq!(
        tree_snapshot(&full.factsdir()),
        tree_snapshot(&stock.factsdir())
    );

    // An environment our master does not have: the probe's 404 makes the
    // agent skip pluginsync, and nothing is touched.
    let before = tree_snapshot(&full.libdir());
    let run = full.agent_test("nosuchenv");
    assert!(
        run.output
            .contains("Environment 'nosuchenv' not found on server, skipping initial pluginsync"),
        "{}",
        run.output
    );
    assert_eq!(tree_snapshot(&full.libdir()), before);
}
