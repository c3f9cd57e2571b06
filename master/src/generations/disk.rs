//! The generation store's files (docs/deploys.md#generations): where each
//! thing lives under `[generations] dir`, and how it is written (a
//! temporary file, `fsync`, `rename`, the directory synced) and read.
//!
//! ```text
//! <dir>/blobs/<2 hex>/<64 hex>    a file's content, named by its sha256
//! <dir>/manifests/<64 hex>        a generation's canonical manifest, named by its id
//! <dir>/environments/<env>.json   the kept generations of one environment, oldest first
//! ```
//!
//! A blob is copied from the indexed file only through
//! [`crate::walk::open_indexed`] (the inode and stat the index vouched for)
//! and hashed as it is copied: bytes that do not hash to the digest the
//! index holds are never stored.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::fsutil;
use pluginsync_common::generation::GenerationId;

use crate::walk::FileSig;

use super::{Kept, StoreError};

/// The record of one environment's kept generations, as stored.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    kept: Vec<Kept>,
}

/// The store's directory layout.
#[derive(Debug)]
pub(super) struct Layout {
    root: PathBuf,
}

impl Layout {
    pub(super) fn new(root: PathBuf) -> Layout {
        Layout { root }
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the directories (and removes temporary files a killed
    /// master left in them).
    pub(super) fn create(&self) -> Result<(), StoreError> {
        for d in [self.blobs_dir(), self.manifests_dir(), self.envs_dir()] {
            std::fs::create_dir_all(&d).map_err(|e| StoreError::io(&d, e))?;
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
    /// blob `digest`, durably; refuses bytes that hash otherwise
    /// ([`StoreError::Changed`]: the file changed since it was indexed).
    pub(super) fn store_blob(
        &self,
        digest: &Sha256,
        source: &Path,
        sig: FileSig,
    ) -> Result<(), StoreError> {
        let target = self.blob(digest);
        let dir = target.parent().unwrap_or(self.root.as_path()).to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
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
        f.set_permissions(std::fs::Permissions::from_mode(0o444))
            .and_then(|()| f.sync_all())
            .map_err(|e| StoreError::io(&target, e))?;
        tmp.persist(&target)
            .map_err(|e| StoreError::io(&target, e.error))?;
        sync_dir(&dir)
    }

    /// Writes the manifest of `id`, durably, unless it is there.
    pub(super) fn store_manifest(&self, id: &GenerationId, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.manifest(id);
        if path.is_file() {
            return Ok(());
        }
        fsutil::write_atomic(&path, bytes, 0o444).map_err(|e| StoreError::io(&path, e))
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
        fsutil::write_atomic(&path, &json, 0o644).map_err(|e| StoreError::io(&path, e))
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

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir, e))
}
