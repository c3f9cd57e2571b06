//! What a master offers beyond Puppet's API (docs/protocol.md §7): content
//! by checksum and batches of blobs, at paths its listing answer names in
//! `X-Pluginsync-Blobs` and `X-Pluginsync-Blob-Batch`. A path is only
//! taken when it is on the master itself ([`same_origin_path`]): the
//! agent's requests (and its client certificate) never go to a host a
//! listing names (docs/protocol.md §7.3).

use pluginsync_common::protocol;
use reqwest::header::HeaderMap;

/// A path on the master itself, as an `X-Pluginsync-Blobs` or
/// `X-Pluginsync-Blob-Batch` header offered it: checked by
/// [`same_origin_path`], so the agent's requests (and its client
/// certificate) never go to a host a listing names (docs/protocol.md §7.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginPath(String);

impl OriginPath {
    /// The path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a master serves a file's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentBy {
    /// Puppet's `file_content` only.
    FileContent,
    /// By checksum under this prefix (docs/protocol.md §7.1), cacheable by
    /// any HTTP cache in front of it; `file_content` when a blob is not
    /// found.
    Checksum(OriginPath),
    /// A generation's content: by checksum under this prefix only
    /// (docs/protocol.md §7.6); a blob not found is the server not keeping
    /// the generation, never a reason to ask `file_content`, which serves
    /// whatever the tree holds now.
    Blobs(OriginPath),
}

/// What a master's listing answer offers beyond Puppet's API
/// (docs/protocol.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offers {
    /// How it serves content.
    pub content: ContentBy,
    /// Where it serves many blobs at once, if it does.
    pub batch: Option<OriginPath>,
    /// Whether it says it serves generations (`X-Pluginsync-Generations`,
    /// docs/protocol.md §7.6): a run that synced its listings asks the
    /// per-node answer again next time.
    pub generations: bool,
}

impl Offers {
    /// What a master serving generations offers: blobs and batches at the
    /// paths of docs/protocol.md §7.1, §7.2.
    pub fn generation() -> Offers {
        Offers {
            content: ContentBy::Blobs(OriginPath(protocol::BLOB_PREFIX.to_owned())),
            batch: Some(OriginPath(protocol::BATCH_PATH.to_owned())),
            generations: true,
        }
    }

    /// Whether the answer came from a pluginsync master: it carried one of
    /// its `X-Pluginsync-*` headers (docs/protocol.md §7).
    pub fn from_pluginsync(&self) -> bool {
        self.generations || self.batch.is_some() || self.content != ContentBy::FileContent
    }

    /// What `server`'s answer headers offer; a header that is not a path
    /// on `server` is ignored (with a warning when `warn`).
    pub(super) fn of(server: &str, headers: &HeaderMap, warn: bool) -> Offers {
        let offered = |name: &str| {
            let value = headers.get(name)?.to_str().ok()?;
            let path = same_origin_path(server, value);
            if path.is_none() && warn {
                tracing::warn!(server = %server, header = %name, value = %value.escape_debug(), "not a path on this server, ignored");
            }
            path
        };
        Offers {
            content: offered(protocol::HEADER_BLOBS)
                .map_or(ContentBy::FileContent, ContentBy::Checksum),
            batch: offered(protocol::HEADER_BLOB_BATCH),
            generations: headers.contains_key(protocol::HEADER_GENERATIONS),
        }
    }
}

/// `value` (an `X-Pluginsync-Blobs` or `X-Pluginsync-Blob-Batch` header)
/// if it is an absolute path on `server` itself, else `None`: it starts
/// with one `/`, has no `..` segment, no `@`, `\\`, `?`, `#`, scheme,
/// space or control character, and `server` followed by it parses as a URL
/// of the same origin with exactly that path (docs/protocol.md §7.3).
pub fn same_origin_path(server: &str, value: &str) -> Option<OriginPath> {
    let plain = value.starts_with('/')
        && !value.starts_with("//")
        && !value.contains("://")
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'@' | b'\\' | b'?' | b'#'))
        && !value.split('/').any(|seg| seg == ".." || seg == ".");
    if !plain {
        return None;
    }
    let base = reqwest::Url::parse(server).ok()?;
    let url = reqwest::Url::parse(&format!("{}{value}", server.trim_end_matches('/'))).ok()?;
    (url.origin() == base.origin() && url.path() == value && url.username().is_empty())
        .then(|| OriginPath(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_locations_are_paths_on_the_server_itself() {
        let s = "https://puppet:8140";
        for ok in [
            "/pluginsync/v1/blobs",
            "/pluginsync/v1/blobs/sha256/",
            "/a%20b/",
        ] {
            assert_eq!(
                same_origin_path(s, ok).as_ref().map(OriginPath::as_str),
                Some(ok),
                "{ok}"
            );
        }
        for bad in [
            "@127.0.0.1:9/x",
            "/@127.0.0.1:9/x",
            "//evil:443/x",
            "https://evil/x",
            "/x/../../y",
            "/./x",
            "x/y",
            "",
            "/a b",
            "/a\\b",
            "/a?b",
            "/a#b",
            "/a\u{1b}b",
            "/a:b@evil/",
        ] {
            assert_eq!(same_origin_path(s, bad), None, "{bad:?}");
        }
    }
}
