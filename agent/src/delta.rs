//! Delta listings, the agent's side (docs/protocol.md §7.5): a delta
//! answer applied to the cached listing it names, and the result checked
//! byte for byte against the new `ETag`.
//!
//! Pure: bytes in, bytes out. The caller (`sync.rs`) reads the cached
//! listing, and on any error here takes the full listing instead, so a
//! wrong delta can only cost a second request, never a wrong tree: the
//! rebuilt body is used only when its sha256 is the one the master's
//! `ETag` names (the `ETag` is derived from the whole uncompressed body,
//! docs/protocol.md §6.1), and it then goes through the same checks as any
//! listing (`listing.rs`).

use pluginsync_common::delta::{
    DeltaApplyError, DeltaFormatError, apply_ops, join_listing, parse_delta, split_listing,
};
use pluginsync_common::etag::ETag;

use crate::client::{MAX_LISTING_BYTES, MAX_LISTING_ENTRIES};

/// Why a delta answer was not used; one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// The body is not a delta.
    #[error(transparent)]
    Format(#[from] DeltaFormatError),
    /// The answer's `ETag` header and the delta disagree on the result.
    #[error("the answer's ETag {header} is not the delta's {delta}")]
    HeaderMismatch {
        /// The `ETag` header.
        header: ETag,
        /// The delta's `etag` line.
        delta: ETag,
    },
    /// The delta applies to another listing than the cached one.
    #[error("the delta applies to {delta}, the cached listing is {cached}")]
    WrongBase {
        /// The delta's `base` line.
        delta: ETag,
        /// The cached listing's tag.
        cached: ETag,
    },
    /// The cached listing is not a compact JSON array.
    #[error("the cached listing cannot be split into entries")]
    BaseNotListing,
    /// The instructions do not fit the base or the limits.
    #[error(transparent)]
    Apply(#[from] DeltaApplyError),
    /// Not as many entries as the delta announced.
    #[error("the delta makes {made} entries, not the {announced} it announced")]
    Count {
        /// Entries made.
        made: usize,
        /// Entries announced.
        announced: usize,
    },
    /// The result would be larger than a listing may be.
    #[error("the rebuilt listing is larger than {} MiB; refused", MAX_LISTING_BYTES >> 20)]
    TooLarge,
    /// The rebuilt bytes are not the listing the `ETag` names.
    #[error("the rebuilt listing is {got}, not {want}")]
    Mismatch {
        /// The delta's `etag`.
        want: ETag,
        /// The rebuilt listing's tag.
        got: ETag,
    },
}

/// The listing `delta` makes from `base` (the cached listing body),
/// checked against the delta's own `etag` line and the answer's `ETag`
/// header `etag` (in any form: `"…"`, `"…-gzip"`).
pub fn rebuild(base: &[u8], delta: &[u8], etag: Option<&ETag>) -> Result<Vec<u8>, DeltaError> {
    let d = parse_delta(delta, MAX_LISTING_ENTRIES)?;
    if let Some(header) = etag
        && !header.same_content(&d.etag)
    {
        return Err(DeltaError::HeaderMismatch {
            header: header.clone(),
            delta: d.etag,
        });
    }
    let cached = ETag::of_listing(base);
    if !cached.same_content(&d.base) {
        return Err(DeltaError::WrongBase {
            delta: d.base,
            cached,
        });
    }
    let entries = split_listing(base).ok_or(DeltaError::BaseNotListing)?;
    let max = d.entries.min(MAX_LISTING_ENTRIES);
    let made = apply_ops(&entries, &d.ops, max)?;
    if made.len() != d.entries {
        return Err(DeltaError::Count {
            made: made.len(),
            announced: d.entries,
        });
    }
    let len = made.iter().map(|e| e.len() + 1).sum::<usize>() + 1;
    if len > MAX_LISTING_BYTES {
        return Err(DeltaError::TooLarge);
    }
    let body = join_listing(made);
    let got = ETag::of_listing(&body);
    if !got.same_content(&d.etag) {
        return Err(DeltaError::Mismatch { want: d.etag, got });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::delta::{Delta, DeltaOp};
    use proptest::prelude::*;

    fn entry(path: &str) -> Vec<u8> {
        format!(r#"{{"relative_path":"{path}","type":"file"}}"#).into_bytes()
    }

    fn body(entries: &[Vec<u8>]) -> Vec<u8> {
        join_listing(entries.iter().map(Vec::as_slice))
    }

    /// `new` as a delta from `base`: the entries equal by position
    /// copied, the others added (a plain reference, not the master's diff).
    fn delta(base: &[Vec<u8>], new: &[Vec<u8>]) -> Vec<u8> {
        let ops = new
            .iter()
            .map(|e| match base.iter().position(|b| b == e) {
                Some(i) => DeltaOp::Copy { start: i, count: 1 },
                None => DeltaOp::Add(e.as_slice()),
            })
            .collect();
        Delta {
            base: ETag::of_listing(&body(base)),
            etag: ETag::of_listing(&body(new)),
            entries: new.len(),
            ops,
        }
        .encode()
    }

    fn v1() -> Vec<Vec<u8>> {
        [".", "a", "b", "c"].map(entry).to_vec()
    }

    fn v2() -> Vec<Vec<u8>> {
        [".", "a", "b2", "c", "d"].map(entry).to_vec()
    }

    #[test]
    fn a_delta_rebuilds_the_new_listing_byte_for_byte() {
        let (base, new) = (body(&v1()), body(&v2()));
        let d = delta(&v1(), &v2());
        let tag = ETag::of_listing(&new);
        assert_eq!(rebuild(&base, &d, Some(&tag)).unwrap(), new);
        let gz = ETag::new(format!("{}-gzip\"", tag.as_str().trim_end_matches('"')));
        assert_eq!(rebuild(&base, &d, Some(&gz)).unwrap(), new, "gzip form");
        assert_eq!(rebuild(&base, &d, None).unwrap(), new);
    }

    #[test]
    fn every_wrong_delta_is_refused() {
        let (base, new) = (body(&v1()), body(&v2()));
        let good = delta(&v1(), &v2());
        let tag = ETag::of_listing(&new);
        let text = String::from_utf8(good.clone()).unwrap();
        // Another base.
        let other = body(&v2());
        assert!(matches!(
            rebuild(&other, &good, Some(&tag)),
            Err(DeltaError::WrongBase { .. })
        ));
        // Another result announced in the header.
        assert!(matches!(
            rebuild(&base, &good, Some(&ETag::of_listing(b"[]"))),
            Err(DeltaError::HeaderMismatch { .. })
        ));
        // One byte of an added entry changed: the ETag check fails.
        let flipped = text.replacen("\"b2\"", "\"b3\"", 1);
        assert_ne!(flipped, text);
        assert!(matches!(
            rebuild(&base, flipped.as_bytes(), Some(&tag)),
            Err(DeltaError::Mismatch { .. })
        ));
        // A copy out of range, a wrong count, a cut body.
        let far = text.replacen("c 3 1", "c 9 1", 1);
        assert!(matches!(
            rebuild(&base, far.as_bytes(), Some(&tag)),
            Err(DeltaError::Apply(_))
        ));
        // A copy past what it announced is refused as it is parsed.
        let more = text.replacen("c 3 1", "c 3 9", 1);
        assert!(matches!(
            rebuild(&base, more.as_bytes(), Some(&tag)),
            Err(DeltaError::Format(DeltaFormatError::MoreThanAnnounced(5)))
        ));
        // A base entry copied twice: never a listing (its paths are
        // unique), and how a small delta would make a huge one.
        let twice =
            (text.replacen("c 3 1", "c 3 1\nc 3 1", 1)).replacen("entries 5", "entries 6", 1);
        assert!(matches!(
            rebuild(&base, twice.as_bytes(), Some(&tag)),
            Err(DeltaError::Apply(DeltaApplyError::CopiedTwice(3)))
        ));
        let fewer = text.replacen("entries 5", "entries 6", 1);
        assert!(matches!(
            rebuild(&base, fewer.as_bytes(), Some(&tag)),
            Err(DeltaError::Count { .. })
        ));
        assert!(matches!(
            rebuild(&base, &good[..good.len() - 3], Some(&tag)),
            Err(DeltaError::Format(_))
        ));
        assert!(matches!(
            rebuild(b"not json", &good, None),
            Err(DeltaError::WrongBase { .. })
        ));
        assert!(matches!(
            rebuild(&base, &new, Some(&tag)),
            Err(DeltaError::Format(DeltaFormatError::Magic))
        ));
    }

    proptest! {
        #[test]
        fn any_edit_round_trips(
            base in proptest::collection::btree_set("[a-z/ \"\\\\,]{1,6}", 0..12),
            new in proptest::collection::btree_set("[a-z/ \"\\\\,]{1,6}", 0..12),
        ) {
            let mk = |s: &std::collections::BTreeSet<String>| -> Vec<Vec<u8>> {
                s.iter().map(|p| serde_json::to_vec(&serde_json::json!({"relative_path": p})).unwrap()).collect()
            };
            let (b, n) = (mk(&base), mk(&new));
            let d = delta(&b, &n);
            prop_assert_eq!(rebuild(&body(&b), &d, Some(&ETag::of_listing(&body(&n)))).unwrap(), body(&n));
        }
    }
}
