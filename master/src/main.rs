//! `pluginsync-master`: parse the command line, set up logging, run.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use pluginsync_master::cli::{Cli, Command};
use pluginsync_master::config::MasterConfig;
use pluginsync_master::{EXIT_CONFIG, check, devcerts, server};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `check` prints its findings itself; the log would repeat them.
    let quiet = matches!(
        cli.command,
        Command::Check { .. } | Command::DevCerts { .. }
    );
    let level = match cli.verbose {
        0 if quiet => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
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
        Command::Check { config } => match MasterConfig::load(&config)
            .map_err(anyhow::Error::from)
            .and_then(|c| check::run(&c, &mut std::io::stdout()))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, EXIT_CONFIG as u8),
        },
        Command::DevCerts {
            out,
            server_names,
            agents,
            revoke,
            days,
        } => {
            let opts = devcerts::DevCertsOptions {
                out,
                server_names,
                agents,
                revoke,
                days,
            };
            match devcerts::generate(&opts) {
                Ok(c) => {
                    println!("development ssldir written to {}", c.ssldir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e, 1),
            }
        }
        Command::Serve { config } => {
            let config = match MasterConfig::load(&config) {
                Ok(c) => Arc::new(c),
                Err(e) => return fail(&e.into(), EXIT_CONFIG as u8),
            };
            match tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(serve(config)))
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e, 1),
            }
        }
    }
}

async fn serve(config: Arc<MasterConfig>) -> anyhow::Result<()> {
    for w in config.warnings() {
        tracing::warn!("{w}");
    }
    let mut listeners = Vec::new();
    for addr in config.listen_addrs()? {
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        listeners.push(l);
    }
    let (tls_tx, tls_rx) = tokio::sync::watch::channel(None);
    let shutdown = server::signals(config.clone(), tls_rx);
    server::serve(config, listeners, shutdown, move |running| {
        let _ = tls_tx.send(Some(running.tls));
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    })
    .await
}

fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::from(code)
}
