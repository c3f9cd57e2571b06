//! Two masters behind HAProxy in TCP passthrough
//! (docs/puppet-fleet.md#running-behind-a-load-balancer): 100 agent syncs
//! through `packaging/haproxy.cfg` while one master is killed and later
//! restarted, with a change on the tree in between: no sync fails, and every
//! sync ends with the same tree. Then the ETag: both replicas give the one the
//! balancer gave, and a conditional request through the balancer still gets its
//! 304 after the backend that served the first request has died.
//!
//! Skipped with a message when `haproxy` is not installed, except under CI
//! (`CI` set), where `.ci/run` installs it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pluginsync_tests::{
    AgentHome, EnvTree, MasterProcess, Pki, client, closed_port, config_toml, merged_mount,
    require, tree_snapshot,
};

use crate::common::pluginsync_query;

/// A fresh connection's conditional GET of the plugins listing at `base`:
/// (status, ETag).
fn conditional_get(pki: &Pki, base: &str, etag: Option<&str>) -> (u16, Option<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut req = client(pki, Some("node1")).get(format!(
            "{base}/puppet/v3/file_metadatas/plugins?{}",
            pluginsync_query("use", "follow", "production")
        ));
        if let Some(tag) = etag {
            req = req.header("If-None-Match", tag);
        }
        let resp = req.send().await.expect("request");
        let tag = resp
            .headers()
            .get("etag")
            .map(|v| v.to_str().unwrap().to_owned());
        (resp.status().as_u16(), tag)
    })
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
    let Some(haproxy) = require("haproxy", "haproxy", "haproxy_lb") else {
        return;
    };
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

    // The same ETag from the balancer and from each replica.
    let front_url = format!("https://localhost:{front}");
    let (status, etag) = conditional_get(&pki, &front_url, None);
    let etag = etag.filter(|_| status == 200).expect("a 200 with an ETag");
    for port in [p1, p2] {
        assert_eq!(
            conditional_get(&pki, &format!("https://localhost:{port}"), Some(&etag)),
            (304, Some(etag.clone())),
            "replica on port {port} does not revalidate the balancer's ETag"
        );
    }
    // Kill one backend: every conditional request through the balancer is
    // still a 304 (from the other), and the agent's no-op stays silent.
    drop(m1.take());
    for _ in 0..10 {
        assert_eq!(conditional_get(&pki, &front_url, Some(&etag)).0, 304);
    }
    let run = home.sync(&[]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{run:?}");
}
