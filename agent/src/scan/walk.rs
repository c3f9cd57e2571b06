//! The walk of [`super::scan`]: one queue of directories that a few
//! threads share (docs/internals.md#scan), each directory opened relative
//! to its parent's descriptor without following a link and its entries
//! stat'ed relative to it.

use std::path::{Path, PathBuf};

use pluginsync_common::filesig::FileSig;
use pluginsync_common::ignore::IgnoreSet;

use super::{LocalEntry, LocalKind, LocalName, ScanError};
use crate::listing::STAGING_DIR;

/// The shared walk of [`super::scan`]: directories still to read, and how many
/// are being read.
pub(super) struct Walk<'a> {
    pub(super) state: std::sync::Mutex<WalkState>,
    /// Signalled when jobs are added or the last busy reader finishes.
    pub(super) ready: std::sync::Condvar,
    pub(super) ignore: &'a IgnoreSet,
    /// An ignored name was skipped.
    pub(super) skipped: std::sync::atomic::AtomicBool,
}

/// A directory to read.
pub(super) struct Job {
    /// The open directory holding it (`None`: the destination itself,
    /// opened by its path): opened relative to it, without following a
    /// link, so a directory swapped for a link during the walk is never
    /// gone through.
    pub(super) parent: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Its path, for messages (and to open the destination).
    pub(super) path: PathBuf,
    /// Its name in the tree.
    pub(super) name: LocalName,
}

pub(super) struct WalkState {
    /// Directories to read.
    pub(super) jobs: Vec<Job>,
    /// Directories being read now.
    pub(super) busy: usize,
    /// The first error: every thread stops at its next job.
    pub(super) failed: Option<ScanError>,
}

impl Walk<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, WalkState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads directories until none is left (or one failed); returns the
    /// entries this thread found.
    pub(super) fn work(&self) -> Vec<(LocalName, LocalEntry)> {
        let mut out = Vec::new();
        // The getdents buffer, one per thread for all its directories.
        let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.failed.is_some() {
                        return out;
                    }
                    if let Some(job) = st.jobs.pop() {
                        st.busy += 1;
                        break job;
                    }
                    if st.busy == 0 {
                        return out;
                    }
                    st = self
                        .ready
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            let mut subdirs = Vec::new();
            let read = self.read_dir(&job, &mut buf, &mut out, &mut subdirs);
            let mut st = self.lock();
            st.busy -= 1;
            let wake = match read {
                Ok(()) => {
                    let more = !subdirs.is_empty();
                    st.jobs.extend(subdirs);
                    more || st.busy == 0
                }
                Err(e) => {
                    st.failed.get_or_insert(e);
                    true
                }
            };
            drop(st);
            // Only new jobs, an error or the end are news to a waiter.
            if wake {
                self.ready.notify_all();
            }
        }
    }

    /// The entries of the directory of `job` into `out`, its
    /// subdirectories into `subdirs`; ignored names (and the agent's
    /// staging directory at the top) are skipped without descending into
    /// them. Every entry is stat'ed by its name relative to the open
    /// directory that holds it, not following a link, never by its whole
    /// path: a deep tree costs no path walk per file.
    fn read_dir(
        &self,
        job: &Job,
        buf: &mut Vec<u8>,
        out: &mut Vec<(LocalName, LocalEntry)>,
        subdirs: &mut Vec<Job>,
    ) -> Result<(), ScanError> {
        use rustix::fs::{AtFlags, Mode, OFlags};
        use std::os::unix::ffi::OsStrExt;
        let io = |path: &Path| {
            let path = path.to_owned();
            move |e: rustix::io::Errno| ScanError::Io {
                path,
                source: e.into(),
            }
        };
        // O_NOATIME: reading a directory changed since it was last read
        // would otherwise dirty its inode (relatime) on every scan after a
        // change; refused (EPERM) where the agent does not own it.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let open = |flags: OFlags| match &job.parent {
            None => rustix::fs::open(&job.path, flags.difference(OFlags::NOFOLLOW), Mode::empty()),
            Some(parent) => {
                let name = job.path.file_name().unwrap_or_default();
                rustix::fs::openat(parent, name, flags, Mode::empty())
            }
        };
        let fd = match open(flags | OFlags::NOATIME) {
            Err(rustix::io::Errno::PERM) => open(flags),
            opened => opened,
        }
        .map_err(io(&job.path))?;
        let fd = std::sync::Arc::new(fd);
        let top = job.parent.is_none();
        let mut dir = rustix::fs::RawDir::new(&*fd, buf.spare_capacity_mut());
        while let Some(entry) = dir.next() {
            let entry = entry.map_err(io(&job.path))?;
            let raw = entry.file_name();
            let bytes = raw.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let file_name = std::ffi::OsStr::from_bytes(bytes);
            let text = file_name.to_str().unwrap_or_default();
            if top && text == STAGING_DIR {
                continue;
            }
            if self.ignore.is_ignored(text) {
                self.skipped
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            let st = rustix::fs::statat(&*fd, raw, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io(&job.path.join(file_name)))?;
            let child = job.name.child(file_name);
            let entry = entry_of_stat(&st);
            if entry.kind == LocalKind::Dir {
                subdirs.push(Job {
                    parent: Some(fd.clone()),
                    path: job.path.join(file_name),
                    name: child.clone(),
                });
            }
            out.push((child, entry));
        }
        Ok(())
    }
}

/// The entry for a raw (non-following) stat; the same as [`entry_of`]
/// gives for the same file.
fn entry_of_stat(st: &rustix::fs::Stat) -> LocalEntry {
    use rustix::fs::FileType;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::Symlink => LocalKind::Symlink,
        FileType::Directory => LocalKind::Dir,
        FileType::RegularFile => LocalKind::File,
        _ => LocalKind::Other,
    };
    LocalEntry {
        kind,
        mode: st.st_mode & 0o777,
        sha256: None,
        stat: FileSig::of_stat(st),
    }
}
