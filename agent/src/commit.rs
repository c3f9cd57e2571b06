//! Commit: put verified downloads in place and purge, in the plan's order.
//!
//! Runs only after every download of the run has been verified and made
//! durable with its mode (`stage::seal`). Directories are made
//! parents-first, staged files are renamed over their targets (atomic: a
//! reader sees the old file or the new one, never half of either), modes
//! are fixed, then purges run. Each step that fails is recorded and the
//! others still run.
//!
//! **Durability** (`durable.rs`): before [`commit`] returns, everything it
//! changed is on disk, at the cost of what it changed alone.
//!
//! **No path is ever resolved through a link**
//! (`tests/e2e/agent_faults.rs`, a racing user): a local
//! user who can rename inside the libdir must not be able to redirect a
//! write or a removal of this (root) process. Every step acts on a name
//! relative to a directory descriptor, and every descriptor is opened from
//! the destination's root down one component at a time with `O_NOFOLLOW`
//! (`dirs.rs`, `Dirs`): `openat` (a component that is a symlink or not a directory
//! fails that step with ELOOP/ENOTDIR), `mkdirat`, `renameat` (staged file
//! in `<dest>/.pluginsync-staging` → its target, same filesystem),
//! `unlinkat`, and `fchmod` on an entry opened `O_NOFOLLOW`. A purged
//! directory is removed by walking it the same way: a symlink entry is
//! unlinked itself, never followed. The destination's own path is
//! configuration (trusted) and is opened as given.
//!
//! Before the first step, [`check_space`] (`space.rs`) makes sure the destination's
//! filesystem has the inodes and blocks the commit needs, so a full disk
//! refuses the whole commit instead of applying part of it.

mod dirs;
mod durable;
mod error;
mod mirror;
mod record;
mod space;
mod switch;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;
use pluginsync_common::fsutil::Durable;
use pluginsync_common::relpath::RelPath;
use rustix::fs::Mode;
use rustix::io::Errno;

use crate::catalog::FileResource;
use crate::listing::{MODE_MASK, STAGING_DIR};
use crate::plan::{Action, ChangeKind, Plan};
use crate::scan::{self, LocalName, LocalTree, Stray};
pub use dirs::premake;
use dirs::{DIR_FLAGS, Dirs, chmod_entry, remove_entry};
pub use durable::Syncing;

pub use error::CommitError;
pub use mirror::{Mirror, MirrorError};
pub use record::GenState;
use record::{foreign_in, unix_ns};
pub use space::{SpaceError, check_space};
use switch::standby_for;
pub use switch::{
    Foreseen, NO_EXCHANGE_ENV, Standby, SwitchError, container_of, foresee, fresh_standby,
    sweep_trash,
};

/// What a commit did.
#[derive(Debug, Default)]
pub struct Committed {
    /// Applied changes (relative path, kind).
    pub changes: Vec<(LocalName, ChangeKind)>,
    /// Failed steps (relative path, `None` for the destination itself;
    /// the error).
    pub failures: Vec<(Option<LocalName>, CommitError)>,
    /// The regular files put in place (created or updated), in order: what
    /// the loaders see.
    pub written: Vec<RelPath>,
}

/// One step.
fn apply(
    dirs: &mut Dirs<'_>,
    action: &Action,
    staged: &HashMap<RelPath, PathBuf>,
    resource: &FileResource,
) -> Result<(), CommitError> {
    match action {
        Action::CreateRoot { mode } => create_root(dirs, *mode),
        Action::ChmodRoot { mode } => chmod_root(dirs, *mode),
        Action::Mkdir { rel, mode, replace } => mkdir(dirs, rel, *mode, *replace, resource.force),
        // The staged file has its mode already (stage::seal).
        Action::Write {
            rel, replace_dir, ..
        } => {
            let tmp = staged
                .get(rel)
                .ok_or_else(|| CommitError::NotDownloaded(rel.to_path(dirs.dest)))?;
            write(dirs, rel, tmp, *replace_dir, resource.force)
        }
        Action::Chmod { rel, mode } => chmod(dirs, rel, *mode),
        Action::Remove { rel, .. } if resource.purge => {
            let (depth, name) = dirs.parent_changed(rel)?;
            clear(dirs, depth, rel, name)
        }
        Action::RemoveStray { stray, .. } if resource.purge => remove_stray(dirs, stray),
        Action::Remove { .. } | Action::RemoveStray { .. } => Ok(()),
    }
}

/// Creates the destination (and what is missing above it) with `mode`.
fn create_root(dirs: &mut Dirs<'_>, mode: u32) -> Result<(), CommitError> {
    let dest = dirs.dest;
    let mut p = dest;
    while !p.exists() {
        dirs.created.push(p.to_owned());
        match p.parent() {
            Some(parent) => p = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(dest).map_err(|source| CommitError::Io {
        what: "create",
        path: dest.to_owned(),
        source,
    })?;
    chmod_root(dirs, mode)
}

/// Sets the destination's own mode.
fn chmod_root(dirs: &mut Dirs<'_>, mode: u32) -> Result<(), CommitError> {
    dirs.root()?;
    dirs.changed(0, &RelPath::root());
    rustix::fs::fchmod(dirs.root()?, Mode::from_raw_mode(mode & MODE_MASK))
        .map_err(CommitError::io("chmod", dirs.dest.join("")))
}

/// Makes the directory `rel` with `mode`, after removing what stands
/// there when `replace` (refused unless `force`).
fn mkdir(
    dirs: &mut Dirs<'_>,
    rel: &RelPath,
    mode: u32,
    replace: bool,
    force: bool,
) -> Result<(), CommitError> {
    let dest = dirs.dest;
    let (depth, name) = dirs.parent_changed(rel)?;
    if replace {
        if !force {
            return Err(CommitError::InTheWay(rel.to_path(dest)));
        }
        clear(dirs, depth, rel, name)?;
    }
    let parent = dirs.fd(depth);
    let io = |what| CommitError::io(what, rel.to_path(dest));
    // Made with its planned mode while the downloads ran (`premake`).
    let premade = dirs.in_place && !replace && dirs.premade.is_some_and(|p| p.contains(rel));
    if premade && dirs.synced_whole {
        return Ok(());
    }
    if !premade {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode & MODE_MASK)) {
            // Made by the downloads that filled it (`Dirs::in_place`); the
            // open below refuses anything but a directory.
            Err(Errno::EXIST) if dirs.in_place => {}
            made => made.map_err(io("create"))?,
        }
    }
    // mkdir's mode went through the umask: set it exactly, on the
    // directory just made (opened without following a link).
    let fd = rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(io("open"))?;
    if !premade {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & MODE_MASK)).map_err(io("chmod"))?;
    }
    dirs.changed_entry(fd.as_fd(), rel);
    let name = rel.file_name().unwrap_or_default();
    dirs.made(depth, name, fd);
    Ok(())
}

/// Removes what stands at `rel`, the entry `name` of the open directory
/// at `depth`, never through a symlink.
fn clear(
    dirs: &mut Dirs<'_>,
    depth: usize,
    rel: &RelPath,
    name: &OsStr,
) -> Result<(), CommitError> {
    dirs.forget(rel);
    remove_entry(dirs.fd(depth), name).map_err(|source| CommitError::Io {
        what: "remove",
        path: rel.to_path(dirs.dest),
        source,
    })
}

/// Renames the staged file `tmp` over `rel`, after removing a directory
/// standing there when `replace_dir` (refused unless `force`).
fn write(
    dirs: &mut Dirs<'_>,
    rel: &RelPath,
    tmp: &Path,
    replace_dir: bool,
    force: bool,
) -> Result<(), CommitError> {
    let dest = dirs.dest;
    if dirs.in_place && !replace_dir && tmp == rel.to_path(dest) {
        // Written there by its download: only its directory's entry is
        // left to make durable, unless its filesystem is synced whole.
        if !dirs.synced_whole {
            dirs.parent_changed(rel)?;
        }
        return Ok(());
    }
    let tmp_name = match (tmp.parent(), tmp.file_name()) {
        (Some(dir), Some(name)) if dir == dirs.staged_in.join(STAGING_DIR) => name,
        _ => return Err(CommitError::NotStaged(tmp.to_owned())),
    };
    let (depth, name) = dirs.parent_changed(rel)?;
    if replace_dir {
        if !force {
            return Err(CommitError::DirectoryInTheWay(rel.to_path(dest)));
        }
        clear(dirs, depth, rel, name)?;
    }
    dirs.staging(tmp)?;
    dirs.move_to_trash(depth, name);
    // renameat(2) replaces a file or a symlink itself, never a link's
    // target.
    rustix::fs::renameat(dirs.staging_fd(), tmp_name, dirs.fd(depth), name)
        .map_err(CommitError::io("rename into", rel.to_path(dest)))
}

/// Sets the mode of `rel`, never through a symlink.
fn chmod(dirs: &mut Dirs<'_>, rel: &RelPath, mode: u32) -> Result<(), CommitError> {
    let dest = dirs.dest;
    let (depth, name) = dirs.parent_of(rel)?;
    let fd = chmod_entry(dirs.fd(depth), name, mode).map_err(|e| {
        if e == Errno::LOOP {
            CommitError::BecameSymlink(rel.to_path(dest))
        } else {
            CommitError::io("chmod", rel.to_path(dest))(e)
        }
    })?;
    dirs.changed_entry(fd.as_fd(), rel);
    Ok(())
}

/// Purges a local name no listing can hold, as a removal.
fn remove_stray(dirs: &mut Dirs<'_>, stray: &Stray) -> Result<(), CommitError> {
    let depth = dirs.open(&stray.parent)?;
    dirs.changed(depth, &stray.parent);
    remove_entry(dirs.fd(depth), stray.name()).map_err(|source| CommitError::Io {
        what: "remove",
        path: stray.to_path(dirs.dest),
        source,
    })
}

/// Applies `plan` to `dest` and makes it durable; see the module docs.
/// `staged`: relative path → staged file, durable with its mode already;
/// `created`: the destination directories its staging made (deepest
/// first), whose entries are made durable too.
pub fn commit(
    dest: &Path,
    plan: &Plan,
    staged: &HashMap<RelPath, PathBuf>,
    created: &[PathBuf],
    resource: &FileResource,
) -> Committed {
    commit_into(
        Dirs::new(dest, dest, Durable::new()),
        plan,
        staged,
        created,
        resource,
    )
}

/// [`commit`] through `dirs`: into the destination itself, or into its
/// standby with the staged files of the live tree (`switch.rs`).
fn commit_into(
    mut dirs: Dirs<'_>,
    plan: &Plan,
    staged: &HashMap<RelPath, PathBuf>,
    created: &[PathBuf],
    resource: &FileResource,
) -> Committed {
    let out = apply_plan(&mut dirs, plan, staged, resource);
    durable::make_durable(dirs, created);
    out
}

/// The steps of [`commit_into`], without the durability step.
fn apply_plan(
    dirs: &mut Dirs<'_>,
    plan: &Plan,
    staged: &HashMap<RelPath, PathBuf>,
    resource: &FileResource,
) -> Committed {
    let dest = dirs.dest;
    let mut out = Committed::default();
    for action in &plan.actions {
        let change = action.change();
        match apply(dirs, action, staged, resource) {
            Ok(()) => {
                if let Action::Write { rel, .. } = action {
                    out.written.push(rel.clone());
                }
                if let Some((name, kind)) = change {
                    tracing::trace!(path = %name, change = kind.as_str(), "committed");
                    if kind != ChangeKind::Removed || resource.purge {
                        out.changes.push((name, kind));
                    }
                }
            }
            Err(e) => {
                let name = change.map(|(name, _)| name);
                let path = name
                    .as_ref()
                    .map_or_else(|| dest.join(""), |n| n.to_path(dest));
                // Printed once for the run (output.rs); every one is in the
                // report.
                tracing::debug!(path = %path.display(), error = %e, "change failed");
                out.failures.push((name, e));
            }
        }
    }
    out
}

/// A destination's next generation, complete beside the live tree and on
/// disk, waiting for its switch ([`switch`]).
pub struct Prepared {
    standby: Standby,
    /// What the commit into the standby did (the report's changes).
    pub committed: Committed,
    /// The standby's scan once prepared, with its digest: the live tree's
    /// after the switch (the cache's stat cache follows the switch with it).
    pub after: Option<(LocalTree, Sha256)>,
    /// What will be known of the generation the switch retires.
    state: Option<GenState>,
    /// An entry someone else wrote in the standby while it was prepared
    /// ([`foreign_in`]): its scan is not learned, the stat cache is
    /// cleared, and the next run reads every file again.
    pub foreign: Option<RelPath>,
}

/// Why the next generation could not be prepared; the live tree is as it
/// was.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The standby trees.
    #[error(transparent)]
    Switch(#[from] SwitchError),
    /// Making the standby equal to the live tree.
    #[error(transparent)]
    Mirror(#[from] MirrorError),
    /// The staged files could not join the standby's durability step.
    #[error("cannot sync the staged files: {0}")]
    Sealed(#[source] std::io::Error),
    /// The standby could not be made durable.
    #[error("cannot sync '{}': {source}", path.display())]
    Sync {
        /// What failed to sync.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The staged files of a destination, for [`prepare`].
pub struct Staged<'a> {
    /// Relative path → staged file, with its mode.
    pub files: &'a HashMap<RelPath, PathBuf>,
    /// The destination directories its staging made (deepest first).
    pub created: &'a [PathBuf],
    /// The staged files, not synced yet (`stage.rs`): taken into the
    /// standby's durability step when there is a switch, left to the
    /// caller to sync before an in-place commit otherwise.
    pub sealed: &'a mut Durable,
    /// The files were downloaded straight into the standby
    /// [`fresh_standby`] gave, their directories made on the way: nothing
    /// to mirror, nothing to rename.
    pub in_standby: bool,
    /// The standby's record, read while the files were downloaded
    /// ([`foresee`]).
    pub foreseen: Option<Foreseen>,
    /// With `in_standby`: the directories made with their planned mode
    /// while the files were downloaded ([`premake`]).
    pub premade: Option<&'a std::collections::HashSet<RelPath>>,
}

/// Prepares the next generation of `dest` in its standby
/// (docs/internals.md#the-switch): the standby made equal to the live
/// tree where it differs (`mirror.rs`: only the paths its [`GenState`]
/// names when the live tree (`local`, its scan) is still the one it was
/// recorded against, else all of it), then `plan` applied to it with the
/// live tree's staged files, all of it durable in one step, staged files
/// included, on a thread ([`Syncing`], to wait for before the switch).
/// `Ok(None)`: no switch here ([`standby_for`]); the caller commits in
/// place. `keep`: `[switch] keep_previous`.
pub fn prepare(
    dest: &Path,
    plan: &Plan,
    (local, local_digest): (&LocalTree, Sha256),
    Staged {
        files: staged,
        created,
        sealed,
        in_standby,
        foreseen,
        premade,
    }: Staged<'_>,
    resource: &FileResource,
    keep: usize,
) -> Result<Option<(Prepared, Syncing)>, PrepareError> {
    let started = std::time::Instant::now();
    let since = unix_ns(std::time::SystemTime::now());
    let ms = || started.elapsed().as_secs_f64() * 1000.0;
    let Some(standby) = open_standby(dest, in_standby)? else {
        return Ok(None);
    };
    let (slot, known) = standby.take_next(keep, foreseen)?;
    tracing::debug!(dest = %dest.display(), known = known.is_some(), elapsed_ms = ms(), "standby taken");
    let known = known
        .filter(|k| k.live_digest == local_digest && !local.ignored && local.strays.is_empty());
    let skip = mirror::left_to_the_plan(plan, resource.purge);
    let mut mirror = Mirror::new(&slot, &skip, true);
    let fast = match &known {
        Some(k) => mirror.run_paths(dest, &slot, &k.changed).map_err(|e| {
            tracing::debug!(error = %e, "the standby is walked whole");
        }),
        // The live tree is empty and the standby holds the downloads:
        // only the root's mode and owner are the live tree's to copy (the
        // standby was made 0700), so the plan's root mode applies to what
        // the switch makes live (docs/agent.md: the root is part of the
        // tree). A root that cannot be given them is fixed by the plan.
        None if in_standby => {
            if let Err(e) = mirror.run_paths(dest, &slot, &[]) {
                tracing::debug!(error = %e, "the standby's root keeps its mode");
            }
            Ok(())
        }
        None => Err(()),
    };
    if fast.is_err() {
        mirror = Mirror::new(&slot, &skip, true);
        mirror.run(dest, &slot)?;
    }
    if let Some(below) = &mirror.crossed {
        tracing::warn!(dest = %dest.display(), below = %below, "a mount point below the destination: committing in place, file by file (no rollback)");
        return Ok(None);
    }
    tracing::debug!(dest = %dest.display(), fast = fast.is_ok(), mirrored = mirror.diffs.len(), elapsed_ms = ms(), "standby mirrored");
    // The paths the standby's scan is stat'ed again at: not the root
    // (always stat'ed), nor a stray.
    let mut touched: Vec<LocalName> = (mirror.diffs.into_iter())
        .filter(|(name, _)| matches!(name, LocalName::Rel(rel) if !rel.is_root()))
        .map(|(name, _)| name)
        .collect();
    // Renamed into the standby, the staged files are visible to nobody
    // until the switch: synced with it, in one step (stage.rs).
    let mut durable = mirror.durable;
    if let Err(e) = durable.absorb(std::mem::take(sealed)) {
        return Err(PrepareError::Sealed(e));
    }
    let mut dirs = Dirs::new(&slot, dest, durable);
    (dirs.in_place, dirs.trash) = (in_standby, standby.trash().map(|fd| (fd, 0)));
    dirs.premade = premade;
    // A failed stat only leaves the commit its usual steps.
    let dev = in_standby.then(|| rustix::fs::stat(&slot).ok()).flatten();
    dirs.synced_whole = dev.is_some_and(|st| dirs.durable.syncs_whole(st.st_dev));
    let committed = apply_plan(&mut dirs, plan, staged, resource);
    tracing::debug!(dest = %dest.display(), elapsed_ms = ms(), "plan applied to the standby");
    let changed: Vec<LocalName> = plan.changes().collect();
    touched.extend(changed.iter().cloned());
    // Synced on a thread of its own: the standby's scan is read, and the
    // next destination prepared, while it is written back; the switch
    // waits for it (`Syncing::wait`).
    let durable = durable::collect(dirs, created);
    let syncing = Syncing::start(durable, &slot, standby.dir.clone())?;
    let clean = committed.failures.is_empty();
    let fast = known.filter(|_| fast.is_ok());
    let (after, state) = record(&slot, fast, &touched, changed, local, resource, clean);
    // A fresh standby was never live: nobody holds a descriptor into it.
    let foreign = (!in_standby)
        .then(|| foreign_written(dest, after.as_ref(), &touched, since))
        .flatten();
    tracing::debug!(dest = %dest.display(), elapsed_ms = ms(), "standby prepared, syncing");
    let prepared = Prepared {
        standby,
        committed,
        after,
        state,
        foreign,
    };
    Ok(Some((prepared, syncing)))
}

/// An entry of `touched` another process wrote in `dest`'s prepared
/// standby, whose scan is `after` (`record::foreign_in`, the preparation
/// begun at `since`), said in one warning.
fn foreign_written(
    dest: &Path,
    after: Option<&(LocalTree, Sha256)>,
    touched: &[LocalName],
    since: i64,
) -> Option<RelPath> {
    let rel = foreign_in(&after?.0, touched, since)?;
    tracing::warn!(dest = %dest.display(), path = %rel, "another process wrote in the standby while it was prepared (through a descriptor held since it was a live tree): its files are read again by the next run");
    Some(rel)
}

/// What [`prepare`] leaves known once `slot` is prepared: its scan and its
/// digest, the live tree's after the switch (the standby's record `fast`,
/// taken when the mirror could trust it, with the `touched` paths stat'ed
/// again; else a scan of it), and, after a `clean` commit, the record of
/// the tree the switch retires (`local`, and the paths the plan `changed`).
fn record(
    slot: &Path,
    fast: Option<GenState>,
    touched: &[LocalName],
    changed: Vec<LocalName>,
    local: &LocalTree,
    resource: &FileResource,
    clean: bool,
) -> (Option<(LocalTree, Sha256)>, Option<GenState>) {
    let after = match fast {
        Some(k) => Some(k.scan.into_updated(slot, touched)),
        None => scan::scan(slot, &resource.ignore).ok(),
    };
    let after = after.map(|tree| {
        let digest = tree.digest();
        (tree, digest)
    });
    let state = after.as_ref().filter(|_| clean).and_then(|(_, digest)| {
        let changed = changed.into_iter().map(|n| match n {
            LocalName::Rel(rel) => Some(rel),
            LocalName::Stray(_) => None,
        });
        Some(GenState {
            live_digest: *digest,
            changed: changed.collect::<Option<Vec<_>>>()?,
            scan: local.clone(),
        })
    });
    (after, state)
}

/// [`standby_for`] in [`prepare`]: `None` (said in one warning, unless
/// there is no live directory) commits in place; but files downloaded
/// into the standby (`in_standby`) have no other way in.
fn open_standby(dest: &Path, in_standby: bool) -> Result<Option<Standby>, PrepareError> {
    match standby_for(dest) {
        Ok(standby) => Ok(Some(standby)),
        Err(why) if in_standby => {
            let why = why.unwrap_or_else(|| "the destination is gone".to_owned());
            Err(PrepareError::Sealed(std::io::Error::other(why)))
        }
        Err(why) => {
            if let Some(why) = why {
                tracing::warn!(dest = %dest.display(), "{why}: committing in place, file by file (no rollback)");
            }
            Ok(None)
        }
    }
}

/// The switch of a prepared destination: one exchange, then the old live
/// tree kept as the newest previous generation (`keep` at most), the
/// switch on disk before this returns. Returns what is known of that
/// generation, to be recorded after the switch ([`Retired::record`]).
/// Only once its [`Syncing`] is waited for.
pub fn switch(prepared: &mut Prepared, keep: usize) -> Result<Option<Retired>, SwitchError> {
    prepared.standby.exchange(switch::NEXT)?;
    let name = prepared.standby.retire(switch::NEXT, keep)?;
    Ok(prepared.state.take().map(|state| Retired {
        file: prepared.standby.state_file(&name),
        state,
    }))
}

/// What is known of the generation a switch retired, not recorded yet:
/// a hint the switch need not wait for (`Retired::record`, on a thread
/// while the next destination switches; docs/internals.md#the-switch).
pub struct Retired {
    file: PathBuf,
    state: GenState,
}

impl Retired {
    /// Records it beside the generation (`prev.<n>.state`).
    pub fn record(self) {
        record::write_state(&self.file, &self.state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SourcePermissions;
    use pluginsync_common::metadata::Links;

    fn resource(dest: &Path) -> FileResource {
        FileResource {
            path: dest.to_owned(),
            mount: pluginsync_common::protocol::Mount::Plugins,
            purge: true,
            force: true,
            backup: false,
            links: Links::Follow,
            ignore: pluginsync_common::ignore::IgnoreSet::empty(),
            source_permissions: SourcePermissions::Use,
        }
    }

    fn rp(rel: &str) -> RelPath {
        RelPath::parse(rel).unwrap()
    }

    fn name(rel: &str) -> LocalName {
        LocalName::Rel(rp(rel))
    }

    fn write(rel: &str) -> Action {
        Action::Write {
            rel: rp(rel),
            digest: pluginsync_common::digest::Sha256::of(b""),
            mode: 0o644,
            change: ChangeKind::Created,
            replace_dir: false,
        }
    }

    /// Stages `rels` as files named after them in `staging`.
    fn staged(staging: &Path, rels: &[&str]) -> HashMap<RelPath, PathBuf> {
        std::fs::create_dir_all(staging).unwrap();
        rels.iter()
            .enumerate()
            .map(|(i, rel)| {
                let tmp = staging.join(i.to_string());
                std::fs::write(&tmp, rel).unwrap();
                (rp(rel), tmp)
            })
            .collect()
    }

    #[test]
    fn a_symlink_planted_in_place_of_a_directory_is_never_gone_through() {
        let tmp = tempfile::tempdir().unwrap();
        let (dest, outside) = (tmp.path().join("lib"), tmp.path().join("outside"));
        std::fs::create_dir_all(dest.join("a/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        // Planned while a/b was a directory; swapped for a link since.
        std::fs::remove_dir(dest.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("a/b")).unwrap();
        let files = staged(
            &dest.join(STAGING_DIR),
            &["a/one.rb", "a/b/two.rb", "a/b/c/three.rb"],
        );
        let plan = Plan {
            actions: vec![
                write("a/one.rb"),
                write("a/b/two.rb"),
                write("a/b/c/three.rb"),
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &files, &[], &resource(&dest));
        assert_eq!(done.changes, vec![(name("a/one.rb"), ChangeKind::Created)]);
        let failed: Vec<_> = done
            .failures
            .iter()
            .map(|(p, _)| p.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(failed, ["a/b/two.rb", "a/b/c/three.rb"]);
        assert!(
            done.failures[0]
                .1
                .to_string()
                .contains("is a symlink; refusing to go through it"),
            "{:?}",
            done.failures
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote through the link"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("a/one.rb")).unwrap(),
            "a/one.rb"
        );
        assert_eq!(done.written, vec![RelPath::parse("a/one.rb").unwrap()]);
    }

    #[test]
    fn a_directory_removed_during_the_commit_is_checked_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("lib");
        std::fs::create_dir_all(dest.join("d")).unwrap();
        let files = staged(&dest.join(STAGING_DIR), &["d/x.rb", "d", "d/y.rb"]);
        // d is checked (as the parent of d/x.rb), then replaced by a file:
        // what is below it must fail on "not a directory", not be trusted.
        let plan = Plan {
            actions: vec![
                write("d/x.rb"),
                Action::Write {
                    rel: rp("d"),
                    digest: pluginsync_common::digest::Sha256::of(b""),
                    mode: 0o644,
                    change: ChangeKind::Updated,
                    replace_dir: true,
                },
                write("d/y.rb"),
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &files, &[], &resource(&dest));
        assert_eq!(done.failures.len(), 1, "{:?}", done.failures);
        assert_eq!(done.failures[0].0, Some(name("d/y.rb")));
        assert!(
            done.failures[0]
                .1
                .to_string()
                .contains("is not a directory"),
            "{:?}",
            done.failures
        );
        assert_eq!(std::fs::read_to_string(dest.join("d")).unwrap(), "d");
    }

    #[test]
    fn purge_and_chmod_never_follow_a_symlink_out_of_the_destination() {
        let tmp = tempfile::tempdir().unwrap();
        let (dest, outside) = (tmp.path().join("lib"), tmp.path().join("outside"));
        std::fs::create_dir_all(dest.join("gone/deeper")).unwrap();
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("keep.rb"), "keep").unwrap();
        std::fs::write(outside.join("sub/keep.rb"), "keep").unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("gone/link")).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("gone/deeper/link")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep.rb"), dest.join("x.rb")).unwrap();
        let plan = Plan {
            actions: vec![
                Action::Chmod {
                    rel: rp("x.rb"),
                    mode: 0o700,
                },
                Action::Remove {
                    rel: rp("gone"),
                    dir: true,
                },
            ],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &HashMap::new(), &[], &resource(&dest));
        assert_eq!(done.failures.len(), 1, "{:?}", done.failures);
        assert!(
            done.failures[0].1.to_string().contains("became a symlink"),
            "{:?}",
            done.failures
        );
        assert_eq!(done.changes, vec![(name("gone"), ChangeKind::Removed)]);
        assert!(!dest.join("gone").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/keep.rb")).unwrap(),
            "keep"
        );
        let mode = std::fs::metadata(outside.join("keep.rb"))
            .unwrap()
            .permissions();
        assert_ne!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }

    #[test]
    fn a_stray_is_removed_by_its_own_name() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("lib");
        let odd = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::create_dir_all(dest.join("a").join(odd).join("deep")).unwrap();
        std::fs::write(dest.join("a/caf"), "a sibling").unwrap();
        let stray = Stray {
            parent: rp("a"),
            rest: odd.into(),
        };
        let plan = Plan {
            actions: vec![Action::RemoveStray {
                stray: stray.clone(),
                dir: true,
            }],
            unchanged: 0,
        };
        let done = commit(&dest, &plan, &HashMap::new(), &[], &resource(&dest));
        assert!(done.failures.is_empty(), "{:?}", done.failures);
        assert_eq!(
            done.changes,
            vec![(LocalName::Stray(stray), ChangeKind::Removed)]
        );
        assert!(!dest.join("a").join(odd).exists());
        assert!(dest.join("a/caf").exists());
    }
}
