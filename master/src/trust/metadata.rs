//! The TUF metadata the deploy pipeline signed, served read-only from
//! `[trust] metadata` at `/pluginsync/v1/trust/<file>`
//! (docs/trust.md#what-the-masters-serve): the master carries signatures,
//! it never makes them. Only TUF's file names are served (`timestamp.json`,
//! `N.root.json`, `N.snapshot.json`, `N.targets.json`), so no other path
//! of the directory, nor outside it, is reachable. The versioned files
//! never change (consistent snapshots): immutable, cacheable; the
//! timestamp is revalidated (`no-cache`, an `ETag`, 304 when unchanged),
//! and its answer says the newest root version served
//! (`X-Pluginsync-Trust-Root`). What the per-node answer says of them
//! ([`served`]) lets a node's no-op run ask none of them
//! (docs/trust.md#requests-per-run).

use std::path::Path;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use pluginsync_common::digest::Sha256;
use pluginsync_common::etag::ETag;
use pluginsync_common::protocol;
use pluginsync_common::trust::served::{Served, named_version};
use pluginsync_common::trust::{HEADER_ROOT_VERSION, METADATA_PREFIX};

use crate::api_error::ApiError;
use crate::request;
use crate::state::AppState;
use crate::trust::timestamp::Answer;

/// The largest metadata file served: a targets file of many thousand
/// generations stays well under it.
const MAX_METADATA_BYTES: u64 = 32 << 20;

/// Whether `name` is a TUF metadata file name, and whether it is
/// versioned (immutable).
pub fn metadata_name(name: &str) -> Option<bool> {
    if name == "timestamp.json" {
        return Some(false);
    }
    let (version, role) = name.split_once('.')?;
    let versioned = !version.is_empty()
        && version.len() <= 20
        && version.bytes().all(|b| b.is_ascii_digit())
        && matches!(role, "root.json" | "snapshot.json" | "targets.json");
    versioned.then_some(true)
}

/// `GET /pluginsync/v1/trust/<file>`: see the module docs. 404 when
/// `[trust] metadata` is not set or the file is not there.
pub async fn serve(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    state.gate.admit(&req)?;
    let name = req
        .uri
        .path()
        .strip_prefix(METADATA_PREFIX)
        .unwrap_or_default();
    let (Some(dir), Some(immutable)) = (state.config.trust.metadata.as_ref(), metadata_name(name))
    else {
        return Err(ApiError::not_found("trust metadata", name));
    };
    // Every node's no-op run asks the timestamp: answered from memory
    // while the file and its directory are unchanged (a `stat` of each).
    let answer = match immutable {
        true => {
            let path = dir.join(name);
            tokio::task::spawn_blocking(move || read_answer(&path, None))
                .await
                .map_err(|_| ApiError::internal())?
        }
        false => timestamp(&state, dir),
    };
    let Answer {
        bytes, etag, root, ..
    } = match answer {
        Ok(a) => a,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => return Err(ApiError::internal()),
        Err(_) => return Err(ApiError::not_found("trust metadata", name)),
    };
    let cache = match immutable {
        true if state.config.authorization.is_empty() => protocol::CACHE_IMMUTABLE,
        true => protocol::CACHE_IMMUTABLE_PRIVATE,
        false => "no-cache",
    };
    let unchanged = request::not_modified(&req.headers, &etag);
    let mut resp = match unchanged {
        true => Response::builder().status(StatusCode::NOT_MODIFIED),
        false => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json"),
    };
    if let Ok(v) = HeaderValue::from_str(etag.as_str()) {
        resp = resp.header(header::ETAG, v);
    }
    if let Some(v) = root {
        resp = resp.header(HEADER_ROOT_VERSION, v);
    }
    let body = match unchanged {
        true => Body::empty(),
        false => Body::from(bytes),
    };
    resp.header(header::CACHE_CONTROL, cache)
        .body(body)
        .map_err(|_| ApiError::internal())
}

/// The answer for `dir`'s `timestamp.json`, from memory while unchanged
/// (`TimestampCache`).
fn timestamp(state: &AppState, dir: &Path) -> std::io::Result<Answer> {
    (state.trust_timestamp).get(dir, || read_answer(&dir.join("timestamp.json"), Some(dir)))
}

/// The headers that say, on the per-node answer, what signed metadata is
/// served (docs/trust.md#requests-per-run): none without `[trust]
/// metadata` or a readable timestamp and root.
pub fn served(state: &AppState) -> Arc<[(&'static str, HeaderValue)]> {
    let answer = (state.config.trust.metadata.as_ref()).and_then(|d| timestamp(state, d).ok());
    answer.map_or_else(|| Arc::new([]) as Arc<[_]>, |a| a.served)
}

/// `path`'s answer: its bytes, their ETag, and with `dir` (the
/// timestamp's) the newest root version there and the snapshot and
/// targets versions the timestamp leads to.
fn read_answer(path: &Path, dir: Option<&Path>) -> std::io::Result<Answer> {
    let bytes = read_bounded(path)?;
    let etag = ETag::of_digest(&Sha256::of(&bytes).0);
    let root = dir.and_then(newest_root);
    let served = dir.zip(root).map(|(d, root)| {
        let snapshot = named_version(&bytes, "snapshot.json");
        let targets = snapshot.and_then(|v| {
            let snapshot = read_bounded(&d.join(format!("{v}.snapshot.json"))).ok()?;
            named_version(&snapshot, "targets.json")
        });
        Served {
            timestamp: etag.as_str().to_owned(),
            root,
            snapshot,
            targets,
        }
    });
    Ok(Answer {
        etag,
        bytes: Bytes::from(bytes),
        root,
        served: Answer::headers_of(served.as_ref()),
    })
}

/// `path`'s bytes, refused (`FileTooLarge`) over [`MAX_METADATA_BYTES`].
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_METADATA_BYTES + 1)
        .read_to_end(&mut bytes)?;
    match bytes.len() as u64 <= MAX_METADATA_BYTES {
        true => Ok(bytes),
        false => Err(std::io::ErrorKind::FileTooLarge.into()),
    }
}

/// The newest `N.root.json` version in `dir`.
fn newest_root(dir: &Path) -> Option<u64> {
    (std::fs::read_dir(dir).ok()?.flatten())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".root.json")?
                .parse()
                .ok()
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::metadata_name;

    #[test]
    fn only_tuf_file_names_are_served() {
        assert_eq!(metadata_name("timestamp.json"), Some(false));
        for v in ["1.root.json", "12.snapshot.json", "3.targets.json"] {
            assert_eq!(metadata_name(v), Some(true), "{v}");
        }
        for bad in [
            "root.json",
            "../1.root.json",
            "1.root.json/x",
            "a.root.json",
            ".root.json",
            "1.keys.json",
            "1.targets.json.bak",
            "",
        ] {
            assert_eq!(metadata_name(bad), None, "{bad}");
        }
    }
}
