//! The standby trees of a destination and the one atomic step that makes
//! one of them live (docs/internals.md#the-switch).
//!
//! Beside the destination `<parent>/<name>`, on the same filesystem, the
//! agent keeps `<parent>/.<name>.pluginsync/` (mode 0700, its own): the
//! tree being prepared, `next`, and the previous generations,
//! `prev.<seq>` (the highest `seq` the newest), at most
//! `[switch] keep_previous` of them. A name says what the tree is: only a
//! `prev.<seq>` is a complete generation (what `rollback` may bring back);
//! a `next` is being prepared and is made equal to the live tree by the
//! mirror (`mirror.rs`) before anything relies on it.
//!
//! The switch is `renameat2(<name>, next, RENAME_EXCHANGE)`: the
//! destination stays a real directory, and a reader that opened it before
//! keeps the whole old generation. Then `next` (now the old live tree) is
//! renamed `prev.<seq+1>`, and the destination's parent and the container
//! are synced: the switch is on disk before the run reports it.
//!
//! A filesystem without `RENAME_EXCHANGE` (NFS, some overlayfs: `EINVAL`,
//! `ENOTSUP`) is found by a probe on two empty directories in the
//! container before anything is prepared; the run then commits in place as
//! before. The environment variable `PLUGINSYNC_TEST_NO_EXCHANGE=1` makes
//! the probe fail: a test hook (`tests/e2e/agent_switch.rs`), nothing else.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::filesig::FileSig;
use pluginsync_common::fsutil::replace_atomic;
use pluginsync_common::relpath::RelPath;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::dirs::{DIR_FLAGS, remove_entry};
use crate::listing::STAGING_DIR;
use crate::scan::{LocalEntry, LocalKind, LocalTree};

/// The tree being prepared, in the container.
pub const NEXT: &str = "next";
/// The prefix of a previous generation's name, `prev.<seq>`.
const PREV: &str = "prev.";
/// The suffix of a previous generation's [`GenState`] file.
const STATE: &str = ".state";
/// The test hook that makes the exchange unsupported (module docs).
pub const NO_EXCHANGE_ENV: &str = "PLUGINSYNC_TEST_NO_EXCHANGE";

/// The standby trees of a destination could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// A system call on `path` failed.
    #[error("cannot {what} '{}': {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The container is not a directory of this user's alone.
    #[error("'{}' is not a directory of this user's alone (mode 0700); not using it", .0.display())]
    NotOurs(PathBuf),
    /// The destination has no parent or no name.
    #[error("'{}' has no parent directory to keep standby trees in", .0.display())]
    NoParent(PathBuf),
}

/// The container of one destination, open.
pub struct Standby {
    /// The destination.
    pub dest: PathBuf,
    /// `<parent>/.<name>.pluginsync`.
    pub dir: PathBuf,
    parent: OwnedFd,
    name: OsString,
    fd: OwnedFd,
}

/// `<parent>/.<name>.pluginsync` for `dest`, with its parent and name.
pub fn container_of(dest: &Path) -> Option<(PathBuf, PathBuf, OsString)> {
    let (parent, name) = (dest.parent()?, dest.file_name()?);
    let mut dir = OsString::from(".");
    dir.push(name);
    dir.push(".pluginsync");
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    Some((parent.join(dir), parent.to_owned(), name.to_owned()))
}

impl Standby {
    /// Opens (with `create`, makes) the container of `dest`; `None`
    /// without `create` when there is none.
    pub fn open(dest: &Path, create: bool) -> Result<Option<Standby>, SwitchError> {
        let (dir, parent, name) =
            container_of(dest).ok_or_else(|| SwitchError::NoParent(dest.to_owned()))?;
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |e: Errno| SwitchError::Io {
                what,
                path,
                source: e.into(),
            }
        };
        let parent_fd = rustix::fs::open(
            &parent,
            DIR_FLAGS.difference(OFlags::NOFOLLOW),
            Mode::empty(),
        )
        .map_err(io("open", &parent))?;
        let dir_name = dir.file_name().unwrap_or_default();
        let fd = match rustix::fs::openat(&parent_fd, dir_name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if create => {
                rustix::fs::mkdirat(&parent_fd, dir_name, Mode::from_raw_mode(0o700))
                    .map_err(io("create", &dir))?;
                let fd = rustix::fs::openat(&parent_fd, dir_name, DIR_FLAGS, Mode::empty())
                    .map_err(io("open", &dir))?;
                rustix::fs::fsync(&parent_fd).map_err(io("sync", &parent))?;
                fd
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io("open", &dir)(e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(io("stat", &dir))?;
        if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            return Err(SwitchError::NotOurs(dir));
        }
        // Under the run lock: a record a killed run left half-written.
        pluginsync_common::fsutil::remove_leftovers(&dir);
        Ok(Some(Standby {
            dest: dest.to_owned(),
            dir,
            parent: parent_fd,
            name,
            fd,
        }))
    }

    fn io(&self, what: &'static str, name: &str) -> impl FnOnce(Errno) -> SwitchError {
        let path = self.dir.join(name);
        move |e| SwitchError::Io {
            what,
            path,
            source: e.into(),
        }
    }

    /// The path of the container's entry `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The previous generations, oldest first: (seq, name).
    pub fn previous(&self) -> Result<Vec<(u64, String)>, SwitchError> {
        let mut out = Vec::new();
        let dir = rustix::fs::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())
            .map_err(self.io("open", ""))?;
        for entry in rustix::fs::Dir::read_from(&dir).map_err(self.io("read", ""))? {
            let entry = entry.map_err(self.io("read", ""))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(seq) = name.strip_prefix(PREV).and_then(|s| s.parse().ok()) {
                out.push((seq, name));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether `RENAME_EXCHANGE` works here: two empty directories of the
    /// container exchanged (module docs).
    pub fn exchange_works(&self) -> bool {
        if std::env::var_os(NO_EXCHANGE_ENV).is_some_and(|v| v == "1") {
            return false;
        }
        let (a, b) = ("probe.a", "probe.b");
        for n in [a, b] {
            let _ = remove_entry(self.fd.as_fd(), OsStr::new(n));
            if rustix::fs::mkdirat(&self.fd, n, Mode::from_raw_mode(0o700)).is_err() {
                return false;
            }
        }
        let result = rustix::fs::renameat_with(&self.fd, a, &self.fd, b, RenameFlags::EXCHANGE);
        for n in [a, b] {
            let _ = rustix::fs::unlinkat(&self.fd, n, AtFlags::REMOVEDIR);
        }
        match result {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "RENAME_EXCHANGE probe failed");
                false
            }
        }
    }

    /// The tree to prepare: a `next` left by an earlier run, else the
    /// oldest previous generation when `keep` are kept already (renamed
    /// `next`, durably, before anything in it changes; with what is known
    /// of it, [`GenState`], when `keep` is 1), else a new empty one.
    pub fn take_next(&self, keep: usize) -> Result<(PathBuf, Option<GenState>), SwitchError> {
        match rustix::fs::statat(&self.fd, NEXT, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => {
                return Ok((self.path(NEXT), None));
            }
            Ok(_) => remove_entry(self.fd.as_fd(), OsStr::new(NEXT)).map_err(|e| {
                self.io("remove", NEXT)(Errno::from_io_error(&e).unwrap_or(Errno::IO))
            })?,
            Err(_) => {}
        }
        let previous = self.previous()?;
        let mut state = None;
        if previous.len() >= keep.max(1)
            && let Some((_, oldest)) = previous.first()
        {
            let file = self.path(&format!("{oldest}{STATE}"));
            state = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| GenState::decode(&t))
                .filter(|_| keep == 1);
            rustix::fs::renameat(&self.fd, oldest.as_str(), &self.fd, NEXT)
                .map_err(self.io("rename", oldest))?;
            // No longer a complete generation, on disk before it changes.
            rustix::fs::fsync(&self.fd).map_err(self.io("sync", ""))?;
            let _gone_is_fine = std::fs::remove_file(&file);
        } else {
            rustix::fs::mkdirat(&self.fd, NEXT, Mode::from_raw_mode(0o700))
                .map_err(self.io("create", NEXT))?;
        }
        Ok((self.path(NEXT), state))
    }

    /// The switch: the destination and the container's `slot` exchanged
    /// in one step.
    pub fn exchange(&self, slot: &str) -> Result<(), SwitchError> {
        rustix::fs::renameat_with(
            &self.parent,
            self.name.as_os_str(),
            &self.fd,
            slot,
            RenameFlags::EXCHANGE,
        )
        .map_err(|e| SwitchError::Io {
            what: "exchange",
            path: self.dest.clone(),
            source: e.into(),
        })
    }

    /// After an exchange with `slot`: what it holds now (the generation
    /// that was live) becomes the newest previous generation, without the
    /// staging directory it carried; older ones beyond `keep` go; the
    /// destination's parent and the container are synced.
    pub fn retire(&self, slot: &str, keep: usize) -> Result<String, SwitchError> {
        if let Ok(fd) = rustix::fs::openat(&self.fd, slot, DIR_FLAGS, Mode::empty()) {
            let _ = remove_entry(fd.as_fd(), OsStr::new(STAGING_DIR));
        }
        let previous = self.previous()?;
        let seq = previous.iter().map(|(s, _)| *s).max().unwrap_or(0) + 1;
        let name = format!("{PREV}{seq}");
        if slot != name {
            rustix::fs::renameat(&self.fd, slot, &self.fd, name.as_str())
                .map_err(self.io("rename", slot))?;
        }
        let extra = (previous.len() + 1).saturating_sub(keep.max(1));
        for (_, old) in previous.iter().filter(|(_, n)| *n != slot).take(extra) {
            if let Err(e) = remove_entry(self.fd.as_fd(), OsStr::new(old)) {
                tracing::warn!(dir = %self.path(old).display(), error = %e, "cannot remove an old generation");
            }
            let _gone_is_fine = std::fs::remove_file(self.path(&format!("{old}{STATE}")));
        }
        let _gone_is_fine = std::fs::remove_file(self.path(&format!("{slot}{STATE}")));
        self.sync()?;
        Ok(name)
    }

    /// Records what is known of the previous generation `name` (a hint:
    /// not synced; a lost or unreadable one costs a whole mirror).
    pub fn write_state(&self, name: &str, state: &GenState) {
        let Some(text) = state.encode() else { return };
        let file = self.path(&format!("{name}{STATE}"));
        if let Err(e) = replace_atomic(&file, text.as_bytes(), 0o600) {
            tracing::debug!(file = %file.display(), error = %e, "cannot record a generation");
        }
    }

    /// Syncs the destination's parent and the container (their entries).
    pub fn sync(&self) -> Result<(), SwitchError> {
        rustix::fs::fsync(&self.parent).map_err(|e| SwitchError::Io {
            what: "sync",
            path: self.dest.parent().unwrap_or(&self.dest).to_owned(),
            source: e.into(),
        })?;
        rustix::fs::fsync(&self.fd).map_err(self.io("sync", ""))
    }
}

/// What is known of a previous generation, so the next change can bring
/// it to the live tree by what differs alone (docs/internals.md#the-switch):
/// kept in `prev.<n>.state`, trusted only while the live tree's scan
/// still has `live_digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenState {
    /// The digest of the live tree's scan right after the switch that
    /// made this generation a previous one.
    pub live_digest: Sha256,
    /// The paths that differ between this generation and that live tree.
    pub changed: Vec<RelPath>,
    /// This generation's scan, from when it was live.
    pub scan: LocalTree,
}

/// The first line of a [`GenState`] file, and its last (a cut file is
/// none).
const STATE_HEADER: &str = "pluginsync-generation 1";
const STATE_END: &str = "end\n";

impl GenState {
    /// The file's text; `None` for what it cannot hold (a name no listing
    /// can hold, a name with a line break, something neither file,
    /// directory nor symlink, an ignored name).
    pub fn encode(&self) -> Option<String> {
        use std::fmt::Write;
        let t = &self.scan;
        let lines = |r: &RelPath| !r.as_str().contains('\n');
        if !t.strays.is_empty() || t.ignored || !self.changed.iter().all(lines) {
            return None;
        }
        let mut out = format!(
            "{STATE_HEADER}\ndigest {}\nroot {:o} {}\nchanged {}\n",
            self.live_digest.to_hex(),
            t.root_mode,
            u8::from(t.exists),
            self.changed.len()
        );
        for rel in &self.changed {
            let _ = writeln!(out, "{rel}");
        }
        for (rel, e) in &t.entries {
            let kind = match e.kind {
                LocalKind::Dir => 'd',
                LocalKind::File => 'f',
                LocalKind::Symlink => 'l',
                LocalKind::Other => return None,
            };
            if !lines(rel) {
                return None;
            }
            let s = &e.stat;
            let _ = writeln!(
                out,
                "{kind} {:o} {} {} {} {} {} {rel}",
                e.mode, s.size, s.mtime_ns, s.ctime_ns, s.ino, s.dev
            );
        }
        out.push_str(STATE_END);
        Some(out)
    }

    /// Reads [`GenState::encode`]'s text; `None` if it is not one.
    pub fn decode(text: &str) -> Option<GenState> {
        let mut lines = text.strip_suffix(STATE_END)?.lines();
        (lines.next()? == STATE_HEADER).then_some(())?;
        let live_digest = Sha256::from_hex(lines.next()?.strip_prefix("digest ")?).ok()?;
        let (mode, exists) = lines.next()?.strip_prefix("root ")?.split_once(' ')?;
        let n: usize = lines.next()?.strip_prefix("changed ")?.parse().ok()?;
        let changed = (0..n)
            .map(|_| RelPath::parse(lines.next()?).ok())
            .collect::<Option<Vec<_>>>()?;
        let mut scan = LocalTree {
            exists: exists == "1",
            root_mode: u32::from_str_radix(mode, 8).ok()?,
            ..LocalTree::default()
        };
        let mut entries = Vec::new();
        for line in lines {
            let mut f = line.splitn(8, ' ');
            let kind = match f.next()? {
                "d" => LocalKind::Dir,
                "f" => LocalKind::File,
                "l" => LocalKind::Symlink,
                _ => return None,
            };
            let mode = u32::from_str_radix(f.next()?, 8).ok()?;
            let mut num = || f.next()?.parse::<i64>().ok();
            let (size, mtime_ns, ctime_ns, ino, dev) = (num()?, num()?, num()?, num()?, num()?);
            let stat = FileSig {
                size: size as u64,
                mtime_ns,
                ctime_ns,
                ino: ino as u64,
                dev: dev as u64,
            };
            let rel = RelPath::parse(f.next()?).ok()?;
            let entry = LocalEntry {
                kind,
                mode,
                sha256: None,
                stat,
            };
            entries.push((rel, entry));
        }
        // Built in bulk (the file is in order; a map sorts anyway).
        scan.entries = entries.into_iter().collect();
        Some(scan).map(|scan| GenState {
            live_digest,
            changed,
            scan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_state_reads_back_and_refuses_what_it_cannot_hold() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a b/c")).unwrap();
        std::fs::write(t.path().join("a b/c/x.rb"), "x").unwrap();
        std::os::unix::fs::symlink("x.rb", t.path().join("a b/c/link")).unwrap();
        let scan =
            crate::scan::scan(t.path(), &pluginsync_common::ignore::IgnoreSet::empty()).unwrap();
        let state = GenState {
            live_digest: Sha256::of(b"live"),
            changed: vec![RelPath::parse("a b/c/x.rb").unwrap()],
            scan,
        };
        let text = state.encode().unwrap();
        assert_eq!(GenState::decode(&text), Some(state.clone()));
        assert_eq!(
            GenState::decode(&text.replacen("generation 1", "generation 2", 1)),
            None
        );
        assert_eq!(
            GenState::decode(&text[..text.len() - 3]).map(|s| s.scan),
            None
        );
        let mut broken = state;
        broken.changed.push(RelPath::parse("line\nbreak").unwrap());
        assert_eq!(broken.encode(), None);
    }
}
