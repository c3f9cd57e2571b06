//! Two masters behind HAProxy in TCP passthrough (issue "Real peers",
//! must-show 3): 100 agent syncs through `packaging/haproxy.cfg` while one
//! master is killed and later restarted, with a change on the tree in
//! between: no sync fails, and every sync ends with the same tree.
//!
//! Skipped with a message when `haproxy` is not installed, except under CI
//! (`CI` set), where `.ci/run` installs it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, EnvTree, MasterProcess, Pki, closed_port, config_toml, merged_mount, tree_snapshot,
};

fn haproxy() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([Path::new("/usr/sbin").to_owned()])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "haproxy is not installed but CI is set: .ci/run must install it"
        );
        eprintln!("SKIPPED haproxy_lb: `haproxy` not installed (apt-get install haproxy)");
    }
    found
}

struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded) until something accepts on 127.0.0.1:`port`.
fn wait_port(port: u16) {
    let end = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "nothing listens on 127.0.0.1:{port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn syncs_survive_a_master_dying_behind_haproxy() {
    let Some(haproxy) = haproxy() else { return };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 6, 20, 21);
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2, front) = (closed_port(), closed_port(), closed_port());
    let config = |port: u16, name: &str| {
        let path = dir.path().join(name);
        let text = config_toml(&tree.envpath(), &pki, "", "")
            .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let (c1, c2) = (config(p1, "m1.toml"), config(p2, "m2.toml"));
    let mut m1 = Some(MasterProcess::spawn(&c1));
    let _m2 = MasterProcess::spawn(&c2);
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/haproxy.cfg");
    let _lb = Haproxy(
        Command::new(&haproxy)
            .args(["-db", "-f"])
            .arg(&cfg)
            .env("PLUGINSYNC_BIND", format!("127.0.0.1:{front}"))
            .env("PLUGINSYNC_MASTER1", format!("127.0.0.1:{p1}"))
            .env("PLUGINSYNC_MASTER2", format!("127.0.0.1:{p2}"))
            .env("PLUGINSYNC_CA", pki.ca())
            .env("PLUGINSYNC_SNI", "localhost")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy"),
    );
    wait_port(front);
    let home = AgentHome::new(&pki, &[format!("https://localhost:{front}")], "");
    let env_dir = tree.envpath().join("production");
    let mut failures = Vec::new();
    for i in 0..100 {
        match i {
            // A crash (SIGKILL), not a clean stop.
            20 => drop(m1.take()),
            // A change while only master2 serves.
            40 => {
                tree.file(
                    "production",
                    "mod00",
                    "lib/facter/during_outage.rb",
                    "# new\n",
                    0o644,
                );
            }
            60 => m1 = Some(MasterProcess::spawn(&c1)),
            // Another change once both are back.
            80 => {
                tree.file(
                    "production",
                    "mod01",
                    "lib/facter/after_restart.rb",
                    "# newer\n",
                    0o644,
                );
            }
            _ => {}
        }
        let run = home.sync(&[]);
        if run.code != 0 {
            failures.push(format!("sync {i}: {}", run.stderr.trim()));
        }
    }
    assert!(failures.is_empty(), "failed syncs: {failures:#?}");
    // Both masters picked the changes up: once more through the balancer,
    // and the libdir equals the merged mount.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env_dir, "lib"));
    assert!(home.libdir().join("facter/during_outage.rb").is_file());
    assert!(home.libdir().join("facter/after_restart.rb").is_file());
}
