//! Command-line interface of `pluginsync-master`: the clap definition (also
//! the source of the man page and completions) and [`parse`], which turns
//! a usage error into [`ExitStatus::Usage`] instead of clap's exit 2.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::csr::CsrOptions;
use crate::devcerts::DevCertsOptions;
use pluginsync_common::logging::LogArgs;

use crate::exit::{EXIT_STATUS_HELP, ExitStatus};

/// Serves per-environment plugin trees over Puppet's v3 file-serving API
/// with mutual TLS.
#[derive(Debug, Parser)]
#[command(name = "pluginsync-master", version, about, after_help = EXIT_STATUS_HELP)]
pub struct Cli {
    /// `-v`, `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve until SIGTERM/SIGINT (SIGHUP reloads the TLS files).
    Serve {
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Validate the config and every environment, print what would be
    /// served and every path collision; exit 0, or 78 with the error.
    Check {
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Instead, hash every blob and manifest of the generation store
        /// again and name each one whose bytes are not what its name says
        /// (docs/deploys.md#scrubbing-the-store).
        #[arg(long)]
        store: bool,
    },
    /// Make a throwaway development CA, server and agent certificates in a
    /// Puppet-style ssldir (never for production).
    DevCerts(DevCertsOptions),
    /// Make the master a P-256 key and a certificate signing request for
    /// the fleet's Puppet CA, in Puppet's ssldir layout (docs/tls.md#a-p-256-key-for-the-master:
    /// cheaper handshakes than an RSA key, same CA for the agents).
    Csr(CsrOptions),
    /// Ask the running master to re-index ENVIRONMENT (every environment
    /// without one) now, and wait until it is served: Puppet Server's admin
    /// API over the master's port with the master's own certificate
    /// (docs/deploys.md; for `index.publish = "explicit"` and r10k's
    /// postrun hook).
    Reindex {
        /// The config file of the running master.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// The master's URL, `https://HOST:PORT` (default: the first
        /// `listen` address, a wildcard as loopback).
        #[arg(long)]
        server: Option<String>,
        /// The environment.
        environment: Option<String>,
    },
    /// Write one generation of ENVIRONMENT as an offline bundle
    /// (docs/protocol.md §7.7): the current one, or a kept one by id (a
    /// unique prefix will do); the same generation gives the same bytes.
    /// Exit 66 when the environment or generation does not exist.
    Bundle {
        /// The config file (for `[generations] dir` and the environmentpath).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// A kept generation's id, or a unique prefix of one (default: the
        /// generation everyone is on, docs/rollouts.md#placement).
        #[arg(long, conflicts_with = "certname")]
        generation: Option<String>,
        /// The generation placement serves this node now.
        #[arg(long)]
        certname: Option<String>,
        /// Where to write the bundle (written under a temporary name, then
        /// renamed).
        #[arg(long)]
        out: PathBuf,
        /// The environment.
        environment: String,
    },
    /// Print the canonical manifest of ENVIRONMENT's tree as it is now to
    /// standard output, byte for byte what a master publishing it computes
    /// (its sha256 is the generation id): what the deploy pipeline signs
    /// (docs/trust.md#the-signing-pipeline). Exit 66 when the environment
    /// does not exist, 1 when its tree cannot be read whole or changed
    /// while it was read.
    Manifest {
        /// The config file (for the environmentpath and `[index]`).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// The environment.
        environment: String,
    },
    /// Show or steer ENVIRONMENT's rollout (docs/rollouts.md#commands):
    /// `status` (of every master named), `halt` (no node moves),
    /// `resume`, `promote` (the newest generation to everyone now),
    /// `rollback` (withdraw the newest: its nodes return to what each had,
    /// no other node moves). A command is applied once, by the first
    /// master named that answers; the others show their status once it
    /// reached them. An admin API call as the master's own certificate;
    /// exit 0 only if every master answered.
    Rollout {
        /// The config file (the TLS identity to present).
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
        /// A master's URL, `https://HOST:PORT`; repeat for each replica
        /// (a command goes to the first that answers; default: the first
        /// `listen` address of the config).
        #[arg(long = "master")]
        masters: Vec<String>,
        /// `text` or `json` (one status per master).
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        format: String,
        /// What to do.
        #[arg(value_parser = ["status", "halt", "resume", "promote", "rollback"])]
        action: String,
        /// The environment.
        environment: String,
    },
    /// The fleet as the masters heard it (docs/operating.md#the-fleet):
    /// per generation, nodes, failing, lagging (not on the generation
    /// placement gives them now); then the nodes that lag or fail.
    Inventory(InventoryArgs),
}

/// `pluginsync-master inventory`'s arguments (docs/operating.md#the-fleet).
#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// The config file (the TLS identity to present).
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The master's URL, `https://HOST:PORT` (default: the first
    /// `listen` address of the config).
    #[arg(long)]
    pub master: Option<String>,
    /// Only nodes on this generation (an id or a prefix of one).
    #[arg(long)]
    pub generation: Option<String>,
    /// Only nodes not on this generation (an id or a prefix of one).
    #[arg(long)]
    pub not_generation: Option<String>,
    /// Only nodes reporting load failures.
    #[arg(long)]
    pub failing: bool,
    /// Only nodes not heard for at least this long (`30m`, `2h`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub stale: Option<std::time::Duration>,
    /// `text` (a table) or `json` (every node matched).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
    /// Only this environment.
    pub environment: Option<String>,
}

impl Cli {
    /// The default log filter: `info` for `serve` (`warn` for the commands
    /// that print their own findings when `quiet`); `-v` info, `-vv`
    /// debug, `-vvv` trace, the agent's levels (docs/operating.md#logs).
    pub fn log_level(&self, quiet: bool) -> &'static str {
        match self.log.verbose {
            0 if quiet => "warn",
            0 | 1 => "info",
            2 => "debug",
            _ => "trace",
        }
    }
}

/// Parses the command line; `--help` and `--version` print and give
/// `Err(Success)`, a usage error prints clap's message and gives
/// `Err(Usage)` (never clap's 2).
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
