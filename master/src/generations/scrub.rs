//! Re-checking the generation store (docs/deploys.md#scrubbing-the-store):
//! every blob hashed again against the digest it is named by, every
//! manifest against its id. A blob rewritten in the store would be served
//! as is to stock agents' `file_content`; `pluginsync-master check --store`
//! finds it first, read-only: what is corrupt is named, never changed.
//! While the master serves, a background pass (`server/scrubber.rs`)
//! hashes one file at a time the same way and repairs what is corrupt:
//! a blob is copied again from a tree that still holds its bytes, else
//! the generations naming it are withdrawn from the store, as is the
//! generation of a corrupt manifest.

use std::io::Read;
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, Manifest};
use pluginsync_common::mutex::lock;

use super::{Generations, StoreError, digest_sizes};
use crate::walk::FileSig;

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

/// A file of the store a background pass hashes, by what names it.
#[derive(Debug, Clone)]
pub enum ScrubTarget {
    /// A blob and the digest its name says.
    Blob(PathBuf, Sha256),
    /// A manifest and the generation its name says.
    Manifest(PathBuf, GenerationId),
}

/// What a background pass did with a corrupt file.
#[derive(Debug)]
pub enum Repair {
    /// Sound again (hashed again under the store's lock, or another pass
    /// repaired it first): nothing done.
    Sound,
    /// The blob was copied again from this file of a tree.
    Copied(PathBuf),
    /// These generations were withdrawn from the store (never served
    /// again); the corrupt file went with the last one naming it.
    Withdrawn(Vec<(EnvName, GenerationId)>),
}

impl ScrubTarget {
    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            ScrubTarget::Blob(p, _) | ScrubTarget::Manifest(p, _) => p,
        }
    }

    /// Whether its bytes hash to its name: `Ok(None)` if so, else why
    /// not; an error when it cannot be read (gone: evicted meanwhile).
    pub fn check(&self) -> std::io::Result<Option<String>> {
        let want = match self {
            ScrubTarget::Blob(_, d) => *d,
            ScrubTarget::Manifest(_, id) => id.0,
        };
        let got = hash_file(self.path())?;
        Ok((got != want).then(|| format!("its bytes hash to {got}")))
    }
}

impl Generations {
    /// The blobs and manifests a background pass hashes, with their
    /// sizes; files whose name is no digest are the start's sweep's.
    pub fn scrub_targets(&self) -> Vec<(ScrubTarget, u64)> {
        let blobs = self.layout.blobs_on_disk().into_iter();
        let blobs = blobs.filter_map(|(p, d, n)| Some((ScrubTarget::Blob(p, d?), n)));
        let manifests = self.layout.manifests_on_disk().into_iter();
        let manifests = manifests.filter_map(|(p, id)| {
            let n = std::fs::symlink_metadata(&p).map_or(0, |m| m.len());
            Some((ScrubTarget::Manifest(p, id?), n))
        });
        blobs.chain(manifests).collect()
    }

    /// Repairs `target`, found corrupt, under the store's lock (no
    /// publication meanwhile): checked again first; a blob is copied again
    /// from `source` (an indexed file of a tree, hashed as it is copied)
    /// when there is one with its bytes, else every kept generation naming
    /// it is withdrawn; a manifest's generation is withdrawn.
    pub fn repair(
        &self,
        target: &ScrubTarget,
        source: Option<(PathBuf, FileSig)>,
    ) -> Result<Repair, StoreError> {
        let _one = lock(&self.publishing);
        match target.check() {
            Ok(None) => return Ok(Repair::Sound),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Repair::Sound),
            _ => {}
        }
        let named_by = |m: &Manifest, d: &Sha256| digest_sizes(m).iter().any(|(x, _)| x == d);
        let mut st = lock(&self.state);
        let mut victims: Vec<(EnvName, GenerationId)> = Vec::new();
        match target {
            ScrubTarget::Blob(_, digest) => {
                if let Some((path, sig)) = source {
                    let mut durable = pluginsync_common::fsutil::Durable::new();
                    let copied = self.layout.store_blob(digest, &path, sig, &mut durable);
                    if copied.and_then(|()| self.layout.sync(durable)).is_ok() {
                        return Ok(Repair::Copied(path));
                    }
                }
                for (env, g) in st
                    .envs
                    .iter()
                    .filter(|(_, g)| g.digests.contains_key(digest))
                {
                    for k in &g.kept {
                        let m = (self.layout.read_manifest(&k.id).ok())
                            .and_then(|b| Manifest::parse(&b, &k.id).ok());
                        // An unreadable manifest: its generation goes too.
                        if m.is_none_or(|m| named_by(&m, digest)) {
                            victims.push((env.clone(), k.id));
                        }
                    }
                }
            }
            ScrubTarget::Manifest(_, id) => {
                for (env, g) in &st.envs {
                    victims.extend(
                        g.kept
                            .iter()
                            .filter(|k| k.id == *id)
                            .map(|k| (env.clone(), k.id)),
                    );
                }
            }
        }
        self.withdraw(&mut st, &victims)?;
        if let ScrubTarget::Blob(path, d) = target {
            // Named by no kept generation now (one whose manifest was
            // unreadable kept its references): never served corrupt.
            let _ = std::fs::remove_file(path);
            st.blobs.remove(d);
            for g in st.envs.values_mut() {
                g.digests.remove(d);
            }
        }
        Ok(Repair::Withdrawn(victims))
    }

    /// Removes `victims` from their environments' records and deletes
    /// what no kept generation names any more, as eviction does.
    fn withdraw(
        &self,
        st: &mut super::State,
        victims: &[(EnvName, GenerationId)],
    ) -> Result<(), StoreError> {
        let mut touched: Vec<EnvName> = victims.iter().map(|(e, _)| e.clone()).collect();
        touched.dedup();
        for (env, id) in victims {
            self.remove(st, env, id);
        }
        for e in &touched {
            let kept = st.envs.get(e).map(|g| g.kept.clone()).unwrap_or_default();
            self.layout.write_record(e, &kept)?;
        }
        self.delete_unreferenced(st);
        Ok(())
    }

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
