//! An index's generation: its manifest (the entries of the standard
//! listings, docs/protocol.md §7.6) and where each of its files is read
//! from; and whether the tree the index was built from was one tree
//! (docs/deploys.md#consistent-builds).

use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{
    EntryKind, GenerationId, Manifest, ManifestEntry, ManifestError,
};
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{FileType, Links};
use pluginsync_common::relpath::RelPath;

use crate::index::{EnvIndex, Mount, StoredBlobs};
use crate::walk::{FileSig, View};

use super::{Generations, Source, State, StoreError, lock};

/// A generation made from an index, not yet published.
pub struct Candidate<'a> {
    /// The canonical manifest's bytes.
    pub bytes: Vec<u8>,
    /// Its id.
    pub id: GenerationId,
    /// The manifest.
    pub manifest: Manifest,
    /// Where each digest's file is read from.
    pub source: Box<Source<'a>>,
    /// The index it was made from: stored beside it for the v3 answers
    /// (docs/rollouts.md#stock-puppet-agents).
    pub index: Option<&'a EnvIndex>,
    /// The deploy's label, if the environment has one ([`deploy_label`]).
    pub label: Option<String>,
}

impl std::fmt::Debug for Candidate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Candidate({})", self.id.short())
    }
}

impl<'a> Candidate<'a> {
    /// The generation of `idx`.
    pub fn of(idx: &'a EnvIndex) -> Result<Candidate<'a>, ManifestError> {
        let manifest = manifest_of(idx)?;
        let (bytes, id) = manifest.encode();
        Ok(Candidate {
            bytes,
            id,
            manifest,
            source: Box::new(move |d: &Sha256| -> Option<(PathBuf, FileSig)> {
                let (root, node) = idx.blob(d)?;
                Some((node.real_path(&root.canon).into_owned(), node.sig?))
            }),
            index: Some(idx),
            label: deploy_label(&idx.dir),
        })
    }
}

/// The label of the deploy of the environment at `dir`: the `signature`
/// r10k 3 writes in `.r10k-deploy.json` (the commit of a git
/// environment), at most 64 printable ASCII characters; `None` without
/// one (docs/operating.md#the-fleet).
pub fn deploy_label(dir: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut text = Vec::new();
    let file = std::fs::File::open(dir.join(".r10k-deploy.json")).ok()?;
    file.take(4 << 20).read_to_end(&mut text).ok()?;
    let info: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let signature = info.get("signature")?.as_str()?;
    let fits =
        (1..=64).contains(&signature.len()) && signature.bytes().all(|b| b.is_ascii_graphic());
    fits.then(|| signature.to_owned())
}

fn entry(
    mount: Mount,
    rel: &RelPath,
    view: &View,
    sha: Option<(Sha256, u64)>,
) -> Option<ManifestEntry> {
    let kind = match (view.kind, sha) {
        (FileType::Directory, _) => EntryKind::Directory,
        (FileType::File, Some((sha256, size))) => EntryKind::File { sha256, size },
        (FileType::Link, _) => EntryKind::Link {
            target: view.destination.clone()?,
        },
        // A file whose content is not served (Puppet lists it with a null
        // checksum), or neither file, directory nor link: no agent can
        // write it.
        (FileType::File, None) | (FileType::Other, _) => return None,
    };
    Some(ManifestEntry {
        mount,
        path: rel.clone(),
        mode: view.mode & 0o7777,
        kind,
    })
}

/// The manifest of `idx`: for each mount, the entries of the standard
/// listing (recursive, `links=follow`, Puppet's default ignores) with
/// their type, mode, and digest and size or link target.
pub fn manifest_of(idx: &EnvIndex) -> Result<Manifest, ManifestError> {
    let ignore = IgnoreSet::new(&pluginsync_common::DEFAULT_IGNORE)
        .map_err(|e| ManifestError::Malformed(e.to_string()))?;
    let mut entries = Vec::new();
    for mount in Mount::ALL {
        let m = idx.mount(mount);
        if m.roots.is_empty() {
            let (_, view) = &m.fallback;
            entries.extend(entry(mount, &RelPath::root(), view, None));
            continue;
        }
        for loc in m.merge(Links::Follow, &ignore, None, None) {
            let node = m.node(loc);
            let Some(view) = node.follow.as_ref() else {
                continue;
            };
            let sha = node.sha256.zip(node.sig.map(|s| s.size));
            entries.extend(entry(mount, &node.rel, view, sha));
        }
    }
    Manifest::new(entries)
}

/// Whether `idx` was built from one tree: the environment directory
/// resolved to `before` when the build started and still does, and every
/// module root (walked, or refused as outside the code tree) still
/// resolves to the real path the walk saw. A Code Manager flip during the
/// walk gives roots of another release, or roots "outside the code tree",
/// even when the link points back by the end
/// (docs/deploys.md#consistent-builds).
pub fn consistent(idx: &EnvIndex, before: &Path) -> bool {
    let after = std::fs::canonicalize(&idx.dir).ok();
    if after.as_deref() != Some(before) {
        return false;
    }
    idx.mounts.iter().all(|m| {
        let roots = m
            .roots
            .iter()
            .map(|r| (Path::new(&r.dir), r.canon.as_path()));
        let outside = m
            .outside
            .iter()
            .map(|o| (o.path.as_path(), o.real.as_path()));
        roots
            .chain(outside)
            .all(|(dir, real)| std::fs::canonicalize(dir).is_ok_and(|now| now == real))
    })
}

/// The indexes stored beside the generations, as the store counts them
/// (docs/rollouts.md#stock-puppet-agents).
#[derive(Debug, Default)]
pub(super) struct StoredIndexes {
    /// (Environment, generation) → the size of its stored index.
    sizes: std::collections::HashMap<(EnvName, GenerationId), u64>,
    /// Of generations evicted: deleted at the end of the publication.
    unlinked: Vec<(EnvName, GenerationId)>,
    /// Their bytes: with the blobs' and manifests', under `max_mib`.
    pub(super) bytes: u64,
}

impl StoredIndexes {
    /// Generation `id` of `env` is evicted: its index goes with it.
    pub(super) fn forget(&mut self, env: &EnvName, id: &GenerationId) {
        let key = (env.clone(), *id);
        if let Some(size) = self.sizes.remove(&key) {
            self.bytes = self.bytes.saturating_sub(size);
            self.unlinked.push(key);
        }
    }
}

/// The index each generation was made from, kept beside it
/// (docs/rollouts.md#stock-puppet-agents).
impl Generations {
    /// Deletes the stored indexes of the generations evicted.
    pub(super) fn unlink_indexes(&self, st: &mut State) {
        for (env, id) in std::mem::take(&mut st.indexes.unlinked) {
            let _ = std::fs::remove_file(self.layout.index(&env, &id));
        }
    }

    /// Counts the stored indexes of the kept generations (at start).
    pub(super) fn load_indexes(&self, st: &mut State) {
        for (_, key, size) in self.layout.indexes_on_disk() {
            if let Some((env, id)) = key
                && st
                    .envs
                    .get(&env)
                    .is_some_and(|g| g.kept.iter().any(|k| k.id == id))
            {
                st.indexes.sizes.insert((env, id), size);
                st.indexes.bytes += size;
            }
        }
    }

    /// Removes the stored indexes of generations not kept.
    pub(super) fn sweep_indexes(&self, st: &State) {
        for (path, key, _) in self.layout.indexes_on_disk() {
            if !key.is_some_and(|k| st.indexes.sizes.contains_key(&k)) {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Stores the index `candidate` was made from beside generation `id`
    /// of `env`, unless there, and counts its bytes.
    pub(super) fn keep_index(
        &self,
        env: &EnvName,
        candidate: &Candidate,
    ) -> Result<(), StoreError> {
        let key = (env.clone(), candidate.id);
        let Some(idx) = candidate.index else {
            return Ok(());
        };
        if lock(&self.state).indexes.sizes.contains_key(&key) {
            return Ok(());
        }
        let bytes = idx.record();
        self.layout.store_index(env, &candidate.id, &bytes)?;
        let mut st = lock(&self.state);
        st.indexes.unlinked.retain(|k| *k != key);
        if st.indexes.sizes.insert(key, bytes.len() as u64).is_none() {
            st.indexes.bytes += bytes.len() as u64;
        }
        Ok(())
    }

    /// Bytes of the indexes stored beside the generations.
    pub fn index_bytes(&self) -> u64 {
        lock(&self.state).indexes.bytes
    }

    /// Where an index made back from the store reads its files: the blobs.
    pub fn stored_blobs(&self) -> StoredBlobs {
        let layout = self.layout.clone();
        StoredBlobs(std::sync::Arc::new(move |d: &Sha256| layout.blob(d)))
    }

    /// The index generation `id` of `env` was made from, as stored
    /// ([`crate::index::EnvIndex::record`]), if `env` keeps `id` and it
    /// was stored.
    pub fn index_record(
        &self,
        env: &EnvName,
        id: &GenerationId,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let kept = self.kept(env).into_iter().any(|k| k.id == *id);
        let path = self.layout.index(env, id);
        match std::fs::read(&path) {
            Ok(b) => Ok(kept.then_some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }
}
