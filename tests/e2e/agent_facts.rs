//! Fact health (docs/loading.md#fact-health) with the real Facter: a
//! generation adding the four bad facts a Puppet fleet breaks on (a
//! facts.d script exiting 3, one printing control bytes and no `=`, one
//! sleeping 20 s, a `lib/facter/*.rb` raising in `setcode`) beside good
//! ones. Each bad file is a load failure naming it, loader `facter`; the
//! good ones pass; the run's wall time stays within one deadline (not
//! 20 s and more), the hanging script is killed, the failures reach the
//! node report's state, and `pluginsync-agent config` shows `[facts]`.
//! A file whose check failed is checked again on the next run, unchanged,
//! until a check passes; a passing unchanged file is not re-run. The
//! Forty changed facts cost one Facter run when all are good, and a run
//! per file, never more at once than the node's cores, when one is not.
//! The `pluginsync` fact (docs/agent.md#the-pluginsync-fact) names the
//! generation the master's inventory reports, is rewritten only when it
//! changes, and Facter reads it.
//! Skipped with a message where `facter` is not installed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, client, config_toml, parse_config, repo_root, require,
};

const TEST: &str = "agent_facts";

/// Each fact file's deadline: the default (`[facts] timeout`).
const DEADLINE: Duration = Duration::from_secs(10);

/// The tree: the four bad facts, a good custom fact and a good external
/// one, and a plugin that is no fact; `sleep.sh` writes its pid to `pid`.
fn tree(pid: &std::path::Path) -> EnvTree {
    let t = EnvTree::new();
    let put = |rel: &str, text: String, mode: u32| t.file("production", "alpha", rel, text, mode);
    put(
        "lib/facter/raises.rb",
        "Facter.add(:raises) { setcode { raise 'boom in setcode' } }\n".into(),
        0o644,
    );
    put(
        "lib/facter/good.rb",
        "Facter.add(:good_custom) { setcode { 'yes' } }\n".into(),
        0o644,
    );
    put("lib/puppet/functions/f.rb", "# not a fact\n".into(), 0o644);
    put(
        "facts.d/exit3.sh",
        "#!/bin/sh\necho exit3=1\nexit 3\n".into(),
        0o755,
    );
    put(
        "facts.d/garbage.sh",
        "#!/bin/sh\nprintf '\\001\\002\\033garbage\\n'\n".into(),
        0o755,
    );
    put(
        "facts.d/sleep.sh",
        format!("#!/bin/sh\necho $$ > {}\nexec sleep 20\n", pid.display()),
        0o755,
    );
    put("facts.d/good.txt", "good_external=1\n".into(), 0o644);
    t
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

#[test]
fn each_changed_fact_is_resolved_by_facter_within_its_own_deadline() {
    if require("facter", "facter", TEST).is_none() {
        return;
    }
    let marks = tempfile::tempdir().unwrap();
    let pid = marks.path().join("pid");
    let (tree, pki) = (tree(&pid), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    // `[facts]` empty: every default, so on because Facter is on PATH.
    let home = AgentHome::new(&pki, &[master.url()], "[facts]");

    let started = Instant::now();
    let run = home.sync(&["--format", "json", "-v"]);
    let took = started.elapsed();
    assert_eq!(run.code, 0, "fact failures do not fail the sync: {run:?}");
    assert!(
        took < DEADLINE + Duration::from_secs(6),
        "the run took {took:?}: not bounded by one deadline ({DEADLINE:?})"
    );
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let loads: BTreeMap<String, serde_json::Value> = report["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["path"].as_str().unwrap().to_owned(), l.clone()))
        .collect();
    let names: Vec<&str> = loads.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "pluginfacts/exit3.sh",
            "pluginfacts/garbage.sh",
            "pluginfacts/good.txt",
            "pluginfacts/sleep.sh",
            "plugins/facter/good.rb",
            "plugins/facter/raises.rb",
        ],
        "one entry per fact file, none for other plugins: {loads:#?}"
    );
    let failed = |path: &str, says: &str| {
        let l = &loads[path];
        assert_eq!(l["status"], "failed", "{path}: {l}");
        assert_eq!(l["loader"], "facter", "{path}: {l}");
        let error = l["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(says),
            "{path}: {error:?} does not say {says:?}: {loads:#?}\n{run:?}"
        );
    };
    failed("pluginfacts/exit3.sh", "exited with status 3");
    failed("pluginfacts/garbage.sh", "unparsable output");
    failed("pluginfacts/sleep.sh", "timed out after");
    failed("plugins/facter/raises.rb", "boom in setcode");
    for good in ["pluginfacts/good.txt", "plugins/facter/good.rb"] {
        let l = &loads[good];
        assert_eq!(l["status"], "ok", "{good}: {l}");
        assert!(
            l["duration_ms"]
                .as_u64()
                .is_some_and(|ms| ms < DEADLINE.as_millis() as u64),
            "{good}: its load time is reported: {l}"
        );
    }
    // The hanging script was killed at the deadline, not left running.
    let pid = std::fs::read_to_string(&pid).expect("sleep.sh ran");
    assert!(dead(&pid), "sleep.sh (pid {pid}) outlived its deadline");
    // The failures are what the next per-node request reports.
    let state = std::fs::read_to_string(home.vardir().join("loads.production.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["loads_ok"], 2, "{state}");
    assert_eq!(state["failed"].as_array().map(Vec::len), Some(4), "{state}");

    // An unchanged tree checks again only what still fails, and those
    // fail again; the passing files are not re-run.
    let again = home.sync(&["--format", "json"]);
    let report: serde_json::Value = serde_json::from_str(again.stdout.trim()).unwrap();
    let retried: Vec<(&str, &str)> = (report["loads"].as_array().unwrap().iter())
        .map(|l| (l["path"].as_str().unwrap(), l["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        retried,
        [
            ("pluginfacts/exit3.sh", "failed"),
            ("pluginfacts/garbage.sh", "failed"),
            ("pluginfacts/sleep.sh", "failed"),
            ("plugins/facter/raises.rb", "failed"),
        ],
        "{again:?}"
    );

    let config = home.run(&["config"]);
    assert!(
        config.stdout.contains("facts.check = true (Facter found)")
            && config.stdout.contains("facts.timeout = 10s  (agent.toml)"),
        "{config:?}"
    );
}

#[test]
fn a_failed_fact_check_is_retried_until_it_passes() {
    if require("facter", "facter", TEST).is_none() {
        return;
    }
    // `flaky.sh` fails until `ready` exists (a check past its deadline
    // under load, say); `counted.sh` passes and counts its runs.
    let marks = tempfile::tempdir().unwrap();
    let (ready, count) = (marks.path().join("ready"), marks.path().join("count"));
    let tree = EnvTree::new();
    let put = |rel: &str, text: String| tree.file("production", "alpha", rel, text, 0o755);
    put(
        "facts.d/flaky.sh",
        format!(
            "#!/bin/sh\n[ -e {} ] || exit 3\necho flaky=1\n",
            ready.display()
        ),
    );
    put(
        "facts.d/counted.sh",
        format!(
            "#!/bin/sh\necho run >> {}\necho counted=1\n",
            count.display()
        ),
    );
    let pki = Pki::new();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], "[facts]");
    let state = || {
        let text = std::fs::read_to_string(home.vardir().join("loads.production.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["failed"].clone()
    };
    let loads = |run: &pluginsync_tests::AgentRun| -> Vec<(String, String)> {
        let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
        (report["loads"].as_array().unwrap().iter())
            .map(|l| {
                (
                    l["path"].as_str().unwrap().into(),
                    l["status"].as_str().unwrap().into(),
                )
            })
            .collect()
    };

    let first = home.sync(&["--format", "json"]);
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(state(), serde_json::json!(["pluginfacts/flaky.sh"]));
    let counted = std::fs::read_to_string(&count).unwrap();
    assert!(!counted.is_empty(), "counted.sh was checked");

    // Nothing changed in the tree: flaky.sh is checked again, and passes.
    std::fs::write(&ready, "").unwrap();
    let second = home.sync(&["--format", "json"]);
    assert_eq!(
        loads(&second),
        [("pluginfacts/flaky.sh".to_owned(), "ok".to_owned())],
        "{second:?}"
    );
    assert_eq!(state(), serde_json::json!([]), "the failure is cleared");
    assert_eq!(
        std::fs::read_to_string(&count).unwrap(),
        counted,
        "the passing unchanged counted.sh was run again"
    );

    // Passing now, nothing is checked.
    let third = home.sync(&["--format", "json"]);
    assert!(loads(&third).is_empty(), "{third:?}");
}

/// A Facter that logs each start and end (with the time, in ns) to `log`
/// around the real one, so a test sees how many ran and how many at once.
fn logging_facter(dir: &std::path::Path, log: &std::path::Path) -> std::path::PathBuf {
    let real = require("facter", "facter", TEST).expect("facter");
    let path = dir.join("facter");
    let script = format!(
        "#!/bin/sh
echo \"start $(date +%s%N)\" >> {log}
{real} \"$@\"
rc=$?
         echo \"end $(date +%s%N)\" >> {log}
exit $rc
",
        log = log.display(),
        real = real.display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// From a [`logging_facter`] log: how many Facter runs, and the most at once.
fn runs_and_most_at_once(log: &std::path::Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut events: Vec<(u128, i32)> = (text.lines())
        .filter_map(|l| {
            let (kind, t) = l.split_once(' ')?;
            Some((t.parse().ok()?, if kind == "start" { 1 } else { -1 }))
        })
        .collect();
    events.sort();
    let (mut open, mut most) = (0, 0);
    for (_, d) in &events {
        open += d;
        most = most.max(open);
    }
    let starts = events.iter().filter(|(_, d)| *d == 1).count();
    (starts, most as usize)
}

/// Forty changed facts: one Facter run when all are good; with one
/// raising, a run per file finds it, never more Facter processes at once
/// than the node's cores (2 to 8).
#[test]
fn many_changed_facts_cost_one_facter_run_and_a_bounded_search() {
    if require("facter", "facter", TEST).is_none() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    for broken in [false, true] {
        let tree = EnvTree::new();
        for i in 0..40 {
            let body = match broken && i == 7 {
                true => "raise 'fact seven is broken'".to_owned(),
                false => format!("'v{i}'"),
            };
            let text = format!("Facter.add(:many_{i}) {{ setcode {{ {body} }} }}\n");
            tree.file(
                "production",
                "alpha",
                &format!("lib/facter/many_{i}.rb"),
                text,
                0o644,
            );
        }
        tree.file(
            "production",
            "alpha",
            "facts.d/plain.txt",
            "plain=1\n",
            0o644,
        );
        let pki = Pki::new();
        let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
        let marks = tempfile::tempdir().unwrap();
        let log = marks.path().join("log");
        let facter = logging_facter(marks.path(), &log);
        let home = AgentHome::new(
            &pki,
            &[master.url()],
            &format!("[facts]\nfacter = {:?}\n", facter.display().to_string()),
        );
        let run = home.sync(&["--format", "json"]);
        assert_eq!(run.code, 0, "{run:?}");
        let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
        let loads = report["loads"].as_array().unwrap();
        let failed: Vec<&str> = (loads.iter())
            .filter(|l| l["status"] != "ok")
            .map(|l| l["path"].as_str().unwrap())
            .collect();
        assert_eq!(loads.len(), 41, "{loads:?}");
        let (runs, most) = runs_and_most_at_once(&log);
        if broken {
            assert_eq!(failed, ["plugins/facter/many_7.rb"], "{loads:?}");
            assert_eq!(runs, 1 + 41, "together, then each file alone");
            assert!(most <= cores, "{most} Facter runs at once, {cores} cores");
        } else {
            assert!(failed.is_empty(), "{loads:?}");
            assert_eq!(runs, 1, "a clean change is one Facter run");
        }
    }
}

/// `node1`'s generation in the master's inventory (asked as the admin
/// `node2`).
fn inventory_generation(pki: &Pki, master: &TestMaster) -> Option<String> {
    let url = format!("{}/pluginsync/v1/inventory", master.url());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let page: serde_json::Value = rt.block_on(async {
        let resp = client(pki, Some("node2")).get(url).send().await.unwrap();
        resp.json().await.unwrap()
    });
    (page["nodes"].as_array().unwrap().iter())
        .find(|n| n["certname"] == "node1")
        .and_then(|n| n["generation"].as_str().map(str::to_owned))
}

#[test]
fn the_pluginsync_fact_names_the_generation_the_inventory_reports() {
    if require("facter", "facter", TEST).is_none() {
        return;
    }
    let tree = EnvTree::new();
    let put = |rel: &str, text: &str, mode| tree.file("production", "alpha", rel, text, mode);
    put("lib/puppet/functions/f.rb", "# one\n", 0o644);
    put("facts.d/bad.sh", "#!/bin/sh\nexit 3\n", 0o755);
    let pki = Pki::new();
    let admin = "[admin]\ncertnames = [\"node2\"]\n";
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", admin)));
    let facts = tempfile::tempdir().unwrap();
    // Missing, and its parent too: made (0755).
    let dir = facts.path().join("facter/facts.d");
    let home = AgentHome::new(
        &pki,
        &[master.url()],
        &format!("[facts]\nexternal_dir = {:?}\n", dir.display().to_string()),
    );
    let file = dir.join("pluginsync.json");
    let read = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&file).expect("the pluginsync fact")).unwrap()
    };
    let sync = || -> serde_json::Value {
        let run = home.sync(&["--format", "json"]);
        assert_eq!(run.code, 0, "{run:?}");
        serde_json::from_str(run.stdout.trim()).unwrap()
    };

    let report = sync();
    let g1 = report["generation"]
        .as_str()
        .expect("a generation")
        .to_owned();
    assert_eq!(
        inventory_generation(&pki, &master).as_deref(),
        Some(g1.as_str())
    );
    let fact = read();
    let entry = &fact["pluginsync"]["production"];
    assert_eq!(entry["generation"], g1.as_str(), "{fact}");
    assert_eq!(
        entry["failing"],
        serde_json::json!(["pluginfacts/bad.sh"]),
        "{fact}"
    );
    assert!(
        entry["committed"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{fact}"
    );
    let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["committed", "failing", "generation"],
        "nothing else: {fact}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&file), mode(&dir)), (0o644, 0o755));

    // Facter reads it as a structured fact.
    let out = std::process::Command::new("facter")
        .arg("--external-dir")
        .arg(&dir)
        .args(["pluginsync", "--json"])
        .output()
        .unwrap();
    let resolved: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(resolved, fact, "facter --external-dir reads the fact");

    // A run that changes nothing rewrites nothing.
    let mtime = || std::fs::metadata(&file).unwrap().modified().unwrap();
    let before = mtime();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(sync()["generation"], g1.as_str());
    assert_eq!(mtime(), before, "a no-op run rewrote the fact");

    // A new generation: the fact follows, its failure gone with its file.
    std::fs::remove_file(
        tree.envpath()
            .join("production/modules/alpha/facts.d/bad.sh"),
    )
    .unwrap();
    put("lib/puppet/functions/g.rb", "# two\n", 0o644);
    let end = Instant::now() + Duration::from_secs(60);
    let g2 = loop {
        let r = sync();
        if r["generation"] != g1.as_str() {
            break r["generation"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < end, "no new generation: {r}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let fact = read();
    assert_eq!(
        fact["pluginsync"]["production"]["generation"],
        g2.as_str(),
        "{fact}"
    );
    assert_eq!(
        fact["pluginsync"]["production"]["failing"],
        serde_json::json!([]),
        "{fact}"
    );
    assert_ne!(mtime(), before);
    assert_eq!(
        inventory_generation(&pki, &master).as_deref(),
        Some(g2.as_str())
    );

    let config = home.run(&["config"]);
    assert!(
        config.stdout.contains(&format!(
            "facts.external_dir = {}  (agent.toml)",
            dir.display()
        )),
        "{config:?}"
    );
    // The shipped unit may write both layouts' directories.
    let unit =
        std::fs::read_to_string(repo_root().join("packaging/pluginsync-agent.service")).unwrap();
    let writable = crate::agent_metrics::unit_writable_paths(&unit);
    for d in ["/etc/facter/facts.d", "/etc/puppetlabs/facter/facts.d"] {
        assert!(
            writable.iter().any(|w| w == std::path::Path::new(d)),
            "{d}: {writable:?}"
        );
    }
}

#[test]
fn the_pluginsync_fact_is_off_without_the_systems_puppet_and_with_false() {
    let tree = EnvTree::new();
    tree.file("production", "alpha", "lib/x.rb", "x\n", 0o644);
    let pki = Pki::new();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    for extra in [
        "[facts]\ncheck = false",
        "[facts]\ncheck = false\nexternal_dir = false",
    ] {
        let home = AgentHome::new(&pki, &[master.url()], extra);
        let config = home.run(&["config"]);
        assert!(
            config
                .stdout
                .lines()
                .any(|l| l.starts_with("facts.external_dir = ") && !l.contains('/')),
            "{extra}: {config:?}"
        );
        assert_eq!(home.sync(&[]).code, 0);
    }
}
