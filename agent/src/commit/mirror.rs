//! The mirror: a standby tree made equal to a source tree (the live one
//! before a switch, docs/internals.md#the-switch), writing only what
//! differs, or (for `rollback`) only listing what differs.
//!
//! Both trees are walked together, one directory at a time, every entry
//! opened or stat'ed relative to its directory's descriptor without
//! following a link (as the commit, `commit.rs`, module docs): a symlink
//! in the source is copied as a symlink, never gone through. What counts
//! as equal, without reading content (docs/internals.md#what-the-switch-trusts):
//! the same kind, permission bits and owner, and for a regular file the
//! same size and modification time (a copy keeps its source's mtime,
//! `futimens`), for a symlink the same target. A file that differs is
//! copied into a **new inode** (`copy_file_range` through `std::io::copy`),
//! never hard-linked: no write or `chmod` on one generation can reach
//! another. FIFOs, sockets and devices are not copied.
//!
//! Every file written and every directory whose entries or mode changed
//! goes into a [`Durable`] set the caller syncs before the switch.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pluginsync_common::fsutil::{Durable, Need};
use pluginsync_common::relpath::RelPath;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, Timespec, Timestamps};
use rustix::io::Errno;

use super::dirs::{DIR_FLAGS, remove_entry};
use crate::listing::STAGING_DIR;
use crate::plan::ChangeKind;
use crate::scan::LocalName;

/// A mirror step failed; the standby is unusable until a mirror succeeds.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} '{}': {source}", path.display())]
pub struct MirrorError {
    /// What was being done.
    pub what: &'static str,
    /// On what (in the tree being written or read).
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

/// One walk of a source tree and a target tree.
pub struct Mirror<'a> {
    /// Write (`true`) or only list the differences.
    apply: bool,
    /// Relative paths the caller writes or removes itself afterwards (a
    /// plan's downloads and purges): not copied, their place cleared.
    skip: &'a HashSet<&'a str>,
    /// The target's root, for messages.
    target: &'a Path,
    /// What the target's walk found different (relative path, what
    /// making it equal to the source does), in walk order.
    pub diffs: Vec<(LocalName, ChangeKind)>,
    /// Everything written, to make durable.
    pub durable: Durable,
    /// A directory of the source on another filesystem than its root (a
    /// mount point below it), not walked: the trees cannot be exchanged.
    pub crossed: Option<LocalName>,
    /// The source root's device.
    dev: u64,
}

/// How a file of the source is opened to be copied: never through a link,
/// never blocking on a FIFO swapped in.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// The names in the open directory `dir`, `.` and `..` left out.
fn names(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>, Errno> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_bytes().to_owned();
        if name != b"." && name != b".." {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// The root of both trees.
fn root() -> LocalName {
    LocalName::Rel(RelPath::root())
}

/// Same permission bits and owner.
fn same_meta(a: &Stat, b: &Stat) -> bool {
    a.st_mode & 0o7777 == b.st_mode & 0o7777 && a.st_uid == b.st_uid && a.st_gid == b.st_gid
}

/// The quick check of a regular file (module docs).
fn same_file(a: &Stat, b: &Stat) -> bool {
    same_meta(a, b)
        && a.st_size == b.st_size
        && a.st_mtime == b.st_mtime
        && a.st_mtime_nsec == b.st_mtime_nsec
}

impl<'a> Mirror<'a> {
    /// A walk writing into `target` (`apply`) or only comparing with it.
    pub fn new(target: &'a Path, skip: &'a HashSet<&'a str>, apply: bool) -> Mirror<'a> {
        Mirror {
            apply,
            skip,
            target,
            diffs: Vec::new(),
            durable: Durable::new(),
            crossed: None,
            dev: 0,
        }
    }

    fn err(&self, what: &'static str, rel: &LocalName) -> impl FnOnce(Errno) -> MirrorError {
        let path = rel.to_path(self.target);
        move |e| MirrorError {
            what,
            path,
            source: e.into(),
        }
    }

    /// Walks `source` (opened as given: configuration) against `target`
    /// (opened as given); the target's root gets the source root's mode.
    pub fn run(&mut self, source: &Path, target: &Path) -> Result<(), MirrorError> {
        let open = |p: &Path| {
            rustix::fs::open(p, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty()).map_err(
                |e| MirrorError {
                    what: "open",
                    path: p.to_owned(),
                    source: e.into(),
                },
            )
        };
        let (src, dst) = (open(source)?, open(target)?);
        let top = root();
        let (ss, ds) = (
            rustix::fs::fstat(&src).map_err(self.err("stat", &top))?,
            rustix::fs::fstat(&dst).map_err(self.err("stat", &top))?,
        );
        self.dev = ss.st_dev;
        if !same_meta(&ss, &ds) {
            self.diffs.push((root(), ChangeKind::Mode));
            if self.apply {
                self.set_meta(dst.as_fd(), &ss, &top)?;
            }
        }
        if self.dir(src.as_fd(), Some(dst.as_fd()), &top)? && self.apply {
            self.keep(dst.as_fd(), &top);
        }
        Ok(())
    }

    /// Like [`Mirror::run`], for `paths` alone (parents first): the rest
    /// of `target` is known to equal `source` already (a previous
    /// generation, docs/internals.md#the-switch). A path whose parent
    /// either tree lacks is an error: the caller walks everything then.
    pub fn run_paths(
        &mut self,
        source: &Path,
        target: &Path,
        paths: &[RelPath],
    ) -> Result<(), MirrorError> {
        let open_root =
            |p: &Path| rustix::fs::open(p, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty());
        let top = root();
        let (src, dst) = (
            open_root(source).map_err(self.err("open", &top))?,
            open_root(target).map_err(self.err("open", &top))?,
        );
        let ss = rustix::fs::fstat(&src).map_err(self.err("stat", &top))?;
        self.dev = ss.st_dev;
        let mut paths: Vec<&RelPath> = paths.iter().filter(|p| !p.is_root()).collect();
        paths.sort();
        paths.dedup();
        // Sorted, so siblings come together: their parents are opened
        // once (a sibling can remove or replace only itself).
        let mut last: Option<(LocalName, OwnedFd, OwnedFd)> = None;
        for rel in paths {
            let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
                continue;
            };
            if let Some((p, sp, dp)) = &last
                && matches!(p, LocalName::Rel(p) if *p == parent)
            {
                let (sp, dp) = (sp.as_fd(), dp.as_fd());
                if self.one(sp, dp, rel, name)? {
                    self.keep(dp, p);
                }
                continue;
            }
            last = None;
            let open = |fd: &OwnedFd, parent: &RelPath| -> Result<OwnedFd, Errno> {
                let mut cur = rustix::fs::openat(fd, ".", DIR_FLAGS, Mode::empty())?;
                for seg in parent.segments() {
                    cur = rustix::fs::openat(&cur, seg, DIR_FLAGS, Mode::empty())?;
                }
                Ok(cur)
            };
            let sp = match open(&src, &parent) {
                Ok(fd) => fd,
                // Gone from the source with its parent: the parent's own
                // path removed it from the target.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(self.err("open", &LocalName::Rel(parent))(e)),
            };
            let dp = open(&dst, &parent);
            let parent = LocalName::Rel(parent);
            let dp = dp.map_err(self.err("open", &parent))?;
            if self.one(sp.as_fd(), dp.as_fd(), rel, name)? {
                self.keep(dp.as_fd(), &parent);
            }
            last = Some((parent, sp, dp));
        }
        let ds = rustix::fs::fstat(&dst).map_err(self.err("stat", &top))?;
        if !same_meta(&ss, &ds) {
            self.diffs.push((top.clone(), ChangeKind::Mode));
            self.set_meta(dst.as_fd(), &ss, &top)?;
        }
        Ok(())
    }

    /// One path of [`Mirror::run_paths`], `name` in the open parents `sp`
    /// (source) and `dp` (target); returns whether the target parent's
    /// entries changed.
    fn one(
        &mut self,
        sp: BorrowedFd<'_>,
        dp: BorrowedFd<'_>,
        rel: &RelPath,
        name: &str,
    ) -> Result<bool, MirrorError> {
        let at = |fd: BorrowedFd<'_>| rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW);
        if matches!(at(sp), Err(Errno::NOENT)) {
            // The source has no such entry: neither may the target.
            let there = at(dp).is_ok();
            if there {
                let rel = LocalName::Rel(rel.clone());
                self.remove(dp, OsStr::new(name), &rel)?;
                self.diffs.push((rel, ChangeKind::Removed));
            }
            Ok(there)
        } else {
            self.entry(sp, Some(dp), LocalName::Rel(rel.clone()), name.as_bytes())
        }
    }

    /// Adds `fd` (`rel`) to the durable set.
    fn keep(&mut self, fd: BorrowedFd<'_>, rel: &LocalName) {
        let path = rel.to_path(self.target);
        if let Err(e) = self.durable.add(fd, Need::All, &path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep an entry to sync");
        }
    }

    /// Gives the open `fd` the mode (and, as root, the owner) of `like`.
    fn set_meta(
        &mut self,
        fd: BorrowedFd<'_>,
        like: &Stat,
        rel: &LocalName,
    ) -> Result<(), MirrorError> {
        // Only another owner than the copy's is given (it takes CAP_CHOWN,
        // which the packaged unit does not grant: then the copy stays
        // ours), and set-id bits only where they may be set (the unit's
        // RestrictSUIDSGID): the quick check compares them again.
        let mine = rustix::fs::fstat(fd).map_err(self.err("stat", rel))?;
        if (mine.st_uid, mine.st_gid) != (like.st_uid, like.st_gid) {
            let (uid, gid) = (
                rustix::fs::Uid::from_raw(like.st_uid),
                rustix::fs::Gid::from_raw(like.st_gid),
            );
            if let Err(e) = rustix::fs::fchown(fd, Some(uid), Some(gid)) {
                tracing::debug!(path = %rel.to_path(self.target).display(), error = %e, "owner not copied");
            }
        }
        let mode = |bits: u32| Mode::from_raw_mode(like.st_mode & bits);
        rustix::fs::fchmod(fd, mode(0o7777))
            .or_else(|_| rustix::fs::fchmod(fd, mode(0o777)))
            .map_err(self.err("chmod", rel))?;
        self.keep(fd, rel);
        Ok(())
    }

    /// One directory of both trees (`dst`: `None` when the target has
    /// none there, listing only); returns whether the target directory's
    /// entries changed.
    fn dir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: Option<BorrowedFd<'_>>,
        rel: &LocalName,
    ) -> Result<bool, MirrorError> {
        let at_root = matches!(rel, LocalName::Rel(r) if r.is_root());
        let mut src_names = names(src).map_err(self.err("read", rel))?;
        if at_root {
            src_names.retain(|n| n != STAGING_DIR.as_bytes());
        }
        let mut changed = false;
        if let Some(dst) = dst {
            let wanted: HashSet<&[u8]> = src_names.iter().map(Vec::as_slice).collect();
            for name in names(dst).map_err(self.err("read", rel))? {
                if wanted.contains(name.as_slice()) {
                    continue;
                }
                let rel_n = rel.child(OsStr::from_bytes(&name));
                if self.apply {
                    remove_entry(dst, OsStr::from_bytes(&name)).map_err(|source| MirrorError {
                        what: "remove",
                        path: rel_n.to_path(self.target),
                        source,
                    })?;
                    changed = true;
                }
                // The staging directory a switch carried along is no entry
                // of the generation.
                if !(at_root && name == STAGING_DIR.as_bytes()) {
                    self.diffs.push((rel_n, ChangeKind::Removed));
                }
            }
        }
        for name in src_names {
            let rel_n = rel.child(OsStr::from_bytes(&name));
            changed |= self.entry(src, dst, rel_n, &name)?;
        }
        Ok(changed)
    }

    /// One entry `name` (`rel_n`) of the source directory `src` made
    /// equal in `dst`; returns whether `dst`'s entries changed.
    fn entry(
        &mut self,
        src: BorrowedFd<'_>,
        dst: Option<BorrowedFd<'_>>,
        rel_n: LocalName,
        name: &[u8],
    ) -> Result<bool, MirrorError> {
        let os = OsStr::from_bytes(name);
        let ss = match rustix::fs::statat(src, os, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the directory was read.
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(self.err("stat", &rel_n)(e)),
        };
        let ds = dst.and_then(|d| rustix::fs::statat(d, os, AtFlags::SYMLINK_NOFOLLOW).ok());
        if matches!(&rel_n, LocalName::Rel(r) if self.skip.contains(r.as_str())) {
            // The caller writes or removes it: only a directory's place is
            // cleared (a rename replaces anything else in one step, and a
            // removal removes it): a removal here frees the old copy's
            // blocks once, not twice.
            let dir_there = ds
                .as_ref()
                .is_some_and(|d| FileType::from_raw_mode(d.st_mode) == FileType::Directory);
            return match dst.filter(|_| self.apply && dir_there) {
                Some(d) => self.remove(d, os, &rel_n).map(|()| true),
                None => Ok(false),
            };
        }
        let kind = FileType::from_raw_mode(ss.st_mode);
        let dkind = ds.as_ref().map(|d| FileType::from_raw_mode(d.st_mode));
        match kind {
            FileType::Directory => self.subdir(src, dst, rel_n, os, &ss, ds.as_ref()),
            FileType::RegularFile => {
                if let Some(d) = &ds
                    && dkind == Some(FileType::RegularFile)
                    && same_file(&ss, d)
                {
                    return Ok(false);
                }
                let what = match (dkind, &ds) {
                    (None, _) => ChangeKind::Created,
                    (Some(FileType::RegularFile), Some(d))
                        if ss.st_size == d.st_size
                            && ss.st_mtime == d.st_mtime
                            && ss.st_mtime_nsec == d.st_mtime_nsec =>
                    {
                        ChangeKind::Mode
                    }
                    _ => ChangeKind::Updated,
                };
                let Some(dst) = dst.filter(|_| self.apply) else {
                    self.diffs.push((rel_n, what));
                    return Ok(false);
                };
                if ds.is_some() {
                    self.remove(dst, os, &rel_n)?;
                }
                self.copy_file(src, dst, os, &rel_n)?;
                self.diffs.push((rel_n, what));
                Ok(true)
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, os, Vec::new())
                    .map_err(self.err("read the link", &rel_n))?;
                let same = dkind == Some(FileType::Symlink)
                    && dst.and_then(|d| rustix::fs::readlinkat(d, os, Vec::new()).ok())
                        == Some(target.clone());
                if same {
                    return Ok(false);
                }
                let what = if ds.is_some() {
                    ChangeKind::Updated
                } else {
                    ChangeKind::Created
                };
                let Some(dst) = dst.filter(|_| self.apply) else {
                    self.diffs.push((rel_n, what));
                    return Ok(false);
                };
                if ds.is_some() {
                    self.remove(dst, os, &rel_n)?;
                }
                rustix::fs::symlinkat(target.as_c_str(), dst, os)
                    .map_err(self.err("create the link", &rel_n))?;
                self.diffs.push((rel_n, what));
                Ok(true)
            }
            // Not copied (module docs); nothing of the target stays there.
            _ => match (dst, ds.is_some() && self.apply) {
                (Some(d), true) => {
                    self.remove(d, os, &rel_n)?;
                    Ok(true)
                }
                _ => Ok(false),
            },
        }
    }

    /// A directory of the source: made in the target if needed, given the
    /// source's mode, and walked.
    fn subdir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: Option<BorrowedFd<'_>>,
        rel: LocalName,
        name: &OsStr,
        ss: &Stat,
        ds: Option<&Stat>,
    ) -> Result<bool, MirrorError> {
        let rel = &rel;
        let is_dir = ds.is_some_and(|d| FileType::from_raw_mode(d.st_mode) == FileType::Directory);
        let mut changed = false;
        if ss.st_dev != self.dev {
            self.crossed.get_or_insert_with(|| rel.clone());
            return Ok(false);
        }
        let sub_src = rustix::fs::openat(src, name, DIR_FLAGS, Mode::empty())
            .map_err(self.err("open", rel))?;
        if !is_dir {
            self.diffs.push((
                rel.clone(),
                if ds.is_some() {
                    ChangeKind::Updated
                } else {
                    ChangeKind::Created
                },
            ));
        } else if let Some(d) = ds
            && !same_meta(ss, d)
        {
            self.diffs.push((rel.clone(), ChangeKind::Mode));
        }
        let sub_dst: Option<OwnedFd> = match dst.filter(|_| self.apply) {
            Some(dst) => {
                if !is_dir {
                    if ds.is_some() {
                        self.remove(dst, name, rel)?;
                    }
                    rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
                        .map_err(self.err("create", rel))?;
                    changed = true;
                }
                let fd = rustix::fs::openat(dst, name, DIR_FLAGS, Mode::empty())
                    .map_err(self.err("open", rel))?;
                Some(fd)
            }
            None if is_dir => dst
                .map(|d| rustix::fs::openat(d, name, DIR_FLAGS, Mode::empty()))
                .transpose()
                .map_err(self.err("open", rel))?,
            None => None,
        };
        if self.dir(sub_src.as_fd(), sub_dst.as_ref().map(AsFd::as_fd), rel)?
            && let Some(fd) = &sub_dst
        {
            self.keep(fd.as_fd(), rel);
        }
        // Its mode last: a directory without write permission for us is
        // filled first.
        if let Some(fd) = sub_dst.as_ref().filter(|_| self.apply)
            && (!is_dir || ds.is_some_and(|d| !same_meta(ss, d)))
        {
            self.set_meta(fd.as_fd(), ss, rel)?;
        }
        Ok(changed)
    }

    fn remove(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &LocalName,
    ) -> Result<(), MirrorError> {
        remove_entry(dir, name).map_err(|source| MirrorError {
            what: "remove",
            path: rel.to_path(self.target),
            source,
        })
    }

    /// Copies the regular file `name` of `src` into a new file of `dst`
    /// with its mode, owner and mtime (module docs).
    fn copy_file(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &OsStr,
        rel: &LocalName,
    ) -> Result<(), MirrorError> {
        let from = rustix::fs::openat(src, name, READ_FLAGS, Mode::empty())
            .map_err(self.err("open", rel))?;
        let st = rustix::fs::fstat(&from).map_err(self.err("stat", rel))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(self.err("copy", rel)(Errno::INVAL));
        }
        let to = rustix::fs::openat(
            dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(self.err("create", rel))?;
        let (mut from, mut to) = (std::fs::File::from(from), std::fs::File::from(to));
        std::io::copy(&mut from, &mut to).map_err(|source| MirrorError {
            what: "copy",
            path: rel.to_path(self.target),
            source,
        })?;
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec as _,
            },
            last_modification: Timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec as _,
            },
        };
        self.set_meta(to.as_fd(), &st, rel)?;
        rustix::fs::futimens(&to, &times).map_err(self.err("set the times of", rel))?;
        Ok(())
    }
}

/// What the mirror leaves to the plan (`mirror.rs`, `skip`): the files
/// it writes over no directory, and with `purge` what it removes.
pub fn left_to_the_plan(plan: &crate::plan::Plan, purge: bool) -> HashSet<&str> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            crate::plan::Action::Write {
                rel,
                replace_dir: false,
                ..
            } => Some(rel.as_str()),
            crate::plan::Action::Remove { rel, .. } if purge => Some(rel.as_str()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn snapshot(root: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in walkdir::WalkDir::new(root).sort_by_file_name().min_depth(1) {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            let md = e.path().symlink_metadata().unwrap();
            let what = if md.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(e.path()).unwrap().display())
            } else if md.is_dir() {
                format!("dir {:o}", md.permissions().mode() & 0o7777)
            } else {
                format!(
                    "file {:o} {:?}",
                    md.permissions().mode() & 0o7777,
                    std::fs::read(e.path()).unwrap()
                )
            };
            out.push((rel, what));
        }
        out
    }

    #[test]
    fn a_mirror_makes_the_target_equal_with_new_inodes_and_skips_the_planned() {
        let t = tempfile::tempdir().unwrap();
        let (live, standby) = (t.path().join("live"), t.path().join("standby"));
        std::fs::create_dir_all(live.join("a/b")).unwrap();
        std::fs::create_dir_all(live.join(STAGING_DIR)).unwrap();
        std::fs::write(live.join("a/one.rb"), "one").unwrap();
        std::fs::write(live.join("a/b/two.rb"), "two").unwrap();
        std::fs::write(live.join("planned.rb"), "new").unwrap();
        std::fs::set_permissions(live.join("a/b"), std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink("a/one.rb", live.join("link")).unwrap();
        std::fs::create_dir_all(standby.join("gone/deep")).unwrap();
        std::fs::write(standby.join("a"), "a file where a directory goes").unwrap();
        let skip: HashSet<&str> = ["planned.rb"].into_iter().collect();
        let mut m = Mirror::new(&standby, &skip, true);
        m.run(&live, &standby).unwrap();
        let mut want = snapshot(&live);
        want.retain(|(rel, _)| rel != "planned.rb" && !rel.starts_with(STAGING_DIR));
        assert_eq!(snapshot(&standby), want);
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_ne!(ino(&live.join("a/one.rb")), ino(&standby.join("a/one.rb")));
        // A second walk finds nothing to do and writes nothing.
        let before = std::fs::metadata(standby.join("a/one.rb"))
            .unwrap()
            .ctime_nsec();
        let mut again = Mirror::new(&standby, &skip, true);
        again.run(&live, &standby).unwrap();
        assert!(again.diffs.is_empty(), "{:?}", again.diffs);
        assert!(again.durable.is_empty());
        let after = std::fs::metadata(standby.join("a/one.rb"))
            .unwrap()
            .ctime_nsec();
        assert_eq!(before, after);
        // Listing only: the differences, nothing written.
        std::fs::write(live.join("a/one.rb"), "changed!").unwrap();
        std::fs::set_permissions(live.join("a/b"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut list = Mirror::new(&standby, &skip, false);
        list.run(&live, &standby).unwrap();
        let diffs: Vec<(String, ChangeKind)> = (list.diffs.iter())
            .map(|(name, kind)| (name.to_string(), *kind))
            .collect();
        assert_eq!(
            diffs,
            vec![
                ("a/b".to_owned(), ChangeKind::Mode),
                ("a/one.rb".to_owned(), ChangeKind::Updated)
            ]
        );
        assert_eq!(std::fs::read(standby.join("a/one.rb")).unwrap(), b"one");
        let mode = std::fs::metadata(standby.join("a/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750, "a listing changed a mode");
    }

    /// A planned path's place in the standby: an old file stays for the
    /// rename to replace in one step; a directory there is cleared (no
    /// rename can replace one with a file).
    #[test]
    fn a_planned_path_is_cleared_only_of_a_directory() {
        let t = tempfile::tempdir().unwrap();
        let (live, standby) = (t.path().join("live"), t.path().join("standby"));
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(live.join("file.rb"), "live").unwrap();
        std::fs::write(live.join("was_dir.rb"), "live").unwrap();
        std::fs::create_dir_all(standby.join("was_dir.rb/below")).unwrap();
        std::fs::write(standby.join("file.rb"), "previous").unwrap();
        let skip: HashSet<&str> = ["file.rb", "was_dir.rb"].into_iter().collect();
        let mut m = Mirror::new(&standby, &skip, true);
        m.run(&live, &standby).unwrap();
        assert_eq!(std::fs::read(standby.join("file.rb")).unwrap(), b"previous");
        assert!(!standby.join("was_dir.rb").exists());
    }
}
