//! The durability step of a commit (`tests/e2e/agent_durable.rs` checks
//! it under `strace`): before [`super::commit`] returns —
//! so before the cache and the report claim the commit — every directory
//! whose entries it changed and every entry whose mode it changed is on
//! disk, at the cost of those alone: the directories renamed into, the
//! staging directory renamed out of, the directories made and their
//! parents (on a first sync, the destination and each ancestor that its
//! staging or `CreateRoot` made), the directories purged from, the
//! entries `chmod`ed. One `fsync` each,
//! deduplicated, or one `syncfs(2)` per filesystem when there are more
//! than `SYNCFS_ABOVE` (`pluginsync_common::fsutil`, which has the
//! measurement); a destination with a mount point below it counts per
//! filesystem. An empty plan (a run that changes nothing) syncs nothing.
//! A failed sync is a warning: the changes are made and cannot be undone.

use std::path::{Path, PathBuf};

use pluginsync_common::fsutil::{Durable, Need};

use super::PrepareError;
use super::dirs::Dirs;

/// Makes what the commit changed durable (module docs): the directories
/// and entries marked while it ran, plus each directory made for the
/// destination and the parent that holds its entry (trusted paths: the
/// destination and its ancestors are configuration).
pub fn make_durable(dirs: Dirs<'_>, created: &[PathBuf]) {
    let durable = collect(dirs, created);
    if durable.is_empty() {
        return;
    }
    match durable.sync() {
        Ok(synced) => {
            tracing::debug!(each = synced.each, syncfs = synced.syncfs, "commit durable");
        }
        Err(failures) => {
            for (path, e) in failures {
                tracing::warn!(path = %path.display(), error = %e, "cannot sync");
            }
        }
    }
}

/// What [`make_durable`] syncs, not synced yet: for a standby, synced on
/// a thread of its own while the next destination is prepared
/// (`super::prepare`).
pub fn collect(dirs: Dirs<'_>, created: &[PathBuf]) -> Durable {
    let mut durable = dirs.durable;
    for dir in created.iter().chain(&dirs.created) {
        for p in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
            if let Err(e) = durable.add_path(p, Need::All) {
                tracing::warn!(dir = %p.display(), error = %e, "cannot open a directory to sync");
            }
        }
    }
    durable
}

/// The durability step of a prepared standby, running on a thread of its
/// own; held by whoever waits for it before the switch (the run's
/// per-destination state, `sync/dest.rs`), not by the standby.
pub struct Syncing {
    /// The standby's container, for a message.
    dir: PathBuf,
    thread: std::thread::JoinHandle<Result<(), PrepareError>>,
}

impl Syncing {
    /// Starts syncing `durable`, what [`collect`] gathered of the standby
    /// `slot` (in the container `dir`); its first failure is the error.
    pub fn start(durable: Durable, slot: &Path, dir: PathBuf) -> Result<Syncing, PrepareError> {
        let sync = move || {
            durable
                .sync_logged("standby durable")
                .map_err(|(path, source)| PrepareError::Sync { path, source })
        };
        let thread = std::thread::Builder::new()
            .name("standby sync".into())
            .spawn(sync)
            .map_err(|source| PrepareError::Sync {
                path: slot.to_owned(),
                source,
            })?;
        Ok(Syncing { dir, thread })
    }

    /// Waits until the standby is on disk, staged files included: the
    /// switch may come only then (docs/internals.md#the-switch). A failed
    /// sync fails the run before the switch: the live tree stays.
    pub fn wait(self) -> Result<(), PrepareError> {
        match self.thread.join() {
            Ok(synced) => synced,
            Err(_) => Err(PrepareError::Sync {
                path: self.dir,
                source: std::io::Error::other("the sync thread panicked"),
            }),
        }
    }
}
