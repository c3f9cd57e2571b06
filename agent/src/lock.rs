//! The run lock: `<vardir>/agent.lock`, an advisory `flock`; and Puppet's
//! run lock, waited for before a commit ([`wait_for_puppet`]).
//!
//! An overlapping run (cron firing while a slow sync still runs) is
//! skipped at once with `another sync is running (pid N)` (exit 75,
//! `exit.rs`). The kernel drops the lock
//! when its process dies, so a crashed run's lock is simply taken over; the
//! pid inside is informational.
//!
//! Puppet's agent holds no `flock`: while it applies a catalog its
//! `agent_catalog_run_lockfile` exists and holds its pid. A commit that
//! changes something waits, bounded, while that file names a live process
//! that is not one of ours (docs/agent.md#a-puppet-run-in-progress).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live run holds it.
    #[error("another sync is running (pid {pid})")]
    Busy {
        /// The holder's pid, as it wrote it.
        pid: String,
    },
    /// The vardir is not safe to use (`vardir.rs`).
    #[error(transparent)]
    Vardir(#[from] crate::vardir::VardirError),
    /// The lock file could not be used.
    #[error("cannot lock '{path}': {source}")]
    Io {
        /// The lock file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Takes the lock in `vardir` (created if missing), once the vardir is
/// known to be safe ([`crate::vardir::check`]).
pub fn acquire(vardir: &Path) -> Result<RunLock, LockError> {
    let path = vardir.join("agent.lock");
    let io = |source| LockError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(vardir).map_err(io)?;
    crate::vardir::check(vardir)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(LockError::Busy {
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_owned()
                },
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(RunLock { _file: file })
}

/// `[puppet_lock]` in agent.toml (docs/agent.md#a-puppet-run-in-progress).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PuppetLockConfig {
    /// How long a commit waits while a Puppet run holds its lock; `0s`
    /// gives up at once.
    #[serde(default = "default_puppet_wait", with = "humantime_serde")]
    pub wait: Duration,
    /// Puppet's run lock file; unset: puppet.conf's
    /// `agent_catalog_run_lockfile`; `""`: no check.
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// Default of `[puppet_lock] wait`.
pub const DEFAULT_PUPPET_WAIT: Duration = Duration::from_secs(300);

fn default_puppet_wait() -> Duration {
    DEFAULT_PUPPET_WAIT
}

impl Default for PuppetLockConfig {
    fn default() -> Self {
        PuppetLockConfig {
            wait: DEFAULT_PUPPET_WAIT,
            file: None,
        }
    }
}

impl PuppetLockConfig {
    /// The lock the run checks: `file` when set (`""`: none), else the one
    /// puppet.conf names (`None` without a puppet.conf).
    pub fn resolve(&self, from_puppet_conf: Option<PathBuf>) -> PuppetLock {
        let file = match &self.file {
            Some(f) if f.as_os_str().is_empty() => None,
            Some(f) => Some(f.clone()),
            None => from_puppet_conf,
        };
        PuppetLock {
            file,
            wait: self.wait,
        }
    }
}

/// Puppet's run lock as a run checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PuppetLock {
    /// The lock file; `None`: no check.
    pub file: Option<PathBuf>,
    /// How long a commit waits for it.
    pub wait: Duration,
}

/// A Puppet run held its lock past the wait; nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error(
    "a Puppet run (pid {pid}) still holds {} after {}; nothing changed",
    path.display(),
    humantime_serde::re::humantime::format_duration(*wait)
)]
pub struct PuppetBusy {
    /// The holder's pid.
    pub pid: u32,
    /// The lock file.
    pub path: PathBuf,
    /// `[puppet_lock] wait`.
    pub wait: Duration,
    /// How long the run waited.
    pub waited: Duration,
}

/// What Puppet's lock file says now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    /// No lock file.
    Free,
    /// An empty lock file (Puppet creates it, then writes its pid).
    Empty,
    /// A lock no live process holds: why.
    Stale(String),
    /// Held by this pid, one of our ancestors (we run inside that Puppet
    /// run, e.g. from an `exec` resource).
    Ancestor(u32),
    /// Held by this live pid.
    Running(u32),
}

/// How often the lock file is looked at while it is held.
const POLL: Duration = Duration::from_millis(200);

/// How much of Puppet's lock file is read.
const MAX_LOCK_BYTES: u64 = 64;

/// How many ancestors are looked at (a loop in `/proc` ends here).
const MAX_ANCESTORS: usize = 64;

/// The pid a lock file holds: Puppet writes its pid alone, maybe with a
/// newline.
fn parse_pid(text: &str) -> Option<u32> {
    text.trim().parse::<u32>().ok().filter(|&p| p > 0)
}

/// `/proc/<pid>/stat`'s state and parent, if the process exists.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Whether `pid` is a live process: it exists (`kill(pid, 0)`, which works
/// where `/proc` hides other users' processes) and `/proc` does not show it
/// a zombie.
fn alive(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(p) {
        Ok(()) | Err(rustix::io::Errno::PERM) => {}
        Err(_) => return false,
    }
    !proc_stat(pid).is_some_and(|(state, _)| matches!(state, 'Z' | 'X' | 'x'))
}

/// This process's ancestors, parent first.
fn ancestors() -> Vec<u32> {
    let mut out = Vec::new();
    let mut pid = std::process::id();
    while out.len() < MAX_ANCESTORS {
        match proc_stat(pid) {
            Some((_, ppid)) if ppid > 1 => {
                out.push(ppid);
                pid = ppid;
            }
            _ => break,
        }
    }
    out
}

/// Reads the lock file once.
fn holder(path: &Path) -> Holder {
    use std::os::unix::fs::OpenOptionsExt;
    // A pid is a few bytes: a larger file is read no further; a FIFO in its
    // place does not block the run (opened non-blocking, then refused).
    let mut text = String::new();
    // Never through a symlink: the file is Puppet's, in a directory root
    // owns, and a link there points at a file that is not a lock (an error
    // names the file, never what it holds).
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW;
    let read = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .and_then(|f| match f.metadata()?.is_file() {
            true => f.take(MAX_LOCK_BYTES).read_to_string(&mut text),
            false => Err(std::io::Error::other("not a regular file")),
        });
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Holder::Free,
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Holder::Stale("is a symlink, not a lock file".into());
        }
        Err(e) => return Holder::Stale(format!("cannot be read: {e}")),
    }
    if text.trim().is_empty() {
        return Holder::Empty;
    }
    let Some(pid) = parse_pid(&text) else {
        return Holder::Stale(format!(
            "holds no pid ({} bytes that are not a process id)",
            text.len()
        ));
    };
    if !alive(pid) {
        Holder::Stale(format!("names pid {pid}, which is not running"))
    } else if ancestors().contains(&pid) {
        Holder::Ancestor(pid)
    } else {
        Holder::Running(pid)
    }
}

/// Waits while a Puppet run holds `lock`, polling, at most `lock.wait`.
/// Returns how long it waited when it did; a stale lock (a dead pid, no
/// pid) or one held by an ancestor of ours is not waited for. An empty
/// file is looked at once more: Puppet creates it before writing its pid.
pub async fn wait_for_puppet(lock: &PuppetLock) -> Result<Option<Duration>, PuppetBusy> {
    let Some(path) = &lock.file else {
        return Ok(None);
    };
    let started = Instant::now();
    let mut waited: Option<Duration> = None;
    let mut looked_again = false;
    loop {
        let pid = match holder(path) {
            Holder::Free => {
                if let Some(w) = waited {
                    tracing::info!(lock = %path.display(), waited_ms = w.as_millis() as u64, "the Puppet run released its lock: committing");
                }
                return Ok(waited);
            }
            Holder::Empty if !looked_again => {
                looked_again = true;
                tokio::time::sleep(POLL).await;
                continue;
            }
            Holder::Empty => {
                tracing::debug!(lock = %path.display(), "Puppet's run lock is empty: ignored");
                return Ok(waited);
            }
            Holder::Stale(why) => {
                tracing::debug!(lock = %path.display(), "Puppet's run lock {why}: ignored");
                return Ok(waited);
            }
            Holder::Ancestor(pid) => {
                tracing::info!(lock = %path.display(), pid, "this run is inside the Puppet run holding its lock: not waiting for it");
                return Ok(waited);
            }
            Holder::Running(pid) => pid,
        };
        let elapsed = started.elapsed();
        if elapsed >= lock.wait {
            return Err(PuppetBusy {
                pid,
                path: path.clone(),
                wait: lock.wait,
                waited: elapsed,
            });
        }
        if waited.is_none() {
            tracing::info!(lock = %path.display(), pid, wait = %humantime_serde::re::humantime::format_duration(lock.wait), "a Puppet run holds its lock: waiting for it before the commit");
        }
        tokio::time::sleep(POLL.min(lock.wait - elapsed)).await;
        waited = Some(started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_holds_a_pid_alone() {
        assert_eq!(parse_pid("1234\n"), Some(1234));
        assert_eq!(parse_pid(" 42 "), Some(42));
        for bad in ["", "\n", "0", "-3", "12ab", "pid 12", "99999999999"] {
            assert_eq!(parse_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn live_dead_and_ancestor_holders() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("agent_catalog_run.lock");
        assert_eq!(holder(&path), Holder::Free);
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(holder(&path), Holder::Empty);
        std::fs::write(&path, "root:*:19000:0:99999:7:::").unwrap();
        assert!(
            matches!(holder(&path), Holder::Stale(w) if w.contains("holds no pid") && !w.contains("root"))
        );
        std::fs::remove_file(&path).unwrap();
        // A symlink to a secret is not followed: named, never quoted.
        let secret = d.path().join("shadow");
        std::fs::write(&secret, "root:*:19000:0:99999:7:::").unwrap();
        std::os::unix::fs::symlink(&secret, &path).unwrap();
        assert!(matches!(holder(&path), Holder::Stale(w) if w == "is a symlink, not a lock file"));
        std::fs::remove_file(&path).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        assert!(matches!(holder(&path), Holder::Stale(w) if w.contains("not a regular file")));
        std::fs::remove_file(&path).unwrap();
        // A reaped child's pid is dead (until reused, which a test cannot
        // prevent but a fresh pid makes unlikely).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(&path, format!("{dead}\n")).unwrap();
        assert!(matches!(holder(&path), Holder::Stale(w) if w.contains("not running")));
        // An exited child not yet reaped is a zombie: not running.
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let start = Instant::now();
        while proc_stat(zombie.id()).is_some_and(|(state, _)| state != 'Z') {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(&path, zombie.id().to_string()).unwrap();
        assert!(matches!(holder(&path), Holder::Stale(w) if w.contains("not running")));
        zombie.wait().unwrap();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(&path, sleeper.id().to_string()).unwrap();
        assert_eq!(holder(&path), Holder::Running(sleeper.id()));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        let parent = std::os::unix::process::parent_id();
        std::fs::write(&path, parent.to_string()).unwrap();
        assert_eq!(holder(&path), Holder::Ancestor(parent));
    }

    #[test]
    fn the_lock_comes_from_the_file_key_over_puppet_conf() {
        let from_conf = Some(PathBuf::from(
            "/var/lib/puppet/state/agent_catalog_run.lock",
        ));
        let c = PuppetLockConfig::default();
        assert_eq!(c.resolve(from_conf.clone()).file, from_conf);
        assert_eq!(c.resolve(None).file, None);
        let c = PuppetLockConfig {
            file: Some("".into()),
            ..c
        };
        assert_eq!(c.resolve(from_conf.clone()).file, None);
        let c = PuppetLockConfig {
            file: Some("/x.lock".into()),
            ..c
        };
        assert_eq!(c.resolve(from_conf).file, Some("/x.lock".into()));
    }

    #[tokio::test]
    async fn a_held_lock_is_waited_for_at_most_the_wait() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("agent_catalog_run.lock");
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(&path, sleeper.id().to_string()).unwrap();
        let lock = PuppetLock {
            file: Some(path.clone()),
            wait: Duration::from_millis(500),
        };
        let e = wait_for_puppet(&lock).await.unwrap_err();
        assert!(e.waited >= Duration::from_millis(500), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "a Puppet run (pid {}) still holds {} after 500ms; nothing changed",
                sleeper.id(),
                path.display()
            )
        );
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert_eq!(wait_for_puppet(&lock).await.unwrap(), None);
        // An empty lock is looked at once more, then ignored.
        std::fs::write(&path, "").unwrap();
        let start = Instant::now();
        assert_eq!(wait_for_puppet(&lock).await.unwrap(), None);
        assert!(start.elapsed() >= POLL);
        // No lock file configured: nothing is looked at.
        let none = PuppetLock { file: None, ..lock };
        assert_eq!(wait_for_puppet(&none).await.unwrap(), None);
    }

    #[test]
    fn second_holder_is_told_the_pid_and_release_frees_it() {
        let d = tempfile::tempdir().unwrap();
        let held = acquire(d.path()).unwrap();
        let e = acquire(d.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("another sync is running (pid {})", std::process::id())
        );
        drop(held);
        assert!(acquire(d.path()).is_ok());
    }
}
