//! Real Puppet peers for the end-to-end tests: a stock Puppet 7 agent
//! (`puppet plugin download`, `puppet agent -t`) in its own directories, and
//! a throwaway Puppet Server 7 started by `scripts/puppetserver_sandbox.py`
//! (the same script the bench uses).
//!
//! A test that needs a peer calls [`crate::require`] first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Finished, repo_root, run_logged, which};

/// A stock Puppet agent with every directory of its own under `work`
/// (confdir, vardir, codedir, logdir, rundir, publicdir; libdir
/// `var/lib`, pluginfactdest `var/facts.d`), talking to
/// `localhost:<port>` as `certname` with the certificates of `ssldir`.
pub struct PuppetAgent {
    puppet: PathBuf,
    work: PathBuf,
    ssldir: PathBuf,
    certname: String,
    port: u16,
}

impl PuppetAgent {
    /// An agent in `work` (created, with the vardir Puppet insists on).
    pub fn new(puppet: &Path, work: &Path, ssldir: &Path, certname: &str, port: u16) -> Self {
        std::fs::create_dir_all(work.join("var")).expect("mkdir vardir");
        PuppetAgent {
            puppet: puppet.to_owned(),
            work: work.to_owned(),
            ssldir: ssldir.to_owned(),
            certname: certname.to_owned(),
            port,
        }
    }

    /// Where it puts the `plugins` mount.
    pub fn libdir(&self) -> PathBuf {
        self.work.join("var/lib")
    }

    /// Its certname.
    pub fn certname(&self) -> &str {
        &self.certname
    }

    /// Where it puts the `pluginfacts` mount.
    pub fn factsdir(&self) -> PathBuf {
        self.work.join("var/facts.d")
    }

    fn command(&self, args: &[&str], env: &str) -> Command {
        let mut cmd = Command::new(&self.puppet);
        cmd.args(args)
            .args(["--color", "false", "--server", "localhost"])
            .arg("--serverport")
            .arg(self.port.to_string())
            .args(["--certname", &self.certname, "--environment", env])
            .arg("--ssldir")
            .arg(&self.ssldir)
            // Puppet reads ~/.puppetlabs as a non-root user.
            .env("HOME", &self.work);
        for (flag, sub) in [
            ("--confdir", "conf"),
            ("--vardir", "var"),
            ("--codedir", "code"),
            ("--logdir", "log"),
            ("--rundir", "run"),
            ("--publicdir", "public"),
            ("--libdir", "var/lib"),
            ("--pluginfactdest", "var/facts.d"),
        ] {
            cmd.arg(flag).arg(self.work.join(sub));
        }
        cmd
    }

    /// `puppet plugin download` for `env` (at most 300 s).
    pub fn plugin_download(&self, env: &str) -> Finished {
        run_logged(
            self.command(&["plugin", "download"], env),
            &self.work,
            Duration::from_secs(300),
        )
    }

    /// `puppet agent --test` for `env`, without reports (at most 300 s).
    pub fn agent_test(&self, env: &str) -> Finished {
        run_logged(
            self.command(&["agent", "--test", "--no-report"], env),
            &self.work,
            Duration::from_secs(300),
        )
    }

    /// `puppet agent --test` for `env` sending its run report to the
    /// server, as a stock agent does (at most 300 s).
    pub fn agent_test_reporting(&self, env: &str) -> Finished {
        run_logged(
            self.command(&["agent", "--test"], env),
            &self.work,
            Duration::from_secs(300),
        )
    }

    /// [`Self::agent_test_reporting`] with `facts_d` as Facter's own
    /// external directory (`/etc/facter/facts.d` for root with Debian's
    /// Facter): bind-mounted there in a mount namespace of the run's own
    /// (`unshare`, root only), so the host's directory keeps what it had
    /// (it is created, empty, if missing: the mount needs it).
    pub fn agent_test_with_facter_dir(&self, env: &str, facts_d: &Path) -> Finished {
        let inner = self.command(&["agent", "--test"], env);
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(
                "mkdir -p /etc/facter/facts.d && \
                 mount --bind \"$0\" /etc/facter/facts.d && exec \"$@\"",
            )
            .arg(facts_d)
            .arg(inner.get_program())
            .args(inner.get_args());
        for (key, value) in inner.get_envs() {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        run_logged(cmd, &self.work, Duration::from_secs(300))
    }
}

/// Lines of a Puppet Server access log that requested `path_prefix`
/// (`"GET /puppet/v3/file_content/…"`).
pub fn requests<'a>(log: &'a str, path_prefix: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.contains(&format!("\"GET {path_prefix}")))
        .collect()
}

/// A throwaway Puppet Server 7 on 127.0.0.1 (Debian's `puppetserver`), its
/// CA, ssldir, code and logs in one tempdir; the JVM is killed on drop.
pub struct PuppetServer {
    dir: tempfile::TempDir,
    child: Child,
    /// Its HTTPS port.
    pub port: u16,
}

impl PuppetServer {
    /// True when Debian's `puppetserver` package is installed.
    pub fn installed() -> bool {
        Path::new("/usr/share/puppetserver/puppetserver.jar").is_file() && which("java").is_some()
    }

    /// Whether `test` can run a Puppet Server: true when it is installed;
    /// otherwise a visible `SKIPPED` line for `test` and false — or, under
    /// `CI`, a failure (`.ci/run` must install it).
    pub fn required(test: &str) -> bool {
        if PuppetServer::installed() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "puppetserver is not installed but CI is set: .ci/run must install it"
        );
        crate::skipped(
            test,
            "`puppetserver` not installed (apt-get install puppetserver)",
        );
        false
    }

    fn sandbox(&self, action: &str, extra: &[&str]) {
        sandbox(self.dir.path(), action, extra);
    }

    /// Writes its configuration, creates its CA, lets `populate` fill the
    /// environmentpath, then starts the JVM and waits (at most 300 s) until
    /// it is ready.
    pub fn start(populate: impl FnOnce(&Path)) -> PuppetServer {
        PuppetServer::start_with(&[], populate)
    }

    /// [`Self::start`] with more options of the sandbox's `setup`
    /// (`--http-port`, `--header-identity`, `--certs`, `--enc`,
    /// `--manifest`: scripts/puppetserver_sandbox.py).
    pub fn start_with(setup: &[&str], populate: impl FnOnce(&Path)) -> PuppetServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        let port_arg = port.to_string();
        let mut args = vec!["--port", port_arg.as_str()];
        args.extend_from_slice(setup);
        sandbox(dir.path(), "setup", &args);
        populate(&dir.path().join("code/environments"));
        let out = std::fs::File::create(dir.path().join("log/stdout.log")).expect("log");
        let child = Command::new("python3")
            .arg(repo_root().join("scripts/puppetserver_sandbox.py"))
            .args(["serve", "--dir"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("spawn puppetserver");
        let mut server = PuppetServer { dir, child, port };
        server.wait_ready(Duration::from_secs(300));
        server
    }

    fn wait_ready(&mut self, limit: Duration) {
        let restart = self.dir.path().join("run/restart");
        let start = Instant::now();
        loop {
            if std::fs::read(&restart).is_ok_and(|b| b.first() == Some(&b'1')) {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!(
                    "puppetserver exited ({status}) while starting:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                start.elapsed() < limit,
                "puppetserver not ready after {limit:?}:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("log/puppetserver.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Has its CA sign a certificate for `certname` (with subject alt
    /// names, if given); key and certificate land in [`Self::ssldir`].
    pub fn generate(&self, certname: &str, sans: Option<&str>) {
        match sans {
            Some(s) => self.sandbox("generate", &["--certname", certname, "--san", s]),
            None => self.sandbox("generate", &["--certname", certname]),
        }
    }

    /// Its ssldir (Puppet's layout: `certs/ca.pem` holds the root and
    /// intermediate CA, `crl.pem` both CRLs).
    pub fn ssldir(&self) -> PathBuf {
        self.dir.path().join("ssl")
    }

    /// Its environmentpath.
    pub fn envpath(&self) -> PathBuf {
        self.dir.path().join("code/environments")
    }

    /// The access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/access.log")).unwrap_or_default()
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }
}

impl Drop for PuppetServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sandbox(dir: &Path, action: &str, extra: &[&str]) {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/puppetserver_sandbox.py"))
        .arg(action)
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run puppetserver_sandbox.py");
    assert!(
        out.status.success(),
        "puppetserver_sandbox.py {action} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Generates the bench's seeded Puppet environment into `env_dir`
/// (`bench/vendor/gen_tree.py`, a copy of the team's shared generator).
pub fn gen_tree(env_dir: &Path, modules: usize, files: usize, target_mb: u32, seed: u64) {
    let out = Command::new("python3")
        .arg(repo_root().join("bench/vendor/gen_tree.py"))
        .arg("--out")
        .arg(env_dir)
        .args(["--modules", &modules.to_string()])
        .args(["--files", &files.to_string()])
        .args(["--target-mb", &target_mb.to_string()])
        .args(["--seed", &seed.to_string()])
        .output()
        .expect("run gen_tree.py");
    assert!(
        out.status.success(),
        "gen_tree.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
