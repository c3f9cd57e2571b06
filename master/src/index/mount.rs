//! What a mount index is, and how first-wins merge works.
//!
//! A [`MountIndex`] is one mount (`plugins` or `pluginfacts`) of one
//! environment: one [`Root`] per module that has the mount's subdirectory,
//! in module order, each holding the nodes [`walk`] found there. Nothing is
//! copied between roots: an entry of a merged view is a [`Loc`], two
//! indices into them.
//!
//! [`MountIndex::merge`] is Puppet's first-wins union of the roots
//! (docs/internals.md#index). [`MountIndex::build`] runs it once with
//! nothing ignored and keeps the result, sorted by path, as the content
//! lookup, so `file_content` always serves the module that won the listing.
//!
//! A root whose real path is outside the code tree
//! (docs/internals.md#environments) is not walked at all, so nothing outside is
//! ever read, listed or served; it is warned about and kept in
//! [`MountIndex::outside`] for `check`.
//!
//! A module root, or anything below it, that cannot be read is reported
//! to the caller ([`ReadError`]), never skipped: the store then keeps the
//! environment's previous index (docs/master.md#unreadable-files).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{FileType, Links};
use pluginsync_common::protocol::Mount;

use crate::environments::{Module, Modulepath, Outside};
use crate::walk::{self, Digests, Hashing, Node, ReadError, View};

/// One served root: a module's `lib/` or `facts.d/`. Stored beside its
/// generation as it is (`EnvIndex::record`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Collision {
    /// The relative path.
    pub path: String,
    /// The module whose entry is served.
    pub winner: String,
    /// The module whose entry is hidden.
    pub loser: String,
}

/// Where an entry of a merged view lives. Stored once per entry in every
/// lookup, so it stays two `u32`s (8 bytes), not two `usize`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Index of the root in [`MountIndex::roots`] (the module, in module
    /// order: a lower index wins).
    pub root: u32,
    /// Index of the node in that root's [`Root::nodes`] (breadth-first walk
    /// order; 0 is the root directory itself).
    pub node: u32,
}

const _: () = assert!(std::mem::size_of::<Loc>() == 8);

impl Loc {
    /// The root directory of the first module: `"."` of a merged view.
    const TOP: Loc = Loc { root: 0, node: 0 };
}

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
    /// Roots not served: their real path is outside the code tree.
    pub outside: Vec<Outside>,
}

impl MountIndex {
    /// Walks and (unless `hashing` is [`Hashing::Skip`]) hashes one mount,
    /// reusing the digests in `previous`; what cannot be read goes to
    /// `errors`.
    pub fn build(
        mount: Mount,
        modules: &[Module],
        modulepath: &Modulepath,
        env_dir: &Path,
        previous: &Digests,
        hashing: Hashing<'_>,
        errors: &mut Vec<ReadError>,
    ) -> MountIndex {
        let mut roots = Vec::new();
        let mut outside = Vec::new();
        for m in modules {
            let dir = m.dir.join(mount.module_subdir());
            match std::fs::metadata(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // A module directory the master cannot search (mode 0700,
                // another owner) is not a module without `lib/`.
                Err(e) => {
                    errors.push(ReadError::new(dir, e));
                    continue;
                }
                Ok(md) if !md.is_dir() => {
                    tracing::warn!(path = %dir.display(), "not a directory, not served");
                    continue;
                }
                Ok(_) => {}
            }
            if let Some(real) = modulepath.outside(&dir) {
                let o = Outside {
                    module: m.name.clone(),
                    path: dir,
                    real,
                };
                tracing::warn!("{o}");
                outside.push(o);
                continue;
            }
            match walk::walk_root(&dir, &m.name, errors) {
                // Checked again on the path the walk resolved: a swap
                // between the two resolutions serves nothing outside.
                Ok((canon, _)) if !modulepath.contains(&canon) => {
                    let o = Outside {
                        module: m.name.clone(),
                        path: dir,
                        real: canon,
                    };
                    tracing::warn!("{o}");
                    outside.push(o);
                }
                Ok((canon, mut nodes)) => {
                    if let Hashing::Hash { files_hashed, kept } = hashing {
                        walk::hash_nodes(&mut nodes, &canon, previous, kept, files_hashed, errors);
                    }
                    roots.push(Root {
                        module: m.name.clone(),
                        dir: dir.to_string_lossy().into_owned(),
                        canon,
                        nodes,
                    });
                }
                Err(e) => errors.push(ReadError::new(dir, e)),
            }
        }
        let mut index = MountIndex::restore(mount, roots, fallback(modulepath, env_dir));
        index.outside = outside;
        index
    }

    /// The mount of `roots` (in module order) and `fallback`, as walked
    /// or as stored beside a generation: the lookup and the collisions
    /// are made from them.
    pub fn restore(mount: Mount, roots: Vec<Root>, fallback: (String, View)) -> MountIndex {
        let mut index = MountIndex {
            mount,
            roots,
            fallback,
            lookup: Vec::new(),
            collisions: Vec::new(),
            outside: Vec::new(),
        };
        let mut collisions = Vec::new();
        let mut lookup = index.merge(
            Links::Follow,
            &IgnoreSet::empty(),
            None,
            Some(&mut collisions),
        );
        lookup
            .sort_unstable_by(|&a, &b| index.node(a).rel.as_str().cmp(index.node(b).rel.as_str()));
        lookup.shrink_to_fit();
        index.lookup = lookup;
        index.collisions = collisions;
        index
    }

    /// The node at `loc`.
    pub fn node(&self, loc: Loc) -> &Node {
        &self.roots[loc.root as usize].nodes[loc.node as usize]
    }

    /// The root at `loc`.
    pub fn root(&self, loc: Loc) -> &Root {
        &self.roots[loc.root as usize]
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
    ///
    /// A path already taken is a collision unless both entries are
    /// directories (their contents merge); hidden entries are pushed to
    /// `collisions` when given.
    pub fn merge(
        &self,
        links: Links,
        ignore: &IgnoreSet,
        recurselimit: Option<u32>,
        mut collisions: Option<&mut Vec<Collision>>,
    ) -> Vec<Loc> {
        let mut out: Vec<Loc> = Vec::new();
        // Every path listed so far → (its type, the root that serves it).
        let mut seen: HashMap<&str, (FileType, u32)> = HashMap::new();
        for (ri, root) in self.roots.iter().enumerate() {
            // Nodes left out, so their subtrees are too (a node's parent
            // always comes before it in walk order).
            let mut skipped = vec![false; root.nodes.len()];
            for (ni, node) in root.nodes.iter().enumerate() {
                if ni == 0 {
                    if ri == 0 {
                        out.push(Loc::TOP);
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
                        out.push(Loc {
                            root: ri as u32,
                            node: ni as u32,
                        });
                    }
                }
            }
        }
        out
    }
}

/// `"."` of a mount no module provides: the first existing modulepath
/// directory, or the environment directory, as a directory (with default
/// metadata if it cannot be stat'ed).
fn fallback(modulepath: &Modulepath, env_dir: &Path) -> (String, View) {
    let fallback_dir = modulepath
        .dirs()
        .next()
        .map(Path::to_owned)
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
    (fallback_dir.to_string_lossy().into_owned(), fallback_view)
}
