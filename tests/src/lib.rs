//! The end-to-end test harness: real certificates, real trees on disk, a
//! real master over real TLS on 127.0.0.1, and real child processes.
//!
//! - [`Pki`]: a throwaway CA made by the master's own `dev-certs` code, with
//!   agents `node1`, `node2` and a revoked `revoked`.
//! - [`EnvTree`]: an environmentpath in a tempdir, built file by file.
//! - [`TestMaster`]: the master in-process (its own thread and runtime) on
//!   port 0, with its index counters reachable; stopped on drop.
//! - [`MasterProcess`]: the `pluginsync-master` binary as a child process,
//!   its port read from its log; killed on drop.
//! - [`client`] and [`raw_get`]: an mTLS reqwest client, and a raw HTTP/1.1
//!   request over TLS for paths a URL library would normalise (`..`).
//! - [`puppet`]: stock Puppet agents and a throwaway Puppet Server.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pluginsync_master::config::MasterConfig;
use pluginsync_master::devcerts::{self, DevCertsOptions};
use pluginsync_master::store::Store;
use sha2::Digest;

pub mod puppet;

/// The agent certnames every [`Pki`] has.
pub const AGENTS: [&str; 3] = ["node1", "node2", "revoked"];

/// A development CA and certificates in a Puppet-style ssldir.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// The ssldir.
    pub ssldir: PathBuf,
}

impl Pki {
    /// Server `localhost`, agents [`AGENTS`], `revoked` in the CRL.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ssldir = dir.path().join("ssl");
        devcerts::generate(&DevCertsOptions {
            out: ssldir.clone(),
            server_names: vec!["localhost".into()],
            agents: AGENTS.iter().map(|s| s.to_string()).collect(),
            revoke: vec!["revoked".into()],
            days: 2,
        })
        .expect("dev certs");
        Pki { _dir: dir, ssldir }
    }

    /// `certs/<name>.pem`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.ssldir.join(format!("certs/{name}.pem"))
    }

    /// `private_keys/<name>.pem`.
    pub fn key(&self, name: &str) -> PathBuf {
        self.ssldir.join(format!("private_keys/{name}.pem"))
    }

    /// `certs/ca.pem`.
    pub fn ca(&self) -> PathBuf {
        self.ssldir.join("certs/ca.pem")
    }

    /// `crl.pem`.
    pub fn crl(&self) -> PathBuf {
        self.ssldir.join("crl.pem")
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

/// An environmentpath in a tempdir.
pub struct EnvTree {
    dir: tempfile::TempDir,
}

impl Default for EnvTree {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvTree {
    /// An empty environmentpath.
    pub fn new() -> EnvTree {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("environments")).expect("mkdir");
        EnvTree { dir }
    }

    /// The environmentpath directory.
    pub fn envpath(&self) -> PathBuf {
        self.dir.path().join("environments")
    }

    /// A scratch directory beside the environmentpath (outside every
    /// environment): for symlink targets that must never be served.
    pub fn outside(&self) -> PathBuf {
        let p = self.dir.path().join("outside");
        std::fs::create_dir_all(&p).expect("mkdir");
        p
    }

    /// `<envpath>/<env>/modules/<module>`.
    pub fn module(&self, env: &str, module: &str) -> PathBuf {
        self.envpath().join(env).join("modules").join(module)
    }

    /// Writes `<module>/<rel>` with `content` and `mode`, creating parents.
    pub fn file(
        &self,
        env: &str,
        module: &str,
        rel: &str,
        content: impl AsRef<[u8]>,
        mode: u32,
    ) -> PathBuf {
        let p = self.module(env, module).join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, content).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }

    /// Creates `<module>/<rel>` as a directory with `mode`.
    pub fn dir(&self, env: &str, module: &str, rel: &str, mode: u32) -> PathBuf {
        let p = self.module(env, module).join(rel);
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }

    /// Creates `<module>/<rel>` as a symlink to `target` (verbatim).
    pub fn symlink(&self, env: &str, module: &str, rel: &str, target: impl AsRef<Path>) -> PathBuf {
        let p = self.module(env, module).join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, &p).expect("symlink");
        p
    }

    /// A deterministic environment of `modules` modules with `files` files
    /// each, spread over Puppet's usual plugin directories, plus an
    /// external fact or two per module; returns the written lib files.
    pub fn generate(&self, env: &str, modules: usize, files: usize, seed: u64) -> Vec<PathBuf> {
        let dirs = [
            "facter",
            "puppet/type",
            "puppet/provider/widget",
            "puppet/functions",
            "puppet_x/util",
        ];
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let mut out = Vec::new();
        for m in 0..modules {
            let module = format!("mod{m:02}");
            for f in 0..files {
                let dir = dirs[next() % dirs.len()];
                let body: String = (0..(next() % 40 + 1))
                    .map(|i| format!("# {module} line {i} {}\n", next()))
                    .collect();
                out.push(self.file(
                    env,
                    &module,
                    &format!("lib/{dir}/{module}_{f}.rb"),
                    body,
                    0o644,
                ));
            }
            for f in 0..(m % 3) {
                self.file(
                    env,
                    &module,
                    &format!("facts.d/{module}_{f}.txt"),
                    format!("{module}_{f}=1\n"),
                    0o644,
                );
            }
        }
        out
    }
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

/// The master running in-process.
pub struct TestMaster {
    /// The bound address.
    pub addr: SocketAddr,
    /// Its indexes and counters.
    pub store: Arc<Store>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestMaster {
    /// Starts a master for `config` (its `listen` is ignored: 127.0.0.1:0).
    pub fn start(config: MasterConfig) -> TestMaster {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
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
                    let _ = ready_tx.send(running.store);
                },
            ));
            if let Err(e) = result {
                eprintln!("test master failed: {e:#}");
            }
        });
        let store = ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("master became ready");
        TestMaster {
            addr,
            store,
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

/// Path of a workspace binary (`target/<profile>/<name>`), next to the
/// test executable's `deps/` directory. Build it first: the README's test
/// command runs `cargo build --workspace --bins` before `cargo test`.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} not built: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
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
    /// 60 s) for its "listening on" line.
    pub fn spawn(config: &Path) -> MasterProcess {
        let mut child = MasterProcess::command(config)
            .spawn()
            .expect("spawn master");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.push_str(&line);
                log.push('\n');
                if let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send((addr.trim().parse::<SocketAddr>().ok(), log.clone()));
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

/// An mTLS client trusting only the test CA, presenting `certname`'s
/// certificate (none for `None`).
pub fn client(pki: &Pki, certname: Option<&str>) -> reqwest::Client {
    pluginsync_common::tls::install_default_provider();
    let ca = std::fs::read(pki.ca()).expect("ca");
    let mut b = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("ca pem"))
        .https_only(true)
        .timeout(Duration::from_secs(30))
        .no_gzip();
    if let Some(name) = certname {
        let mut pem = std::fs::read(pki.cert(name)).expect("cert");
        pem.extend(std::fs::read(pki.key(name)).expect("key"));
        b = b.identity(reqwest::Identity::from_pem(&pem).expect("identity"));
    }
    b.build().expect("client")
}

/// A raw response.
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Header lines, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding is not decoded; the master sends
    /// Content-Length for everything these tests ask).
    pub body: Vec<u8>,
}

/// Sends `GET <target>` verbatim (no URL normalisation) over TLS with
/// `certname`'s certificate, HTTP/1.1, `Connection: close`.
pub async fn raw_get(
    addr: SocketAddr,
    pki: &Pki,
    certname: Option<&str>,
    target: &str,
) -> std::io::Result<RawResponse> {
    use pluginsync_common::tls as ptls;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let roots = ptls::load_roots(&pki.ca()).map_err(std::io::Error::other)?;
    let builder = rustls::ClientConfig::builder_with_provider(ptls::provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots);
    let config = match certname {
        Some(n) => builder
            .with_client_auth_cert(
                ptls::load_certs("cert", &pki.cert(n)).map_err(std::io::Error::other)?,
                ptls::load_key(&pki.key(n)).map_err(std::io::Error::other)?,
            )
            .map_err(std::io::Error::other)?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name =
        rustls_pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let mut tls = connector.connect(name, tcp).await?;
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("raw_get timed out"))??;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(RawResponse {
        status,
        headers,
        body: buf[split + 4..].to_vec(),
    })
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// A comparable picture of a tree: relative path → `dir <mode>`,
/// `file <mode> <sha256>` or `link <target>`. Symlinks are not followed.
pub fn tree_snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let md = std::fs::symlink_metadata(&p).expect("lstat");
            let mode = md.permissions().mode() & 0o7777;
            if md.file_type().is_symlink() {
                out.insert(
                    rel,
                    format!(
                        "link {}",
                        std::fs::read_link(&p).expect("readlink").display()
                    ),
                );
            } else if md.is_dir() {
                out.insert(rel, format!("dir {mode:o}"));
                walk(root, &p, out);
            } else {
                out.insert(
                    rel,
                    format!(
                        "file {mode:o} {}",
                        sha256_hex(&std::fs::read(&p).expect("read"))
                    ),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Polls `f` every 25 ms until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// What the environment's merged mount should look like, computed here
/// independently of the master: modules by name, first wins, Puppet's
/// default ignores, modes of files and directories. Same notation as
/// [`tree_snapshot`] (`dir <mode>`, `file <mode> <sha256>`).
pub fn merged_mount(env_dir: &Path, subdir: &str) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read_dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if [".git", ".svn", "CVS", ".hg"].contains(&name) {
                continue;
            }
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let md = std::fs::metadata(&p).expect("stat");
            let mode = md.permissions().mode() & 0o777;
            let value = if md.is_dir() {
                format!("dir {mode:o}")
            } else {
                format!(
                    "file {mode:o} {}",
                    sha256_hex(&std::fs::read(&p).expect("read"))
                )
            };
            out.entry(rel).or_insert(value);
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut modules: Vec<PathBuf> = std::fs::read_dir(env_dir.join("modules"))
        .expect("modules")
        .flatten()
        .map(|e| e.path())
        .collect();
    modules.sort();
    let mut out = BTreeMap::new();
    for m in modules {
        let root = m.join(subdir);
        if root.is_dir() {
            walk(&root, &root, &mut out);
        }
    }
    out
}

/// An agent configured in a tempdir: `agent.toml`, `lib/`, `facts.d/`,
/// `var/`, with `node1`'s certificate from `pki`.
pub struct AgentHome {
    dir: tempfile::TempDir,
}

/// What one agent run did.
#[derive(Debug)]
pub struct AgentRun {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl AgentHome {
    /// A home syncing from `servers`, plus `extra` TOML (top-level keys).
    pub fn new(pki: &Pki, servers: &[String], extra: &str) -> AgentHome {
        AgentHome::with_ssldir(&pki.ssldir, "node1", servers, extra)
    }

    /// A home syncing from `servers` with `certname`'s files from a
    /// Puppet-style `ssldir`, plus `extra` TOML (top-level keys).
    pub fn with_ssldir(
        ssldir: &Path,
        certname: &str,
        servers: &[String],
        extra: &str,
    ) -> AgentHome {
        let dir = tempfile::tempdir().expect("tempdir");
        let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
        let toml = format!(
            "servers = [{}]\nlibdir = \"lib\"\nfactsdir = \"facts.d\"\nvardir = \"var\"\ntimeout = \"60s\"\nretries = 2\n{extra}\n[tls]\nssldir = {ssldir:?}\ncertname = {certname:?}\n",
            servers.join(", "),
        );
        std::fs::write(dir.path().join("agent.toml"), toml).expect("write config");
        AgentHome { dir }
    }

    /// The home directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `lib/`.
    pub fn libdir(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    /// `facts.d/`.
    pub fn factsdir(&self) -> PathBuf {
        self.dir.path().join("facts.d")
    }

    /// `var/`.
    pub fn vardir(&self) -> PathBuf {
        self.dir.path().join("var")
    }

    /// Runs `pluginsync-agent <args> --config <home>/agent.toml` (for
    /// `sync` and `report`), killed after 120 s.
    pub fn run(&self, args: &[&str]) -> AgentRun {
        let mut child = Command::new(bin_path("pluginsync-agent"))
            .args(args)
            .arg("--config")
            .arg(self.dir.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agent");
        let (mut out, mut err) = (
            child.stdout.take().expect("stdout"),
            child.stderr.take().expect("stderr"),
        );
        let t_out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        let t_err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            s
        });
        let start = Instant::now();
        let code = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status.code().unwrap_or(-1);
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pluginsync-agent did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        AgentRun {
            code,
            stdout: t_out.join().expect("stdout thread"),
            stderr: t_err.join().expect("stderr thread"),
        }
    }

    /// Runs `sync` with extra flags.
    pub fn sync(&self, flags: &[&str]) -> AgentRun {
        let mut args = vec!["sync"];
        args.extend_from_slice(flags);
        self.run(&args)
    }
}

/// A scriptable TLS server for answers a real master never gives
/// (malformed or hostile listings, cut transfers). HTTP/1.1, one request
/// per connection; `respond` maps the request target to the raw response
/// bytes (status line, headers, body: written as given, then the
/// connection is closed).
pub struct FakeMaster {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The responder of a [`FakeMaster`].
pub type Responder = Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

impl FakeMaster {
    /// Serves with `pki`'s `localhost` certificate.
    pub fn start(pki: &Pki, respond: Responder) -> FakeMaster {
        use pluginsync_common::tls as ptls;
        let config = rustls::ServerConfig::builder_with_provider(ptls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                ptls::load_certs("cert", &pki.cert("localhost")).expect("cert"),
                ptls::load_key(&pki.key("localhost")).expect("key"),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (tcp, _) = tokio::select! {
                        r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                        _ = &mut stop_rx => break,
                    };
                    let (acceptor, respond) = (acceptor.clone(), respond.clone());
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let mut buf = Vec::new();
                        let mut chunk = [0u8; 4096];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                            match tls.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&buf);
                        let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                        let _ = tls.write_all(&respond(&target)).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
        });
        FakeMaster {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A raw HTTP/1.1 response with `Connection: close`.
pub fn http_response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A 127.0.0.1 port with nothing listening (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `name` on PATH (or in /usr/sbin, /sbin).
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        // Debian's daemons (haproxy) live in sbin, not on a user's PATH.
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `tool` (from Debian's `package`) on PATH, or `None` after printing
/// `SKIPPED <test>: …`: a test that needs a real peer calls this first.
/// Under CI (`CI` set) `.ci/run` installs the packages, and a missing one
/// is a failure, not a skip.
pub fn require(tool: &str, package: &str, test: &str) -> Option<PathBuf> {
    let found = which(tool);
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is not installed but CI is set: .ci/run must install Debian's {package} package"
        );
        skipped(
            test,
            &format!("`{tool}` not installed (apt-get install {package})"),
        );
    }
    found
}

/// Prints `SKIPPED <test>: <why>` where `cargo test` shows it: straight
/// to stderr, since libtest captures a passing test's `eprintln!` and the
/// skip would be silent.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// What a child process did.
#[derive(Debug)]
pub struct Finished {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output and error, interleaved.
    pub output: String,
}

/// Runs `cmd` with stdout and stderr into one log file under `dir`; kills
/// it after `limit`.
pub fn run_logged(mut cmd: Command, dir: &Path, limit: Duration) -> Finished {
    let log = dir.join(format!(
        "run-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{:?} did not finish in {limit:?}:\n{}",
                cmd.get_program(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Finished {
        code,
        output: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}
