//! Command-line interface of `pluginsync-master`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Serves per-environment plugin trees over Puppet's v3 file-serving API
/// with mutual TLS.
#[derive(Debug, Parser)]
#[command(name = "pluginsync-master", version, about)]
pub struct Cli {
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
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
    /// served and every path collision; exit 0, or 2 with the error.
    Check {
        /// The config file.
        #[arg(long, default_value = crate::config::DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Make a throwaway development CA, server and agent certificates in a
    /// Puppet-style ssldir (never for production).
    DevCerts {
        /// The ssldir to write (an existing CA there is reused).
        #[arg(long)]
        out: PathBuf,
        /// The server's name (repeatable; the first is its certname).
        #[arg(long = "server-name", default_value = "localhost")]
        server_names: Vec<String>,
        /// An agent certname (repeatable).
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// A certname to list in the CRL (repeatable).
        #[arg(long)]
        revoke: Vec<String>,
        /// Validity of the server and agent certificates, in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}
