//! The exit statuses of `pluginsync-master`, one enum, documented in
//! `--help` ([`EXIT_STATUS_HELP`]) and in the man page.
//!
//! A usage or config error exits 64 or 78 (the sysexits codes), the same
//! codes as `pluginsync-agent`; the unit's `RestartPreventExitStatus=64 78`
//! stops a restart loop that restarting cannot fix.

use std::process::ExitCode;

/// How `pluginsync-master` exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// Served until told to stop, or the subcommand succeeded.
    Success = 0,
    /// A runtime failure (cannot listen, cannot write the dev certificates).
    Failure = 1,
    /// The command line is wrong (sysexits `EX_USAGE`).
    Usage = 64,
    /// What the command names does not exist: `bundle`'s environment or
    /// generation, `manifest`'s environment (sysexits `EX_NOINPUT`).
    NoInput = 66,
    /// The config, or an environment it names, cannot be used (sysexits
    /// `EX_CONFIG`); `check` exits with this when it finds a problem.
    Config = 78,
}

/// The EXIT STATUS section of `--help`.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0   success (serve: stopped by SIGTERM/SIGINT after draining)
  1   runtime failure (e.g. cannot listen)
  64  usage error (unknown flag or subcommand)
  66  bundle, manifest: no such environment or kept generation
  78  configuration error (serve and check)";

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

/// A subcommand's failure: the error and the status it exits with.
#[derive(Debug)]
pub struct Failure {
    /// How the process exits.
    pub status: ExitStatus,
    /// What went wrong, printed as one line.
    pub error: anyhow::Error,
}

impl Failure {
    /// A config (or environment) problem: [`ExitStatus::Config`].
    pub fn config(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            status: ExitStatus::Config,
            error: error.into(),
        }
    }

    /// The error as one line: each cause in the chain appended after `: `,
    /// unless the text before already says it (an error whose message
    /// quotes its own source, as `ConfigError::Read` does, would otherwise
    /// print the OS error twice).
    pub fn line(&self) -> String {
        let mut line = String::new();
        for cause in self.error.chain() {
            let text = cause.to_string();
            if line.is_empty() {
                line = text;
            } else if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
        }
        line
    }

    /// What the command names does not exist: [`ExitStatus::NoInput`].
    pub fn no_input(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            status: ExitStatus::NoInput,
            error: error.into(),
        }
    }

    /// A runtime problem: [`ExitStatus::Failure`].
    pub fn runtime(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            status: ExitStatus::Failure,
            error: error.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_quotes_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let read = pluginsync_common::config::ConfigError::Read {
            path: "/etc/x.toml".into(),
            source: io,
        };
        assert_eq!(
            Failure::config(read).line(),
            "cannot read config '/etc/x.toml': No such file or directory"
        );
        let chained = anyhow::anyhow!("refused").context("cannot listen on 127.0.0.1:8140");
        assert_eq!(
            Failure::runtime(chained).line(),
            "cannot listen on 127.0.0.1:8140: refused"
        );
    }
}
