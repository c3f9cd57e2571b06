//! Delta listings, the master's side (docs/protocol.md §7.5): the last few
//! standard listings of an environment, remembered by `ETag` across index
//! rebuilds, and the deltas from them to the listing served now.
//!
//! A [`History`] belongs to an environment's chain of indexes: each new
//! [`super::EnvIndex`] takes its predecessor's (`EnvIndex::build`), and
//! [`super::EnvIndex::warm`] records the standard listings it publishes.
//! What is kept is compact: the listing served now is the pinned
//! [`CachedListing`] itself (shared, no copy); when a newer one replaces
//! it, only its `ETag` and one 64-bit hash per entry stay
//! ([`MAX_BASES`] of them, at most [`MAX_HASHES`] hashes per listing key).
//! A delta is computed on the first request for its (base, target) pair
//! and kept until the target is replaced, so a fleet asking for the same
//! change costs one diff.
//!
//! The diff ([`diff`]) is a copy/add script: each entry of the new listing
//! is either a run of consecutive base entries with the same bytes or its
//! own raw JSON. Entries are compared by a keyed hash of their raw bytes; a
//! collision could only make a delta that fails the agent's check against
//! the new `ETag`, and the agent then takes the full listing.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use pluginsync_common::delta::{Delta, DeltaOp, split_listing};
use pluginsync_common::etag::ETag;
use pluginsync_common::protocol::Mount;

use super::entry::SearchParams;
use super::listing::{CachedListing, gzip};

/// Older listings remembered per listing key (mount and parameters).
pub const MAX_BASES: usize = 6;
/// Entry hashes kept per listing key at most (2 MiB): older listings are
/// forgotten first, so a huge environment remembers fewer of them.
pub const MAX_HASHES: usize = 1 << 18;

/// What a listing is remembered under.
type Key = (Mount, SearchParams);

/// The remembered listings of one environment, shared by its successive
/// indexes.
#[derive(Debug, Default)]
pub struct History {
    /// Keys the entry hashes; one per history, so hashes compare within it.
    hasher: RandomState,
    tracks: Mutex<HashMap<Key, Track>>,
}

/// One listing key's history.
#[derive(Debug, Default)]
struct Track {
    /// The listing published last, whole.
    current: Option<Arc<CachedListing>>,
    /// Older listings, newest first.
    bases: VecDeque<Base>,
    /// Deltas computed to the current listing: base core → the delta, or
    /// `None` when it was not smaller than the listing.
    deltas: HashMap<String, Option<Arc<DeltaListing>>>,
}

/// An older listing: its `ETag` core and a hash of each entry, in order.
#[derive(Debug)]
struct Base {
    core: String,
    hashes: Arc<[u64]>,
}

/// A serialised delta, ready to send (docs/protocol.md §7.5.2).
#[derive(Debug)]
pub struct DeltaListing {
    plain: Bytes,
    gzip: OnceLock<Bytes>,
}

impl DeltaListing {
    /// The uncompressed body.
    pub fn plain(&self) -> Bytes {
        self.plain.clone()
    }

    /// The gzipped body, compressed on first use.
    pub fn gzip(&self) -> Bytes {
        self.gzip.get_or_init(|| gzip(&self.plain)).clone()
    }

    /// Length of the uncompressed body.
    pub fn len(&self) -> usize {
        self.plain.len()
    }

    /// Whether the body is empty (never, for a parsed delta).
    pub fn is_empty(&self) -> bool {
        self.plain.is_empty()
    }
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Track>> {
        self.tracks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hash(&self, raw: &[u8]) -> u64 {
        self.hasher.hash_one(raw)
    }

    /// Records `listing` as the one published now under `key`; the one it
    /// replaces becomes a base (unless it is the same listing).
    pub fn record(&self, key: Key, listing: Arc<CachedListing>) {
        let core = listing.etag.core().to_owned();
        let previous = {
            let mut tracks = self.lock();
            let track = tracks.entry(key.clone()).or_default();
            if track
                .current
                .as_ref()
                .is_some_and(|c| c.etag.core() == core)
            {
                track.current = Some(listing);
                return;
            }
            // A listing served again (a revert) is current, not a base.
            track.bases.retain(|b| b.core != core);
            track.deltas.clear();
            track.current.replace(listing)
        };
        let Some(previous) = previous else {
            return;
        };
        // Hashed outside the lock: requests for deltas go on meanwhile.
        let plain = previous.plain();
        let Some(entries) = split_listing(&plain) else {
            return;
        };
        let hashes: Arc<[u64]> = entries.iter().map(|e| self.hash(e)).collect();
        let base = Base {
            core: previous.etag.core().to_owned(),
            hashes,
        };
        let mut tracks = self.lock();
        let track = tracks.entry(key).or_default();
        if track
            .current
            .as_ref()
            .is_some_and(|c| c.etag.core() == base.core)
        {
            return;
        }
        track.bases.retain(|b| b.core != base.core);
        track.bases.push_front(base);
        let mut kept = 0;
        let mut total = 0;
        for b in &track.bases {
            if kept == MAX_BASES || total + b.hashes.len() > MAX_HASHES {
                break;
            }
            kept += 1;
            total += b.hashes.len();
        }
        track.bases.truncate(kept);
    }

    /// The delta under `key` from the first of `bases` (`ETag` cores, in
    /// the request's order) that is remembered, to `listing` (the listing
    /// the answering index serves); `None` when no base is remembered or
    /// the delta would not be smaller than the listing. Blocking: the first
    /// request for a pair diffs the listing.
    pub fn delta(
        &self,
        key: &Key,
        listing: &CachedListing,
        bases: &[&str],
    ) -> Option<Arc<DeltaListing>> {
        let target = listing.etag.core();
        for &base in bases {
            if base == target {
                continue;
            }
            let (hashes, is_current) = {
                let tracks = self.lock();
                let track = tracks.get(key)?;
                let is_current = track
                    .current
                    .as_ref()
                    .is_some_and(|c| c.etag.core() == target);
                if is_current && let Some(known) = track.deltas.get(base) {
                    return known.clone();
                }
                let Some(b) = track.bases.iter().find(|b| b.core == base) else {
                    continue;
                };
                (b.hashes.clone(), is_current)
            };
            let plain = listing.plain();
            let made = split_listing(&plain).and_then(|entries| {
                let body = Delta {
                    base: ETag::from_core(base),
                    etag: ETag::from_core(target),
                    entries: entries.len(),
                    ops: diff(&hashes, &entries, |e| self.hash(e)),
                }
                .encode();
                (body.len() < plain.len()).then(|| {
                    Arc::new(DeltaListing {
                        plain: Bytes::from(body),
                        gzip: OnceLock::new(),
                    })
                })
            });
            if is_current {
                let mut tracks = self.lock();
                if let Some(track) = tracks.get_mut(key)
                    && track
                        .current
                        .as_ref()
                        .is_some_and(|c| c.etag.core() == target)
                {
                    track.deltas.insert(base.to_owned(), made.clone());
                }
            }
            return made;
        }
        None
    }

    /// How many older listings are remembered under `key` (for tests).
    pub fn bases(&self, key: &Key) -> usize {
        self.lock().get(key).map_or(0, |t| t.bases.len())
    }
}

/// The copy/add script that makes `entries` from a base whose entries hash
/// to `base` (docs/protocol.md §7.5.2): each entry found in the base is
/// copied (consecutive ones in one run), any other is added as it is.
pub fn diff<'a>(
    base: &[u64],
    entries: &[&'a [u8]],
    hash: impl Fn(&[u8]) -> u64,
) -> Vec<DeltaOp<'a>> {
    let at: HashMap<u64, usize> = base.iter().enumerate().map(|(i, &h)| (h, i)).collect();
    let mut ops: Vec<DeltaOp<'a>> = Vec::new();
    for &entry in entries {
        match at.get(&hash(entry)) {
            Some(&i) => match ops.last_mut() {
                Some(DeltaOp::Copy { start, count }) if *start + *count == i => *count += 1,
                _ => ops.push(DeltaOp::Copy { start: i, count: 1 }),
            },
            None => ops.push(DeltaOp::Add(entry)),
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::checksum::ChecksumType;
    use pluginsync_common::delta::{apply_ops, join_listing, parse_delta};
    use pluginsync_common::metadata::Links;

    fn key() -> Key {
        (
            Mount::Plugins,
            SearchParams {
                recurse: true,
                recurselimit: None,
                links: Links::Follow,
                ignore: Vec::new(),
                checksum_type: ChecksumType::Sha256,
                use_permissions: true,
            },
        )
    }

    fn entry(path: &str, sum: u64) -> Vec<u8> {
        format!(r#"{{"relative_path":"{path}","checksum":"{sum:016x}"}}"#).into_bytes()
    }

    fn listing(entries: &[Vec<u8>]) -> Arc<CachedListing> {
        Arc::new(CachedListing::new(
            join_listing(entries.iter().map(Vec::as_slice)),
            entries.len(),
        ))
    }

    /// What an agent does with a delta body: the listing it makes.
    fn apply(base: &[u8], delta: &[u8]) -> Vec<u8> {
        let d = parse_delta(delta, usize::MAX).unwrap();
        assert_eq!(d.base, ETag::of_listing(base));
        let base = split_listing(base).unwrap();
        let out = apply_ops(&base, &d.ops, usize::MAX).unwrap();
        assert_eq!(out.len(), d.entries);
        let body = join_listing(out);
        assert_eq!(d.etag, ETag::of_listing(&body));
        body
    }

    /// A small deterministic generator (no proptest in this crate).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    #[test]
    fn random_edits_round_trip_through_diff_and_apply() {
        let mut rng = Lcg(7);
        let h = RandomState::new();
        for case in 0..300 {
            let n = (rng.next() % 60) as usize;
            let base: Vec<Vec<u8>> = (0..n)
                .map(|i| entry(&format!("f{i}"), rng.next()))
                .collect();
            let mut new = base.clone();
            for _ in 0..(rng.next() % 6) {
                let at = (rng.next() as usize) % (new.len() + 1);
                match rng.next() % 3 {
                    0 => new.insert(at, entry(&format!("n{case}_{at}"), rng.next())),
                    1 if at < new.len() => {
                        new.remove(at);
                    }
                    _ if at < new.len() => new[at] = entry(&format!("f{at}"), rng.next()),
                    _ => {}
                }
            }
            let base_body = join_listing(base.iter().map(Vec::as_slice));
            let new_body = join_listing(new.iter().map(Vec::as_slice));
            let hashes: Vec<u64> = base.iter().map(|e| h.hash_one(e.as_slice())).collect();
            let entries = split_listing(&new_body).unwrap();
            let body = Delta {
                base: ETag::of_listing(&base_body),
                etag: ETag::of_listing(&new_body),
                entries: entries.len(),
                ops: diff(&hashes, &entries, |e| h.hash_one(e)),
            }
            .encode();
            assert_eq!(apply(&base_body, &body), new_body, "case {case}");
        }
    }

    #[test]
    fn a_small_change_is_a_small_delta_from_any_remembered_base() {
        let h = History::default();
        let v1: Vec<Vec<u8>> = (0..200).map(|i| entry(&format!("f{i}"), i)).collect();
        let mut v2 = v1.clone();
        v2[50] = entry("f50", 9999);
        v2.insert(120, entry("new", 1));
        let mut v3 = v2.clone();
        v3.remove(10);
        let (l1, l2, l3) = (listing(&v1), listing(&v2), listing(&v3));
        h.record(key(), l1.clone());
        assert_eq!(h.bases(&key()), 0, "the current listing is not a base");
        h.record(key(), l2.clone());
        h.record(key(), l3.clone());
        assert_eq!(h.bases(&key()), 2);
        for base in [&l1, &l2] {
            let d = h.delta(&key(), &l3, &[base.etag.core()]).expect("a delta");
            assert!(d.len() < l3.len / 10, "{} vs {}", d.len(), l3.len);
            assert_eq!(apply(&base.plain(), &d.plain()), l3.plain());
            let again = h.delta(&key(), &l3, &[base.etag.core()]).unwrap();
            assert!(Arc::ptr_eq(&d, &again), "computed once");
        }
        assert!(h.delta(&key(), &l3, &["0123"]).is_none(), "unknown base");
        assert!(
            h.delta(&key(), &l3, &["0123", l1.etag.core()]).is_some(),
            "the first remembered tag of If-None-Match"
        );
        let mut other = key();
        other.1.use_permissions = false;
        assert!(h.delta(&other, &l3, &[l1.etag.core()]).is_none());
        // Everything changed: the delta would not be smaller.
        let v4: Vec<Vec<u8>> = (0..200).map(|i| entry(&format!("g{i}"), i)).collect();
        let l4 = listing(&v4);
        h.record(key(), l4.clone());
        assert!(h.delta(&key(), &l4, &[l3.etag.core()]).is_none());
        // A revert: the old listing is current again, not a base.
        h.record(key(), l1.clone());
        assert_eq!(h.bases(&key()), 3, "l2, l3, l4");
        assert!(h.delta(&key(), &l1, &[l3.etag.core()]).is_some());
    }

    #[test]
    fn history_is_bounded() {
        let h = History::default();
        for n in 0..20 {
            let v: Vec<Vec<u8>> = (0..10).map(|i| entry(&format!("f{i}"), i + n)).collect();
            h.record(key(), listing(&v));
        }
        assert_eq!(h.bases(&key()), MAX_BASES);
    }
}
