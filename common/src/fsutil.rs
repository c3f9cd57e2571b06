//! Writing a small state file so that readers see the old or the new
//! version whole, never a mix, and making a set of files durable at the
//! cost of those files ([`Durable`]).
//!
//! **State files.** Both writers put the new version in a temporary file
//! beside the target and `rename(2)` it over the target:
//! - [`write_atomic`] also `fsync`s the file and then its directory, so
//!   the new version survives a crash once it returns. For records whose
//!   loss loses work: the pending loads (files committed but not yet
//!   loaded) and the plugin registry (accepted plugin versions).
//! - [`replace_atomic`] does not wait for the disk, for what every run
//!   rewrites and only reports or hints: the report, the metrics textfile,
//!   the cache. A run that changes nothing writes only these, so it makes
//!   no sync call at all (`agent_durable`).
//!
//! A file replaced without `fsync` can be **lost but never torn**. The
//! old and the new version are two inodes: the new one is written whole
//! under its temporary name before the rename, and the rename switches
//! the name in one step, so a reader before a crash opens one version or
//! the other, whole. After a crash the name holds what the journal last
//! committed: the old inode (the new version is lost) or the new inode,
//! whose bytes can only be the new version's — never the old file's, and
//! on the journaling filesystems a vardir lives on (ext4 in its default
//! `data=ordered`, XFS, btrfs) never stale blocks either: a size is
//! committed only for data written. At worst, where data is written
//! after the rename (XFS; ext4 flushes a file renamed over another first,
//! `auto_da_alloc`), the new inode is empty or cut short: the report's
//! reader refuses it as not JSON and the next run replaces it, the
//! textfile's series go missing until then, and the cache checks every
//! record against its own digest (docs/internals.md#cache).
//!
//! **Durable sets** ([`Durable`]): the files and directories one step
//! changed, made durable together. Up to [`SYNCFS_ABOVE`] of them per
//! filesystem get one `fsync` each, issued from up to [`SYNC_THREADS`]
//! threads at once (a journaling filesystem commits concurrent `fsync`s
//! together: one after another, each costs its own journal commit,
//! ~4 ms on this project's build machine); above it, one `syncfs(2)` of
//! that filesystem. `syncfs` writes back every dirty page of the
//! filesystem, other processes' included, so its cost is the machine's
//! and not ours; `fsync` of our own files waits for our own. Measured on
//! the build machine (ext4 on a virtio SSD, 4 KiB files, median of 3-5;
//! `/dev/shm` costs under 1 ms either way) — each file `fsync`ed from 16
//! threads, then its directory, vs one `syncfs`:
//!
//! | files | quiet: fsync each | quiet: syncfs | ~1 GB dirty: fsync each | ~1 GB dirty: syncfs |
//! |---|---|---|---|---|
//! | 10 | 2 ms | 10 ms | 3 ms | 1,600 ms |
//! | 30 | 7 ms | 6-12 ms | 14 ms | 1,330 ms |
//! | 100 | 18 ms | 16-95 ms | 38 ms | 1,360 ms |
//! | 300 | 57 ms | 37-43 ms | 90-230 ms | 1,090 ms |
//! | 1,000 | 160 ms | 80-120 ms | | |
//!
//! One after another instead of from 16 threads: 45, 150, 460, 1,500 and
//! 4,300 ms. So per-file `fsync` is as cheap as `syncfs` on a quiet disk
//! up to a few hundred files and never waits for another process's
//! gigabytes; above a few hundred, on a quiet disk, `syncfs` is cheaper
//! and the change is large anyway (an initial sync). The busy-node figures
//! of whole runs come from the bench's busy-node scenario (`bench/busy.py`).
//!
//! **Quiet machines.** Without a journal (ext4 as this project's bench
//! machine mounts its root), every `fsync` flushes the device's cache on
//! its own: 30 files in 15 directories and their parent (46 members),
//! quiet, took 8.9 ms `fsync`ed from 16 threads and 1.5 ms with one
//! `syncfs` (median of 12 each, alternating). So a program may declare
//! the machine quiet up to some dirty and under-writeback data
//! ([`set_quiet_dirty`]; the agent's `[switch] syncfs_below_dirty_mib`,
//! 4 MiB by default): [`Durable::sync`] then syncs every filesystem of
//! more than one member whole. On a busy machine (more dirty data than
//! that, `/proc/meminfo`) nothing changes. A writer that starts between
//! the look and the `syncfs` costs that run its dirty data's writeback,
//! never durability.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The name prefix of the temporary files [`write_atomic`] and
/// [`replace_atomic`] create beside their target.
pub const TMP_PREFIX: &str = ".pluginsync-tmp-";

/// Removes the temporary files a killed writer left in `dir` (not below
/// it); returns how many. Call it only while no writer can be running
/// (the agent holds its run lock).
pub fn remove_leftovers(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(TMP_PREFIX))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in the
/// same directory (so the rename cannot cross filesystems), mode `mode`,
/// `fsync`, `rename` over `path`, then `fsync` of the directory so the
/// rename itself is on disk. For records whose loss loses work (module
/// docs).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write(path, bytes, mode, true)
}

/// Writes `bytes` to `path` atomically (a temporary file in the same
/// directory renamed over `path`) without waiting for the disk: after a
/// crash `path` holds the old version, the new one, or — on filesystems
/// that write data after the rename — the new one empty or cut short;
/// never a mix (module docs). Only for state its reader validates and
/// may discard, and that the next run writes again.
pub fn replace_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write(path, bytes, mode, false)
}

/// [`replace_atomic`] in two steps: `bytes` written now beside `path`
/// under a temporary name (what [`remove_leftovers`] removes after a
/// kill), put in place by [`Written::put`], removed if dropped instead.
/// For a file whose content is known before the step that lets it be
/// written (the agent's cache, before its switch).
pub fn write_beside(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<Written> {
    write_beside_synced(path, bytes, mode, false)
}

/// [`write_beside`], the temporary file synced (content and mode) through
/// the descriptor that wrote it when `durable`.
fn write_beside_synced(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durable: bool,
) -> std::io::Result<Written> {
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(parent_of(path))?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    if durable {
        tmp.as_file().sync_all()?;
    }
    Ok(Written {
        tmp: tmp.into_temp_path(),
        path: path.to_owned(),
    })
}

/// A file [`write_beside`] wrote, not in place yet.
#[derive(Debug)]
pub struct Written {
    tmp: tempfile::TempPath,
    path: PathBuf,
}

impl Written {
    /// Renames it over its path (not synced, as [`replace_atomic`]).
    pub fn put(self) -> std::io::Result<()> {
        self.tmp.persist(&self.path).map_err(|e| e.error)
    }
}

fn write(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> std::io::Result<()> {
    write_beside_synced(path, bytes, mode, durable)?.put()?;
    if durable {
        std::fs::File::open(parent_of(path))?.sync_all()?;
    }
    Ok(())
}

/// The directory holding `path` (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Above this many files and directories to make durable on one
/// filesystem, one `syncfs(2)` of it instead of one `fsync` each (module
/// docs: the measurement).
pub const SYNCFS_ABOVE: usize = 256;

/// At most this many `fsync`s in flight at once (module docs).
pub const SYNC_THREADS: usize = 16;

/// How one filesystem's share of a [`Durable`] set reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// One `fsync` (or `fdatasync`) per file or directory.
    Each,
    /// One `syncfs` of the whole filesystem.
    Syncfs,
}

impl Strategy {
    /// The strategy for `items` distinct files and directories on one
    /// filesystem: [`Strategy::Each`] up to [`SYNCFS_ABOVE`].
    pub fn for_items(items: usize) -> Strategy {
        if items > SYNCFS_ABOVE {
            Strategy::Syncfs
        } else {
            Strategy::Each
        }
    }
}

/// What of a file must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Its data, and the metadata needed to read it back: `fdatasync`.
    Data,
    /// Its data and all its metadata (mode, a directory's entries):
    /// `fsync`.
    All,
}

/// One member of a [`Durable`] set.
#[derive(Debug)]
struct Item {
    fd: OwnedFd,
    need: Need,
    /// For messages.
    path: PathBuf,
}

/// A set of open files and directories to make durable together, each
/// once (by device and inode); see the module docs for how.
///
/// It holds at most [`SYNCFS_ABOVE`] descriptors per filesystem: once a
/// filesystem has more members than that it will be synced whole, so only
/// one of its descriptors is kept (for `syncfs`) and the others are
/// counted, not held — a first sync of 50,000 files must not run out of
/// descriptors making them durable.
#[derive(Debug, Default)]
pub struct Durable {
    devices: HashMap<u64, Device>,
}

/// One filesystem's share of a [`Durable`] set.
#[derive(Debug, Default)]
struct Device {
    /// Members kept open to sync one by one (empty once `whole` is set).
    items: Vec<Item>,
    /// Inode → index in `items` (kept while `whole` is `None`), for
    /// counting each member once and keeping its largest [`Need`].
    seen: HashMap<u64, usize>,
    /// Distinct members counted.
    count: usize,
    /// Set above [`SYNCFS_ABOVE`] members: the one descriptor kept, for
    /// `syncfs`.
    whole: Option<Item>,
}

/// What [`Durable::sync`] did, for the debug log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// Files and directories synced one by one.
    pub each: usize,
    /// Filesystems synced whole.
    pub syncfs: usize,
}

impl Durable {
    /// An empty set.
    pub fn new() -> Durable {
        Durable::default()
    }

    /// Adds the open file or directory `fd` (`path` names it in
    /// messages); one already in the set keeps the larger [`Need`].
    pub fn add(&mut self, fd: BorrowedFd<'_>, need: Need, path: &Path) -> std::io::Result<()> {
        let st = rustix::fs::fstat(fd)?;
        let dev = self.devices.entry(st.st_dev).or_default();
        if let Some(&i) = dev.seen.get(&st.st_ino) {
            if let Some(item) = dev.items.get_mut(i) {
                item.need = item.need.max(need);
            }
            return Ok(());
        }
        dev.seen.insert(st.st_ino, dev.items.len());
        dev.count += 1;
        if dev.whole.is_some() {
            return Ok(());
        }
        dev.items.push(Item {
            fd: fd.try_clone_to_owned()?,
            need,
            path: path.to_owned(),
        });
        if Strategy::for_items(dev.count) == Strategy::Syncfs {
            // Synced whole from now on: one descriptor is enough.
            dev.whole = dev.items.drain(..).next();
        }
        Ok(())
    }

    /// Adds `count` members of the filesystem `fd` is on without opening
    /// each: for a caller that knows it has more than [`SYNCFS_ABOVE`] of
    /// them, so that filesystem is synced whole through `fd` (`path` names
    /// it in messages). Members are not told apart, so a member also added
    /// one by one is counted twice: harmless, the filesystem is synced
    /// whole either way.
    pub fn add_whole(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        path: &Path,
    ) -> std::io::Result<()> {
        let st = rustix::fs::fstat(fd)?;
        let dev = self.devices.entry(st.st_dev).or_default();
        dev.count += count.max(SYNCFS_ABOVE + 1);
        if dev.whole.is_none() {
            dev.items.clear();
            dev.whole = Some(Item {
                fd: fd.try_clone_to_owned()?,
                need: Need::All,
                path: path.to_owned(),
            });
        }
        Ok(())
    }

    /// Whether the filesystem `dev` (a stat's `st_dev`) is synced whole:
    /// anything on it is made durable without being added.
    pub fn syncs_whole(&self, dev: u64) -> bool {
        self.devices.get(&dev).is_some_and(|d| d.whole.is_some())
    }

    /// Adds every member of `other`: its descriptors one by one, and the
    /// filesystems it syncs whole as such (a commit's set taking in the
    /// staged files it renames, so both are synced in one step).
    pub fn absorb(&mut self, other: Durable) -> std::io::Result<()> {
        for dev in other.devices.into_values() {
            if let Some(whole) = dev.whole {
                self.add_whole(whole.fd.as_fd(), dev.count, &whole.path)?;
            }
            for item in dev.items {
                self.add(item.fd.as_fd(), item.need, &item.path)?;
            }
        }
        Ok(())
    }

    /// Opens `path` (a file or a directory, read-only, following links:
    /// only for trusted paths) and adds it.
    pub fn add_path(&mut self, path: &Path, need: Need) -> std::io::Result<()> {
        let file = std::fs::File::open(path)?;
        self.add(file.as_fd(), need, path)
    }

    /// Distinct files and directories in the set.
    pub fn len(&self) -> usize {
        self.devices.values().map(|d| d.count).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The strategy of each filesystem in the set (by device), from how
    /// many of its members the set holds.
    pub fn plan(&self) -> HashMap<u64, Strategy> {
        self.devices
            .iter()
            .map(|(&dev, d)| (dev, Strategy::for_items(d.count)))
            .collect()
    }

    /// [`Durable::sync`] for a step that fails on its first failure: an
    /// empty set makes no call; what was done is logged as `what`.
    pub fn sync_logged(self, what: &str) -> Result<(), (PathBuf, std::io::Error)> {
        if self.is_empty() {
            return Ok(());
        }
        let synced = self
            .sync()
            .map_err(|mut failures| failures.swap_remove(0))?;
        tracing::debug!(each = synced.each, syncfs = synced.syncfs, "{what}");
        Ok(())
    }

    /// Makes every member durable, [`Durable::plan`]'s way, except that on
    /// a quiet machine ([`machine_is_quiet`]) a filesystem with more than
    /// one member is synced whole too; returns what it did, or every
    /// failure (path, error) when any failed. An empty set makes no call.
    pub fn sync(self) -> Result<Synced, Vec<(PathBuf, std::io::Error)>> {
        let mut failures = Vec::new();
        let mut done = Synced::default();
        let mut each = Vec::new();
        let several = |d: &Device| d.whole.is_none() && d.items.len() > 1;
        let quiet = self.devices.values().any(several) && machine_is_quiet();
        for (_, mut dev) in self.devices {
            if quiet && dev.items.len() > 1 {
                dev.whole = dev.items.drain(..).next();
            }
            match dev.whole {
                Some(item) => {
                    done.syncfs += 1;
                    if let Err(e) = rustix::fs::syncfs(&item.fd) {
                        failures.push((item.path, e.into()));
                    }
                }
                None => each.extend(dev.items),
            }
        }
        done.each = each.len();
        failures.extend(sync_each(&each));
        if failures.is_empty() {
            Ok(done)
        } else {
            Err(failures)
        }
    }

    /// Descriptors the set holds open now (tests: bounded by
    /// [`SYNCFS_ABOVE`] per filesystem).
    pub fn open_descriptors(&self) -> usize {
        self.devices
            .values()
            .map(|d| d.items.len() + usize::from(d.whole.is_some()))
            .sum()
    }
}

/// Up to how many bytes of dirty and under-writeback data the machine
/// counts as quiet ([`set_quiet_dirty`]); 0, until a program sets it:
/// never.
static QUIET_DIRTY: AtomicU64 = AtomicU64::new(0);

/// Sets, for the whole process, up to how many bytes of dirty and
/// under-writeback data the machine counts as quiet (0: never quiet, every
/// set of up to [`SYNCFS_ABOVE`] members is synced one by one).
pub fn set_quiet_dirty(bytes: u64) {
    QUIET_DIRTY.store(bytes, Ordering::Relaxed);
}

/// Whether the machine's dirty and under-writeback data is at most the
/// quiet limit ([`set_quiet_dirty`]): then one `syncfs` writes little
/// besides our own and costs one device flush instead of one per member.
/// Unreadable: not quiet.
pub fn machine_is_quiet() -> bool {
    let limit = QUIET_DIRTY.load(Ordering::Relaxed);
    limit > 0
        && std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| unsettled_bytes(&m))
            .is_some_and(|b| b <= limit)
}

/// `Dirty` + `Writeback` of a `/proc/meminfo` text, in bytes.
fn unsettled_bytes(meminfo: &str) -> Option<u64> {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let kb = l.strip_prefix(name)?.trim().strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok()
        })
    };
    Some((field("Dirty:")? + field("Writeback:")?) * 1024)
}

/// `fsync`s (or `fdatasync`s) `items` from up to [`SYNC_THREADS`] threads;
/// returns the failures.
fn sync_each(items: &[Item]) -> Vec<(PathBuf, std::io::Error)> {
    let one = |item: &Item| match item.need {
        Need::Data => rustix::fs::fdatasync(&item.fd),
        Need::All => rustix::fs::fsync(&item.fd),
    };
    if items.len() <= 1 {
        return items
            .iter()
            .filter_map(|i| one(i).err().map(|e| (i.path.clone(), e.into())))
            .collect();
    }
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..items.len().min(SYNC_THREADS) {
            s.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = one(item) {
                        failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((item.path.clone(), e.into()));
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_unsettled_data_is_dirty_plus_writeback() {
        let meminfo = "MemTotal:       24000000 kB\nDirty:              1536 kB\n\
                       Writeback:           512 kB\nWritebackTmp:         7 kB\n";
        assert_eq!(unsettled_bytes(meminfo), Some(2048 * 1024));
        assert_eq!(unsettled_bytes("Dirty: 1 kB\n"), None);
        assert_eq!(unsettled_bytes("Dirty: x kB\nWriteback: 0 kB\n"), None);
    }

    #[test]
    fn syncfs_only_above_the_threshold() {
        assert_eq!(Strategy::for_items(0), Strategy::Each);
        assert_eq!(Strategy::for_items(1), Strategy::Each);
        assert_eq!(Strategy::for_items(SYNCFS_ABOVE), Strategy::Each);
        assert_eq!(Strategy::for_items(SYNCFS_ABOVE + 1), Strategy::Syncfs);
        assert_eq!(Strategy::for_items(100_000), Strategy::Syncfs);
    }

    #[test]
    fn a_set_counts_each_file_once_per_filesystem() {
        let disk = tempfile::tempdir().unwrap();
        let mut set = Durable::new();
        assert!(set.is_empty());
        assert_eq!(set.plan(), HashMap::new());
        // The same directory three times, once by another descriptor, and
        // a file first for its data then for everything: two members.
        for _ in 0..3 {
            set.add_path(disk.path(), Need::All).unwrap();
        }
        let f = disk.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        set.add_path(&f, Need::Data).unwrap();
        set.add_path(&f, Need::All).unwrap();
        assert_eq!(set.len(), 2);
        let dev = std::fs::metadata(disk.path()).unwrap().dev();
        assert_eq!(set.devices[&dev].items[1].need, Need::All);
        assert_eq!(set.plan(), HashMap::from([(dev, Strategy::Each)]));
        assert_eq!(set.sync().unwrap(), Synced { each: 2, syncfs: 0 });
        assert_eq!(Durable::new().sync().unwrap(), Synced::default());
    }

    #[test]
    fn a_set_absorbs_another_member_by_member_or_whole() {
        let disk = tempfile::tempdir().unwrap();
        let f = disk.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let (mut commit, mut staged) = (Durable::new(), Durable::new());
        commit.add_path(disk.path(), Need::All).unwrap();
        staged.add_path(&f, Need::All).unwrap();
        // The same directory in both: one member.
        staged.add_path(disk.path(), Need::All).unwrap();
        commit.absorb(staged).unwrap();
        assert_eq!(commit.len(), 2);
        assert_eq!(commit.sync().unwrap(), Synced { each: 2, syncfs: 0 });
        // A set synced whole makes the other's filesystem synced whole.
        let mut big = Durable::new();
        let dir = std::fs::File::open(disk.path()).unwrap();
        big.add_whole(dir.as_fd(), SYNCFS_ABOVE + 1, disk.path())
            .unwrap();
        let mut commit = Durable::new();
        commit.add_path(&f, Need::All).unwrap();
        commit.absorb(big).unwrap();
        assert_eq!(commit.open_descriptors(), 1);
        assert_eq!(commit.sync().unwrap(), Synced { each: 0, syncfs: 1 });
    }

    #[test]
    fn above_the_threshold_one_filesystem_is_synced_whole_and_the_other_each() {
        let disk = tempfile::tempdir().unwrap();
        let mut set = Durable::new();
        for i in 0..=SYNCFS_ABOVE {
            let f = disk.path().join(i.to_string());
            std::fs::write(&f, b"x").unwrap();
            set.add_path(&f, Need::All).unwrap();
        }
        let dev = std::fs::metadata(disk.path()).unwrap().dev();
        let mut want = HashMap::from([(dev, Strategy::Syncfs)]);
        // Another filesystem, where the machine has one: its one member
        // is synced by itself.
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        if let Some(shm) = &shm {
            set.add_path(shm.path(), Need::All).unwrap();
            let other = std::fs::metadata(shm.path()).unwrap().dev();
            if other != dev {
                want.insert(other, Strategy::Each);
            }
        }
        assert_eq!(set.plan(), want);
        let synced = set.sync().unwrap();
        assert_eq!(synced.syncfs, 1);
        assert_eq!(synced.each, want.len() - 1);
    }

    #[test]
    fn a_large_set_holds_one_descriptor_per_filesystem_synced_whole() {
        // 50,000 staged files of a first sync ran the agent out of
        // descriptors (EMFILE) when the set held one per file.
        let disk = tempfile::tempdir().unwrap();
        let mut set = Durable::new();
        let n = SYNCFS_ABOVE * 8;
        for i in 0..n {
            let f = disk.path().join(i.to_string());
            std::fs::write(&f, b"x").unwrap();
            set.add_path(&f, Need::Data).unwrap();
            assert!(set.open_descriptors() <= SYNCFS_ABOVE);
        }
        assert_eq!(set.open_descriptors(), 1);
        assert_eq!(set.len(), n);
        // Adding a member again counts it once.
        set.add_path(&disk.path().join("0"), Need::All).unwrap();
        assert_eq!(set.len(), n);
        let synced = set.sync().unwrap();
        assert_eq!((synced.syncfs, synced.each), (1, 0));
    }

    #[test]
    fn replaces_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"old", 0o644).unwrap();
        write_atomic(&p, b"new contents", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new contents");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn replace_is_atomic_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache.json");
        replace_atomic(&p, b"one", 0o600).unwrap();
        replace_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn leftovers_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".pluginsync-tmp-abc"), b"half").unwrap();
        std::fs::write(dir.path().join("keep.json"), b"{}").unwrap();
        assert_eq!(remove_leftovers(dir.path()), 1);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("keep.json")]);
        assert_eq!(remove_leftovers(&dir.path().join("missing")), 0);
    }

    #[test]
    fn fails_cleanly_in_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_atomic(&dir.path().join("no/such/file"), b"x", 0o644).is_err());
    }
}
