//! Hex: the one encoder and decoder of the workspace. Lowercase is what
//! pluginsync writes (digests, checksums, ETags, a transaction's UUID, a
//! terminal's `\x1b`), uppercase what a manifest's `%XX` field escape
//! writes (docs/protocol.md §7.6); a digest is read back in lowercase only
//! ([`decode_lower`]), an escape in either case ([`byte`]). Table lookups,
//! no formatting machinery: [`crate::digest::Sha256`] hex is on the hot
//! paths of listing and serving.

const LOWER: &[u8; 16] = b"0123456789abcdef";
const UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Lowercase hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    put(&mut out, bytes, LOWER);
    out
}

/// Lowercase hex of `bytes`, appended to `out`.
pub fn push(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    put(out, bytes, LOWER);
}

/// Uppercase hex of `bytes`, appended to `out`.
pub fn push_upper(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    put(out, bytes, UPPER);
}

/// Two digits of `digits` per byte, appended to `out` (room already
/// made).
#[inline]
fn put(out: &mut String, bytes: &[u8], digits: &[u8; 16]) {
    for b in bytes {
        out.push(char::from(digits[usize::from(b >> 4)]));
        out.push(char::from(digits[usize::from(b & 15)]));
    }
}

/// The value of one hex digit, either case.
fn digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The byte two hex digits spell (`high` first), either case.
pub fn byte(high: u8, low: u8) -> Option<u8> {
    Some(digit(high)? << 4 | digit(low)?)
}

/// The `N` bytes that exactly `2 * N` lowercase hex digits spell; `None`
/// for any other text (uppercase included: one value, one spelling).
pub fn decode_lower<const N: usize>(text: &str) -> Option<[u8; N]> {
    let lower = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let b = text.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        *o = lower(pair[0])? << 4 | lower(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_both_cases_and_decodes_what_it_wrote() {
        assert_eq!(encode(&[0, 0x0f, 0xa0, 0xff]), "000fa0ff");
        let mut s = String::from("%");
        push_upper(&mut s, &[0x7f]);
        push(&mut s, &[0xab]);
        assert_eq!(s, "%7Fab");
        assert_eq!(byte(b'7', b'F'), Some(0x7f));
        assert_eq!(byte(b'a', b'B'), Some(0xab));
        assert_eq!(byte(b'+', b'1'), None);
        assert_eq!(byte(b'g', b'0'), None);
        assert_eq!(decode_lower::<2>("00ff"), Some([0, 0xff]));
        assert_eq!(decode_lower::<2>("00FF"), None);
        assert_eq!(decode_lower::<2>("00f"), None);
        assert_eq!(decode_lower::<2>("00fff"), None);
        assert_eq!(decode_lower::<1>("+1"), None);
    }
}
