//! The local side: what is in a destination now.
//!
//! A walk that never follows symlinks (a link is an entry to replace or
//! purge, never a way out of the destination), skips ignored names without
//! descending into them (Puppet applies `pluginsignore` locally too, so a
//! local `.git/` survives) and skips the agent's own staging directory. The
//! walk only stats; [`hash_files`] then hashes just the files the listing
//! also has as files, and only those whose stat changed since the stat
//! cache saw them (everything else is decided without reading it).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::filesig::FileSig;
use pluginsync_common::ignore::IgnoreSet;

use crate::listing::{RemoteKind, RemoteTree, STAGING_DIR};

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
    /// Lowercase sha256 hex, for files the listing also has as files
    /// (filled by [`hash_files`]).
    pub sha256: Option<String>,
    /// The entry's stat (not following symlinks).
    pub stat: FileSig,
}

/// A destination as found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalTree {
    /// The destination exists as a directory.
    pub exists: bool,
    /// Its permission bits.
    pub root_mode: u32,
    /// Everything below it, relative, sorted.
    pub entries: BTreeMap<PathBuf, LocalEntry>,
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
    pub fn digest(&self) -> String {
        let mut text = format!("root {:o} {}\n", self.root_mode, self.exists);
        for (p, e) in &self.entries {
            let s = &e.stat;
            text.push_str(&format!(
                "{}\0{:?} {:o} {} {} {} {} {}\n",
                p.display(),
                e.kind,
                e.mode,
                s.size,
                s.mtime_ns,
                s.ctime_ns,
                s.ino,
                s.dev
            ));
        }
        pluginsync_common::digest::Sha256::of(text.as_bytes()).to_hex()
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
        entries: BTreeMap::new(),
    };
    // Top-level entries here; each top-level directory's subtree is walked
    // by one of a few threads. A sorted depth-first walk yields paths in
    // `Path` order already, so the map is bulk-built from the concatenation.
    let mut top: Vec<std::fs::DirEntry> = std::fs::read_dir(dest)
        .map_err(io(dest))?
        .collect::<Result<_, _>>()
        .map_err(io(dest))?;
    top.sort_by_key(|e| e.file_name());
    top.retain(|e| {
        let name = e.file_name();
        let name = name.to_str().unwrap_or_default();
        !(ignore.is_ignored(name) || name == STAGING_DIR)
    });
    let subtrees: Vec<std::sync::Mutex<Option<Subtree>>> =
        top.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = stat_threads();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(entry) = top.get(i) else { break };
                    let result = walk_one(dest, &entry.path(), ignore);
                    if let Ok(mut slot) = subtrees[i].lock() {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    let mut all = Vec::new();
    for slot in subtrees {
        let result = slot
            .into_inner()
            .ok()
            .flatten()
            .unwrap_or_else(|| Ok(Vec::new()));
        all.extend(result?);
    }
    tree.entries = all.into_iter().collect();
    Ok(tree)
}

/// What walking one top-level entry produced.
type Subtree = Result<Vec<(PathBuf, LocalEntry)>, ScanError>;

/// One top-level entry of `dest` and, for a real directory, everything
/// below it, in walk (= `Path`) order.
fn walk_one(
    dest: &Path,
    top: &Path,
    ignore: &IgnoreSet,
) -> Result<Vec<(PathBuf, LocalEntry)>, ScanError> {
    let mut out = Vec::new();
    let walker = walkdir::WalkDir::new(top)
        .follow_links(false)
        // Each top-level entry is a walk root here, and walkdir follows a
        // root symlink by default: a link out of the destination must stay
        // a link.
        .follow_root_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            e.depth() == 0 || !ignore.is_ignored(e.file_name().to_str().unwrap_or_default())
        });
    for entry in walker {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(top).to_owned();
            ScanError::Io {
                path,
                source: e
                    .into_io_error()
                    .unwrap_or_else(|| std::io::Error::other("walk error")),
            }
        })?;
        let md = entry.metadata().map_err(|e| ScanError::Io {
            path: entry.path().to_owned(),
            source: e
                .into_io_error()
                .unwrap_or_else(|| std::io::Error::other("stat error")),
        })?;
        let rel = entry
            .path()
            .strip_prefix(dest)
            .map(Path::to_owned)
            .unwrap_or_default();
        out.push((rel, entry_of(&md)));
    }
    Ok(out)
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
    /// The tree after `touched` paths changed: each is stat'ed again (or
    /// dropped with its subtree if gone), as is each parent directory
    /// (its mtime moved). Cheaper than a rescan; a concurrent change this
    /// misses only makes the next run's digest differ, never match.
    pub fn updated(&self, dest: &Path, touched: &[PathBuf]) -> LocalTree {
        let mut t = self.clone();
        if touched.is_empty() {
            return t;
        }
        // Everything is stat'ed after the commit, so a touched directory's
        // stat is already its final one: not stat'ed again as a parent.
        let is_touched: std::collections::HashSet<&Path> =
            touched.iter().map(PathBuf::as_path).collect();
        let mut parents = std::collections::BTreeSet::new();
        for rel in touched {
            let mut p = rel.parent();
            while let Some(dir) = p {
                if !dir.as_os_str().is_empty() && !is_touched.contains(dir) {
                    parents.insert(dir);
                }
                p = dir.parent();
            }
        }
        let rels: Vec<&Path> = touched
            .iter()
            .map(PathBuf::as_path)
            .filter(|r| !r.as_os_str().is_empty())
            .chain(parents.iter().copied())
            .collect();
        let (touched_rels, parent_rels) = rels.split_at(rels.len() - parents.len());
        let mut stats = stat_all(dest, &rels).into_iter();
        // In plan order: a path's stale subtree goes before its new stat.
        for rel in touched_rels {
            let stale: Vec<PathBuf> = t
                .entries
                .range(rel.to_path_buf()..)
                .take_while(|(k, _)| k.starts_with(rel))
                .map(|(k, _)| k.clone())
                .collect();
            for k in stale {
                t.entries.remove(&k);
            }
            // A created or replaced directory's contents are touched paths
            // of their own, later in the plan.
            if let Some(entry) = stats.next().flatten() {
                t.entries.insert(rel.to_path_buf(), entry);
            }
        }
        for dir in parent_rels {
            if let Some(entry) = stats.next().flatten() {
                t.entries.insert(dir.to_path_buf(), entry);
            }
        }
        if let Ok(md) = std::fs::metadata(dest) {
            t.exists = true;
            t.root_mode = md.permissions().mode() & 0o777;
        }
        t
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

/// `lstat`s `dest/rel` for each of `rels` (in order; `None` where gone),
/// on a few threads when there are many: after a 3,000-file initial sync
/// this is ~4,000 path walks.
fn stat_all(dest: &Path, rels: &[&Path]) -> Vec<Option<LocalEntry>> {
    let stat = |rel: &&Path| {
        std::fs::symlink_metadata(dest.join(rel))
            .ok()
            .map(|md| entry_of(&md))
    };
    let workers = stat_threads();
    if rels.len() < PARALLEL_STAT_MIN || workers == 1 {
        return rels.iter().map(stat).collect();
    }
    let chunk = rels.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let handles: Vec<_> = rels
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
/// `known` (the stat cache: the sha256 of a relative path if its stat is
/// still the given one) where it knows, else by reading them. Returns how
/// many files were read.
pub fn hash_files(
    dest: &Path,
    local: &mut LocalTree,
    remote: &RemoteTree,
    known: impl Fn(&str, &FileSig) -> Option<String>,
) -> Result<usize, ScanError> {
    let mut read = 0;
    for (rel, entry) in local.entries.iter_mut() {
        if entry.kind != LocalKind::File {
            continue;
        }
        let Some(rel_str) = rel.to_str() else {
            continue;
        };
        let wanted = pluginsync_common::relpath::RelPath::parse(rel_str)
            .ok()
            .and_then(|r| remote.entries.get(&r))
            .is_some_and(|e| matches!(e.kind, RemoteKind::File { .. }));
        if !wanted {
            continue;
        }
        if let Some(sha) = known(rel_str, &entry.stat) {
            entry.sha256 = Some(sha);
            continue;
        }
        let path = dest.join(rel);
        let io = |source| ScanError::Io {
            path: path.clone(),
            source,
        };
        let f = std::fs::File::open(&path).map_err(io)?;
        let v = ChecksumType::Sha256.digest_reader(f).map_err(io)?;
        entry.sha256 = Some(v["{sha256}".len()..].to_owned());
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
            .map(|(p, e)| (p.display().to_string(), e.kind))
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
        let mut touched = vec![
            PathBuf::new(),
            PathBuf::from("new"),
            PathBuf::from("new/sub"),
        ];
        std::fs::create_dir_all(dest.join("new/sub")).unwrap();
        for i in 0..PARALLEL_STAT_MIN + 50 {
            let rel = PathBuf::from(format!("new/sub/f{i:03}.rb"));
            std::fs::write(dest.join(&rel), "f").unwrap();
            touched.push(rel);
        }
        // A file added to a directory that is not itself touched: its
        // mtime moved all the same.
        std::fs::write(dest.join("stays/added.rb"), "a").unwrap();
        touched.push(PathBuf::from("stays/added.rb"));
        std::fs::remove_dir_all(dest.join("old")).unwrap();
        std::fs::write(dest.join("old"), "now a file").unwrap();
        touched.push(PathBuf::from("old"));
        std::fs::set_permissions(dest.join("mode.rb"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        touched.push(PathBuf::from("mode.rb"));
        std::fs::remove_file(dest.join("gone.rb")).unwrap();
        touched.push(PathBuf::from("gone.rb"));

        let updated = before.updated(&dest, &touched);
        let rescan = scan(&dest, &ignore).unwrap();
        assert_eq!(updated, rescan);
        assert_eq!(updated.digest(), rescan.digest());
        assert_ne!(before.digest(), rescan.digest());
    }
}
