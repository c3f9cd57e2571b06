//! The timestamp's answer kept in memory (docs/trust.md#requests-per-run):
//! every per-node answer says the timestamp's `ETag` and the versions it
//! leads to, so reading it, hashing it, listing the directory for the
//! newest root and reading the snapshot on each request would be most of
//! that request's cost. The kept
//! answer is used while a `stat` of the file and of the directory shows
//! both unchanged (size, inode, modification and change times); past
//! [`MAX_AGE`] the file's bytes are compared with the kept ones too, so a
//! file rewritten in place within one timestamp tick is read again within
//! a second.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::http::HeaderValue;
use bytes::Bytes;
use pluginsync_common::etag::ETag;
use pluginsync_common::mutex::lock;
use pluginsync_common::trust::served::Served;

/// How long a kept answer is used without reading the file again.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// What a `stat` says of a file or directory, for "unchanged".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    ino: u64,
    modified: Option<SystemTime>,
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            len: m.len(),
            ino: m.ino(),
            modified: m.modified().ok(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// One read of a metadata file: its bytes, their ETag and, for the
/// timestamp, the newest root version in its directory and the headers the
/// per-node answer carries (`pluginsync_common::trust::served`), made once
/// per read, not per request.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The file's bytes.
    pub bytes: Bytes,
    /// Their ETag (their sha256).
    pub etag: ETag,
    /// The newest `N.root.json` in the directory.
    pub root: Option<u64>,
    /// What the per-node answer says of the metadata served, as headers;
    /// empty without a root (nothing a node could verify from).
    pub served: Arc<[(&'static str, HeaderValue)]>,
}

impl Answer {
    /// The headers that say `served` (those a header cannot carry left out).
    pub fn headers_of(served: Option<&Served>) -> Arc<[(&'static str, HeaderValue)]> {
        (served.iter().flat_map(|s| s.headers()))
            .filter_map(|(name, value)| Some((name, HeaderValue::from_str(&value).ok()?)))
            .collect()
    }
}

#[derive(Debug)]
struct Kept {
    file: Stamp,
    dir: Stamp,
    at: Instant,
    answer: Answer,
}

/// The kept answer of one metadata directory, used for at most `max_age`
/// ([`MAX_AGE`] by default); see the module docs.
#[derive(Debug)]
pub struct TimestampCache {
    kept: Mutex<Option<Kept>>,
    max_age: Duration,
}

impl Default for TimestampCache {
    fn default() -> TimestampCache {
        TimestampCache {
            kept: Mutex::default(),
            max_age: MAX_AGE,
        }
    }
}

impl TimestampCache {
    /// The answer for `dir`'s `timestamp.json`: the kept one while
    /// unchanged, else `read` (the file's bytes and the newest root), kept
    /// for the next request (not kept when a `stat` fails: the next
    /// request reads again).
    pub fn get(
        &self,
        dir: &Path,
        read: impl FnOnce() -> std::io::Result<Answer>,
    ) -> std::io::Result<Answer> {
        let path = dir.join("timestamp.json");
        let file = Stamp::of(&path);
        let dir_stamp = Stamp::of(dir);
        if let (Some(file), Some(dir_stamp)) = (&file, &dir_stamp)
            && let Some(k) = lock(&self.kept).as_mut()
            && k.file == *file
            && k.dir == *dir_stamp
        {
            if k.at.elapsed() < self.max_age {
                return Ok(k.answer.clone());
            }
            // Older: only the bytes are read again (what a rewrite within
            // one timestamp tick can change); the same bytes in the same
            // directory are the same answer.
            if same_bytes(&path, &k.answer.bytes) {
                k.at = Instant::now();
                return Ok(k.answer.clone());
            }
        }
        let answer = read()?;
        if let (Some(file), Some(dir)) = (file, dir_stamp) {
            *lock(&self.kept) = Some(Kept {
                file,
                dir,
                at: Instant::now(),
                answer: answer.clone(),
            });
        }
        Ok(answer)
    }
}

/// Whether `path` holds exactly `bytes` (read no further than one byte
/// past their length).
fn same_bytes(path: &Path, bytes: &[u8]) -> bool {
    use std::io::Read;
    let mut now = Vec::with_capacity(bytes.len() + 1);
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(bytes.len() as u64 + 1).read_to_end(&mut now));
    read.is_ok() && now == bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(dir: &Path) -> std::io::Result<Answer> {
        let bytes = std::fs::read(dir.join("timestamp.json"))?;
        Ok(Answer {
            etag: ETag::of_digest(&pluginsync_common::digest::Sha256::of(&bytes).0),
            bytes: Bytes::from(bytes),
            root: None,
            served: Arc::new([]),
        })
    }

    #[test]
    fn a_changed_file_is_read_again_and_an_unchanged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("timestamp.json"), b"one").unwrap();
        let cache = TimestampCache::default();
        let reads = std::cell::Cell::new(0);
        let get = |cache: &TimestampCache| {
            cache
                .get(d, || {
                    reads.set(reads.get() + 1);
                    answer(d)
                })
                .unwrap()
        };
        assert_eq!(get(&cache).bytes, &b"one"[..]);
        assert_eq!(get(&cache).bytes, &b"one"[..]);
        // A new file in its place (how a pipeline publishes: rename).
        std::fs::write(d.join("new"), b"two!").unwrap();
        std::fs::rename(d.join("new"), d.join("timestamp.json")).unwrap();
        assert_eq!(get(&cache).bytes, &b"two!"[..]);
        assert_eq!(reads.get(), 2, "one read per version of the file");
        // Rewritten in place with the same length (possibly within one
        // timestamp tick): read again once the kept answer is older than
        // its max age, here none.
        let young = TimestampCache {
            kept: Mutex::default(),
            max_age: Duration::ZERO,
        };
        assert_eq!(young.get(d, || answer(d)).unwrap().bytes, &b"two!"[..]);
        std::fs::write(d.join("timestamp.json"), b"six!").unwrap();
        assert_eq!(young.get(d, || answer(d)).unwrap().bytes, &b"six!"[..]);
        // Unchanged past its max age: the bytes compared, nothing parsed.
        let unread = young.get(d, || panic!("read again")).unwrap();
        assert_eq!(unread.bytes, &b"six!"[..]);
    }
}
