//! What the agent records of a generation it retires, and when it
//! trusts what it knows of a standby (docs/internals.md#what-the-switch-trusts):
//! a previous generation's record ([`GenState`], `prev.<n>.state`),
//! trusted only while the generation still is what it says
//! ([`as_recorded`]); and a prepared standby's scan, not learned when
//! another process wrote in it meanwhile ([`foreign_in`]).

use std::os::fd::OwnedFd;
use std::path::Path;

use pluginsync_common::digest::{Sealed, Sha256, Unsealed};
use pluginsync_common::filesig::FileSig;
use pluginsync_common::fsutil::replace_atomic;
use pluginsync_common::relpath::RelPath;
use rustix::fs::{AtFlags, Mode, OFlags};

use super::dirs::DIR_FLAGS;
use crate::scan::{LocalEntry, LocalKind, LocalName, LocalTree};

/// Records `state` in `file` (`Standby::state_file`): a hint, not
/// synced; a lost or unreadable one costs a whole mirror.
pub fn write_state(file: &Path, state: &GenState) {
    let Some(bytes) = state.encode() else { return };
    if let Err(e) = replace_atomic(file, &bytes, 0o600) {
        tracing::debug!(file = %file.display(), error = %e, "cannot record a generation");
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

/// The first bytes of a [`GenState`] file.
const STATE_MAGIC: &[u8] = b"pluginsync-generation 2\n";

impl GenState {
    /// The file's bytes: [`STATE_MAGIC`], the digest, the root's mode and
    /// whether it existed, the changed paths, then per entry its kind,
    /// mode, size, mtime, ctime, inode, device and path (little-endian,
    /// paths after their u16 length), then the sha256 of all of it, so a
    /// cut or torn file is none. Binary, not text: it is written at every
    /// switch and read at the next change, 3,600 entries on the bench
    /// tree (docs/internals.md#the-scans-queue-and-binary-records). `None` for what it cannot hold (a
    /// name no listing can hold, something neither file, directory nor
    /// symlink, an ignored name).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let t = &self.scan;
        if !t.strays.is_empty() || t.ignored {
            return None;
        }
        let mut out = Sealed::new(STATE_MAGIC, 64 + 100 * t.entries.len());
        out.bytes.extend_from_slice(&self.live_digest.0);
        out.u32(t.root_mode);
        out.bytes.push(u8::from(t.exists));
        out.u32(u32::try_from(self.changed.len()).ok()?);
        for rel in &self.changed {
            out.text(rel.as_str())?;
        }
        out.u32(u32::try_from(t.entries.len()).ok()?);
        for (rel, e) in &t.entries {
            out.bytes.push(match e.kind {
                LocalKind::Dir => b'd',
                LocalKind::File => b'f',
                LocalKind::Symlink => b'l',
                LocalKind::Other => return None,
            });
            out.u32(e.mode);
            out.bytes.extend_from_slice(&e.stat.to_le_bytes());
            out.text(rel.as_str())?;
        }
        Some(out.seal())
    }

    /// Reads [`GenState::encode`]'s bytes; `None` if they are not one.
    pub fn decode(bytes: &[u8]) -> Option<GenState> {
        let mut r = Unsealed::open(bytes, STATE_MAGIC)?;
        let path = |r: &mut Unsealed<'_>| RelPath::parse(r.text()?).ok();
        let live_digest = Sha256(r.array()?);
        let root_mode = r.u32()?;
        let exists = r.take(1)?[0] == 1;
        let n = r.u32()? as usize;
        let changed = (0..n).map(|_| path(&mut r)).collect::<Option<Vec<_>>>()?;
        let n = r.u32()? as usize;
        let mut entries = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let kind = match r.take(1)?[0] {
                b'd' => LocalKind::Dir,
                b'f' => LocalKind::File,
                b'l' => LocalKind::Symlink,
                _ => return None,
            };
            let mode = r.u32()?;
            let stat = FileSig::from_le_bytes(&r.array()?);
            let entry = LocalEntry {
                kind,
                mode,
                sha256: None,
                stat,
            };
            entries.push((path(&mut r)?, entry));
        }
        r.is_done().then(|| GenState {
            live_digest,
            changed,
            scan: LocalTree {
                exists,
                root_mode,
                // The file is in order; built in bulk.
                entries: entries.into_iter().collect(),
                ..LocalTree::default()
            },
        })
    }
}

/// Whether a standby still is what its record (`scan`, taken of it while
/// it was live, before the switch that retired it) says: every directory
/// the record holds still has its recorded stat, and in it and in the
/// root the names read now are exactly the record's, each of the
/// recorded kind and inode. A user who renamed, made or removed an entry
/// in the live tree between the scan that made the record and the switch
/// that retired it, or later through a descriptor held across it, changed
/// one of those: the record is then no longer the standby's, and it is
/// walked whole (docs/internals.md#what-the-switch-trusts). Times alone
/// would not do: a directory's mtime moves by the kernel's clock tick, so
/// a rename in the tick of the scan leaves it as recorded, and the root's
/// times are not in the record.
pub(super) fn as_recorded(slot: &Path, scan: &LocalTree) -> bool {
    let unchanged = recorded_dirs_match(slot, scan).is_some_and(|same| same);
    if !unchanged {
        tracing::debug!("the standby changed since it was recorded");
    }
    unchanged
}

/// [`as_recorded`]'s walk, from the root down through descriptors (no
/// path resolved twice): each directory's entries against the record's
/// children of it, by name, kind and inode, and each recorded
/// directory's stat. `None` when a directory cannot be read.
fn recorded_dirs_match(slot: &Path, scan: &LocalTree) -> Option<bool> {
    use std::collections::HashMap;
    if !scan.strays.is_empty() {
        return Some(false); // names no record holds: walked whole anyway
    }
    // The record's children of each directory (by its path, "" the
    // root), sorted by name: the entries are in path order, but `a/b`
    // and `a.rb` interleave a directory's children with deeper ones.
    let mut children: Children<'_> = HashMap::new();
    for (rel, e) in &scan.entries {
        let s = rel.as_str();
        let (parent, name) = s.rsplit_once('/').unwrap_or(("", s));
        children.entry(parent).or_default().push((name, rel, e));
    }
    for list in children.values_mut() {
        list.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    let root =
        rustix::fs::open(slot, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty()).ok()?;
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
    dir_matches(&root, "", &children, &mut buf)
}

/// The record's children of each directory, by its path, sorted by name.
type Children<'a> = std::collections::HashMap<&'a str, Vec<(&'a str, &'a RelPath, &'a LocalEntry)>>;

/// Whether the directory open as `fd` (at `path`) and everything below it
/// hold what `children` says, depth first (one descriptor open per
/// level); `buf` is the directory reads' buffer.
fn dir_matches(
    fd: &OwnedFd,
    path: &str,
    children: &Children<'_>,
    buf: &mut [std::mem::MaybeUninit<u8>],
) -> Option<bool> {
    let recorded: &[(&str, &RelPath, &LocalEntry)] =
        children.get(path).map_or(&[], |v| v.as_slice());
    let (mut seen, mut dirs) = (0usize, Vec::new());
    let mut raw = rustix::fs::RawDir::new(fd, &mut *buf);
    while let Some(entry) = raw.next() {
        let entry = entry.ok()?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        seen += 1;
        let Ok(at) = recorded.binary_search_by(|c| c.0.as_bytes().cmp(name)) else {
            return Some(false);
        };
        let e = recorded[at].2;
        if entry.ino() != e.stat.ino || !kind_is(fd, entry.file_type(), name, e.kind) {
            return Some(false);
        }
        if e.kind == LocalKind::Dir {
            dirs.push(at);
        }
    }
    if seen != recorded.len() {
        return Some(false);
    }
    for at in dirs {
        let (name, rel, e) = recorded[at];
        let Ok(child) = rustix::fs::openat(fd, name, DIR_FLAGS, Mode::empty()) else {
            return Some(false);
        };
        let st = rustix::fs::fstat(&child).ok()?;
        if FileSig::of_stat(&st) != e.stat || !dir_matches(&child, rel.as_str(), children, buf)? {
            return Some(false);
        }
    }
    Some(true)
}

/// Whether an entry of type `ty` (named `name`, in `dir`) is of `kind`:
/// its type as the directory says, or its stat where the filesystem does
/// not say.
fn kind_is(dir: &OwnedFd, ty: rustix::fs::FileType, name: &[u8], kind: LocalKind) -> bool {
    use rustix::fs::FileType;
    let ty = match ty {
        FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => FileType::from_raw_mode(st.st_mode),
            Err(_) => return false,
        },
        ty => ty,
    };
    let is = match ty {
        FileType::Directory => LocalKind::Dir,
        FileType::RegularFile => LocalKind::File,
        FileType::Symlink => LocalKind::Symlink,
        _ => LocalKind::Other,
    };
    is == kind
}

/// How far a status change may read before the moment it happened: a
/// filesystem stamps times by the kernel's clock tick (at most 10 ms);
/// one that keeps whole seconds, by up to 2 s ([`foreign_in`]).
pub(super) const TICK_NS: i64 = 20_000_000;
pub(super) const COARSE_NS: i64 = 2_000_000_000;

/// Nanoseconds since the epoch of `t`.
pub(super) fn unix_ns(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The first of `touched` that the prepared standby's scan `after` holds
/// with a status change before `since` (the preparation's start, less a
/// clock tick): every entry the mirror or the plan wrote, made, renamed
/// or gave a mode in the standby changed status then, so an older one
/// was put there by another process, through a descriptor held since the
/// standby was a live tree (a directory of an earlier generation renamed
/// back over one the mirror made). The stat cache must not take it for
/// what the plan wrote (docs/internals.md#what-the-switch-trusts).
pub(super) fn foreign_in(after: &LocalTree, touched: &[LocalName], since: i64) -> Option<RelPath> {
    touched.iter().find_map(|name| {
        let LocalName::Rel(rel) = name else {
            return None;
        };
        let ctime = after.entries.get(rel)?.stat.ctime_ns;
        let slack = match ctime % 1_000_000_000 {
            0 => COARSE_NS,
            _ => TICK_NS,
        };
        (ctime < since.saturating_sub(slack)).then(|| rel.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(rel: &str) -> RelPath {
        RelPath::parse(rel).unwrap()
    }

    /// An entry the preparation touched whose status changed before it
    /// began (less a tick, or 2 s where times are whole seconds) was put
    /// there by another process; untouched entries keep their old times.
    #[test]
    fn a_touched_entry_older_than_the_preparation_is_foreign() {
        let since: i64 = 1_800_000_000_123_456_789;
        let entry = |ctime_ns: i64| LocalEntry {
            kind: LocalKind::File,
            mode: 0o644,
            sha256: None,
            stat: FileSig {
                size: 5,
                mtime_ns: ctime_ns,
                ctime_ns,
                ino: 7,
                dev: 1,
            },
        };
        let mut tree = LocalTree::default();
        tree.entries
            .insert(rp("old/untouched.rb"), entry(since - 60_000_000_000));
        tree.entries
            .insert(rp("new/written.rb"), entry(since + 1_000_000));
        tree.entries
            .insert(rp("new/in_the_tick.rb"), entry(since - 5_000_000));
        tree.entries
            .insert(rp("new/whole_second.rb"), entry(1_799_999_999_000_000_000));
        tree.entries
            .insert(rp("d8/s2/f0.rb"), entry(since - 400_000_000));
        let names = |list: &[&str]| -> Vec<LocalName> {
            list.iter().map(|r| LocalName::Rel(rp(r))).collect()
        };
        let ours = names(&[
            "new/written.rb",
            "new/in_the_tick.rb",
            "new/whole_second.rb",
            "gone.rb",
        ]);
        assert_eq!(foreign_in(&tree, &ours, since), None);
        let all = [ours, names(&["d8/s2/f0.rb"])].concat();
        assert_eq!(foreign_in(&tree, &all, since), Some(rp("d8/s2/f0.rb")));
        assert_eq!(
            foreign_in(&tree, &names(&["old/untouched.rb"]), since),
            Some(rp("old/untouched.rb"))
        );
    }

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
        let bytes = state.encode().unwrap();
        assert_eq!(GenState::decode(&bytes), Some(state.clone()));
        let mut other = bytes.clone();
        other[STATE_MAGIC.len() - 2] = b'1';
        assert_eq!(GenState::decode(&other), None, "another format");
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(GenState::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut flipped = bytes;
        flipped[STATE_MAGIC.len() + 40] ^= 1;
        assert_eq!(GenState::decode(&flipped), None, "altered");
        // A line break in a name is held now; a name no listing can hold
        // is not.
        let mut more = state.clone();
        more.changed.push(RelPath::parse("line\nbreak").unwrap());
        assert_eq!(GenState::decode(&more.encode().unwrap()), Some(more));
        let mut broken = state;
        broken.scan.ignored = true;
        assert_eq!(broken.encode(), None);
    }
}
