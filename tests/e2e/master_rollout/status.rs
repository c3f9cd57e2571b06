//! `pluginsync-master rollout status` in text (docs/rollouts.md#commands):
//! each kept generation says what it is to the fleet. The one everyone
//! else runs is the base, not its own first wave's share; the newest says
//! its share and wave, and while halted since when and why; a rolled-back
//! one says so, and the one rolled back to is everyone's, not "promoted".

use std::process::Command;

use pluginsync_tests::{EnvTree, MasterProcess, Pki, bin_path, closed_port, wait_for};

use super::{PATIENCE, replica, rollout};

/// A first wave of 20% that stays open alone for an hour.
const SLOW: &str = "[[rollout]]\nenvironments = [\"production\"]\n\
    waves = [ { after = \"0s\", percent = 20 }, { after = \"1h\", percent = 100 } ]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_status_says_what_each_generation_is_to_the_fleet() {
    let (tree, pki, dir) = (EnvTree::new(), Pki::new(), tempfile::tempdir().unwrap());
    tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let a = replica(dir.path(), "a", (&tree, &pki), closed_port(), SLOW);
    let _master = MasterProcess::spawn(&a.config);
    // `rollout status production` in text, one line per generation after
    // the environment's, each without its id, publication time and counts.
    let states = |n: usize| {
        let out = Command::new(bin_path("pluginsync-master"))
            .args(["rollout", "--config"])
            .arg(&a.config)
            .args(["--master", &a.url(), "status", "production"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{out:?}");
        let lines: Vec<String> = (text.lines().skip(1))
            .map(|l| {
                let l = l.trim().splitn(3, ' ').nth(2).unwrap_or("");
                // Without the fleet's counts (`, N nodes, M failing`).
                let counts = l.find(" nodes, ").and_then(|i| l[..i].rfind(", "));
                l[..counts.unwrap_or(l.len())].to_owned()
            })
            .collect();
        (lines.len() == n).then_some((lines, text))
    };
    let kept = |n: usize| async move {
        wait_for(PATIENCE, || async { states(n) })
            .await
            .unwrap_or_else(|| panic!("{n} generations kept"))
    };
    let (one, text) = kept(1).await;
    assert_eq!(one, ["everyone"], "{text}");

    tree.file("production", "app", "lib/facter/app.rb", "# two\n", 0o644);
    let (two, text) = kept(2).await;
    assert_eq!(two, ["20% open (wave 1)", "base (everyone else)"], "{text}");

    rollout(&a.config, "halt", &[&a]);
    let (halted, text) = kept(2).await;
    assert!(
        halted[0].starts_with("halted at 20% open (wave 1) since 20")
            && halted[0].contains(": halted by "),
        "{text}"
    );
    assert_eq!(halted[1], "base (everyone else)", "{text}");

    rollout(&a.config, "rollback", &[&a]);
    let (back, text) = kept(2).await;
    assert_eq!(back, ["rolled back", "everyone; rolled back to"], "{text}");
    rollout(&a.config, "promote", &[&a]);
    let (promoted, text) = kept(2).await;
    assert_eq!(promoted, ["everyone; promoted", "superseded"], "{text}");
}
