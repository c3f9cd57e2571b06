//! Generations kept on local disk (docs/deploys.md#generations,
//! docs/protocol.md §7.6): each environment's last `[generations] keep`
//! published generations, their manifests and the content of their files,
//! in a content-addressed store that survives a restart and outlives the
//! trees it was copied from.
//!
//! [`Generations::publish`] is called by the store before an index is
//! published: every blob the manifest names is copied in first (only those
//! not already there: the copy costs one read per changed file), then the
//! manifest, then the environment's record; only then is the index served.
//! Eviction is oldest first, by count per environment and by bytes across
//! the store, never an environment's current generation; a blob no kept
//! generation names any more is removed (reference counts, rebuilt from the
//! manifests on disk when the master starts).
//!
//! Memory stays small whatever `keep` is: only each environment's record
//! (id, time, totals) and the digests its kept generations name are held;
//! manifests are read from disk when asked for.
//!
//! | file | answers |
//! |---|---|
//! | `mod.rs` | [`Generations`]: publish, evict, look up; the in-memory references. |
//! | `disk.rs` | Where each file lives; durable writes; records read back. |
//! | `of_index.rs` | An index's manifest; was its tree consistent; the index kept beside its generation. |
//! | `stamp.rs` | [`Stamp`]: a publication time, parsed where it is read. |

mod disk;
mod limits;
mod of_index;
mod scrub;
mod stamp;

pub use scrub::{Repair, ScrubTarget, Scrubbed};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, Manifest};
use pluginsync_common::mutex::lock;

use crate::walk::FileSig;

use self::disk::Layout;
pub use self::disk::StoreError;
pub use self::limits::Limits;
pub use self::of_index::{Candidate, consistent, manifest_of};
pub use self::stamp::{BadStamp, Stamp};

/// One kept generation of an environment, as its record holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kept {
    /// The generation.
    pub id: GenerationId,
    /// When this master published it (RFC 3339, UTC, in the record).
    pub published: Stamp,
    /// Regular files in it.
    pub files: u64,
    /// Their bytes in all.
    pub bytes: u64,
    /// Its deploy's label where the tree had one at publication: r10k's
    /// `.r10k-deploy.json` `signature` (the control repository's commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// What [`Generations::publish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// A new generation, now the environment's current one.
    New(Kept),
    /// The tree is the current generation: nothing new.
    Unchanged(Kept),
}

/// One environment's kept generations (oldest first; the last is the
/// current one) and how many of them name each digest.
#[derive(Debug, Default)]
struct EnvGens {
    kept: Vec<Kept>,
    digests: HashMap<Sha256, u32>,
}

/// The references that decide what the store may delete.
#[derive(Debug, Default)]
struct State {
    loaded: bool,
    envs: BTreeMap<EnvName, EnvGens>,
    /// Digest → (environments naming it, its size).
    blobs: HashMap<Sha256, (u32, u64)>,
    /// Generation → (environment records keeping it, manifest size).
    manifests: HashMap<GenerationId, (u32, u64)>,
    /// The indexes stored beside the generations.
    indexes: of_index::StoredIndexes,
    /// Bytes of the blobs and manifests referenced (an entry at 0 is
    /// deleted at the end of the publication that dropped it).
    bytes: u64,
}

/// The kept generations of every environment and their store. See the
/// module docs.
#[derive(Debug)]
pub struct Generations {
    layout: Layout,
    /// True for the temporary directory used when `dir` is unset: removed
    /// with the store.
    temporary: bool,
    /// That directory, made by `tempfile` under a name of its own, mode
    /// 0700: a name made of the process id alone was a path another user
    /// could make first (and a killed master's leftover, found again by a
    /// later process with the same id, stopped its start).
    _temporary_dir: Option<tempfile::TempDir>,
    /// Why that directory could not be made: [`Generations::open`] says it.
    unmade: Option<(std::io::ErrorKind, String)>,
    keep: usize,
    max_bytes: u64,
    /// One publication at a time: a blob found present stays present
    /// until its generation is recorded.
    publishing: Mutex<()>,
    state: Mutex<State>,
    /// The last [`DELTAS_KEPT`] deltas served, newest last: after a change
    /// every node asks for the same one (docs/protocol.md §7.6).
    deltas: Mutex<Vec<KeptDelta>>,
    /// Generations evicted since start.
    pub evictions: AtomicU64,
    /// Publications the store failed since start.
    pub errors: AtomicU64,
    /// Bytes re-hashed by background scrubs since start.
    pub scrubbed_bytes: AtomicU64,
    /// Corrupt blobs and manifests background scrubs found since start.
    pub corrupt: AtomicU64,
}

/// A computed delta: from, to, its bytes.
type KeptDelta = (GenerationId, GenerationId, std::sync::Arc<[u8]>);

/// Deltas kept computed ([`Generations::delta`]): a change's, and those
/// of nodes a few generations behind.
const DELTAS_KEPT: usize = 8;

/// `(digest, size)` of each distinct file content of `m`, by digest.
pub fn digest_sizes(m: &Manifest) -> Vec<(Sha256, u64)> {
    use pluginsync_common::generation::EntryKind;
    let mut v: Vec<(Sha256, u64)> = m
        .entries()
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { sha256, size } => Some((sha256, size)),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v.dedup_by_key(|(d, _)| *d);
    v
}

impl Generations {
    /// The store `config` describes: a configured directory is neither
    /// read nor created before the first use ([`Generations::open`]);
    /// without one, a private temporary directory is made now.
    pub fn new(config: &Limits) -> Generations {
        let temporary_dir = || {
            use std::os::unix::fs::PermissionsExt;
            tempfile::Builder::new()
                .prefix("pluginsync-generations-")
                .permissions(std::fs::Permissions::from_mode(0o700))
                .tempdir()
        };
        let (root, temporary, made, unmade) = match &config.dir {
            Some(d) => (d.clone(), false, None, None),
            None => match temporary_dir() {
                Ok(t) => (t.path().to_owned(), true, Some(t), None),
                Err(e) => {
                    let why = (e.kind(), e.to_string());
                    (std::env::temp_dir(), false, None, Some(why))
                }
            },
        };
        Generations {
            layout: Layout::new(root, !temporary),
            temporary,
            _temporary_dir: made,
            unmade,
            keep: config.keep.max(1),
            max_bytes: config.max_mib.saturating_mul(1 << 20),
            publishing: Mutex::new(()),
            state: Mutex::new(State::default()),
            deltas: Mutex::new(Vec::new()),
            evictions: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            scrubbed_bytes: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        self.layout.root()
    }

    /// Creates the store's directories and reads what it keeps, once;
    /// with `sweep`, removes what no kept generation names (files a killed
    /// master left). `serve` calls it before listening, so a store it
    /// cannot write stops the start with one line.
    pub fn open(&self, sweep: bool) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        if st.loaded {
            return Ok(());
        }
        if let Some((kind, why)) = &self.unmade {
            return Err(StoreError::Io {
                path: self.layout.root().to_owned(),
                source: std::io::Error::new(*kind, why.clone()),
            });
        }
        if sweep {
            self.layout.create()?;
        }
        self.load(&mut st);
        if sweep {
            self.sweep_unreferenced(&st);
        }
        st.loaded = true;
        Ok(())
    }

    /// Reads every environment record and the manifests they keep; a
    /// generation whose manifest or blobs are missing or corrupt is
    /// dropped from its record (logged).
    fn load(&self, st: &mut State) {
        let present: HashMap<Sha256, u64> = self
            .layout
            .blobs_on_disk()
            .into_iter()
            .filter_map(|(_, d, size)| Some((d?, size)))
            .collect();
        for record in self.layout.read_records() {
            let (env, kept) = match record {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "generation store: record not read");
                    continue;
                }
            };
            for k in kept {
                match self.complete(&k.id, &present) {
                    Ok((manifest, size)) => add_refs(st, &env, k, &manifest, size),
                    Err(e) => {
                        tracing::error!(env = %env, generation = %k.id.short(), error = %e, "generation store: kept generation dropped")
                    }
                }
            }
        }
        self.load_indexes(st);
    }

    /// Publishes `candidate` as `env`'s current generation: its blobs
    /// copied in (those not there yet), its manifest, its record, then
    /// eviction (`on_disk` says which environments still exist: the
    /// current generation of one that does not is evicted like any other
    /// by the byte bound). See the module docs.
    pub fn publish(
        &self,
        env: &EnvName,
        candidate: &Candidate,
        on_disk: &dyn Fn(&EnvName) -> bool,
    ) -> Result<Published, StoreError> {
        let _one = lock(&self.publishing);
        self.open(true)?;
        if let Some(cur) = self.current(env).filter(|k| k.id == candidate.id) {
            // A store from before indexes were kept gets the current one.
            self.keep_index(env, candidate)?;
            return Ok(Published::Unchanged(cur));
        }
        let sizes = digest_sizes(&candidate.manifest);
        let mut durable = pluginsync_common::fsutil::Durable::new();
        for (digest, _) in &sizes {
            if lock(&self.state).blobs.contains_key(digest) {
                continue;
            }
            let (path, sig) = (candidate.source)(digest).ok_or(StoreError::NoSource(*digest))?;
            self.layout.store_blob(digest, &path, sig, &mut durable)?;
        }
        // Every blob durable before the manifest and record name them.
        self.layout.sync(durable)?;
        self.layout
            .store_manifest(&candidate.id, &candidate.bytes)?;
        self.keep_index(env, candidate)?;
        let (files, bytes) = candidate.manifest.totals();
        let kept = Kept {
            id: candidate.id,
            published: Stamp::now(),
            files,
            bytes,
            label: candidate.label.clone(),
        };
        let mut st = lock(&self.state);
        let again = st
            .envs
            .get(env)
            .and_then(|g| g.kept.iter().position(|k| k.id == candidate.id));
        match again {
            // Published before and still kept (a revert): it moves to the
            // end, its references unchanged.
            Some(i) => {
                let g = st.envs.get_mut(env).expect("found above");
                g.kept.remove(i);
                g.kept.push(kept.clone());
            }
            None => add_refs(
                &mut st,
                env,
                kept.clone(),
                &candidate.manifest,
                candidate.bytes.len() as u64,
            ),
        }
        let mut touched = vec![env.clone()];
        touched.extend(self.evict(&mut st, on_disk));
        touched.sort();
        touched.dedup();
        for e in &touched {
            let kept = st.envs.get(e).map(|g| g.kept.clone()).unwrap_or_default();
            self.layout.write_record(e, &kept)?;
        }
        self.delete_unreferenced(&mut st);
        Ok(Published::New(kept))
    }

    /// Evicts by count per environment, then by bytes (oldest first,
    /// never a current generation); returns the environments touched.
    fn evict(&self, st: &mut State, on_disk: &dyn Fn(&EnvName) -> bool) -> Vec<EnvName> {
        let mut victims: Vec<(EnvName, GenerationId)> = Vec::new();
        for (env, g) in &st.envs {
            let over = g.kept.len().saturating_sub(self.keep);
            victims.extend(g.kept[..over].iter().map(|k| (env.clone(), k.id)));
        }
        let mut touched = Vec::new();
        for (env, id) in victims {
            self.remove(st, &env, &id);
            touched.push(env);
        }
        while st.bytes + st.indexes.bytes > self.max_bytes {
            let oldest = st
                .envs
                .iter()
                .filter_map(|(env, g)| {
                    let k = g
                        .kept
                        .first()
                        .filter(|_| g.kept.len() > 1 || !on_disk(env))?;
                    Some((k.published, env.clone(), k.id))
                })
                .min();
            let Some((_, env, id)) = oldest else {
                tracing::warn!(
                    bytes = st.bytes,
                    max_bytes = self.max_bytes,
                    "generation store over generations.max_mib with only current generations left"
                );
                break;
            };
            self.remove(st, &env, &id);
            touched.push(env);
        }
        touched
    }

    /// Forgets `env`'s generation `id` and drops its references (the
    /// manifest read back from disk for its digests).
    fn remove(&self, st: &mut State, env: &EnvName, id: &GenerationId) {
        let Some(g) = st.envs.get_mut(env) else {
            return;
        };
        let Some(i) = g.kept.iter().position(|k| k.id == *id) else {
            return;
        };
        g.kept.remove(i);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(env = %env, generation = %id.short(), "generation evicted");
        let manifest = self
            .layout
            .read_manifest(id)
            .ok()
            .and_then(|b| Manifest::parse(&b, id).ok());
        let mut dropped = Vec::new();
        if let Some(m) = manifest {
            for (d, _) in digest_sizes(&m) {
                if let Some(n) = g.digests.get_mut(&d) {
                    *n -= 1;
                    if *n == 0 {
                        g.digests.remove(&d);
                        dropped.push(d);
                    }
                }
            }
        }
        // Bytes count what is referenced: an entry at 0 is deleted at the
        // end of the publication, after the records are written.
        for d in dropped {
            if let Some(b) = st.blobs.get_mut(&d) {
                b.0 = b.0.saturating_sub(1);
                if b.0 == 0 {
                    st.bytes = st.bytes.saturating_sub(b.1);
                }
            }
        }
        if let Some(m) = st.manifests.get_mut(id) {
            m.0 = m.0.saturating_sub(1);
            if m.0 == 0 {
                st.bytes = st.bytes.saturating_sub(m.1);
            }
        }
        st.indexes.forget(env, id);
    }

    /// Deletes the blobs and manifests nothing references any more.
    fn delete_unreferenced(&self, st: &mut State) {
        let blobs: Vec<Sha256> = st
            .blobs
            .iter()
            .filter(|(_, (n, _))| *n == 0)
            .map(|(d, _)| *d)
            .collect();
        for d in blobs {
            st.blobs.remove(&d);
            let _ = std::fs::remove_file(self.layout.blob(&d));
        }
        let manifests: Vec<GenerationId> = st
            .manifests
            .iter()
            .filter(|(_, (n, _))| *n == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in manifests {
            st.manifests.remove(&id);
            let _ = std::fs::remove_file(self.layout.manifest(&id));
        }
        self.unlink_indexes(st);
        st.envs.retain(|_, g| !g.kept.is_empty());
    }

    /// `env`'s current generation.
    pub fn current(&self, env: &EnvName) -> Option<Kept> {
        lock(&self.state)
            .envs
            .get(env)
            .and_then(|g| g.kept.last().cloned())
    }

    /// `env`'s kept generations, newest first.
    pub fn kept(&self, env: &EnvName) -> Vec<Kept> {
        lock(&self.state)
            .envs
            .get(env)
            .map(|g| g.kept.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// Every environment with kept generations, and how many.
    pub fn counts(&self) -> Vec<(EnvName, usize)> {
        lock(&self.state)
            .envs
            .iter()
            .map(|(e, g)| (e.clone(), g.kept.len()))
            .collect()
    }

    /// Bytes of blobs and manifests in the store.
    pub fn bytes(&self) -> u64 {
        lock(&self.state).bytes
    }

    /// The canonical manifest of `id` if `env` keeps it.
    pub fn manifest(
        &self,
        env: &EnvName,
        id: &GenerationId,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.kept(env).iter().any(|k| k.id == *id) {
            return Ok(None);
        }
        self.layout.read_manifest(id).map(Some)
    }

    /// The delta from `since` to `id` (docs/protocol.md §7.6), if `env`
    /// keeps both. Computed once for the fleet: the last [`DELTAS_KEPT`]
    /// are kept (ids name contents, so a kept delta is never stale).
    pub fn delta(
        &self,
        env: &EnvName,
        since: &GenerationId,
        id: &GenerationId,
    ) -> Result<Option<std::sync::Arc<[u8]>>, StoreError> {
        let kept = self.kept(env);
        if !(kept.iter().any(|k| k.id == *since) && kept.iter().any(|k| k.id == *id)) {
            return Ok(None);
        }
        if let Some((_, _, d)) = lock(&self.deltas)
            .iter()
            .find(|(s, t, _)| s == since && t == id)
        {
            return Ok(Some(d.clone()));
        }
        let (Some(base), Some(target)) = (self.manifest(env, since)?, self.manifest(env, id)?)
        else {
            return Ok(None);
        };
        let parse = |b: &[u8], id: &GenerationId| {
            Manifest::parse(b, id).map_err(|e| StoreError::Manifest(*id, e))
        };
        let (base, target) = (parse(&base, since)?, parse(&target, id)?);
        let bytes: std::sync::Arc<[u8]> = base.diff(*since, &target, *id).to_bytes().into();
        let mut deltas = lock(&self.deltas);
        if deltas.len() >= DELTAS_KEPT {
            deltas.remove(0);
        }
        deltas.push((*since, *id, bytes.clone()));
        Ok(Some(bytes))
    }

    /// The stored content of `digest` and its size, if a generation of an
    /// environment `may_read` allows keeps it.
    pub fn blob(&self, digest: &Sha256, may_read: impl Fn(&str) -> bool) -> Option<(PathBuf, u64)> {
        let st = lock(&self.state);
        let &(_, size) = st.blobs.get(digest)?;
        st.envs
            .iter()
            .any(|(e, g)| g.digests.contains_key(digest) && may_read(e.as_str()))
            .then(|| (self.layout.blob(digest), size))
    }

    /// The kept generation of `env` whose id starts with `prefix` (hex),
    /// if exactly one does.
    pub fn find(&self, env: &EnvName, prefix: &str) -> Result<Kept, Vec<Kept>> {
        let matching: Vec<Kept> = self
            .kept(env)
            .into_iter()
            .filter(|k| k.id.to_hex().starts_with(&prefix.to_ascii_lowercase()))
            .collect();
        match <[Kept; 1]>::try_from(matching) {
            Ok([one]) => Ok(one),
            Err(v) => Err(v),
        }
    }

    /// The path of the stored blob `digest` (whether or not it is there).
    pub fn blob_path(&self, digest: &Sha256) -> PathBuf {
        self.layout.blob(digest)
    }
}

/// Adds `env`'s new kept generation `kept` (manifest `m`, `size` bytes)
/// and its references.
fn add_refs(st: &mut State, env: &EnvName, kept: Kept, m: &Manifest, size: u64) {
    let mref = st.manifests.entry(kept.id).or_insert((0, size));
    if mref.0 == 0 {
        st.bytes += size;
    }
    mref.0 += 1;
    let g = st.envs.entry(env.clone()).or_default();
    g.kept.push(kept);
    let mut new_for_env = Vec::new();
    for (d, s) in digest_sizes(m) {
        let n = g.digests.entry(d).or_insert(0);
        *n += 1;
        if *n == 1 {
            new_for_env.push((d, s));
        }
    }
    for (d, s) in new_for_env {
        let b = st.blobs.entry(d).or_insert((0, s));
        if b.0 == 0 {
            st.bytes += s;
        }
        b.0 += 1;
    }
}

impl Drop for Generations {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(self.layout.root());
        }
    }
}

/// Where a file of a candidate generation is read from: its real path and
/// the stat the index vouched for.
pub type Source<'a> = dyn Fn(&Sha256) -> Option<(PathBuf, FileSig)> + 'a;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use pluginsync_common::digest::Sha256;
    use pluginsync_common::generation::{EntryKind, Manifest, ManifestEntry};
    use pluginsync_common::protocol::Mount;
    use pluginsync_common::relpath::RelPath;

    use super::*;

    /// Files written under `src`, and the candidate generation of them
    /// (all in `plugins`).
    fn candidate(src: &Path, files: &[(&str, &[u8])]) -> Candidate<'static> {
        let mut entries: Vec<ManifestEntry> = Mount::ALL
            .into_iter()
            .map(|mount| ManifestEntry {
                mount,
                path: RelPath::root(),
                mode: 0o755,
                kind: EntryKind::Directory,
            })
            .collect();
        let mut sources: HashMap<Sha256, (PathBuf, FileSig)> = HashMap::new();
        for (name, body) in files {
            let path = src.join(Sha256::of(body).to_hex());
            if !path.exists() {
                std::fs::write(&path, body).unwrap();
            }
            let sig = crate::walk::sig_of(&std::fs::metadata(&path).unwrap());
            sources.insert(Sha256::of(body), (path, sig));
            entries.push(ManifestEntry {
                mount: Mount::Plugins,
                path: RelPath::parse(name).unwrap(),
                mode: 0o644,
                kind: EntryKind::File {
                    sha256: Sha256::of(body),
                    size: body.len() as u64,
                },
            });
        }
        let manifest = Manifest::new(entries).unwrap();
        let (bytes, id) = manifest.encode();
        Candidate {
            bytes,
            id,
            manifest,
            source: Box::new(move |d| sources.get(d).cloned()),
            index: None,
            label: None,
        }
    }

    /// A blob rewritten in the store is copied again from a source with
    /// its bytes, else every generation naming it is withdrawn and it is
    /// never served again; a corrupt manifest withdraws its generation
    /// (docs/deploys.md#scrubbing-the-store).
    #[test]
    fn a_scrub_repairs_a_blob_or_withdraws_the_generations_that_need_it() {
        use super::scrub::{Repair, ScrubTarget};
        use std::os::unix::fs::PermissionsExt;
        let rewrite = |p: &Path| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o640)).unwrap();
            std::fs::write(p, b"evil").unwrap();
        };
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let env: EnvName = "production".parse().unwrap();
        let g = store(dir.path(), 5, 2048);
        let one = candidate(src.path(), &[("a.rb", b"a\n"), ("b.rb", b"b1\n")]);
        let two = candidate(src.path(), &[("a.rb", b"a\n"), ("b.rb", b"b2\n")]);
        g.publish(&env, &one, &|_| true).unwrap();
        g.publish(&env, &two, &|_| true).unwrap();
        let blob = |b: &[u8]| ScrubTarget::Blob(g.layout.blob(&Sha256::of(b)), Sha256::of(b));
        let a = blob(b"a\n");
        rewrite(a.path());
        assert!(a.check().unwrap().is_some());
        let source = (one.source)(&Sha256::of(b"a\n"));
        assert!(matches!(g.repair(&a, source).unwrap(), Repair::Copied(_)));
        assert_eq!(a.check().unwrap(), None);
        let b1 = blob(b"b1\n");
        rewrite(b1.path());
        let done = g.repair(&b1, None).unwrap();
        assert!(
            matches!(&done, Repair::Withdrawn(v) if *v == [(env.clone(), one.id)]),
            "{done:?}"
        );
        let ids = |g: &Generations| g.kept(&env).iter().map(|k| k.id).collect::<Vec<_>>();
        assert_eq!(ids(&g), [two.id]);
        assert!(!b1.path().exists());
        assert!(g.blob(&Sha256::of(b"b1\n"), |_| true).is_none());
        assert!(g.blob(&Sha256::of(b"a\n"), |_| true).is_some());
        let m = ScrubTarget::Manifest(g.layout.manifest(&two.id), two.id);
        rewrite(m.path());
        let done = g.repair(&m, None).unwrap();
        assert!(
            matches!(&done, Repair::Withdrawn(v) if *v == [(env.clone(), two.id)]),
            "{done:?}"
        );
        assert!(ids(&g).is_empty());
    }

    #[test]
    fn a_store_without_a_directory_gets_a_private_one_of_its_own_removed_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (
            Generations::new(&Limits::default()),
            Generations::new(&Limits::default()),
        );
        assert_ne!(a.dir(), b.dir());
        a.open(true).unwrap();
        let root = a.dir().to_owned();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", root.display());
        drop(a);
        assert!(!root.exists(), "{}", root.display());
    }

    fn store(dir: &Path, keep: usize, max_mib: u64) -> Generations {
        let g = Generations::new(&Limits {
            keep,
            dir: Some(dir.to_owned()),
            max_mib,
            ..Limits::default()
        });
        g.open(true).unwrap();
        g
    }

    fn blobs_on_disk(g: &Generations) -> Vec<Sha256> {
        let mut v: Vec<Sha256> = g
            .layout
            .blobs_on_disk()
            .into_iter()
            .filter_map(|(_, d, _)| d)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_delta_is_computed_once_applies_to_its_target_and_goes_with_an_evicted_side() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let env: EnvName = "production".parse().unwrap();
        let g = store(dir.path(), 2, 2048);
        let gens: Vec<Candidate> = (0..3u8)
            .map(|i| {
                candidate(
                    src.path(),
                    &[("a.rb", b"same\n"), ("b.rb", &[b'0' + i; 10])],
                )
            })
            .collect();
        g.publish(&env, &gens[0], &|_| true).unwrap();
        g.publish(&env, &gens[1], &|_| true).unwrap();
        let (from, to) = (gens[0].id, gens[1].id);
        let d = g.delta(&env, &from, &to).unwrap().expect("both kept");
        let (_, bytes) = pluginsync_common::generation::ManifestDelta::parse(&d)
            .unwrap()
            .apply(&gens[0].manifest, from)
            .unwrap();
        assert_eq!(bytes, gens[1].bytes, "the delta leads to its target");
        let again = g.delta(&env, &from, &to).unwrap().unwrap();
        assert!(
            std::sync::Arc::ptr_eq(&d, &again),
            "served from the kept delta"
        );
        // Another environment that does not keep them gets none.
        let other: EnvName = "staging".parse().unwrap();
        assert!(g.delta(&other, &from, &to).unwrap().is_none());
        // The third publication evicts the first (keep 2): no delta from it,
        // though one was computed.
        g.publish(&env, &gens[2], &|_| true).unwrap();
        assert!(g.delta(&env, &from, &to).unwrap().is_none());
        // Bounded: more pairs than are kept.
        for _ in 0..2 * DELTAS_KEPT {
            g.delta(&env, &to, &gens[2].id).unwrap().unwrap();
            g.delta(&env, &gens[2].id, &to).unwrap().unwrap();
        }
        assert!(lock(&g.deltas).len() <= DELTAS_KEPT);
    }

    #[test]
    fn keeps_the_newest_by_count_deletes_what_none_names_and_survives_a_restart() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let env: EnvName = "production".parse().unwrap();
        let g = store(dir.path(), 2, 2048);
        let shared: &[u8] = b"shared by all\n";
        let gens: Vec<Candidate> = (0..3u8)
            .map(|i| candidate(src.path(), &[("a.rb", shared), ("b.rb", &[b'0' + i; 10])]))
            .collect();
        for c in &gens {
            assert!(matches!(
                g.publish(&env, c, &|_| true).unwrap(),
                Published::New(_)
            ));
        }
        assert!(matches!(
            g.publish(&env, &gens[2], &|_| true).unwrap(),
            Published::Unchanged(_)
        ));
        let kept: Vec<GenerationId> = g.kept(&env).iter().map(|k| k.id).collect();
        assert_eq!(kept, vec![gens[2].id, gens[1].id], "newest first");
        assert_eq!(g.evictions.load(Ordering::Relaxed), 1);
        let mut want = vec![
            Sha256::of(shared),
            Sha256::of(&[b'1'; 10]),
            Sha256::of(&[b'2'; 10]),
        ];
        want.sort();
        assert_eq!(
            blobs_on_disk(&g),
            want,
            "the evicted one's own blob is gone"
        );
        assert!(g.manifest(&env, &gens[0].id).unwrap().is_none());
        let bytes = g.bytes();
        let expected: u64 =
            shared.len() as u64 + 20 + (gens[1].bytes.len() + gens[2].bytes.len()) as u64;
        assert_eq!(bytes, expected);

        // A restart reads it all back; a revert to a kept one moves it last.
        drop(g);
        let g = store(dir.path(), 2, 2048);
        assert_eq!(g.bytes(), bytes);
        assert_eq!(g.current(&env).unwrap().id, gens[2].id);
        assert!(matches!(
            g.publish(&env, &gens[1], &|_| true).unwrap(),
            Published::New(_)
        ));
        assert_eq!(g.current(&env).unwrap().id, gens[1].id);
        assert_eq!((g.bytes(), blobs_on_disk(&g).len()), (bytes, 3));
    }

    #[test]
    fn identical_files_are_stored_once_across_environments() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let g = store(dir.path(), 5, 2048);
        let c = candidate(src.path(), &[("a.rb", b"same\n"), ("b.rb", b"same\n")]);
        for env in ["one", "two", "three"] {
            g.publish(&env.parse().unwrap(), &c, &|_| true).unwrap();
        }
        assert_eq!(blobs_on_disk(&g), vec![Sha256::of(b"same\n")]);
        assert_eq!(g.bytes(), 5 + c.bytes.len() as u64);
        let two: EnvName = "two".parse().unwrap();
        assert!(g.blob(&Sha256::of(b"same\n"), |e| e == "two").is_some());
        assert!(g.blob(&Sha256::of(b"same\n"), |e| e == "four").is_none());
        assert_eq!(g.find(&two, &c.id.to_hex()[..6]).unwrap().id, c.id);
        assert!(g.find(&two, "ffffffffffff").unwrap_err().is_empty());
    }

    #[test]
    fn the_byte_bound_evicts_the_oldest_but_never_a_current_generation() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let g = store(dir.path(), 5, 1);
        let big = |b: u8| vec![b; 400 << 10];
        let (a, b): (EnvName, EnvName) = ("a".parse().unwrap(), "b".parse().unwrap());
        let a1 = candidate(src.path(), &[("x", &big(1))]);
        let b1 = candidate(src.path(), &[("x", &big(2))]);
        let a2 = candidate(src.path(), &[("x", &big(3))]);
        g.publish(&a, &a1, &|_| true).unwrap();
        g.publish(&b, &b1, &|_| true).unwrap();
        g.publish(&a, &a2, &|_| true).unwrap();
        // 1.2 MiB over a 1 MiB bound: a's older one goes, both currents stay.
        assert_eq!(g.kept(&a).len(), 1);
        assert_eq!(g.kept(&b).len(), 1);
        assert!(g.bytes() <= (1 << 20));
        // Currents alone over the bound: kept, whatever it costs.
        let b2 = candidate(
            src.path(),
            &[("x", &big(4)), ("y", &big(5)), ("z", &big(6))],
        );
        g.publish(&b, &b2, &|_| true).unwrap();
        assert_eq!(
            (g.current(&a).unwrap().id, g.current(&b).unwrap().id),
            (a2.id, b2.id)
        );
        assert!(g.bytes() > (1 << 20));
        // Once `a` is gone from disk, its current generation may go too.
        let b3 = candidate(src.path(), &[("x", &big(7))]);
        g.publish(&b, &b3, &|e| e.as_str() != "a").unwrap();
        assert!(g.current(&a).is_none(), "{:?}", g.kept(&a));
        assert_eq!(g.current(&b).unwrap().id, b3.id);
    }

    #[test]
    fn a_file_changed_since_indexing_is_not_stored() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let g = store(dir.path(), 5, 2048);
        let env: EnvName = "production".parse().unwrap();
        let c = candidate(src.path(), &[("a.rb", b"indexed\n")]);
        let (path, _) = (c.source)(&Sha256::of(b"indexed\n")).unwrap();
        std::fs::write(&path, b"changed\n").unwrap();
        assert!(matches!(
            g.publish(&env, &c, &|_| true),
            Err(StoreError::Changed { .. })
        ));
        assert!(g.current(&env).is_none());
        assert!(blobs_on_disk(&g).is_empty());
    }

    /// An index of a one-module tree under `root` whose `a.rb` holds `body`.
    fn index_of(root: &Path, body: &str) -> crate::index::EnvIndex {
        let lib = root.join("envs/production/modules/m/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("a.rb"), body).unwrap();
        let layout = crate::environments::Layout {
            environmentpath: vec![root.join("envs")],
            ..Default::default()
        };
        let hashed = AtomicU64::new(0);
        let hashing = crate::index::Hashing::Hash {
            files_hashed: &hashed,
            kept: None,
        };
        let dir = root.join("envs/production");
        crate::index::EnvIndex::build(
            &layout,
            &crate::index::Settings::default(),
            "production".parse().unwrap(),
            dir,
            None,
            hashing,
        )
    }

    #[test]
    fn the_index_of_each_generation_is_kept_beside_it_and_goes_with_it() {
        let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let env: EnvName = "production".parse().unwrap();
        let g = store(dir.path(), 1, 2048);
        let one = index_of(src.path(), "# one\n");
        let c1 = Candidate::of(&one).unwrap();
        g.publish(&env, &c1, &|_| true).unwrap();
        let stored = g.index_record(&env, &c1.id).unwrap().expect("stored");
        assert_eq!(stored, one.record());
        assert_eq!(g.index_bytes(), stored.len() as u64);
        let path = g.layout.index(&env, &c1.id);
        assert!(path.is_file());

        let two = index_of(src.path(), "# two\n");
        let c2 = Candidate::of(&two).unwrap();
        g.publish(&env, &c2, &|_| true).unwrap();
        assert!(!path.exists(), "evicted with its generation");
        assert!(g.index_record(&env, &c1.id).unwrap().is_none());
        let kept = g.index_record(&env, &c2.id).unwrap().expect("stored");
        assert_eq!(g.index_bytes(), kept.len() as u64);

        // A restart counts it again and sweeps what no kept generation names.
        std::fs::write(path.with_file_name("stray"), b"x").unwrap();
        drop(g);
        let g = store(dir.path(), 1, 2048);
        assert_eq!(g.index_bytes(), kept.len() as u64);
        assert!(!path.with_file_name("stray").exists());
    }
}
