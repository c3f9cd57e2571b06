//! The early writeback of a big staging (docs/internals.md#stage): the
//! staged data started on its way to the disk while the downloads go on.

use super::Staging;

/// Above this many files staged for one destination (a first sync, a big
/// deploy), their data is written back while the rest downloads
/// ([`Writeback`]).
pub const WRITEBACK_ABOVE: usize = 1024;

/// How often [`Writeback`] starts the staged data on its way to the disk.
const WRITEBACK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Writes the staged data back while the downloads go on and the standby
/// is prepared: a `syncfs` of the staging directory's filesystem every
/// [`WRITEBACK_EVERY`] on a thread of its own, until stopped or dropped.
/// Only a head start: the files are made durable by their seal as always
/// (`stage.rs`, module docs), whose `syncfs` (above
/// [`pluginsync_common::fsutil::SYNCFS_ABOVE`] files their filesystem is
/// synced whole anyway) then finds little left to write; its error is the
/// one that counts.
#[derive(Debug)]
pub struct Writeback {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Writeback {
    /// Starts it for `staging` when it will hold more than
    /// [`WRITEBACK_ABOVE`] files.
    pub fn start(staging: &Staging, files: usize) -> Option<Writeback> {
        use rustix::fs::{Mode, OFlags};
        if files <= WRITEBACK_ABOVE {
            return None;
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = rustix::fs::open(&staging.dir, flags, Mode::empty()).ok()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(WRITEBACK_EVERY);
                    if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    if let Err(e) = rustix::fs::syncfs(&dir) {
                        tracing::debug!(error = %e, "early writeback failed");
                        break;
                    }
                }
            });
        spawned.ok().map(|_| Writeback { stop })
    }
}

impl Writeback {
    /// Stops it (not waited for: a `syncfs` in flight only writes back).
    pub fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.stop();
    }
}
