//! Checksums in Puppet's notation: `{sha256}<hex>`, `{md5}<hex>`, `{ctime}…`.
//!
//! The agent compares a listing's `checksum.value` with the same string
//! computed locally, so the formatting here must match Puppet's byte for byte
//! (docs/protocol.md §2.2): a `{type}` prefix, lowercase hex for digests, Ruby's
//! `Time#to_s` for `mtime`/`ctime`, and an empty suffix for `none`. The `lite`
//! variants hash only the first 512 bytes.

use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// Bytes hashed by the `*lite` checksum types.
pub const LITE_BYTES: usize = 512;

/// The checksum types Puppet's file server accepts in `checksum_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChecksumType {
    /// SHA-256 of the whole file; Puppet 7's default and pluginsync's index key.
    Sha256,
    /// SHA-256 of the first 512 bytes.
    Sha256Lite,
    /// SHA-224.
    Sha224,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
    /// SHA-1.
    Sha1,
    /// SHA-1 of the first 512 bytes.
    Sha1Lite,
    /// MD5.
    Md5,
    /// MD5 of the first 512 bytes.
    Md5Lite,
    /// Modification time, as Ruby's `Time#to_s`.
    Mtime,
    /// Status-change time, as Ruby's `Time#to_s`; what directories carry.
    Ctime,
    /// No checksum: `{none}`.
    None,
}

/// `checksum_type` named a type Puppet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported checksum type '{0}'")]
pub struct UnknownChecksumType(pub String);

impl ChecksumType {
    /// Every type, in a stable order.
    pub const ALL: [ChecksumType; 12] = [
        Self::Sha256,
        Self::Sha256Lite,
        Self::Sha224,
        Self::Sha384,
        Self::Sha512,
        Self::Sha1,
        Self::Sha1Lite,
        Self::Md5,
        Self::Md5Lite,
        Self::Mtime,
        Self::Ctime,
        Self::None,
    ];

    /// The name as written on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Lite => "sha256lite",
            Self::Sha224 => "sha224",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
            Self::Sha1 => "sha1",
            Self::Sha1Lite => "sha1lite",
            Self::Md5 => "md5",
            Self::Md5Lite => "md5lite",
            Self::Mtime => "mtime",
            Self::Ctime => "ctime",
            Self::None => "none",
        }
    }

    /// True for the types computed from the file's bytes.
    pub fn is_digest(self) -> bool {
        !matches!(self, Self::Mtime | Self::Ctime | Self::None)
    }

    /// Digest of everything `reader` yields (only the first 512 bytes for the
    /// `lite` types), as `{type}<lowercase hex>`. Panics in debug builds if
    /// called for a non-digest type; those are formatted from a stat.
    pub fn digest_reader(self, reader: impl Read) -> io::Result<String> {
        debug_assert!(self.is_digest());
        let hex = match self {
            Self::Sha256 => hash_all::<Sha256>(reader)?,
            Self::Sha256Lite => hash_lite::<Sha256>(reader)?,
            Self::Sha224 => hash_all::<Sha224>(reader)?,
            Self::Sha384 => hash_all::<Sha384>(reader)?,
            Self::Sha512 => hash_all::<Sha512>(reader)?,
            Self::Sha1 => hash_all::<Sha1>(reader)?,
            Self::Sha1Lite => hash_lite::<Sha1>(reader)?,
            Self::Md5 => hash_all::<Md5>(reader)?,
            Self::Md5Lite => hash_lite::<Md5>(reader)?,
            Self::Mtime | Self::Ctime | Self::None => String::new(),
        };
        Ok(format!("{{{}}}{}", self.name(), hex))
    }

    /// `{mtime}`/`{ctime}` value for a Unix timestamp, as Ruby's `Time#to_s`
    /// in UTC: `{ctime}2026-11-22 13:14:19 +0000`.
    pub fn format_time(self, unix_seconds: i64) -> String {
        format!("{{{}}}{}", self.name(), ruby_time_utc(unix_seconds))
    }
}

impl fmt::Display for ChecksumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChecksumType {
    type Err = UnknownChecksumType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownChecksumType(s.to_owned()))
    }
}

/// Ruby's `Time#to_s` for a UTC timestamp: `2026-11-22 13:14:19 +0000`.
pub fn ruby_time_utc(unix_seconds: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix_seconds)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let fmt =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] +0000");
    t.format(&fmt)
        .unwrap_or_else(|_| "1970-01-01 00:00:00 +0000".to_owned())
}

fn hash_all<D: Digest>(reader: impl Read) -> io::Result<String> {
    Ok(crate::hex::encode(&digest_all::<D>(reader)?))
}

fn digest_all<D: Digest>(mut reader: impl Read) -> io::Result<Vec<u8>> {
    let mut hasher = D::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().to_vec())
}

/// The SHA-256 of everything `reader` yields, streamed.
pub fn sha256_reader(reader: impl Read) -> io::Result<crate::digest::Sha256> {
    let v = digest_all::<Sha256>(reader)?;
    let mut out = [0u8; 32];
    out.copy_from_slice(&v);
    Ok(crate::digest::Sha256(out))
}

fn hash_lite<D: Digest>(reader: impl Read) -> io::Result<String> {
    hash_all::<D>(reader.take(LITE_BYTES as u64))
}

/// A streaming SHA-256 for downloads: feed chunks as they arrive, then compare
/// [`Sha256Stream::finish`] with the listing's value.
#[derive(Default, Clone)]
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk.
    pub fn update(&mut self, chunk: &[u8]) {
        self.0.update(chunk);
    }

    /// The digest as `{sha256}<hex>`.
    pub fn finish(self) -> String {
        self.digest().to_checksum()
    }

    /// The digest.
    pub fn digest(self) -> crate::digest::Sha256 {
        crate::digest::Sha256(self.0.finalize().into())
    }
}

/// SHA-256 of a byte slice as raw bytes (used for content-derived ETags).
pub fn sha256_bytes(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Splits `{type}value` into its type and the hex (or time) part.
pub fn split_checksum(value: &str) -> Option<(&str, &str)> {
    let rest = value.strip_prefix('{')?;
    let end = rest.find('}')?;
    Some((&rest[..end], &rest[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        let t = |ty: ChecksumType, data: &[u8]| ty.digest_reader(data).unwrap();
        assert_eq!(
            t(ChecksumType::Sha256, b"abc"),
            "{sha256}ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            t(ChecksumType::Md5, b"abc"),
            "{md5}900150983cd24fb0d6963f7d28e17f72"
        );
        assert_eq!(
            t(ChecksumType::Sha1, b"abc"),
            "{sha1}a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        let big = vec![b'x'; 2000];
        assert_eq!(
            t(ChecksumType::Sha256Lite, &big),
            t(ChecksumType::Sha256, &big[..512]).replace("sha256", "sha256lite")
        );
    }

    #[test]
    fn names_round_trip() {
        for t in ChecksumType::ALL {
            assert_eq!(t.name().parse::<ChecksumType>().unwrap(), t);
        }
        assert!("bogus".parse::<ChecksumType>().is_err());
        assert!("SHA256".parse::<ChecksumType>().is_err());
    }

    #[test]
    fn time_format_is_rubys() {
        assert_eq!(
            ChecksumType::Ctime.format_time(0),
            "{ctime}1970-01-01 00:00:00 +0000"
        );
        assert_eq!(
            ChecksumType::Mtime.format_time(1_704_067_200),
            "{mtime}2024-01-01 00:00:00 +0000"
        );
    }

    #[test]
    fn stream_matches_reader() {
        let mut s = Sha256Stream::new();
        s.update(b"a");
        s.update(b"bc");
        assert_eq!(
            s.finish(),
            ChecksumType::Sha256.digest_reader(&b"abc"[..]).unwrap()
        );
        assert_eq!(split_checksum("{sha256}abc"), Some(("sha256", "abc")));
        assert_eq!(split_checksum("sha256abc"), None);
    }
}
