//! The master as a service manager sees it: SIGTERM makes the health check
//! answer 503 for `shutdown_grace` (load balancers drain the replica), then
//! the process exits 0 — also when nobody reads its log any more. (A closed
//! stderr pipe once made the shutdown task panic on its first log line, and
//! the master ignored every SIGTERM after.)

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStderr, ExitStatus};
use std::time::{Duration, Instant};

use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, config_toml, wait_ready};

/// Starts the master binary; returns it, its address and its log, read up
/// to the "listening on" line.
fn spawn(config: &Path) -> (Child, SocketAddr, BufReader<ChildStderr>) {
    let mut child = MasterProcess::command(config)
        .spawn()
        .expect("spawn master");
    let mut log = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    // Bounded: the master logs a handful of lines before listening.
    for _ in 0..100 {
        line.clear();
        if log.read_line(&mut line).expect("read the master's log") == 0 {
            break;
        }
        if let Some(addr) = line.split("listening on ").nth(1) {
            return (child, addr.trim().parse().expect("address"), log);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("master did not start; last line: {line}");
}

fn terminate(child: &Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::TERM,
    )
    .expect("send SIGTERM");
}

/// Waits up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

async fn health(c: &reqwest::Client, addr: SocketAddr) -> Option<u16> {
    let url = format!("https://localhost:{}/status/v1/simple", addr.port());
    c.get(url).send().await.ok().map(|r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_exits_even_with_nobody_reading_the_log() {
    let pki = Pki::new();
    let tree = EnvTree::new();
    tree.file("production", "m", "lib/facter/a.rb", b"a", 0o644);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("master.toml");
    let text = config_toml(&tree.envpath(), &pki, "", "")
        .replace("shutdown_grace = \"0s\"", "shutdown_grace = \"3s\"");
    assert!(
        text.contains("\"3s\""),
        "the test config changed shape:\n{text}"
    );
    std::fs::write(&cfg, text).unwrap();
    let c = client(&pki, Some("node1"));

    // Log read to the end: drain, then a clean exit.
    let (mut master, addr, log) = spawn(&cfg);
    let reader = std::thread::spawn(move || {
        log.lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    });
    wait_ready(&c, &format!("https://localhost:{}", addr.port())).await;
    terminate(&master);
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.push(health(&c, addr).await);
        if seen.last() == Some(&Some(503)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen.last(),
        Some(&Some(503)),
        "health during the grace: {seen:?}"
    );
    let status = wait_exit(&mut master, Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "exit: {status:?}");
    let log = reader.join().unwrap();
    assert!(
        log.contains("shutting down: draining") && log.contains("stopped"),
        "{log}"
    );

    // Nobody reads the log any more: SIGTERM must still stop it.
    let (mut master, addr, log) = spawn(&cfg);
    drop(log);
    wait_ready(&c, &format!("https://localhost:{}", addr.port())).await;
    terminate(&master);
    let status = wait_exit(&mut master, Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "with its stderr closed the master did not stop on SIGTERM: {status:?}"
    );
}
