//! What the agent remembers between runs, per mount, in `<vardir>/cache/`:
//!
//! - the last listing's body and `ETag`, with the key it was fetched with
//!   (server, environment, parameters), for `If-None-Match`; the body is
//!   also the base a delta listing is applied to (docs/protocol.md §7.5,
//!   `delta.rs`), used only when this record describes it;
//! - a stat cache: relative path → (size, mtime, ctime, inode, device,
//!   sha256), so a file is hashed again only when its stat changed;
//! - the digest of the destination's stat scan right after the last sync.
//!
//! The policy lives here too: which `ETag` a listing request may send
//! ([`MountCache::if_none_match`]), what a `304 Not Modified` means
//! ([`MountCache::not_modified`]: a 304 plus a stat scan whose digest equals
//! the recorded one means neither side changed, and the pass ends with
//! nothing else read or sent), and what a clean commit leaves behind
//! ([`remember`]). Everything here is a hint: a missing or unreadable cache
//! only makes the run slower, a stale stat never hides a changed file (the
//! stat would differ), and nothing from the cache overrides a listing's
//! checksum. Files are replaced atomically but not fsynced
//! ([`pluginsync_common::fsutil::replace_atomic`]): a cache lost in a crash
//! costs one slower run, while two fsyncs per file cost every changed run
//! (docs/internals.md#caches-without-fsync).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use pluginsync_common::digest::{Sealed, Sha256, Unsealed};
use pluginsync_common::etag::ETag;
use pluginsync_common::fsutil::{Written, replace_atomic, write_beside};
use pluginsync_common::generation::GenerationId;
use pluginsync_common::metadata::FileMetadata;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use serde::{Deserialize, Serialize};

use crate::listing::{RemoteKind, RemoteTree};
use crate::plan::Plan;
use crate::scan::LocalTree;

pub use pluginsync_common::filesig::FileSig;

/// What a `304 Not Modified` for a listing means for the pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotModified {
    /// Neither the master's tree nor ours changed since the last sync: the
    /// pass is done.
    Unchanged,
    /// The master's tree did not change but ours may have: plan against
    /// the cached listing.
    Cached(Vec<u8>),
    /// The cached listing is gone: fetch it again, unconditionally.
    Refetch,
}

/// The listing a pass planned against, as the cache records it.
#[derive(Debug, Clone)]
pub struct ListingStamp {
    /// Cache key ([`MountCache::key`]) of the listing.
    pub key: String,
    /// Its `ETag`.
    pub etag: Option<ETag>,
    /// A newly fetched body, to cache; `None` when the cached one is
    /// current.
    pub fresh: Option<Bytes>,
    /// The sha256 of the listing body the pass planned against.
    pub listing_sha256: Option<Sha256>,
}

/// The cache of one mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountCache {
    /// `server|environment|parameters` of the cached listing.
    pub key: String,
    /// Its `ETag`, if the server sent one.
    pub etag: Option<ETag>,
    /// Digest of the destination's stat scan after the last sync (hex on
    /// disk, as every digest here).
    pub scan_digest: Option<Sha256>,
    /// Entries below `"."` in the cached listing.
    pub entries: usize,
    /// The sha256 of the listing body this record describes. The
    /// three cache files are replaced one after the other, so a run killed
    /// in between can leave a new listing beside an old record (old `ETag`):
    /// a cached body is used only when its digest is this one, so such a
    /// torn cache costs one full listing instead of planning against the
    /// wrong tree forever (a master rolled back answers 304 to the old
    /// `ETag`). `None` only in records written before this field existed.
    #[serde(default)]
    pub listing_sha256: Option<Sha256>,
    /// Stat cache: relative path → (stat, sha256). Kept in its own
    /// file and read only when a pass needs hashing ([`MountCache::load_files`]),
    /// so a no-op run does not parse it.
    #[serde(skip)]
    pub files: HashMap<String, (FileSig, Sha256)>,
}

impl MountCache {
    fn dir(vardir: &Path) -> PathBuf {
        vardir.join("cache")
    }

    /// Reads the cache of `mount`; anything unreadable is an empty cache.
    pub fn load(vardir: &Path, mount: Mount) -> MountCache {
        let path = Self::dir(vardir).join(format!("{mount}.json"));
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Reads the stat cache of `mount` into `self.files`: `<mount>.stat`
    /// ([`decode_stat_cache`]), or the JSON `<mount>.stat.json` an older
    /// agent wrote.
    pub fn load_files(&mut self, vardir: &Path, mount: Mount) {
        if !self.files.is_empty() {
            return;
        }
        let dir = Self::dir(vardir);
        self.files = match std::fs::read(dir.join(format!("{mount}.stat"))) {
            Ok(b) => decode_stat_cache(&b).unwrap_or_default(),
            Err(_) => std::fs::read(dir.join(format!("{mount}.stat.json")))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default(),
        };
    }

    /// The cached listing body of `mount`.
    pub fn load_listing(vardir: &Path, mount: Mount) -> Option<Vec<u8>> {
        std::fs::read(Self::dir(vardir).join(format!("{mount}.listing.json"))).ok()
    }

    /// The modules the cached listing of `mount` served `paths` from, the
    /// module with the most of them first: the directory above each
    /// entry's search base (`path`: `…/modules/<module>/lib` or
    /// `…/facts.d`, as Puppet and the master send it). Empty without a
    /// cached listing; what the removal guard names
    /// (docs/agent.md#the-removal-guard).
    pub fn modules_of(vardir: &Path, mount: Mount, paths: &[&RelPath]) -> Vec<String> {
        let Some(listing) = Self::load_listing(vardir, mount)
            .and_then(|b| serde_json::from_slice::<Vec<FileMetadata>>(&b).ok())
        else {
            return Vec::new();
        };
        let wanted: HashSet<&str> = paths.iter().map(|p| p.as_str()).collect();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for entry in &listing {
            let Some(rel) = entry.relative_path.as_deref() else {
                continue;
            };
            let module = Path::new(entry.path.trim_end_matches('/'))
                .parent()
                .and_then(Path::file_name);
            if let (true, Some(m)) = (wanted.contains(rel), module) {
                *counts.entry(m.to_string_lossy().into_owned()).or_default() += 1;
            }
        }
        let mut modules: Vec<(String, usize)> = counts.into_iter().collect();
        modules.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        modules.into_iter().map(|(m, _)| m).collect()
    }

    /// The key of the listing of `mount` from `server` asked with `query`
    /// (the listing's query string).
    pub fn key(server: &str, mount: Mount, query: &str) -> String {
        format!("{server}|{mount}|{query}")
    }

    /// The `If-None-Match` for a listing with `key`: the cached `ETag`, only
    /// if the cached listing was fetched with the same key.
    pub fn if_none_match(&self, key: &str) -> Option<ETag> {
        if self.key == key {
            self.etag.clone()
        } else {
            None
        }
    }

    /// What a 304 for `mount` means, given the digest of this run's scan.
    pub fn not_modified(&self, vardir: &Path, mount: Mount, scan_digest: &Sha256) -> NotModified {
        if self.scan_digest.as_ref() == Some(scan_digest) {
            return NotModified::Unchanged;
        }
        match Self::load_listing(vardir, mount) {
            Some(body) if self.describes(&body) => NotModified::Cached(body),
            _ => NotModified::Refetch,
        }
    }

    /// Whether `body` is the listing this record was written for.
    pub fn describes(&self, body: &[u8]) -> bool {
        self.listing_sha256
            .is_none_or(|want| Sha256::of(body) == want)
    }

    /// Writes the cache (and the listing body, when given), each file
    /// atomically and durably.
    pub fn save(&self, vardir: &Path, mount: Mount, listing: Option<&[u8]>) -> std::io::Result<()> {
        let stat = write_stat(vardir, mount, &encode_stat_cache(&self.files))?;
        self.finish(vardir, mount, listing, stat)
    }

    /// [`MountCache::save`] with its stat cache written already (`stat`).
    fn finish(
        &self,
        vardir: &Path,
        mount: Mount,
        listing: Option<&[u8]>,
        stat: Written,
    ) -> std::io::Result<()> {
        let dir = Self::dir(vardir);
        let write = |name: String, bytes: &[u8]| replace_atomic(&dir.join(name), bytes, 0o600);
        if let Some(body) = listing {
            write(format!("{mount}.listing.json"), body)?;
        }
        stat.put()?;
        let _gone_is_fine = std::fs::remove_file(dir.join(format!("{mount}.stat.json")));
        write(format!("{mount}.json"), &serde_json::to_vec(self)?)
    }

    /// Removes the cached listing body of `mount`: a pass planned from a
    /// generation keeps no listing (the generation's manifest is the
    /// cache, [`GenerationRecord`]).
    pub fn forget_listing(vardir: &Path, mount: Mount) {
        let path = Self::dir(vardir).join(format!("{mount}.listing.json"));
        let _missing_is_fine = std::fs::remove_file(path);
    }

    /// Forgets everything about `mount` (after a failed commit).
    pub fn clear(vardir: &Path, mount: Mount) {
        let dir = Self::dir(vardir);
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.json")));
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.listing.json")));
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.stat")));
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.stat.json")));
    }

    /// The cached sha256 of `rel`, if its stat is still `stat`.
    pub fn sha256(&self, rel: &RelPath, stat: &FileSig) -> Option<Sha256> {
        self.files
            .get(rel.as_str())
            .filter(|(s, _)| s == stat)
            .map(|(_, sha)| *sha)
    }
}

/// A stat cache's `bytes` written beside its place (`<mount>.stat`), not
/// in place yet (`MountCache::finish` puts it there).
fn write_stat(vardir: &Path, mount: Mount, bytes: &[u8]) -> std::io::Result<Written> {
    let dir = MountCache::dir(vardir);
    std::fs::create_dir_all(&dir)?;
    write_beside(&dir.join(format!("{mount}.stat")), bytes, 0o600)
}

/// A mount's cache made, its stat cache written beside its place, not
/// saved yet ([`learn`]); dropped, it leaves nothing.
pub struct Learned {
    cache: MountCache,
    stat: std::io::Result<Written>,
}

impl Learned {
    /// Saves it; a failure is only logged (the cache is a hint).
    pub fn save_logged(self, vardir: &Path, mount: Mount, stamp: &ListingStamp) {
        let listing = stamp.fresh.as_deref();
        let saved = (self.stat).and_then(|stat| self.cache.finish(vardir, mount, listing, stat));
        if let Err(e) = saved {
            tracing::warn!(vardir = %vardir.display(), error = %e, "cannot save the sync cache");
        }
    }
}

/// What a clean commit of `mount` into `dest` left, to save
/// ([`Learned::save_logged`]): the listing (`stamp`, `remote`), the stat
/// of every synced file with its (verified) sha256, and the digest of the
/// destination's scan. `before` is the scan the `plan` was made from,
/// with its digest (taken when it was scanned); the paths the plan
/// touched (and their parent directories) are stat'ed again, with no
/// second walk. After a switch (the standby's scan, an empty plan) it is
/// made, its stat cache written, on a thread while the switch runs, and
/// saved once it succeeded (docs/internals.md#the-switch).
pub fn learn(
    vardir: &Path,
    mount: Mount,
    dest: &Path,
    stamp: &ListingStamp,
    remote: &RemoteTree,
    plan: &Plan,
    before: (&LocalTree, Sha256),
) -> Learned {
    let (cache, bytes) = learn_cache(dest, stamp, remote, plan, before);
    let stat = write_stat(vardir, mount, &bytes);
    Learned { cache, stat }
}

/// The cache [`learn`] saves, its stat cache as bytes (not in its
/// `files`: a map of 3,000 paths built only to be encoded cost a 1 % run
/// a millisecond).
fn learn_cache(
    dest: &Path,
    stamp: &ListingStamp,
    remote: &RemoteTree,
    plan: &Plan,
    (before, before_digest): (&LocalTree, Sha256),
) -> (MountCache, Vec<u8>) {
    let touched: Vec<_> = plan.changes().collect();
    // Nothing touched (a switched tree, scanned already): no copy of it.
    let updated;
    let (after, after_digest) = if touched.is_empty() {
        (before, before_digest)
    } else {
        updated = before.updated(dest, &touched);
        (&updated, updated.digest())
    };
    let written: HashSet<&RelPath> = plan.writes().map(|(r, _)| r).collect();
    let mut files = StatEncoder::new(remote.entries.len());
    // The three maps are sorted by path: one walk of each, no lookups.
    let (mut now_at, mut then_at) = (
        after.entries.iter().peekable(),
        before.entries.iter().peekable(),
    );
    for (rel, entry) in remote.entries.iter() {
        let RemoteKind::File { digest } = &entry.kind else {
            continue;
        };
        while now_at.next_if(|(k, _)| *k < rel).is_some() {}
        let Some((_, now)) = now_at.next_if(|(k, _)| *k == rel) else {
            continue;
        };
        // A file we did not write must still be the one we hashed (or
        // found in the cache); otherwise it changed under us: not cached.
        let unchanged = written.contains(rel) || {
            while then_at.next_if(|(k, _)| *k < rel).is_some() {}
            then_at
                .peek()
                .is_some_and(|(k, then)| *k == rel && then.stat == now.stat)
        };
        if unchanged {
            files.push(rel.as_str(), &now.stat, digest);
        }
    }
    let cache = MountCache {
        key: stamp.key.clone(),
        etag: stamp.etag.clone(),
        scan_digest: Some(after_digest),
        entries: remote.entries.len(),
        listing_sha256: stamp.listing_sha256,
        files: HashMap::new(),
    };
    (cache, files.finish())
}

/// The first bytes of a stat cache file (`<mount>.stat`).
const STAT_MAGIC: &[u8] = b"pluginsync-stat 1\n";

/// A stat cache as bytes (docs/internals.md#cache): [`STAT_MAGIC`], the
/// entry count (u32), then per entry its path's length (u16) and bytes,
/// size, mtime, ctime, inode and device (8 bytes each) and the sha256,
/// all little-endian; then the sha256 of everything before it. A binary
/// file, not JSON: a 1 % run reads and writes the stat cache of every
/// file, and JSON cost ~10 ms of it on 3,000 files
/// (docs/internals.md#the-scans-queue-and-binary-records).
pub fn encode_stat_cache(files: &HashMap<String, (FileSig, Sha256)>) -> Vec<u8> {
    let mut out = StatEncoder::new(files.len());
    for (path, (sig, sha)) in files {
        out.push(path, sig, sha);
    }
    out.finish()
}

/// A stat cache's bytes ([`encode_stat_cache`]) built entry by entry, the
/// count filled in at the end: no map of paths needed to write one.
struct StatEncoder {
    out: Sealed,
    count_at: usize,
    count: u32,
}

impl StatEncoder {
    fn new(capacity: usize) -> StatEncoder {
        let mut out = Sealed::new(STAT_MAGIC, 4 + capacity * 128);
        let count_at = out.bytes.len();
        out.u32(0);
        StatEncoder {
            out,
            count_at,
            count: 0,
        }
    }

    /// One entry; a path longer than the format holds is left out.
    fn push(&mut self, path: &str, sig: &FileSig, sha: &Sha256) {
        if self.out.text(path).is_some() {
            self.out.bytes.extend_from_slice(&sig.to_le_bytes());
            self.out.bytes.extend_from_slice(&sha.0);
            self.count += 1;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let at = self.count_at..self.count_at + 4;
        self.out.bytes[at].copy_from_slice(&self.count.to_le_bytes());
        self.out.seal()
    }
}

/// [`encode_stat_cache`]'s bytes back; `None` for anything else (cut,
/// torn, another format): the cache is only a hint.
pub fn decode_stat_cache(bytes: &[u8]) -> Option<HashMap<String, (FileSig, Sha256)>> {
    let mut r = Unsealed::open(bytes, STAT_MAGIC)?;
    let count = r.u32()? as usize;
    let mut files = HashMap::with_capacity(count.min(1 << 20));
    for _ in 0..count {
        let path = r.text()?.to_owned();
        let sig = FileSig::from_le_bytes(&r.array()?);
        files.insert(path, (sig, Sha256(r.array()?)));
    }
    r.is_done().then_some(files)
}

/// What the agent remembers of the generation it committed, per
/// environment (docs/protocol.md §4.11): `<vardir>/cache/generation.<env>.json`
/// (this record) beside `generation.<env>.manifest`, the generation's
/// canonical manifest, which proves itself by the id recorded here (a
/// torn pair is a manifest that does not hash to the id: it is fetched
/// again). The stat cache and each destination's scan digest stay in the
/// per-mount records ([`MountCache`], keyed by the generation). Written
/// only by a run that committed (or found) another generation, or learnt
/// that its servers serve none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationRecord {
    /// The generation the destinations hold.
    pub generation: Option<GenerationId>,
    /// The server whose per-node answer carried `assignment_etag`.
    pub server: String,
    /// The per-node answer's `ETag`, for `If-None-Match`.
    pub assignment_etag: Option<ETag>,
    /// The `servers` list (joined by `,`) whose first server said it does
    /// not serve generations: runs sync Puppet's listings without asking
    /// again, until a listing says otherwise (`X-Pluginsync-Generations`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listings_only: Option<String>,
}

impl GenerationRecord {
    fn path(vardir: &Path, env: &str, ext: &str) -> PathBuf {
        MountCache::dir(vardir).join(format!("generation.{env}.{ext}"))
    }

    /// The record for `env`; anything unreadable is an empty record.
    pub fn load(vardir: &Path, env: &str) -> GenerationRecord {
        std::fs::read(Self::path(vardir, env, "json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The manifest bytes kept for `env`, unverified (the caller checks
    /// them against the id: `Manifest::parse`, or as a delta's base).
    pub fn load_manifest(vardir: &Path, env: &str) -> Option<Vec<u8>> {
        std::fs::read(Self::path(vardir, env, "manifest")).ok()
    }

    /// The length of the manifest kept for `env` (its file's size).
    pub fn manifest_len(vardir: &Path, env: &str) -> Option<u64> {
        std::fs::metadata(Self::path(vardir, env, "manifest"))
            .ok()
            .map(|m| m.len())
    }

    /// Writes the manifest (when given) and then the record, each
    /// atomically (not synced: a hint, as the rest of the cache).
    pub fn save(&self, vardir: &Path, env: &str, manifest: Option<&[u8]>) -> std::io::Result<()> {
        let written = manifest.map(|bytes| Self::write_manifest(vardir, env, bytes));
        self.save_written(vardir, env, written.transpose()?)
    }

    /// The manifest for `env` written beside its place, not in place yet:
    /// [`GenerationRecord::save_written`] puts it there.
    pub fn write_manifest(vardir: &Path, env: &str, bytes: &[u8]) -> std::io::Result<Written> {
        std::fs::create_dir_all(MountCache::dir(vardir))?;
        write_beside(&Self::path(vardir, env, "manifest"), bytes, 0o600)
    }

    /// [`GenerationRecord::save`] with the manifest written already.
    pub fn save_written(
        &self,
        vardir: &Path,
        env: &str,
        manifest: Option<Written>,
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(MountCache::dir(vardir))?;
        if let Some(written) = manifest {
            written.put()?;
        }
        let json = serde_json::to_vec(self)?;
        replace_atomic(&Self::path(vardir, env, "json"), &json, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modules_of_removed_files_come_from_the_cached_listing() {
        let d = tempfile::tempdir().unwrap();
        let entry = |module: &str, rel: &str| {
            format!(
                r#"{{"path":"/etc/puppetlabs/code/environments/production/modules/{module}/lib","relative_path":"{rel}","links":"follow","owner":0,"group":0,"mode":420,"checksum":null,"type":"file","destination":null}}"#
            )
        };
        let listing = format!(
            "[{},{},{},{}]",
            entry("stdlib", "a.rb"),
            entry("apt", "b.rb"),
            entry("apt", "c.rb"),
            entry("kept", "d.rb")
        );
        MountCache::default()
            .save(d.path(), Mount::Plugins, Some(listing.as_bytes()))
            .unwrap();
        let paths: Vec<RelPath> = ["a.rb", "b.rb", "c.rb", "gone.rb"]
            .iter()
            .map(|p| RelPath::parse(p).unwrap())
            .collect();
        let refs: Vec<&RelPath> = paths.iter().collect();
        assert_eq!(
            MountCache::modules_of(d.path(), Mount::Plugins, &refs),
            ["apt", "stdlib"],
            "most files first"
        );
        assert!(MountCache::modules_of(d.path(), Mount::Pluginfacts, &refs).is_empty());
    }

    #[test]
    fn round_trip_and_stat_match() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x");
        std::fs::write(&f, "a").unwrap();
        let stat = FileSig::of(&std::fs::symlink_metadata(&f).unwrap());
        let mut c = MountCache {
            key: "k".into(),
            etag: Some("\"e\"".into()),
            ..Default::default()
        };
        let x = RelPath::parse("x").unwrap();
        c.files.insert("x".into(), (stat, Sha256::of(b"abc")));
        c.save(d.path(), Mount::Plugins, Some(b"[]")).unwrap();
        let mut back = MountCache::load(d.path(), Mount::Plugins);
        assert!(back.files.is_empty(), "the stat cache is read on demand");
        back.load_files(d.path(), Mount::Plugins);
        assert_eq!(back, c);
        assert_eq!(back.sha256(&x, &stat), Some(Sha256::of(b"abc")));
        std::fs::write(&f, "bb").unwrap();
        let changed = FileSig::of(&std::fs::symlink_metadata(&f).unwrap());
        assert_eq!(back.sha256(&x, &changed), None, "a changed stat is a miss");
        assert_eq!(
            MountCache::load_listing(d.path(), Mount::Plugins).unwrap(),
            b"[]"
        );
        assert_eq!(
            back.if_none_match("k").as_ref().map(ETag::as_str),
            Some("\"e\""),
            "same key: the ETag is sent"
        );
        assert_eq!(back.if_none_match("other"), None);
        MountCache::clear(d.path(), Mount::Plugins);
        assert_eq!(
            MountCache::load(d.path(), Mount::Plugins),
            MountCache::default()
        );
    }

    #[test]
    fn a_torn_cache_is_never_planned_against() {
        let d = tempfile::tempdir().unwrap();
        let old = MountCache {
            etag: Some("\"old\"".into()),
            scan_digest: Some(Sha256::of(b"s")),
            listing_sha256: Some(Sha256::of(b"[old]")),
            ..Default::default()
        };
        old.save(d.path(), Mount::Plugins, Some(b"[old]")).unwrap();
        assert_eq!(
            old.not_modified(d.path(), Mount::Plugins, &Sha256::of(b"t")),
            NotModified::Cached(b"[old]".to_vec())
        );
        // Killed after the new listing was written, before its record: the
        // old record (and ETag) beside the new body.
        std::fs::write(d.path().join("cache/plugins.listing.json"), b"[new]").unwrap();
        let back = MountCache::load(d.path(), Mount::Plugins);
        assert_eq!(back, old);
        assert_eq!(
            back.not_modified(d.path(), Mount::Plugins, &Sha256::of(b"t")),
            NotModified::Refetch
        );
    }

    #[test]
    fn a_304_ends_the_pass_only_when_the_scan_is_unchanged_too() {
        let d = tempfile::tempdir().unwrap();
        let c = MountCache {
            scan_digest: Some(Sha256::of(b"s")),
            ..Default::default()
        };
        assert_eq!(
            c.not_modified(d.path(), Mount::Plugins, &Sha256::of(b"s")),
            NotModified::Unchanged
        );
        assert_eq!(
            c.not_modified(d.path(), Mount::Plugins, &Sha256::of(b"t")),
            NotModified::Refetch
        );
        c.save(d.path(), Mount::Plugins, Some(b"[]")).unwrap();
        assert_eq!(
            c.not_modified(d.path(), Mount::Plugins, &Sha256::of(b"t")),
            NotModified::Cached(b"[]".to_vec())
        );
    }

    /// The record keeps its format (digests as bare hex strings, as the
    /// agent wrote them when it held them as text), and a stat cache an
    /// older agent wrote as JSON is still read, then replaced.
    #[test]
    fn digests_are_hex_on_disk() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (Sha256::of(b"a"), Sha256::of(b"b"));
        std::fs::create_dir_all(d.path().join("cache")).unwrap();
        let record = format!(
            r#"{{"key":"k","etag":null,"scan_digest":"{}","entries":1,"listing_sha256":"{}"}}"#,
            a.to_hex(),
            b.to_hex()
        );
        std::fs::write(d.path().join("cache/plugins.json"), &record).unwrap();
        let stat = r#"{"x":[{"size":1,"mtime_ns":2,"ctime_ns":3,"ino":4,"dev":5},"HEX"]}"#;
        std::fs::write(
            d.path().join("cache/plugins.stat.json"),
            stat.replace("HEX", &a.to_hex()),
        )
        .unwrap();
        let mut c = MountCache::load(d.path(), Mount::Plugins);
        assert_eq!((c.scan_digest, c.listing_sha256), (Some(a), Some(b)));
        c.load_files(d.path(), Mount::Plugins);
        assert_eq!(c.files["x"].1, a);
        c.save(d.path(), Mount::Plugins, None).unwrap();
        let again = std::fs::read_to_string(d.path().join("cache/plugins.json")).unwrap();
        assert_eq!(again, record);
        assert!(!d.path().join("cache/plugins.stat.json").exists());
        let mut back = MountCache::load(d.path(), Mount::Plugins);
        back.load_files(d.path(), Mount::Plugins);
        assert_eq!(back.files, c.files);
    }

    #[test]
    fn the_stat_cache_round_trips_and_a_cut_or_altered_file_is_none() {
        let mut files = HashMap::new();
        for i in 0..50u64 {
            let sig = FileSig {
                size: i,
                mtime_ns: -(i as i64),
                ctime_ns: i as i64 * 1_000_000_007,
                ino: u64::MAX - i,
                dev: 42,
            };
            files.insert(format!("dir/é/{i}.rb"), (sig, Sha256::of(&i.to_le_bytes())));
        }
        let bytes = encode_stat_cache(&files);
        assert_eq!(decode_stat_cache(&bytes), Some(files.clone()));
        assert_eq!(
            decode_stat_cache(&encode_stat_cache(&HashMap::new())),
            Some(HashMap::new())
        );
        for cut in [0, 1, 20, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(decode_stat_cache(&bytes[..cut]), None, "cut at {cut}");
        }
        // A path the format cannot hold is left out, and counted out.
        let mut with_long = files.clone();
        let long = "x".repeat(usize::from(u16::MAX) + 1);
        let sig = files["dir/é/1.rb"].0;
        with_long.insert(long, (sig, Sha256::of(b"long")));
        assert_eq!(
            decode_stat_cache(&encode_stat_cache(&with_long)),
            Some(files.clone())
        );
        let mut altered = bytes;
        altered[40] ^= 1;
        assert_eq!(decode_stat_cache(&altered), None);
        let d = tempfile::tempdir().unwrap();
        let c = MountCache {
            files,
            ..Default::default()
        };
        c.save(d.path(), Mount::Plugins, None).unwrap();
        let mut back = MountCache::load(d.path(), Mount::Plugins);
        back.load_files(d.path(), Mount::Plugins);
        assert_eq!(back.files, c.files);
    }
}
