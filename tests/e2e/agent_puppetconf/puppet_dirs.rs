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

/// Puppet's directories as its agent resolves them on this host
/// (`puppet config print … --section agent`, Debian's `puppet`), else
/// Debian's, as docs/operating.md lists them.
fn debian_puppet_dirs(test: &str) -> Vec<(String, PathBuf)> {
    let names = ["libdir", "pluginfactdest", "vardir", "ssldir"];
    let Some(puppet) = require("puppet", "puppet", test) else {
        let debian = ["/var/cache/puppet/lib", "/var/cache/puppet/facts.d"];
        let debian = debian
            .into_iter()
            .chain(["/var/cache/puppet", "/var/lib/puppet/ssl"]);
        return names
            .into_iter()
            .map(String::from)
            .zip(debian.map(PathBuf::from))
            .collect();
    };
    let out = std::process::Command::new(puppet)
        .args(["config", "print"])
        .args(names)
        .args(["--section", "agent"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let dirs: Vec<(String, PathBuf)> = text
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.to_owned(), PathBuf::from(v)))
        .collect();
    assert_eq!(dirs.len(), names.len(), "{text}");
    dirs
}

/// The shipped unit (`ProtectSystem=strict`) may write Puppet's libdir,
/// its pluginfactdest and the parent the switch renames in (Debian's, as
/// its `puppet` says, and the AIO packages'), never Puppet's ssldir.
#[test]
fn the_shipped_unit_may_write_puppets_vardir_but_not_its_ssldir() {
    let unit = std::fs::read_to_string(
        pluginsync_tests::repo_root().join("packaging/pluginsync-agent.service"),
    )
    .unwrap();
    let writable = crate::agent_metrics::unit_writable_paths(&unit);
    let under = |p: &Path| writable.iter().any(|w| p.starts_with(w));
    let aio = [
        ("libdir", "/opt/puppetlabs/puppet/cache/lib"),
        ("pluginfactdest", "/opt/puppetlabs/puppet/cache/facts.d"),
        ("ssldir", "/etc/puppetlabs/puppet/ssl"),
    ];
    let aio = aio.map(|(k, v)| (k.to_owned(), PathBuf::from(v)));
    let dirs = debian_puppet_dirs("the_shipped_unit_may_write_puppets_vardir_but_not_its_ssldir");
    for (name, dir) in dirs.into_iter().chain(aio) {
        match name.as_str() {
            "ssldir" => assert!(!under(&dir), "{name} {dir:?} is writable: {writable:?}"),
            "libdir" | "pluginfactdest" => {
                assert!(under(&dir), "{name} {dir:?} is not writable: {writable:?}");
                let parent = dir.parent().unwrap();
                assert!(under(parent), "{parent:?} is not writable: {writable:?}");
            }
            _ => {}
        }
    }
}

/// Under the unit's capabilities (its `CapabilityBoundingSet=`, through
/// `setpriv`), a root agent syncs into a Puppet vardir root does not own
/// (Debian's `/var/cache/puppet` is `puppet:puppet 0751`), switching
/// generations there without a warning; with only the ssldir's
/// `CAP_DAC_READ_SEARCH` it could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_units_capabilities_write_a_puppet_owned_vardir() {
    if !pluginsync_tests::running_as_root() {
        pluginsync_tests::skipped(
            "the_units_capabilities_write_a_puppet_owned_vardir",
            "not root: a mode stops this user anyway",
        );
        return;
    }
    let unit = std::fs::read_to_string(
        pluginsync_tests::repo_root().join("packaging/pluginsync-agent.service"),
    )
    .unwrap();
    let caps = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit names its capabilities")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let pki = Pki::new();
    let tree = tree_with_facts();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let scratch = tempfile::tempdir().unwrap();
    let vardir = scratch.path().join("pvar");
    std::fs::create_dir(&vardir).unwrap();
    std::os::unix::fs::chown(&vardir, Some(4242), Some(4242)).unwrap();
    std::fs::set_permissions(&vardir, std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
    let (home, _) = node(&pki, &master, &format!("vardir = {}", vardir.display()), "");
    let sync = |bounding: &str| {
        std::process::Command::new("setpriv")
            .args(["--bounding-set", bounding, "--inh-caps", "-all", "--"])
            .arg(pluginsync_tests::bin_path("pluginsync-agent"))
            .args(["sync", "--config"])
            .arg(home.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let control = sync("-all,+dac_read_search");
    assert!(!control.status.success(), "{control:?}");
    assert!(!vardir.join("lib").exists());
    let run = sync(&format!("-all,{caps}"));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{run:?}");
    assert!(stderr.trim().is_empty(), "{stderr}");
    assert!(vardir.join("lib/facter/pluginsync_probe.rb").is_file());
    assert!(vardir.join("facts.d/role.txt").is_file());
    assert!(
        vardir.join(".lib.pluginsync").is_dir(),
        "the switch was not used"
    );
}
