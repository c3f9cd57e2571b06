//! Delta listings (docs/protocol.md §7.5), the format both sides share: a
//! listing split into its raw entries and joined back, the delta body
//! ([`Delta`], [`parse_delta`], [`Delta::encode`]) and its instructions
//! applied to a base ([`apply_ops`]). The headers and the status a delta
//! travels with are in `protocol.rs`; which listing a tag names is
//! `etag.rs`.

use crate::etag::ETag;

/// The first line of a delta body.
const DELTA_MAGIC: &str = "pluginsync-listing-delta 1";

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
pub fn join_listing<'a, I>(entries: I) -> Vec<u8>
where
    I: IntoIterator<Item = &'a [u8]>,
    I::IntoIter: Clone,
{
    let entries = entries.into_iter();
    // Exactly the size needed: growing by doubling would hold up to twice
    // the listing.
    let len = entries.clone().map(|e| e.len() + 1).sum::<usize>() + 1;
    let mut out = Vec::with_capacity(len.max(2));
    out.push(b'[');
    for (i, e) in entries.enumerate() {
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
    /// The `ETag` of the listing the delta applies to (`"<40 hex>"`).
    pub base: ETag,
    /// The `ETag` of the listing it makes.
    pub etag: ETag,
    /// The number of entries of the listing it makes.
    pub entries: usize,
    /// The instructions, in order.
    pub ops: Vec<DeltaOp<'a>>,
}

/// A body that is not a delta listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaFormatError {
    /// The first line is not `DELTA_MAGIC` (another version or not a
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
    /// The `entries` line announces more than the caller allows.
    #[error(
        "the delta listing announces {announced} entries, more than the {max} a listing may hold; refused"
    )]
    TooManyAnnounced {
        /// The `entries` line.
        announced: usize,
        /// The caller's limit.
        max: usize,
    },
    /// The instructions make more entries than announced (found while
    /// parsing, before they are held: docs/protocol.md §7.5.2).
    #[error("the delta listing makes more than the {0} entries it announces; refused")]
    MoreThanAnnounced(usize),
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
fn quoted_tag(v: &[u8]) -> Option<ETag> {
    let s = std::str::from_utf8(v).ok()?;
    let hex = s.strip_prefix('"')?.strip_suffix('"')?;
    (hex.len() == 40 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| ETag::new(s))
}

/// A decimal count of at most 12 ASCII digits.
fn count(v: &[u8]) -> Option<usize> {
    if v.is_empty() || v.len() > 12 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Parses a delta body (docs/protocol.md §7.5.2). The syntax is checked
/// here, and the size: `entries` at most `max_entries`, and the
/// instructions never make more than `entries` (a copy of nothing is not
/// an instruction), so what is held is bounded by the limit, never by the
/// body's line count. Whether it applies to a base, and whether the
/// result is the listing it names, is for the applier to check.
pub fn parse_delta(body: &[u8], max_entries: usize) -> Result<Delta<'_>, DeltaFormatError> {
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
    if entries > max_entries {
        return Err(DeltaFormatError::TooManyAnnounced {
            announced: entries,
            max: max_entries,
        });
    }
    let (mut ops, mut made) = (Vec::new(), 0usize);
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
            made += 1;
            if made > entries {
                return Err(DeltaFormatError::MoreThanAnnounced(entries));
            }
            ops.push(DeltaOp::Add(raw));
        } else if let Some(args) = l.strip_prefix(b"c ") {
            let mut it = args.splitn(2, |&b| b == b' ');
            let (Some(start), Some(count)) = (it.next().and_then(count), it.next().and_then(count))
            else {
                return Err(bad(n, l));
            };
            if count == 0 {
                return Err(bad(n, l));
            }
            made = made.saturating_add(count);
            if made > entries {
                return Err(DeltaFormatError::MoreThanAnnounced(entries));
            }
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
    /// A base entry copied a second time: a listing never holds the same
    /// entry twice (its paths are unique, docs/protocol.md §4.3), so a
    /// delta may make at most its base plus what it adds
    /// (docs/protocol.md §7.5.2), never a multiple of a base entry.
    #[error("the delta copies base entry {0} more than once; refused")]
    CopiedTwice(usize),
}

/// The entries of the listing a delta makes, in order: its `ops` applied to
/// `base` (the raw entries of the base listing, [`split_listing`]). At
/// most `max` entries (the delta's own count is checked by the caller), and
/// each base entry copied at most once, so the result is never larger than
/// the base and the delta together: a small delta cannot expand into a
/// large listing.
pub fn apply_ops<'a>(
    base: &[&'a [u8]],
    ops: &[DeltaOp<'a>],
    max: usize,
) -> Result<Vec<&'a [u8]>, DeltaApplyError> {
    let mut out: Vec<&[u8]> = Vec::new();
    let mut copied = vec![false; base.len()];
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
                if let Some(twice) = (start..end).find(|&i| copied[i]) {
                    return Err(DeltaApplyError::CopiedTwice(twice));
                }
                copied[start..end].fill(true);
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

    fn sample_delta() -> (ETag, ETag, Vec<u8>) {
        (
            ETag::of_listing(b"[1]"),
            ETag::of_listing(b"[2]"),
            br#"{"relative_path":"a b,c"}"#.to_vec(),
        )
    }

    #[test]
    fn a_delta_encodes_and_parses_back() {
        let (base, etag, raw) = sample_delta();
        let d = Delta {
            base: base.clone(),
            etag: etag.clone(),
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
        assert_eq!(parse_delta(&body, 4), Ok(d));
    }

    #[test]
    fn a_malformed_delta_is_refused_with_its_line() {
        let (base, etag, _) = sample_delta();
        let head = format!("pluginsync-listing-delta 1\nbase {base}\netag {etag}\nentries 1\n");
        let parse = |tail: &str| parse_delta(format!("{head}{tail}").as_bytes(), 10).map(|_| ());
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
        // A copy of nothing is no instruction: it would only cost memory.
        assert!(matches!(
            parse("c 0 0\nc 0 1\nend\n"),
            Err(DeltaFormatError::BadLine { line: 5, .. })
        ));
        // More made than announced is refused at the line that does it.
        assert_eq!(
            parse("c 0 1\na {}\nend\n"),
            Err(DeltaFormatError::MoreThanAnnounced(1))
        );
        assert_eq!(
            parse("c 0 2\nend\n"),
            Err(DeltaFormatError::MoreThanAnnounced(1))
        );
        let big =
            format!("pluginsync-listing-delta 1\nbase {base}\netag {etag}\nentries 11\nend\n");
        assert_eq!(
            parse_delta(big.as_bytes(), 10),
            Err(DeltaFormatError::TooManyAnnounced {
                announced: 11,
                max: 10
            })
        );
        assert_eq!(
            parse_delta(b"pluginsync-listing-delta 2\n", 10),
            Err(DeltaFormatError::Magic)
        );
        assert_eq!(parse_delta(b"[]", 10), Err(DeltaFormatError::Magic));
        let bad_tag =
            format!("pluginsync-listing-delta 1\nbase \"xyz\"\netag {etag}\nentries 1\nend\n");
        assert!(matches!(
            parse_delta(bad_tag.as_bytes(), 10),
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
        let twice = [
            DeltaOp::Copy { start: 0, count: 2 },
            DeltaOp::Copy { start: 1, count: 1 },
        ];
        assert_eq!(
            apply_ops(&base, &twice, 10),
            Err(DeltaApplyError::CopiedTwice(1))
        );
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
