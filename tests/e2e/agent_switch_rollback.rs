//! `pluginsync-agent rollback` per generation
//! (docs/agent.md#generations-and-rollback), with the real agent binary
//! against a real master, stopped before each rollback:
//!
//! - after G1 (a bad fact), G2 (the fact fixed) and G3 (only plugins
//!   changed), both destinations are G2 byte for byte and mode for mode,
//!   the facts' live tree untouched (G3 did not change it), and the
//!   report and the node's history name G2;
//! - when no tree kept beside a destination holds the previous
//!   generation's mount, the rollback is refused in one line naming it,
//!   and nothing changes;
//! - a rollback killed between its two destinations' exchanges is
//!   finished by the next run: both destinations on the one generation.
//!
//! Each generation is an environment of one tree, as in `agent_switch`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, config_toml, merged_mount, parse_config, tree_snapshot,
};

/// `g1`: a fact that fails; `g2`: fixed (and its mode changed); `g3`:
/// `g2` with only plugins changed.
fn three_generations() -> EnvTree {
    let t = EnvTree::new();
    for env in ["g1", "g2", "g3"] {
        let (fact, mode) = match env {
            "g1" => ("#!/bin/sh\nexit 3\n", 0o644),
            _ => ("#!/bin/sh\necho bad=fixed\n", 0o755),
        };
        t.file(env, "m", "facts.d/bad.sh", fact, mode);
        t.file(env, "m", "facts.d/ok.txt", "ok=1\n", 0o644);
        let plugin = if env == "g3" { "# v3\n" } else { "# v1\n" };
        t.file(env, "m", "lib/facter/x.rb", plugin, 0o644);
        t.file(env, "m", "lib/puppet/kept.rb", "# kept\n", 0o644);
        if env == "g3" {
            t.file(env, "m", "lib/puppet/new.rb", "# new\n", 0o644);
        }
    }
    t
}

/// Both destinations.
fn synced(home: &AgentHome) -> [BTreeMap<String, String>; 2] {
    [
        tree_snapshot(&home.libdir()),
        tree_snapshot(&home.factsdir()),
    ]
}

/// Both mounts of environment `env`: the master's tree.
fn mounts(t: &EnvTree, env: &str) -> [BTreeMap<String, String>; 2] {
    let dir = t.envpath().join(env);
    [merged_mount(&dir, "lib"), merged_mount(&dir, "facts.d")]
}

/// The last report, as JSON.
fn last_report(home: &AgentHome) -> serde_json::Value {
    let text = std::fs::read_to_string(home.vardir().join("last_run_report.json")).unwrap();
    serde_json::from_str(&text).expect(&text)
}

/// Syncs each of `envs` in turn; returns each one's generation.
fn sync_each(home: &AgentHome, t: &EnvTree, envs: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for env in envs {
        let run = home.sync(&["--environment", env]);
        assert_eq!(run.code, 0, "{env}: {run:?}");
        assert_eq!(synced(home), mounts(t, env), "{env}");
        let report = last_report(home);
        ids.push(
            report["generation"]
                .as_str()
                .expect("a generation")
                .to_owned(),
        );
    }
    ids
}

/// The node's history: the generations made live, the current one last.
fn history(home: &AgentHome) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(home.vardir().join("history.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect(&text);
    v["live"].as_array().unwrap().clone()
}

/// A node that synced g1, g2 and g3 from a master now stopped.
fn node_after_three() -> (EnvTree, AgentHome, Vec<String>) {
    let pki = Pki::new();
    let t = three_generations();
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], "");
    let ids = sync_each(&home, &t, &["g1", "g2", "g3"]);
    drop(master);
    (t, home, ids)
}

#[test]
fn rollback_brings_back_the_previous_generation_whole_in_both_destinations() {
    let (t, home, ids) = node_after_three();
    assert_ne!(ids[1], ids[2]);
    let facts_inode = std::fs::metadata(home.factsdir()).unwrap().ino();
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), mounts(&t, "g2"), "not G2 whole");
    assert_ne!(synced(&home)[1], mounts(&t, "g1")[1], "G1's bad fact back");
    // G3 left the facts alone: their live tree stays, not exchanged.
    assert_eq!(
        std::fs::metadata(home.factsdir()).unwrap().ino(),
        facts_inode
    );
    for line in [
        "updated  plugins/facter/x.rb",
        "removed  plugins/puppet/new.rb",
    ] {
        assert!(run.stdout.contains(line), "{line}: {run:?}");
    }
    assert!(!run.stdout.contains("pluginfacts/"), "{run:?}");
    let report = last_report(&home);
    assert_eq!(report["generation"], ids[1].as_str(), "{report}");
    assert_eq!(report["environment"], "g2", "{report}");
    assert_eq!(report["rolled_back"], true, "{report}");
    let last = history(&home).last().cloned().unwrap();
    assert_eq!(last["generation"], ids[1].as_str());
    let record = home.vardir().join("cache/generation.g2.json");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    assert_eq!(record["generation"], ids[1].as_str(), "{record}");
    // A second rollback goes forward again: G3 whole.
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), mounts(&t, "g3"));
    assert_eq!(last_report(&home)["generation"], ids[2].as_str());
}

#[test]
fn rollback_without_the_previous_generations_content_refuses_and_changes_nothing() {
    let (_t, home, _ids) = node_after_three();
    // G2's plugins were kept beside the libdir; a hand (or a run) changed
    // them since.
    let kept = home.path().join(".lib.pluginsync");
    for entry in std::fs::read_dir(&kept).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("prev.") && !name.ends_with(".state") {
            std::fs::write(p.join("facter/x.rb"), "# changed by hand\n").unwrap();
        }
    }
    let containers = |home: &AgentHome| {
        [".lib.pluginsync", ".facts.d.pluginsync"].map(|c| tree_snapshot(&home.path().join(c)))
    };
    let (before, kept_before, history_before) = (synced(&home), containers(&home), history(&home));
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    let lib = home.libdir().display().to_string();
    assert!(
        run.stderr
            .contains(&format!("no tree of '{lib}' holds its plugins"))
            && run.stderr.contains("nothing was changed"),
        "{run:?}"
    );
    assert_eq!(synced(&home), before);
    assert_eq!(containers(&home), kept_before);
    assert_eq!(history(&home), history_before);
    assert!(!home.vardir().join("rollback.json").exists());
}

#[test]
fn a_rollback_killed_between_two_exchanges_is_finished_by_the_next_run() {
    let pki = Pki::new();
    let t = three_generations();
    let master = TestMaster::start(parse_config(&config_toml(&t.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], "");
    // G1 → G3 changes both mounts: the rollback exchanges both.
    let ids = sync_each(&home, &t, &["g1", "g3"]);
    drop(master);
    let hook = [("PLUGINSYNC_TEST_ROLLBACK_PAUSE", "1")];
    let mut agent = home.spawn_env(&["rollback"], &hook, "pluginsync_agent=info");
    assert!(
        agent.stderr_until("the rollback pauses between two exchanges"),
        "{:?}",
        agent.lines
    );
    agent.signal(rustix::process::Signal::KILL);
    let _ = agent.finish();
    // Cut between the two: the facts (first) are G1's, the plugins G3's.
    let (g1, g3) = (mounts(&t, "g1"), mounts(&t, "g3"));
    assert_eq!(synced(&home), [g3[0].clone(), g1[1].clone()], "not cut");
    // The next run finishes it: G1 whole, named.
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), g1);
    assert_eq!(last_report(&home)["generation"], ids[0].as_str());
    assert!(!home.vardir().join("rollback.json").exists());
    // And the one after goes forward again, whole.
    let run = home.run(&["rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(synced(&home), g3);
}
