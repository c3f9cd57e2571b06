//! `pluginsync-agent`: parse the command line, set up logging, run, print
//! the report on stdout and errors as one line on stderr.

use std::process::ExitCode;

use clap::Parser;
use pluginsync_agent::cli::{Cli, Command, Format};
use pluginsync_agent::config::AgentConfig;
use pluginsync_agent::load::{LoadStatus, Loaders};
use pluginsync_agent::plugins::Registry;
use pluginsync_agent::report::Report;
use pluginsync_agent::settings::{Overrides, Settings};

/// `print!` that drops output nobody reads any more (stdout closed by
/// `| head`, say) instead of panicking: the sync has happened and its exit
/// code must still say how it went.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _unread = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `println!` without the panic; see [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _unread = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` without the panic; see [`out!`].
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _unread = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = ["warn", "info", "debug"][usize::from(cli.verbose.min(2))];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr's reader gone) is
        // dropped; by default tracing-subscriber reports it with
        // `eprintln!`, which panics on that same broken pipe and kills
        // the task that logged (once: the master's shutdown task).
        .log_internal_errors(false)
        .init();
    match cli.command {
        Command::Sync {
            environment,
            config,
            servers,
            noop,
            format,
            detailed_exitcodes,
            load,
        } => {
            let overrides = Overrides {
                environment,
                servers,
                noop,
                format: Some(format),
                detailed_exitcodes,
                load,
            };
            let settings =
                match AgentConfig::load(&config).and_then(|c| Settings::resolve(c, overrides)) {
                    Ok(s) => s,
                    Err(e) => return fail(&e.to_string()),
                };
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            let outcome = runtime.block_on(pluginsync_agent::sync::run(&settings));
            print(&outcome.report, settings.format);
            for l in outcome
                .report
                .loads
                .iter()
                .filter(|l| l.status == LoadStatus::Failed)
            {
                errln!(
                    "load failed: {} ({}): {}",
                    l.path,
                    l.loader.as_deref().unwrap_or("after_load"),
                    l.error.as_deref().unwrap_or("failed")
                );
            }
            if let Some(e) = &outcome.error {
                errln!("error: {e}");
            }
            outcome.exit_status(settings.detailed_exitcodes).into()
        }
        Command::Plugins { config, format } => {
            let config = match AgentConfig::load(&config) {
                Ok(c) => c,
                Err(e) => return fail(&e.to_string()),
            };
            let registry = Registry::load(&config.vardir);
            let loaders = Loaders::new(&config.loaders, &config.load, &config.environment);
            if format == Format::Json {
                outln!("{}", serde_json::to_string(&registry).unwrap_or_default());
                return ExitCode::SUCCESS;
            }
            outln!(
                "{:<24} {:<14} {:<6} {:<9} PATH",
                "NAME",
                "VERSION",
                "API",
                "STATUS"
            );
            for (name, versions) in &registry.plugins {
                let active = registry
                    .active(name, loaders.constraint(name))
                    .map(|r| r.path.clone());
                for r in versions {
                    let status = if Some(&r.path) == active.as_ref() {
                        "active"
                    } else {
                        "available"
                    };
                    outln!(
                        "{:<24} {:<14} {:<6} {:<9} {}",
                        name,
                        r.version,
                        format!("x{}", r.api_version),
                        status,
                        r.path
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Command::Report { config, format } => {
            let vardir = match AgentConfig::load(&config) {
                Ok(c) => c.vardir,
                Err(e) => return fail(&e.to_string()),
            };
            match Report::load(&vardir) {
                Ok(r) => {
                    print(&r, format);
                    if format == Format::Text && r.changes.is_empty() && r.failures.is_empty() {
                        outln!(
                            "no changes in the last run ({}, {})",
                            r.environment,
                            r.error.as_deref().unwrap_or("ok")
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
    }
}

fn print(report: &Report, format: Format) {
    match format {
        Format::Text => out!("{}", report.text()),
        Format::Json => outln!("{}", serde_json::to_string(report).unwrap_or_default()),
    }
}

fn fail(message: &str) -> ExitCode {
    errln!("error: {message}");
    ExitCode::from(1)
}
