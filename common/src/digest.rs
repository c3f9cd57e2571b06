//! [`Sha256`]: the digest that names content everywhere in pluginsync —
//! in listings as `{sha256}<hex>` (docs/protocol.md §2.2), in blob URLs and
//! batch frames as bare lowercase hex (docs/protocol.md §7). The one place
//! that encodes and decodes sha256 hex.

use std::fmt;
use std::str::FromStr;

use sha2::Digest;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

/// Text that is not a sha256 digest in the expected notation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a sha256 digest (64 lowercase hex digits)")]
pub struct BadDigest(pub String);

impl Sha256 {
    /// The `{type}` prefix of Puppet's checksum notation.
    pub const PREFIX: &'static str = "{sha256}";

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Sha256 {
        Sha256(sha2::Sha256::digest(data).into())
    }

    /// Parses exactly 64 lowercase hex digits (the form on the wire: blob
    /// paths, batch queries and frames). Uppercase is refused so that one
    /// digest has one spelling, and one cache key.
    pub fn from_hex(hex: &str) -> Result<Sha256, BadDigest> {
        let b = hex.as_bytes();
        if b.len() != 64 || !b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(BadDigest(hex.chars().take(80).collect()));
        }
        let nibble = |c: u8| if c <= b'9' { c - b'0' } else { c - b'a' + 10 };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = nibble(b[2 * i]) << 4 | nibble(b[2 * i + 1]);
        }
        Ok(Sha256(out))
    }

    /// Parses Puppet's `{sha256}<hex>` notation.
    pub fn from_checksum(checksum: &str) -> Result<Sha256, BadDigest> {
        checksum
            .strip_prefix(Self::PREFIX)
            .ok_or_else(|| BadDigest(checksum.chars().take(80).collect()))
            .and_then(Sha256::from_hex)
    }

    /// Lowercase hex, 64 digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Puppet's `{sha256}<hex>` notation.
    pub fn to_checksum(&self) -> String {
        format!("{}{}", Self::PREFIX, self.to_hex())
    }
}

/// Lowercase hex of any bytes (also used for md5 and sha1 checksums).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

impl fmt::Display for Sha256 {
    /// Bare lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({})", self.to_hex())
    }
}

impl FromStr for Sha256 {
    type Err = BadDigest;
    /// Bare hex or `{sha256}hex`.
    fn from_str(s: &str) -> Result<Sha256, BadDigest> {
        if s.starts_with(Self::PREFIX) {
            Sha256::from_checksum(s)
        } else {
            Sha256::from_hex(s)
        }
    }
}

/// Serialized as its bare lowercase hex, the form the agent's cache files
/// have always held (`agent/src/cache.rs`).
impl serde::Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

/// Read from bare lowercase hex ([`Sha256::from_hex`]).
impl<'de> serde::Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sha256, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Sha256::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

impl From<[u8; 32]> for Sha256 {
    fn from(b: [u8; 32]) -> Sha256 {
        Sha256(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refusals() {
        let d = Sha256::of(b"hello\n");
        assert_eq!(
            d.to_hex(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(Sha256::from_hex(&d.to_hex()), Ok(d));
        assert_eq!(Sha256::from_checksum(&d.to_checksum()), Ok(d));
        assert_eq!(d.to_checksum().parse::<Sha256>(), Ok(d));
        assert_eq!(d.to_hex().parse::<Sha256>(), Ok(d));
        assert!(Sha256::from_hex(&d.to_hex().to_uppercase()).is_err());
        assert!(Sha256::from_hex("ab").is_err());
        assert!(Sha256::from_hex(&"zz".repeat(32)).is_err());
        assert!(Sha256::from_hex(&"ab".repeat(33)).is_err());
        assert!(Sha256::from_checksum(&format!("{{md5}}{}", d.to_hex())).is_err());
        assert_eq!(hex(&[0, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    #[test]
    fn serde_is_bare_hex() {
        let d = Sha256::of(b"hello\n");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{}\"", d.to_hex()));
        assert_eq!(serde_json::from_str::<Sha256>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Sha256>("\"ab\"").is_err());
    }
}
