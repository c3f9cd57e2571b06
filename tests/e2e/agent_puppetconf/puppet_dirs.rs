//! Puppet's own directories by default (docs/agent.md#on-a-puppet-node): with a puppet.conf and
//! an agent.toml that names no destination, the plugins land in Puppet's `libdir` and the
//! external facts in its `pluginfactdest`, as Puppet resolves them (named, or under `$vardir`;
//! `[agent]` over `[main]`), `pluginsync-agent config` showing them from puppet.conf; and a
//! stock `puppet facts show` with that puppet.conf resolves the synced custom and external
//! facts (SKIPPED without Debian's `puppet`).

use std::path::{Path, PathBuf};

use pluginsync_tests::{AgentHome, EnvTree, Pki, TestMaster, config_toml, parse_config, require};

use super::setting;

/// A custom fact under `lib/facter` and an external fact under `facts.d`.
fn tree_with_facts() -> EnvTree {
    let tree = EnvTree::new();
    tree.file(
        "production",
        "alpha",
        "lib/facter/pluginsync_probe.rb",
        "Facter.add(:pluginsync_probe) { setcode { 'from-libdir' } }\n",
        0o644,
    );
    tree.file(
        "production",
        "alpha",
        "facts.d/role.txt",
        "pluginsync_role=web\n",
        0o644,
    );
    tree
}

/// An agent home whose agent.toml names no destination (only its vardir,
/// puppet.conf, and no fact check), and whose puppet.conf, beside it, is
/// `[main]` with `main` and `[agent]` with `agent` (and what every node has:
/// the server, the ssldir, the certname; Puppet's log and run directories
/// in the home).
fn node(pki: &Pki, master: &TestMaster, main: &str, agent: &str) -> (AgentHome, PathBuf) {
    let home = AgentHome::with_ssldir(Path::new("/nonexistent"), "unused", &[], "");
    let conf = home.path().join("etc-puppet/puppet.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let host_port = master.url().strip_prefix("https://").unwrap().to_owned();
    let dir = home.path().display();
    std::fs::write(
        &conf,
        format!(
            "[main]\nssldir = {ssldir}\nserver_list = {host_port}\nlogdir = {dir}/plog\nrundir = {dir}/prun\n{main}\n\n[agent]\ncertname = node1\n{agent}\n",
            ssldir = pki.ssldir.display(),
        ),
    )
    .unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        format!("vardir = \"var\"\npuppet_conf = {conf:?}\n[facts]\ncheck = false\n"),
    )
    .unwrap();
    (home, conf)
}

/// `libdir` in `[main]` and `pluginfactdest` in `[agent]`: each is the
/// destination, shown with its section; nothing lands in the agent's own
/// directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puppet_confs_libdir_and_pluginfactdest_are_the_destinations() {
    let pki = Pki::new();
    let tree = tree_with_facts();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let scratch = tempfile::tempdir().unwrap();
    let (libdir, factsdir) = (scratch.path().join("plib"), scratch.path().join("pfacts"));
    let (home, _) = node(
        &pki,
        &master,
        &format!("libdir = {}", libdir.display()),
        &format!("pluginfactdest = {}", factsdir.display()),
    );
    let config = home.run(&["config"]);
    assert_eq!(config.code, 0, "{config:?}");
    let out = config.stdout.as_str();
    let (lib_text, facts_text) = (libdir.display().to_string(), factsdir.display().to_string());
    assert_eq!(
        setting(out, "libdir"),
        Some((lib_text.as_str(), "puppet.conf [main]")),
        "{out}"
    );
    assert_eq!(
        setting(out, "factsdir"),
        Some((facts_text.as_str(), "puppet.conf [agent]")),
        "{out}"
    );
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        std::fs::read_to_string(libdir.join("facter/pluginsync_probe.rb")).unwrap(),
        "Facter.add(:pluginsync_probe) { setcode { 'from-libdir' } }\n"
    );
    assert_eq!(
        std::fs::read_to_string(factsdir.join("role.txt")).unwrap(),
        "pluginsync_role=web\n"
    );
    assert!(!home.path().join("var/lib").exists());
    assert!(!home.path().join("var/facts.d").exists());

    // agent.toml naming a destination takes both back from puppet.conf.
    let toml = std::fs::read_to_string(home.path().join("agent.toml")).unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        format!("libdir = \"lib\"\n{toml}"),
    )
    .unwrap();
    let out = home.run(&["config"]).stdout;
    let own_facts = home.path().join("var/facts.d").display().to_string();
    assert_eq!(
        setting(&out, "factsdir"),
        Some((own_facts.as_str(), "default")),
        "{out}"
    );
}

/// Only `vardir` in puppet.conf: `$vardir/lib` and `$vardir/facts.d`, as
/// Puppet resolves them; a stock `puppet facts show` reading that
/// puppet.conf resolves the synced custom fact and external fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puppet_confs_vardir_places_both_and_stock_puppet_resolves_the_synced_facts() {
    let pki = Pki::new();
    let tree = tree_with_facts();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let scratch = tempfile::tempdir().unwrap();
    let vardir = scratch.path().join("pvar");
    let (home, conf) = node(&pki, &master, &format!("vardir = {}", vardir.display()), "");
    let out = home.run(&["config"]).stdout;
    for (name, dir) in [("libdir", "lib"), ("factsdir", "facts.d")] {
        let expected = vardir.join(dir).display().to_string();
        assert_eq!(
            setting(&out, name),
            Some((expected.as_str(), "puppet.conf [main]")),
            "{out}"
        );
    }
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(vardir.join("lib/facter/pluginsync_probe.rb").is_file());
    assert!(vardir.join("facts.d/role.txt").is_file());

    const TEST: &str = "puppet_confs_vardir_places_both_and_stock_puppet_resolves_the_synced_facts";
    let Some(puppet) = require("puppet", "puppet", TEST) else {
        return;
    };
    let out = std::process::Command::new(puppet)
        .args(["facts", "show", "pluginsync_probe", "pluginsync_role"])
        .args(["--render-as", "json", "--config"])
        .arg(&conf)
        .env("HOME", scratch.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let facts: serde_json::Value = serde_json::from_str(&stdout).expect(&stdout);
    assert_eq!(facts["pluginsync_probe"], "from-libdir", "{stdout}");
    assert_eq!(facts["pluginsync_role"], "web", "{stdout}");
}
