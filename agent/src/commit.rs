//! Commit: put verified downloads in place and purge, in the plan's order.
//!
//! Runs only after every download of the run has been verified and made
//! durable with its mode (`stage::seal`). Directories are made
//! parents-first, staged files are renamed over their targets (atomic: a
//! reader sees the old file or the new one, never half of either), modes
//! are fixed, then purges run. Each step that fails is recorded and the
//! others still run.
//!
//! **Durability** (`agent_durable`; BENCHMARKS.md#busy-node-busy-benchbusypy):
//! before [`commit`] returns —
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
//!
//! **No path is ever resolved through a link**
//! (`a_racing_user_never_redirects_the_commit`): a local
//! user who can rename inside the libdir must not be able to redirect a
//! write or a removal of this (root) process. Every step acts on a name
//! relative to a directory descriptor, and every descriptor is opened from
//! the destination's root down one component at a time with `O_NOFOLLOW`
//! ([`Dirs`]): `openat` (a component that is a symlink or not a directory
//! fails that step with ELOOP/ENOTDIR), `mkdirat`, `renameat` (staged file
//! in `<dest>/.pluginsync-staging` → its target, same filesystem),
//! `unlinkat`, and `fchmod` on an entry opened `O_NOFOLLOW`. A purged
//! directory is removed by walking it the same way: a symlink entry is
//! unlinked itself, never followed. The destination's own path is
//! configuration (trusted) and is opened as given.
//!
//! Before the first step, [`check_space`] makes sure the destination's
//! filesystem has the inodes and blocks the commit needs, so a full disk
//! refuses the whole commit instead of applying part of it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use pluginsync_common::fsutil::{Durable, Need};
use pluginsync_common::relpath::RelPath;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::catalog::FileResource;
use crate::listing::{MODE_MASK, STAGING_DIR};
use crate::plan::{Action, ChangeKind, Plan};

/// What a commit did.
#[derive(Debug, Default)]
pub struct Committed {
    /// Applied changes (relative path, kind).
    pub changes: Vec<(PathBuf, ChangeKind)>,
    /// Failed steps (relative path, one-line error).
    pub failures: Vec<(PathBuf, String)>,
    /// The regular files put in place (created or updated), in order: what
    /// the loaders see.
    pub written: Vec<RelPath>,
}

/// How every directory of the commit is opened: read-only (a descriptor
/// that `fsync` and `fchmod` accept), never through a symlink.
const DIR_FLAGS: OFlags = OFlags::RDONLY
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

/// The open directories of one commit: the destination's root and the
/// chain from it down to the directory of the last step.
///
/// Bounded: only the current chain is kept (at most the tree's depth in
/// descriptors). The plan's order (directories parents-first, then files
/// in listing order, removals deepest-first) visits a directory's entries
/// together, so a chain is mostly reused from one step to the next and
/// each directory is opened about once per phase, not once per file.
struct Dirs<'a> {
    /// The destination (for messages, and to open the root).
    dest: &'a Path,
    /// The destination itself, once open.
    root: Option<OwnedFd>,
    /// Below the root: (name, descriptor, marked changed) per component
    /// of the last directory looked up.
    chain: Vec<(std::ffi::OsString, OwnedFd, bool)>,
    /// Whether the root is marked changed.
    root_marked: bool,
    /// `<dest>/.pluginsync-staging`, once open, and whether it is marked
    /// changed. A directory is marked (an `fstat` into [`Durable`]) once
    /// per descriptor, not once per file renamed into or out of it: a
    /// first sync renames thousands of files.
    staging: Option<OwnedFd>,
    staging_marked: bool,
    /// What the commit changed, to make durable at its end (module docs).
    durable: Durable,
    /// The destination and those of its ancestors that `CreateRoot` made.
    created: Vec<PathBuf>,
}

/// The names of `rel`'s components; only plain names (a listing path).
fn names(rel: &Path) -> Result<Vec<&OsStr>, String> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(format!("'{}' is not a relative path", rel.display())),
        })
        .collect()
}

impl<'a> Dirs<'a> {
    fn new(dest: &'a Path) -> Dirs<'a> {
        Dirs {
            dest,
            root: None,
            chain: Vec::new(),
            root_marked: false,
            staging: None,
            staging_marked: false,
            durable: Durable::new(),
            created: Vec::new(),
        }
    }

    /// The root, opened on first use (it may be created by the plan's
    /// first step).
    fn root(&mut self) -> Result<BorrowedFd<'_>, String> {
        if self.root.is_none() {
            let fd = rustix::fs::open(
                self.dest,
                DIR_FLAGS.difference(OFlags::NOFOLLOW),
                Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "cannot open '{}': {}",
                    self.dest.display(),
                    std::io::Error::from(e)
                )
            })?;
            self.root = Some(fd);
        }
        Ok(self.root.as_ref().map(AsFd::as_fd).ok_or("no root")?)
    }

    /// Opens the directory `rel_dir` (relative to the root) component by
    /// component without following links, reusing the chain's common
    /// prefix; returns its depth (0: the root). See [`Dirs::fd`].
    fn open(&mut self, rel_dir: &Path) -> Result<usize, String> {
        let names = names(rel_dir)?;
        self.root()?;
        let keep = self
            .chain
            .iter()
            .zip(&names)
            .take_while(|((have, _, _), want)| have.as_os_str() == **want)
            .count();
        self.chain.truncate(keep);
        for (i, name) in names.iter().enumerate().skip(keep) {
            let parent = self.fd(i);
            let fd = match rustix::fs::openat(parent, *name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => {
                    let path = self.dest.join(names[..=i].iter().collect::<PathBuf>());
                    return Err(not_a_dir(parent, name, &path, e));
                }
            };
            self.chain.push(((*name).to_owned(), fd, false));
        }
        Ok(names.len())
    }

    /// The descriptor of the chain at `depth` (0: the root); valid after
    /// [`Dirs::open`] returned at least that depth.
    fn fd(&self, depth: usize) -> BorrowedFd<'_> {
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
    fn changed(&mut self, depth: usize, rel_dir: &Path) {
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
        let path = self.dest.join(rel_dir);
        if let Err(e) = self.durable.add(fd, Need::All, &path) {
            tracing::warn!(dir = %path.display(), error = %e, "cannot keep a directory to sync");
        }
    }

    /// Marks the open entry `fd` (`rel`) as changed.
    fn changed_entry(&mut self, fd: BorrowedFd<'_>, rel: &Path) {
        let path = self.dest.join(rel);
        if let Err(e) = self.durable.add(fd, Need::All, &path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep an entry to sync");
        }
    }

    /// The parent directory of `rel`, opened; returns its depth and `rel`'s
    /// last name.
    fn parent_of<'r>(&mut self, rel: &'r Path) -> Result<(usize, &'r OsStr), String> {
        let name = rel
            .file_name()
            .ok_or_else(|| format!("'{}' has no name", rel.display()))?;
        let depth = self.open(rel.parent().unwrap_or(Path::new("")))?;
        Ok((depth, name))
    }

    /// Drops `rel` (and what was opened below it) from the chain: it is
    /// about to be removed or replaced.
    fn forget(&mut self, rel: &Path) {
        let Ok(names) = names(rel) else { return };
        let common = self
            .chain
            .iter()
            .zip(&names)
            .take_while(|((have, _, _), want)| have.as_os_str() == **want)
            .count();
        if common == names.len() {
            self.chain.truncate(common.saturating_sub(1));
        }
    }

    /// `<dest>/.pluginsync-staging`, opened without following a link.
    fn staging(&mut self) -> Result<BorrowedFd<'_>, String> {
        if self.staging.is_none() {
            let root = self.root()?;
            let fd =
                rustix::fs::openat(root, STAGING_DIR, DIR_FLAGS, Mode::empty()).map_err(|e| {
                    format!(
                        "cannot open '{}': {}",
                        self.dest.join(STAGING_DIR).display(),
                        std::io::Error::from(e)
                    )
                })?;
            self.staging = Some(fd);
        }
        Ok(self.staging.as_ref().map(AsFd::as_fd).ok_or("no staging")?)
    }
}

/// The message for a directory component that could not be opened: a
/// symlink and a non-directory are named as such.
fn not_a_dir(parent: BorrowedFd<'_>, name: &OsStr, path: &Path, e: Errno) -> String {
    if (e == Errno::LOOP || e == Errno::NOTDIR)
        && let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
    {
        return if rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink() {
            format!(
                "'{}' is a symlink; refusing to go through it",
                path.display()
            )
        } else {
            format!("'{}' is not a directory", path.display())
        };
    }
    format!("'{}': {}", path.display(), std::io::Error::from(e))
}

/// Removes the entry `name` of `parent` without following a symlink: a
/// directory with its subtree (walked the same way), anything else
/// itself. Gone already is fine.
fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
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
fn empty_dir(dir: &OwnedFd) -> std::io::Result<()> {
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
fn chmod_entry(parent: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::openat(parent, name, ENTRY_FLAGS, Mode::empty())?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & MODE_MASK))?;
    Ok(fd)
}

/// One step; the error is its one line.
fn apply(
    dirs: &mut Dirs<'_>,
    action: &Action,
    staged: &HashMap<PathBuf, PathBuf>,
    resource: &FileResource,
) -> Result<(), String> {
    let dest = dirs.dest;
    let io = |what: &str, rel: &Path| {
        let (what, p) = (what.to_owned(), dest.join(rel).display().to_string());
        move |e: Errno| format!("cannot {what} '{p}': {}", std::io::Error::from(e))
    };
    match action {
        Action::CreateRoot { mode } => {
            let mut p = dest;
            while !p.exists() {
                dirs.created.push(p.to_owned());
                match p.parent() {
                    Some(parent) => p = parent,
                    None => break,
                }
            }
            std::fs::create_dir_all(dest)
                .map_err(|e| format!("cannot create '{}': {e}", dest.display()))?;
            dirs.root()?;
            dirs.changed(0, Path::new(""));
            rustix::fs::fchmod(dirs.root()?, Mode::from_raw_mode(mode & MODE_MASK))
                .map_err(io("chmod", Path::new("")))
        }
        Action::ChmodRoot { mode } => {
            dirs.root()?;
            dirs.changed(0, Path::new(""));
            rustix::fs::fchmod(dirs.root()?, Mode::from_raw_mode(mode & MODE_MASK))
                .map_err(io("chmod", Path::new("")))
        }
        Action::Mkdir { rel, mode, replace } => {
            let (depth, name) = dirs.parent_of(rel)?;
            dirs.changed(depth, rel.parent().unwrap_or(Path::new("")));
            if *replace {
                if !resource.force {
                    return Err(format!(
                        "'{}' is in the way and force is off",
                        dest.join(rel).display()
                    ));
                }
                dirs.forget(rel);
                remove_entry(dirs.fd(depth), name)
                    .map_err(|e| format!("cannot remove '{}': {e}", dest.join(rel).display()))?;
            }
            let parent = dirs.fd(depth);
            rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode & MODE_MASK))
                .map_err(io("create", rel))?;
            // mkdir's mode went through the umask: set it exactly, on the
            // directory just made (opened without following a link).
            let fd = rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty())
                .map_err(io("open", rel))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & MODE_MASK))
                .map_err(io("chmod", rel))?;
            dirs.changed_entry(fd.as_fd(), rel);
            if dirs.chain.len() == depth {
                dirs.chain.push((name.to_owned(), fd, true));
            }
            Ok(())
        }
        // The staged file has its mode already (stage::seal).
        Action::Write {
            rel, replace_dir, ..
        } => {
            let tmp = staged.get(rel).ok_or_else(|| {
                format!("no verified download for '{}'", dest.join(rel).display())
            })?;
            let tmp_name = match (tmp.parent(), tmp.file_name()) {
                (Some(dir), Some(name)) if dir == dest.join(STAGING_DIR) => name,
                _ => return Err(format!("'{}' is not a staged file", tmp.display())),
            };
            let (depth, name) = dirs.parent_of(rel)?;
            dirs.changed(depth, rel.parent().unwrap_or(Path::new("")));
            if *replace_dir {
                if !resource.force {
                    return Err(format!(
                        "a directory is in the way at '{}' and force is off",
                        dest.join(rel).display()
                    ));
                }
                dirs.forget(rel);
                remove_entry(dirs.fd(depth), name)
                    .map_err(|e| format!("cannot remove '{}': {e}", dest.join(rel).display()))?;
            }
            dirs.staging()?;
            let staging = dirs.staging.as_ref().ok_or("no staging")?.as_fd();
            if !std::mem::replace(&mut dirs.staging_marked, true)
                && let Err(e) = dirs
                    .durable
                    .add(staging, Need::All, tmp.parent().unwrap_or(tmp))
            {
                tracing::warn!(dir = %tmp.display(), error = %e, "cannot keep a directory to sync");
            }
            // renameat(2) replaces a file or a symlink itself, never a
            // link's target.
            rustix::fs::renameat(staging, tmp_name, dirs.fd(depth), name)
                .map_err(io("rename into", rel))
        }
        Action::Chmod { rel, mode } => {
            let (depth, name) = dirs.parent_of(rel)?;
            let fd = chmod_entry(dirs.fd(depth), name, *mode).map_err(|e| {
                if e == Errno::LOOP {
                    format!(
                        "'{}' became a symlink; not changing its mode",
                        dest.join(rel).display()
                    )
                } else {
                    io("chmod", rel)(e)
                }
            })?;
            dirs.changed_entry(fd.as_fd(), rel);
            Ok(())
        }
        Action::Remove { rel, .. } => {
            if !resource.purge {
                return Ok(());
            }
            let (depth, name) = dirs.parent_of(rel)?;
            dirs.changed(depth, rel.parent().unwrap_or(Path::new("")));
            dirs.forget(rel);
            remove_entry(dirs.fd(depth), name)
                .map_err(|e| format!("cannot remove '{}': {e}", dest.join(rel).display()))
        }
    }
}

/// Applies `plan` to `dest` and makes it durable; see the module docs.
/// `staged`: relative path → staged file, durable with its mode already;
/// `created`: the destination directories its staging made (deepest
/// first), whose entries are made durable too.
pub fn commit(
    dest: &Path,
    plan: &Plan,
    staged: &HashMap<PathBuf, PathBuf>,
    created: &[PathBuf],
    resource: &FileResource,
) -> Committed {
    let mut out = Committed::default();
    let mut dirs = Dirs::new(dest);
    for action in &plan.actions {
        match apply(&mut dirs, action, staged, resource) {
            Ok(()) => {
                if let Action::Write { rel, .. } = action {
                    // Planned from the listing's relative paths: always one.
                    match rel.to_str().map(RelPath::parse) {
                        Some(Ok(rel)) => out.written.push(rel),
                        _ => {
                            tracing::warn!(path = %rel.display(), "written path is not a listing path")
                        }
                    }
                }
                if let Some((rel, kind)) = action.change() {
                    tracing::trace!(path = %rel.display(), change = kind.as_str(), "committed");
                    if kind != ChangeKind::Removed || resource.purge {
                        out.changes.push((rel.to_owned(), kind));
                    }
                }
            }
            Err(e) => {
                let rel = action
                    .change()
                    .map(|(r, _)| r.to_owned())
                    .unwrap_or_default();
                // Printed once for the run (output.rs); every one is in the
                // report.
                tracing::debug!(path = %dest.join(&rel).display(), error = %e, "change failed");
                out.failures.push((rel, e));
            }
        }
    }
    make_durable(dirs, created);
    out
}

/// Makes what the commit changed durable (module docs): the directories
/// and entries marked while it ran, plus each directory made for the
/// destination and the parent that holds its entry (trusted paths: the
/// destination and its ancestors are configuration).
fn make_durable(dirs: Dirs<'_>, created: &[PathBuf]) {
    let mut durable = dirs.durable;
    for dir in created.iter().chain(&dirs.created) {
        for p in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
            if let Err(e) = durable.add_path(p, Need::All) {
                tracing::warn!(dir = %p.display(), error = %e, "cannot open a directory to sync");
            }
        }
    }
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

/// The destination's filesystem cannot hold what the commit must create;
/// checked before the commit's first step ([`check_space`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough room for the commit in '{}': {short} {what} short ({free} free, {needed} needed for {dirs} new directories); nothing was changed",
    dest.display()
)]
pub struct SpaceError {
    /// The (first) destination on that filesystem.
    pub dest: PathBuf,
    /// `inodes` or `blocks`.
    pub what: &'static str,
    /// How many the commit needs, margin included.
    pub needed: u64,
    /// How many are free (for this process: root may use the reserve).
    pub free: u64,
    /// `needed - free`.
    pub short: u64,
    /// New directories the commit makes there.
    pub dirs: u64,
}

/// What the commits on one filesystem need.
struct Needs {
    dest: PathBuf,
    dirs: u64,
    names: u64,
    vfs: Option<rustix::fs::StatVfs>,
}

/// Checks, before anything changes, that each destination's filesystem
/// has the inodes and blocks its commit needs
/// (`a_destination_out_of_inodes_is_refused_before_the_commit`). What the commit allocates:
/// - staged files are already allocated (same filesystem): their rename
///   needs nothing, and one over an old file frees the old;
/// - a new directory needs an inode and a block (`f_bsize`);
/// - a new name in a directory may grow it: 64 bytes per created name,
///   rounded up to blocks;
/// - plus a margin of 1% and one, for whatever else writes there meanwhile.
///
/// Destinations on one filesystem are summed. A filesystem that reports no
/// inode (or block) counts (`f_files == 0`, as btrfs) is not checked for
/// them. `statvfs` failing skips the check: the commit then reports its own
/// errors.
pub fn check_space<'p>(
    commits: impl IntoIterator<Item = (&'p Path, &'p Plan)>,
) -> Result<(), SpaceError> {
    let root = rustix::process::geteuid().is_root();
    let mut by_fs: Vec<Needs> = Vec::new();
    for (dest, plan) in commits {
        let (mut dirs, mut names) = (0u64, 0u64);
        for a in &plan.actions {
            match a {
                Action::CreateRoot { .. } | Action::Mkdir { .. } => {
                    dirs += 1;
                    names += 1;
                }
                Action::Write {
                    change: ChangeKind::Created,
                    ..
                } => names += 1,
                _ => {}
            }
        }
        if dirs == 0 && names == 0 {
            continue;
        }
        // The destination, or its nearest existing ancestor (a first sync).
        let Some(vfs) = dest.ancestors().find_map(|p| rustix::fs::statvfs(p).ok()) else {
            continue;
        };
        match by_fs
            .iter_mut()
            .find(|n| n.vfs.as_ref().is_some_and(|v| v.f_fsid == vfs.f_fsid))
        {
            Some(n) => {
                n.dirs += dirs;
                n.names += names;
            }
            None => by_fs.push(Needs {
                dest: dest.to_owned(),
                dirs,
                names,
                vfs: Some(vfs),
            }),
        }
    }
    for n in by_fs {
        let Some(v) = n.vfs else { continue };
        let margin = |x: u64| if x == 0 { 0 } else { x + x / 100 + 1 };
        let frsize = v.f_frsize.max(1);
        let per_dir = v.f_bsize.max(frsize).div_ceil(frsize);
        let inodes = margin(n.dirs);
        let blocks = margin(n.dirs * per_dir + (n.names * 64).div_ceil(frsize));
        let (free_inodes, free_blocks) = if root {
            (v.f_ffree, v.f_bfree)
        } else {
            (v.f_favail, v.f_bavail)
        };
        let short = |what, needed: u64, free: u64, reported: bool| {
            (reported && needed > free).then(|| SpaceError {
                dest: n.dest.clone(),
                what,
                needed,
                free,
                short: needed - free,
                dirs: n.dirs,
            })
        };
        if let Some(e) = short("inodes", inodes, free_inodes, v.f_files > 0)
            .or_else(|| short("blocks", blocks, free_blocks, v.f_blocks > 0))
        {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SourcePermissions;
    use pluginsync_common::metadata::Links;

    fn resource(dest: &Path) -> FileResource {
        FileResource {
            path: dest.to_owned(),
            mount: pluginsync_common::protocol::Mount::Plugins,
            purge: true,
            force: true,
            backup: false,
            links: Links::Follow,
            ignore: pluginsync_common::ignore::IgnoreSet::empty(),
            source_permissions: SourcePermissions::Use,
        }
    }

    fn write(rel: &str) -> Action {
        Action::Write {
            rel: rel.into(),
            sha256: String::new(),
            mode: 0o644,
            change: ChangeKind::Created,
            replace_dir: false,
        }
    }

    /// Stages `rels` as files named after them in `staging`.
    fn staged(staging: &Path, rels: &[&str]) -> HashMap<PathBuf, PathBuf> {
        std::fs::create_dir_all(staging).unwrap();
        rels.iter()
            .enumerate()
            .map(|(i, rel)| {
                let tmp = staging.join(i.to_string());
                std::fs::write(&tmp, rel).unwrap();
                (PathBuf::from(rel), tmp)
            })
            .collect()
    }

    #[test]
    fn a_symlink_planted_in_place_of_a_directory_is_never_gone_through() {
        let tmp = tempfile::tempdir().unwrap();
        let (dest, outside) = (tmp.path().join("lib"), tmp.path().join("outside"));
        std::fs::create_dir_all(dest.join("a/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        // Planned while a/b was a directory; swapped for a link since.
        std::fs::remove_dir(dest.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("a/b")).unwrap();
        let files = staged(
            &dest.join(STAGING_DIR),
            &["a/one.rb", "a/b/two.rb", "a/b/c/three.rb"],
        );
        let plan = Plan {
            actions: vec![
                write("a/one.rb"),
                write("a/b/two.rb"),
                write("a/b/c/three.rb"),
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &files, &[], &resource(&dest));
        assert_eq!(
            done.changes,
            vec![(PathBuf::from("a/one.rb"), ChangeKind::Created)]
        );
        let failed: Vec<_> = done
            .failures
            .iter()
            .map(|(p, _)| p.to_str().unwrap())
            .collect();
        assert_eq!(failed, ["a/b/two.rb", "a/b/c/three.rb"]);
        assert!(
            done.failures[0]
                .1
                .contains("is a symlink; refusing to go through it"),
            "{:?}",
            done.failures
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote through the link"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("a/one.rb")).unwrap(),
            "a/one.rb"
        );
        assert_eq!(done.written, vec![RelPath::parse("a/one.rb").unwrap()]);
    }

    #[test]
    fn a_directory_removed_during_the_commit_is_checked_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("lib");
        std::fs::create_dir_all(dest.join("d")).unwrap();
        let files = staged(&dest.join(STAGING_DIR), &["d/x.rb", "d", "d/y.rb"]);
        // d is checked (as the parent of d/x.rb), then replaced by a file:
        // what is below it must fail on "not a directory", not be trusted.
        let plan = Plan {
            actions: vec![
                write("d/x.rb"),
                Action::Write {
                    rel: "d".into(),
                    sha256: String::new(),
                    mode: 0o644,
                    change: ChangeKind::Updated,
                    replace_dir: true,
                },
                write("d/y.rb"),
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &files, &[], &resource(&dest));
        assert_eq!(done.failures.len(), 1, "{:?}", done.failures);
        assert_eq!(done.failures[0].0, PathBuf::from("d/y.rb"));
        assert!(
            done.failures[0].1.contains("is not a directory"),
            "{:?}",
            done.failures
        );
        assert_eq!(std::fs::read_to_string(dest.join("d")).unwrap(), "d");
    }

    #[test]
    fn purge_and_chmod_never_follow_a_symlink_out_of_the_destination() {
        let tmp = tempfile::tempdir().unwrap();
        let (dest, outside) = (tmp.path().join("lib"), tmp.path().join("outside"));
        std::fs::create_dir_all(dest.join("gone/deeper")).unwrap();
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("keep.rb"), "keep").unwrap();
        std::fs::write(outside.join("sub/keep.rb"), "keep").unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("gone/link")).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("gone/deeper/link")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep.rb"), dest.join("x.rb")).unwrap();
        let plan = Plan {
            actions: vec![
                Action::Chmod {
                    rel: "x.rb".into(),
                    mode: 0o700,
                },
                Action::Remove {
                    rel: "gone".into(),
                    dir: true,
                },
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &HashMap::new(), &[], &resource(&dest));
        assert_eq!(done.failures.len(), 1, "{:?}", done.failures);
        assert!(
            done.failures[0].1.contains("became a symlink"),
            "{:?}",
            done.failures
        );
        assert_eq!(
            done.changes,
            vec![(PathBuf::from("gone"), ChangeKind::Removed)]
        );
        assert!(!dest.join("gone").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/keep.rb")).unwrap(),
            "keep"
        );
        let mode = std::fs::metadata(outside.join("keep.rb"))
            .unwrap()
            .permissions();
        assert_ne!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }
}
