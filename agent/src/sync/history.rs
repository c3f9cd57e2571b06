//! What the node's destinations held, run by run
//! (docs/agent.md#generations-and-rollback): the last [`KEPT`] trees made
//! live on this node, each the generation it was (with its manifest, so a
//! rollback can tell which kept tree holds it) or `null` for a tree that
//! was none (a sync of Puppet's listings, a commit with failures).
//! `<vardir>/history.json`, the manifests in `<vardir>/history/<id>`, each
//! written atomically, not synced (`fsutil::replace_atomic`; a run that
//! changes a few files syncs nothing of the vardir,
//! docs/internals.md#caches-without-fsync): a history lost in a crash
//! costs a rollback refused, never a wrong one, since a manifest is
//! checked against its id and a tree against the manifest.
//!
//! Whether a kept tree holds a generation's mount is never taken from the
//! record alone: [`holds`] compares the tree with the manifest (names,
//! kinds, content, modes), so a standby recycled by a later run is never
//! taken for what it held before.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pluginsync_common::checksum::sha256_reader;
use pluginsync_common::fsutil::replace_atomic;
use pluginsync_common::generation::{EntryKind, GenerationId, Manifest};
use pluginsync_common::relpath::RelPath;
use serde::{Deserialize, Serialize};

use crate::catalog::FileResource;
use crate::config::SourcePermissions;
use crate::listing::{MODE_MASK, STAGING_DIR};
use crate::scan::{self, LocalKind};

/// How many live trees the history keeps (the newest last).
pub const KEPT: usize = 3;

/// One tree made live on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// The generation it was (hex id), `None` when it was none.
    pub generation: Option<String>,
    /// The environment it came from.
    pub environment: String,
}

impl Live {
    /// Its generation's id, if it was one and the record is readable.
    pub fn id(&self) -> Option<GenerationId> {
        self.generation.as_deref()?.parse().ok()
    }
}

/// The history, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// The trees made live, the current one last.
    pub live: Vec<Live>,
}

impl History {
    fn path(vardir: &Path) -> PathBuf {
        vardir.join("history.json")
    }

    fn manifests(vardir: &Path) -> PathBuf {
        vardir.join("history")
    }

    /// The history in `vardir`; an unreadable one is empty.
    pub fn load(vardir: &Path) -> History {
        std::fs::read(Self::path(vardir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The tree live before the current one.
    pub fn previous(&self) -> Option<&Live> {
        self.live.len().checked_sub(2).map(|i| &self.live[i])
    }

    /// The manifest of `id`, verified against it; `None` if not kept.
    pub fn manifest(vardir: &Path, id: &GenerationId) -> Option<(Manifest, Vec<u8>)> {
        let bytes = std::fs::read(Self::manifests(vardir).join(id.to_hex())).ok()?;
        Some((Manifest::parse(&bytes, id).ok()?, bytes))
    }

    /// `live` is the tree now live: appended (unless it is the current
    /// one already), with its manifest (`manifest`, or read by `manifest`
    /// when needed) kept; what falls out of the history goes.
    pub fn push(
        vardir: &Path,
        live: Live,
        manifest: impl FnOnce() -> Option<Vec<u8>>,
    ) -> std::io::Result<()> {
        let mut history = History::load(vardir);
        if history.live.last() == Some(&live) {
            return Ok(());
        }
        let dir = Self::manifests(vardir);
        if let Some(hex) = &live.generation {
            std::fs::create_dir_all(&dir)?;
            let file = dir.join(hex);
            if !file.exists() {
                let Some(bytes) = manifest() else {
                    return Err(std::io::Error::other("no manifest to keep"));
                };
                replace_atomic(&file, &bytes, 0o600)?;
            }
        }
        history.live.push(live);
        let extra = history.live.len().saturating_sub(KEPT);
        history.live.drain(..extra);
        replace_atomic(&Self::path(vardir), &serde_json::to_vec(&history)?, 0o600)?;
        let named: Vec<&str> = (history.live.iter())
            .filter_map(|l| l.generation.as_deref())
            .collect();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            if !named.iter().any(|n| *n == name) {
                let _gone_is_fine = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

/// Whether the tree at `dir` is `resource`'s mount of `manifest` as a
/// sync commits it: the same names (ignored ones and the staging
/// directory aside), kinds and content, and under `source_permissions =
/// "use"` the same modes (`mode & MODE_MASK`). Reads every file.
pub fn holds(dir: &Path, manifest: &Manifest, resource: &FileResource) -> bool {
    let Ok(tree) = scan::scan(dir, &resource.ignore) else {
        return false;
    };
    let ignored = |rel: &RelPath| rel.segments().any(|s| resource.ignore.is_ignored(s));
    let wanted: BTreeMap<&RelPath, _> = (manifest.mount(resource.mount))
        .filter(|e| !e.path.is_root() && !ignored(&e.path))
        .map(|e| (&e.path, e))
        .collect();
    let local: Vec<_> = (tree.entries.iter())
        .filter(|(rel, _)| rel.segments().next() != Some(STAGING_DIR))
        .collect();
    if !tree.exists || !tree.strays.is_empty() || local.len() != wanted.len() {
        return false;
    }
    let use_modes = resource.source_permissions == SourcePermissions::Use;
    local.into_iter().all(|(rel, e)| {
        let Some(m) = wanted.get(rel) else {
            return false;
        };
        if use_modes && e.mode != m.mode & MODE_MASK {
            return false;
        }
        match (&m.kind, e.kind) {
            (EntryKind::Directory, LocalKind::Dir) => true,
            (EntryKind::File { sha256, .. }, LocalKind::File) => {
                std::fs::File::open(rel.to_path(dir))
                    .ok()
                    .and_then(|f| sha256_reader(f).ok())
                    .is_some_and(|d| d == *sha256)
            }
            // Links arrive as files (`links = follow`).
            _ => false,
        }
    })
}

impl super::Run<'_> {
    /// After the commit: the tree now live joins the history, as the
    /// generation `held` when it committed cleanly, else as none when
    /// the run changed something (a listings sync, a commit with
    /// failures). A history that cannot be written costs a rollback
    /// later, not this run: one warning.
    pub(super) fn remember_live(&self, held: Option<&super::generation::Held>) {
        let clean = self.report.failures.is_empty();
        let generation = held.filter(|_| clean).map(|h| h.id.to_hex());
        if generation.is_none() && self.report.changes.is_empty() {
            return;
        }
        let (vardir, env) = (&self.settings.vardir, self.env.as_str());
        let live = Live {
            generation,
            environment: env.to_owned(),
        };
        let manifest = || {
            (held.and_then(|h| h.fresh.clone()))
                .or_else(|| crate::cache::GenerationRecord::load_manifest(vardir, env))
        };
        if let Err(e) = History::push(vardir, live, manifest) {
            tracing::warn!(vardir = %vardir.display(), error = %e, "cannot record the generation now live");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use pluginsync_common::digest::Sha256;
    use pluginsync_common::generation::ManifestEntry;
    use pluginsync_common::ignore::IgnoreSet;
    use pluginsync_common::metadata::Links;
    use pluginsync_common::protocol::Mount;

    use super::*;

    fn entry(path: &str, mode: u32, kind: EntryKind) -> ManifestEntry {
        ManifestEntry {
            mount: Mount::Plugins,
            path: RelPath::parse(path).unwrap(),
            mode,
            kind,
        }
    }

    fn manifest(content: &[u8]) -> Manifest {
        let file = EntryKind::File {
            sha256: Sha256::of(content),
            size: content.len() as u64,
        };
        let dir = || EntryKind::Directory;
        Manifest::new(vec![
            entry(".", 0o755, dir()),
            entry("facter", 0o755, dir()),
            entry("facter/x.rb", 0o644, file),
            ManifestEntry {
                mount: Mount::Pluginfacts,
                ..entry(".", 0o755, dir())
            },
        ])
        .unwrap()
    }

    fn resource(path: &Path, perms: SourcePermissions) -> FileResource {
        FileResource {
            path: path.to_owned(),
            mount: Mount::Plugins,
            purge: true,
            force: true,
            backup: false,
            links: Links::Follow,
            ignore: IgnoreSet::new(&[".git"]).unwrap(),
            source_permissions: perms,
        }
    }

    #[test]
    fn a_tree_holds_a_mount_only_with_its_names_content_and_modes() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("lib");
        std::fs::create_dir_all(dir.join("facter")).unwrap();
        std::fs::write(dir.join("facter/x.rb"), "x").unwrap();
        let set = |p: &str, m: u32| {
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(m)).unwrap()
        };
        set("facter", 0o755);
        set("facter/x.rb", 0o644);
        let (m, r) = (manifest(b"x"), resource(&dir, SourcePermissions::Use));
        assert!(holds(&dir, &m, &r));
        // An ignored name and the staging directory are no part of it.
        std::fs::create_dir(dir.join(".git")).unwrap();
        std::fs::create_dir(dir.join(STAGING_DIR)).unwrap();
        assert!(holds(&dir, &m, &r));
        assert!(!holds(&dir, &manifest(b"y"), &r), "other content");
        set("facter/x.rb", 0o755);
        assert!(!holds(&dir, &m, &r), "another mode");
        let ignoring = resource(&dir, SourcePermissions::Ignore);
        assert!(holds(&dir, &m, &ignoring), "modes not the master's");
        set("facter/x.rb", 0o644);
        std::fs::write(dir.join("facter/extra.rb"), "").unwrap();
        assert!(!holds(&dir, &m, &r), "an extra file");
        assert!(!holds(&t.path().join("none"), &m, &r), "no tree");
    }

    #[test]
    fn the_history_keeps_the_last_trees_and_their_manifests_only() {
        let t = tempfile::tempdir().unwrap();
        let vardir = t.path();
        let mut ids = Vec::new();
        for k in 0..5u8 {
            let (bytes, id) = manifest(&[k]).encode();
            let live = Live {
                generation: Some(id.to_hex()),
                environment: "production".into(),
            };
            History::push(vardir, live.clone(), || Some(bytes.clone())).unwrap();
            // The current tree again: nothing added.
            History::push(vardir, live, || None).unwrap();
            ids.push(id);
        }
        let none = Live {
            generation: None,
            environment: "production".into(),
        };
        History::push(vardir, none.clone(), || None).unwrap();
        let h = History::load(vardir);
        assert_eq!(h.live.len(), KEPT);
        assert_eq!(h.live.last(), Some(&none));
        assert_eq!(h.previous().and_then(Live::id), Some(ids[4]));
        assert!(History::manifest(vardir, &ids[4]).is_some());
        assert!(History::manifest(vardir, &ids[2]).is_none(), "not pruned");
        let kept = std::fs::read_dir(vardir.join("history")).unwrap().count();
        assert_eq!(kept, 2);
        // A manifest that does not hash to its id is none.
        std::fs::write(vardir.join("history").join(ids[4].to_hex()), "x").unwrap();
        assert!(History::manifest(vardir, &ids[4]).is_none());
    }
}
