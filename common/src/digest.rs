//! [`Sha256`]: the digest that names content everywhere in pluginsync —
//! in listings as `{sha256}<hex>` (docs/protocol.md §2.2), in blob URLs and
//! batch frames as bare lowercase hex (docs/protocol.md §7), encoded and
//! decoded by [`crate::hex`].

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
        crate::hex::decode_lower(hex)
            .map(Sha256)
            .ok_or_else(|| BadDigest(hex.chars().take(80).collect()))
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
        crate::hex::encode(&self.0)
    }

    /// Puppet's `{sha256}<hex>` notation.
    pub fn to_checksum(&self) -> String {
        format!("{}{}", Self::PREFIX, self.to_hex())
    }
}

/// A record the agent keeps without fsync (its stat cache, a kept
/// generation's record: docs/internals.md#cache), sealed by the sha256 of
/// its bytes so that a file cut or torn by a crash reads as none. Built
/// by pushing fields onto `bytes` after a magic line, then [`Sealed::seal`].
#[derive(Debug, Default)]
pub struct Sealed {
    /// The bytes so far.
    pub bytes: Vec<u8>,
}

impl Sealed {
    /// A record starting with `magic` (its format and version).
    pub fn new(magic: &[u8], capacity: usize) -> Sealed {
        let mut bytes = Vec::with_capacity(magic.len() + capacity + 32);
        bytes.extend_from_slice(magic);
        Sealed { bytes }
    }

    /// Appends a `u32`, little-endian.
    pub fn u32(&mut self, n: u32) {
        self.bytes.extend_from_slice(&n.to_le_bytes());
    }

    /// Appends `text` after its length as a `u16`; `None` (nothing
    /// appended) for a text longer than that can say.
    pub fn text(&mut self, text: &str) -> Option<()> {
        let len = u16::try_from(text.len()).ok()?;
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(text.as_bytes());
        Some(())
    }

    /// The record's bytes, the seal appended.
    pub fn seal(mut self) -> Vec<u8> {
        let seal = Sha256::of(&self.bytes);
        self.bytes.extend_from_slice(&seal.0);
        self.bytes
    }
}

/// Reads a [`Sealed`] record front to back.
#[derive(Debug)]
pub struct Unsealed<'a> {
    rest: &'a [u8],
}

impl<'a> Unsealed<'a> {
    /// The fields of `bytes` when they are a record with `magic` whose
    /// seal holds; `None` otherwise.
    pub fn open(bytes: &'a [u8], magic: &[u8]) -> Option<Unsealed<'a>> {
        let (body, seal) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
        (Sha256::of(body).0 == seal).then_some(())?;
        Some(Unsealed {
            rest: body.strip_prefix(magic)?,
        })
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(head)
    }

    /// The next `N` bytes, as an array.
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// The next `u32` ([`Sealed::u32`]).
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    /// The next text ([`Sealed::text`]).
    pub fn text(&mut self) -> Option<&'a str> {
        let len = u16::from_le_bytes(self.array()?);
        std::str::from_utf8(self.take(usize::from(len))?).ok()
    }

    /// Whether every field was read.
    pub fn is_done(&self) -> bool {
        self.rest.is_empty()
    }
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
        assert_eq!(crate::hex::encode(&[0, 0x0f, 0xa0, 0xff]), "000fa0ff");
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
