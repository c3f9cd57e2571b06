//! The plan: a pure function from (listing, local scan) to actions.
//!
//! This is Puppet's recursive, purging, forcing file resource reduced to
//! what it decides: create or fix directories, write new or changed files,
//! fix modes, remove what the master does not have. No I/O happens here, so
//! every rule is unit-tested on plain values, and `--noop` prints exactly
//! what a real run would do.
//!
//! Rules:
//! - A remote directory where a local non-directory stands replaces it; a
//!   remote file where a local directory stands replaces the directory (the
//!   resource has `force`). A local symlink is replaced, never followed.
//! - A file is written when missing or when its sha256 differs.
//! - Modes: with `source_permissions = use`, the listing's mode (already
//!   `mode & 0o755`, [`crate::listing::MODE_MASK`]: never group- or
//!   world-writable) is applied to new and existing entries; with `ignore`, new files get
//!   0644 and new directories 0755, and existing modes stay.
//! - Local entries the listing lacks are removed, the topmost only (a
//!   directory's removal takes its subtree); so are local names no listing
//!   can hold ([`Stray`]). Ignored names never reach here.
//! - Order: directories parents-first, then writes, then mode fixes, then
//!   removals deepest-first.

use std::collections::HashSet;

use pluginsync_common::digest::Sha256;
use pluginsync_common::relpath::RelPath;

use crate::listing::{RemoteKind, RemoteTree};
use crate::scan::{LocalKind, LocalName, LocalTree, Stray};

#[cfg(test)]
thread_local! {
    /// Set lookups made by [`plan`] on this thread (tests check that
    /// planning stays linear in the number of entries).
    static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one lookup (tests only).
fn probe() {
    #[cfg(test)]
    PROBES.with(|p| p.set(p.get() + 1));
}

/// What a change is, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// A new file or directory.
    Created,
    /// A file whose content changed (or that replaced something else).
    Updated,
    /// Purged.
    Removed,
    /// Only the permission bits changed.
    Mode,
}

impl ChangeKind {
    /// The word printed in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Updated => "updated",
            ChangeKind::Removed => "removed",
            ChangeKind::Mode => "mode",
        }
    }
}

/// One step, on a path relative to the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the destination itself.
    CreateRoot {
        /// Its mode.
        mode: u32,
    },
    /// Set the destination's own mode.
    ChmodRoot {
        /// The mode.
        mode: u32,
    },
    /// Create a directory (after removing a non-directory in the way).
    Mkdir {
        /// Relative path.
        rel: RelPath,
        /// Its mode.
        mode: u32,
        /// A local non-directory stands there and goes first.
        replace: bool,
    },
    /// Put a downloaded file in place.
    Write {
        /// Relative path (also the listing's relative path).
        rel: RelPath,
        /// The content's digest, as listed.
        digest: Sha256,
        /// Mode to give it.
        mode: u32,
        /// Created or Updated.
        change: ChangeKind,
        /// A local directory stands there and goes first.
        replace_dir: bool,
    },
    /// Fix permission bits.
    Chmod {
        /// Relative path.
        rel: RelPath,
        /// The mode.
        mode: u32,
    },
    /// Purge (a directory with its subtree; a symlink itself).
    Remove {
        /// Relative path.
        rel: RelPath,
        /// It is a real directory.
        dir: bool,
    },
    /// Purge a local name no listing can hold, as [`Action::Remove`].
    RemoveStray {
        /// The name (topmost: [`Stray::is_topmost`]).
        stray: Stray,
        /// It is a real directory.
        dir: bool,
    },
}

impl Action {
    /// The reported change, if this action is one (the root's own creation
    /// is not reported).
    pub fn change(&self) -> Option<(LocalName, ChangeKind)> {
        let rel = |rel: &RelPath| LocalName::Rel(rel.clone());
        match self {
            Action::CreateRoot { .. } | Action::ChmodRoot { .. } => None,
            Action::Mkdir { rel: r, .. } => Some((rel(r), ChangeKind::Created)),
            Action::Write { rel: r, change, .. } => Some((rel(r), *change)),
            Action::Chmod { rel: r, .. } => Some((rel(r), ChangeKind::Mode)),
            Action::Remove { rel: r, .. } => Some((rel(r), ChangeKind::Removed)),
            Action::RemoveStray { stray, .. } => {
                Some((LocalName::Stray(stray.clone()), ChangeKind::Removed))
            }
        }
    }
}

/// The plan for one destination.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Actions in execution order.
    pub actions: Vec<Action>,
    /// Remote entries already as they should be.
    pub unchanged: usize,
}

impl Plan {
    /// The writes, which need downloads.
    pub fn writes(&self) -> impl Iterator<Item = (&RelPath, &Sha256)> {
        self.actions.iter().filter_map(|a| match a {
            Action::Write { rel, digest, .. } => Some((rel, digest)),
            _ => None,
        })
    }

    /// The names its actions change, in order.
    pub fn changes(&self) -> impl Iterator<Item = LocalName> + '_ {
        self.actions.iter().filter_map(|a| Some(a.change()?.0))
    }
}

/// The directories above `rel`, deepest first, as text (the root is not
/// one): `a/b` and `a` for `a/b/c`.
fn ancestors(rel: &RelPath) -> impl Iterator<Item = &str> {
    let s = rel.as_str();
    s.rmatch_indices('/').map(move |(i, _)| &s[..i])
}

/// Computes the plan; see the module docs for the rules.
pub fn plan(remote: &RemoteTree, local: &LocalTree, use_permissions: bool) -> Plan {
    let changes = changes(remote, local, use_permissions);
    let removes = removals(remote, local, &changes.replaced);
    let mut actions = Vec::new();
    actions.extend(root(remote, local, use_permissions));
    actions.extend(changes.mkdirs);
    actions.extend(changes.writes);
    actions.extend(changes.chmods);
    actions.extend(removes);
    Plan {
        actions,
        unchanged: changes.unchanged,
    }
}

/// What happens to the destination itself: created when missing, its mode
/// fixed when permissions are used and it differs.
fn root(remote: &RemoteTree, local: &LocalTree, use_permissions: bool) -> Option<Action> {
    if !local.exists {
        Some(Action::CreateRoot {
            mode: if use_permissions {
                remote.root_mode
            } else {
                0o755
            },
        })
    } else if use_permissions && local.root_mode != remote.root_mode {
        Some(Action::ChmodRoot {
            mode: remote.root_mode,
        })
    } else {
        None
    }
}

/// What the listing asks of the paths it lists, by phase.
#[derive(Default)]
struct Changes<'a> {
    /// Directories to create, parents first.
    mkdirs: Vec<Action>,
    /// Files to write.
    writes: Vec<Action>,
    /// Modes to fix.
    chmods: Vec<Action>,
    /// Listed entries already as they should be.
    unchanged: usize,
    /// Local directories a listed file replaces: they go wholesale, and
    /// nothing below them needs its own removal.
    replaced: Vec<&'a RelPath>,
}

/// Each listed entry against the local one at its path. Both maps are
/// sorted by path: each is walked once beside the other, no lookups.
fn changes<'a>(remote: &'a RemoteTree, local: &LocalTree, use_permissions: bool) -> Changes<'a> {
    let mut c = Changes::default();
    let mut scanned = local.entries.iter().peekable();
    for (rel, r) in &remote.entries {
        while scanned.next_if(|(k, _)| *k < rel).is_some() {}
        let l = scanned.next_if(|(k, _)| *k == rel).map(|(_, l)| l);
        let chmod = |c: &mut Changes, local_mode: u32| {
            if use_permissions && local_mode != r.mode {
                c.chmods.push(Action::Chmod {
                    rel: rel.clone(),
                    mode: r.mode,
                });
            } else {
                c.unchanged += 1;
            }
        };
        match (&r.kind, l) {
            (RemoteKind::Dir, Some(l)) if l.kind == LocalKind::Dir => chmod(&mut c, l.mode),
            (RemoteKind::Dir, l) => c.mkdirs.push(Action::Mkdir {
                rel: rel.clone(),
                mode: if use_permissions { r.mode } else { 0o755 },
                replace: l.is_some(),
            }),
            (RemoteKind::File { digest }, None) => c.writes.push(Action::Write {
                rel: rel.clone(),
                digest: *digest,
                mode: if use_permissions { r.mode } else { 0o644 },
                change: ChangeKind::Created,
                replace_dir: false,
            }),
            (RemoteKind::File { digest }, Some(l))
                if l.kind == LocalKind::File && l.sha256 == Some(*digest) =>
            {
                chmod(&mut c, l.mode)
            }
            (RemoteKind::File { digest }, Some(l)) => {
                let mode = match (use_permissions, l.kind) {
                    (true, _) => r.mode,
                    (false, LocalKind::File) => l.mode,
                    (false, _) => 0o644,
                };
                let replace_dir = l.kind == LocalKind::Dir;
                if replace_dir {
                    c.replaced.push(rel);
                }
                c.writes.push(Action::Write {
                    rel: rel.clone(),
                    digest: *digest,
                    mode,
                    change: ChangeKind::Updated,
                    replace_dir,
                });
            }
        }
    }
    c
}

/// What goes away, deepest first: the topmost local entries the listing
/// lacks (below a local symlink nothing was scanned; below a removed or
/// replaced directory the subtree goes with it), then the topmost strays
/// not below one of those.
fn removals(remote: &RemoteTree, local: &LocalTree, replaced: &[&RelPath]) -> Vec<Action> {
    // Local paths that go with their whole subtree: the replaced ones and
    // the removals planned so far. One set lookup per ancestor keeps
    // planning linear in the entries (a scan of the removals planned so
    // far made 8,000 sibling purges cost seconds). Parents sort before
    // their children, so a directory is decided before what is below it.
    let mut gone: HashSet<&str> = replaced.iter().map(|r| r.as_str()).collect();
    let mut removes = Vec::new();
    let mut listed = remote.entries.keys().peekable();
    for (rel, l) in &local.entries {
        probe();
        while listed.next_if(|k| *k < rel).is_some() {}
        if listed.next_if(|k| *k == rel).is_some() {
            continue;
        }
        let covered = ancestors(rel).any(|a| {
            probe();
            gone.contains(a)
        });
        if covered {
            continue;
        }
        gone.insert(rel.as_str());
        removes.push(Action::Remove {
            rel: rel.clone(),
            dir: l.kind == LocalKind::Dir,
        });
    }
    for (stray, l) in local.strays.iter().filter(|(s, _)| s.is_topmost()) {
        let parent = &stray.parent;
        let covered = gone.contains(parent.as_str()) || ancestors(parent).any(|a| gone.contains(a));
        if !covered {
            removes.push(Action::RemoveStray {
                stray: stray.clone(),
                dir: l.kind == LocalKind::Dir,
            });
        }
    }
    removes.reverse();
    removes
}

/// The removal guard's floor: a destination holding fewer files than this
/// is never guarded (taking 6 of 8 files away is an ordinary change, and a
/// percentage of a handful says nothing about the master's tree).
pub const GUARD_MIN_FILES: usize = 10;

/// How many of a destination's files a plan takes away
/// (docs/agent.md#the-removal-guard). Files are the local non-directories
/// (regular files,
/// symlinks, others); one is taken away when the listing has no file at
/// its path: purged itself, purged with a directory above it, or replaced
/// by a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    /// Files the plan takes away.
    pub removed: usize,
    /// Files the destination holds now.
    pub total: usize,
}

impl Removal {
    /// Counts, for the plan of `remote` over `local` (with `purge`; without
    /// it nothing is removed but what a directory replaces).
    pub fn count(remote: &RemoteTree, local: &LocalTree, purge: bool) -> Removal {
        let mut r = Removal {
            removed: 0,
            total: 0,
        };
        // Both maps are sorted by path: one walk of each, no lookups.
        let mut listed = remote.entries.iter().peekable();
        for (rel, l) in &local.entries {
            if l.kind == LocalKind::Dir {
                continue;
            }
            r.total += 1;
            while listed.next_if(|(k, _)| *k < rel).is_some() {}
            let taken = match listed.peek() {
                Some((k, e)) if *k == rel => !matches!(e.kind, RemoteKind::File { .. }),
                _ => purge,
            };
            r.removed += usize::from(taken);
        }
        // A name the listing cannot hold is purged like any extra.
        for l in local.strays.values() {
            if l.kind != LocalKind::Dir {
                r.total += 1;
                r.removed += usize::from(purge);
            }
        }
        r
    }

    /// The paths of the local files the plan takes away (those [`count`]
    /// counts, less the names a listing cannot hold), sorted.
    ///
    /// [`count`]: Removal::count
    pub fn paths<'a>(remote: &RemoteTree, local: &'a LocalTree, purge: bool) -> Vec<&'a RelPath> {
        local
            .entries
            .iter()
            .filter(|(rel, l)| l.kind != LocalKind::Dir && taken(remote, rel, purge))
            .map(|(rel, _)| rel)
            .collect()
    }

    /// True when the guard refuses: the destination holds at least
    /// [`GUARD_MIN_FILES`] files and more than `max_percent` % of them
    /// would go. `None` (`--allow-mass-removal`) never refuses.
    pub fn refused(&self, max_percent: Option<u8>) -> bool {
        let Some(max) = max_percent else {
            return false;
        };
        self.total >= GUARD_MIN_FILES && self.removed * 100 > usize::from(max) * self.total
    }
}

/// Whether the plan takes the local file at `rel` away: the listing has
/// no file there (nothing, with `purge`, or a directory).
fn taken(remote: &RemoteTree, rel: &RelPath, purge: bool) -> bool {
    match remote.entries.get(rel) {
        Some(e) => !matches!(e.kind, RemoteKind::File { .. }),
        None => purge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::RemoteEntry;
    use crate::scan::LocalEntry;

    fn remote(entries: &[(&str, Option<&str>, u32)]) -> RemoteTree {
        RemoteTree {
            root_mode: 0o755,
            entries: entries
                .iter()
                .map(|(p, sha, mode)| {
                    let kind = match sha {
                        Some(s) => RemoteKind::File {
                            digest: Sha256::of(s.as_bytes()),
                        },
                        None => RemoteKind::Dir,
                    };
                    (
                        RelPath::parse(p).unwrap(),
                        RemoteEntry { kind, mode: *mode },
                    )
                })
                .collect(),
        }
    }

    fn local(entries: &[(&str, LocalKind, Option<&str>, u32)]) -> LocalTree {
        LocalTree {
            exists: true,
            root_mode: 0o755,
            entries: entries
                .iter()
                .map(|(p, kind, sha, mode)| {
                    (
                        rp(p),
                        LocalEntry {
                            kind: *kind,
                            mode: *mode,
                            sha256: sha.map(|s| Sha256::of(s.as_bytes())),
                            stat: pluginsync_common::filesig::FileSig {
                                size: 0,
                                mtime_ns: 0,
                                ctime_ns: 0,
                                ino: 0,
                                dev: 0,
                            },
                        },
                    )
                })
                .collect(),
            ..LocalTree::default()
        }
    }

    fn rp(p: &str) -> RelPath {
        RelPath::parse(p).unwrap()
    }

    fn changes(p: &Plan) -> Vec<(String, &'static str)> {
        p.actions
            .iter()
            .filter_map(|a| a.change())
            .map(|(path, c)| (path.to_string(), c.as_str()))
            .collect()
    }

    #[test]
    fn initial_sync_creates_everything_parents_first() {
        let r = remote(&[
            ("a", None, 0o750),
            ("a/x.rb", Some("11"), 0o755),
            ("b.rb", Some("22"), 0o600),
        ]);
        let p = plan(&r, &LocalTree::default(), true);
        assert_eq!(p.actions[0], Action::CreateRoot { mode: 0o755 });
        assert_eq!(
            changes(&p),
            vec![
                ("a".into(), "created"),
                ("a/x.rb".into(), "created"),
                ("b.rb".into(), "created")
            ]
        );
        assert!(p.actions.contains(&Action::Mkdir {
            rel: rp("a"),
            mode: 0o750,
            replace: false
        }));
        assert_eq!(p.writes().count(), 2);
    }

    #[test]
    fn in_sync_is_empty() {
        let r = remote(&[("a", None, 0o755), ("a/x.rb", Some("11"), 0o644)]);
        let l = local(&[
            ("a", LocalKind::Dir, None, 0o755),
            ("a/x.rb", LocalKind::File, Some("11"), 0o644),
        ]);
        let p = plan(&r, &l, true);
        assert!(p.actions.is_empty());
        assert_eq!(p.unchanged, 2);
    }

    #[test]
    fn changed_content_and_modes() {
        let r = remote(&[("x.rb", Some("new"), 0o644), ("y.sh", Some("same"), 0o755)]);
        let l = local(&[
            ("x.rb", LocalKind::File, Some("old"), 0o600),
            ("y.sh", LocalKind::File, Some("same"), 0o644),
        ]);
        let p = plan(&r, &l, true);
        assert_eq!(
            changes(&p),
            vec![("x.rb".into(), "updated"), ("y.sh".into(), "mode")]
        );
        // With source_permissions = ignore, existing modes stay and a
        // replaced file keeps its mode.
        let p = plan(&r, &l, false);
        assert_eq!(changes(&p), vec![("x.rb".into(), "updated")]);
        assert!(matches!(&p.actions[0], Action::Write { mode: 0o600, .. }));
    }

    #[test]
    fn purges_topmost_junk_only_children_first() {
        let r = remote(&[("keep.rb", Some("1"), 0o644)]);
        let l = local(&[
            ("junk", LocalKind::Dir, None, 0o755),
            ("junk/deep", LocalKind::Dir, None, 0o755),
            ("junk/deep/x", LocalKind::File, None, 0o644),
            ("keep.rb", LocalKind::File, Some("1"), 0o644),
            ("stray.rb", LocalKind::File, None, 0o644),
            ("link", LocalKind::Symlink, None, 0o777),
        ]);
        let p = plan(&r, &l, true);
        assert_eq!(
            changes(&p),
            vec![
                ("stray.rb".into(), "removed"),
                ("link".into(), "removed"),
                ("junk".into(), "removed")
            ]
        );
        assert!(p.actions.contains(&Action::Remove {
            rel: rp("link"),
            dir: false
        }));
    }

    #[test]
    fn type_changes_replace_with_force() {
        let r = remote(&[
            ("d", None, 0o755),
            ("f", Some("1"), 0o644),
            ("l", Some("2"), 0o644),
        ]);
        let l = local(&[
            ("d", LocalKind::File, None, 0o644),
            ("f", LocalKind::Dir, None, 0o755),
            ("f/child", LocalKind::File, None, 0o644),
            ("l", LocalKind::Symlink, None, 0o777),
        ]);
        let p = plan(&r, &l, true);
        assert_eq!(
            changes(&p),
            vec![
                ("d".into(), "created"),
                ("f".into(), "updated"),
                ("l".into(), "updated")
            ]
        );
        assert!(p.actions.contains(&Action::Mkdir {
            rel: rp("d"),
            mode: 0o755,
            replace: true
        }));
        assert!(p.actions.iter().any(
            |a| matches!(a, Action::Write { rel, replace_dir: true, .. } if rel.as_str() == "f")
        ));
        assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Remove { .. })),
            "f/child goes with f"
        );
    }

    /// Planning is linear in the entries: 50,000 sibling removals (and as
    /// many below a removed directory) cost a few lookups each, not one per
    /// removal planned before them (A-6: 8,000 removals took 6.6 s).
    #[test]
    fn purge_planning_is_linear_in_removals() {
        let probes = |n: usize| {
            let mut l = LocalTree {
                exists: true,
                root_mode: 0o755,
                ..LocalTree::default()
            };
            let entry = local(&[("x", LocalKind::File, None, 0o644)])
                .entries
                .into_values()
                .next()
                .unwrap();
            for i in 0..n {
                l.entries.insert(rp(&format!("junk{i}")), entry.clone());
                l.entries.insert(rp(&format!("gone/sub{i}")), entry.clone());
            }
            let mut dir = entry;
            dir.kind = LocalKind::Dir;
            l.entries.insert(rp("gone"), dir);
            PROBES.with(|p| p.set(0));
            let p = plan(&remote(&[]), &l, true);
            assert_eq!(p.actions.len(), n + 1, "junk{{i}} and gone, not gone/*");
            PROBES.with(|p| p.get())
        };
        let n = 50_000;
        let (half, full) = (probes(n / 2), probes(n));
        assert!(
            full <= 4 * (2 * n as u64 + 1),
            "{full} lookups for {n} removals"
        );
        assert!(full <= 2 * half + 8, "not linear: {half} then {full}");
    }

    #[test]
    fn ignore_mode_defaults_for_new_entries() {
        let r = remote(&[("d", None, 0o700), ("d/x", Some("1"), 0o700)]);
        let p = plan(&r, &LocalTree::default(), false);
        assert!(p.actions.contains(&Action::Mkdir {
            rel: rp("d"),
            mode: 0o755,
            replace: false
        }));
        assert!(
            p.actions
                .iter()
                .any(|a| matches!(a, Action::Write { mode: 0o644, .. }))
        );
    }

    /// `n` local files `f0..` under `d/`, and a listing keeping `kept` of
    /// them.
    fn trees(n: usize, kept: usize) -> (RemoteTree, LocalTree) {
        let names: Vec<String> = (0..n).map(|i| format!("d/f{i}")).collect();
        let mut l: Vec<(&str, LocalKind, Option<&str>, u32)> =
            vec![("d", LocalKind::Dir, None, 0o755)];
        l.extend(
            names
                .iter()
                .map(|p| (p.as_str(), LocalKind::File, Some("aa"), 0o644)),
        );
        let mut r: Vec<(&str, Option<&str>, u32)> = vec![("d", None, 0o755)];
        r.extend(
            names[..kept]
                .iter()
                .map(|p| (p.as_str(), Some("aa"), 0o644)),
        );
        (remote(&r), local(&l))
    }

    #[test]
    fn removal_counts_files_not_directories() {
        let (r, l) = trees(20, 2);
        let c = Removal::count(&r, &l, true);
        assert_eq!(
            c,
            Removal {
                removed: 18,
                total: 20
            }
        );
        assert_eq!(Removal::paths(&r, &l, true).len(), 18);
        // Without purge nothing is taken away.
        assert_eq!(Removal::count(&r, &l, false).removed, 0);
        assert!(Removal::paths(&r, &l, false).is_empty());
        // A whole directory gone counts every file below it.
        let empty = remote(&[]);
        assert_eq!(Removal::count(&empty, &l, true).removed, 20);
        // A file replaced by a directory is taken away too.
        let dir_over_file = remote(&[("d", None, 0o755), ("d/f0", None, 0o755)]);
        let (_, l1) = trees(1, 0);
        assert_eq!(
            Removal::count(&dir_over_file, &l1, true),
            Removal {
                removed: 1,
                total: 1
            }
        );
    }

    #[test]
    fn removal_guard_threshold_and_floor() {
        // 90 % of 20 goes: refused at 50, not at 90 or with the override.
        let (r, l) = trees(20, 2);
        let c = Removal::count(&r, &l, true);
        assert!(c.refused(Some(50)));
        assert!(!c.refused(Some(90)));
        assert!(!c.refused(None));
        // Exactly 50 % is allowed, one more file is not.
        assert!(
            !Removal {
                removed: 10,
                total: 20
            }
            .refused(Some(50))
        );
        assert!(
            Removal {
                removed: 11,
                total: 20
            }
            .refused(Some(50))
        );
        // Below the floor the guard never speaks.
        let small = Removal {
            removed: GUARD_MIN_FILES - 1,
            total: GUARD_MIN_FILES - 1,
        };
        assert!(!small.refused(Some(0)));
        assert!(
            Removal {
                removed: 1,
                total: GUARD_MIN_FILES
            }
            .refused(Some(0))
        );
    }

    /// Local names no listing can hold are purged (the topmost only, and
    /// not below a directory purged already) and counted by the guard.
    #[test]
    fn strays_are_purged_like_any_extra() {
        let mut l = local(&[
            ("keep", LocalKind::Dir, None, 0o755),
            ("junk", LocalKind::Dir, None, 0o755),
        ]);
        let entry = |kind| LocalEntry {
            kind,
            ..l.entries[&rp("keep")].clone()
        };
        for (parent, rest, kind) in [
            ("keep", "a\\b", LocalKind::Dir),
            ("keep", "a\\b/x", LocalKind::File),
            ("junk", "c\\d", LocalKind::File),
            (".", "e\\f", LocalKind::File),
        ] {
            let stray = Stray {
                parent: rp(parent),
                rest: rest.into(),
            };
            l.strays.insert(stray, entry(kind));
        }
        let r = remote(&[("keep", None, 0o755)]);
        let p = plan(&r, &l, true);
        assert_eq!(
            changes(&p),
            vec![
                ("keep/a\\b".into(), "removed"),
                ("e\\f".into(), "removed"),
                ("junk".into(), "removed")
            ]
        );
        assert!(p.actions.iter().any(|a| matches!(
            a,
            Action::RemoveStray { stray, dir: true } if stray.parent == rp("keep")
        )));
        assert_eq!(
            Removal::count(&r, &l, true),
            Removal {
                removed: 3,
                total: 3
            }
        );
        assert_eq!(Removal::count(&r, &l, false).removed, 0);
    }
}
