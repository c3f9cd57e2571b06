//! The in-memory index of one environment: both mounts, merged, hashed.
//!
//! [`EnvIndex::build`] walks every module root of the `plugins` (`lib/`)
//! and `pluginfacts` (`facts.d/`) mounts, hashes each file once (reusing the
//! digest of every file whose stat is unchanged since the previous build),
//! and precomputes the merged, first-wins view used to find content. It runs
//! off the request path (startup, the watcher, or once for an environment
//! created after startup). Requests only read it: a listing for a given set
//! of parameters is serialised once, kept with its content-derived ETag and
//! gzipped at most once; the standard listings agents ask for are pinned
//! for the index's lifetime, any other parameter set lives in a small
//! least-recently-used cache (docs/internals.md#index).
//!
//! # Map of this folder
//!
//! | file | answers |
//! |---|---|
//! | `mod.rs` | What an environment index is: [`EnvIndex`] (build, lookups by path and by sha256, listings, [`EnvIndex::warm`]). |
//! | `mount.rs` | What a mount index is, and how first-wins merge works: [`MountIndex`], [`Root`], [`Loc`], [`Collision`]. |
//! | `entry.rs` | What one listing entry is: [`SearchParams`], [`Identity`], a node's metadata and its checksum of any type. |
//! | `listing.rs` | How a listing is serialised and cached: [`CachedListing`], the streaming writer (ETag, gzip), the cache (standard listings pinned, the rest LRU-bounded). |
//! | `history.rs` | Delta listings (docs/protocol.md §7.5): the last few standard listings by ETag, across rebuilds ([`History`]), and the deltas from them ([`DeltaListing`]). |
//!
//! # How data flows
//!
//! ```text
//! walk::walk_root + walk::hash_nodes     nodes of one module root
//!   → MountIndex::build                  one Root per module, in module order
//!   → MountIndex::merge                  first-wins union, as Locs
//!                                        (unfiltered and path-sorted: the lookup)
//!   → EnvIndex::build                    both mounts, blobs by sha256
//!   → EnvIndex::listing                  merge for the params → entry::metadata
//!                                        per Loc → listing::Serialiser → cache
//! ```
//!
//! Children never import this file; `entry` uses `mount`, `listing` uses
//! `entry`, `history` uses `listing` and `entry`.

mod entry;
mod history;
mod listing;
mod mount;
mod settings;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{Checksum, FileMetadata, Links};
use pluginsync_common::relpath::RelPath;

use crate::environments::{self, Module};
use crate::walk::{Digests, Node, ReadError, View};

pub use self::entry::{DIRECTORY_CTIME, Identity, ListingError, SearchParams, StoredBlobs};

pub use self::history::{DeltaListing, History};
pub use self::listing::{CachedListing, gzip};
pub use self::mount::{Collision, Loc, MountIndex, Root};
pub use self::settings::{
    DEFAULT_IDLE_DROP, DEFAULT_SETTLE, DEFAULT_SETTLE_MAX, Publish, Settings,
};
pub use crate::walk::Hashing;
pub use pluginsync_common::protocol::Mount;

use self::entry::OtherChecksums;
use self::listing::{ListingCache, Serialiser};

/// The version of [`EnvIndex::record`]'s form.
const RECORD_FORMAT: u32 = 1;

/// What [`EnvIndex::record`] writes: the environment directory and each
/// mount's roots and fallback (borrowed to write, owned when read).
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored<R, F> {
    format: u32,
    dir: PathBuf,
    mounts: [(R, F); 2],
}

/// A stored index that cannot be made back ([`EnvIndex::restore`]).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not gzip.
    #[error("stored index: {0}")]
    Read(#[from] std::io::Error),
    /// Not the JSON of an index.
    #[error("stored index: {0}")]
    Parse(#[from] serde_json::Error),
    /// Written by another version.
    #[error("stored index: format {0}, not {RECORD_FORMAT}")]
    Format(u32),
}

/// Where [`EnvIndex::listing`] found its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// From the listing cache.
    Cached,
    /// Serialised for this request (then cached, within budget), which
    /// evicted this many cached listings.
    Serialised {
        /// Listings evicted to keep this one.
        evicted: u64,
    },
}

/// One environment: both mounts plus caches.
#[derive(Debug)]
pub struct EnvIndex {
    /// The environment name.
    pub name: EnvName,
    /// The environment directory.
    pub dir: PathBuf,
    /// The modules, in resolution order.
    pub modules: Vec<Module>,
    /// `plugins` and `pluginfacts`, in [`Mount::ALL`] order.
    pub mounts: [MountIndex; 2],
    identity: Identity,
    responses: ListingCache,
    /// Content-addressed view: sha256 → (index in `mounts`, location) of a
    /// file served by either mount (the first seen wins; the bytes are
    /// equal).
    blobs: HashMap<Sha256, (usize, Loc)>,
    /// Non-sha256 digests computed on demand.
    other_checksums: OtherChecksums,
    /// The standard listings this environment served before, by ETag,
    /// for delta listings; handed from each index to the next.
    history: Arc<History>,
    /// What the build could not read (docs/master.md#unreadable-files):
    /// when any, this index lacks part of the tree and must not be served
    /// in place of a complete one.
    pub unreadable: Vec<ReadError>,
    /// The generation it was published as (docs/deploys.md#generations);
    /// set once, before it is served.
    pub generation: std::sync::OnceLock<pluginsync_common::generation::GenerationId>,
}

impl EnvIndex {
    /// The tree of `name` at `dir` as it is now, every file hashed, with no
    /// earlier index to reuse: what a command run beside the masters
    /// (`bundle`, `manifest`) computes, byte for byte as a master would.
    pub fn build_now(
        layout: &environments::Layout,
        settings: &Settings,
        name: EnvName,
        dir: PathBuf,
    ) -> EnvIndex {
        let hashed = std::sync::atomic::AtomicU64::new(0);
        EnvIndex::build(
            layout,
            settings,
            name,
            dir,
            None,
            Hashing::Hash {
                files_hashed: &hashed,
                kept: None,
            },
        )
    }

    /// Walks and (unless `hashing` is [`Hashing::Skip`]) hashes
    /// an environment, reusing digests from `previous`.
    pub fn build(
        layout: &environments::Layout,
        settings: &Settings,
        name: EnvName,
        dir: PathBuf,
        previous: Option<&EnvIndex>,
        hashing: Hashing<'_>,
    ) -> EnvIndex {
        let modulepath = environments::modulepath(layout, &dir);
        let (modules, unlisted) = environments::modules(&modulepath);
        let mut unreadable: Vec<ReadError> = unlisted
            .into_iter()
            .map(|(path, e)| ReadError::new(path, e))
            .collect();
        let reuse = previous.map(EnvIndex::digests).unwrap_or_default();
        let mounts = Mount::ALL.map(|m| {
            MountIndex::build(
                m,
                &modules,
                &modulepath,
                &dir,
                &reuse,
                hashing,
                &mut unreadable,
            )
        });
        for (i, m) in mounts.iter().enumerate() {
            let before = previous.map(|p| p.mounts[i].collisions.as_slice());
            log_collisions(&name, m.mount, &new_collisions(before, &m.collisions));
        }
        let mut idx = EnvIndex::assemble(settings, name, dir, mounts, OtherChecksums::default());
        idx.modules = modules;
        idx.history = previous.map(|p| p.history.clone()).unwrap_or_default();
        idx.unreadable = unreadable;
        idx
    }

    /// An index of `mounts`, its blob lookup made, its caches empty.
    fn assemble(
        settings: &Settings,
        name: EnvName,
        dir: PathBuf,
        mounts: [MountIndex; 2],
        other_checksums: OtherChecksums,
    ) -> EnvIndex {
        let mut blobs = HashMap::new();
        for (mi, m) in mounts.iter().enumerate() {
            for &loc in &m.lookup {
                if let Some(digest) = m.node(loc).sha256 {
                    blobs.entry(digest).or_insert((mi, loc));
                }
            }
        }
        EnvIndex {
            blobs,
            name,
            dir,
            modules: Vec::new(),
            mounts,
            identity: Identity::current(),
            responses: ListingCache::new(
                settings.cached_responses.max(1),
                settings.cache_mib.saturating_mul(1 << 20),
            ),
            other_checksums,
            history: Arc::default(),
            unreadable: Vec::new(),
            generation: std::sync::OnceLock::new(),
        }
    }

    /// This index as stored beside its generation
    /// (docs/rollouts.md#stock-puppet-agents): every root's walked entries
    /// with their views and digests, and each mount's fallback, as gzipped
    /// JSON. [`EnvIndex::restore`] makes the index back without the tree,
    /// so its v3 answers are the ones this index gives, byte for byte.
    pub fn record(&self) -> Vec<u8> {
        let stored = Stored {
            format: RECORD_FORMAT,
            dir: self.dir.clone(),
            mounts: [0, 1].map(|i| (&self.mounts[i].roots[..], &self.mounts[i].fallback)),
        };
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        // Writing to a Vec cannot fail. Buffered: serde writes a token at a
        // time, and each write to the encoder is a deflate call (20,000
        // files: 3.9 s unbuffered at level 6, 41 ms buffered at level 1).
        let _ = serde_json::to_writer(std::io::BufWriter::new(&mut enc), &stored);
        enc.finish().unwrap_or_default()
    }

    /// The index of generation `id` of `name` from its [`EnvIndex::record`]
    /// `bytes`; the content of its files, and digests other than sha256,
    /// come from `stored` (the generation store's blobs), never the tree.
    pub fn restore(
        settings: &Settings,
        name: EnvName,
        id: GenerationId,
        bytes: &[u8],
        stored: StoredBlobs,
    ) -> Result<EnvIndex, RecordError> {
        use std::io::Read;
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut json)?;
        let s: Stored<Vec<Root>, (String, View)> = serde_json::from_slice(&json)?;
        if s.format != RECORD_FORMAT {
            return Err(RecordError::Format(s.format));
        }
        let [(p, pf), (f, ff)] = s.mounts;
        let mounts = [
            MountIndex::restore(Mount::ALL[0], p, pf),
            MountIndex::restore(Mount::ALL[1], f, ff),
        ];
        let mut other = OtherChecksums::default();
        other.stored = Some(stored);
        let idx = EnvIndex::assemble(settings, name, s.dir, mounts, other);
        let _once = idx.generation.set(id);
        Ok(idx)
    }

    /// Every file digest of this index, for the next build to reuse.
    fn digests(&self) -> Digests {
        self.mounts
            .iter()
            .flat_map(|m| m.roots.iter())
            .flat_map(|r| r.nodes.iter().map(move |n| (r, n)))
            .filter_map(|(r, n)| Some((n.real_path(&r.canon).into_owned(), (n.sig?, n.sha256?))))
            .collect()
    }

    /// The index of a mount.
    pub fn mount(&self, mount: Mount) -> &MountIndex {
        match mount {
            Mount::Plugins => &self.mounts[0],
            Mount::Pluginfacts => &self.mounts[1],
        }
    }

    /// Number of files served by a mount.
    pub fn file_count(&self, mount: Mount) -> usize {
        let m = self.mount(mount);
        m.lookup
            .iter()
            .filter(|&&loc| m.node(loc).has_content())
            .count()
    }

    /// Files served by a mount, and their bytes.
    pub fn served(&self, mount: Mount) -> (u64, u64) {
        let m = self.mount(mount);
        m.lookup
            .iter()
            .map(|&loc| m.node(loc))
            .filter(|n| n.has_content())
            .fold((0, 0), |(files, bytes), n| {
                (files + 1, bytes + n.sig.map_or(0, |s| s.size))
            })
    }

    /// The standard listings: what a stock or pluginsync agent asks for
    /// (both mounts, both `source_permissions`, `links=follow`, Puppet's
    /// default ignores, sha256).
    pub fn standard_params() -> impl Iterator<Item = (Mount, SearchParams)> {
        Mount::ALL.into_iter().flat_map(|mount| {
            [true, false].map(move |use_permissions| {
                (
                    mount,
                    SearchParams {
                        recurse: true,
                        recurselimit: None,
                        links: Links::Follow,
                        ignore: pluginsync_common::DEFAULT_IGNORE
                            .iter()
                            .map(|s| s.to_string())
                            .collect(),
                        checksum_type: ChecksumType::Sha256,
                        use_permissions,
                    },
                )
            })
        })
    }

    /// Serialises and gzips, before the index is published, the standard
    /// listings ([`EnvIndex::standard_params`]), so the first agent after a
    /// change does not wait for them, and pins them in the cache for the
    /// index's lifetime: no other parameter set can evict them. Each is
    /// recorded in the environment's [`History`], so later indexes can
    /// answer deltas from it (docs/protocol.md §7.5).
    pub fn warm(&self) {
        for (mount, params) in Self::standard_params() {
            match self.serialise(mount, &params) {
                Ok(l) => {
                    l.gzip();
                    self.history.record((mount, params.clone()), l.clone());
                    self.responses.pin((mount, params), l);
                }
                Err(e) => {
                    tracing::warn!(env = %self.name, mount = mount.as_str(), error = %e, "cannot pre-serialise a listing")
                }
            }
        }
    }

    /// The cached listing for `params`, if there is one: a read lock on the
    /// pinned listings, then (for other parameter sets) the recent ones'
    /// mutex, held for a lookup only; no serialising and no file access,
    /// so the request path asks this first
    /// and leaves the blocking pool to [`EnvIndex::listing`] for a listing
    /// that must be serialised. A 304 or a cached listing then costs no
    /// hand-off to another thread.
    pub fn cached_listing(
        &self,
        mount: Mount,
        params: &SearchParams,
    ) -> Option<Arc<CachedListing>> {
        self.responses.get(&(mount, params.clone()))
    }

    /// The serialised listing for `params`, from the cache or built now
    /// (and then cached), and which of the two it was.
    /// Blocking: may hash files for non-sha256 checksum types.
    pub fn listing(
        &self,
        mount: Mount,
        params: &SearchParams,
    ) -> Result<(Arc<CachedListing>, Served), ListingError> {
        let key = (mount, params.clone());
        if let Some(hit) = self.responses.get(&key) {
            return Ok((hit, Served::Cached));
        }
        let listing = self.serialise(mount, params)?;
        let evicted = self.responses.insert(key, listing.clone());
        Ok((listing, Served::Serialised { evicted }))
    }

    /// A delta from the first of `bases` (`ETag` cores) this environment
    /// remembers to `listing` (this index's listing for `mount` and
    /// `params`), if smaller than the listing (docs/protocol.md §7.5).
    /// Only the standard listings are remembered. Blocking: the first
    /// request for a pair diffs the listing.
    pub fn delta(
        &self,
        mount: Mount,
        params: &SearchParams,
        listing: &CachedListing,
        bases: &[&str],
    ) -> Option<Arc<DeltaListing>> {
        self.history.delta(&(mount, params.clone()), listing, bases)
    }

    /// The environment's listing history (for tests and introspection).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Serialises the listing for `params`, bypassing the cache.
    fn serialise(
        &self,
        mount: Mount,
        params: &SearchParams,
    ) -> Result<Arc<CachedListing>, ListingError> {
        // Streamed: each entry is serialised as soon as it is made, never
        // collected (for 50,000 files the whole JSON and the entry vector
        // would be 17 MB plus their growth, and the allocator keeps such a
        // peak as resident memory).
        let mut out = Serialiser::new()?;
        self.for_each_entry(mount, params, |entry| out.push(&entry))?;
        Ok(Arc::new(out.finish()?))
    }

    /// Calls `f` with each entry of a `file_metadatas` answer, in order:
    /// the merge of the mount for `params`, or only `"."` (the fallback
    /// directory) when no module provides the mount.
    fn for_each_entry(
        &self,
        mount: Mount,
        params: &SearchParams,
        mut f: impl FnMut(FileMetadata) -> Result<(), ListingError>,
    ) -> Result<(), ListingError> {
        let m = self.mount(mount);
        if m.roots.is_empty() {
            let (dir, view) = &m.fallback;
            return f(self.entry(dir, ".", view, None, params)?);
        }
        let ignore =
            IgnoreSet::new(&params.ignore).map_err(|e| ListingError::BadRequest(e.to_string()))?;
        let limit = if params.recurse {
            params.recurselimit
        } else {
            Some(0)
        };
        for loc in m.merge(params.links, &ignore, limit, None) {
            let node = m.node(loc);
            let Some(view) = node.view(params.links) else {
                continue;
            };
            let root = m.root(loc);
            f(self.entry(
                &root.dir,
                node.rel.as_str(),
                view,
                Some((root, node)),
                params,
            )?)?;
        }
        Ok(())
    }

    /// One metadata entry.
    pub fn entry(
        &self,
        base: &str,
        rel: &str,
        view: &View,
        node: Option<(&Root, &Node)>,
        params: &SearchParams,
    ) -> Result<FileMetadata, ListingError> {
        entry::metadata(
            self.identity,
            &self.other_checksums,
            base,
            rel,
            view,
            node,
            params,
        )
    }

    /// The checksum of a file (or of a link's target); `None` when its
    /// content is not served (a dangling or escaping link), as Puppet sends
    /// `null` when it cannot compute one; [`ListingError::Changed`] when
    /// the type is read from disk and the file changed since indexing.
    pub fn checksum(
        &self,
        root: &Root,
        node: &Node,
        view: &View,
        ty: ChecksumType,
    ) -> Result<Option<Checksum>, ListingError> {
        entry::checksum(&self.other_checksums, root, node, view, ty)
    }

    /// Finds a served file by its sha256.
    pub fn blob(&self, digest: &Sha256) -> Option<(&Root, &Node)> {
        let &(mi, loc) = self.blobs.get(digest)?;
        let m = &self.mounts[mi];
        Some((m.root(loc), m.node(loc)))
    }

    /// Finds the winning entry for a relative path (`"."` for the root).
    pub fn find(&self, mount: Mount, rel: &RelPath) -> Option<(&Root, &Node)> {
        let m = self.mount(mount);
        let loc = m.find(rel.as_str())?;
        Some((m.root(loc), m.node(loc)))
    }
}

/// Collisions logged one line each per build; the rest are counted in one
/// line (`pluginsync-master check` lists them all).
pub const COLLISION_LOG_LINES: usize = 20;

/// The collisions of `current` that `previous` (the index this one
/// replaces) did not have: each collision is logged once, when it first
/// appears, not again on every re-index (a write to 20 modules that share
/// paths once logged 26,002 lines).
pub fn new_collisions<'a>(
    previous: Option<&[Collision]>,
    current: &'a [Collision],
) -> Vec<&'a Collision> {
    let before: std::collections::HashSet<&Collision> =
        previous.unwrap_or_default().iter().collect();
    current.iter().filter(|c| !before.contains(c)).collect()
}

/// Logs new collisions: at most [`COLLISION_LOG_LINES`] lines, then one
/// line with the count of the others.
fn log_collisions(env: &EnvName, mount: Mount, new: &[&Collision]) {
    for c in new.iter().take(COLLISION_LOG_LINES) {
        tracing::info!(env = %env, mount = mount.as_str(), path = %c.path, winner = %c.winner, hidden = %c.loser, "path served by two modules, first wins");
    }
    if new.len() > COLLISION_LOG_LINES {
        tracing::info!(
            env = %env,
            mount = mount.as_str(),
            more = new.len() - COLLISION_LOG_LINES,
            "more paths served by two modules (pluginsync-master check lists them)"
        );
    }
}

#[cfg(test)]
mod collision_tests {
    use super::*;

    fn c(path: &str, winner: &str, loser: &str) -> Collision {
        Collision {
            path: path.into(),
            winner: winner.into(),
            loser: loser.into(),
        }
    }

    #[test]
    fn a_collision_is_new_only_once() {
        let first = [c("a.rb", "m1", "m2"), c("b.rb", "m1", "m3")];
        assert_eq!(
            new_collisions(None, &first).len(),
            2,
            "a first build: all new"
        );
        assert!(
            new_collisions(Some(&first), &first).is_empty(),
            "a re-index with the same collisions logs nothing"
        );
        let second = [
            c("a.rb", "m1", "m2"),
            c("b.rb", "m3", "m1"),
            c("c.rb", "m1", "m2"),
        ];
        assert_eq!(
            new_collisions(Some(&first), &second),
            vec![&second[1], &second[2]],
            "a changed winner and a new path are new"
        );
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn put(root: &std::path::Path, rel: &str, body: &str, mode: u32) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Every parameter set a client may send that shapes a listing.
    fn params() -> Vec<SearchParams> {
        let mut v: Vec<SearchParams> = EnvIndex::standard_params().map(|(_, p)| p).collect();
        let base = v[0].clone();
        for (links, ty, recurse, limit, ignore) in [
            (Links::Manage, ChecksumType::Md5, true, None, vec![]),
            (
                Links::Follow,
                ChecksumType::Mtime,
                true,
                None,
                vec!["b*".to_owned()],
            ),
            (Links::Manage, ChecksumType::Ctime, true, Some(1), vec![]),
            (Links::Follow, ChecksumType::Sha1, false, None, vec![]),
            (Links::Follow, ChecksumType::None, true, None, vec![]),
        ] {
            v.push(SearchParams {
                links,
                checksum_type: ty,
                recurse,
                recurselimit: limit,
                ignore,
                ..base.clone()
            });
        }
        v
    }

    #[test]
    fn a_restored_index_answers_every_listing_and_entry_byte_for_byte_without_the_tree() {
        let t = tempfile::tempdir().unwrap();
        let env = t.path().join("envs/production");
        let m = env.join("modules");
        put(&m, "alpha/lib/facter/a.rb", "# alpha\n", 0o644);
        put(&m, "alpha/lib/facter/common.rb", "# alpha wins\n", 0o640);
        put(&m, "alpha/lib/.git/HEAD", "ref\n", 0o644);
        put(&m, "beta/lib/facter/common.rb", "# hidden\n", 0o644);
        put(&m, "beta/lib/puppet/type/b.rb", "# type\n", 0o600);
        put(&m, "beta/facts.d/b.sh", "#!/bin/sh\necho b=1\n", 0o750);
        std::os::unix::fs::symlink("a.rb", m.join("alpha/lib/facter/link.rb")).unwrap();
        std::os::unix::fs::symlink("nowhere", m.join("beta/lib/dangling.rb")).unwrap();
        let layout = environments::Layout {
            environmentpath: vec![t.path().join("envs")],
            ..Default::default()
        };
        let settings = Settings::default();
        let hashed = std::sync::atomic::AtomicU64::new(0);
        let name: EnvName = "production".parse().unwrap();
        let hashing = Hashing::Hash {
            files_hashed: &hashed,
            kept: None,
        };
        let live = EnvIndex::build(&layout, &settings, name.clone(), env, None, hashing);
        assert!(live.unreadable.is_empty());
        // The blobs as the generation store keeps them; then the tree goes.
        let blobs = t.path().join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        for mount in &live.mounts {
            for &loc in &mount.lookup {
                let (root, node) = (mount.root(loc), mount.node(loc));
                if let Some(d) = node.sha256 {
                    std::fs::copy(node.real_path(&root.canon), blobs.join(d.to_hex())).unwrap();
                }
            }
        }
        let record = live.record();
        let listed = |idx: &EnvIndex| -> Vec<String> {
            let all = Mount::ALL
                .into_iter()
                .flat_map(|m| params().into_iter().map(move |p| (m, p)));
            all.map(|(m, p)| {
                String::from_utf8_lossy(&idx.serialise(m, &p).unwrap().plain()).into_owned()
            })
            .collect()
        };
        let want = listed(&live);
        std::fs::remove_dir_all(&m).unwrap();
        let stored = StoredBlobs(Arc::new(move |d: &Sha256| blobs.join(d.to_hex())));
        let id = GenerationId(Sha256::of(b"g"));
        let back = EnvIndex::restore(&settings, name, id, &record, stored).unwrap();
        assert_eq!(back.generation.get(), Some(&id));
        let got = listed(&back);
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "listing {i}");
            assert!(want.len() > 2, "listing {i} is not empty");
        }
        for mount in Mount::ALL {
            assert_eq!(back.mount(mount).lookup, live.mount(mount).lookup);
        }
        let rel = RelPath::parse("facter/common.rb").unwrap();
        let (root, node) = back.find(Mount::Plugins, &rel).unwrap();
        assert_eq!(root.module, "alpha");
        let md5 = back.checksum(root, node, node.follow.as_ref().unwrap(), ChecksumType::Md5);
        assert_eq!(
            md5.unwrap().unwrap().value,
            ChecksumType::Md5
                .digest_reader(&b"# alpha wins\n"[..])
                .unwrap()
        );
    }
}
