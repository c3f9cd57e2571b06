//! `GET /pluginsync/v1/blobs?sha256=<hex>&sha256=<hex>…`: many blobs in
//! one answer (pluginsync's extension; stock agents never ask for it).
//!
//! A first sync of 3,000 files is 3,000 requests over Puppet's API; most of
//! its cost on both ends is per request (measured in the bench). This
//! endpoint answers up to [`MAX_BATCH`] checksums at once as a stream of
//! frames, in request order:
//!
//! ```text
//! <64 hex> <length>\n<length bytes>     the blob
//! <64 hex> -\n                          not found (or changed): fetch it singly
//! ```
//!
//! The same rules as for single blobs hold: a client certificate is needed,
//! only environments the client may read are searched, and only the inode
//! the index vouched for is read. Advertised to agents by the
//! `X-Pluginsync-Blob-Batch` header on listings.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum_server::tls::TlsInfo;
use bytes::Bytes;

use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{self, MAX_BATCH};

use crate::api_error::ApiError;
use crate::auth;
use crate::config::ClientAuth;
use crate::handlers::AppState;
use crate::request::Query;

/// Bytes read and sent per chunk of a large blob.
const CHUNK: usize = 256 * 1024;

/// The handler; see the module docs.
pub async fn blobs_batch(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    let certname = auth::peer_common_name(req.extensions.get::<Arc<TlsInfo>>());
    if state.client_auth != ClientAuth::None && certname.is_none() {
        return Err(ApiError::forbidden(req.uri.path()));
    }
    let hashes = Query::parse(req.uri.query()).all(protocol::BATCH_QUERY_KEY);
    if hashes.is_empty() || hashes.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "ask for 1 to {MAX_BATCH} sha256 values"
        )));
    }
    let mut wanted = Vec::with_capacity(hashes.len());
    for h in &hashes {
        let digest = Sha256::from_hex(h).map_err(|e| ApiError::bad_request(e.to_string()))?;
        wanted.push(digest);
    }
    crate::request::check_accept(
        &req.headers,
        &[protocol::BLOBS_MEDIA_TYPE, protocol::ACCEPT_CONTENT],
    )?;
    let envs: Vec<_> = state
        .store
        .all()
        .into_iter()
        .filter(|idx| {
            state.client_auth == ClientAuth::None
                || certname
                    .as_deref()
                    .is_some_and(|cn| state.authorizer.allows(cn, idx.name.as_str()))
        })
        .collect();
    let items: Vec<(Sha256, Option<(std::path::PathBuf, crate::walk::FileSig)>)> = wanted
        .into_iter()
        .map(|digest| {
            let found = envs.iter().find_map(|idx| {
                let (root, node) = idx.blob(&digest.0)?;
                Some((node.real_path(&root.canon).into_owned(), node.sig?))
            });
            (digest, found)
        })
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let store = state.store;
    tokio::task::spawn_blocking(move || {
        for (digest, found) in items {
            let opened = found.and_then(|(path, sig)| {
                crate::walk::open_indexed(&path, sig)
                    .ok()
                    .map(|f| (f, sig.size))
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
            store.stats.contents_sent.fetch_add(1, Ordering::Relaxed);
        }
    });
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
