//! The run lock: `<vardir>/agent.lock`, an advisory `flock`.
//!
//! An overlapping run (cron firing while a slow sync still runs) is
//! skipped at once with `another sync is running (pid N)` (exit 75,
//! `exit.rs`). The kernel drops the lock
//! when its process dies, so a crashed run's lock is simply taken over; the
//! pid inside is informational.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
