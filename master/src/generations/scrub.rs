//! Re-checking the generation store (docs/deploys.md#scrubbing-the-store):
//! every blob hashed again against the digest it is named by, every
//! manifest against its id. A blob rewritten in the store would be served
//! as is to stock agents' `file_content`; `pluginsync-master check --store`
//! finds it first. Read-only: what is corrupt is named, never changed.

use std::io::Read;
use std::path::PathBuf;

use pluginsync_common::digest::Sha256;
use pluginsync_common::generation::GenerationId;

use super::Generations;

/// What a scrub of the store found.
#[derive(Debug, Default)]
pub struct Scrubbed {
    /// Blobs hashed.
    pub blobs: usize,
    /// Manifests hashed.
    pub manifests: usize,
    /// Files whose bytes are not what their name says (or that cannot be
    /// read), with why.
    pub corrupt: Vec<(PathBuf, String)>,
}

/// The sha256 of the file at `path`, read in blocks.
fn hash_file(path: &std::path::Path) -> std::io::Result<Sha256> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(Sha256(hasher.finalize().into())),
            n => hasher.update(&buf[..n]),
        }
    }
}

impl Generations {
    /// Hashes every blob and manifest of the store again.
    pub fn scrub(&self) -> Scrubbed {
        let mut out = Scrubbed::default();
        let mut check = |path: PathBuf, want: Option<Sha256>| {
            let why = match (want, hash_file(&path)) {
                (None, _) => Some("its name is not a sha256".to_owned()),
                (_, Err(e)) => Some(format!("cannot be read: {e}")),
                (Some(w), Ok(got)) if got != w => Some(format!("its bytes hash to {got}")),
                _ => None,
            };
            if let Some(why) = why {
                out.corrupt.push((path, why));
            }
        };
        let blobs = self.layout.blobs_on_disk();
        for (path, digest, _) in blobs.iter().cloned() {
            check(path, digest);
        }
        let manifests = self.layout.manifests_on_disk();
        for (path, id) in manifests.iter().cloned() {
            check(path, id.map(|i: GenerationId| i.0));
        }
        (out.blobs, out.manifests) = (blobs.len(), manifests.len());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generations::limits::Limits;

    /// A blob rewritten in place and a manifest flipped are found and
    /// named; the others pass.
    #[test]
    fn a_rewritten_blob_or_manifest_is_found() {
        let t = tempfile::tempdir().unwrap();
        let config = Limits {
            dir: Some(t.path().join("store")),
            ..Limits::default()
        };
        let g = Generations::new(&config);
        g.layout.create().unwrap();
        let good = Sha256::of(b"good");
        let bad = Sha256::of(b"bad");
        for (d, content) in [(good, &b"good"[..]), (bad, b"rewritten")] {
            let p = g.layout.blob(&d);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
        }
        let id = GenerationId::of(b"m");
        g.layout.store_manifest(&id, b"m").unwrap();
        let s = g.scrub();
        assert_eq!((s.blobs, s.manifests), (2, 1));
        assert_eq!(s.corrupt.len(), 1, "{:?}", s.corrupt);
        assert_eq!(s.corrupt[0].0, g.layout.blob(&bad));
        std::fs::remove_file(g.layout.manifest(&id)).unwrap();
        std::fs::write(g.layout.manifest(&id), b"n").unwrap();
        assert_eq!(g.scrub().corrupt.len(), 2);
    }
}
