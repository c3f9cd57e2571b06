//! Faults for the agent's commit (`agent_faults`): [`RunningAgent`], an agent run
//! whose stderr a test reads as it comes and which it can signal;
//! [`Racer`], a local user swapping the libdir's directories for symlinks
//! while runs commit; [`on_small_tmpfs`], a run whose libdir is a tmpfs
//! with few inodes (in a private mount namespace).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::agent::{AgentHome, AgentRun};
use crate::process::bin_path;

/// A `pluginsync-agent sync` child whose stderr is read line by line on
/// demand ([`RunningAgent::stderr_until`]): while the test does not read
/// it, the pipe fills and the agent blocks on its next log line.
pub struct RunningAgent {
    child: Child,
    stderr: BufReader<ChildStderr>,
    /// The stderr lines read so far.
    pub lines: Vec<String>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl AgentHome {
    /// Starts `sync <flags>` with `RUST_LOG=<rust_log>` (empty: unset).
    pub fn spawn_sync(&self, flags: &[&str], rust_log: &str) -> RunningAgent {
        let args: Vec<&str> = std::iter::once("sync")
            .chain(flags.iter().copied())
            .collect();
        self.spawn_env(&args, &[], rust_log)
    }

    /// Starts `pluginsync-agent <args>` with `envs` added and
    /// `RUST_LOG=<rust_log>` (empty: unset).
    pub fn spawn_env(&self, args: &[&str], envs: &[(&str, &str)], rust_log: &str) -> RunningAgent {
        let mut cmd = Command::new(bin_path("pluginsync-agent"));
        cmd.args(args)
            .envs(envs.iter().copied())
            .arg("--config")
            .arg(self.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !rust_log.is_empty() {
            cmd.env("RUST_LOG", rust_log);
        }
        let mut child = cmd.spawn().expect("spawn agent");
        let mut out = child.stdout.take().expect("stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        RunningAgent {
            stderr: BufReader::new(child.stderr.take().expect("stderr")),
            child,
            lines: Vec::new(),
            stdout: Some(stdout),
        }
    }
}

impl RunningAgent {
    /// Reads stderr until a line containing `needle` (true) or its end
    /// (false).
    pub fn stderr_until(&mut self, needle: &str) -> bool {
        let mut line = String::new();
        loop {
            line.clear();
            match self.stderr.read_line(&mut line) {
                Ok(0) | Err(_) => return false,
                Ok(_) => {
                    self.lines.push(line.trim_end().to_owned());
                    if line.contains(needle) {
                        return true;
                    }
                }
            }
        }
    }

    /// Sends `signal` to the agent.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, signal).expect("signal the agent");
    }

    /// Reads the rest of stderr and waits (120 s at most) for the exit.
    /// `stderr` holds only the lines read here, after what was read before.
    pub fn finish(mut self) -> AgentRun {
        let mut rest = String::new();
        let _ = self.stderr.read_to_string(&mut rest);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                panic!("pluginsync-agent did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        AgentRun {
            code: status.code().unwrap_or(-1),
            stdout: self
                .stdout
                .take()
                .map(|t| t.join().expect("stdout thread"))
                .unwrap_or_default(),
            stderr: rest,
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A local user who can rename inside the libdir, racing the agent: on a
/// thread, over and over, each directory of the libdir (two levels) is
/// renamed away (to `<name>.away`, inside the libdir), a symlink to
/// `target` is put in its place, and then the directory is put back.
pub struct Racer {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Racer {
    /// Starts racing in `libdir`.
    pub fn start(libdir: &Path, target: &Path) -> Racer {
        let (stop, swaps) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (s, n) = (stop.clone(), swaps.clone());
        let (libdir, target) = (libdir.to_owned(), target.to_owned());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut dirs = subdirs(&libdir);
                for d in dirs.clone() {
                    dirs.extend(subdirs(&d));
                }
                for dir in dirs {
                    if swap(&dir, &target) {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Racer {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    /// Stops racing; returns how many symlinks were planted.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("racer thread");
        }
        self.swaps.load(Ordering::Relaxed)
    }
}

impl Drop for Racer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Swaps `dir` for a symlink to `target` for a moment, then puts it back;
/// whether the link was planted. Every step is relative to `dir`'s parent,
/// opened without following a link: the racer plays a user who redirects
/// the agent, and must not write through a link itself (a switch can make
/// a tree live whose `dir`'s parent is one of its earlier links).
fn swap(dir: &Path, target: &Path) -> bool {
    use rustix::fs::{Mode, OFlags};
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return false;
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(p) = rustix::fs::open(parent, flags, Mode::empty()) else {
        return false;
    };
    let mut away = name.to_owned();
    away.push(".away");
    if rustix::fs::renameat(&p, name, &p, &away).is_err() {
        return false;
    }
    let planted = rustix::fs::symlinkat(target, &p, name).is_ok();
    if planted {
        std::thread::yield_now();
        let _ = rustix::fs::unlinkat(&p, name, rustix::fs::AtFlags::empty());
    }
    let _ = rustix::fs::renameat(&p, &away, &p, name);
    planted
}

/// The real directories directly in `dir` (not links, not `*.away`).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| !n.ends_with(".away") && !n.starts_with('.'))
        })
        .collect()
}

/// Runs `sync` of `home` with its libdir on a fresh tmpfs of `nr_inodes`
/// inodes (8 MiB): in a private mount namespace (`unshare -Urm`, else as
/// root `unshare -m`), the tmpfs is mounted on the libdir, `seed`'s content
/// copied in, the agent run, and the libdir's content copied to `out`
/// afterwards (the mount vanishes with its namespace). `Err`: why no such
/// filesystem can be made here.
pub fn on_small_tmpfs(
    home: &AgentHome,
    seed: &Path,
    out: &Path,
    nr_inodes: u64,
) -> Result<AgentRun, String> {
    let script = r#"mount -t tmpfs -o "nr_inodes=$1,size=8m,mode=755" tmpfs "$2" || exit 200
cp -a "$3/." "$2/" || exit 201
"$4" sync --config "$5"; code=$?
cp -a "$2/." "$6/" || exit 202
exit $code"#;
    let mut why = Vec::new();
    for unshare in [&["-Urm"][..], &["-m"][..]] {
        let out_run = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c", script, "sh"])
            .arg(nr_inodes.to_string())
            .arg(home.libdir())
            .arg(seed)
            .arg(bin_path("pluginsync-agent"))
            .arg(home.path().join("agent.toml"))
            .arg(out)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output();
        let run = match out_run {
            Ok(o) => o,
            Err(e) => return Err(format!("cannot run unshare: {e}")),
        };
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        let code = run.status.code();
        // 200/201: the mount or the copy failed; 1 with unshare's own
        // message: no namespace. Anything else is the agent's status.
        if matches!(code, Some(200 | 201)) || (code == Some(1) && stderr.starts_with("unshare:")) {
            why.push(format!("unshare {}: {}", unshare.join(" "), stderr.trim()));
            continue;
        }
        if code == Some(202) {
            return Err(format!("cannot copy the libdir out: {stderr}"));
        }
        return Ok(AgentRun {
            code: code.unwrap_or(-1),
            stdout: String::from_utf8_lossy(&run.stdout).into_owned(),
            stderr,
        });
    }
    Err(format!(
        "no tmpfs with few inodes can be mounted here ({})",
        why.join("; ")
    ))
}
