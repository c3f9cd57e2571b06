//! The exit statuses of `pluginsync-agent`, one enum, documented in
//! `--help` ([`EXIT_STATUS_HELP`]) and in the man page.
//!
//! 0/1/2/4/6 are Puppet's `--detailed-exitcodes` (a timer unit's
//! `SuccessExitStatus=2` relies on them), so a usage or config error must
//! never look like one of them: they use the sysexits codes 64 and 78. A
//! run stopped by SIGINT or SIGTERM exits as a shell reports a process
//! killed by them, 128 + the signal's number (`signals.rs`). A run that
//! finds another one running is skipped with sysexits' `EX_TEMPFAIL`, 75:
//! not a failure (the agent unit's `SuccessExitStatus=` lists it), and
//! never 1, which would mark the timer's unit failed for a manual run.

use std::process::ExitCode;

/// How `pluginsync-agent` exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// The run succeeded (with `--detailed-exitcodes`: and changed nothing).
    Success = 0,
    /// The run failed and nothing was applied (or a subcommand failed).
    Failure = 1,
    /// `--detailed-exitcodes`: changes were applied.
    Changes = 2,
    /// `--detailed-exitcodes`: some resources failed.
    Failures = 4,
    /// `--detailed-exitcodes`: changes were applied and some failed.
    ChangesAndFailures = 6,
    /// The command line is wrong (sysexits `EX_USAGE`).
    Usage = 64,
    /// `[trust]` refused the generation, its signed metadata or unsigned
    /// content (docs/agent.md#signed-generations): nothing was changed
    /// (sysexits `EX_DATAERR`; not 0, 2 or 75, so the timer's unit fails).
    Untrusted = 65,
    /// Another run holds the run lock: this one was skipped and changed
    /// nothing, wrote no report and no metrics (sysexits `EX_TEMPFAIL`:
    /// the next run retries; docs/agent.md#one-run-at-a-time). Also a
    /// Puppet run that held its lock past `[puppet_lock] wait`: nothing
    /// changed, but this run reports and writes its metrics
    /// (docs/agent.md#a-puppet-run-in-progress).
    Busy = 75,
    /// The config file is missing, unreadable or invalid (sysexits
    /// `EX_CONFIG`).
    Config = 78,
    /// SIGINT stopped the run (128 + 2, as a shell reports it): before the
    /// commit nothing was changed; after its start the commit finished and
    /// the loads were left to the next run (docs/operating.md#signals).
    Interrupted = 130,
    /// SIGTERM stopped the run (128 + 15); as [`ExitStatus::Interrupted`].
    Terminated = 143,
}

/// The EXIT STATUS section of `--help`.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0   success (with --detailed-exitcodes: no change)
  1   the run failed; nothing was applied
  2   with --detailed-exitcodes: changes were applied
  4   with --detailed-exitcodes: failures
  6   with --detailed-exitcodes: changes and failures
  64  usage error (unknown flag or subcommand)
  65  [trust] refused the generation (unsigned, withdrawn, replayed or
      expired metadata): nothing was changed
  75  another run is in progress: this one was skipped, nothing changed
      (also a Puppet run holding its lock past [puppet_lock] wait)
  78  configuration error
  130 interrupted by SIGINT (before the commit: nothing was changed;
      during it: the commit was finished, its loads left to the next run)
  143 stopped by SIGTERM (as 130)";

impl ExitStatus {
    /// The numeric code.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        ExitCode::from(s.code())
    }
}
