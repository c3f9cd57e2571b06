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

use crate::api_error::ApiError;
use crate::auth;
use crate::config::ClientAuth;
use crate::handlers::AppState;
use crate::request::Query;

/// Checksums per request at most.
pub const MAX_BATCH: usize = 128;
/// The path agents are told about.
pub const BATCH_PATH: &str = "/pluginsync/v1/blobs";
/// Bytes read and sent per chunk of a large blob.
const CHUNK: usize = 256 * 1024;

fn parse_hex(h: &str) -> Option<[u8; 32]> {
    if h.len() != 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The handler; see the module docs.
pub async fn blobs_batch(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    let certname = auth::peer_common_name(req.extensions.get::<Arc<TlsInfo>>());
    if state.client_auth != ClientAuth::None && certname.is_none() {
        return Err(ApiError::forbidden(req.uri.path()));
    }
    let hashes = Query::parse(req.uri.query()).all("sha256");
    if hashes.is_empty() || hashes.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "ask for 1 to {MAX_BATCH} sha256 values"
        )));
    }
    let mut wanted = Vec::with_capacity(hashes.len());
    for h in &hashes {
        let digest = parse_hex(h).ok_or_else(|| {
            ApiError::bad_request(format!("'{h}' is not 64 lowercase hex digits"))
        })?;
        wanted.push((h.clone(), digest));
    }
    crate::request::check_accept(
        &req.headers,
        &["application/x-pluginsync-blobs", "application/octet-stream"],
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
    let items: Vec<(String, Option<(std::path::PathBuf, crate::walk::FileSig)>)> = wanted
        .into_iter()
        .map(|(hex, digest)| {
            let found = envs.iter().find_map(|idx| {
                let (root, node) = idx.blob(&digest)?;
                Some((node.real_path(&root.canon).into_owned(), node.sig?))
            });
            (hex, found)
        })
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let store = state.store;
    tokio::task::spawn_blocking(move || {
        for (hex, found) in items {
            let opened = found.and_then(|(path, sig)| {
                crate::walk::open_indexed(&path, sig)
                    .ok()
                    .map(|f| (f, sig.size))
            });
            let Some((mut file, size)) = opened else {
                if tx
                    .blocking_send(Ok(Bytes::from(format!("{hex} -\n"))))
                    .is_err()
                {
                    return;
                }
                continue;
            };
            if tx
                .blocking_send(Ok(Bytes::from(format!("{hex} {size}\n"))))
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
                HeaderValue::from_static("application/x-pluginsync-blobs"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_parsing() {
        assert!(parse_hex(&"ab".repeat(32)).is_some());
        assert!(parse_hex(&"AB".repeat(32)).is_none());
        assert!(parse_hex("ab").is_none());
        assert!(parse_hex(&"zz".repeat(32)).is_none());
    }
}
