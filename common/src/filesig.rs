//! [`FileSig`]: the parts of a file's stat that change whenever its content
//! may have changed. The master reuses a digest, and serves a file, only
//! while its signature is the indexed one; the agent re-hashes a file only
//! when its signature differs from the one in its stat cache.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

/// Device, inode, size and both timestamps (nanoseconds since the epoch).
///
/// Equal signatures mean "same content" for every writer that goes through
/// the kernel (a write updates mtime and ctime; a rename-over changes the
/// inode); the timestamps are nanoseconds so two writes within one second
/// still differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileSig {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status-change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// Inode.
    pub ino: u64,
    /// Device.
    pub dev: u64,
}

impl FileSig {
    /// From a stat (following or not, as the caller chose).
    pub fn of(md: &Metadata) -> FileSig {
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        FileSig {
            size: md.size(),
            mtime_ns: ns(md.mtime(), md.mtime_nsec()),
            ctime_ns: ns(md.ctime(), md.ctime_nsec()),
            ino: md.ino(),
            dev: md.dev(),
        }
    }

    /// Its five fields, little-endian, for the agent's binary records.
    pub fn to_le_bytes(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        let fields = [
            self.size.to_le_bytes(),
            self.mtime_ns.to_le_bytes(),
            self.ctime_ns.to_le_bytes(),
            self.ino.to_le_bytes(),
            self.dev.to_le_bytes(),
        ];
        for (chunk, field) in out.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field);
        }
        out
    }

    /// [`FileSig::to_le_bytes`] back.
    pub fn from_le_bytes(b: &[u8; 40]) -> FileSig {
        let at = |i: usize| {
            let mut f = [0u8; 8];
            f.copy_from_slice(&b[i..i + 8]);
            f
        };
        FileSig {
            size: u64::from_le_bytes(at(0)),
            mtime_ns: i64::from_le_bytes(at(8)),
            ctime_ns: i64::from_le_bytes(at(16)),
            ino: u64::from_le_bytes(at(24)),
            dev: u64::from_le_bytes(at(32)),
        }
    }

    /// From a raw stat (rustix's `fstat`/`statat`): the same fields as
    /// [`FileSig::of`] gives for the same file.
    pub fn of_stat(st: &rustix::fs::Stat) -> FileSig {
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
        FileSig {
            size: st.st_size as u64,
            mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
            ino: st.st_ino as u64,
            dev: st.st_dev as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_changes_the_signature() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        let a = FileSig::of(&std::fs::metadata(&p).unwrap());
        assert_eq!(a, FileSig::of(&std::fs::metadata(&p).unwrap()));
        std::fs::write(&p, b"two!").unwrap();
        let b = FileSig::of(&std::fs::metadata(&p).unwrap());
        assert_ne!(a, b);
        assert_eq!(b.size, 4);
        assert_eq!(FileSig::from_le_bytes(&b.to_le_bytes()), b);
    }

    #[test]
    fn a_raw_stat_gives_the_signature_std_gives() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        let raw = rustix::fs::stat(&p).unwrap();
        assert_eq!(
            FileSig::of_stat(&raw),
            FileSig::of(&std::fs::metadata(&p).unwrap())
        );
    }
}
