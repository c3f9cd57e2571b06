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
use crate::request::{self, Query};
use crate::state::AppState;
use crate::tls::ClientAuth;

use super::content::{BlobSource, CacheControl, send_file, send_path};

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
    let config = &state.config;
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
    let cache = CacheControl::Immutable {
        public: shareable(&state),
    };
    let sent = &state.store.stats.contents_sent;
    // The store's copy first (content.rs, `BlobSource`); one evicted since
    // it was looked up leaves the trees to search.
    if let Some(stored) = stored(&state, &digest, |env| client.may_read(env)) {
        match send_path(&req, stored, &digest, cache, sent).await {
            Err(e) if e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE => {}
            answer => return answer,
        }
    }
    let mut changed = None;
    for index in state.store.all() {
        if client.may_read(index.name.as_str())
            && let Some((root, node)) = index.blob(&digest)
        {
            match send_file(&req, root, node, cache, sent).await {
                // Changed since it was indexed.
                Err(e) if e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE => {
                    changed = Some(e);
                    break;
                }
                answer => return answer,
            }
        }
    }
    Err(changed.unwrap_or_else(|| ApiError::not_found("blob", hex_digest)))
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
            // The store's copy first (content.rs, `BlobSource`).
            let found = stored(&state, &digest, |env| client.may_read(env)).or_else(|| {
                envs.iter().find_map(|idx| {
                    let (root, node) = idx.blob(&digest)?;
                    let path = node.real_path(&root.canon).into_owned();
                    Some(BlobSource::Indexed {
                        path,
                        sig: node.sig?,
                    })
                })
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

/// The generation store's copy of `digest`, when a kept generation of an
/// environment the client `may_read` names it.
fn stored(
    state: &AppState,
    digest: &Sha256,
    may_read: impl Fn(&str) -> bool,
) -> Option<BlobSource> {
    let (path, size) = state.store.generations.blob(digest, may_read)?;
    Some(BlobSource::Stored { path, size })
}

/// A digest a batch asks for, and where its bytes are, if anywhere.
type Wanted = (Sha256, Option<BlobSource>);

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

/// Frames are gathered into buffers of about this size before they are
/// handed to the connection: a plugin file is a few KiB, and one message,
/// one HTTP/2 DATA frame and one TLS record per file (and per header) cost
/// both ends more than the bytes (docs/internals.md#blobs-gathered-downloads-into-the-standby).
const GATHER: usize = 64 * 1024;

/// Sends the frames of `items` in order on `tx` (blocking: run it on the
/// blocking pool): a blob while the answer stays within
/// [`BATCH_MAX_BYTES`] and the file is still the indexed one, else a
/// missing frame. Small blobs are read whole into a buffer of frames sent
/// once it holds [`GATHER`] bytes (one that reads short gets a missing
/// frame instead); a bigger one is streamed in [`CHUNK`]s, and one that
/// shrinks under us ends the stream with an error (the client sees a
/// short frame and fetches the rest singly). Stops when the client is
/// gone. Each blob sent counts in `sent`.
fn send_frames(
    items: Vec<Wanted>,
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    sent: &AtomicU64,
) {
    let send = |buf: &mut Vec<u8>| {
        let full = std::mem::replace(buf, Vec::with_capacity(GATHER + CHUNK));
        full.is_empty() || tx.blocking_send(Ok(Bytes::from(full))).is_ok()
    };
    let mut out: Vec<u8> = Vec::with_capacity(GATHER + CHUNK);
    // Blob bytes promised so far, against BATCH_MAX_BYTES.
    let mut promised: u64 = 0;
    for (digest, found) in items {
        let opened = found
            .filter(|source| {
                promised == 0 || promised.saturating_add(source.size()) <= BATCH_MAX_BYTES
            })
            .and_then(|source| source.open().ok().map(|f| (f, source.size())));
        let Some((file, size)) = opened else {
            out.extend_from_slice(protocol::frame_header(&digest, None).as_bytes());
            if out.len() >= GATHER && !send(&mut out) {
                return;
            }
            continue;
        };
        promised = promised.saturating_add(size);
        let header = protocol::frame_header(&digest, Some(size));
        if size <= CHUNK as u64 {
            let start = out.len();
            out.extend_from_slice(header.as_bytes());
            let body = out.len();
            if read_whole(file, size, &mut out).is_err() {
                out.truncate(start);
                out.extend_from_slice(protocol::frame_header(&digest, None).as_bytes());
            } else {
                debug_assert_eq!(out.len() - body, size as usize);
                sent.fetch_add(1, Ordering::Relaxed);
            }
            if out.len() >= GATHER && !send(&mut out) {
                return;
            }
            continue;
        }
        out.extend_from_slice(header.as_bytes());
        if !send(&mut out) || !stream_blob(file, size, tx) {
            return;
        }
        sent.fetch_add(1, Ordering::Relaxed);
    }
    send(&mut out);
}

/// Appends exactly `size` bytes of `file` to `out`, without zeroing them
/// first; an error (the file shrank) leaves `out` longer, for the caller
/// to cut.
fn read_whole(file: std::fs::File, size: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
    out.reserve(size as usize);
    let got = file.take(size).read_to_end(out)?;
    if got as u64 != size {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Streams a big blob in [`CHUNK`]s; `false` once the stream is over (the
/// client gone, or the file shrank: the stream then ends with an error).
fn stream_blob(
    mut file: std::fs::File,
    size: u64,
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> bool {
    let mut left = size;
    while left > 0 {
        let want = CHUNK.min(left as usize) as u64;
        let mut buf = Vec::with_capacity(want as usize);
        match (&mut file).take(want).read_to_end(&mut buf) {
            Ok(n) if n as u64 == want => {}
            Ok(_) => {
                let _ = tx.blocking_send(Err(std::io::ErrorKind::UnexpectedEof.into()));
                return false;
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return false;
            }
        }
        left -= want;
        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::protocol::{FrameDecoder, FrameEvent};

    /// A frame decoded: its digest, its content or `None` when missing.
    type Decoded = (Sha256, Option<Vec<u8>>);

    /// The frames `send_frames` sends for `items`, decoded, and how many
    /// messages carried them.
    fn sent(items: Vec<Wanted>) -> (Vec<Decoded>, usize) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1 << 12);
        let count = AtomicU64::new(0);
        send_frames(items, &tx, &count);
        drop(tx);
        let (mut decoder, mut out, mut messages) = (FrameDecoder::new(), Vec::new(), 0);
        while let Ok(msg) = rx.try_recv() {
            messages += 1;
            decoder.feed(&msg.expect("no stream error"));
            while let Some(event) = decoder.next_event().unwrap() {
                match event {
                    FrameEvent::Missing(d) => out.push((d, None)),
                    FrameEvent::Begin { digest, .. } => out.push((digest, Some(Vec::new()))),
                    FrameEvent::Data(b) => out.last_mut().unwrap().1.as_mut().unwrap().extend(b),
                    FrameEvent::End(_) => {}
                }
            }
        }
        decoder.finish().unwrap();
        assert_eq!(
            count.load(Ordering::Relaxed) as usize,
            out.iter().filter(|(_, c)| c.is_some()).count()
        );
        (out, messages)
    }

    #[test]
    fn small_blobs_share_messages_big_ones_stream_and_a_shrunk_one_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut items: Vec<Wanted> = Vec::new();
        let mut want = Vec::new();
        let file = |i: usize, bytes: Vec<u8>| {
            let path = dir.path().join(i.to_string());
            std::fs::write(&path, &bytes).unwrap();
            let sig = crate::walk::sig_of(&std::fs::metadata(&path).unwrap());
            (Sha256::of(&bytes), path, sig, bytes)
        };
        // 300 small files, one big one among them, one never found.
        for i in 0..300 {
            let (d, path, sig, bytes) = file(i, format!("file {i}\n").repeat(i % 50 + 1).into());
            // Every third one is a stored copy, the others indexed files.
            let source = if i % 3 == 0 {
                BlobSource::Stored {
                    path,
                    size: sig.size,
                }
            } else {
                BlobSource::Indexed { path, sig }
            };
            items.push((d, Some(source)));
            want.push((d, Some(bytes)));
            if i == 100 {
                let (d, path, sig, bytes) = file(1000, vec![7u8; CHUNK * 2 + 5]);
                items.push((d, Some(BlobSource::Indexed { path, sig })));
                want.push((d, Some(bytes)));
                let gone = Sha256::of(b"gone");
                items.push((gone, None));
                want.push((gone, None));
            }
        }
        let (got, messages) = sent(items.clone());
        assert_eq!(got, want);
        // Gathered: far fewer messages than frames (one per file before).
        assert!(messages < 20, "{messages} messages");

        // A file that is no longer the one indexed (its size differs), and
        // a stored copy of another size than the store recorded: missing
        // frames, and the frames around them are whole.
        for i in [5, 6] {
            items[i].1 = match items[i].1.take() {
                Some(BlobSource::Indexed { path, sig }) => Some(BlobSource::Indexed {
                    path,
                    sig: crate::walk::FileSig {
                        size: sig.size + 10,
                        ..sig
                    },
                }),
                Some(BlobSource::Stored { path, size }) => Some(BlobSource::Stored {
                    path,
                    size: size - 1,
                }),
                None => unreachable!(),
            };
            want[i].1 = None;
        }
        assert!(matches!(items[6].1, Some(BlobSource::Stored { .. })));
        let (got, _) = sent(items);
        assert_eq!(got, want);
    }
}
