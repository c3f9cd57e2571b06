//! Commit: put verified downloads in place and purge, in the plan's order.
//!
//! Runs only after every download of the run has been verified. Directories
//! are made parents-first, staged files are renamed over their targets
//! (atomic: a reader sees the old file or the new one, never half of
//! either), modes are fixed, then purges run. Before touching any path, its
//! parent chain inside the destination must consist of real directories:
//! a symlink there (planted between scan and commit, say) refuses the step,
//! so nothing is ever written or removed outside the destination. Each step
//! that fails is recorded and the others still run. Finally every touched
//! directory is fsynced once.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::catalog::FileResource;
use crate::plan::{Action, ChangeKind, Plan};

/// What a commit did.
#[derive(Debug, Default)]
pub struct Committed {
    /// Applied changes (relative path, kind).
    pub changes: Vec<(PathBuf, ChangeKind)>,
    /// Failed steps (relative path, one-line error).
    pub failures: Vec<(PathBuf, String)>,
}

fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777))
}

/// Checks that every ancestor of `rel` below `dest` is a real directory.
fn parents_are_dirs(dest: &Path, rel: &Path) -> Result<(), String> {
    let mut p = dest.to_path_buf();
    let comps: Vec<_> = rel.components().collect();
    for c in &comps[..comps.len().saturating_sub(1)] {
        p.push(c);
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.is_dir() => {}
            Ok(md) if md.file_type().is_symlink() => {
                return Err(format!(
                    "'{}' is a symlink; refusing to go through it",
                    p.display()
                ));
            }
            Ok(_) => return Err(format!("'{}' is not a directory", p.display())),
            Err(e) => return Err(format!("'{}': {e}", p.display())),
        }
    }
    Ok(())
}

/// Removes whatever is at `path` without following a symlink.
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn apply(
    dest: &Path,
    action: &Action,
    staged: &HashMap<PathBuf, PathBuf>,
    resource: &FileResource,
) -> Result<(), String> {
    let io = |what: &str, p: &Path| {
        let (what, p) = (what.to_owned(), p.display().to_string());
        move |e: std::io::Error| format!("cannot {what} '{p}': {e}")
    };
    match action {
        Action::CreateRoot { mode } => {
            std::fs::create_dir_all(dest).map_err(io("create", dest))?;
            chmod(dest, *mode).map_err(io("chmod", dest))
        }
        Action::ChmodRoot { mode } => chmod(dest, *mode).map_err(io("chmod", dest)),
        Action::Mkdir { rel, mode, replace } => {
            parents_are_dirs(dest, rel)?;
            let path = dest.join(rel);
            if *replace {
                if !resource.force {
                    return Err(format!(
                        "'{}' is in the way and force is off",
                        path.display()
                    ));
                }
                remove_any(&path).map_err(io("remove", &path))?;
            }
            std::fs::create_dir(&path).map_err(io("create", &path))?;
            chmod(&path, *mode).map_err(io("chmod", &path))
        }
        Action::Write {
            rel,
            mode,
            replace_dir,
            ..
        } => {
            parents_are_dirs(dest, rel)?;
            let path = dest.join(rel);
            let tmp = staged
                .get(rel)
                .ok_or_else(|| format!("no verified download for '{}'", path.display()))?;
            chmod(tmp, *mode).map_err(io("chmod", tmp))?;
            if *replace_dir {
                if !resource.force {
                    return Err(format!(
                        "a directory is in the way at '{}' and force is off",
                        path.display()
                    ));
                }
                remove_any(&path).map_err(io("remove", &path))?;
            }
            // rename(2) replaces a file or a symlink itself, never a link's target.
            std::fs::rename(tmp, &path).map_err(io("rename into", &path))
        }
        Action::Chmod { rel, mode } => {
            parents_are_dirs(dest, rel)?;
            let path = dest.join(rel);
            let md = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
            if md.file_type().is_symlink() {
                return Err(format!(
                    "'{}' became a symlink; not changing its mode",
                    path.display()
                ));
            }
            chmod(&path, *mode).map_err(io("chmod", &path))
        }
        Action::Remove { rel, .. } => {
            if !resource.purge {
                return Ok(());
            }
            parents_are_dirs(dest, rel)?;
            let path = dest.join(rel);
            remove_any(&path).map_err(io("remove", &path))
        }
    }
}

/// Applies `plan` to `dest`; see the module docs.
pub fn commit(
    dest: &Path,
    plan: &Plan,
    staged: &HashMap<PathBuf, PathBuf>,
    resource: &FileResource,
) -> Committed {
    let mut out = Committed::default();
    let mut touched: BTreeSet<PathBuf> = BTreeSet::from([dest.to_owned()]);
    for action in &plan.actions {
        match apply(dest, action, staged, resource) {
            Ok(()) => {
                if let Some((rel, kind)) = action.change() {
                    if kind != ChangeKind::Removed || resource.purge {
                        out.changes.push((rel.to_owned(), kind));
                    }
                    if let Some(parent) = dest.join(rel).parent() {
                        touched.insert(parent.to_owned());
                    }
                }
            }
            Err(e) => {
                let rel = action
                    .change()
                    .map(|(r, _)| r.to_owned())
                    .unwrap_or_default();
                tracing::error!(path = %dest.join(&rel).display(), error = %e, "change failed");
                out.failures.push((rel, e));
            }
        }
    }
    if let Some(parent) = dest.parent() {
        touched.insert(parent.to_owned());
    }
    for dir in touched {
        if let Ok(d) = std::fs::File::open(&dir)
            && let Err(e) = d.sync_all()
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot fsync directory");
        }
    }
    out
}
