//! Why one step of a commit failed: [`CommitError`], one line each, the
//! text of a failure in the report (`report.rs`). The commit records it
//! and goes on with the other steps (`commit.rs`, module docs).

use std::path::PathBuf;

/// One failed step of a commit.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A system call on `path` failed (`what`: `open`, `create`, `chmod`,
    /// `rename into`, `remove`).
    #[error("cannot {what} '{}': {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A directory component is a symlink: never gone through.
    #[error("'{}' is a symlink; refusing to go through it", .0.display())]
    Symlink(PathBuf),
    /// A directory component is not a directory.
    #[error("'{}' is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A directory component could not be opened for another reason.
    #[error("'{}': {source}", path.display())]
    Component {
        /// The component's path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The step names the destination itself where it needs an entry.
    #[error("'{}' has no name", .0.display())]
    NoName(PathBuf),
    /// A non-directory stands where a directory goes, and `force` is off.
    #[error("'{}' is in the way and force is off", .0.display())]
    InTheWay(PathBuf),
    /// A directory stands where a file goes, and `force` is off.
    #[error("a directory is in the way at '{}' and force is off", .0.display())]
    DirectoryInTheWay(PathBuf),
    /// The plan writes a file that was not downloaded.
    #[error("no verified download for '{}'", .0.display())]
    NotDownloaded(PathBuf),
    /// The download's file is not in the staging directory.
    #[error("'{}' is not a staged file", .0.display())]
    NotStaged(PathBuf),
    /// The entry whose mode was to change is now a symlink.
    #[error("'{}' became a symlink; not changing its mode", .0.display())]
    BecameSymlink(PathBuf),
    /// The switch to the prepared generation failed; the live tree is
    /// the old one (docs/internals.md#the-switch).
    #[error("the switch failed, the previous tree stays live: {0}")]
    Switch(#[source] SwitchError),
}

impl CommitError {
    /// A failed `what` on `path`, from a system call's error.
    pub fn io(what: &'static str, path: PathBuf) -> impl FnOnce(rustix::io::Errno) -> CommitError {
        move |e| CommitError::Io {
            what,
            path,
            source: e.into(),
        }
    }
}

/// The standby trees of a destination could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// A system call on `path` failed.
    #[error("cannot {what} '{}': {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The container is not a directory of this user's alone.
    #[error("'{}' is not a directory of this user's alone (mode 0700); not using it", .0.display())]
    NotOurs(PathBuf),
    /// The destination has no parent or no name.
    #[error("'{}' has no parent directory to keep standby trees in", .0.display())]
    NoParent(PathBuf),
}
