//! The `pluginsync-agent` binary in a home of its own: [`AgentHome`] writes
//! its config and runs it; [`AgentRun`] is what one run did.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::pki::Pki;
use crate::process::bin_path;

/// An agent configured in a tempdir: `agent.toml`, `lib/`, `facts.d/`,
/// `var/`, with `node1`'s certificate from `pki`; `[facts] check = false`
/// unless `extra` has a `[facts]` table.
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
        AgentHome::with_ssldir_in(
            tempfile::tempdir().expect("tempdir"),
            ssldir,
            certname,
            servers,
            extra,
        )
    }

    /// Like [`AgentHome::new`], in memory (`/dev/shm` when it is there):
    /// for destinations of tens of thousands of files.
    pub fn in_memory(pki: &Pki, servers: &[String], extra: &str) -> AgentHome {
        AgentHome::with_ssldir_in(
            crate::tree::memory_tempdir(),
            &pki.ssldir,
            "node1",
            servers,
            extra,
        )
    }

    fn with_ssldir_in(
        dir: tempfile::TempDir,
        ssldir: &Path,
        certname: &str,
        servers: &[String],
        extra: &str,
    ) -> AgentHome {
        let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
        let mut toml = format!(
            "servers = [{}]\npuppet_conf = \"\"\nlibdir = \"lib\"\nfactsdir = \"facts.d\"\nvardir = \"var\"\ntimeout = \"60s\"\nretries = 2\n{extra}\n[tls]\nssldir = {ssldir:?}\ncertname = {certname:?}\n",
            servers.join(", "),
        );
        // Fact health (docs/loading.md#fact-health) is off unless a test
        // configures `[facts]`: Facter runs cost seconds, and the other
        // tests' reports assert their own loads (tests/e2e/agent_facts.rs
        // checks it on by default).
        if !extra.contains("[facts]") {
            toml.push_str("[facts]\ncheck = false\n");
        }
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
        self.run_env(args, &[])
    }

    /// [`AgentHome::run`] with `envs` set in the agent's environment.
    pub fn run_env(&self, args: &[&str], envs: &[(&str, &str)]) -> AgentRun {
        let mut child = Command::new(bin_path("pluginsync-agent"))
            .args(args)
            .arg("--config")
            .arg(self.dir.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .envs(envs.iter().copied())
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
