//! The in-memory index of one environment: both mounts, merged, hashed.
//!
//! [`EnvIndex::build`] walks every module root of the `plugins` (`lib/`)
//! and `pluginfacts` (`facts.d/`) mounts, hashes each file once (reusing the
//! digest of every file whose stat is unchanged since the previous build),
//! and precomputes the merged, first-wins view used to find content. It runs
//! off the request path (startup, the watcher, or once for an environment
//! created after startup). Requests only read it: a listing for a given set
//! of parameters is serialised once, kept in a small bounded cache with its
//! content-derived ETag, and gzipped at most once.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::envname::EnvName;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{Checksum, FileMetadata, FileType, Links, Principal};
use pluginsync_common::relpath::RelPath;

use crate::environments::{self, Module};
use crate::walk::{self, FileSig, Node, View};

pub use pluginsync_common::protocol::Mount;

/// One served root: a module's `lib/` or `facts.d/`.
#[derive(Debug)]
pub struct Root {
    /// The module name.
    pub module: String,
    /// The root directory, as configured (the `path` of listing entries).
    pub dir: String,
    /// The root directory, canonical: nodes' real paths are relative to it
    /// ([`Node::real_path`]).
    pub canon: PathBuf,
    /// The walked entries; `nodes[0]` is the root.
    pub nodes: Vec<Node>,
}

/// A path served by two modules: the first wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    /// The relative path.
    pub path: String,
    /// The module whose entry is served.
    pub winner: String,
    /// The module whose entry is hidden.
    pub loser: String,
}

/// Where an entry of a merged view lives: (root, node).
pub type Loc = (u32, u32);

/// One mount of one environment.
#[derive(Debug)]
pub struct MountIndex {
    /// The mount.
    pub mount: Mount,
    /// Roots in module order.
    pub roots: Vec<Root>,
    /// What `"."` is when no module has the subdirectory: the first existing
    /// modulepath directory, or the environment directory.
    pub fallback: (String, View),
    /// The merged `links=follow` view with nothing ignored: the winning
    /// entry of every relative path, sorted by that path (so a lookup is a
    /// binary search and costs no second copy of each path). `file_content`
    /// and `file_metadata` look up here, through [`MountIndex::find`].
    pub lookup: Vec<Loc>,
    /// Paths hidden by an earlier module.
    pub collisions: Vec<Collision>,
}

/// Parameters of a `file_metadatas` search, normalised; also the key of the
/// response cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SearchParams {
    /// `recurse`.
    pub recurse: bool,
    /// `recurselimit`; `None` for no limit.
    pub recurselimit: Option<u32>,
    /// `links`.
    pub links: Links,
    /// `ignore` patterns, in request order.
    pub ignore: Vec<String>,
    /// `checksum_type`.
    pub checksum_type: ChecksumType,
    /// `source_permissions=use` (or `use_when_creating`).
    pub use_permissions: bool,
}

/// How owner, group and mode are reported.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    /// The master's euid, reported under `source_permissions=ignore`.
    pub uid: u32,
    /// The master's egid.
    pub gid: u32,
}

impl Identity {
    /// The running process's effective ids.
    pub fn current() -> Self {
        Identity {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// The checksum every directory carries. Puppet sends the ctime of the
/// search base, which agents ignore (PROTOCOL.md §2.2); a constant keeps
/// listings, and so ETags, identical on every replica of the same tree.
pub const DIRECTORY_CTIME: i64 = 0;

impl MountIndex {
    /// Walks and hashes one mount.
    pub fn build(
        mount: Mount,
        modules: &[Module],
        modulepath: &[PathBuf],
        env_dir: &Path,
        previous: &HashMap<PathBuf, (FileSig, [u8; 32])>,
        hashed: Option<&AtomicU64>,
    ) -> MountIndex {
        let mut roots = Vec::new();
        for m in modules {
            let dir = m.dir.join(mount.module_subdir());
            if !dir.exists() {
                continue;
            }
            if !dir.is_dir() {
                tracing::warn!(path = %dir.display(), "not a directory, not served");
                continue;
            }
            match walk::walk_root(&dir, &m.name) {
                Ok((canon, mut nodes)) => {
                    if let Some(counter) = hashed {
                        walk::hash_nodes(&mut nodes, &canon, previous, counter, &m.name);
                    }
                    roots.push(Root {
                        module: m.name.clone(),
                        dir: dir.to_string_lossy().into_owned(),
                        canon,
                        nodes,
                    });
                }
                Err(e) => {
                    tracing::warn!(path = %dir.display(), error = %e, "cannot walk module directory, not served")
                }
            }
        }
        let fallback_dir = modulepath
            .iter()
            .find(|d| d.is_dir())
            .cloned()
            .unwrap_or_else(|| env_dir.to_owned());
        let fallback_view = std::fs::metadata(&fallback_dir)
            .ok()
            .map(|md| {
                use std::os::unix::fs::MetadataExt;
                View {
                    kind: FileType::Directory,
                    mode: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    mtime: md.mtime(),
                    ctime: md.ctime(),
                    destination: None,
                }
            })
            .unwrap_or(View {
                kind: FileType::Directory,
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: 0,
                ctime: 0,
                destination: None,
            });
        let mut index = MountIndex {
            mount,
            roots,
            fallback: (fallback_dir.to_string_lossy().into_owned(), fallback_view),
            lookup: Vec::new(),
            collisions: Vec::new(),
        };
        let mut collisions = Vec::new();
        let all = index.merge(
            Links::Follow,
            &IgnoreSet::empty(),
            None,
            Some(&mut collisions),
        );
        let mut lookup = all;
        lookup
            .sort_unstable_by(|&a, &b| index.node(a).rel.as_str().cmp(index.node(b).rel.as_str()));
        lookup.shrink_to_fit();
        index.lookup = lookup;
        for c in &collisions {
            tracing::info!(mount = mount.as_str(), path = %c.path, winner = %c.winner, hidden = %c.loser, "path served by two modules, first wins");
        }
        index.collisions = collisions;
        index
    }

    /// The node at `loc`.
    pub fn node(&self, loc: Loc) -> &Node {
        &self.roots[loc.0 as usize].nodes[loc.1 as usize]
    }

    /// The winning entry for `rel` in the merged `links=follow` view.
    pub fn find(&self, rel: &str) -> Option<Loc> {
        self.lookup
            .binary_search_by(|&loc| self.node(loc).rel.as_str().cmp(rel))
            .ok()
            .map(|i| self.lookup[i])
    }

    /// The first-wins union of every root for one `links` mode, in Puppet's
    /// order: the first root's breadth-first walk, then each later root's
    /// new paths. `"."` (the first root's) comes first. Ignored entries and
    /// everything below them are left out, as are entries deeper than
    /// `recurselimit`. An entry below a path that an earlier module serves
    /// as a non-directory is dropped with its subtree (Puppet would list
    /// both, and the agent would fail to write the child).
    pub fn merge(
        &self,
        links: Links,
        ignore: &IgnoreSet,
        recurselimit: Option<u32>,
        mut collisions: Option<&mut Vec<Collision>>,
    ) -> Vec<Loc> {
        let mut out: Vec<Loc> = Vec::new();
        let mut seen: HashMap<&str, (FileType, u32)> = HashMap::new();
        for (ri, root) in self.roots.iter().enumerate() {
            let mut skipped = vec![false; root.nodes.len()];
            for (ni, node) in root.nodes.iter().enumerate() {
                if ni == 0 {
                    if ri == 0 {
                        out.push((0, 0));
                        seen.insert(".", (FileType::Directory, 0));
                    }
                    continue;
                }
                if skipped[node.parent as usize] {
                    skipped[ni] = true;
                    continue;
                }
                let Some(view) = node.view(links) else {
                    skipped[ni] = true;
                    continue;
                };
                let name = node.rel.file_name().unwrap_or_default();
                if ignore.is_ignored(name)
                    || recurselimit.is_some_and(|l| node.rel.depth() > l as usize)
                {
                    skipped[ni] = true;
                    continue;
                }
                match seen.get(node.rel.as_str()) {
                    Some(&(kind, winner)) => {
                        let both_dirs =
                            kind == FileType::Directory && view.kind == FileType::Directory;
                        if !both_dirs {
                            skipped[ni] = true;
                            if let Some(c) = collisions.as_deref_mut() {
                                c.push(Collision {
                                    path: node.rel.as_str().to_owned(),
                                    winner: self.roots[winner as usize].module.clone(),
                                    loser: root.module.clone(),
                                });
                            }
                        }
                    }
                    None => {
                        seen.insert(node.rel.as_str(), (view.kind, ri as u32));
                        out.push((ri as u32, ni as u32));
                    }
                }
            }
        }
        out
    }
}

/// A serialised listing, ready to send.
///
/// Built by streaming the entries through a hasher (the ETag) and a gzip
/// encoder. Large listings (4 MiB or more) are kept only gzipped (a
/// 50,000-file listing is 17 MB of JSON and ~5.7 MB gzipped; both
/// pluginsync's and Puppet's agents ask for gzip), and inflated for the rare
/// client that does not take it. Small ones are kept both ways.
#[derive(Debug)]
pub struct CachedListing {
    plain: Option<Bytes>,
    gzip: OnceLock<Bytes>,
    /// Strong ETag derived from the uncompressed body alone (quoted).
    pub etag: String,
    /// Number of entries.
    pub count: usize,
    /// Length of the uncompressed body.
    pub len: usize,
}

/// Listings at least this large are kept only gzipped (inflating one per
/// identity request is then cheaper than holding it twice).
const KEEP_GZIPPED: usize = 4 << 20;

impl CachedListing {
    /// Wraps a body, deriving its ETag.
    pub fn new(body: Vec<u8>, count: usize) -> Self {
        let digest = pluginsync_common::checksum::sha256_bytes(&body);
        let etag = format!("\"{}\"", pluginsync_common::digest::hex(&digest[..20]));
        let len = body.len();
        if len >= KEEP_GZIPPED {
            let gz = OnceLock::new();
            let _ = gz.set(gzip(&body));
            CachedListing {
                plain: None,
                gzip: gz,
                etag,
                count,
                len,
            }
        } else {
            CachedListing {
                plain: Some(Bytes::from(body)),
                gzip: OnceLock::new(),
                etag,
                count,
                len,
            }
        }
    }

    /// The uncompressed body (inflated if only the gzip is kept).
    pub fn plain(&self) -> Bytes {
        match &self.plain {
            Some(b) => b.clone(),
            None => {
                use std::io::Read;
                let mut out = Vec::with_capacity(self.len);
                let gz = self.gzip.get().cloned().unwrap_or_default();
                let _ = flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut out);
                Bytes::from(out)
            }
        }
    }

    /// The gzipped body, compressed on first use.
    pub fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| gzip(self.plain.as_deref().unwrap_or_default()))
            .clone()
    }

    /// Bytes held now or once gzipped (for the cache budget).
    pub fn cost(&self) -> usize {
        match &self.plain {
            Some(b) => b.len() * 2,
            None => self.gzip.get().map_or(0, |g| g.len()),
        }
    }
}

/// Where a listing is serialised: hashes it for the ETag, gzips it, and
/// keeps a plain copy only while it stays under [`KEEP_GZIPPED`].
struct ListingWriter {
    hasher: sha2::Sha256,
    plain: Option<Vec<u8>>,
    gz: flate2::write::GzEncoder<Vec<u8>>,
    len: usize,
}

impl ListingWriter {
    fn new() -> Self {
        ListingWriter {
            hasher: sha2::Sha256::default(),
            plain: Some(Vec::new()),
            gz: flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6)),
            len: 0,
        }
    }

    fn finish(self, count: usize) -> CachedListing {
        use sha2::Digest;
        let digest = self.hasher.finalize();
        let gz = OnceLock::new();
        // Writing to a Vec cannot fail.
        let _ = gz.set(Bytes::from(self.gz.finish().unwrap_or_default()));
        CachedListing {
            plain: self.plain.map(Bytes::from),
            gzip: gz,
            etag: format!("\"{}\"", pluginsync_common::digest::hex(&digest[..20])),
            count,
            len: self.len,
        }
    }
}

impl std::io::Write for ListingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        self.hasher.update(buf);
        self.len += buf.len();
        if let Some(plain) = &mut self.plain {
            if plain.len() + buf.len() >= KEEP_GZIPPED {
                self.plain = None;
            } else {
                plain.extend_from_slice(buf);
            }
        }
        self.gz.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Gzips a buffer.
pub fn gzip(data: &[u8]) -> Bytes {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 3),
        flate2::Compression::new(6),
    );
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(data);
    Bytes::from(enc.finish().unwrap_or_default())
}

/// Bounded map of serialised listings, oldest evicted first, by count and
/// by bytes (a body counts twice: it may be gzipped too).
#[derive(Debug, Default)]
struct ResponseCache {
    map: HashMap<(Mount, SearchParams), Arc<CachedListing>>,
    order: VecDeque<(Mount, SearchParams)>,
    bytes: usize,
}

impl ResponseCache {
    fn insert(
        &mut self,
        key: (Mount, SearchParams),
        listing: Arc<CachedListing>,
        max_entries: usize,
        max_bytes: usize,
    ) {
        if self.map.contains_key(&key) {
            return;
        }
        let cost = listing.cost();
        // A single listing larger than the whole budget is served, not kept
        // (and does not flush what is cached).
        if cost > max_bytes {
            return;
        }
        while !self.order.is_empty()
            && (self.order.len() >= max_entries || self.bytes + cost > max_bytes)
        {
            if let Some(old) = self.order.pop_front()
                && let Some(gone) = self.map.remove(&old)
            {
                self.bytes -= gone.cost();
            }
        }
        self.bytes += cost;
        self.order.push_back(key.clone());
        self.map.insert(key, listing);
    }
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
    cache_capacity: usize,
    cache_bytes: usize,
    responses: Mutex<ResponseCache>,
    /// Content-addressed view: sha256 → (mount index, location) of a file
    /// served by either mount (the first seen wins; the bytes are equal).
    blobs: HashMap<[u8; 32], (usize, Loc)>,
    /// Non-sha256 digests computed on demand: (real path, type) → value.
    extra_checksums: Mutex<HashMap<(PathBuf, ChecksumType), String>>,
}

impl EnvIndex {
    /// Walks and (unless `hashed` is `None`) hashes an environment, reusing
    /// digests from `previous`.
    pub fn build(
        config: &crate::config::MasterConfig,
        name: EnvName,
        dir: PathBuf,
        previous: Option<&EnvIndex>,
        hashed: Option<&AtomicU64>,
    ) -> EnvIndex {
        let modulepath = environments::modulepath(config, &dir);
        let modules = environments::modules(&modulepath);
        let reuse = previous.map(EnvIndex::digests).unwrap_or_default();
        let mounts =
            Mount::ALL.map(|m| MountIndex::build(m, &modules, &modulepath, &dir, &reuse, hashed));
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
            modules,
            mounts,
            identity: Identity::current(),
            cache_capacity: config.index.cached_responses.max(1),
            cache_bytes: config.index.cache_mib.saturating_mul(1 << 20),
            responses: Mutex::new(ResponseCache::default()),
            extra_checksums: Mutex::new(HashMap::new()),
        }
    }

    /// Every file digest of this index: real path → (signature, sha256).
    fn digests(&self) -> HashMap<PathBuf, (FileSig, [u8; 32])> {
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

    /// Serialises and gzips, before the index is published, the listings
    /// a stock or pluginsync agent asks for (both mounts, both
    /// `source_permissions`, Puppet's default ignores), so the first agent
    /// after a change does not wait for them.
    pub fn warm(&self) {
        for mount in Mount::ALL {
            for use_permissions in [true, false] {
                let params = SearchParams {
                    recurse: true,
                    recurselimit: None,
                    links: Links::Follow,
                    ignore: pluginsync_common::DEFAULT_IGNORE
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                    checksum_type: ChecksumType::Sha256,
                    use_permissions,
                };
                match self.listing(mount, &params) {
                    Ok(l) => {
                        l.gzip();
                    }
                    Err(e) => {
                        tracing::warn!(env = %self.name, mount = mount.as_str(), error = %e, "cannot pre-serialise a listing")
                    }
                }
            }
        }
    }

    /// The serialised listing for `params`, from the cache or built now.
    /// Blocking: may hash files for non-sha256 checksum types.
    pub fn listing(
        &self,
        mount: Mount,
        params: &SearchParams,
    ) -> Result<Arc<CachedListing>, ListingError> {
        let key = (mount, params.clone());
        if let Some(hit) = self.lock_responses().map.get(&key) {
            return Ok(hit.clone());
        }
        // Streamed: entries are serialised one at a time into the hasher
        // (ETag), the gzip encoder and, while small, a plain copy, so the
        // whole JSON document and the entry vector never exist at once (for
        // 50,000 files they would be 17 MB plus their growth, and the
        // allocator keeps such a peak as resident memory).
        let mut sink = ListingWriter::new();
        let mut out = std::io::BufWriter::with_capacity(64 << 10, &mut sink);
        let mut count = 0usize;
        let io = |e: std::io::Error| ListingError::Internal(e.to_string());
        out.write_all(b"[").map_err(io)?;
        self.for_each_entry(mount, params, |entry| {
            if count > 0 {
                out.write_all(b",").map_err(io)?;
            }
            serde_json::to_writer(&mut out, &entry)
                .map_err(|e| ListingError::Internal(e.to_string()))?;
            count += 1;
            Ok(())
        })?;
        out.write_all(b"]").map_err(io)?;
        out.flush().map_err(io)?;
        drop(out);
        let listing = Arc::new(sink.finish(count));
        self.lock_responses()
            .insert(key, listing.clone(), self.cache_capacity, self.cache_bytes);
        Ok(listing)
    }

    fn lock_responses(&self) -> std::sync::MutexGuard<'_, ResponseCache> {
        self.responses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entries of a `file_metadatas` answer.
    pub fn search(
        &self,
        mount: Mount,
        params: &SearchParams,
    ) -> Result<Vec<FileMetadata>, ListingError> {
        let mut entries = Vec::new();
        self.for_each_entry(mount, params, |e| {
            entries.push(e);
            Ok(())
        })?;
        Ok(entries)
    }

    /// Calls `f` with each entry of a `file_metadatas` answer, in order.
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
            let root = &m.roots[loc.0 as usize];
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
        let (owner, group, mode) = if params.use_permissions {
            (view.uid, view.gid, view.mode)
        } else {
            (self.identity.uid, self.identity.gid, 0o644)
        };
        let checksum = match view.kind {
            FileType::Directory => Some(Checksum {
                kind: "ctime".into(),
                value: ChecksumType::Ctime.format_time(DIRECTORY_CTIME),
            }),
            _ => node.and_then(|(r, n)| self.checksum(r, n, view, params.checksum_type)),
        };
        Ok(FileMetadata {
            path: base.to_owned(),
            relative_path: Some(rel.to_owned()),
            links: params.links,
            owner: Principal::Id(owner.into()),
            group: Principal::Id(group.into()),
            mode,
            checksum,
            kind: view.kind,
            destination: view.destination.clone(),
        })
    }

    /// The checksum of a file (or of a link's target); `None` when its
    /// content is not served (a dangling or escaping link), as Puppet sends
    /// `null` when it cannot compute one.
    pub fn checksum(
        &self,
        root: &Root,
        node: &Node,
        view: &View,
        ty: ChecksumType,
    ) -> Option<Checksum> {
        let value = match ty {
            ChecksumType::Sha256 => format!(
                "{{sha256}}{}",
                pluginsync_common::digest::hex(&node.sha256?)
            ),
            ChecksumType::Mtime => ty.format_time(view.mtime),
            ChecksumType::Ctime => ty.format_time(view.ctime),
            ChecksumType::None => "{none}".to_owned(),
            _ => {
                node.sha256?;
                let real = node.real_path(&root.canon).into_owned();
                let key = (real.clone(), ty);
                if let Some(v) = self
                    .extra_checksums
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Some(Checksum {
                        kind: ty.name().into(),
                        value: v.clone(),
                    });
                }
                let value = std::fs::File::open(&real)
                    .and_then(|f| ty.digest_reader(f))
                    .ok()?;
                self.extra_checksums
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, value.clone());
                value
            }
        };
        Some(Checksum {
            kind: ty.name().into(),
            value,
        })
    }

    /// Finds a served file by its sha256.
    pub fn blob(&self, digest: &[u8; 32]) -> Option<(&Root, &Node)> {
        let &(mi, loc) = self.blobs.get(digest)?;
        let m = &self.mounts[mi];
        Some((&m.roots[loc.0 as usize], m.node(loc)))
    }

    /// Finds the winning entry for a relative path (`"."` for the root).
    pub fn find(&self, mount: Mount, rel: &RelPath) -> Option<(&Root, &Node)> {
        let m = self.mount(mount);
        let loc = m.find(rel.as_str())?;
        Some((&m.roots[loc.0 as usize], m.node(loc)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> (Mount, SearchParams) {
        let p = SearchParams {
            recurse: true,
            recurselimit: Some(n),
            links: Links::Follow,
            ignore: Vec::new(),
            checksum_type: ChecksumType::Sha256,
            use_permissions: false,
        };
        (Mount::Plugins, p)
    }

    #[test]
    fn streamed_listing_matches_the_whole_body() {
        for size in [10usize, 3 << 20, 6 << 20] {
            let body: Vec<u8> = (0..size).map(|i| b"[{\"a\":1},]"[i % 10]).collect();
            let whole = CachedListing::new(body.clone(), 7);
            let mut sink = ListingWriter::new();
            for chunk in body.chunks(4093) {
                sink.write_all(chunk).unwrap();
            }
            let streamed = sink.finish(7);
            assert_eq!(streamed.etag, whole.etag, "same ETag, size {size}");
            assert_eq!((streamed.len, streamed.count), (size, 7));
            assert_eq!(streamed.plain(), Bytes::from(body.clone()));
            assert_eq!(streamed.plain.is_some(), size < KEEP_GZIPPED);
            let mut inflated = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::GzDecoder::new(&streamed.gzip()[..]),
                &mut inflated,
            )
            .unwrap();
            assert_eq!(inflated, body);
        }
    }

    #[test]
    fn response_cache_is_bounded_by_count_and_bytes() {
        let mut c = ResponseCache::default();
        let body = |n: usize| Arc::new(CachedListing::new(vec![b'x'; n], 1));
        let big = CachedListing::new(vec![b'y'; 5 << 20], 1);
        assert_eq!(big.plain().len(), 5 << 20, "inflated on demand");
        assert!(big.cost() < 10_000, "kept gzipped only");
        for i in 0..10 {
            c.insert(key(i), body(100), 4, 10_000);
        }
        assert_eq!(c.map.len(), 4);
        assert!(c.map.contains_key(&key(9)) && !c.map.contains_key(&key(5)));
        c.insert(key(20), body(4_000), 4, 10_000);
        assert_eq!(c.bytes, c.map.values().map(|l| l.cost()).sum::<usize>());
        assert!(c.bytes <= 10_000);
        c.insert(key(21), body(6_000), 4, 10_000);
        assert!(
            !c.map.contains_key(&key(21)),
            "larger than the budget: served, not kept"
        );
        assert!(c.bytes <= 10_000);
    }
}

/// A listing could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// A request parameter was unusable.
    #[error("{0}")]
    BadRequest(String),
    /// Serialisation failed.
    #[error("{0}")]
    Internal(String),
}
