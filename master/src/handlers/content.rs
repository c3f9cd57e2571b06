//! How a file's bytes are sent, for `file_content`, blobs and stock
//! agents' content from the generation store: [`send_file`] (an indexed
//! file, only while it is still the inode the index vouched for),
//! [`send_path`], [`send_stored`], and the cache policy of each answer.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pluginsync_common::etag::ETag;
use pluginsync_common::protocol;

use crate::api_error::ApiError;
use crate::index::Root;
use crate::request;
use crate::state::AppState;
use crate::walk::Node;

/// Files up to this size are read whole; larger ones are streamed.
const SMALL_FILE: u64 = 256 * 1024;

/// The message of the 503 for a file that changed since indexing
/// (docs/protocol.md §1.7 step 12).
pub(super) const CHANGED: &str = "the file changed on the master, retry";

pub(super) fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("\"invalid\""))
}

/// How a file answer may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CacheControl {
    /// `file_content`: the same path may have new bytes tomorrow.
    Revalidate,
    /// Blobs: the URL names the bytes, so they never change. `public` only
    /// when any client that reaches a shared cache may read every blob
    /// (no `[[authorization]]` rule applies); otherwise `private`, so only
    /// the agent's own cache keeps them (docs/protocol.md §6.4, §7.4).
    Immutable {
        /// A shared cache may store the answer.
        public: bool,
    },
}

impl CacheControl {
    /// The `Cache-Control` value.
    pub(super) fn header(self) -> &'static str {
        match self {
            CacheControl::Revalidate => "no-cache",
            CacheControl::Immutable { public: true } => protocol::CACHE_IMMUTABLE,
            CacheControl::Immutable { public: false } => protocol::CACHE_IMMUTABLE_PRIVATE,
        }
    }
}

/// Sends an indexed file: opened through [`crate::walk::open_indexed`]
/// (no symlink followed, never blocking), and only if it is still the
/// inode (and stat) the index vouched for.
pub(super) async fn send_file(
    req: &Parts,
    root: &Root,
    node: &Node,
    cache: CacheControl,
    sent: &AtomicU64,
) -> Result<Response, ApiError> {
    let (Some(sig), Some(digest)) = (node.sig, node.sha256) else {
        return Err(ApiError::internal());
    };
    let path = node.real_path(&root.canon).into_owned();
    send_path(req, BlobSource::Indexed { path, sig }, &digest, cache, sent).await
}

/// Where the bytes of a file are read from.
#[derive(Debug, Clone)]
pub(super) enum BlobSource {
    /// The generation store's copy (docs/deploys.md#generations):
    /// immutable, hashed as it was copied in, and outside the watched
    /// trees, so reading it raises no watch event (the watcher's inotify
    /// watches are given `IN_OPEN` too: docs/internals.md#watch).
    Stored {
        /// Its path in the store.
        path: PathBuf,
        /// Its size, as the store recorded it.
        size: u64,
    },
    /// The indexed file itself, read only while it is still the inode
    /// (and stat) the index vouched for.
    Indexed {
        /// Its real path.
        path: PathBuf,
        /// Its stat when it was indexed.
        sig: crate::walk::FileSig,
    },
}

impl BlobSource {
    /// The size of the bytes it holds.
    pub(super) fn size(&self) -> u64 {
        match self {
            BlobSource::Stored { size, .. } => *size,
            BlobSource::Indexed { sig, .. } => sig.size,
        }
    }

    /// Where it is.
    pub(super) fn path(&self) -> &Path {
        match self {
            BlobSource::Stored { path, .. } | BlobSource::Indexed { path, .. } => path,
        }
    }

    /// Opens it (blocking), without following a link; an error when it is
    /// not the file it should be (a stored copy of another size, an
    /// indexed file changed since).
    pub(super) fn open(&self) -> std::io::Result<std::fs::File> {
        match self {
            BlobSource::Stored { path, size } => {
                let (file, md) = crate::walk::open_regular(path)?;
                if md.size() != *size {
                    return Err(std::io::Error::other("the stored copy has another size"));
                }
                Ok(file)
            }
            BlobSource::Indexed { path, sig } => {
                crate::walk::open_indexed(path, *sig).map(|(file, _)| file)
            }
        }
    }
}

/// Sends `source` as the content of `digest`, only if it is still the
/// file it should be ([`BlobSource::open`]); a 503 `CHANGED` if not.
pub(super) async fn send_path(
    req: &Parts,
    source: BlobSource,
    digest: &pluginsync_common::digest::Sha256,
    cache: CacheControl,
    sent: &AtomicU64,
) -> Result<Response, ApiError> {
    let etag = ETag::of_digest(&digest.0);
    if request::not_modified(&req.headers, &etag) {
        return Ok((
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, header_value(etag.as_str()))],
        )
            .into_response());
    }
    let size = source.size();
    let opening = source.clone();
    let opened = tokio::task::spawn_blocking(
        move || -> std::io::Result<(std::fs::File, Option<Vec<u8>>)> {
            let file = opening.open()?;
            let small = if size <= SMALL_FILE {
                use std::io::Read;
                let mut buf = Vec::with_capacity(size as usize);
                (&file).take(SMALL_FILE + 1).read_to_end(&mut buf)?;
                Some(buf)
            } else {
                None
            };
            Ok((file, small))
        },
    )
    .await
    .map_err(|_| ApiError::internal())?;
    let (file, small) = match opened {
        Ok(o) => o,
        Err(e) => {
            tracing::info!(path = %source.path().display(), error = %e, "file changed since it was indexed");
            return Err(ApiError::unavailable(CHANGED, 1));
        }
    };
    if small.as_ref().is_some_and(|b| b.len() as u64 != size) {
        tracing::info!(path = %source.path().display(), "file changed since it was indexed");
        return Err(ApiError::unavailable(CHANGED, 1));
    }
    sent.fetch_add(1, Ordering::Relaxed);
    let body = match small {
        Some(bytes) => Body::from(Bytes::from(bytes)),
        None => Body::from_stream(tokio_util::io::ReaderStream::new(
            tokio::fs::File::from_std(file),
        )),
    };
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(size)),
            (header::ETAG, header_value(etag.as_str())),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static(cache.header()),
            ),
        ],
        body,
    )
        .into_response())
}

/// Sends the generation store's copy of `digest` (404 when the store
/// does not hold it).
pub(super) async fn send_stored(
    req: &Parts,
    state: &AppState,
    digest: &pluginsync_common::digest::Sha256,
    cache: CacheControl,
) -> Result<Response, ApiError> {
    let path = state.store.generations.blob_path(digest);
    let Some(size) = stored_size(&path) else {
        return Err(ApiError::not_found("blob", &digest.to_hex()));
    };
    send_path(
        req,
        BlobSource::Stored { path, size },
        digest,
        cache,
        &state.store.stats.contents_sent,
    )
    .await
}

/// The size of a stored blob, read without following a link (the store
/// writes files only).
fn stored_size(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|md| md.is_file())
        .map(|md| md.len())
}
