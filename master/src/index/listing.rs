//! How a listing is serialised and cached.
//!
//! A `file_metadatas` answer is serialised once per (mount, parameters):
//! entries are written one at a time ([`Serialiser`]) into a
//! [`ListingWriter`], which feeds the ETag hasher, the gzip encoder and,
//! while the body stays small, a plain copy, so the whole JSON document and
//! the entry vector never exist at once (docs/internals.md#index). The
//! result, a [`CachedListing`], is kept in a [`ListingCache`]: the
//! standard listings pinned for the index's lifetime, every other parameter
//! set in a least-recently-used tier bounded by count and by bytes.
//!
//! The ETag is derived from the uncompressed body alone, so two masters
//! serving the same tree send the same ETag and revalidate each other's.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use pluginsync_common::etag::ETag;
use pluginsync_common::metadata::FileMetadata;
use pluginsync_common::protocol::Mount;

use super::entry::{ListingError, SearchParams};

/// A serialised listing, ready to send.
///
/// Built by streaming the entries through a hasher (the ETag) and a gzip
/// encoder. Listings of 64 KiB or more are kept only gzipped (a 3,000-file
/// listing is 1.1 MB of JSON and 160 KB gzipped, times two `source_permissions`
/// and a hundred environments; both
/// pluginsync's and Puppet's agents ask for gzip), and inflated as they are
/// sent for the rare client that does not take it ([`Inflating`]). Small
/// ones are kept both ways.
#[derive(Debug)]
pub struct CachedListing {
    plain: Option<Bytes>,
    gzip: OnceLock<Bytes>,
    /// Strong ETag derived from the uncompressed body alone.
    pub etag: ETag,
    /// Number of entries.
    pub count: usize,
    /// Length of the uncompressed body.
    pub len: usize,
}

/// Listings at least this large are kept only gzipped (inflating one per
/// identity request is then cheaper than holding it twice).
const KEEP_GZIPPED: usize = 64 << 10;

impl CachedListing {
    /// Wraps a body, deriving its ETag ([`ETag::of_listing`], the one
    /// agents check a rebuilt delta listing with: docs/protocol.md §7.5).
    pub fn new(body: Vec<u8>, count: usize) -> Self {
        let etag = ETag::of_listing(&body);
        let len = body.len();
        if len >= KEEP_GZIPPED {
            let gz = OnceLock::new();
            let _ = gz.set(gzip(&body));
            CachedListing {
                plain: None,
                gzip: gz,
                etag,
                count,
                len,
            }
        } else {
            CachedListing {
                plain: Some(Bytes::from(body)),
                gzip: OnceLock::new(),
                etag,
                count,
                len,
            }
        }
    }

    /// The uncompressed body (inflated if only the gzip is kept).
    pub fn plain(&self) -> Bytes {
        match &self.plain {
            Some(b) => b.clone(),
            None => {
                use std::io::Read;
                let mut out = Vec::with_capacity(self.len);
                let gz = self.gzip.get().cloned().unwrap_or_default();
                let _ = flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut out);
                Bytes::from(out)
            }
        }
    }

    /// The uncompressed body if it is held as such (listings under
    /// 64 KiB), without blocking.
    pub fn plain_ready(&self) -> Option<Bytes> {
        self.plain.clone()
    }

    /// The uncompressed body of a listing kept gzipped only, inflated as
    /// it is sent ([`Inflating`]); `None` when the plain body is held.
    pub fn inflating(&self) -> Option<Inflating> {
        if self.plain.is_some() {
            return None;
        }
        let gz = self.gzip.get().cloned().unwrap_or_default();
        Some(Inflating {
            decoder: flate2::read::GzDecoder::new(bytes::Buf::reader(gz)),
            left: self.len,
        })
    }

    /// The gzipped body if it is compressed already (every standard
    /// listing is: [`super::EnvIndex::warm`]), without blocking.
    pub fn gzip_ready(&self) -> Option<Bytes> {
        self.gzip.get().cloned()
    }

    /// The gzipped body, compressed on first use.
    pub fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| gzip(self.plain.as_deref().unwrap_or_default()))
            .clone()
    }

    /// Bytes held now or once gzipped (for the cache budget).
    pub fn cost(&self) -> usize {
        match &self.plain {
            Some(b) => b.len() * 2,
            None => self.gzip.get().map_or(0, |g| g.len()),
        }
    }
}

/// What [`Inflating`] inflates per frame.
const INFLATE_CHUNK: usize = 64 << 10;

/// The uncompressed body of a listing kept gzipped only, as a response
/// body: inflated [`INFLATE_CHUNK`] at a time when the connection asks
/// for the next frame, from the shared gzipped copy. A stream whose client
/// does not take gzip, and does not read, then holds the inflater's state
/// and one chunk, not a whole inflated copy
/// (docs/master.md#what-it-does-differently-from-puppet-server).
/// Its exact length is known, so the answer keeps its `Content-Length`.
pub struct Inflating {
    decoder: flate2::read::GzDecoder<bytes::buf::Reader<Bytes>>,
    /// Uncompressed bytes not sent yet.
    left: usize,
}

impl std::fmt::Debug for Inflating {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflating")
            .field("left", &self.left)
            .finish()
    }
}

impl http_body::Body for Inflating {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::io::Read;
        let this = &mut *self;
        if this.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let mut chunk = vec![0u8; this.left.min(INFLATE_CHUNK)];
        let mut filled = 0;
        while filled < chunk.len() {
            match this.decoder.read(&mut chunk[filled..]) {
                Ok(0) => {
                    return std::task::Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "listing shorter than its length",
                    ))));
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return std::task::Poll::Ready(Some(Err(e))),
            }
        }
        this.left -= filled;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(chunk)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left as u64)
    }
}

/// Writes the entries of one listing as a JSON array, one at a time, into a
/// [`ListingWriter`] behind a 64 KiB buffer.
pub(super) struct Serialiser {
    out: std::io::BufWriter<ListingWriter>,
    count: usize,
}

impl Serialiser {
    /// Opens the array.
    pub(super) fn new() -> Result<Self, ListingError> {
        let mut out = std::io::BufWriter::with_capacity(64 << 10, ListingWriter::new());
        out.write_all(b"[").map_err(internal)?;
        Ok(Serialiser { out, count: 0 })
    }

    /// Appends one entry.
    pub(super) fn push(&mut self, entry: &FileMetadata) -> Result<(), ListingError> {
        if self.count > 0 {
            self.out.write_all(b",").map_err(internal)?;
        }
        serde_json::to_writer(&mut self.out, entry)
            .map_err(|e| ListingError::Internal(e.to_string()))?;
        self.count += 1;
        Ok(())
    }

    /// Closes the array: the body, its ETag and its gzip.
    pub(super) fn finish(mut self) -> Result<CachedListing, ListingError> {
        self.out.write_all(b"]").map_err(internal)?;
        let sink = self
            .out
            .into_inner()
            .map_err(|e| internal(e.into_error()))?;
        Ok(sink.finish(self.count))
    }
}

fn internal(e: std::io::Error) -> ListingError {
    ListingError::Internal(e.to_string())
}

/// Where a listing is serialised: hashes it for the ETag, gzips it, and
/// keeps a plain copy only while it stays under [`KEEP_GZIPPED`].
struct ListingWriter {
    hasher: sha2::Sha256,
    plain: Option<Vec<u8>>,
    gz: flate2::write::GzEncoder<Vec<u8>>,
    len: usize,
}

impl ListingWriter {
    fn new() -> Self {
        ListingWriter {
            hasher: sha2::Sha256::default(),
            plain: Some(Vec::new()),
            gz: flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6)),
            len: 0,
        }
    }

    fn finish(self, count: usize) -> CachedListing {
        use sha2::Digest;
        let digest = self.hasher.finalize();
        let gz = OnceLock::new();
        // Writing to a Vec cannot fail.
        let _ = gz.set(Bytes::from(self.gz.finish().unwrap_or_default()));
        CachedListing {
            plain: self.plain.map(Bytes::from),
            gzip: gz,
            etag: ETag::of_digest(&digest[..20]),
            count,
            len: self.len,
        }
    }
}

impl std::io::Write for ListingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        self.hasher.update(buf);
        self.len += buf.len();
        if let Some(plain) = &mut self.plain {
            if plain.len() + buf.len() >= KEEP_GZIPPED {
                self.plain = None;
            } else {
                plain.extend_from_slice(buf);
            }
        }
        self.gz.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Gzips a buffer.
pub fn gzip(data: &[u8]) -> Bytes {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 3),
        flate2::Compression::new(6),
    );
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(data);
    Bytes::from(enc.finish().unwrap_or_default())
}

/// What a listing is cached under: the mount and the normalised search.
type CacheKey = (Mount, SearchParams);

/// The serialised listings of one environment index, shared by every
/// request, in two tiers:
///
/// - **pinned**: the standard listings [`super::EnvIndex::warm`]
///   pre-serialises (what every pluginsync and stock Puppet agent asks
///   for). Filled before the index is published, never evicted, outside the
///   `[index]` budget: however many odd parameter sets arrive, the listing
///   the fleet asks for is never serialised again on the request path.
/// - **recent**: every other parameter set, least recently used evicted
///   first, within the `[index]` budget of the config (`cached_responses`
///   entries, `cache_mib` bytes).
#[derive(Debug)]
pub(super) struct ListingCache {
    /// At most this many listings in `recent`.
    max_entries: usize,
    /// At most this many bytes ([`CachedListing::cost`]) in `recent`.
    max_bytes: usize,
    pinned: std::sync::RwLock<HashMap<CacheKey, Arc<CachedListing>>>,
    recent: Mutex<Lru>,
}

impl ListingCache {
    /// An empty cache with these bounds for non-standard listings.
    pub(super) fn new(max_entries: usize, max_bytes: usize) -> Self {
        ListingCache {
            max_entries,
            max_bytes,
            pinned: std::sync::RwLock::new(HashMap::new()),
            recent: Mutex::new(Lru::default()),
        }
    }

    /// The listing cached under `key`; a hit in `recent` makes it the most
    /// recently used.
    pub(super) fn get(&self, key: &CacheKey) -> Option<Arc<CachedListing>> {
        if let Some(hit) = self
            .pinned
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
        {
            return Some(hit.clone());
        }
        self.lock().get(key)
    }

    /// Keeps `listing` under `key` in `recent`, evicting the least recently
    /// used to stay in budget; returns how many were evicted.
    pub(super) fn insert(&self, key: CacheKey, listing: Arc<CachedListing>) -> u64 {
        self.lock()
            .insert(key, listing, self.max_entries, self.max_bytes)
    }

    /// Keeps a standard listing for the index's lifetime.
    pub(super) fn pin(&self, key: CacheKey, listing: Arc<CachedListing>) {
        self.lock().remove(&key);
        self.pinned
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, listing);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bounded map of serialised listings, least recently used evicted first,
/// by count and by bytes (a body counts twice: it may be gzipped too).
#[derive(Debug, Default)]
struct Lru {
    /// Listing and the tick of its last use.
    map: HashMap<CacheKey, (Arc<CachedListing>, u64)>,
    /// Tick of last use → key: the first is the least recently used.
    order: BTreeMap<u64, CacheKey>,
    tick: u64,
    bytes: usize,
}

impl Lru {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn get(&mut self, key: &CacheKey) -> Option<Arc<CachedListing>> {
        let now = self.next_tick();
        let (listing, used) = self.map.get_mut(key)?;
        let old = std::mem::replace(used, now);
        let listing = listing.clone();
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(now, k);
        }
        Some(listing)
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some((gone, used)) = self.map.remove(key) {
            self.order.remove(&used);
            self.bytes -= gone.cost();
        }
    }

    fn insert(
        &mut self,
        key: CacheKey,
        listing: Arc<CachedListing>,
        max_entries: usize,
        max_bytes: usize,
    ) -> u64 {
        if self.map.contains_key(&key) {
            return 0;
        }
        let cost = listing.cost();
        // A single listing larger than the whole budget is served, not kept
        // (and does not flush what is cached).
        if cost > max_bytes {
            return 0;
        }
        let mut evicted = 0;
        while !self.map.is_empty()
            && (self.map.len() >= max_entries || self.bytes + cost > max_bytes)
        {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = self.map.remove(&old) {
                self.bytes -= gone.cost();
                evicted += 1;
            }
        }
        let now = self.next_tick();
        self.bytes += cost;
        self.order.insert(now, key.clone());
        self.map.insert(key, (listing, now));
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::checksum::ChecksumType;
    use pluginsync_common::metadata::Links;

    fn key(n: u32) -> (Mount, SearchParams) {
        let p = SearchParams {
            recurse: true,
            recurselimit: Some(n),
            links: Links::Follow,
            ignore: Vec::new(),
            checksum_type: ChecksumType::Sha256,
            use_permissions: false,
        };
        (Mount::Plugins, p)
    }

    #[test]
    fn streamed_listing_matches_the_whole_body() {
        for size in [10usize, 3 << 20, 6 << 20] {
            let body: Vec<u8> = (0..size).map(|i| b"[{\"a\":1},]"[i % 10]).collect();
            let whole = CachedListing::new(body.clone(), 7);
            let mut sink = ListingWriter::new();
            for chunk in body.chunks(4093) {
                sink.write_all(chunk).unwrap();
            }
            let streamed = sink.finish(7);
            assert_eq!(streamed.etag, whole.etag, "same ETag, size {size}");
            assert_eq!(
                streamed.etag,
                ETag::of_listing(&body),
                "the ETag agents verify deltas with (docs/protocol.md §7.5.4)"
            );
            assert_eq!((streamed.len, streamed.count), (size, 7));
            assert_eq!(streamed.plain(), Bytes::from(body.clone()));
            assert_eq!(streamed.plain.is_some(), size < KEEP_GZIPPED);
            let mut inflated = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::GzDecoder::new(&streamed.gzip()[..]),
                &mut inflated,
            )
            .unwrap();
            assert_eq!(inflated, body);
        }
    }

    #[test]
    fn response_cache_is_bounded_by_count_and_bytes() {
        let mut c = Lru::default();
        let body = |n: usize| Arc::new(CachedListing::new(vec![b'x'; n], 1));
        let big = CachedListing::new(vec![b'y'; 5 << 20], 1);
        assert_eq!(big.plain().len(), 5 << 20, "inflated on demand");
        let mut streamed = Vec::new();
        let mut inflating = big.inflating().expect("kept gzipped only");
        assert_eq!(
            http_body::Body::size_hint(&inflating).exact(),
            Some(5 << 20)
        );
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        while let std::task::Poll::Ready(Some(frame)) =
            http_body::Body::poll_frame(std::pin::Pin::new(&mut inflating), &mut cx)
        {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= INFLATE_CHUNK);
            streamed.extend_from_slice(&data);
        }
        assert_eq!(Bytes::from(streamed), big.plain(), "inflated as it is sent");
        assert!(big.cost() < 10_000, "kept gzipped only");
        for i in 0..10 {
            c.insert(key(i), body(100), 4, 10_000);
        }
        assert_eq!(c.map.len(), 4);
        assert!(c.map.contains_key(&key(9)) && !c.map.contains_key(&key(5)));
        c.insert(key(20), body(4_000), 4, 10_000);
        assert_eq!(
            c.bytes,
            c.map.values().map(|(l, _)| l.cost()).sum::<usize>()
        );
        assert!(c.bytes <= 10_000);
        c.insert(key(21), body(6_000), 4, 10_000);
        assert!(
            !c.map.contains_key(&key(21)),
            "larger than the budget: served, not kept"
        );
        assert!(c.bytes <= 10_000);
    }

    #[test]
    fn least_recently_used_goes_first_and_pinned_never() {
        let body = || Arc::new(CachedListing::new(vec![b'x'; 100], 1));
        let cache = ListingCache::new(3, 1 << 20);
        cache.pin(key(0), body());
        for i in 1..=3 {
            cache.insert(key(i), body());
        }
        // key(1) used again: key(2) is now the least recently used.
        assert!(cache.get(&key(1)).is_some());
        cache.insert(key(4), body());
        assert!(cache.get(&key(2)).is_none(), "least recently used evicted");
        assert!(cache.get(&key(1)).is_some() && cache.get(&key(3)).is_some());
        for i in 100..200 {
            cache.insert(key(i), body());
        }
        assert!(cache.get(&key(0)).is_some(), "pinned survives any churn");
        let lru = cache.lock();
        assert_eq!(lru.map.len(), 3);
        assert_eq!(lru.order.len(), 3);
        assert_eq!(lru.bytes, 3 * body().cost());
    }
}
