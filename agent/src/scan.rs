//! The local side: what is in a destination now.
//!
//! A walk that never follows symlinks (a link is an entry to replace or
//! purge, never a way out of the destination), skips ignored names without
//! descending into them (Puppet applies `pluginsignore` locally too, so a
//! local `.git/` survives) and skips the agent's own staging directory. The
//! walk only stats; [`hash_files`] then hashes just the files the listing
//! also has as files, and only those whose stat changed since the stat
//! cache saw them (everything else is decided without reading it).
//!
//! Entries are keyed by [`RelPath`], as the listing's are, so the plan
//! compares the two trees without converting a path. A name no listing
//! can hold (not UTF-8, or with a backslash) is kept apart as a [`Stray`]:
//! never managed, only purged.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use pluginsync_common::checksum::sha256_reader;
use pluginsync_common::digest::Sha256;
use pluginsync_common::filesig::FileSig;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::relpath::RelPath;

use crate::listing::{RemoteKind, RemoteTree};

mod walk;

use walk::{Job, Walk, WalkState};

/// What a local entry is (never following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink (never followed).
    Symlink,
    /// A fifo, socket or device.
    Other,
}

/// One local entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEntry {
    /// What it is.
    pub kind: LocalKind,
    /// Permission bits, `& 0o777`.
    pub mode: u32,
    /// The content's digest, for files the listing also has as files
    /// (filled by [`hash_files`]).
    pub sha256: Option<Sha256>,
    /// The entry's stat (not following symlinks).
    pub stat: FileSig,
}

/// A local name no listing can hold (not UTF-8, or with a backslash: the
/// rules of [`RelPath`]), or something below one. Never managed: purged
/// like any entry the listing lacks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stray {
    /// The deepest directory above it whose path is a [`RelPath`].
    pub parent: RelPath,
    /// Below `parent`: first the name no listing can hold, then whatever
    /// the walk found below it.
    pub rest: PathBuf,
}

impl Stray {
    /// True for the name itself, false for what is below it.
    pub fn is_topmost(&self) -> bool {
        self.rest.components().nth(1).is_none()
    }

    /// Its first name below [`Stray::parent`].
    pub fn name(&self) -> &OsStr {
        self.rest
            .components()
            .next()
            .map_or(OsStr::new(""), Component::as_os_str)
    }

    /// `base` joined with it.
    pub fn to_path(&self, base: &Path) -> PathBuf {
        self.parent.to_path(base).join(&self.rest)
    }
}

impl fmt::Display for Stray {
    /// `parent/rest`, lossily (for reports and logs only).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.parent.is_root() {
            write!(f, "{}/", self.parent)?;
        }
        write!(f, "{}", self.rest.display())
    }
}

/// The name of a local entry, relative to its destination: a path a
/// listing can hold, or a [`Stray`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LocalName {
    /// A path a listing can hold.
    Rel(RelPath),
    /// A name no listing can hold.
    Stray(Stray),
}

impl LocalName {
    /// The entry `name` of this directory: a [`RelPath`] while every name
    /// on the way is one a listing can hold (each checked alone, as the
    /// walk finds it), else a [`Stray`].
    pub fn child(&self, name: &OsStr) -> LocalName {
        match self {
            LocalName::Rel(dir) => match name.to_str().map(|s| dir.join(s)) {
                Some(Ok(rel)) => LocalName::Rel(rel),
                _ => LocalName::Stray(Stray {
                    parent: dir.clone(),
                    rest: name.into(),
                }),
            },
            LocalName::Stray(stray) => LocalName::Stray(Stray {
                parent: stray.parent.clone(),
                rest: stray.rest.join(name),
            }),
        }
    }

    /// `base` joined with it.
    pub fn to_path(&self, base: &Path) -> PathBuf {
        match self {
            LocalName::Rel(rel) => rel.to_path(base),
            LocalName::Stray(stray) => stray.to_path(base),
        }
    }
}

impl fmt::Display for LocalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalName::Rel(rel) => rel.fmt(f),
            LocalName::Stray(stray) => stray.fmt(f),
        }
    }
}

/// A destination as found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalTree {
    /// The destination exists as a directory.
    pub exists: bool,
    /// Its permission bits.
    pub root_mode: u32,
    /// Everything below it a listing could name, sorted.
    pub entries: BTreeMap<RelPath, LocalEntry>,
    /// Everything below it no listing can name, sorted.
    pub strays: BTreeMap<Stray, LocalEntry>,
    /// The walk skipped an ignored name (not part of [`LocalTree::digest`]).
    pub ignored: bool,
}

/// The destination could not be read; nothing is changed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The destination exists but is not a directory.
    #[error("'{}' exists and is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// Reading failed.
    #[error("cannot read '{}': {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl LocalTree {
    /// A digest of everything the scan saw (paths, kinds, modes, stats):
    /// equal digests mean nothing in the destination changed.
    pub fn digest(&self) -> Sha256 {
        // Fixed-width binary fields after a NUL-ended name (no name holds a
        // NUL), one buffer, hashed once: it runs on every scan, and text
        // formatting of 3,000 stats cost more than the hash.
        let mut buf: Vec<u8> =
            Vec::with_capacity(96 * (self.entries.len() + self.strays.len() + 1));
        buf.extend_from_slice(b"scan 2\0");
        buf.extend_from_slice(&self.root_mode.to_le_bytes());
        buf.push(u8::from(self.exists));
        let mut line = |name: &[u8], e: &LocalEntry| {
            let s = &e.stat;
            buf.extend_from_slice(name);
            buf.push(0);
            buf.push(e.kind as u8);
            buf.extend_from_slice(&e.mode.to_le_bytes());
            for n in [s.size, s.ino, s.dev] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
            for n in [s.mtime_ns, s.ctime_ns] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
        };
        for (p, e) in &self.entries {
            line(p.as_str().as_bytes(), e);
        }
        for (p, e) in &self.strays {
            // Its bytes as they are: two names no listing can hold may
            // look alike once made printable.
            use std::os::unix::ffi::OsStrExt;
            line(p.to_path(Path::new("")).as_os_str().as_bytes(), e);
        }
        Sha256::of(&buf)
    }

    /// Adds (or replaces) one entry.
    fn insert(&mut self, name: LocalName, entry: LocalEntry) {
        match name {
            LocalName::Rel(rel) => self.entries.insert(rel, entry),
            LocalName::Stray(stray) => self.strays.insert(stray, entry),
        };
    }
}

/// Scans `dest` (stat only); see the module docs.
pub fn scan(dest: &Path, ignore: &IgnoreSet) -> Result<LocalTree, ScanError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ScanError::Io { path, source }
    };
    let md = match std::fs::metadata(dest) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LocalTree::default()),
        Err(e) => return Err(io(dest)(e)),
    };
    if !md.is_dir() {
        return Err(ScanError::NotADirectory(dest.to_owned()));
    }
    let mut tree = LocalTree {
        exists: true,
        root_mode: md.permissions().mode() & 0o777,
        ..LocalTree::default()
    };
    // Every directory is one job of a queue that a few threads share:
    // a Puppet libdir has one big top-level directory (`puppet/`), so
    // splitting by top-level entries left one thread doing two thirds
    // of the work (docs/internals.md#the-scans-queue-and-binary-records).
    let walk = Walk {
        state: std::sync::Mutex::new(WalkState {
            jobs: vec![Job {
                parent: None,
                path: dest.to_owned(),
                name: LocalName::Rel(RelPath::root()),
            }],
            busy: 0,
            failed: None,
        }),
        ready: std::sync::Condvar::new(),
        ignore,
        skipped: std::sync::atomic::AtomicBool::new(false),
    };
    let workers = stat_threads();
    let found: Vec<Vec<(LocalName, LocalEntry)>> = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(|| walk.work())).collect();
        let mut found = vec![walk.work()];
        // A helper that panicked leaves its part unknown: an error below.
        found.extend(helpers.into_iter().filter_map(|h| h.join().ok()));
        found
    });
    let state = walk
        .state
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(e) = state.failed {
        return Err(e);
    }
    if found.len() != workers || state.busy != 0 || !state.jobs.is_empty() {
        return Err(io(dest)(std::io::Error::other("a scan thread failed")));
    }
    let (mut rels, mut strays) = (Vec::new(), Vec::new());
    for (name, entry) in found.into_iter().flatten() {
        match name {
            LocalName::Rel(rel) => rels.push((rel, entry)),
            LocalName::Stray(stray) => strays.push((stray, entry)),
        }
    }
    // Built sorted in bulk, not entry by entry.
    tree.entries = rels.into_iter().collect();
    tree.strays = strays.into_iter().collect();
    tree.ignored = walk.skipped.into_inner();
    Ok(tree)
}

/// The entry for a (non-following) stat.
pub fn entry_of(md: &std::fs::Metadata) -> LocalEntry {
    let ft = md.file_type();
    let kind = if ft.is_symlink() {
        LocalKind::Symlink
    } else if ft.is_dir() {
        LocalKind::Dir
    } else if ft.is_file() {
        LocalKind::File
    } else {
        LocalKind::Other
    };
    LocalEntry {
        kind,
        mode: md.permissions().mode() & 0o777,
        sha256: None,
        stat: FileSig::of(md),
    }
}

impl LocalTree {
    /// The tree after `touched` entries changed: each is stat'ed again (or
    /// dropped with its subtree if gone), as is each parent directory (its
    /// mtime moved) and the destination itself. Cheaper than a rescan; a
    /// concurrent change this misses only makes the next run's digest
    /// differ, never match.
    pub fn updated(&self, dest: &Path, touched: &[LocalName]) -> LocalTree {
        self.clone().into_updated(dest, touched)
    }

    /// [`LocalTree::updated`], without a copy of the tree.
    pub fn into_updated(self, dest: &Path, touched: &[LocalName]) -> LocalTree {
        let mut t = self;
        let touched: Vec<&LocalName> = touched
            .iter()
            .filter(|n| !matches!(n, LocalName::Rel(r) if r.is_root()))
            .collect();
        // Everything is stat'ed after the commit, so a touched directory's
        // stat is already its final one: not stat'ed again as a parent.
        let is_touched: HashSet<&RelPath> = touched
            .iter()
            .filter_map(|n| match n {
                LocalName::Rel(rel) => Some(rel),
                LocalName::Stray(_) => None,
            })
            .collect();
        let mut parents = BTreeSet::new();
        for name in &touched {
            let mut p = match name {
                LocalName::Rel(rel) => rel.parent(),
                LocalName::Stray(stray) => Some(stray.parent.clone()),
            };
            while let Some(dir) = p.filter(|d| !d.is_root()) {
                p = dir.parent();
                if !is_touched.contains(&dir) {
                    parents.insert(dir);
                }
            }
        }
        let paths: Vec<PathBuf> = touched
            .iter()
            .map(|n| n.to_path(dest))
            .chain(parents.iter().map(|d| d.to_path(dest)))
            .collect();
        let mut stats = stat_all(&paths).into_iter();
        // In plan order: a path's stale subtree goes before its new stat.
        // A created or replaced directory's contents are touched paths of
        // their own, later in the plan. A directory that stays one (its
        // mode changed, its entries did) keeps what is below it: what
        // changed there is touched by itself, before or after it
        // (`tests/e2e/agent_switch.rs`, the fast path).
        for name in touched {
            let entry = stats.next().flatten();
            let is_dir = |e: Option<&LocalEntry>| e.is_some_and(|e| e.kind == LocalKind::Dir);
            let was = match name {
                LocalName::Rel(rel) => t.entries.get(rel),
                LocalName::Stray(stray) => t.strays.get(stray),
            };
            if !(is_dir(was) && is_dir(entry.as_ref())) {
                t.forget(name);
            }
            if let Some(entry) = entry {
                t.insert(name.clone(), entry);
            }
        }
        for dir in parents {
            if let Some(entry) = stats.next().flatten() {
                t.entries.insert(dir, entry);
            }
        }
        if let Ok(md) = std::fs::metadata(dest) {
            t.exists = true;
            t.root_mode = md.permissions().mode() & 0o777;
        }
        t
    }

    /// Drops `name` and everything below it.
    fn forget(&mut self, name: &LocalName) {
        match name {
            LocalName::Rel(rel) => {
                // Below `a` in string order: from `a` on, among the names
                // that start with the text `a` (`a.rb` sorts before `a/x`).
                let stale: Vec<RelPath> = self
                    .entries
                    .range(rel.clone()..)
                    .take_while(|(k, _)| k.as_str().starts_with(rel.as_str()))
                    .filter(|(k, _)| k.starts_with(rel))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in stale {
                    self.entries.remove(&k);
                }
                if !self.strays.is_empty() {
                    self.strays.retain(|s, _| !s.parent.starts_with(rel));
                }
            }
            LocalName::Stray(stray) => self
                .strays
                .retain(|s, _| !(s.parent == stray.parent && s.rest.starts_with(&stray.rest))),
        }
    }
}

/// Threads for stat-only work (walks, restats): the cores, at most 4.
fn stat_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4)
}

/// Below this many paths one thread stats them all.
const PARALLEL_STAT_MIN: usize = 256;

/// `lstat`s each of `paths` (in order; `None` where gone), on a few
/// threads when there are many: after a 3,000-file initial sync this is
/// ~4,000 path walks.
fn stat_all(paths: &[PathBuf]) -> Vec<Option<LocalEntry>> {
    let stat = |path: &PathBuf| std::fs::symlink_metadata(path).ok().map(|md| entry_of(&md));
    let workers = stat_threads();
    if paths.len() < PARALLEL_STAT_MIN || workers == 1 {
        return paths.iter().map(stat).collect();
    }
    let chunk = paths.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let handles: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                (
                    part.len(),
                    scope.spawn(move || part.iter().map(stat).collect()),
                )
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|(len, h)| {
                // A worker that died leaves its paths unknown: not cached.
                h.join()
                    .unwrap_or_else(|_| (0..len).map(|_| None).collect::<Vec<_>>())
            })
            .collect()
    })
}

/// Fills `sha256` of the local files that the listing has as files, from
/// `known` (the stat cache: the digest of a relative path if its stat is
/// still the given one) where it knows, else by reading them. Returns how
/// many files were read.
pub fn hash_files(
    dest: &Path,
    local: &mut LocalTree,
    remote: &RemoteTree,
    known: impl Fn(&RelPath, &FileSig) -> Option<Sha256>,
) -> Result<usize, ScanError> {
    let mut read = 0;
    for (rel, entry) in local.entries.iter_mut() {
        if entry.kind != LocalKind::File {
            continue;
        }
        let wanted = remote
            .entries
            .get(rel)
            .is_some_and(|e| matches!(e.kind, RemoteKind::File { .. }));
        if !wanted {
            continue;
        }
        if let Some(sha) = known(rel, &entry.stat) {
            entry.sha256 = Some(sha);
            continue;
        }
        let path = rel.to_path(dest);
        let io = |source| ScanError::Io {
            path: path.clone(),
            source,
        };
        let f = std::fs::File::open(&path).map_err(io)?;
        entry.sha256 = Some(sha256_reader(f).map_err(io)?);
        read += 1;
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_entries_never_followed_at_any_depth() {
        let t = tempfile::tempdir().unwrap();
        let (dest, outside) = (t.path().join("lib"), t.path().join("outside"));
        std::fs::create_dir_all(dest.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("precious"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("top_link")).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("sub/deep_link")).unwrap();
        std::fs::create_dir_all(dest.join(".git/objects")).unwrap();
        std::fs::write(dest.join("sub/a.rb"), "a").unwrap();
        let ignore = IgnoreSet::new(&crate::config::default_ignore()).unwrap();
        let tree = scan(&dest, &ignore).unwrap();
        let kinds: Vec<(String, LocalKind)> = tree
            .entries
            .iter()
            .map(|(p, e)| (p.to_string(), e.kind))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("sub".into(), LocalKind::Dir),
                ("sub/a.rb".into(), LocalKind::File),
                ("sub/deep_link".into(), LocalKind::Symlink),
                ("top_link".into(), LocalKind::Symlink),
            ]
        );
        // The same picture, in the same order, as a single-threaded walk.
        assert_eq!(tree.digest(), scan(&dest, &ignore).unwrap().digest());
    }

    #[test]
    fn an_updated_tree_is_what_a_rescan_finds() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("lib");
        std::fs::create_dir_all(dest.join("old/deep")).unwrap();
        std::fs::write(dest.join("old/deep/x.rb"), "x").unwrap();
        std::fs::write(dest.join("keep.rb"), "k").unwrap();
        std::fs::write(dest.join("gone.rb"), "g").unwrap();
        std::fs::write(dest.join("mode.rb"), "m").unwrap();
        std::fs::create_dir(dest.join("stays")).unwrap();
        // Dated back, so adding a file below moves its mtime for sure.
        std::fs::File::open(dest.join("stays"))
            .unwrap()
            .set_modified(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30),
            )
            .unwrap();
        let ignore = IgnoreSet::new(&crate::config::default_ignore()).unwrap();
        let before = scan(&dest, &ignore).unwrap();
        // What a commit might do, in plan order: directories, writes (one
        // replacing a directory), a chmod, a purge. Enough files that the
        // stats are spread over threads.
        let name = |p: &str| LocalName::Rel(RelPath::parse(p).unwrap());
        let mut touched = vec![name("new"), name("new/sub")];
        std::fs::create_dir_all(dest.join("new/sub")).unwrap();
        for i in 0..PARALLEL_STAT_MIN + 50 {
            let rel = format!("new/sub/f{i:03}.rb");
            std::fs::write(dest.join(&rel), "f").unwrap();
            touched.push(name(&rel));
        }
        // A file added to a directory that is not itself touched: its
        // mtime moved all the same.
        std::fs::write(dest.join("stays/added.rb"), "a").unwrap();
        touched.push(name("stays/added.rb"));
        std::fs::remove_dir_all(dest.join("old")).unwrap();
        std::fs::write(dest.join("old"), "now a file").unwrap();
        touched.push(name("old"));
        std::fs::set_permissions(dest.join("mode.rb"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        touched.push(name("mode.rb"));
        std::fs::remove_file(dest.join("gone.rb")).unwrap();
        touched.push(name("gone.rb"));
        // A directory whose mode changes after what is below it was
        // touched (a standby's mirrored paths, then the plan's chmod): it
        // keeps its entries.
        std::fs::set_permissions(dest.join("new/sub"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        touched.push(name("new/sub"));

        let updated = before.updated(&dest, &touched);
        let rescan = scan(&dest, &ignore).unwrap();
        assert_eq!(updated, rescan);
        assert_eq!(updated.digest(), rescan.digest());
        assert_ne!(before.digest(), rescan.digest());
    }

    #[test]
    fn names_no_listing_can_hold_are_strays() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("lib");
        let odd = OsStr::from_bytes(b"caf\xe9");
        std::fs::create_dir_all(dest.join("sub").join(odd)).unwrap();
        std::fs::write(dest.join("sub").join(odd).join("x.rb"), "x").unwrap();
        std::fs::write(dest.join("back\\slash.rb"), "b").unwrap();
        std::fs::write(dest.join("sub/ok.rb"), "o").unwrap();
        let ignore = IgnoreSet::new(&crate::config::default_ignore()).unwrap();
        let before = scan(&dest, &ignore).unwrap();
        let names: Vec<String> = before.entries.keys().map(ToString::to_string).collect();
        assert_eq!(names, ["sub", "sub/ok.rb"]);
        let strays: Vec<(String, bool)> = before
            .strays
            .keys()
            .map(|s| (s.to_string(), s.is_topmost()))
            .collect();
        assert_eq!(
            strays,
            [
                ("back\\slash.rb".to_owned(), true),
                ("sub/caf\u{fffd}".to_owned(), true),
                ("sub/caf\u{fffd}/x.rb".to_owned(), false),
            ]
        );
        // Removed, as a purge would: the update drops what was below too.
        let top: Vec<LocalName> = before
            .strays
            .keys()
            .filter(|s| s.is_topmost())
            .map(|s| LocalName::Stray(s.clone()))
            .collect();
        std::fs::remove_dir_all(dest.join("sub").join(odd)).unwrap();
        std::fs::remove_file(dest.join("back\\slash.rb")).unwrap();
        let updated = before.updated(&dest, &top);
        let rescan = scan(&dest, &ignore).unwrap();
        assert!(rescan.strays.is_empty());
        assert_eq!(updated, rescan);
        assert_eq!(updated.digest(), rescan.digest());
        assert_ne!(before.digest(), rescan.digest());
    }
}
