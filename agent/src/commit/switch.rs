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

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::dirs::{DIR_FLAGS, empty_dir, remove_entry};
pub use super::error::SwitchError;
use super::record::{GenState, as_recorded};
use crate::listing::STAGING_DIR;
use crate::scan::LocalTree;

/// The tree being prepared, in the container.
pub const NEXT: &str = "next";
/// The prefix of a previous generation's name, `prev.<seq>`.
const PREV: &str = "prev.";

/// The container's entry for the files a standby's commit replaced
/// ([`Standby::trash`]): removed by the next run, off its critical path
/// ([`sweep_trash`]).
pub const TRASH: &str = "trash";
/// The suffix of a previous generation's [`GenState`] file.
const STATE: &str = ".state";
/// The test hook that makes the exchange unsupported (module docs).
pub const NO_EXCHANGE_ENV: &str = "PLUGINSYNC_TEST_NO_EXCHANGE";

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
        previous_in(self.fd.as_fd()).map_err(self.io("read", ""))
    }

    /// The container's trash, made if missing (0700): a standby's commit
    /// renames the old copy of a file it replaces there instead of
    /// freeing it in the rename (docs/internals.md#the-switch). `None` if
    /// it cannot be had: the rename then frees it.
    pub fn trash(&self) -> Option<OwnedFd> {
        match rustix::fs::mkdirat(&self.fd, TRASH, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(_) => return None,
        }
        rustix::fs::openat(&self.fd, TRASH, DIR_FLAGS, Mode::empty()).ok()
    }

    /// Whether `RENAME_EXCHANGE` works here: two empty directories of the
    /// container exchanged (module docs). They are kept for the next
    /// probe: made and removed each time, they cost 0.3 ms a run here,
    /// where every freed block is discarded (`discard`).
    pub fn exchange_works(&self) -> bool {
        if std::env::var_os(NO_EXCHANGE_ENV).is_some_and(|v| v == "1") {
            return false;
        }
        let (a, b) = ("probe.a", "probe.b");
        for n in [a, b] {
            let is_dir = rustix::fs::statat(&self.fd, n, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
            if is_dir {
                continue;
            }
            let _ = remove_entry(self.fd.as_fd(), OsStr::new(n));
            if rustix::fs::mkdirat(&self.fd, n, Mode::from_raw_mode(0o700)).is_err() {
                return false;
            }
        }
        let result = rustix::fs::renameat_with(&self.fd, a, &self.fd, b, RenameFlags::EXCHANGE);
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
    /// of it when `keep` is 1: its [`GenState`], if it still matches it,
    /// as [`foresee`] found it when `foreseen` names it, else read now),
    /// else a new empty one.
    pub fn take_next(
        &self,
        keep: usize,
        foreseen: Option<Foreseen>,
    ) -> Result<(PathBuf, Option<GenState>), SwitchError> {
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
            let file = self.state_file(oldest);
            if keep == 1 {
                state = match foreseen {
                    Some(f) if f.name == *oldest => f.state,
                    _ => read_state(&self.dir, oldest),
                };
            }
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
            let _gone_is_fine = std::fs::remove_file(self.state_file(old));
        }
        let _gone_is_fine = std::fs::remove_file(self.state_file(slot));
        self.sync()?;
        Ok(name)
    }

    /// Where what is known of the previous generation `name` is kept.
    pub fn state_file(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}{STATE}"))
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

/// Empties the trash of each of `dests`' containers ([`Standby::trash`])
/// on a thread of its own, not waited for: freeing a file's blocks is
/// slow on a filesystem mounted `discard` (each freed extent discarded
/// before `unlink` returns), so the files the last change replaced are
/// freed while this run waits on its master, not in its commit. What a
/// run's exit cuts short, the next one removes. Called under the run
/// lock: no other run writes to a container.
pub fn sweep_trash(dests: Vec<PathBuf>) {
    if let Err(e) = std::thread::Builder::new()
        .name("trash".into())
        .spawn(move || sweep(&dests))
    {
        tracing::debug!(error = %e, "cannot start the trash sweep");
    }
}

/// [`sweep_trash`]'s work, done here.
fn sweep(dests: &[PathBuf]) {
    for dest in dests {
        let Some((dir, _, _)) = container_of(dest) else {
            continue;
        };
        let Ok(fd) = rustix::fs::open(dir.join(TRASH), DIR_FLAGS, Mode::empty()) else {
            continue;
        };
        // Only a directory of this user's alone (as its container).
        if rustix::fs::fstat(&fd).is_ok_and(|st| st.st_uid == rustix::process::geteuid().as_raw()) {
            let _left_for_the_next_run = empty_dir(&fd);
        }
    }
}

/// A first sync's standby, to be filled by its downloads (`stage.rs`):
/// `Some(slot)` when `dest` will switch, its live tree (`local`, its
/// scan) holds nothing, and the standby taken for its next generation
/// is empty. Nothing then needs mirroring, and every downloaded file
/// can be written straight to its place there instead of into a staging
/// directory and renamed in one by one: on a first sync of thousands of
/// files, the renames and the staging directory's size were a third of
/// the time after the downloads
/// (docs/internals.md#blobs-gathered-downloads-into-the-standby).
/// [`super::prepare`] is then called with [`super::Staged::in_standby`].
pub fn fresh_standby(dest: &Path, local: &LocalTree, keep: usize) -> Option<PathBuf> {
    if !local.entries.is_empty() || !local.strays.is_empty() || local.ignored {
        return None;
    }
    let standby = standby_for(dest).ok()?;
    // A kept generation would be recycled, and is left to `prepare`.
    if standby.previous().ok()?.len() >= keep.max(1) {
        return None;
    }
    let (slot, _) = standby.take_next(keep, None).ok()?;
    let empty = std::fs::read_dir(&slot).ok()?.next().is_none();
    empty.then_some(slot)
}

/// The standby trees of `dest`, or why it has none and commits in place
/// (docs/internals.md#the-switch): a mount point, a filesystem without
/// `RENAME_EXCHANGE`, a container that is not this user's alone; `None`
/// when there is no live directory (made in place, nothing to say).
pub(super) fn standby_for(dest: &Path) -> Result<Standby, Option<String>> {
    let dev = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.is_dir(), std::os::unix::fs::MetadataExt::dev(&m)))
    };
    let Some((true, dest_dev)) = dev(dest) else {
        // Nothing live to keep: made in place, without a word.
        return Err(None);
    };
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty());
    if parent.and_then(dev).map(|(_, d)| d) != Some(dest_dev) {
        return Err(Some("the destination is a mount point".to_owned()));
    }
    match Standby::open(dest, true) {
        Ok(Some(s)) if s.exchange_works() => Ok(s),
        Ok(_) => Err(Some(
            "the filesystem cannot exchange two directories (RENAME_EXCHANGE)".to_owned(),
        )),
        Err(e) => Err(Some(format!("no standby tree ({e})"))),
    }
}

/// A previous generation's record, read and checked against it ahead of
/// [`Standby::take_next`] ([`foresee`]).
pub struct Foreseen {
    /// The generation it describes, `prev.<seq>`.
    name: String,
    /// Its record; `None` if it has none or no longer matches it.
    state: Option<GenState>,
}

/// What [`Standby::take_next`] would read of `dest`'s standby when it
/// takes the oldest previous generation with `keep` 1: its [`GenState`],
/// if it still matches it ([`as_recorded`]). Reads only, and only what
/// the run's own preparation leaves alone, so it runs on a thread of its
/// own while the downloads do (docs/internals.md#the-switch): decoding a
/// 3,000-file record and reading its directories run beside them. `None`: nothing to read ahead.
pub fn foresee(dest: &Path, keep: usize) -> Option<Foreseen> {
    if keep != 1 {
        return None;
    }
    let (dir, _, _) = container_of(dest)?;
    let fd = rustix::fs::open(&dir, DIR_FLAGS, Mode::empty()).ok()?;
    if rustix::fs::statat(&fd, NEXT, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return None; // taken as it is, with nothing known of it
    }
    let (_, name) = previous_in(fd.as_fd()).ok()?.into_iter().next()?;
    let state = read_state(&dir, &name);
    Some(Foreseen { name, state })
}

/// The record of the previous generation `name` in the container `dir`,
/// if it has one that still matches it.
fn read_state(dir: &Path, name: &str) -> Option<GenState> {
    let state = GenState::decode(&std::fs::read(dir.join(format!("{name}{STATE}"))).ok()?)?;
    as_recorded(&dir.join(name), &state.scan).then_some(state)
}

/// The previous generations in the container open as `dir`, oldest
/// first: (seq, name).
fn previous_in(dir: std::os::fd::BorrowedFd<'_>) -> Result<Vec<(u64, String)>, Errno> {
    let mut out = Vec::new();
    let dir = rustix::fs::openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(seq) = name.strip_prefix(PREV).and_then(|s| s.parse().ok()) {
            out.push((seq, name));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::record::write_state;
    use super::*;
    use pluginsync_common::digest::Sha256;
    use pluginsync_common::relpath::RelPath;

    #[test]
    fn the_sweep_empties_each_trash_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("lib");
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(dest.join("live.rb"), "live").unwrap();
        let container = t.path().join(".lib.pluginsync");
        let trash = container.join(TRASH);
        std::fs::create_dir_all(trash.join("a/b")).unwrap();
        std::fs::write(trash.join("1.1"), "old").unwrap();
        std::fs::write(trash.join("a/b/1.2"), "old").unwrap();
        std::fs::create_dir(container.join("prev.1")).unwrap();
        std::fs::write(container.join("prev.1/kept.rb"), "kept").unwrap();
        // A destination without a container is passed over.
        sweep(&[t.path().join("other"), dest.clone()]);
        assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0);
        assert_eq!(std::fs::read(dest.join("live.rb")).unwrap(), b"live");
        assert_eq!(
            std::fs::read(container.join("prev.1/kept.rb")).unwrap(),
            b"kept"
        );
    }

    #[test]
    fn the_record_read_ahead_is_the_one_take_next_would_read() {
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("lib");
        std::fs::create_dir(&dest).unwrap();
        let container = t.path().join(".lib.pluginsync");
        let prev = container.join("prev.1");
        std::fs::create_dir_all(prev.join("a/b")).unwrap();
        std::fs::write(prev.join("a/b/x.rb"), "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(&container, private).unwrap();
        let ignore = pluginsync_common::ignore::IgnoreSet::empty();
        let state = GenState {
            live_digest: Sha256::of(b"live"),
            changed: vec![RelPath::parse("a/b/x.rb").unwrap()],
            scan: crate::scan::scan(&prev, &ignore).unwrap(),
        };
        write_state(&container.join("prev.1.state"), &state);
        // Nothing to read ahead with more than one generation kept.
        assert!(foresee(&dest, 2).is_none());
        let ahead = foresee(&dest, 1).expect("read ahead");
        assert_eq!(
            (ahead.name.as_str(), ahead.state.as_ref()),
            ("prev.1", Some(&state))
        );
        // What take_next finds is what was read ahead, without the file.
        std::fs::remove_file(container.join("prev.1.state")).unwrap();
        let standby = Standby::open(&dest, false).unwrap().unwrap();
        let (slot, known) = standby.take_next(1, Some(ahead)).unwrap();
        assert_eq!((slot, known), (container.join(NEXT), Some(state.clone())));
        // A `next` is taken as it is: nothing read ahead.
        assert!(foresee(&dest, 1).is_none());

        // A generation changed since its record: read ahead as unknown,
        // as take_next would find it.
        std::fs::rename(container.join(NEXT), &prev).unwrap();
        write_state(&container.join("prev.1.state"), &state);
        std::fs::create_dir(prev.join("a/new")).unwrap();
        let ahead = foresee(&dest, 1).expect("read ahead");
        assert_eq!(ahead.state, None);
        let (_, known) = standby.take_next(1, None).unwrap();
        assert_eq!(known, None);
    }
}
