//! Room for a commit: [`check_space`] refuses, before its first step, a
//! commit whose filesystem lacks the inodes or blocks it needs, so a full
//! disk refuses the whole commit instead of applying part of it.

use std::path::{Path, PathBuf};

use crate::plan::{Action, ChangeKind, Plan};

/// The destination's filesystem cannot hold what the commit must create;
/// checked before the commit's first step ([`check_space`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough room for the commit in '{}': {short} {what} short ({free} free, {needed} needed for {dirs} new directories); nothing was changed",
    dest.display()
)]
pub struct SpaceError {
    /// The (first) destination on that filesystem.
    pub dest: PathBuf,
    /// `inodes` or `blocks`.
    pub what: &'static str,
    /// How many the commit needs, margin included.
    pub needed: u64,
    /// How many are free (for this process: root may use the reserve).
    pub free: u64,
    /// `needed - free`.
    pub short: u64,
    /// New directories the commit makes there.
    pub dirs: u64,
}

/// What the commits on one filesystem need.
struct Needs {
    dest: PathBuf,
    dirs: u64,
    names: u64,
    vfs: Option<rustix::fs::StatVfs>,
}

/// Checks, before anything changes, that each destination's filesystem
/// has the inodes and blocks its commit needs (`tests/e2e/agent_faults.rs`:
/// a libdir out of inodes). What the commit allocates:
/// - staged files are already allocated (same filesystem): their rename
///   needs nothing, and one over an old file frees the old;
/// - a new directory needs an inode and a block (`f_bsize`);
/// - a new name in a directory may grow it: 64 bytes per created name,
///   rounded up to blocks;
/// - plus a margin of 1% and one, for whatever else writes there meanwhile.
///
/// Destinations on one filesystem are summed. A filesystem that reports no
/// inode (or block) counts (`f_files == 0`, as btrfs) is not checked for
/// them. `statvfs` failing skips the check: the commit then reports its own
/// errors.
pub fn check_space<'p>(
    commits: impl IntoIterator<Item = (&'p Path, &'p Plan)>,
) -> Result<(), SpaceError> {
    let root = rustix::process::geteuid().is_root();
    let mut by_fs: Vec<Needs> = Vec::new();
    for (dest, plan) in commits {
        let (mut dirs, mut names) = (0u64, 0u64);
        for a in &plan.actions {
            match a {
                Action::CreateRoot { .. } | Action::Mkdir { .. } => {
                    dirs += 1;
                    names += 1;
                }
                Action::Write {
                    change: ChangeKind::Created,
                    ..
                } => names += 1,
                _ => {}
            }
        }
        if dirs == 0 && names == 0 {
            continue;
        }
        // The destination, or its nearest existing ancestor (a first sync).
        let Some(vfs) = dest.ancestors().find_map(|p| rustix::fs::statvfs(p).ok()) else {
            continue;
        };
        match by_fs
            .iter_mut()
            .find(|n| n.vfs.as_ref().is_some_and(|v| v.f_fsid == vfs.f_fsid))
        {
            Some(n) => {
                n.dirs += dirs;
                n.names += names;
            }
            None => by_fs.push(Needs {
                dest: dest.to_owned(),
                dirs,
                names,
                vfs: Some(vfs),
            }),
        }
    }
    for n in by_fs {
        let Some(v) = n.vfs else { continue };
        let margin = |x: u64| if x == 0 { 0 } else { x + x / 100 + 1 };
        let frsize = v.f_frsize.max(1);
        let per_dir = v.f_bsize.max(frsize).div_ceil(frsize);
        let inodes = margin(n.dirs);
        let blocks = margin(n.dirs * per_dir + (n.names * 64).div_ceil(frsize));
        let (free_inodes, free_blocks) = if root {
            (v.f_ffree, v.f_bfree)
        } else {
            (v.f_favail, v.f_bavail)
        };
        let short = |what, needed: u64, free: u64, reported: bool| {
            (reported && needed > free).then(|| SpaceError {
                dest: n.dest.clone(),
                what,
                needed,
                free,
                short: needed - free,
                dirs: n.dirs,
            })
        };
        if let Some(e) = short("inodes", inodes, free_inodes, v.f_files > 0)
            .or_else(|| short("blocks", blocks, free_blocks, v.f_blocks > 0))
        {
            return Err(e);
        }
    }
    Ok(())
}
