//! Command-line interface of `pluginsync-agent`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Syncs this node's plugin directories from a pluginsync master or a
/// Puppet Server: one recursive, purging file resource per destination.
#[derive(Debug, Parser)]
#[command(name = "pluginsync-agent", version, about)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
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
        /// A master URL (repeatable; replaces the config's servers).
        #[arg(long = "server")]
        servers: Vec<String>,
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
    },
    /// Print the registry of loaded describe plugins (name, version, api,
    /// status, path).
    Plugins {
        /// The config file (for vardir and constraints).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
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
