//! The master under test: a test config ([`config_toml`],
//! [`parse_config`]), the master in-process on its own thread and runtime
//! with its index counters reachable ([`TestMaster`]), and the
//! `pluginsync-master` binary as a child process ([`MasterProcess`]).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use pluginsync_master::config::MasterConfig;
use pluginsync_master::store::Store;

use crate::pki::Pki;
use crate::process::bin_path;

/// Writes `text` as `master.toml` in a new temporary directory; returns
/// the directory (keep it alive) and the file's path.
pub fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("master.toml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

/// A master config for tests: 127.0.0.1 port 0, the PKI's files, a CRL,
/// no shutdown grace, plus `extra` TOML (top-level keys first, then
/// tables).
pub fn config_toml(envpath: &Path, pki: &Pki, extra_top: &str, extra_tables: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:0\"]\nenvironmentpath = [{envpath:?}]\n{extra_top}\n\
         [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\ncrl = {crl:?}\n\
         [http]\nshutdown_grace = \"0s\"\n{extra_tables}\n",
        cert = pki.cert("localhost"),
        key = pki.key("localhost"),
        ca = pki.ca(),
        crl = pki.crl(),
    )
}

/// Parses and validates a test config.
pub fn parse_config(text: &str) -> MasterConfig {
    let c = MasterConfig::parse(text, Path::new("/test/master.toml")).expect("config parses");
    c.validate().expect("config is valid");
    c
}

/// The master running in-process; [`TestMaster::start`] returns once the
/// warmer has indexed what `index.warm` names.
pub struct TestMaster {
    /// The bound address.
    pub addr: SocketAddr,
    /// Its indexes and counters.
    pub store: Arc<Store>,
    /// Its `[proxy]` listeners' bound addresses.
    pub proxy: Vec<SocketAddr>,
    /// Its metrics listener's bound address, if configured.
    pub metrics: Option<SocketAddr>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestMaster {
    /// Starts a master for `config` (its `listen` is ignored: 127.0.0.1:0).
    pub fn start(config: MasterConfig) -> TestMaster {
        let master = TestMaster::listening(config);
        let store = &master.store;
        // Environments are indexed and watched in the background
        // (docs/master.md#many-environments): wait until the warmer and the
        // watcher's setup are done, so a test starts from every environment
        // indexed and watched, as a master did before serving.
        let settled = || store.is_warmed() && store.is_watching();
        for _ in 0..6000 {
            if settled() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(settled(), "the master indexed and watched its environments");
        master
    }

    /// Starts a master for `config` and returns as soon as it listens,
    /// while it still indexes and sets up its watches in the background.
    pub fn listening(config: MasterConfig) -> TestMaster {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        TestMaster::listening_on(config, listener)
    }

    /// [`TestMaster::listening`] on a listener bound already (a port
    /// named before it starts).
    pub fn listening_on(config: MasterConfig, listener: std::net::TcpListener) -> TestMaster {
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let result = rt.block_on(pluginsync_master::server::serve(
                Arc::new(config),
                vec![listener],
                async move {
                    let _ = stop_rx.await;
                },
                move |running| {
                    let _ = ready_tx.send((running.store, running.proxy, running.metrics));
                },
            ));
            if let Err(e) = result {
                eprintln!("test master failed: {e:#}");
            }
        });
        let (store, proxy, metrics) = ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("master became ready");
        TestMaster {
            addr,
            store,
            proxy,
            metrics,
            shutdown: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for TestMaster {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The master binary as a child process.
pub struct MasterProcess {
    child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Everything it logged up to "listening on".
    pub log: String,
}

impl MasterProcess {
    /// `pluginsync-master serve --config <config>`, logging at info to a
    /// pipe, stdin and stdout closed.
    pub fn command(config: &Path) -> Command {
        let mut cmd = Command::new(bin_path("pluginsync-master"));
        cmd.args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs `pluginsync-master serve --config <config>` and waits (up to
    /// 60 s) for its "listening on" and its "ready" lines (it listens before
    /// `index.warm` is indexed: docs/master.md#many-environments), in either
    /// order.
    pub fn spawn(config: &Path) -> MasterProcess {
        let mut child = MasterProcess::command(config)
            .spawn()
            .expect("spawn master");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = String::new();
            let mut started = StartLines::default();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.push_str(&line);
                log.push('\n');
                if let Some(addr) = started.see(&line) {
                    let _ = tx.send((addr, log.clone()));
                }
            }
            let _ = tx.send((None, log));
        });
        let (addr, log) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("master started in time");
        let addr = addr.unwrap_or_else(|| panic!("master did not start:\n{log}"));
        MasterProcess { child, addr, log }
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Follows a master's log until it has both listened and become ready
/// (the two lines come in either order).
#[derive(Default)]
pub(crate) struct StartLines {
    addr: Option<Option<SocketAddr>>,
    ready: bool,
    done: bool,
}

impl StartLines {
    /// Takes one log line; the listening address (or `None` if it did not
    /// parse) once, when both lines have been seen.
    pub(crate) fn see(&mut self, line: &str) -> Option<Option<SocketAddr>> {
        if let Some(addr) = line.split("listening on ").nth(1) {
            self.addr = Some(addr.trim().parse::<SocketAddr>().ok());
        }
        if line.contains("pluginsync_master::store: ready") {
            self.ready = true;
        }
        match self.addr {
            Some(addr) if self.ready && !self.done => {
                self.done = true;
                Some(addr)
            }
            _ => None,
        }
    }
}
