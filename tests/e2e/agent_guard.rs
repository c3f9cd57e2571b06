//! The agent's removal guard (docs/agent.md#the-removal-guard): a master whose
//! environment lost most of its files must not wipe a node. The run refuses
//! with one line naming the count, the limit and the modules the files
//! came from, changes nothing and exits 1;
//! `--allow-mass-removal` proceeds.

use std::time::Duration;

use pluginsync_tests::{
    AgentHome, EnvTree, Pki, TestMaster, config_toml, merged_mount, parse_config, tree_snapshot,
};

/// 18 of 20 files gone on the master (90 %).
#[test]
fn a_master_that_lost_most_files_cannot_wipe_the_node() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let files: Vec<_> = (0..20)
        .map(|i| {
            tree.file(
                "production",
                "app",
                &format!("lib/facter/f{i:02}.rb"),
                format!("# fact {i}\n"),
                0o644,
            )
        })
        .collect();
    let m = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    // The line names modules from the last listing: Puppet's listings
    // (a generation's manifest names no module, docs/agent.md#the-removal-guard).
    let home = AgentHome::new(&pki, &[m.url()], "generations = false");
    assert_eq!(home.sync(&[]).code, 0);
    let env = tree.envpath().join("production");
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env, "lib"));
    let synced = tree_snapshot(&home.libdir());

    for f in &files[2..] {
        std::fs::remove_file(f).unwrap();
    }
    // Bounded wait until the master serves the loss (the agent's --noop
    // plan shows the removals), so the refusal below is the guard's.
    let seen = (0..600).any(|_| {
        let noop = home.sync(&["--noop", "--format", "json"]);
        let removing = noop.stdout.matches("\"removed\"").count();
        removing == 18 || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(seen, "the master never served the shrunken environment");

    let run = home.sync(&[]);
    assert_eq!(run.code, 1, "{run:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {run:?}");
    assert!(
        lines[0].ends_with(
            "refusing to remove 18 of 20 files in plugins (more than max_removal_percent = 50), from module app; --allow-mass-removal to proceed"
        ),
        "{run:?}"
    );
    assert_eq!(tree_snapshot(&home.libdir()), synced, "nothing changed");

    let run = home.sync(&["--allow-mass-removal"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env, "lib"));
    assert_eq!(
        merged_mount(&env, "lib").len(),
        3,
        "facter/, f00.rb, f01.rb"
    );
}

/// The limit is the agent's `max_removal_percent`; a destination with
/// fewer than 10 files is never guarded.
#[test]
fn the_limit_is_configurable_and_small_destinations_are_not_guarded() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let mut files = Vec::new();
    for (env, n) in [("production", 12), ("tiny", 5)] {
        for i in 0..n {
            files.push(tree.file(
                env,
                "app",
                &format!("lib/facter/f{i:02}.rb"),
                format!("# {env} fact {i}\n"),
                0o644,
            ));
        }
    }
    let m = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    // 6 of 12 files gone is 50 %: allowed at the default, refused at 40.
    let strict = AgentHome::new(&pki, &[m.url()], "max_removal_percent = 40");
    let default = AgentHome::new(&pki, &[m.url()], "");
    // All 5 of 5 gone: below the floor, allowed even at 0.
    let tiny = AgentHome::new(
        &pki,
        &[m.url()],
        "environment = \"tiny\"\nmax_removal_percent = 0",
    );
    for home in [&strict, &default, &tiny] {
        assert_eq!(home.sync(&[]).code, 0);
    }
    for f in files[6..12].iter().chain(&files[12..]) {
        std::fs::remove_file(f).unwrap();
    }
    for (home, n) in [(&default, 6), (&tiny, 5)] {
        let seen = (0..600).any(|_| {
            let noop = home.sync(&["--noop", "--format", "json"]);
            noop.stdout.matches("\"removed\"").count() == n || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        assert!(seen, "the master never served the shrunken environment");
    }
    let refused = strict.sync(&[]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("refusing to remove 6 of 12 files in plugins"),
        "{refused:?}"
    );
    assert_eq!(default.sync(&[]).code, 0);
    let prod = tree.envpath().join("production");
    assert_eq!(tree_snapshot(&default.libdir()), merged_mount(&prod, "lib"));
    assert_eq!(tiny.sync(&[]).code, 0);
    let tiny_env = tree.envpath().join("tiny");
    assert_eq!(
        tree_snapshot(&tiny.libdir()),
        merged_mount(&tiny_env, "lib")
    );
}
