//! The wire contract both sides must agree on, in one place: the mounts,
//! the endpoint paths, the query a pluginsync listing is asked with, the
//! headers and media types of pluginsync's extensions, and the batch frame
//! format with its limits (docs/protocol.md §1 and §7). The delta listing
//! format is `delta.rs`, the entity tags `etag.rs`.
//!
//! The master routes and answers with these constants and the agent builds
//! its requests and parses its answers with them; neither spells a path,
//! header name or limit of its own.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::Sha256;
use crate::urlpath::{encode_path, encode_query_value};

/// The mounts a pluginsync master serves (docs/protocol.md §3.1): the
/// union of every module's `lib/` (`plugins`) or `facts.d/`
/// (`pluginfacts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mount {
    /// Module `lib/` directories: Ruby plugins, facts, functions, types.
    Plugins,
    /// Module `facts.d/` directories: external facts.
    Pluginfacts,
}

impl Mount {
    /// Both mounts, `plugins` first.
    pub const ALL: [Mount; 2] = [Mount::Plugins, Mount::Pluginfacts];

    /// The mount's name in URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            Mount::Plugins => "plugins",
            Mount::Pluginfacts => "pluginfacts",
        }
    }

    /// The module subdirectory the mount unites.
    pub fn module_subdir(self) -> &'static str {
        match self {
            Mount::Plugins => "lib",
            Mount::Pluginfacts => "facts.d",
        }
    }
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mount name that is neither `plugins` nor `pluginfacts`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mount '{0}' (plugins or pluginfacts)")]
pub struct UnknownMount(pub String);

impl FromStr for Mount {
    type Err = UnknownMount;
    fn from_str(s: &str) -> Result<Mount, UnknownMount> {
        match s {
            "plugins" => Ok(Mount::Plugins),
            "pluginfacts" => Ok(Mount::Pluginfacts),
            _ => Err(UnknownMount(s.to_owned())),
        }
    }
}

/// `GET {FILE_METADATAS}/<mount>?…`: a recursive listing (Puppet's).
pub const FILE_METADATAS: &str = "/puppet/v3/file_metadatas";
/// `GET {FILE_METADATA}/<mount>[/<path>]`: one entry (Puppet's).
pub const FILE_METADATA: &str = "/puppet/v3/file_metadata";
/// `GET {FILE_CONTENT}/<mount>/<path>`: a file's bytes (Puppet's).
pub const FILE_CONTENT: &str = "/puppet/v3/file_content";
/// `GET /status/v1/simple`: the health check (Puppet Server's).
pub const STATUS_SIMPLE: &str = "/status/v1/simple";

/// Where a pluginsync master serves a file by its sha256:
/// `{BLOB_PREFIX}<64 hex>` (docs/protocol.md §7.1).
pub const BLOB_PREFIX: &str = "/pluginsync/v1/blobs/sha256/";
/// Where it serves many blobs in one answer: `{BATCH_PATH}?sha256=…&…`
/// (docs/protocol.md §7.2).
pub const BATCH_PATH: &str = "/pluginsync/v1/blobs";
/// The query key of each digest in a batch request.
pub const BATCH_QUERY_KEY: &str = "sha256";
/// Digests per batch request at most: the master refuses more, the agent
/// never asks for more (128 × 71 bytes of query stays well inside HTTP/2's
/// 16 KiB header-list limit).
pub const MAX_BATCH: usize = 128;

/// Listing response header: the blob prefix ([`BLOB_PREFIX`]) of a master
/// that serves content by checksum.
pub const HEADER_BLOBS: &str = "x-pluginsync-blobs";
/// Listing response header: the batch path ([`BATCH_PATH`]) of a master
/// that serves batches.
pub const HEADER_BLOB_BATCH: &str = "x-pluginsync-blob-batch";
/// The Puppet version header, on every request and response.
pub const HEADER_PUPPET_VERSION: &str = "x-puppet-version";

/// What a stock agent accepts for a listing (docs/protocol.md §1.6).
pub const ACCEPT_LISTING: &str = "application/json, text/pson";
/// What a stock agent accepts for content.
pub const ACCEPT_CONTENT: &str = "application/octet-stream";
/// The media type of a batch answer.
pub const BLOBS_MEDIA_TYPE: &str = "application/x-pluginsync-blobs";

/// `GET {ASSIGNMENT_PATH}?environment=<env>`: the per-node answer, which
/// generation this node should have (docs/protocol.md §7.6). Answered by a
/// master with the node's identity; `Cache-Control: private, no-cache`.
pub const ASSIGNMENT_PATH: &str = "/pluginsync/v1/assignment";
/// `POST {REPORT_PATH}?environment=<env>`: a node's report right after
/// its commit, the body the `X-Pluginsync-Report` header's value, at most
/// 4,096 bytes (docs/protocol.md §7.8).
pub const REPORT_PATH: &str = "/pluginsync/v1/report";
/// `GET {GENERATIONS_PREFIX}<64 hex>?environment=<env>[&since=<64 hex>]`: a
/// generation's canonical manifest, or its delta from `since` when the
/// master has that one too (docs/protocol.md §7.6). Immutable.
pub const GENERATIONS_PREFIX: &str = "/pluginsync/v1/generations/";
/// The query key naming the generation a manifest delta starts from.
pub const SINCE_QUERY_KEY: &str = "since";
/// The media type of a canonical manifest (`generation.rs`).
pub const MANIFEST_MEDIA_TYPE: &str = "application/x-pluginsync-manifest";
/// The media type of a manifest delta (`generation.rs`).
pub const MANIFEST_DELTA_MEDIA_TYPE: &str = "application/x-pluginsync-manifest-delta";
/// Response header: the generation an answer was made from (listings,
/// content, the per-node answer, manifests).
pub const HEADER_GENERATION: &str = "x-pluginsync-generation";
/// Listing and status response header: the per-node answer's path
/// ([`ASSIGNMENT_PATH`]) of a master that serves generations.
pub const HEADER_GENERATIONS: &str = "x-pluginsync-generations";
/// `Cache-Control` of an immutable answer (a manifest, a blob) that any
/// HTTP cache may keep (docs/protocol.md §6.4).
pub const CACHE_IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// `Cache-Control` of an immutable answer that only the client may keep:
/// the environment has a per-environment `[[authorization]]` rule.
pub const CACHE_IMMUTABLE_PRIVATE: &str = "private, max-age=31536000, immutable";

/// The parameters of a pluginsync listing, as a stock agent sends them
/// (docs/protocol.md §1.2): recursive, unlimited, links followed, sha256.
#[derive(Debug, Clone, Copy)]
pub struct ListingQuery<'a> {
    /// The environment.
    pub environment: &'a str,
    /// `use`, `use_when_creating` or `ignore`.
    pub source_permissions: &'a str,
    /// Ignore globs, in order.
    pub ignore: &'a [String],
}

impl ListingQuery<'_> {
    /// The query string (without `?`), byte for byte a stock agent's.
    pub fn to_query(&self) -> String {
        let mut query = String::from("recurse=true&max_files=-1");
        for i in self.ignore {
            query.push_str("&ignore=");
            query.push_str(&encode_query_value(i));
        }
        query.push_str("&links=follow&checksum_type=sha256&source_permissions=");
        query.push_str(&encode_query_value(self.source_permissions));
        query.push_str("&environment=");
        query.push_str(&encode_query_value(self.environment));
        query
    }

    /// The whole URL of the listing of `mount` on `server` (`https://host:port`).
    pub fn url(&self, server: &str, mount: Mount) -> String {
        listing_url(server, mount, &self.to_query())
    }
}

/// The URL of the listing of `mount` on `server` asked with `query` (a
/// [`ListingQuery::to_query`]).
pub fn listing_url(server: &str, mount: Mount, query: &str) -> String {
    format!(
        "{}{FILE_METADATAS}/{mount}?{query}",
        server.trim_end_matches('/')
    )
}

/// The URL of Puppet's `file_content` for `rel` in `mount` of `environment`.
pub fn content_url(server: &str, mount: Mount, rel: &str, environment: &str) -> String {
    format!(
        "{}{FILE_CONTENT}/{mount}/{}?environment={}",
        server.trim_end_matches('/'),
        encode_path(rel),
        encode_query_value(environment)
    )
}

/// The query of a batch request for `digests`.
pub fn batch_query(digests: &[Sha256]) -> String {
    let mut q = String::with_capacity(digests.len() * 72);
    for (i, d) in digests.iter().enumerate() {
        if i > 0 {
            q.push('&');
        }
        q.push_str(BATCH_QUERY_KEY);
        q.push('=');
        q.push_str(&d.to_hex());
    }
    q
}

/// The longest frame header the decoder accepts: 64 hex digits, a space,
/// a 20-digit length and the newline.
pub const MAX_FRAME_HEADER: usize = 64 + 1 + 20 + 1;

/// The header of one batch frame (docs/protocol.md §7.2):
/// `<64 hex> <length>\n` before `length` bytes of content, or
/// `<64 hex> -\n` for a blob the master does not have (fetch it singly).
pub fn frame_header(digest: &Sha256, len: Option<u64>) -> String {
    match len {
        Some(n) => format!("{digest} {n}\n"),
        None => format!("{digest} -\n"),
    }
}

/// One thing a batch answer says, in stream order.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameEvent<'a> {
    /// The master does not have this blob.
    Missing(Sha256),
    /// A blob of `len` bytes starts.
    Begin {
        /// Its digest.
        digest: Sha256,
        /// Its length.
        len: u64,
    },
    /// The next bytes of the current blob.
    Data(&'a [u8]),
    /// The current blob is complete (its bytes are not yet verified).
    End(Sha256),
}

/// A batch answer that is not in the frame format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A header longer than [`MAX_FRAME_HEADER`] without a newline.
    #[error("frame header longer than {MAX_FRAME_HEADER} bytes")]
    HeaderTooLong,
    /// A header that is not `<64 hex> <length|->`.
    #[error("bad frame header {0:?}")]
    BadHeader(String),
    /// The stream ended inside a frame or a header.
    #[error("the stream ended inside a frame")]
    Truncated,
}

/// An incremental decoder of batch answers: [`FrameDecoder::feed`] the
/// bytes as they arrive, then take [`FrameDecoder::next_event`] until it
/// says `None`. Memory is bounded by the largest chunk fed plus
/// [`MAX_FRAME_HEADER`], whatever the peer sends.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    pos: usize,
    /// The frame being read and its bytes still to come.
    current: Option<(Sha256, u64)>,
}

impl FrameDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next event from what was fed, or `None` when more bytes are
    /// needed.
    pub fn next_event(&mut self) -> Result<Option<FrameEvent<'_>>, FrameError> {
        if let Some((digest, left)) = self.current {
            if left == 0 {
                self.current = None;
                return Ok(Some(FrameEvent::End(digest)));
            }
            let avail = self.buf.len() - self.pos;
            if avail == 0 {
                return Ok(None);
            }
            let take = usize::try_from(left).map_or(avail, |l| l.min(avail));
            let start = self.pos;
            self.pos += take;
            self.current = Some((digest, left - take as u64));
            return Ok(Some(FrameEvent::Data(&self.buf[start..start + take])));
        }
        let rest = &self.buf[self.pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > MAX_FRAME_HEADER {
                return Err(FrameError::HeaderTooLong);
            }
            return Ok(None);
        };
        if nl + 1 > MAX_FRAME_HEADER {
            return Err(FrameError::HeaderTooLong);
        }
        let line = &rest[..nl];
        self.pos += nl + 1;
        let bad = || FrameError::BadHeader(String::from_utf8_lossy(line).into_owned());
        let text = std::str::from_utf8(line).map_err(|_| bad())?;
        let (hex, len) = text.split_once(' ').ok_or_else(bad)?;
        let digest = Sha256::from_hex(hex).map_err(|_| bad())?;
        if len == "-" {
            return Ok(Some(FrameEvent::Missing(digest)));
        }
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let len: u64 = len.parse().map_err(|_| bad())?;
        self.current = Some((digest, len));
        Ok(Some(FrameEvent::Begin { digest, len }))
    }

    /// Checks that the stream ended between frames.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.current.is_some() || self.pos < self.buf.len() {
            Err(FrameError::Truncated)
        } else {
            Ok(())
        }
    }
}

/// Request header by which pluginsync's agent asks for a delta listing
/// (docs/protocol.md §7.5), always together with `If-None-Match`; its value
/// is the delta format version, [`DELTA_VERSION`]. Stock agents never send
/// it, so they never receive a delta.
pub const HEADER_DELTA: &str = "x-pluginsync-delta";
/// The delta format this code speaks.
pub const DELTA_VERSION: &str = "1";
/// The media type of a delta listing answer.
pub const DELTA_MEDIA_TYPE: &str = "application/x-pluginsync-listing-delta";
/// The status of a delta listing answer: `226 IM Used` (RFC 3229: the body
/// is an instance manipulation of the resource, not the resource).
pub const DELTA_STATUS: u16 = 226;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_parse_and_print() {
        for m in Mount::ALL {
            assert_eq!(m.as_str().parse::<Mount>(), Ok(m));
            assert_eq!(m.to_string(), m.as_str());
        }
        assert!("modules".parse::<Mount>().is_err());
        assert_eq!(Mount::Pluginfacts.module_subdir(), "facts.d");
    }

    #[test]
    fn listing_query_is_a_stock_agents() {
        let ignore = vec![".git".to_owned(), "a b".to_owned()];
        let q = ListingQuery {
            environment: "production",
            source_permissions: "ignore",
            ignore: &ignore,
        };
        assert_eq!(
            q.to_query(),
            "recurse=true&max_files=-1&ignore=.git&ignore=a%20b&links=follow&checksum_type=sha256&source_permissions=ignore&environment=production"
        );
        assert!(
            q.url("https://m:8140/", Mount::Plugins)
                .starts_with("https://m:8140/puppet/v3/file_metadatas/plugins?recurse=true")
        );
        assert_eq!(
            content_url("https://m:8140", Mount::Plugins, "a b/c.rb", "production"),
            "https://m:8140/puppet/v3/file_content/plugins/a%20b/c.rb?environment=production"
        );
    }

    /// Each blob's hex digest and its bytes (`None`: missing).
    type Decoded = Vec<(String, Option<Vec<u8>>)>;

    /// Feeds `stream` in chunks of `n` and collects what the decoder says.
    fn decode(stream: &[u8], n: usize) -> Result<Decoded, FrameError> {
        let mut d = FrameDecoder::new();
        let mut out = Vec::new();
        let mut body: Option<Vec<u8>> = None;
        for chunk in stream.chunks(n.max(1)) {
            d.feed(chunk);
            while let Some(ev) = d.next_event()? {
                match ev {
                    FrameEvent::Missing(s) => out.push((s.to_hex(), None)),
                    FrameEvent::Begin { .. } => body = Some(Vec::new()),
                    FrameEvent::Data(b) => body.as_mut().unwrap().extend_from_slice(b),
                    FrameEvent::End(s) => out.push((s.to_hex(), body.take())),
                }
            }
        }
        d.finish()?;
        Ok(out)
    }

    #[test]
    fn frames_round_trip_in_any_chunking() {
        let (a, b, c) = (Sha256::of(b"aa"), Sha256::of(b""), Sha256::of(b"x"));
        let mut s = Vec::new();
        s.extend(frame_header(&a, Some(2)).bytes());
        s.extend(b"aa");
        s.extend(frame_header(&c, None).bytes());
        s.extend(frame_header(&b, Some(0)).bytes());
        let want = vec![
            (a.to_hex(), Some(b"aa".to_vec())),
            (c.to_hex(), None),
            (b.to_hex(), Some(Vec::new())),
        ];
        for n in [1, 2, 3, 7, 64, 65, 66, 1000] {
            assert_eq!(decode(&s, n).unwrap(), want, "chunks of {n}");
        }
        assert_eq!(decode(&s[..s.len() - 1], 5), Err(FrameError::Truncated));
        assert_eq!(decode(&s[..70], 5), Err(FrameError::Truncated));
    }

    #[test]
    fn hostile_frames_are_refused_with_bounded_memory() {
        assert_eq!(decode(&[b'a'; 10_000], 100), Err(FrameError::HeaderTooLong));
        let bad = |h: &str| decode(h.as_bytes(), 4);
        let hex = Sha256::of(b"").to_hex();
        assert!(matches!(
            bad(&format!("{hex} +1\n")),
            Err(FrameError::BadHeader(_))
        ));
        assert!(matches!(
            bad(&format!("{hex}\n")),
            Err(FrameError::BadHeader(_))
        ));
        assert!(matches!(bad("zz 1\n"), Err(FrameError::BadHeader(_))));
        assert!(matches!(
            bad(&format!("{hex} 99999999999999999999\n")),
            Err(FrameError::BadHeader(_))
        ));
    }

    #[test]
    fn batch_query_names_each_digest() {
        let d = [Sha256::of(b"1"), Sha256::of(b"2")];
        assert_eq!(batch_query(&d), format!("sha256={}&sha256={}", d[0], d[1]));
        assert_eq!(
            frame_header(&d[0], Some(5)),
            format!("{} 5\n", d[0].to_hex())
        );
    }
}
