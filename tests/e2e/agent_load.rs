//! Loading changed plugins with real child processes (docs/loading.md): a
//! loader that exits 1, one that hangs (killed at its deadline with its
//! children), one killed by a signal, a describe plugin whose name and
//! answer disagree, a bad `_SHA256SUM`, several versions of one plugin
//! (highest wins, `-dev` loses to its release), unchanged files never
//! reloaded, loading disabled (nothing executed). In every case the sync
//! completes, the other plugins load, and the report says what happened.

use std::path::Path;

use pluginsync_agent::plugins::{host_arch, host_os};
use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, bin_path, config_toml, parse_config, sha256_hex,
};

fn plugin_name(name: &str, version: &str) -> String {
    format!(
        "pluginsync-plugin-{name}_v{version}_x1.0_{}_{}",
        host_os(),
        host_arch()
    )
}

/// A describe plugin: answers `describe` with `version` (which may differ
/// from its name), and notes every run in `$DESCRIBE_MARKER`.
fn describe_script(version: &str) -> String {
    format!(
        "#!/bin/sh\n[ -n \"$DESCRIBE_MARKER\" ] && echo \"$0\" >> \"$DESCRIBE_MARKER\"\n[ \"$1\" = describe ] || exit 64\necho '{{\"version\":\"{version}\",\"api_version\":\"x1.0\",\"protocol\":\"stdio\"}}'\n"
    )
}

fn tree() -> EnvTree {
    let t = EnvTree::new();
    for f in ["ok.rb", "fail.rb", "hang.rb", "signal.rb"] {
        t.file(
            "production",
            "alpha",
            &format!("lib/loaders/{f}"),
            format!("# {f}\n"),
            0o644,
        );
    }
    t.file(
        "production",
        "alpha",
        "lib/other/unmatched.rb",
        "# no loader\n",
        0o644,
    );
    for v in ["1.0.0", "1.0.1-dev", "1.0.1"] {
        t.file(
            "production",
            "alpha",
            &format!("lib/bin/{}", plugin_name("hello", v)),
            describe_script(v),
            0o755,
        );
    }
    t.file(
        "production",
        "alpha",
        &format!("lib/bin/{}", plugin_name("liar", "2.0.0")),
        describe_script("2.0.1"),
        0o755,
    );
    let badsum = plugin_name("badsum", "1.0.0");
    t.file(
        "production",
        "alpha",
        &format!("lib/bin/{badsum}"),
        describe_script("1.0.0"),
        0o755,
    );
    t.file(
        "production",
        "alpha",
        &format!("lib/bin/{badsum}_SHA256SUM"),
        format!("{}  {badsum}\n", sha256_hex(b"other")),
        0o644,
    );
    let goodsum = plugin_name("goodsum", "3.1.4");
    let script = describe_script("3.1.4");
    t.file(
        "production",
        "alpha",
        &format!("lib/bin/{goodsum}"),
        &script,
        0o755,
    );
    t.file(
        "production",
        "alpha",
        &format!("lib/bin/{goodsum}_SHA256SUM"),
        format!("{}\n", sha256_hex(script.as_bytes())),
        0o644,
    );
    t
}

/// Loader config writing into `marks`.
fn loaders(marks: &Path, enabled: bool, failures_are_errors: bool) -> String {
    let m = |f: &str| marks.join(f).display().to_string();
    format!(
        r#"
[load]
enabled = {enabled}
failures_are_errors = {failures_are_errors}
after_load = ["sh", "-c", "echo after >> {after}"]

[[loader]]
name = "marker"
match = "loaders/ok.rb"
kind = "command"
command = ["sh", "-c", "echo \"$0 $1 $2\" >> {ok}", "{{path}}", "{{relpath}}", "{{environment}}"]

[[loader]]
name = "broken"
match = "loaders/fail.rb"
kind = "command"
command = ["sh", "-c", "echo broken >&2; echo ran >> {fail}; exit 1"]
attempts = 2

[[loader]]
name = "hangs"
match = "loaders/hang.rb"
kind = "command"
command = ["sh", "-c", "sleep 300 & echo $! > {pid}; wait"]
timeout = "1s"

[[loader]]
name = "crashes"
match = "loaders/signal.rb"
kind = "command"
command = ["sh", "-c", "kill -9 $$"]

[[loader]]
name = "plugins"
match = "bin/pluginsync-plugin-*"
kind = "describe"
env = {{ DESCRIBE_MARKER = "{describe}" }}
"#,
        after = m("after"),
        ok = m("ok"),
        fail = m("fail"),
        pid = m("pid"),
        describe = m("describe"),
    )
}

fn loads(report: &serde_json::Value) -> std::collections::BTreeMap<String, (String, String)> {
    report["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["path"].as_str().unwrap().to_owned(),
                (
                    l["status"].as_str().unwrap().to_owned(),
                    l["error"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect()
}

/// True if `pid` is not running (gone, or a zombie nobody reaped yet).
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                == Some("Z")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_load_is_isolated_and_reported() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let home = AgentHome::new(&pki, &[master.url()], &loaders(marks.path(), true, false));

    let run = home.sync(&["--format", "json", "--detailed-exitcodes"]);
    assert_eq!(run.code, 2, "load failures do not fail the sync: {run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let l = loads(&report);
    let status = |p: &str| {
        l.get(p)
            .unwrap_or_else(|| panic!("{p} not in {l:#?}"))
            .clone()
    };

    let ok = status("plugins/loaders/ok.rb");
    assert_eq!(ok.0, "ok");
    let lib = home.libdir();
    assert_eq!(
        std::fs::read_to_string(marks.path().join("ok")).unwrap(),
        format!(
            "{} loaders/ok.rb production\n",
            lib.join("loaders/ok.rb").display()
        ),
        "placeholders replaced"
    );
    let fail = status("plugins/loaders/fail.rb");
    assert_eq!(fail.0, "failed");
    assert!(
        fail.1.contains("exited with status 1: broken") && fail.1.contains("attempt 2 of 2"),
        "{}",
        fail.1
    );
    assert_eq!(
        std::fs::read_to_string(marks.path().join("fail"))
            .unwrap()
            .lines()
            .count(),
        2,
        "launched twice"
    );
    let hang = status("plugins/loaders/hang.rb");
    assert_eq!(hang.0, "failed");
    assert!(hang.1.contains("timed out after 1s"), "{}", hang.1);
    let child = std::fs::read_to_string(marks.path().join("pid")).unwrap();
    assert!(
        dead(&child),
        "the hanging loader's child {child} was killed with it"
    );
    let sig = status("plugins/loaders/signal.rb");
    assert_eq!(
        (sig.0.as_str(), sig.1.as_str()),
        ("failed", "killed by signal 9")
    );

    for v in ["1.0.0", "1.0.1-dev", "1.0.1"] {
        assert_eq!(
            status(&format!("plugins/bin/{}", plugin_name("hello", v))).0,
            "ok",
            "{v}"
        );
    }
    let liar = status(&format!("plugins/bin/{}", plugin_name("liar", "2.0.0")));
    assert_eq!(liar.0, "failed");
    assert!(
        liar.1
            .contains("describe says version 2.0.1 but the name says 2.0.0"),
        "{}",
        liar.1
    );
    let badsum = status(&format!("plugins/bin/{}", plugin_name("badsum", "1.0.0")));
    assert_eq!(badsum.0, "failed");
    assert!(badsum.1.contains("does not match"), "{}", badsum.1);
    assert_eq!(
        status(&format!(
            "plugins/bin/{}_SHA256SUM",
            plugin_name("badsum", "1.0.0")
        ))
        .0,
        "skipped"
    );
    assert_eq!(
        status(&format!("plugins/bin/{}", plugin_name("goodsum", "3.1.4"))).0,
        "ok"
    );
    assert_eq!(
        status("plugins/other/unmatched.rb"),
        ("skipped".into(), "not loaded (no loader)".into())
    );
    assert_eq!(status("after_load").0, "ok");
    assert_eq!(
        std::fs::read_to_string(marks.path().join("after")).unwrap(),
        "after\n",
        "after_load ran once"
    );

    // One stderr line per failure, nothing else.
    let failed: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(failed.len(), 5, "{}", run.stderr);
    assert!(
        failed
            .iter()
            .all(|l| l.starts_with("load failed: plugins/"))
    );

    // The registry: every accepted version, the highest one active.
    let plugins = home.run(&["plugins"]);
    assert_eq!(plugins.code, 0);
    let active: Vec<&str> = plugins
        .stdout
        .lines()
        .filter(|l| l.contains(" active "))
        .collect();
    assert_eq!(active.len(), 2, "{}", plugins.stdout);
    assert!(
        active
            .iter()
            .any(|l| l.starts_with("hello") && l.contains("1.0.1 ") && !l.contains("dev")),
        "{}",
        plugins.stdout
    );
    assert!(!plugins.stdout.contains("liar") && !plugins.stdout.contains("badsum"));

    // A second run loads nothing: unchanged files are never reloaded.
    let described_before = std::fs::read_to_string(marks.path().join("describe")).unwrap();
    let again = home.sync(&["--format", "json"]);
    let report: serde_json::Value = serde_json::from_str(again.stdout.trim()).unwrap();
    assert_eq!(report["loads"].as_array().unwrap().len(), 0);
    assert_eq!(
        std::fs::read_to_string(marks.path().join("ok"))
            .unwrap()
            .lines()
            .count(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(marks.path().join("describe")).unwrap(),
        described_before
    );

    // The final release goes away on the master: the registry drops it on
    // the same run and -dev becomes active.
    std::fs::remove_file(
        tree.module("production", "alpha")
            .join(format!("lib/bin/{}", plugin_name("hello", "1.0.1"))),
    )
    .unwrap();
    let gone = pluginsync_tests::wait_for(std::time::Duration::from_secs(5), || {
        let home = &home;
        async move {
            let r = home.sync(&[]);
            r.stdout.contains("removed  plugins/bin/").then_some(())
        }
    })
    .await;
    assert!(gone.is_some());
    let plugins = home.run(&["plugins"]);
    let hello: Vec<&str> = plugins
        .stdout
        .lines()
        .filter(|l| l.starts_with("hello"))
        .collect();
    assert_eq!(hello.len(), 2, "{}", plugins.stdout);
    assert!(
        hello
            .iter()
            .any(|l| l.contains("1.0.1-dev") && l.contains(" active ")),
        "{}",
        plugins.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_unless_loading_is_enabled() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let home = AgentHome::new(&pki, &[master.url()], &loaders(marks.path(), false, false));
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let l = loads(&report);
    assert_eq!(
        l["plugins/loaders/ok.rb"],
        ("skipped".into(), "not loaded (loading disabled)".into())
    );
    assert_eq!(l["plugins/other/unmatched.rb"].1, "not loaded (no loader)");
    assert!(l.values().all(|(s, _)| s == "skipped"));
    assert_eq!(
        std::fs::read_dir(marks.path()).unwrap().count(),
        0,
        "no loader, describe or after_load ran"
    );
    assert_eq!(run.stderr, "");
    assert!(!home.vardir().join("plugins.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_errors_sets_the_failure_bit() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let home = AgentHome::new(&pki, &[master.url()], &loaders(marks.path(), false, true));
    // --load enables loading for this run like [load] enabled would.
    let run = home.sync(&["--load", "--detailed-exitcodes"]);
    assert_eq!(run.code, 6, "changes and failures: {run:?}");
    assert!(run.stdout.contains("loads: "), "{}", run.stdout);
    assert!(
        home.libdir().join("loaders/ok.rb").is_file(),
        "the sync itself completed"
    );
}

/// A loader with `mount = "pluginfacts"` loads a changed external fact
/// from the factsdir; the plugins loaders never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loader_matches_a_pluginfacts_file() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file(
        "production",
        "alpha",
        "facts.d/role.sh",
        "#!/bin/sh\necho role=web\n",
        0o755,
    );
    tree.file(
        "production",
        "alpha",
        "lib/facts/role.rb",
        "# role\n",
        0o644,
    );
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let log = marks.path().join("loaded");
    let config = format!(
        r#"
[load]
enabled = true

[[loader]]
name = "facts"
mount = "pluginfacts"
match = "*.sh"
kind = "command"
command = ["sh", "-c", "echo \"facts $0\" >> {log}", "{{path}}"]

[[loader]]
name = "ruby"
match = "**/*.sh"
kind = "command"
command = ["sh", "-c", "echo \"ruby $0\" >> {log}", "{{path}}"]
"#,
        log = log.display()
    );
    let home = AgentHome::new(&pki, &[master.url()], &config);
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let l = loads(&report);
    assert_eq!(l["pluginfacts/role.sh"], ("ok".into(), String::new()));
    assert_eq!(l["plugins/facts/role.rb"].1, "not loaded (no loader)");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("facts {}\n", home.factsdir().join("role.sh").display())
    );
}

/// The agent is SIGKILLed after its commit, while its first load runs: the
/// loader and the loader's own child die with it; the next run loads the
/// files that run committed, once; the run after that loads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_survive_an_agent_killed_after_its_commit() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    for f in ["a.rb", "b.rb"] {
        tree.file(
            "production",
            "alpha",
            &format!("lib/loaders/{f}"),
            format!("# {f}\n"),
            0o644,
        );
    }
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let m = |f: &str| marks.path().join(f).display().to_string();
    // While `block` exists the loader hangs, noting its pid and its child's.
    let config = format!(
        r#"
[load]
enabled = true

[[loader]]
name = "blocking"
match = "loaders/*.rb"
kind = "command"
command = ["sh", "-c", "if [ -e {block} ]; then sleep 300 & echo $! > {child}; echo $$ > {pid}; wait; fi; echo \"$0\" >> {loaded}", "{{relpath}}"]
timeout = "200s"
"#,
        block = m("block"),
        child = m("child"),
        pid = m("pid"),
        loaded = m("loaded"),
    );
    std::fs::write(marks.path().join("block"), "").unwrap();
    let home = AgentHome::new(&pki, &[master.url()], &config);
    let mut agent = std::process::Command::new(pluginsync_tests::bin_path("pluginsync-agent"))
        .args(["sync", "--config"])
        .arg(home.path().join("agent.toml"))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !marks.path().join("pid").exists() || !marks.path().join("child").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the loader never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    agent.kill().unwrap(); // SIGKILL
    agent.wait().unwrap();
    let (pid, child) = (
        std::fs::read_to_string(marks.path().join("pid")).unwrap(),
        std::fs::read_to_string(marks.path().join("child")).unwrap(),
    );
    let gone = pluginsync_tests::wait_for(std::time::Duration::from_secs(5), || {
        let (pid, child) = (pid.clone(), child.clone());
        async move { (dead(&pid) && dead(&child)).then_some(()) }
    })
    .await;
    assert!(
        gone.is_some(),
        "loader {pid} and its child {child} outlived the killed agent"
    );
    assert!(home.libdir().join("loaders/b.rb").is_file(), "committed");
    assert!(!marks.path().join("loaded").exists(), "nothing loaded yet");

    std::fs::remove_file(marks.path().join("block")).unwrap();
    let next = home.sync(&["--format", "json"]);
    assert_eq!(next.code, 0, "{next:?}");
    let report: serde_json::Value = serde_json::from_str(next.stdout.trim()).unwrap();
    assert_eq!(
        report["changes"].as_array().unwrap().len(),
        0,
        "nothing new"
    );
    let l = loads(&report);
    assert_eq!(l.len(), 2, "{l:#?}");
    assert!(l.values().all(|(s, _)| s == "ok"), "{l:#?}");
    assert_eq!(
        std::fs::read_to_string(marks.path().join("loaded")).unwrap(),
        "loaders/a.rb\nloaders/b.rb\n",
        "each committed file loaded once"
    );
    assert!(!home.vardir().join("pending_loads.json").exists());

    let after = home.sync(&["--format", "json"]);
    let report: serde_json::Value = serde_json::from_str(after.stdout.trim()).unwrap();
    assert_eq!(report["loads"].as_array().unwrap().len(), 0);
    assert_eq!(
        std::fs::read_to_string(marks.path().join("loaded"))
            .unwrap()
            .lines()
            .count(),
        2
    );
}

/// Loader placeholders are substituted in one pass (a file
/// named `x{environment}.rb` is loaded as itself, not as `xproduction.rb`);
/// a `{relpath}` beginning with `-` reaches the loader as `./-…`, so `cat`
/// reads it instead of refusing an unknown option (the loader runs in the
/// libdir); and a loader's environment is cleared but for the allowlist,
/// the agent's `PLUGINSYNC_*` and the loader's `env`: a secret in the
/// agent's environment does not reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loader_arguments_and_environment_are_what_the_loader_asked_for() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file(
        "production",
        "alpha",
        "lib/braces/x{environment}.rb",
        "# braces\n",
        0o644,
    );
    tree.file(
        "production",
        "alpha",
        "lib/-dash.rb",
        "dash content\n",
        0o644,
    );
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let marks = tempfile::tempdir().unwrap();
    let (args, cat, env) = (
        marks.path().join("args"),
        marks.path().join("cat"),
        marks.path().join("env"),
    );
    let config = format!(
        r#"
[load]
enabled = true

[[loader]]
name = "braces"
match = "braces/*"
kind = "command"
command = ["sh", "-c", "printf '%s|%s\n' \"$0\" \"$1\" >> {args}; env >> {env}", "{{relpath}}", "{{path}}"]
env = {{ LOADER_OWN = "yes" }}

[[loader]]
name = "dash"
match = "-*"
kind = "command"
command = ["sh", "-c", "cat \"$0\" >> {cat}", "{{relpath}}"]
"#,
        args = args.display(),
        env = env.display(),
        cat = cat.display()
    );
    let home = AgentHome::new(&pki, &[master.url()], &config);
    let run = std::process::Command::new(bin_path("pluginsync-agent"))
        .args(["sync", "--format", "json", "--config"])
        .arg(home.path().join("agent.toml"))
        .env("AGENT_SECRET", "hunter2")
        .env("LC_MESSAGES", "C")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let l = loads(&report);
    assert_eq!(
        l["plugins/braces/x{environment}.rb"],
        ("ok".into(), String::new())
    );
    assert_eq!(
        l["plugins/-dash.rb"],
        ("ok".into(), String::new()),
        "{l:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(&args).unwrap(),
        format!(
            "braces/x{{environment}}.rb|{}\n",
            home.libdir().join("braces/x{environment}.rb").display()
        ),
        "one pass: the file's own braces are not placeholders"
    );
    assert_eq!(std::fs::read_to_string(&cat).unwrap(), "dash content\n");
    let env = std::fs::read_to_string(&env).unwrap();
    let vars: std::collections::BTreeMap<&str, &str> =
        env.lines().filter_map(|l| l.split_once('=')).collect();
    assert!(!vars.contains_key("AGENT_SECRET"), "{env}");
    assert_eq!(vars.get("LC_MESSAGES"), Some(&"C"), "{env}");
    assert!(vars.contains_key("PATH"), "{env}");
    assert_eq!(vars.get("LOADER_OWN"), Some(&"yes"), "{env}");
    assert_eq!(vars.get("PLUGINSYNC_ENVIRONMENT"), Some(&"production"));
    assert_eq!(vars.get("PLUGINSYNC_MOUNT"), Some(&"plugins"));
    assert_eq!(
        vars.get("PLUGINSYNC_RELPATH"),
        Some(&"braces/x{environment}.rb")
    );
    for v in vars.keys() {
        assert!(
            [
                "PATH",
                "LANG",
                "LANGUAGE",
                "TZ",
                "LOADER_OWN",
                "PWD",
                "SHLVL",
                "_"
            ]
            .contains(v)
                || v.starts_with("LC_")
                || v.starts_with("PLUGINSYNC_"),
            "'{v}' reached the loader: {env}"
        );
    }
}

/// A loader that puts `{path}` inside a `sh -c` script makes a module's
/// file names shell code run as root: accepted with `allow_shell_relpath
/// = true`, the run says so, one warning per such loader
/// (docs/loading.md#never-put-path-in-a-shell-script); the form that
/// passes the name as an argument after the script is quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_name_inside_a_shell_script_is_warned_about() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    for f in ["inline/a.rb", "argument/b.rb"] {
        tree.file("production", "alpha", &format!("lib/{f}"), "# x\n", 0o644);
    }
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let config = r#"
[load]
enabled = true

[[loader]]
name = "inline"
match = "inline/*.rb"
kind = "command"
command = ["sh", "-c", "test -f {path}"]
allow_shell_relpath = true

[[loader]]
name = "argument"
match = "argument/*.rb"
kind = "command"
command = ["sh", "-c", "test -f \"$0\"", "{path}"]
"#;
    let home = AgentHome::new(&pki, &[master.url()], config);
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let warned: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("inside a shell script"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", run.stderr);
    assert!(
        warned[0].contains("inline") && warned[0].contains("{path}"),
        "{}",
        warned[0]
    );
    // `pluginsync-agent config`, where an operator checks a config, says
    // it too, for that loader alone.
    let shown = home.run(&["config"]);
    assert_eq!(shown.code, 0, "{shown:?}");
    let warned: Vec<&str> = shown
        .stderr
        .lines()
        .filter(|l| l.contains("inside a shell script"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", shown.stderr);
    assert!(warned[0].contains("'inline'"), "{}", warned[0]);
}

/// A-11, the adversarial script that found it: a loader `["sh", "-c",
/// "… {relpath} …"]` and a module file named `$(touch PWNED_BY_NAME).rb`.
/// The loader is refused when the configuration is read (78, one line
/// naming it and the safe form, docs/loading.md#never-put-path-in-a-shell-script):
/// by `sync` before anything is fetched or run, and by `config`; the name
/// never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_name_inside_a_shell_script_is_refused_when_the_config_is_read() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let name = "lib/x/$(touch PWNED_BY_NAME).rb";
    tree.file("production", "alpha", name, "# x\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let cwd = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[load]
enabled = true

[[loader]]
name = "ruby check"
match = "x/*.rb"
kind = "command"
command = ["sh", "-c", "cd {} && echo {{relpath}} > /dev/null"]
"#,
        cwd.path().display()
    );
    let home = AgentHome::new(&pki, &[master.url()], &config);
    for run in [home.sync(&[]), home.run(&["config"])] {
        assert_eq!(run.code, 78, "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(
            run.stderr
                .contains("[[loader]] 1 'ruby check' puts {relpath} inside a shell script")
                && run
                    .stderr
                    .contains(r#"["sh", "-c", "ruby -c \"$1\"", "sh", "{relpath}"]"#)
                && run.stderr.contains("allow_shell_relpath = true"),
            "{}",
            run.stderr
        );
    }
    assert!(!cwd.path().join("PWNED_BY_NAME").exists());
    assert!(!home.libdir().join("x").exists(), "nothing was synced");
}
