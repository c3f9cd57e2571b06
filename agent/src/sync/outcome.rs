//! How a run ended: [`SyncError`], why it stopped before changing
//! anything (one line, the report's `error`), and [`Outcome`], the report
//! with the process's exit status.

use std::path::PathBuf;

use pluginsync_common::protocol::Mount;

use crate::client::{FetchError, SetupError};
use crate::commit;
use crate::exit::ExitStatus;
use crate::listing::ListingError;
use crate::load::LoadStatus;
use crate::lock::{LockError, PuppetBusy};
use crate::plan;
use crate::progress::thousands;
use crate::report::Report;
use crate::scan::ScanError;
use crate::signals::Interrupt;
use crate::stage::StageError;

/// Why a run stopped before changing anything; one line each, the text of
/// the report's `error`.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Another run holds the lock, or it cannot be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The HTTP client could not be set up (TLS files).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// A destination could not be scanned or hashed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// A listing could not be fetched, or is not a listing.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A generation was refused, or no server keeps it
    /// (docs/protocol.md §4.11).
    #[error(transparent)]
    Generation(Box<super::generation::GenerationError>),
    /// `[trust]` refused what the run would sync
    /// (docs/agent.md#signed-generations).
    #[error("{0}; nothing was changed")]
    Untrusted(#[from] crate::trust::Refused),
    /// A listing was refused (hostile or malformed entries).
    #[error("malformed listing from {server}: {mount} mount: {source}")]
    Listing {
        /// The master that sent it.
        server: String,
        /// Its mount.
        mount: Mount,
        /// What is wrong with it.
        source: ListingError,
    },
    /// A destination's staging directory could not be prepared.
    #[error("cannot stage downloads in '{}': {source}", dest.display())]
    Staging {
        /// The destination.
        dest: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A download could not be staged and verified.
    #[error("{0}; nothing was changed")]
    Download(#[source] StageError),
    /// A destination's filesystem cannot hold what the commit creates.
    #[error(transparent)]
    Space(#[from] commit::SpaceError),
    /// A rollback could not be done (docs/agent.md#generations-and-rollback).
    #[error(transparent)]
    Rollback(#[from] super::RollbackError),
    /// A destination's next generation could not be prepared beside it
    /// (docs/internals.md#the-switch).
    #[error("cannot prepare the next generation of '{}': {source}; nothing was changed", dest.display())]
    Prepare {
        /// The destination.
        dest: PathBuf,
        /// The error.
        source: commit::PrepareError,
    },
    /// The removal guard (docs/agent.md#the-removal-guard): the plan of `mount`
    /// takes away more than `max_removal_percent` of its destination's
    /// files; nothing was changed. The line says what it saw — how many
    /// files, the limit, the modules they came from — and no verdict: an
    /// environment refactored on purpose looks the same as a broken one.
    #[error(
        "refusing to remove {} of {} files in {mount} (more than max_removal_percent = {limit}){}; --allow-mass-removal to proceed",
        thousands(removal.removed as u64),
        thousands(removal.total as u64),
        from_modules(modules)
    )]
    MassRemoval {
        /// The mount whose destination it is.
        mount: Mount,
        /// What the plan takes away.
        removal: plan::Removal,
        /// `max_removal_percent`.
        limit: u8,
        /// The modules the files came from, most files first (empty when
        /// the last listing is not cached: `cache::MountCache::modules_of`).
        modules: Vec<String>,
    },
    /// A Puppet run held its lock past `[puppet_lock] wait`
    /// (docs/agent.md#a-puppet-run-in-progress).
    #[error(transparent)]
    PuppetBusy(#[from] PuppetBusy),
    /// SIGTERM or SIGINT stopped the run.
    #[error("interrupted by {signal} {}", match .committed {
        false => "before the commit; nothing was changed",
        true => "during the run; the commit was finished, its loads are left to the next run",
    })]
    Interrupted {
        /// The signal.
        signal: Interrupt,
        /// Whether the commit had started (and so was finished).
        committed: bool,
    },
}

/// The modules shown in the guard's line.
const MODULES_SHOWN: usize = 3;

/// `, from module a` / `, from modules a, b, c and 2 more`; nothing when
/// no module is known.
fn from_modules(modules: &[String]) -> String {
    let shown: Vec<String> = modules
        .iter()
        .take(MODULES_SHOWN)
        .map(|m| crate::report::escape(m).into_owned())
        .collect();
    let more = modules.len().saturating_sub(MODULES_SHOWN);
    match (shown.len(), more) {
        (0, _) => String::new(),
        (1, _) => format!(", from module {}", shown[0]),
        (_, 0) => format!(", from modules {}", shown.join(", ")),
        _ => format!(", from modules {} and {more} more", shown.join(", ")),
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The report (also for failed runs).
    pub report: Report,
    /// Why the run stopped, if it did.
    pub error: Option<SyncError>,
    /// `[load] failures_are_errors`.
    pub load_failures_are_errors: bool,
}

impl Outcome {
    /// How the process exits: with `detailed`, 0 no change, 2 changes,
    /// 4 failures, 6 both; 1 when nothing was applied. Without it, 0 or 1.
    /// What `[trust]` refused: 65, whatever `detailed`.
    /// A signal: 130 (SIGINT) or 143 (SIGTERM), whatever was applied.
    pub fn exit_status(&self, detailed: bool) -> ExitStatus {
        match &self.error {
            Some(SyncError::Interrupted { signal, .. }) => return signal.exit_status(),
            Some(SyncError::Lock(LockError::Busy { .. }) | SyncError::PuppetBusy(_)) => {
                return ExitStatus::Busy;
            }
            Some(SyncError::Untrusted(_)) => return ExitStatus::Untrusted,
            Some(_) => return ExitStatus::Failure,
            None => {}
        }
        let failed = !self.report.failures.is_empty()
            || (self.load_failures_are_errors
                && self
                    .report
                    .loads
                    .iter()
                    .any(|l| l.status == LoadStatus::Failed));
        let changed = !self.report.changes.is_empty();
        match (detailed, changed, failed) {
            (false, _, false) => ExitStatus::Success,
            (false, _, true) => ExitStatus::Failure,
            (true, false, false) => ExitStatus::Success,
            (true, true, false) => ExitStatus::Changes,
            (true, false, true) => ExitStatus::Failures,
            (true, true, true) => ExitStatus::ChangesAndFailures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_line_names_counts_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(3093), "3,093");
        assert_eq!(thousands(1_234_567), "1,234,567");
        let e = |modules: &[&str]| SyncError::MassRemoval {
            mount: Mount::Plugins,
            removal: plan::Removal {
                removed: 2941,
                total: 3093,
            },
            limit: 50,
            modules: modules.iter().map(|m| m.to_string()).collect(),
        };
        assert_eq!(
            e(&[]).to_string(),
            "refusing to remove 2,941 of 3,093 files in plugins (more than max_removal_percent = 50); --allow-mass-removal to proceed"
        );
        assert_eq!(
            e(&["stdlib"]).to_string(),
            "refusing to remove 2,941 of 3,093 files in plugins (more than max_removal_percent = 50), from module stdlib; --allow-mass-removal to proceed"
        );
        assert!(
            e(&["a", "b", "c", "d", "e"])
                .to_string()
                .contains(", from modules a, b, c and 2 more; ")
        );
    }
}
