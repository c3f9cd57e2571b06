//! Settings: the command line over the config file over the defaults,
//! resolved once; everything after this takes `&Settings`.
//!
//! The file was checked when it was loaded (`config.rs`). What the command
//! line can replace, the masters and the environment, is checked here on
//! the merged values, by the same rules ([`crate::config::servers`],
//! [`crate::config::environment`]); the TLS files are resolved here.

use std::path::PathBuf;
use std::time::Duration;

use pluginsync_common::envname::EnvName;

use crate::cli::Format;
use crate::config::{
    self, AgentConfig, ConfigError, LoadConfig, LoaderConfig, SourcePermissions, TlsFiles,
};

/// What a run needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Masters in failover order.
    pub servers: Vec<String>,
    /// The environment.
    pub environment: EnvName,
    /// `plugins` destination.
    pub libdir: PathBuf,
    /// `pluginfacts` destination, if any.
    pub factsdir: Option<PathBuf>,
    /// State directory.
    pub vardir: PathBuf,
    /// Ignore globs.
    pub ignore: Vec<String>,
    /// Whole-run deadline.
    pub timeout: Duration,
    /// Attempts per server.
    pub retries: u32,
    /// Concurrent downloads.
    pub parallel_downloads: usize,
    /// The removal guard's limit (`max_removal_percent`); `None` with
    /// `--allow-mass-removal`.
    pub max_removal_percent: Option<u8>,
    /// TLS files.
    pub tls: TlsFiles,
    /// `plugins` modes.
    pub plugins_permissions: SourcePermissions,
    /// `pluginfacts` modes.
    pub pluginfacts_permissions: SourcePermissions,
    /// Print the plan, change nothing.
    pub noop: bool,
    /// Report format.
    pub format: Format,
    /// Puppet-style detailed exit codes.
    pub detailed_exitcodes: bool,
    /// Run loaders after the commit (`[load] enabled` or `--load`).
    pub load_enabled: bool,
    /// `[load]`.
    pub load: LoadConfig,
    /// `[[loader]]`.
    pub loaders: Vec<LoaderConfig>,
    /// `[metrics] textfile`.
    pub metrics_textfile: Option<PathBuf>,
}

/// Command-line overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--environment`.
    pub environment: Option<String>,
    /// `--server` (replaces the config's list when non-empty).
    pub servers: Vec<String>,
    /// `--noop`.
    pub noop: bool,
    /// `--format`.
    pub format: Option<Format>,
    /// `--detailed-exitcodes`.
    pub detailed_exitcodes: bool,
    /// `--load`.
    pub load: bool,
    /// `--allow-mass-removal`.
    pub allow_mass_removal: bool,
}

impl Settings {
    /// Resolves `config` (loaded, so checked) with `cli` on top, and checks
    /// what the run goes by.
    pub fn resolve(config: AgentConfig, cli: Overrides) -> Result<Settings, ConfigError> {
        let servers = config::servers(if cli.servers.is_empty() {
            &config.servers
        } else {
            &cli.servers
        })?;
        let environment = config::environment(
            cli.environment
                .as_deref()
                .unwrap_or(config.environment.as_str()),
        )?;
        let tls = config.tls_files()?;
        Ok(Settings {
            servers,
            environment,
            libdir: config.libdir,
            factsdir: config.factsdir,
            vardir: config.vardir,
            ignore: config.ignore,
            timeout: config.timeout,
            retries: config.retries,
            parallel_downloads: config.parallel_downloads,
            max_removal_percent: (!cli.allow_mass_removal).then_some(config.max_removal_percent),
            tls,
            plugins_permissions: config.plugins.source_permissions,
            pluginfacts_permissions: config.pluginfacts.source_permissions,
            noop: cli.noop,
            format: cli.format.unwrap_or(Format::Text),
            detailed_exitcodes: cli.detailed_exitcodes,
            load_enabled: config.load.enabled || cli.load,
            load: config.load,
            loaders: config.loaders,
            metrics_textfile: config.metrics.textfile,
        })
    }
}
