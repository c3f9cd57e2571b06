//! What one listing entry is: the search parameters that shape it, and how
//! one node becomes a `FileMetadata` (owner, group and mode under
//! `source_permissions`, the checksum of the requested type).
//!
//! sha256, mtime and ctime come from the index itself; the other digest
//! types (md5, sha1, …) are read from disk on first request and kept
//! ([`OtherChecksums`]), through the same identity-checked open as content
//! ([`crate::walk::open_indexed`]): a file replaced since indexing (by a
//! symlink, a fifo, other bytes) is never read for them, and the listing
//! answers 503 like `file_content` does (docs/protocol.md §1.7 step 12).
//! Directories carry a constant checksum ([`DIRECTORY_CTIME`]) so every
//! replica lists the same bytes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::digest::Sha256;
use pluginsync_common::metadata::{Checksum, FileMetadata, FileType, Links, Principal};

use super::mount::Root;
use crate::walk::{FileSig, Node, View};

/// A listing could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// A request parameter was unusable.
    #[error("{0}")]
    BadRequest(String),
    /// Serialisation failed.
    #[error("{0}")]
    Internal(String),
    /// A checksum had to be read from a file that is no longer the indexed
    /// one (replaced, swapped for a symlink or a fifo): answered 503 with
    /// `Retry-After`, like `file_content` (docs/protocol.md §1.7 step 12),
    /// and never cached.
    #[error("the file changed on the master, retry")]
    Changed,
}

/// Parameters of a `file_metadatas` search, normalised; also the key of the
/// response cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SearchParams {
    /// `recurse`.
    pub recurse: bool,
    /// `recurselimit`; `None` for no limit.
    pub recurselimit: Option<u32>,
    /// `links`.
    pub links: Links,
    /// `ignore` patterns, in request order.
    pub ignore: Vec<String>,
    /// `checksum_type`.
    pub checksum_type: ChecksumType,
    /// `source_permissions=use` (or `use_when_creating`).
    pub use_permissions: bool,
}

/// How owner, group and mode are reported.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    /// The master's euid, reported under `source_permissions=ignore`.
    pub uid: u32,
    /// The master's egid.
    pub gid: u32,
}

impl Identity {
    /// The running process's effective ids.
    pub fn current() -> Self {
        Identity {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// The checksum every directory carries. Puppet sends the ctime of the
/// search base, which agents ignore (docs/protocol.md §2.2); a constant keeps
/// listings, and so ETags, identical on every replica of the same tree.
pub const DIRECTORY_CTIME: i64 = 0;

/// Where an index restored from the generation store reads a file's
/// bytes: the stored blob of its sha256 (docs/rollouts.md#stock-puppet-agents).
#[derive(Clone)]
pub struct StoredBlobs(pub Arc<dyn Fn(&Sha256) -> PathBuf + Send + Sync>);

impl std::fmt::Debug for StoredBlobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoredBlobs")
    }
}

/// Digests of types the index does not hold (md5, sha1, …), computed on
/// demand: (real path, type) → value. Kept for the index's lifetime: a
/// rebuild starts empty, so a changed file is read again. A restored
/// index reads them from the store's blobs (`stored`).
#[derive(Debug, Default)]
pub(super) struct OtherChecksums {
    values: Mutex<HashMap<(PathBuf, ChecksumType), String>>,
    pub(super) stored: Option<StoredBlobs>,
}

impl OtherChecksums {
    /// The `ty` digest of the file at `real` (content `sha`), read now
    /// unless known. It is read only if it is still the indexed inode with
    /// the indexed stat `sig` ([`crate::walk::open_indexed`]); otherwise
    /// [`ListingError::Changed`]. A restored index reads the stored blob.
    fn get_or_read(
        &self,
        real: PathBuf,
        (sig, sha): (FileSig, Sha256),
        ty: ChecksumType,
    ) -> Result<String, ListingError> {
        let key = match &self.stored {
            Some(blob) => ((blob.0)(&sha), ty),
            None => (real, ty),
        };
        if let Some(v) = self.lock().get(&key) {
            return Ok(v.clone());
        }
        let opened = match self.stored {
            Some(_) => std::fs::File::open(&key.0),
            None => crate::walk::open_indexed(&key.0, sig).map(|(f, _)| f),
        };
        let value = opened
            .and_then(|f| ty.digest_reader(f))
            .map_err(|e| {
                tracing::info!(path = %key.0.display(), error = %e, "file changed since it was indexed");
                ListingError::Changed
            })?;
        self.lock().insert(key, value.clone());
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(PathBuf, ChecksumType), String>> {
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One metadata entry: `view` of `rel` under `base`, with the checksum of
/// `node` (`None` for the fallback root of an empty mount);
/// [`ListingError::Changed`] when a checksum needs a file that changed.
pub(super) fn metadata(
    identity: Identity,
    other: &OtherChecksums,
    base: &str,
    rel: &str,
    view: &View,
    node: Option<(&Root, &Node)>,
    params: &SearchParams,
) -> Result<FileMetadata, ListingError> {
    let (owner, group, mode) = if params.use_permissions {
        (view.uid, view.gid, view.mode)
    } else {
        (identity.uid, identity.gid, 0o644)
    };
    let checksum = match view.kind {
        FileType::Directory => Some(Checksum {
            kind: "ctime".into(),
            value: ChecksumType::Ctime.format_time(DIRECTORY_CTIME),
        }),
        _ => match node {
            Some((r, n)) => checksum(other, r, n, view, params.checksum_type)?,
            None => None,
        },
    };
    Ok(FileMetadata {
        path: base.to_owned(),
        relative_path: Some(rel.to_owned()),
        links: params.links,
        owner: Principal::Id(owner.into()),
        group: Principal::Id(group.into()),
        mode,
        checksum,
        kind: view.kind,
        destination: view.destination.clone(),
    })
}

/// The checksum of a file (or of a link's target); `None` when its
/// content is not served (a dangling or escaping link), as Puppet sends
/// `null` when it cannot compute one; [`ListingError::Changed`] when the
/// type must be read from disk and the file is no longer the indexed one.
pub(super) fn checksum(
    other: &OtherChecksums,
    root: &Root,
    node: &Node,
    view: &View,
    ty: ChecksumType,
) -> Result<Option<Checksum>, ListingError> {
    let value = match ty {
        ChecksumType::Sha256 => match node.sha256 {
            Some(d) => d.to_checksum(),
            None => return Ok(None),
        },
        ChecksumType::Mtime => ty.format_time(view.mtime),
        ChecksumType::Ctime => ty.format_time(view.ctime),
        ChecksumType::None => "{none}".to_owned(),
        _ => {
            let (Some(sha), Some(sig)) = (node.sha256, node.sig) else {
                return Ok(None);
            };
            other.get_or_read(node.real_path(&root.canon).into_owned(), (sig, sha), ty)?
        }
    };
    Ok(Some(Checksum {
        kind: ty.name().into(),
        value,
    }))
}
