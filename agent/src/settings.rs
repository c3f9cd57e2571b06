//! Settings: the command line over the config file over the defaults,
//! resolved once; everything after this takes `&Settings`.

use std::path::PathBuf;
use std::time::Duration;

use pluginsync_common::envname::EnvName;

use crate::cli::Format;
use crate::config::{
    AgentConfig, ConfigError, LoadConfig, LoaderConfig, SourcePermissions, TlsFiles,
    validate_server,
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
}

impl Settings {
    /// Resolves `config` with `cli` on top.
    pub fn resolve(config: AgentConfig, cli: Overrides) -> Result<Settings, ConfigError> {
        let servers = if cli.servers.is_empty() {
            config.servers.clone()
        } else {
            cli.servers
        };
        for s in &servers {
            validate_server(s).map_err(ConfigError::Invalid)?;
        }
        let env = cli
            .environment
            .unwrap_or_else(|| config.environment.clone());
        let environment = env
            .parse::<EnvName>()
            .map_err(|e| ConfigError::Invalid(format!("environment: {e}")))?;
        let tls = config.tls_files()?;
        Ok(Settings {
            servers: servers
                .iter()
                .map(|s| s.trim_end_matches('/').to_owned())
                .collect(),
            environment,
            libdir: config.libdir,
            factsdir: config.factsdir,
            vardir: config.vardir,
            ignore: config.ignore,
            timeout: config.timeout,
            retries: config.retries,
            parallel_downloads: config.parallel_downloads,
            tls,
            plugins_permissions: config.plugins.source_permissions,
            pluginfacts_permissions: config.pluginfacts.source_permissions,
            noop: cli.noop,
            format: cli.format.unwrap_or(Format::Text),
            detailed_exitcodes: cli.detailed_exitcodes,
            load_enabled: config.load.enabled || cli.load,
            load: config.load,
            loaders: config.loaders,
        })
    }
}
