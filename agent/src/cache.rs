//! What the agent remembers between runs, per mount, in `<vardir>/cache/`:
//!
//! - the last listing's body and `ETag`, with the key it was fetched with
//!   (server, environment, parameters), for `If-None-Match`;
//! - a stat cache: relative path → (size, mtime, ctime, inode, device,
//!   sha256), so a file is hashed again only when its stat changed;
//! - the digest of the destination's stat scan right after the last sync.
//!
//! A `304 Not Modified` plus a stat scan whose digest equals the recorded
//! one means neither side changed: the pass ends with nothing else read or
//! sent. Everything here is a hint: a missing or unreadable cache only makes
//! the run slower, a stale stat never hides a changed file (the stat would
//! differ), and nothing from the cache overrides a listing's checksum.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use pluginsync_common::protocol::Mount;
use serde::{Deserialize, Serialize};

pub use pluginsync_common::filesig::FileSig;

/// The cache of one mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountCache {
    /// `server|environment|parameters` of the cached listing.
    pub key: String,
    /// Its `ETag`, if the server sent one.
    pub etag: Option<String>,
    /// Digest of the destination's stat scan after the last sync.
    pub scan_digest: Option<String>,
    /// Entries below `"."` in the cached listing.
    pub entries: usize,
    /// Stat cache: relative path → (stat, sha256 hex). Kept in its own
    /// file and read only when a pass needs hashing ([`MountCache::load_files`]),
    /// so a no-op run does not parse it.
    #[serde(skip)]
    pub files: HashMap<String, (FileSig, String)>,
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

    /// Reads the stat cache of `mount` into `self.files`.
    pub fn load_files(&mut self, vardir: &Path, mount: Mount) {
        if !self.files.is_empty() {
            return;
        }
        let path = Self::dir(vardir).join(format!("{mount}.stat.json"));
        self.files = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
    }

    /// The cached listing body of `mount`.
    pub fn load_listing(vardir: &Path, mount: Mount) -> Option<Vec<u8>> {
        std::fs::read(Self::dir(vardir).join(format!("{mount}.listing.json"))).ok()
    }

    /// Writes the cache (and the listing body, when given) atomically.
    pub fn save(&self, vardir: &Path, mount: Mount, listing: Option<&[u8]>) -> std::io::Result<()> {
        let dir = Self::dir(vardir);
        std::fs::create_dir_all(&dir)?;
        let write = |name: String, bytes: &[u8]| -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
            std::io::Write::write_all(&mut tmp, bytes)?;
            tmp.persist(dir.join(name)).map_err(|e| e.error)?;
            Ok(())
        };
        if let Some(body) = listing {
            write(format!("{mount}.listing.json"), body)?;
        }
        write(
            format!("{mount}.stat.json"),
            &serde_json::to_vec(&self.files)?,
        )?;
        write(format!("{mount}.json"), &serde_json::to_vec(self)?)
    }

    /// Forgets everything about `mount` (after a failed commit).
    pub fn clear(vardir: &Path, mount: Mount) {
        let dir = Self::dir(vardir);
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.json")));
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.listing.json")));
        let _missing_is_fine = std::fs::remove_file(dir.join(format!("{mount}.stat.json")));
    }

    /// The cached sha256 of `rel`, if its stat is still `stat`.
    pub fn sha256(&self, rel: &str, stat: &FileSig) -> Option<&str> {
        self.files
            .get(rel)
            .filter(|(s, _)| s == stat)
            .map(|(_, sha)| sha.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.files.insert("x".into(), (stat, "abc".into()));
        c.save(d.path(), Mount::Plugins, Some(b"[]")).unwrap();
        let mut back = MountCache::load(d.path(), Mount::Plugins);
        assert!(back.files.is_empty(), "the stat cache is read on demand");
        back.load_files(d.path(), Mount::Plugins);
        assert_eq!(back, c);
        assert_eq!(back.sha256("x", &stat), Some("abc"));
        std::fs::write(&f, "bb").unwrap();
        let changed = FileSig::of(&std::fs::symlink_metadata(&f).unwrap());
        assert_eq!(back.sha256("x", &changed), None, "a changed stat is a miss");
        assert_eq!(
            MountCache::load_listing(d.path(), Mount::Plugins).unwrap(),
            b"[]"
        );
        MountCache::clear(d.path(), Mount::Plugins);
        assert_eq!(
            MountCache::load(d.path(), Mount::Plugins),
            MountCache::default()
        );
    }
}
