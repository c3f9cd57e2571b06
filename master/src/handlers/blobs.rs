//! pluginsync's content-by-checksum extension (docs/protocol.md §7): one
//! blob, `GET /pluginsync/v1/blobs/sha256/<hex>` ([`blob`]), or many in one
//! answer, `GET /pluginsync/v1/blobs?sha256=<hex>&sha256=<hex>…`
//! ([`blobs_batch`]). Stock agents never ask for either.
//!
//! A first sync of 3,000 files is 3,000 requests over Puppet's API; most of
//! its cost on both ends is per request (measured in the bench). The batch
//! endpoint answers up to [`MAX_BATCH`] checksums at once as a stream of
//! frames, in request order:
//!
//! ```text
//! <64 hex> <length>\n<length bytes>     the blob
//! <64 hex> -\n                          not found (or changed): fetch it singly
//! ```
//!
//! A batch names each distinct digest once: repeated values are answered
//! by the first one's frame only, so the answer never carries the same
//! bytes twice. And it carries at most [`BATCH_MAX_BYTES`] of blob content
//! (or one blob, if that alone is larger): a blob that would pass the bound
//! gets a missing frame, and the agent fetches it singly (docs/protocol.md
//! §7.2.3, §7.3). So a 9 KB request costs the master at most one bounded
//! answer, whatever it names.
//!
//! Both go through the same authorization step as the file endpoints
//! ([`crate::auth::Gate::admit`]: a client certificate is needed), search
//! only the environments the client may read ([`crate::auth::Client::may_read`]),
//! and read only the inode the index vouched for. Both are advertised to
//! agents by the `X-Pluginsync-Blobs` and `X-Pluginsync-Blob-Batch` headers
//! on listings.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{self, MAX_BATCH};

use crate::api_error::ApiError;
use crate::config::ClientAuth;
use crate::request::{self, Query};
use crate::state::AppState;
use crate::walk::FileSig;

use super::files::{CacheControl, send_file, send_path};

/// Bytes read and sent per chunk of a large blob.
const CHUNK: usize = 256 * 1024;

/// Blob content one batch answer carries at most, in bytes (16 MiB): once
/// the blobs sent add up so that the next one would pass it, that one gets
/// a missing frame (`<hex> -`) and is fetched singly. A first blob larger
/// than the bound is still sent, so an answer is at most the bound or one
/// file, plus frame headers. 128 plugin files rarely come near it; the
/// agent's 4 batches in flight then ask one master for at most 64 MiB. A
/// config key for it would be `[http] batch_max_mib`.
pub const BATCH_MAX_BYTES: u64 = 16 << 20;

/// Whether a blob answer may be `public`: no `[[authorization]]` rule
/// limits who reads what (none configured, or `client_auth = "none"`, which
/// ignores them). Otherwise a shared cache in front of the masters would
/// hand an environment's files to clients the rules refuse
/// (docs/protocol.md §7.4).
pub(super) fn shareable(state: &AppState) -> bool {
    let config = state.store.config();
    config.authorization.is_empty() || config.tls.client_auth == ClientAuth::None
}

/// `GET /pluginsync/v1/blobs/sha256/<hex>`: a served file by its sha256
/// (docs/protocol.md §7.1), immutable; `public` (a shared HTTP cache in
/// front of the masters may serve it to the whole fleet) only without
/// `[[authorization]]` rules, else `private`. Needs a client certificate like
/// the file endpoints, and only finds files of environments the client may
/// read.
pub async fn blob(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    let client = state.gate.admit(&req)?;
    let hex_digest = req
        .uri
        .path()
        .strip_prefix(protocol::BLOB_PREFIX)
        .unwrap_or_default();
    let digest = Sha256::from_hex(hex_digest).map_err(|_| {
        ApiError::bad_request("a blob is named by 64 lowercase hex digits of its sha256")
    })?;
    request::check_accept(&req.headers, &["application/octet-stream"])?;
    for index in state.store.all() {
        if client.may_read(index.name.as_str())
            && let Some((root, node)) = index.blob(&digest)
        {
            return send_file(
                &req,
                root,
                node,
                CacheControl::Immutable {
                    public: shareable(&state),
                },
                &state.store.stats.contents_sent,
            )
            .await;
        }
    }
    // A kept generation's content outlives its tree (docs/deploys.md#generations).
    if let Some((path, _)) = state
        .store
        .generations
        .blob(&digest, |env| client.may_read(env))
        && let Some(sig) = stored_sig(&path)
    {
        let cache = CacheControl::Immutable {
            public: shareable(&state),
        };
        return send_path(
            &req,
            path,
            sig,
            &digest,
            cache,
            &state.store.stats.contents_sent,
        )
        .await;
    }
    Err(ApiError::not_found("blob", hex_digest))
}

/// The stat of a stored blob, read without following a link (the store
/// writes files only).
fn stored_sig(path: &std::path::Path) -> Option<FileSig> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|md| md.is_file())
        .map(|md| crate::walk::sig_of(&md))
}

/// `GET /pluginsync/v1/blobs?sha256=…`: the batch (docs/protocol.md §7.2);
/// see the module docs for the frames.
pub async fn blobs_batch(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    let client = state.gate.admit(&req)?;
    let wanted = wanted_digests(&req)?;
    request::check_accept(
        &req.headers,
        &[protocol::BLOBS_MEDIA_TYPE, protocol::ACCEPT_CONTENT],
    )?;
    let envs: Vec<_> = state
        .store
        .all()
        .into_iter()
        .filter(|idx| client.may_read(idx.name.as_str()))
        .collect();
    let items: Vec<Wanted> = wanted
        .into_iter()
        .map(|digest| {
            let found = envs
                .iter()
                .find_map(|idx| {
                    let (root, node) = idx.blob(&digest)?;
                    Some((node.real_path(&root.canon).into_owned(), node.sig?))
                })
                .or_else(|| {
                    let (path, _) = state
                        .store
                        .generations
                        .blob(&digest, |env| client.may_read(env))?;
                    let sig = stored_sig(&path)?;
                    Some((path, sig))
                });
            (digest, found)
        })
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let store = state.store;
    tokio::task::spawn_blocking(move || send_frames(items, &tx, &store.stats.contents_sent));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(protocol::BLOBS_MEDIA_TYPE),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// A digest a batch asks for, and where the index found it (the real path
/// and the signature it must still have), if it did.
type Wanted = (Sha256, Option<(std::path::PathBuf, FileSig)>);

/// The distinct digests a batch asks for, in the order of their first
/// mention (a repeated value gets no second frame); 400 for none, more
/// than [`MAX_BATCH`], or one that is not a sha256.
fn wanted_digests(req: &Parts) -> Result<Vec<Sha256>, ApiError> {
    let hashes = Query::parse(req.uri.query()).all(protocol::BATCH_QUERY_KEY);
    if hashes.is_empty() || hashes.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "ask for 1 to {MAX_BATCH} sha256 values"
        )));
    }
    let mut wanted: Vec<Sha256> = Vec::with_capacity(hashes.len());
    for h in &hashes {
        let digest = Sha256::from_hex(h).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !wanted.contains(&digest) {
            wanted.push(digest);
        }
    }
    Ok(wanted)
}

/// Sends the frames of `items` in order on `tx` (blocking: run it on the
/// blocking pool): a blob while the answer stays within
/// [`BATCH_MAX_BYTES`] and the file is still the indexed one, else a
/// missing frame. Stops when the client is gone; ends the stream with an
/// error if a file shrank under us. Each blob sent counts in `sent`.
fn send_frames(
    items: Vec<Wanted>,
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    sent: &AtomicU64,
) {
    // Blob bytes promised so far, against BATCH_MAX_BYTES.
    let mut promised: u64 = 0;
    for (digest, found) in items {
        let opened = found
            .filter(|(_, sig)| {
                promised == 0 || promised.saturating_add(sig.size) <= BATCH_MAX_BYTES
            })
            .and_then(|(path, sig)| {
                crate::walk::open_indexed(&path, sig)
                    .ok()
                    .map(|(f, _)| (f, sig.size))
            });
        let Some((mut file, size)) = opened else {
            if tx
                .blocking_send(Ok(Bytes::from(protocol::frame_header(&digest, None))))
                .is_err()
            {
                return;
            }
            continue;
        };
        promised = promised.saturating_add(size);
        if tx
            .blocking_send(Ok(Bytes::from(protocol::frame_header(&digest, Some(size)))))
            .is_err()
        {
            return;
        }
        let mut left = size;
        while left > 0 {
            let mut buf = vec![0u8; CHUNK.min(left as usize)];
            // A file that shrank under us ends the stream early: the
            // client sees a short frame and fetches the rest singly.
            if let Err(e) = file.read_exact(&mut buf) {
                let _ = tx.blocking_send(Err(e));
                return;
            }
            left -= buf.len() as u64;
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return;
            }
        }
        sent.fetch_add(1, Ordering::Relaxed);
    }
}
