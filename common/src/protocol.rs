//! The wire contract both sides must agree on, in one place: the mounts,
//! the endpoint paths, the query a pluginsync listing is asked with, the
//! headers and media types of pluginsync's extensions, and the batch frame
//! format with its limits (docs/protocol.md §1 and §7).
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
        format!(
            "{}{FILE_METADATAS}/{mount}?{}",
            server.trim_end_matches('/'),
            self.to_query()
        )
    }
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

// ---------------------------------------------------------------------
// Delta listings (docs/protocol.md §7.5)
// ---------------------------------------------------------------------

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
/// The first line of a delta body.
const DELTA_MAGIC: &str = "pluginsync-listing-delta 1";

/// The strong `ETag` of a listing body (docs/protocol.md §6.1): `"` + the
/// lowercase hex of the first 20 bytes of the body's sha256 + `"`. The
/// master tags every listing with it and the agent checks a rebuilt listing
/// against it.
pub fn listing_etag(body: &[u8]) -> String {
    let digest = Sha256::of(body);
    format!("\"{}\"", crate::digest::hex(&digest.0[..20]))
}

/// The part of an entity tag that names a listing's content: without `W/`,
/// the quotes and a `-gzip` suffix (docs/protocol.md §6.2), so `"ab"`,
/// `W/"ab"` and `"ab-gzip"` are all `ab`.
pub fn etag_core(tag: &str) -> &str {
    let t = tag.trim();
    let t = t.strip_prefix("W/").unwrap_or(t);
    let t = t.trim_matches('"');
    t.strip_suffix("-gzip").unwrap_or(t)
}

/// The raw bytes of each element of a compact JSON array, exactly as they
/// appear in `body` (which must be `[` elements separated by `,` `]`, with
/// no whitespace between them, as the master serialises a listing:
/// docs/protocol.md §1.2). `None` when `body` is not such an array.
/// [`join_listing`] is its inverse.
pub fn split_listing(body: &[u8]) -> Option<Vec<&[u8]>> {
    let inner = body.strip_prefix(b"[")?.strip_suffix(b"]")?;
    let mut out = Vec::new();
    if inner.is_empty() {
        return Some(out);
    }
    let (mut depth, mut in_string, mut escaped, mut start) = (0usize, false, false, 0usize);
    for (i, &b) in inner.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b',' if depth == 0 => {
                if i == start {
                    return None;
                }
                out.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if in_string || depth != 0 || start == inner.len() {
        return None;
    }
    out.push(&inner[start..]);
    Some(out)
}

/// A listing body from its entries' raw bytes: `[` + entries joined by
/// `,` + `]`, the master's serialisation (the inverse of [`split_listing`]).
pub fn join_listing<'a>(entries: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, e) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.push(b']');
    out
}

/// One instruction of a delta: the new listing is made of these, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaOp<'a> {
    /// Entries `start .. start + count` of the base listing (0 is `"."`).
    Copy {
        /// The first base entry copied.
        start: usize,
        /// How many consecutive base entries.
        count: usize,
    },
    /// One entry, its raw JSON (never holding a newline: compact JSON
    /// escapes control characters inside strings).
    Add(&'a [u8]),
}

/// A delta listing (docs/protocol.md §7.5.2): how to make the listing
/// tagged `etag` from the one tagged `base`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta<'a> {
    /// The `ETag` of the listing the delta applies to, quoted (`"<40 hex>"`).
    pub base: &'a str,
    /// The `ETag` of the listing it makes, quoted.
    pub etag: &'a str,
    /// The number of entries of the listing it makes.
    pub entries: usize,
    /// The instructions, in order.
    pub ops: Vec<DeltaOp<'a>>,
}

/// A body that is not a delta listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaFormatError {
    /// The first line is not [`DELTA_MAGIC`] (another version or not a
    /// delta).
    #[error("not a version 1 delta listing")]
    Magic,
    /// A line that is not what its place requires.
    #[error("bad delta line {line}: {text:?}")]
    BadLine {
        /// Its number, from 1.
        line: usize,
        /// Its first 80 bytes.
        text: String,
    },
    /// The body does not end with the `end` line.
    #[error("the delta listing is truncated")]
    Truncated,
}

impl Delta<'_> {
    /// The body of this delta (docs/protocol.md §7.5.2).
    pub fn encode(&self) -> Vec<u8> {
        let added: usize = self
            .ops
            .iter()
            .map(|op| match op {
                DeltaOp::Add(raw) => raw.len() + 3,
                DeltaOp::Copy { .. } => 24,
            })
            .sum();
        let mut out = Vec::with_capacity(added + 160);
        out.extend_from_slice(
            format!(
                "{DELTA_MAGIC}\nbase {}\netag {}\nentries {}\n",
                self.base, self.etag, self.entries
            )
            .as_bytes(),
        );
        for op in &self.ops {
            match op {
                DeltaOp::Copy { start, count } => {
                    out.extend_from_slice(format!("c {start} {count}\n").as_bytes())
                }
                DeltaOp::Add(raw) => {
                    out.extend_from_slice(b"a ");
                    out.extend_from_slice(raw);
                    out.push(b'\n');
                }
            }
        }
        out.extend_from_slice(b"end\n");
        out
    }
}

/// `"<40 lowercase hex>"`, the form of a listing's `ETag`.
fn quoted_tag(v: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(v).ok()?;
    let hex = s.strip_prefix('"')?.strip_suffix('"')?;
    (hex.len() == 40 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(s)
}

/// A decimal count of at most 12 ASCII digits.
fn count(v: &[u8]) -> Option<usize> {
    if v.is_empty() || v.len() > 12 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Parses a delta body (docs/protocol.md §7.5.2). Only the syntax is
/// checked here; whether it applies to a base, and whether the result is
/// the listing it names, is for the applier to check.
pub fn parse_delta(body: &[u8]) -> Result<Delta<'_>, DeltaFormatError> {
    let mut lines = body.split(|&b| b == b'\n').enumerate();
    let bad = |line: usize, text: &[u8]| DeltaFormatError::BadLine {
        line: line + 1,
        text: String::from_utf8_lossy(&text[..text.len().min(80)]).into_owned(),
    };
    match lines.next() {
        Some((_, l)) if l == DELTA_MAGIC.as_bytes() => {}
        _ => return Err(DeltaFormatError::Magic),
    }
    let mut field = |name: &str| -> Result<&[u8], DeltaFormatError> {
        let (n, l) = lines.next().ok_or(DeltaFormatError::Truncated)?;
        l.strip_prefix(name.as_bytes())
            .and_then(|v| v.strip_prefix(b" "))
            .ok_or_else(|| bad(n, l))
    };
    let base_line = field("base")?;
    let base = quoted_tag(base_line).ok_or_else(|| bad(1, base_line))?;
    let etag_line = field("etag")?;
    let etag = quoted_tag(etag_line).ok_or_else(|| bad(2, etag_line))?;
    let entries_line = field("entries")?;
    let entries = count(entries_line).ok_or_else(|| bad(3, entries_line))?;
    let mut ops = Vec::new();
    for (n, l) in lines.by_ref() {
        if l == b"end" {
            // Nothing may follow but the final newline.
            return match (lines.next(), lines.next()) {
                (Some((_, [])), None) => Ok(Delta {
                    base,
                    etag,
                    entries,
                    ops,
                }),
                (None, _) => Err(DeltaFormatError::Truncated),
                _ => Err(bad(n + 1, b"(data after end)")),
            };
        }
        if l.is_empty() {
            // Only the end of a body cut at a line boundary is empty.
            return Err(DeltaFormatError::Truncated);
        }
        if let Some(raw) = l.strip_prefix(b"a ") {
            if raw.is_empty() {
                return Err(bad(n, l));
            }
            ops.push(DeltaOp::Add(raw));
        } else if let Some(args) = l.strip_prefix(b"c ") {
            let mut it = args.splitn(2, |&b| b == b' ');
            let (Some(start), Some(count)) = (it.next().and_then(count), it.next().and_then(count))
            else {
                return Err(bad(n, l));
            };
            ops.push(DeltaOp::Copy { start, count });
        } else {
            return Err(bad(n, l));
        }
    }
    Err(DeltaFormatError::Truncated)
}

/// A delta's instructions that do not fit its base or its limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaApplyError {
    /// A copy past the base's last entry.
    #[error("copy of base entries {start}..{end} but the base has {len}")]
    OutOfRange {
        /// First entry asked.
        start: usize,
        /// One past the last.
        end: usize,
        /// Entries in the base.
        len: usize,
    },
    /// More entries than the delta announced (or than the caller allows).
    #[error("the delta makes more than {0} entries")]
    TooMany(usize),
}

/// The entries of the listing a delta makes, in order: its `ops` applied to
/// `base` (the raw entries of the base listing, [`split_listing`]). At
/// most `max` entries (the delta's own count is checked by the caller).
pub fn apply_ops<'a>(
    base: &[&'a [u8]],
    ops: &[DeltaOp<'a>],
    max: usize,
) -> Result<Vec<&'a [u8]>, DeltaApplyError> {
    let mut out: Vec<&[u8]> = Vec::new();
    for op in ops {
        match *op {
            DeltaOp::Copy { start, count } => {
                let end = start.saturating_add(count);
                let slice = base.get(start..end).ok_or(DeltaApplyError::OutOfRange {
                    start,
                    end,
                    len: base.len(),
                })?;
                if out.len() + slice.len() > max {
                    return Err(DeltaApplyError::TooMany(max));
                }
                out.extend_from_slice(slice);
            }
            DeltaOp::Add(raw) => {
                if out.len() >= max {
                    return Err(DeltaApplyError::TooMany(max));
                }
                out.push(raw);
            }
        }
    }
    Ok(out)
}

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

    #[test]
    fn a_listing_splits_into_its_raw_entries_and_joins_back() {
        let body = br#"[{"a":"x,y]}","b":[1,{"c":"\"}"}]},{"d":null},{"e":"\\"}]"#;
        let parts = split_listing(body).unwrap();
        assert_eq!(
            parts,
            vec![
                &br#"{"a":"x,y]}","b":[1,{"c":"\"}"}]}"#[..],
                br#"{"d":null}"#,
                br#"{"e":"\\"}"#
            ]
        );
        assert_eq!(join_listing(parts), body);
        assert_eq!(split_listing(b"[]"), Some(vec![]));
        for bad in [
            &b""[..],
            b"[",
            b"{}",
            b"[{},]",
            b"[,{}]",
            b"[{}},{}]",
            b"[{\"a\":\"}]",
            b"[{\"a\":1}",
        ] {
            assert_eq!(split_listing(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn listing_etags_and_their_cores() {
        let tag = listing_etag(b"[]");
        assert_eq!(tag.len(), 42);
        assert!(tag.starts_with('"') && tag.ends_with('"'));
        let core = &tag[1..41];
        for form in [
            tag.clone(),
            format!("W/{tag}"),
            format!("\"{core}-gzip\""),
            format!(" {tag} "),
        ] {
            assert_eq!(etag_core(&form), core, "{form}");
        }
    }

    fn sample_delta() -> (String, String, Vec<u8>) {
        (
            listing_etag(b"[1]"),
            listing_etag(b"[2]"),
            br#"{"relative_path":"a b,c"}"#.to_vec(),
        )
    }

    #[test]
    fn a_delta_encodes_and_parses_back() {
        let (base, etag, raw) = sample_delta();
        let d = Delta {
            base: &base,
            etag: &etag,
            entries: 4,
            ops: vec![
                DeltaOp::Copy { start: 0, count: 2 },
                DeltaOp::Add(&raw),
                DeltaOp::Copy { start: 3, count: 1 },
            ],
        };
        let body = d.encode();
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            format!(
                "pluginsync-listing-delta 1\nbase {base}\netag {etag}\nentries 4\nc 0 2\na {}\nc 3 1\nend\n",
                String::from_utf8_lossy(&raw)
            )
        );
        assert_eq!(parse_delta(&body), Ok(d));
    }

    #[test]
    fn a_malformed_delta_is_refused_with_its_line() {
        let (base, etag, _) = sample_delta();
        let head = format!("pluginsync-listing-delta 1\nbase {base}\netag {etag}\nentries 1\n");
        let parse = |tail: &str| parse_delta(format!("{head}{tail}").as_bytes()).map(|_| ());
        assert_eq!(parse("c 0 1\nend\n"), Ok(()));
        assert_eq!(parse("c 0 1\n"), Err(DeltaFormatError::Truncated));
        assert_eq!(parse("c 0 1\nend"), Err(DeltaFormatError::Truncated));
        assert!(matches!(
            parse("c 0 1\nend\nx"),
            Err(DeltaFormatError::BadLine { .. })
        ));
        assert!(matches!(
            parse("c 0\nend\n"),
            Err(DeltaFormatError::BadLine { line: 5, .. })
        ));
        assert!(matches!(
            parse("c -1 2\nend\n"),
            Err(DeltaFormatError::BadLine { .. })
        ));
        assert!(matches!(
            parse("a \nend\n"),
            Err(DeltaFormatError::BadLine { .. })
        ));
        assert!(matches!(
            parse("x\nend\n"),
            Err(DeltaFormatError::BadLine { .. })
        ));
        assert_eq!(
            parse_delta(b"pluginsync-listing-delta 2\n"),
            Err(DeltaFormatError::Magic)
        );
        assert_eq!(parse_delta(b"[]"), Err(DeltaFormatError::Magic));
        let bad_tag =
            format!("pluginsync-listing-delta 1\nbase \"xyz\"\netag {etag}\nentries 1\nend\n");
        assert!(matches!(
            parse_delta(bad_tag.as_bytes()),
            Err(DeltaFormatError::BadLine { line: 2, .. })
        ));
    }

    #[test]
    fn ops_apply_within_the_base_and_the_limit() {
        let base: Vec<&[u8]> = vec![b"0", b"1", b"2"];
        let ops = [
            DeltaOp::Copy { start: 1, count: 2 },
            DeltaOp::Add(b"x"),
            DeltaOp::Copy { start: 0, count: 1 },
        ];
        assert_eq!(
            apply_ops(&base, &ops, 10).unwrap(),
            vec![&b"1"[..], b"2", b"x", b"0"]
        );
        assert_eq!(apply_ops(&base, &ops, 3), Err(DeltaApplyError::TooMany(3)));
        assert_eq!(
            apply_ops(
                &base,
                &[DeltaOp::Copy {
                    start: 2,
                    count: usize::MAX
                }],
                10
            ),
            Err(DeltaApplyError::OutOfRange {
                start: 2,
                end: usize::MAX,
                len: 3
            })
        );
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn split_inverts_join(entries in proptest::collection::vec(
                proptest::collection::btree_map("[a-z\\\\\",\\[\\]{} ]{0,8}", "[a-z\\\\\",\\[\\]{}: ]{0,8}", 0..4),
                0..6,
            )) {
                let raw: Vec<Vec<u8>> = entries.iter().map(|m| serde_json::to_vec(m).unwrap()).collect();
                let body = join_listing(raw.iter().map(Vec::as_slice));
                let split = split_listing(&body).unwrap();
                prop_assert_eq!(split, raw.iter().map(Vec::as_slice).collect::<Vec<_>>());
            }
        }
    }
}
