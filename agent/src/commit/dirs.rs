//! [`Dirs`]: the open directories of one commit, and the steps that act
//! on an entry by name relative to one of them without following a
//! symlink (`commit.rs`, module docs: "No path is ever resolved through a
//! link").

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use pluginsync_common::fsutil::{Durable, Need};
use pluginsync_common::relpath::RelPath;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::error::CommitError;
use crate::listing::{MODE_MASK, STAGING_DIR};

/// How every directory of the commit is opened: read-only (a descriptor
/// that `fsync` and `fchmod` accept), never through a symlink.
pub const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// How an entry is opened for `fchmod`: never through a symlink, never
/// blocking (a FIFO planted there), never as a controlling terminal.
const ENTRY_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// The path of `rel` under `dest` as the commit's messages name it (the
/// destination itself with a trailing `/`).
pub fn path_of(dest: &Path, rel: &RelPath) -> PathBuf {
    if rel.is_root() {
        dest.join("")
    } else {
        rel.to_path(dest)
    }
}

/// Makes the directories of a first sync's plan in its empty standby on a
/// thread while the downloads fill it (docs/internals.md#the-switch):
/// `dirs` (relative path, planned mode) parents first, each with its
/// planned mode, so a download finds its directory made and the commit's
/// `Mkdir` step finds it exact (`mkdir` in `commit.rs`). Only directories
/// whose mode lets their owner write into them are made exact here; the
/// others stay for the commit, which sets their modes once every file is
/// in. The thread gives the directories it made exact; one that failed
/// leaves the rest to the commit, which makes them as ever (its error is
/// the commit's to say). `None` when there are none or no thread starts.
pub fn premake(
    slot: PathBuf,
    dirs: Vec<(RelPath, u32)>,
) -> Option<std::thread::JoinHandle<HashSet<RelPath>>> {
    if dirs.is_empty() {
        return None;
    }
    let make = move || {
        make_dirs(&slot, dirs).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "the standby's directories are left to the commit");
            HashSet::new()
        })
    };
    std::thread::Builder::new()
        .name("standby dirs".into())
        .spawn(make)
        .ok()
}

/// [`premake`]'s thread: each directory made (or found made by a
/// download) and opened without following a link, its mode set when it
/// is not the planned one.
fn make_dirs(slot: &Path, dirs: Vec<(RelPath, u32)>) -> Result<HashSet<RelPath>, CommitError> {
    let mut d = Dirs::new(slot, slot, Durable::new());
    let mut made = HashSet::with_capacity(dirs.len());
    for (rel, mode) in dirs {
        let mode = mode & MODE_MASK;
        let (depth, name) = d.parent_of(&rel)?;
        let parent = d.fd(depth);
        let io = |what| CommitError::io(what, rel.to_path(slot));
        // A mode the owner cannot write through is set by the commit, once
        // the downloads are in.
        let exact = mode & 0o700 == 0o700;
        let asked = if exact { mode } else { 0o700 };
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(asked)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io("create")(e)),
        }
        let fd = rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(io("open"))?;
        if exact {
            // mkdir's mode went through the umask (or a default ACL).
            let st = rustix::fs::fstat(&fd).map_err(io("stat"))?;
            if st.st_mode & 0o7777 != mode {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(io("chmod"))?;
            }
        }
        let last = rel.file_name().unwrap_or_default().to_owned();
        d.made(depth, &last, fd);
        if exact {
            made.insert(rel);
        }
    }
    Ok(made)
}

/// The open directories of one commit: the destination's root and the
/// chain from it down to the directory of the last step.
///
/// Bounded: only the current chain is kept (at most the tree's depth in
/// descriptors). The plan's order (directories parents-first, then files
/// in listing order, removals deepest-first) visits a directory's entries
/// together, so a chain is mostly reused from one step to the next and
/// each directory is opened about once per phase, not once per file.
pub struct Dirs<'a> {
    /// The destination (for messages, and to open the root).
    pub dest: &'a Path,
    /// The tree whose `.pluginsync-staging` holds the staged files: the
    /// destination itself, or the live tree when `dest` is its standby
    /// (docs/internals.md#the-switch).
    pub staged_in: &'a Path,
    /// The destination itself, once open.
    root: Option<OwnedFd>,
    /// Below the root: (name, descriptor, marked changed) per component
    /// of the last directory looked up.
    chain: Vec<(String, OwnedFd, bool)>,
    /// Whether the root is marked changed.
    root_marked: bool,
    /// `<dest>/.pluginsync-staging`, once open, and whether it is marked
    /// changed. A directory is marked (an `fstat` into [`Durable`]) once
    /// per descriptor, not once per file renamed into or out of it: a
    /// first sync renames thousands of files.
    staging: Option<OwnedFd>,
    staging_marked: bool,
    /// What the commit changed, to make durable at its end (module docs).
    pub durable: Durable,
    /// The destination and those of its ancestors that `CreateRoot` made.
    pub created: Vec<PathBuf>,
    /// The staged files are already in their places in `dest`, and so are
    /// the directories holding them: a first sync's standby, built by the
    /// downloads themselves (`stage.rs`, docs/internals.md#the-switch).
    pub in_place: bool,
    /// A standby's trash ([`super::Standby::trash`]) and how many files
    /// went there: a file the plan replaces is renamed there first, so
    /// its blocks are not freed in this run.
    pub trash: Option<(OwnedFd, u64)>,
    /// With `in_place`: the directories [`premake`] made with their
    /// planned mode, for `Mkdir` only to open.
    pub premade: Option<&'a HashSet<RelPath>>,
    /// With `in_place`: the standby's filesystem is synced whole
    /// ([`Durable::syncs_whole`]), so a premade directory or a file
    /// downloaded in place leaves the commit nothing to do.
    pub synced_whole: bool,
}

impl<'a> Dirs<'a> {
    /// Nothing open yet; staged files come from `staged_in`'s staging
    /// directory, and what is already in `durable` is synced with the rest.
    pub fn new(dest: &'a Path, staged_in: &'a Path, durable: Durable) -> Dirs<'a> {
        Dirs {
            dest,
            staged_in,
            root: None,
            chain: Vec::new(),
            root_marked: false,
            staging: None,
            staging_marked: false,
            durable,
            created: Vec::new(),
            in_place: false,
            trash: None,
            premade: None,
            synced_whole: false,
        }
    }

    /// The root, opened on first use (it may be created by the plan's
    /// first step).
    pub fn root(&mut self) -> Result<BorrowedFd<'_>, CommitError> {
        let dest = self.dest;
        let fd: &OwnedFd = match &mut self.root {
            Some(fd) => fd,
            slot @ None => slot.insert(
                rustix::fs::open(dest, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty())
                    .map_err(CommitError::io("open", dest.to_owned()))?,
            ),
        };
        Ok(fd.as_fd())
    }

    /// Opens the directory `rel_dir` component by component without
    /// following links, reusing the chain's common prefix; returns its
    /// depth (0: the root). See [`Dirs::fd`].
    pub fn open(&mut self, rel_dir: &RelPath) -> Result<usize, CommitError> {
        let names: Vec<&str> = rel_dir.segments().collect();
        self.root()?;
        let keep = self.common(&names);
        self.chain.truncate(keep);
        for (i, name) in names.iter().enumerate().skip(keep) {
            let parent = self.fd(i);
            let fd = match rustix::fs::openat(parent, *name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => {
                    let path = self.dest.join(names[..=i].join("/"));
                    return Err(not_a_dir(parent, OsStr::new(name), path, e));
                }
            };
            self.chain.push(((*name).to_owned(), fd, false));
        }
        Ok(names.len())
    }

    /// How many of `names` the open chain already holds.
    fn common(&self, names: &[&str]) -> usize {
        self.chain
            .iter()
            .zip(names)
            .take_while(|((have, _, _), want)| have == *want)
            .count()
    }

    /// The descriptor of the chain at `depth` (0: the root); valid after
    /// [`Dirs::open`] returned at least that depth.
    pub fn fd(&self, depth: usize) -> BorrowedFd<'_> {
        match depth.checked_sub(1).and_then(|i| self.chain.get(i)) {
            Some((_, fd, _)) => fd.as_fd(),
            None => self
                .root
                .as_ref()
                .expect("the root is opened by Dirs::open before any depth")
                .as_fd(),
        }
    }

    /// Marks the open directory at `depth` (`rel_dir`, for messages) as
    /// changed: it is made durable at the end of the commit.
    pub fn changed(&mut self, depth: usize, rel_dir: &RelPath) {
        let (fd, marked) = match depth.checked_sub(1).and_then(|i| self.chain.get_mut(i)) {
            Some(entry) => (entry.1.as_fd(), &mut entry.2),
            None => match &self.root {
                Some(root) => (root.as_fd(), &mut self.root_marked),
                None => return,
            },
        };
        if std::mem::replace(marked, true) {
            return;
        }
        let path = path_of(self.dest, rel_dir);
        if let Err(e) = self.durable.add(fd, Need::All, &path) {
            tracing::warn!(dir = %path.display(), error = %e, "cannot keep a directory to sync");
        }
    }

    /// Marks the open entry `fd` (`rel`) as changed.
    pub fn changed_entry(&mut self, fd: BorrowedFd<'_>, rel: &RelPath) {
        let path = path_of(self.dest, rel);
        if let Err(e) = self.durable.add(fd, Need::All, &path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep an entry to sync");
        }
    }

    /// The parent directory of `rel`, opened; returns its depth and
    /// `rel`'s last name.
    pub fn parent_of<'r>(&mut self, rel: &'r RelPath) -> Result<(usize, &'r OsStr), CommitError> {
        self.parent(rel, false)
    }

    /// [`Dirs::parent_of`], with the parent marked changed: an entry of it
    /// is about to be made, replaced or removed.
    pub fn parent_changed<'r>(
        &mut self,
        rel: &'r RelPath,
    ) -> Result<(usize, &'r OsStr), CommitError> {
        self.parent(rel, true)
    }

    fn parent<'r>(
        &mut self,
        rel: &'r RelPath,
        mark: bool,
    ) -> Result<(usize, &'r OsStr), CommitError> {
        let (Some(name), Some(parent)) = (rel.file_name(), rel.parent()) else {
            return Err(CommitError::NoName(path_of(self.dest, rel)));
        };
        let depth = self.open(&parent)?;
        if mark {
            self.changed(depth, &parent);
        }
        Ok((depth, OsStr::new(name)))
    }

    /// Drops `rel` (and what was opened below it) from the chain: it is
    /// about to be removed or replaced.
    pub fn forget(&mut self, rel: &RelPath) {
        let names: Vec<&str> = rel.segments().collect();
        let common = self.common(&names);
        if common == names.len() {
            self.chain.truncate(common.saturating_sub(1));
        }
    }

    /// Keeps `fd`, the directory `name` just made at `depth`, as the
    /// chain's next component when the chain ends at `depth`.
    pub fn made(&mut self, depth: usize, name: &str, fd: OwnedFd) {
        if self.chain.len() == depth {
            self.chain.push((name.to_owned(), fd, true));
        }
    }

    /// Opens `<staged_in>/.pluginsync-staging` without following a link, and
    /// marks it changed (`staged`, for messages: a staged file in it). See
    /// [`Dirs::staging_fd`].
    pub fn staging(&mut self, staged: &Path) -> Result<(), CommitError> {
        if self.staging.is_none() {
            let path = self.staged_in.join(STAGING_DIR);
            let fd = if self.staged_in == self.dest {
                let root = self.root()?;
                rustix::fs::openat(root, STAGING_DIR, DIR_FLAGS, Mode::empty())
            } else {
                let live = rustix::fs::open(
                    self.staged_in,
                    DIR_FLAGS.difference(OFlags::NOFOLLOW),
                    Mode::empty(),
                )
                .map_err(CommitError::io("open", self.staged_in.to_owned()))?;
                rustix::fs::openat(live, STAGING_DIR, DIR_FLAGS, Mode::empty())
            }
            .map_err(CommitError::io("open", path))?;
            self.staging = Some(fd);
        }
        let Some(fd) = &self.staging else {
            unreachable!("opened above")
        };
        if !std::mem::replace(&mut self.staging_marked, true)
            && let Err(e) =
                self.durable
                    .add(fd.as_fd(), Need::All, staged.parent().unwrap_or(staged))
        {
            tracing::warn!(dir = %staged.display(), error = %e, "cannot keep a directory to sync");
        }
        Ok(())
    }

    /// Moves the entry `name` of the open directory at `depth` (a file
    /// about to be replaced) into the trash, if there is one and it is
    /// there; else leaves it for the rename to replace.
    pub fn move_to_trash(&mut self, depth: usize, name: &OsStr) {
        let Some((trash, n)) = self.trash.take() else {
            return;
        };
        let to = format!("{}.{}", std::process::id(), n + 1);
        match rustix::fs::renameat(self.fd(depth), name, &trash, to.as_str()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => tracing::debug!(error = %e, "not moved to the trash; replaced in place"),
        }
        self.trash = Some((trash, n + 1));
    }

    /// The staging directory; valid after [`Dirs::staging`] succeeded.
    pub fn staging_fd(&self) -> BorrowedFd<'_> {
        self.staging
            .as_ref()
            .expect("the staging directory is opened by Dirs::staging first")
            .as_fd()
    }
}

/// The error for a directory component that could not be opened: a
/// symlink and a non-directory are named as such.
fn not_a_dir(parent: BorrowedFd<'_>, name: &OsStr, path: PathBuf, e: Errno) -> CommitError {
    if (e == Errno::LOOP || e == Errno::NOTDIR)
        && let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
    {
        return if rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink() {
            CommitError::Symlink(path)
        } else {
            CommitError::NotADirectory(path)
        };
    }
    CommitError::Component {
        path,
        source: e.into(),
    }
}

/// Removes the entry `name` of `parent` without following a symlink: a
/// directory with its subtree (walked the same way), anything else
/// itself. Gone already is fine.
pub fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
    use rustix::fs::FileType;
    let st = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let result = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        // O_NOFOLLOW: a directory swapped for a link since the stat fails
        // here (ELOOP) instead of emptying the link's target.
        let dir = rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty())?;
        empty_dir(&dir)?;
        rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
    } else {
        rustix::fs::unlinkat(parent, name, AtFlags::empty())
    };
    match result {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes everything in the open directory `dir`.
pub fn empty_dir(dir: &OwnedFd) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    // Names first, removals after: a directory is not changed while it is
    // being read.
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_bytes().to_owned();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    for name in names {
        remove_entry(dir.as_fd(), OsStr::from_bytes(&name))?;
    }
    Ok(())
}

/// Opens the entry `name` of `parent` (never through a symlink) and sets
/// its mode to `mode & MODE_MASK`; returns it, open.
pub fn chmod_entry(parent: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::openat(parent, name, ENTRY_FLAGS, Mode::empty())?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & MODE_MASK))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn rp(rel: &str) -> RelPath {
        RelPath::parse(rel).unwrap()
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn premade_directories_get_their_planned_modes_except_those_their_owner_cannot_write() {
        let t = tempfile::tempdir().unwrap();
        let slot = t.path().join("next");
        std::fs::create_dir(&slot).unwrap();
        // A download got there first, with the umask's mode.
        std::fs::create_dir(slot.join("a")).unwrap();
        std::fs::set_permissions(slot.join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let dirs = vec![
            (rp("a"), 0o755),
            (rp("a/b"), 0o750),
            (rp("a/b/c"), 0o700),
            (rp("ro"), 0o555),
            (rp("ro/x"), 0o755),
        ];
        let made = premake(slot.clone(), dirs).unwrap().join().unwrap();
        for (rel, mode) in [
            ("a", 0o755),
            ("a/b", 0o750),
            ("a/b/c", 0o700),
            ("ro/x", 0o755),
        ] {
            assert_eq!(mode_of(&slot.join(rel)), mode, "{rel}");
            assert!(made.contains(&rp(rel)), "{rel}");
        }
        // Left to the commit, which sets its mode once the files are in:
        // made writable by its owner meanwhile.
        assert!(!made.contains(&rp("ro")));
        assert_eq!(mode_of(&slot.join("ro")), 0o700);
    }

    #[test]
    fn premaking_stops_at_a_symlink_and_leaves_everything_to_the_commit() {
        let t = tempfile::tempdir().unwrap();
        let slot = t.path().join("next");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&slot).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, slot.join("a")).unwrap();
        let dirs = vec![(rp("a"), 0o755), (rp("a/b"), 0o755)];
        let made = premake(slot, dirs).unwrap().join().unwrap();
        assert!(made.is_empty());
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
    }
}
