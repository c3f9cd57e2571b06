//! The generation store's files (docs/deploys.md#generations): where each
//! thing lives under `[generations] dir`, and how it is written (a
//! temporary file, `fsync`, `rename`, the directory synced) and read.
//!
//! ```text
//! <dir>/blobs/<2 hex>/<64 hex>    a file's content, named by its sha256
//! <dir>/manifests/<64 hex>        a generation's canonical manifest, named by its id
//! <dir>/environments/<env>.json   the kept generations of one environment, oldest first
//! <dir>/indexes/<env>/<64 hex>    the index a generation of <env> was made from (gzipped JSON)
//! ```
//!
//! A blob is copied from the indexed file only through
//! [`crate::walk::open_indexed`] (the inode and stat the index vouched for)
//! and hashed as it is copied: bytes that do not hash to the digest the
//! index holds are never stored.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::fsutil;
use pluginsync_common::generation::{GenerationId, Manifest, ManifestError};

use crate::walk::FileSig;

use super::{Generations, Kept, State, digest_sizes};

/// The mode of the store's directories: the master user's alone (its
/// group may read), since a blob is the content of an environment that
/// `[[authorization]]` may restrict (docs/deploys.md#generations).
pub(crate) const DIR_MODE: u32 = 0o750;
/// The mode of a blob, a manifest or an index: never rewritten in place.
const SEALED_MODE: u32 = 0o440;
/// The mode of an environment's record (and the rollout state).
pub(crate) const STATE_MODE: u32 = 0o640;

/// Creates `dir` (and its parents) with [`DIR_MODE`], and takes the
/// group's write and every other user's access away from one that exists
/// (a store an earlier version made 0755).
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o027 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & DIR_MODE))?;
    }
    Ok(())
}

/// The generation store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file of the store could not be read or written.
    #[error("generation store: {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file of the tree changed after it was indexed: its bytes are not
    /// the ones the manifest names, so the generation is not published.
    #[error("{} changed since it was indexed", path.display())]
    Changed {
        /// The file in the code tree.
        path: PathBuf,
    },
    /// The index holds no file for a digest its manifest names.
    #[error("no indexed file has sha256 {0}")]
    NoSource(Sha256),
    /// A manifest in the store does not parse or hash to its name.
    #[error("generation store: manifest {0}: {1}")]
    Manifest(GenerationId, #[source] ManifestError),
}

impl StoreError {
    pub(super) fn io(path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// A stored index's environment and generation.
pub(super) type IndexKey = (EnvName, GenerationId);

/// The record of one environment's kept generations, as stored.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    kept: Vec<Kept>,
}

/// The store's directory layout.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    root: PathBuf,
    /// False for the temporary store of a development run (removed on
    /// exit): nothing is synced.
    durable: bool,
}

impl Layout {
    pub(super) fn new(root: PathBuf, durable: bool) -> Layout {
        Layout { root, durable }
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the directories (and removes temporary files a killed
    /// master left in them).
    pub(super) fn create(&self) -> Result<(), StoreError> {
        for d in [
            self.root.clone(),
            self.blobs_dir(),
            self.manifests_dir(),
            self.envs_dir(),
            self.indexes_dir(),
        ] {
            private_dir(&d).map_err(|e| StoreError::io(&d, e))?;
            fsutil::remove_leftovers(&d);
        }
        Ok(())
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs")
    }

    fn manifests_dir(&self) -> PathBuf {
        self.root.join("manifests")
    }

    fn envs_dir(&self) -> PathBuf {
        self.root.join("environments")
    }

    fn indexes_dir(&self) -> PathBuf {
        self.root.join("indexes")
    }

    /// Where the index that generation `id` of `env` was made from lives
    /// (docs/rollouts.md#stock-puppet-agents).
    pub(super) fn index(&self, env: &EnvName, id: &GenerationId) -> PathBuf {
        self.indexes_dir().join(env.as_str()).join(id.to_hex())
    }

    /// Writes the index of `id` of `env`, durably, unless it is there
    /// (it records the tree of the generation's first publication).
    pub(super) fn store_index(
        &self,
        env: &EnvName,
        id: &GenerationId,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let path = self.index(env, id);
        if path.is_file() {
            return Ok(());
        }
        let dir = self.indexes_dir().join(env.as_str());
        private_dir(&dir).map_err(|e| StoreError::io(&dir, e))?;
        self.write(&path, bytes, SEALED_MODE)
    }

    /// Every stored index on disk: (path, environment, generation, size).
    pub(super) fn indexes_on_disk(&self) -> Vec<(PathBuf, Option<IndexKey>, u64)> {
        let mut out = Vec::new();
        let Ok(envs) = std::fs::read_dir(self.indexes_dir()) else {
            return out;
        };
        for env in envs.flatten() {
            let name = env.file_name().to_str().and_then(|n| n.parse().ok());
            let Ok(files) = std::fs::read_dir(env.path()) else {
                continue;
            };
            for f in files.flatten() {
                let id = f.file_name().to_str().and_then(|n| n.parse().ok());
                let size = f.metadata().map_or(0, |m| m.len());
                out.push((f.path(), name.clone().zip(id), size));
            }
        }
        out
    }

    /// Where the blob `digest` lives.
    pub(super) fn blob(&self, digest: &Sha256) -> PathBuf {
        let hex = digest.to_hex();
        self.blobs_dir().join(&hex[..2]).join(hex)
    }

    /// Where the manifest of generation `id` lives.
    pub(super) fn manifest(&self, id: &GenerationId) -> PathBuf {
        self.manifests_dir().join(id.to_hex())
    }

    fn record(&self, env: &EnvName) -> PathBuf {
        self.envs_dir().join(format!("{env}.json"))
    }

    /// Copies the indexed file at `source` (still with `sig`) into the
    /// blob `digest`, and adds it and its directory to `durable` (the
    /// caller syncs the set once, before anything names the blob: one
    /// `syncfs` for a first publication of thousands of files, not an
    /// `fsync` each); refuses bytes that hash otherwise
    /// ([`StoreError::Changed`]: the file changed since it was indexed).
    pub(super) fn store_blob(
        &self,
        digest: &Sha256,
        source: &Path,
        sig: FileSig,
        durable: &mut fsutil::Durable,
    ) -> Result<(), StoreError> {
        let target = self.blob(digest);
        let dir = target.parent().unwrap_or(self.root.as_path()).to_owned();
        private_dir(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let (file, _) =
            crate::walk::open_indexed(source, sig).map_err(|_| StoreError::Changed {
                path: source.to_owned(),
            })?;
        let mut tmp = tempfile::Builder::new()
            .prefix(fsutil::TMP_PREFIX)
            .tempfile_in(&dir)
            .map_err(|e| StoreError::io(&dir, e))?;
        let actual = copy_hashing(file.take(sig.size + 1), tmp.as_file_mut())
            .map_err(|e| StoreError::io(source, e))?;
        if actual != *digest {
            return Err(StoreError::Changed {
                path: source.to_owned(),
            });
        }
        let f = tmp.as_file();
        f.set_permissions(std::fs::Permissions::from_mode(SEALED_MODE))
            .and_then(|()| durable.add(f.as_fd(), fsutil::Need::Data, &target))
            .and_then(|()| durable.add_path(&dir, fsutil::Need::All))
            .map_err(|e| StoreError::io(&target, e))?;
        tmp.persist(&target)
            .map_err(|e| StoreError::io(&target, e.error))?;
        Ok(())
    }

    /// Makes the blobs added to `durable` durable.
    pub(super) fn sync(&self, durable: fsutil::Durable) -> Result<(), StoreError> {
        if !self.durable {
            return Ok(());
        }
        durable.sync().map(drop).map_err(|failures| {
            let (path, e) = failures
                .into_iter()
                .next()
                .unwrap_or_else(|| (self.root.clone(), std::io::Error::other("sync failed")));
            StoreError::io(&path, e)
        })
    }

    /// Writes the manifest of `id`, durably, unless it is there.
    pub(super) fn store_manifest(&self, id: &GenerationId, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.manifest(id);
        if path.is_file() {
            return Ok(());
        }
        self.write(&path, bytes, SEALED_MODE)
    }

    /// Writes `path` atomically, and durably unless the store is temporary.
    fn write(&self, path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
        if self.durable {
            fsutil::write_atomic(path, bytes, mode)
        } else {
            fsutil::replace_atomic(path, bytes, mode)
        }
        .map_err(|e| StoreError::io(path, e))
    }

    /// The canonical bytes of the manifest of `id`.
    pub(super) fn read_manifest(&self, id: &GenerationId) -> Result<Vec<u8>, StoreError> {
        let path = self.manifest(id);
        std::fs::read(&path).map_err(|e| StoreError::io(&path, e))
    }

    /// Writes `env`'s record of kept generations durably (none: removed).
    pub(super) fn write_record(&self, env: &EnvName, kept: &[Kept]) -> Result<(), StoreError> {
        let path = self.record(env);
        if kept.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io(&path, e)),
                _ => Ok(()),
            };
        }
        let json = serde_json::to_vec_pretty(&Record {
            kept: kept.to_vec(),
        })
        .map_err(|e| StoreError::io(&path, std::io::Error::other(e)))?;
        self.write(&path, &json, STATE_MODE)
    }

    /// Every environment record on disk; one that cannot be read or parsed
    /// is an error the caller logs (and skips).
    pub(super) fn read_records(&self) -> Vec<Result<(EnvName, Vec<Kept>), StoreError>> {
        let dir = self.envs_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let Some(env) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<EnvName>().ok())
            else {
                continue;
            };
            let read = std::fs::read(&path)
                .map_err(|e| StoreError::io(&path, e))
                .and_then(|b| {
                    serde_json::from_slice::<Record>(&b)
                        .map_err(|e| StoreError::io(&path, std::io::Error::other(e)))
                });
            out.push(read.map(|r| (env, r.kept)));
        }
        out.sort_by(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => a.0.cmp(&b.0),
            _ => std::cmp::Ordering::Equal,
        });
        out
    }

    /// Every blob file on disk, with its size.
    pub(super) fn blobs_on_disk(&self) -> Vec<(PathBuf, Option<Sha256>, u64)> {
        let mut out = Vec::new();
        let Ok(shards) = std::fs::read_dir(self.blobs_dir()) else {
            return out;
        };
        for shard in shards.flatten() {
            let Ok(files) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for f in files.flatten() {
                let size = f.metadata().map_or(0, |m| m.len());
                let digest = f
                    .file_name()
                    .to_str()
                    .and_then(|n| Sha256::from_hex(n).ok());
                out.push((f.path(), digest, size));
            }
        }
        out
    }

    /// Every manifest file on disk.
    pub(super) fn manifests_on_disk(&self) -> Vec<(PathBuf, Option<GenerationId>)> {
        let Ok(files) = std::fs::read_dir(self.manifests_dir()) else {
            return Vec::new();
        };
        files
            .flatten()
            .map(|f| {
                let id = f.file_name().to_str().and_then(|n| n.parse().ok());
                (f.path(), id)
            })
            .collect()
    }
}

/// Copies `from` into `to` while hashing; returns the sha256 of what was
/// copied.
fn copy_hashing(mut from: impl Read, to: &mut std::fs::File) -> std::io::Result<Sha256> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])?;
    }
    Ok(Sha256(hasher.finalize().into()))
}

/// The store read back when the master starts.
impl Generations {
    /// The manifest of `id` and its size, if every blob it names is in
    /// `present`.
    pub(super) fn complete(
        &self,
        id: &GenerationId,
        present: &HashMap<Sha256, u64>,
    ) -> Result<(Manifest, u64), StoreError> {
        let bytes = self.layout.read_manifest(id)?;
        let m = Manifest::parse(&bytes, id).map_err(|e| StoreError::Manifest(*id, e))?;
        if let Some((d, _)) = digest_sizes(&m)
            .into_iter()
            .find(|(d, size)| present.get(d) != Some(size))
        {
            return Err(StoreError::io(
                &self.layout.blob(&d),
                std::io::ErrorKind::NotFound.into(),
            ));
        }
        Ok((m, bytes.len() as u64))
    }

    /// Removes what no kept generation names (files a killed master left).
    pub(super) fn sweep_unreferenced(&self, st: &State) {
        for (path, digest, _) in self.layout.blobs_on_disk() {
            if !digest.is_some_and(|d| st.blobs.contains_key(&d)) {
                let _ = std::fs::remove_file(path);
            }
        }
        for (path, id) in self.layout.manifests_on_disk() {
            if !id.is_some_and(|id| st.manifests.contains_key(&id)) {
                let _ = std::fs::remove_file(path);
            }
        }
        self.sweep_indexes(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// The store is the master user's (docs/deploys.md#generations): a
    /// root an earlier version left 0755 is tightened, what is made is
    /// 0750 and 0440; nothing is readable by another user.
    #[test]
    fn the_store_is_the_master_users_alone() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("store");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let layout = Layout::new(root.clone(), false);
        layout.create().unwrap();
        let id = GenerationId::of(b"manifest");
        layout.store_manifest(&id, b"manifest").unwrap();
        let env: EnvName = "production".parse().unwrap();
        layout.store_index(&env, &id, b"{}").unwrap();
        for sub in [
            "",
            "blobs",
            "manifests",
            "environments",
            "indexes",
            "indexes/production",
        ] {
            assert_eq!(mode(&root.join(sub)), 0o750, "{sub}");
        }
        assert_eq!(mode(&layout.manifest(&id)), 0o440);
        assert_eq!(mode(&layout.index(&env, &id)), 0o440);
    }
}
