//! The agent on a Puppet node (docs/agent.md#on-a-puppet-node): settings from a
//! Debian-style puppet.conf under an agent.toml that names only its own
//! directories, each value's source in `pluginsync-agent config`, the command
//! line winning; and `environment_source = "server"`: the environment the node
//! endpoint assigns (docs/protocol.md §4.10) synced, through a front that
//! answers `/puppet/v3/node/…` and passes everything else to a real master, and
//! the configured one (with one warning) against a pluginsync master alone.
//! The shipped `etc/agent.toml` sets nothing that outranks puppet.conf,
//! and external facts are synced without `factsdir` set, into
//! `<vardir>/facts.d` (docs/agent.md#configuration). A commit waits while a
//! Puppet run holds its run lock, bounded; a stale lock does not delay it
//! (docs/agent.md#a-puppet-run-in-progress).

mod puppet_dirs;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, EnvTree, FakeMaster, Pki, TestMaster, client, config_toml, http_response,
    parse_config, repo_root,
};

/// `production` and `testing`, each with its own `hello.rb`.
fn two_environments() -> EnvTree {
    let tree = EnvTree::new();
    for env in ["production", "testing"] {
        tree.file(
            env,
            "alpha",
            "lib/facter/hello.rb",
            format!("# {env}\n"),
            0o644,
        );
    }
    tree
}

fn synced(home: &AgentHome) -> String {
    std::fs::read_to_string(home.libdir().join("facter/hello.rb")).unwrap_or_default()
}

/// `name = value  (source)` of `pluginsync-agent config`'s text output.
fn setting<'a>(out: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    out.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(" = ")?;
        let (value, source) = rest.rsplit_once("  (")?;
        Some((value, source.strip_suffix(')')?))
    })
}

/// An agent home whose agent.toml holds only `libdir`, `vardir`,
/// `puppet_conf` and `extra`; puppet.conf is written next to it.
fn puppet_node(puppet_conf: &str, extra: &str) -> (AgentHome, std::path::PathBuf) {
    // AgentHome's own agent.toml is replaced below.
    let home = AgentHome::with_ssldir(Path::new("/nonexistent"), "unused", &[], "");
    let conf = home.path().join("etc-puppet/puppet.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, puppet_conf).unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        format!("libdir = \"lib\"\nvardir = \"var\"\npuppet_conf = {conf:?}\n{extra}\n"),
    )
    .unwrap();
    (home, conf)
}

/// A Debian-style puppet.conf: `[main]` with `$vardir` interpolation for
/// the ssldir, `[agent]` overriding the environment.
fn debian_puppet_conf(ssldir: &Path, server: &str, agent_env: &str) -> String {
    let host_port = server.strip_prefix("https://").unwrap();
    format!(
        "# written by the test, shaped as Debian's /etc/puppet/puppet.conf\n\
         [main]\n\
         vardir = {vardir}\n\
         ssldir = $vardir/ssl\n\
         server_list = {host_port}\n\
         environment = production\n\
         \n\
         [server]\n\
         environment = nope\n\
         \n\
         [agent]\n\
         certname = node1\n\
         {agent_env}\n",
        vardir = ssldir.parent().unwrap().display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_puppet_conf_under_agent_toml_and_the_command_line() {
    let pki = Pki::new();
    let tree = two_environments();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    assert_eq!(pki.ssldir.file_name().unwrap(), "ssl");
    let (home, conf) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &master.url(), "environment = testing"),
        "",
    );

    let config = home.run(&["config"]);
    assert_eq!(config.code, 0, "{config:?}");
    let out = config.stdout.as_str();
    assert_eq!(
        setting(out, "servers"),
        Some((master.url().as_str(), "puppet.conf [main]")),
        "{out}"
    );
    assert_eq!(
        setting(out, "environment"),
        Some(("testing", "puppet.conf [agent]")),
        "{out}"
    );
    assert_eq!(
        setting(out, "certname"),
        Some(("node1", "puppet.conf [agent]")),
        "{out}"
    );
    let ssldir = pki.ssldir.display().to_string();
    assert_eq!(
        setting(out, "ssldir"),
        Some((ssldir.as_str(), "puppet.conf [main]")),
        "{out}"
    );
    let libdir = home.libdir().display().to_string();
    assert_eq!(
        setting(out, "libdir"),
        Some((libdir.as_str(), "agent.toml")),
        "{out}"
    );
    let conf_text = conf.display().to_string();
    assert_eq!(
        setting(out, "puppet_conf"),
        Some((conf_text.as_str(), "agent.toml")),
        "{out}"
    );
    assert_eq!(setting(out, "retries"), Some(("3", "default")), "{out}");

    // JSON says the same.
    let json = home.run(&["config", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect(&json.stdout);
    let env = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "environment")
        .unwrap();
    assert_eq!(env["value"], "testing");
    assert_eq!(env["source"], "puppet.conf [agent]");

    // The sync goes by them: puppet.conf's [agent] environment.
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# testing\n");

    // The command line wins over puppet.conf.
    let config = home.run(&["config", "--environment", "production"]);
    assert_eq!(
        setting(&config.stdout, "environment"),
        Some(("production", "command line")),
        "{config:?}"
    );
    let run = home.sync(&["--environment", "production"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");

    // agent.toml wins over puppet.conf.
    let toml = std::fs::read_to_string(home.path().join("agent.toml")).unwrap();
    std::fs::write(
        home.path().join("agent.toml"),
        format!("environment = \"testing\"\n{toml}"),
    )
    .unwrap();
    let config = home.run(&["config"]);
    assert_eq!(
        setting(&config.stdout, "environment"),
        Some(("testing", "agent.toml")),
        "{config:?}"
    );
}

/// The shipped etc/agent.toml under an agent.toml that names only its
/// directories and puppet.conf: puppet.conf's server, certname and ssldir
/// are used (nothing in the shipped file outranks them), and both mounts
/// are synced, external facts into `<vardir>/facts.d` with no `factsdir`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_agent_toml_defers_to_puppet_conf_and_syncs_external_facts() {
    let pki = Pki::new();
    let tree = two_environments();
    tree.file(
        "production",
        "alpha",
        "facts.d/role.txt",
        "role=web\n",
        0o644,
    );
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let shipped = std::fs::read_to_string(repo_root().join("etc/agent.toml")).unwrap();
    let (home, _) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &master.url(), ""),
        &shipped,
    );
    let config = home.run(&["config"]);
    assert_eq!(config.code, 0, "{config:?}");
    let out = config.stdout.as_str();
    assert_eq!(
        setting(out, "certname"),
        Some(("node1", "puppet.conf [agent]")),
        "{out}"
    );
    let facts = home.vardir().join("facts.d");
    let facts_text = facts.display().to_string();
    assert_eq!(
        setting(out, "factsdir"),
        Some((facts_text.as_str(), "default")),
        "{out}"
    );
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    assert_eq!(
        std::fs::read_to_string(facts.join("role.txt")).unwrap(),
        "role=web\n"
    );

    // `factsdir = ""` turns the pluginfacts pass off.
    let (home, _) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &master.url(), ""),
        "factsdir = \"\"\n",
    );
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    assert!(!home.vardir().join("facts.d").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_puppet_conf_is_one_line_naming_it() {
    let pki = Pki::new();
    let (home, conf) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, "https://localhost:1", "serverport = nope"),
        "",
    );
    // `serverport` applies to `server`, not to entries of `server_list`
    // with a port; a server without one takes it.
    std::fs::write(
        &conf,
        "[main]\nserver = localhost\n[agent]\nserverport = nope\n",
    )
    .unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 78, "a config error: {run:?}");
    let err = run.stderr.trim();
    assert!(
        err.contains("serverport 'nope' is not a port") && err.contains(&*conf.to_string_lossy()),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    std::fs::remove_file(&conf).unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 78, "{run:?}");
    assert!(
        run.stderr.contains("cannot read puppet.conf") && run.stderr.trim().lines().count() == 1,
        "{run:?}"
    );
    assert!(!home.libdir().exists() || std::fs::read_dir(home.libdir()).unwrap().count() == 0);
    // A bad value on the command line is still a usage error.
    std::fs::write(&conf, "[main]\nserver = localhost\n").unwrap();
    let run = home.sync(&["--environment", "bad-name"]);
    assert_eq!(run.code, 64, "{run:?}");
}

/// A front for `upstream`: answers `/puppet/v3/node/…` with a node object
/// assigning `assigned` (recording each node request's target) and passes
/// every other request to `upstream` as node1.
fn front(pki: &Pki, upstream: String, assigned: &str, seen: Arc<Mutex<Vec<String>>>) -> FakeMaster {
    let http = client(pki, Some("node1"));
    let node = serde_json::json!({
        "name": "node1",
        "environment": assigned,
        "parameters": {},
        "facts": {"values": {}},
    })
    .to_string();
    FakeMaster::start(
        pki,
        Arc::new(move |target: &str| {
            if target.starts_with("/puppet/v3/node/") {
                seen.lock().unwrap().push(target.to_owned());
                return http_response("200 OK", "application/json", node.as_bytes());
            }
            // The responder is synchronous: the request upstream runs on a
            // thread of its own, with a runtime of its own.
            let (http, url) = (http.clone(), format!("{upstream}{target}"));
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let resp = http.get(&url).send().await.unwrap();
                    let status = resp.status();
                    let ctype = resp
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("application/octet-stream")
                        .to_owned();
                    let body = resp.bytes().await.unwrap();
                    http_response(&status.to_string(), &ctype, &body)
                })
            })
            .join()
            .unwrap()
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_assigned_environment_is_synced_and_a_pluginsync_master_falls_back() {
    let pki = Pki::new();
    let tree = two_environments();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let front = front(&pki, master.url(), "testing", seen.clone());

    let metrics_extra =
        "environment_source = \"server\"\n[metrics]\ntextfile = \"var/agent.prom\"\n";
    let (home, _) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &front.url(), ""),
        metrics_extra,
    );
    let run = home.sync(&["-v"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# testing\n", "{run:?}");
    assert!(
        run.stderr
            .contains("switching to the environment the server assigns"),
        "{run:?}"
    );
    let targets = seen.lock().unwrap().clone();
    assert_eq!(targets.len(), 1, "{targets:?}");
    let rest = targets[0]
        .strip_prefix("/puppet/v3/node/node1?environment=production&configured_environment=production&transaction_uuid=")
        .unwrap_or_else(|| panic!("{targets:?}"));
    assert_eq!(rest.len(), 36, "a UUID: {rest}");
    // The report and the metrics name the environment synced.
    let report = home.run(&["report", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&report.stdout).expect(&report.stdout);
    assert_eq!(v["environment"], "testing");
    let prom = std::fs::read_to_string(home.vardir().join("agent.prom")).unwrap();
    assert!(prom.contains("environment=\"testing\""), "{prom}");

    // `--environment` is never replaced, and the node is not asked (as
    // Puppet's agent).
    let run = home.sync(&["--environment", "production"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    assert_eq!(seen.lock().unwrap().len(), 1);

    // A pluginsync master alone answers 404 for the node: the configured
    // environment, with one warning line.
    let (home, _) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &master.url(), ""),
        metrics_extra,
    );
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    let warnings: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(warnings.len(), 1, "{run:?}");
    assert!(
        warnings[0].contains("do not serve the node endpoint")
            && warnings[0].contains("production"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_or_malformed_node_answer_stops_the_run_before_any_change() {
    let pki = Pki::new();
    let huge = format!(
        "{{\"name\":\"node1\",\"environment\":\"testing\",\"parameters\":{{\"x\":\"{}\"}}}}",
        "a".repeat(2 << 20)
    );
    for (body, expected) in [
        (huge, "larger than 1024 KiB"),
        ("{\"name\":\"node1\"}".to_owned(), "not a node object"),
        ("{\"environment\":\"bad-name\"}".to_owned(), "bad-name"),
    ] {
        let fake = FakeMaster::start(
            &pki,
            Arc::new(move |_: &str| http_response("200 OK", "application/json", body.as_bytes())),
        );
        let (home, _) = puppet_node(
            &debian_puppet_conf(&pki.ssldir, &fake.url(), ""),
            "environment_source = \"server\"\n",
        );
        std::fs::create_dir_all(home.libdir()).unwrap();
        std::fs::write(home.libdir().join("keep.rb"), "local\n").unwrap();
        let run = home.sync(&[]);
        assert_eq!(run.code, 1, "{run:?}");
        let err = run.stderr.trim();
        assert!(err.contains(expected) && err.contains("the node"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(
            std::fs::read_to_string(home.libdir().join("keep.rb")).unwrap(),
            "local\n"
        );
    }
}

/// The flags a Puppet operator types by habit (docs/agent.md#puppet-style-flags):
/// `--certname NAME` picks the ssldir's files of NAME, `--server HOST`
/// without `https://` is `https://HOST:8140` (with `:PORT`, that port), and
/// `--test` is `puppet agent -t`: info lines and detailed exit codes. All
/// three were refused as usage errors (64) before.
#[test]
fn puppet_style_flags_are_taken() {
    let (tree, pki) = (two_environments(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let port = master.addr.port();
    // agent.toml names node1 and no server the run could reach.
    let home = AgentHome::new(&pki, &["https://nowhere.invalid:1".to_owned()], "");

    let shown = home.run(&["config", "--server", "puppet", "--certname", "node2"]);
    assert_eq!(shown.code, 0, "{shown:?}");
    assert_eq!(
        setting(&shown.stdout, "servers"),
        Some(("https://puppet:8140", "command line")),
        "{shown:?}"
    );
    assert_eq!(
        setting(&shown.stdout, "certname"),
        Some(("node2", "command line")),
        "{shown:?}"
    );

    // The certname names the files: one that has none fails on them.
    let server = format!("localhost:{port}");
    let run = home.sync(&["--server", &server, "--certname", "nosuch"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("nosuch.pem"), "{run:?}");
    assert!(!home.libdir().join("facter/hello.rb").exists());

    // `--test`: the first run changes files (2), says what it does at
    // info, and the next changes nothing (0).
    let run = home.sync(&["--test", "--server", &server, "--certname", "node2"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains(" INFO "), "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    let run = home.sync(&["-t", "--server", &server, "--certname", "node2"]);
    assert_eq!(run.code, 0, "{run:?}");
}

/// A `sleep 30` standing in for a Puppet run: its pid written into `lock`.
fn hold_puppet_lock(lock: &Path) -> std::process::Child {
    let holder = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    std::fs::write(lock, format!("{}\n", holder.id())).unwrap();
    holder
}

/// The last report's `puppet_lock_waited_ms`, if it has one.
fn waited_ms(home: &AgentHome) -> Option<u64> {
    let text = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect(&text);
    v.get("puppet_lock_waited_ms").map(|w| w.as_u64().unwrap())
}

/// A Puppet run in progress (docs/agent.md#a-puppet-run-in-progress): the lock
/// file puppet.conf implies (`$vardir/state/agent_catalog_run.lock`) holds
/// the pid of a live process, and a change is pending. The run stages, then
/// waits: the destination is unchanged while the lock is held; once the
/// holder exits and its lock is gone the run commits, and its report says
/// how long it waited. SIGTERM ends the wait, changing nothing. A no-op run
/// with the lock held returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_waits_while_a_puppet_run_holds_its_lock() {
    let pki = Pki::new();
    let tree = two_environments();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let (home, _) = puppet_node(
        &debian_puppet_conf(&pki.ssldir, &master.url(), ""),
        "[puppet_lock]\nwait = \"60s\"\n",
    );
    // puppet.conf's `vardir` is the ssldir's parent.
    let lock = pki
        .ssldir
        .parent()
        .unwrap()
        .join("state/agent_catalog_run.lock");
    let mut holder = hold_puppet_lock(&lock);

    // SIGTERM ends the wait as any phase before the commit.
    let mut agent = home.spawn_sync(&[], "pluginsync_agent=info");
    assert!(
        agent.stderr_until("a Puppet run holds its lock"),
        "{:?}",
        agent.lines
    );
    agent.signal(rustix::process::Signal::TERM);
    let run = agent.finish();
    assert_eq!(run.code, 143, "{run:?}");
    assert!(
        run.stderr
            .contains("interrupted by SIGTERM before the commit; nothing was changed"),
        "{run:?}"
    );
    assert_eq!(synced(&home), "", "the libdir changed under a Puppet run");

    let mut agent = home.spawn_sync(&[], "pluginsync_agent=info");
    assert!(
        agent.stderr_until("a Puppet run holds its lock"),
        "{:?}",
        agent.lines
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(synced(&home), "", "the libdir changed under a Puppet run");
    holder.kill().unwrap();
    holder.wait().unwrap();
    std::fs::remove_file(&lock).unwrap();
    let run = agent.finish();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    let waited = waited_ms(&home).expect("puppet_lock_waited_ms");
    assert!(waited >= 1000, "waited {waited} ms");

    // Nothing to change: the lock is not even looked at.
    let mut holder = hold_puppet_lock(&lock);
    let start = Instant::now();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(start.elapsed() < Duration::from_secs(20), "{run:?}");
    assert_eq!(waited_ms(&home), None);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// A Puppet run that outlasts `[puppet_lock] wait` stops the run with one
/// line and exit 75, the destination unchanged and the report saying how
/// long it waited; a stale lock (its pid dead, or no pid in it) does not
/// delay a run, nor does a lock held by an ancestor of the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_puppet_lock_is_ignored_and_the_wait_is_bounded() {
    let pki = Pki::new();
    let tree = two_environments();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        "[puppet_lock]\nfile = \"puppet.lock\"\nwait = \"2s\"\n",
    );
    let lock = home.path().join("puppet.lock");
    let mut holder = hold_puppet_lock(&lock);

    let start = Instant::now();
    let run = home.sync(&[]);
    assert_eq!(run.code, 75, "{run:?}");
    assert!(start.elapsed() >= Duration::from_secs(2), "{run:?}");
    assert_eq!(
        run.stderr.lines().collect::<Vec<_>>(),
        [format!(
            "error: a Puppet run (pid {}) still holds {} after 2s; nothing changed",
            holder.id(),
            lock.display()
        )],
        "{run:?}"
    );
    assert_eq!(synced(&home), "", "the libdir changed under a Puppet run");
    assert!(waited_ms(&home).expect("puppet_lock_waited_ms") >= 2000);

    // The holder dies without removing its lock: stale, not waited for;
    // so is a lock without a pid.
    holder.kill().unwrap();
    holder.wait().unwrap();
    for stale in ["", "not a pid\n"] {
        if !stale.is_empty() {
            std::fs::write(&lock, stale).unwrap();
        }
        std::fs::remove_dir_all(home.libdir()).ok();
        let run = home.sync(&[]);
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(synced(&home), "# production\n");
        assert_eq!(waited_ms(&home), None);
    }

    // Run from inside the Puppet run that holds the lock (an `exec`
    // resource): the holder is an ancestor (here the test, the agent's
    // parent), so waiting would never end; the run does not wait.
    std::fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    std::fs::remove_dir_all(home.libdir()).unwrap();
    let mut agent = home.spawn_sync(&[], "pluginsync_agent=info");
    assert!(
        agent.stderr_until("inside the Puppet run holding its lock"),
        "{:?}",
        agent.lines
    );
    let run = agent.finish();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), "# production\n");
    assert_eq!(waited_ms(&home), None);
}

/// A `[puppet_lock] file` that is a symlink to a secret (here a copy of a
/// shadow line) is not followed: the `-vv` log names the lock and says it
/// is a symlink, never what the secret holds, and the run goes on; `config`
/// prints the lock file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puppet_lock_that_is_a_symlink_to_a_secret_is_named_never_quoted() {
    let pki = Pki::new();
    let tree = two_environments();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        "[puppet_lock]\nfile = \"puppet.lock\"\nwait = \"2s\"\n",
    );
    let secret = home.path().join("shadow");
    std::fs::write(&secret, "root:*:SECRET-HASH:0:99999:7:::\n").unwrap();
    let lock = home.path().join("puppet.lock");
    std::os::unix::fs::symlink(&secret, &lock).unwrap();
    // `config` names the lock a run waits on, and where that came from.
    let shown = home.run(&["config"]);
    assert_eq!(shown.code, 0, "{shown:?}");
    let lock_name = lock.display().to_string();
    assert_eq!(
        setting(&shown.stdout, "puppet_lock.file"),
        Some((lock_name.as_str(), "agent.toml")),
        "{}",
        shown.stdout
    );
    let run = home.sync(&["-vv"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("SECRET"), "{}", run.stderr);
    assert!(
        run.stderr.contains("is a symlink, not a lock file"),
        "{}",
        run.stderr
    );
    assert_eq!(synced(&home), "# production\n");
}
