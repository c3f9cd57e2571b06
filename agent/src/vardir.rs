//! Whether the vardir can be trusted (docs/agent.md#the-vardir), checked
//! under the run lock before anything in it is read: the cache, the plugin
//! registry and the pending loads decide what the agent fetches, keeps and
//! executes as root, so another user who can write them could make it
//! load their own code. As Puppet checks its ssldir: the vardir, its
//! `cache/`, and every file directly in them must belong to the agent's
//! user (or root), and none may be writable by group or others. A mode
//! that is too open on what the agent owns is fixed (a warning says so);
//! anything owned by another user refuses the run with one line.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the vardir is not used.
#[derive(Debug, thiserror::Error)]
pub enum VardirError {
    /// Owned by another user than the agent's (or root).
    #[error(
        "'{}' belongs to uid {owner}, not to this agent (uid {me}); refused: another user could change what it runs (docs/agent.md#the-vardir)",
        path.display()
    )]
    Owner {
        /// The directory or file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The agent's effective uid.
        me: u32,
    },
    /// Its metadata or mode could not be read or fixed.
    #[error("cannot check '{}': {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Checks `vardir` and its `cache/`, and the files directly in either
/// (symlinks themselves, never their targets), fixing group- and
/// other-writable modes on what the agent owns.
pub fn check(vardir: &Path) -> Result<(), VardirError> {
    let me = rustix::process::geteuid().as_raw();
    for dir in [vardir.to_owned(), vardir.join("cache")] {
        // A vardir that is a symlink is judged by the directory it names.
        let Some(meta) = metadata(&dir, true)? else {
            continue;
        };
        secure(&dir, &meta, me)?;
        let entries = std::fs::read_dir(&dir).map_err(|source| VardirError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if let Some(meta) = metadata(&path, false)?
                && !meta.is_dir()
            {
                secure(&path, &meta, me)?;
            }
        }
    }
    Ok(())
}

/// The metadata of `path` (of a symlink's target when `follow`); `None`
/// if it is gone.
fn metadata(path: &Path, follow: bool) -> Result<Option<std::fs::Metadata>, VardirError> {
    let meta = if follow {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    };
    match meta {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(VardirError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Refuses `path` owned by another user than `me` or root; removes the
/// group and other write bits when they are set (a symlink's own mode
/// means nothing and is left).
fn secure(path: &Path, meta: &std::fs::Metadata, me: u32) -> Result<(), VardirError> {
    if meta.uid() != me && meta.uid() != 0 {
        return Err(VardirError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if meta.file_type().is_symlink() || mode & 0o022 == 0 {
        return Ok(());
    }
    let fixed = mode & !0o022;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(fixed)).map_err(|source| {
        VardirError::Io {
            path: path.to_owned(),
            source,
        }
    })?;
    tracing::warn!(
        path = %path.display(),
        "vardir entry was writable by other users ({mode:04o}); now {fixed:04o} (docs/agent.md#the-vardir)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn open_modes_on_what_the_agent_owns_are_fixed() {
        let t = tempfile::tempdir().unwrap();
        let v = t.path().join("var");
        std::fs::create_dir_all(v.join("cache")).unwrap();
        std::fs::write(v.join("plugins.json"), "{}").unwrap();
        std::fs::write(v.join("cache/plugins.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/nonexistent", v.join("link")).unwrap();
        for (p, m) in [
            (v.clone(), 0o777),
            (v.join("cache"), 0o775),
            (v.join("plugins.json"), 0o666),
            (v.join("cache/plugins.json"), 0o646),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        check(&v).unwrap();
        assert_eq!(mode(&v), 0o755);
        assert_eq!(mode(&v.join("cache")), 0o755);
        assert_eq!(mode(&v.join("plugins.json")), 0o644);
        assert_eq!(mode(&v.join("cache/plugins.json")), 0o644);
        check(&t.path().join("missing")).unwrap();
    }

    #[test]
    fn what_another_user_owns_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let v = t.path().join("var");
        std::fs::create_dir_all(&v).unwrap();
        let file = v.join("pending_loads.json");
        std::fs::write(&file, "[]").unwrap();
        let me = rustix::process::geteuid().as_raw();
        let meta = std::fs::symlink_metadata(&file).unwrap();
        // As root the file can be given away; otherwise check the rule
        // through `secure` with another uid as "me".
        let other = 4_242_424;
        let e = if me == 0 {
            std::os::unix::fs::lchown(&file, Some(other), None).unwrap();
            check(&v).unwrap_err()
        } else {
            secure(&file, &meta, other).unwrap_err()
        };
        assert!(
            e.to_string().contains("pending_loads.json' belongs to uid")
                && e.to_string().contains("refused"),
            "{e}"
        );
    }
}
