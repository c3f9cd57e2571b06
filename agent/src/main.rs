//! `pluginsync-agent`: parse the command line, set up logging, run the
//! subcommand, print through [`pluginsync_agent::output`], and exit with
//! the documented status ([`pluginsync_agent::exit`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pluginsync_agent::cli::{self, Command};
use pluginsync_agent::config::{AgentConfig, DEFAULT_VARDIR};
use pluginsync_agent::exit::ExitStatus;
use pluginsync_agent::output;
use pluginsync_agent::plugins::Registry;
use pluginsync_agent::report::{self, Report};
use pluginsync_agent::settings::{CommandLine, RunFlags, Settings, command_line};
use pluginsync_agent::signals::Interrupts;
use pluginsync_agent::sync::SyncError;
use pluginsync_agent::{certs, metrics};

fn main() -> ExitCode {
    // A loader's supervisor (load.rs, `supervised`): no CLI, no logging.
    if let Some(code) = pluginsync_agent::load::supervised() {
        return ExitCode::from((code & 0xff) as u8);
    }
    if let Ok(agent) = std::env::current_exe() {
        pluginsync_agent::load::use_supervisor(agent);
    }
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(status) => return status.into(),
    };
    pluginsync_common::logging::init_with(cli.log_level(), cli.log.log_format);
    match run(cli.command) {
        Ok(status) => status,
        Err((status, message)) => {
            output::error(&message);
            status
        }
    }
    .into()
}

/// A settings error's exit status (64 for a command-line value, 78 for a
/// file's) and its line.
fn resolve_error(e: pluginsync_agent::settings::ResolveError) -> (ExitStatus, String) {
    let status = if e.from_command_line {
        ExitStatus::Usage
    } else {
        ExitStatus::Config
    };
    (status, e.to_string())
}

/// What a subcommand ends with: its exit status, or an error's status and
/// its one line.
type Ended = Result<ExitStatus, (ExitStatus, String)>;

/// Loads agent.toml: a config error (78) is its one line.
fn load_config(path: &Path) -> Result<AgentConfig, (ExitStatus, String)> {
    AgentConfig::load(path).map_err(|e| (ExitStatus::Config, e.to_string()))
}

/// Runs one subcommand.
fn run(command: Command) -> Ended {
    match command {
        Command::Sync {
            environment,
            config,
            servers,
            certname,
            test,
            noop,
            format,
            detailed_exitcodes,
            load,
            allow_mass_removal,
            from_bundle,
            allow_expired_metadata,
        } => sync_or_rollback(
            &config,
            command_line(
                environment,
                servers,
                certname,
                RunFlags {
                    noop,
                    format: Some(format),
                    // `--test` is `puppet agent --test`: detailed exit codes.
                    detailed_exitcodes: detailed_exitcodes || test,
                    load,
                    allow_mass_removal,
                    allow_expired_metadata,
                },
            ),
            false,
            from_bundle,
        ),
        Command::Rollback {
            environment,
            config,
            format,
            load,
        } => sync_or_rollback(
            &config,
            command_line(
                environment,
                Vec::new(),
                None,
                RunFlags {
                    format: Some(format),
                    load,
                    ..RunFlags::default()
                },
            ),
            true,
            None,
        ),
        Command::Plugins { config, format } => {
            let file = load_config(&config)?;
            let vardir = (file.vardir.clone()).unwrap_or_else(|| DEFAULT_VARDIR.into());
            let loaders = (file.loader_table()).map_err(|e| (ExitStatus::Config, e.to_string()))?;
            output::plugins(&Registry::load(&vardir), &loaders, format);
            Ok(ExitStatus::Success)
        }
        Command::Config {
            config,
            environment,
            servers,
            certname,
            format,
        } => show_config(
            &config,
            command_line(environment, servers, certname, RunFlags::default()),
            format,
        ),
        Command::Report { config, format } => {
            let vardir = (load_config(&config)?.vardir).unwrap_or_else(|| DEFAULT_VARDIR.into());
            let report = Report::load(&vardir).map_err(|e| (ExitStatus::Failure, e.to_string()))?;
            output::last_report(&report, format);
            // A monitoring check can run `pluginsync-agent report`.
            Ok(if metrics::succeeded(&report) {
                ExitStatus::Success
            } else {
                ExitStatus::Failure
            })
        }
    }
}

/// `pluginsync-agent sync` (or, `rollback`, `pluginsync-agent
/// rollback`): one run, its report, its metrics; with `bundle`, `sync
/// --from-bundle` (docs/agent.md#offline-from-a-bundle).
fn sync_or_rollback(
    config: &Path,
    cli: CommandLine,
    rollback: bool,
    bundle: Option<PathBuf>,
) -> Ended {
    // The file is checked on load (78); what `resolve` refuses comes from
    // the command line (a usage error, 64) or from puppet.conf (78).
    let file = load_config(config)?;
    let settings = Settings::resolve(file, cli).map_err(resolve_error)?;
    pluginsync_common::fsutil::set_quiet_dirty(settings.switch.syncfs_below_dirty_mib << 20);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            (
                ExitStatus::Failure,
                format!("cannot start the runtime: {e}"),
            )
        })?;
    // SIGTERM/SIGINT from here on stop the run cleanly
    // (docs/operating.md#signals); if they cannot be taken over they keep killing.
    let interrupts = Interrupts::listen().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot handle SIGTERM and SIGINT");
        Interrupts::none()
    });
    let outcome = if rollback {
        runtime.block_on(pluginsync_agent::sync::rollback(&settings, &interrupts))
    } else {
        runtime.block_on(pluginsync_agent::sync::run(
            &settings,
            bundle.as_deref(),
            &interrupts,
        ))
    };
    // The run is over: nothing of it runs on the blocking threads, and
    // waiting for them to wind down cost 0.4 ms a run.
    runtime.shutdown_background();
    output::report(&outcome.report, settings.format);
    output::commit_failures(&outcome.report);
    output::load_failures(&outcome.report);
    let status = outcome.exit_status(settings.detailed_exitcodes);
    match &outcome.error {
        // Skipped, not failed: the running one reports and writes the
        // metrics (`ExitStatus::Busy`). A Puppet run that outlasted the
        // wait is 75 too, but this run reports it (its one error line).
        Some(e @ SyncError::Lock(_)) if status == ExitStatus::Busy => {
            output::warning(&format!("{e}: this run is skipped, nothing was changed"));
            return Ok(status);
        }
        Some(e) => output::error(e),
        None => {}
    }
    if let Some(path) = settings.metrics_textfile.as_deref()
        && !settings.noop
    {
        let facts = metrics::RunFacts {
            exit_code: status.code(),
            cert_expiry: certs::validity(&settings.tls.cert).map(|(_, until)| until),
        };
        if let Err(e) = metrics::write_textfile(path, &outcome.report, facts) {
            output::warning(&format!(
                "cannot write the metrics textfile '{}': {e}",
                path.display()
            ));
        }
    }
    Ok(status)
}

/// `pluginsync-agent config`: every effective setting and its source.
fn show_config(config: &Path, cli: CommandLine, format: cli::Format) -> Ended {
    let file = load_config(config)?;
    let settings = Settings::resolve(file, cli).map_err(resolve_error)?;
    // Said where an operator checks a config, not only when a run loads
    // (docs/loading.md#never-put-path-in-a-shell-script).
    for (loader, placeholder) in settings.loaders.shell_interpolations() {
        output::warning(&format!(
            "loader '{}' puts {placeholder} inside a shell script: a module file named $(…) would run as root; pass it as an argument after the script",
            report::escape(loader)
        ));
    }
    match format {
        cli::Format::Text => {
            for e in &settings.effective {
                println!("{} = {}  ({})", e.name, e.value, e.source);
            }
        }
        cli::Format::Json => {
            println!("{}", serde_json::json!({ "settings": settings.effective }))
        }
    }
    Ok(ExitStatus::Success)
}
