//! A throwaway PostgreSQL for the state store's tests
//! (docs/operating.md#the-state-store): Debian's server
//! (`/usr/lib/postgresql/*/bin`) with its own data directory in a temp
//! dir, run as `nobody` when the tests run as root (`initdb` refuses
//! root), listening on a free loopback port and a Unix socket in the temp
//! dir, `fsync` off; stopped and removed on drop. A test can take it away
//! ([`Postgres::stop`]) and bring it back on the same port
//! ([`Postgres::start`]); each test makes its own database
//! ([`Postgres::database`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process::{hand_over, skipped, unprivileged};

/// A running (or stopped) PostgreSQL server of its own (module docs).
#[derive(Debug)]
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    server: Mutex<Option<Child>>,
    made: AtomicU32,
    tls: AtomicBool,
}

/// Debian's newest server binaries, if installed.
fn server_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|f| f.1)
}

impl Postgres {
    /// A new server, started; `None` after a visible `SKIPPED` line for
    /// `test` when Debian's `postgresql` is not installed (a failure
    /// under CI, which installs it).
    pub fn launch(test: &str) -> Option<Postgres> {
        let Some(bin) = server_bin() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL is not installed but CI is set: .ci/run must install Debian's postgresql package"
            );
            skipped(
                test,
                "PostgreSQL not installed (apt-get install postgresql)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sock")).expect("socket dir");
        hand_over(&[dir.path()]);
        let out = unprivileged(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = Postgres {
            dir,
            bin,
            port: crate::closed_port(),
            server: Mutex::new(None),
            made: AtomicU32::new(0),
            tls: AtomicBool::new(false),
        };
        pg.start();
        Some(pg)
    }

    /// Starts the server (again) on its port, and waits until it answers.
    pub fn start(&self) {
        let mut server = self.server.lock().expect("lock");
        if server.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .expect("log file");
        let mut cmd = unprivileged(&self.bin.join("postgres"));
        if self.tls.load(Ordering::Relaxed) {
            let dir = self.dir.path().display();
            cmd.args(["-c", "ssl=on", "-c"])
                .arg(format!("ssl_cert_file={dir}/server.crt"))
                .arg("-c")
                .arg(format!("ssl_key_file={dir}/server.key"));
        }
        let child = cmd
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.socket_dir())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=100",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        *server = Some(child);
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ready() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not answer within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the server (fast shutdown: connections closed), keeping its
    /// data for [`Postgres::start`].
    pub fn stop(&self) {
        let Some(mut child) = self.server.lock().expect("lock").take() else {
            return;
        };
        // SIGINT is PostgreSQL's fast shutdown.
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Serves TLS with `cert` and `key` (PEM) from now on: restarted.
    pub fn serve_tls(&self, cert: &Path, key: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let (c, k) = (
            self.dir.path().join("server.crt"),
            self.dir.path().join("server.key"),
        );
        std::fs::copy(cert, &c).expect("server certificate");
        std::fs::copy(key, &k).expect("server key");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        hand_over(&[&c, &k]);
        self.tls.store(true, Ordering::Relaxed);
        self.restart();
    }

    /// Stops and starts it.
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    fn ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of its Unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// A new empty database of its own; its `postgresql://` URL over
    /// loopback (plaintext: `sslmode=disable`, the server has no TLS).
    pub fn database(&self) -> String {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{n}");
        self.sql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// The URL of database `name` over loopback.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/{name}?sslmode=disable",
            self.port
        )
    }

    /// Runs `sql` in database `db` (a name, or the URL [`Postgres::database`]
    /// gave) with `psql`; its output (unaligned, tuples only).
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let name = db
            .rsplit_once('/')
            .map_or(db, |(_, n)| n.split('?').next().unwrap_or(n));
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                name,
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The temp dir that holds it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
