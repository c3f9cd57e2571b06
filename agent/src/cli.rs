//! Command-line interface of `pluginsync-agent`: the clap definition (also
//! the source of the man page and completions) and [`parse`], which turns a
//! usage error into [`ExitStatus::Usage`] — never clap's 2, which means
//! "changes applied" under `--detailed-exitcodes`.

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Parser, Subcommand, ValueEnum};

use pluginsync_common::logging::LogArgs;

use crate::exit::{EXIT_STATUS_HELP, ExitStatus};

/// Syncs this node's plugin directories from a pluginsync master or a
/// Puppet Server: one recursive, purging file resource per destination.
#[derive(Debug, Parser)]
#[command(name = "pluginsync-agent", version, about, after_help = EXIT_STATUS_HELP)]
pub struct Cli {
    /// `-v`, `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One line per change and a summary; nothing when nothing changed.
    Text,
    /// The whole report as one JSON object.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sync now. Prints one line per change and a summary, nothing at all
    /// when nothing changed; errors are one line on stderr.
    Sync {
        /// The environment (overrides the config's).
        #[arg(long)]
        environment: Option<String>,
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// A master (repeatable; replaces the config's servers): a URL
        /// `https://HOST[:PORT]`, or as Puppet's `--server`, `HOST[:PORT]`
        /// on port 8140 (puppet.conf's `serverport`) unless given.
        #[arg(long = "server")]
        servers: Vec<String>,
        /// This node's certname (overrides `[tls] certname` and
        /// puppet.conf's): the ssldir's certificate and key of that name.
        #[arg(long)]
        certname: Option<String>,
        /// As `puppet agent --test`: one run with its info lines on stderr
        /// (`-v`) and `--detailed-exitcodes` (docs/agent.md#puppet-style-flags).
        #[arg(short = 't', long)]
        test: bool,
        /// Print what would change; change nothing.
        #[arg(long)]
        noop: bool,
        /// Report format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Exit 0 (no change), 2 (changes), 4 (failures), 6 (both); 1 means
        /// nothing was applied.
        #[arg(long)]
        detailed_exitcodes: bool,
        /// Run the configured loaders on changed files (as `[load] enabled`).
        #[arg(long)]
        load: bool,
        /// Proceed even when the run would remove more than
        /// `max_removal_percent` of a destination's files (the removal
        /// guard, docs/agent.md#the-removal-guard).
        #[arg(long)]
        allow_mass_removal: bool,
        /// Sync from this bundle (`pluginsync-master bundle`) instead of a
        /// master, with no network at all: every digest is checked before
        /// anything changes; the environment is the bundle's
        /// (docs/agent.md#offline-from-a-bundle).
        #[arg(long, value_name = "FILE")]
        from_bundle: Option<PathBuf>,
        /// With `--from-bundle` under `[trust]`: accept the bundle's signed
        /// metadata past its expiry (air-gapped sites only; signatures,
        /// rollback and withdrawal are still checked,
        /// docs/trust.md#signed-bundles).
        #[arg(long, requires = "from_bundle")]
        allow_expired_metadata: bool,
    },
    /// Make the previous generation live again in every destination at
    /// once, offline (no master needed); report what changed and run
    /// the loaders on it. The next `sync` converges back to the master's
    /// generation (docs/agent.md#generations-and-rollback).
    Rollback {
        /// Names the report's environment only when nothing is rolled
        /// back (overrides the config's): a rollback brings back one
        /// generation, and its report and loaders name that generation's
        /// own environment, whatever this says.
        #[arg(long)]
        environment: Option<String>,
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Report format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Run the configured loaders on the files brought back (as
        /// `[load] enabled`).
        #[arg(long)]
        load: bool,
    },
    /// Print the registry of loaded describe plugins (name, version, api,
    /// status, path).
    Plugins {
        /// The config file (for vardir and constraints).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Output format.
        #[arg(long, default_value = "text", value_parser = format_of(
            "One line per plugin version: name, version, api, status, path",
            "The registry as one JSON object",
        ))]
        format: Format,
    },
    /// Print every effective setting and where it came from: command
    /// line, agent.toml, puppet.conf [agent] or [main], or default
    /// (docs/agent.md#on-a-puppet-node).
    Config {
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// The environment (overrides the config's), as for `sync`.
        #[arg(long)]
        environment: Option<String>,
        /// A master (repeatable), as for `sync`: a URL or `HOST[:PORT]`.
        #[arg(long = "server")]
        servers: Vec<String>,
        /// This node's certname, as for `sync`.
        #[arg(long)]
        certname: Option<String>,
        /// Output format.
        #[arg(long, default_value = "text", value_parser = format_of(
            "One line per setting: `name = value  (source)`",
            "Every setting, its value and source, as one JSON object",
        ))]
        format: Format,
    },
    /// Print the last run's report.
    Report {
        /// The config file (for vardir).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Report format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

/// A `--format` parser whose `text` and `json` say what this subcommand
/// prints (the [`Format`] variants' own help is the report's).
fn format_of(text: &'static str, json: &'static str) -> impl TypedValueParser<Value = Format> {
    use clap::builder::{PossibleValue, PossibleValuesParser};
    PossibleValuesParser::new([
        PossibleValue::new("text").help(text),
        PossibleValue::new("json").help(json),
    ])
    .map(|s| match s.as_str() {
        "json" => Format::Json,
        _ => Format::Text,
    })
}

impl Cli {
    /// The default log filter: warnings, `-v` info, `-vv` debug, `-vvv`
    /// trace: the same levels as the master's (docs/operating.md#logs).
    pub fn log_level(&self) -> &'static str {
        // `--test` is at least `-v`, as `puppet agent --test` is verbose.
        let test = matches!(self.command, Command::Sync { test: true, .. });
        let verbose = self.log.verbose.max(u8::from(test));
        ["warn", "info", "debug", "trace"][usize::from(verbose.min(3))]
    }
}

/// Parses the command line; `--help` and `--version` print and give
/// `Err(Success)`, a usage error prints clap's message and gives
/// `Err(Usage)`.
pub fn parse() -> Result<Cli, ExitStatus> {
    Cli::try_parse().map_err(|e| {
        let _unread = e.print();
        if e.use_stderr() {
            ExitStatus::Usage
        } else {
            ExitStatus::Success
        }
    })
}
