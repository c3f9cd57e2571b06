//! `pluginsync-master`: parse the command line, set up logging, run the
//! subcommand, and turn its failure into one line on stderr and an exit
//! status ([`pluginsync_master::exit`]).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use pluginsync_master::cli::{self, Command};
use pluginsync_master::config::MasterConfig;
use pluginsync_master::exit::{ExitStatus, Failure};
use pluginsync_master::rollout::api::RolloutStatus;
use pluginsync_master::rollout_client::CommandError;
use pluginsync_master::{
    bundle, check, csr, devcerts, inventory_client, reindex, rollout_client, server, trust,
};

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(status) => return status.into(),
    };
    // Every command but `serve` prints its findings itself.
    let quiet = !matches!(cli.command, Command::Serve { .. });
    pluginsync_common::logging::init_with(cli.log_level(quiet), cli.log.log_format);
    let result = match cli.command {
        Command::Check { config, store } => load(&config).and_then(|c| {
            let out = &mut std::io::stdout();
            match store {
                true => check::store(&c, out),
                false => check::run(&c, out),
            }
            .map_err(Failure::config)
        }),
        Command::DevCerts(opts) => devcerts::generate(&opts)
            .map(|c| println!("development ssldir written to {}", c.ssldir.display()))
            .map_err(Failure::runtime),
        Command::Csr(opts) => csr::generate(&opts)
            .map(|c| {
                println!("key written to {}", c.key.display());
                println!(
                    "certificate request written to {} (submit it to the Puppet CA, sign it, \
                     and put the certificate in certs/; docs/tls.md, \"A P-256 key for the master\")",
                    c.request.display()
                );
            })
            .map_err(Failure::runtime),
        Command::Reindex {
            config,
            server,
            environment,
        } => load(&config).and_then(|c| {
            let done = tokio::runtime::Runtime::new()
                .map_err(Failure::runtime)?
                .block_on(reindex::run(&c, environment.as_deref(), server.as_deref()))
                .map_err(Failure::runtime)?;
            println!("{done}");
            Ok(())
        }),
        Command::Bundle {
            config,
            generation,
            certname,
            out,
            environment,
        } => load(&config).and_then(|c| {
            let which = match (&generation, &certname) {
                (Some(g), _) => bundle::Which::Generation(g),
                (None, Some(n)) => bundle::Which::Certname(n),
                (None, None) => bundle::Which::Everyone,
            };
            write_bundle(&c, &environment, which, &out)
        }),
        Command::Manifest {
            config,
            environment,
        } => load(&config).and_then(|c| print_manifest(&c, &environment)),
        Command::Rollout {
            config,
            masters,
            format,
            action,
            environment,
        } => load(&config).and_then(|c| {
            let answers = tokio::runtime::Runtime::new()
                .map_err(Failure::runtime)?
                .block_on(rollout_client::run(&c, &action, &environment, &masters));
            print_rollout(&answers, format == "json")
        }),
        Command::Inventory(args) => load(&args.config).and_then(|c| print_inventory(&c, args)),
        Command::Serve { config } => load(&config).and_then(|c| {
            tokio::runtime::Runtime::new()
                .map_err(Failure::runtime)?
                .block_on(serve(Arc::new(c)))
                .map_err(Failure::runtime)
        }),
    };
    match result {
        Ok(()) => ExitStatus::Success.into(),
        Err(f) => {
            eprintln!(
                "{}error: {}",
                pluginsync_common::logging::stderr_prefix(3),
                f.line()
            );
            f.status.into()
        }
    }
}

/// `bundle`: says which generation and why, writes it, says where.
fn write_bundle(
    c: &MasterConfig,
    environment: &str,
    which: bundle::Which,
    out: &Path,
) -> Result<(), Failure> {
    let said = |line: &str| println!("{line}");
    let written = bundle::run(c, environment, which, out, said).map_err(|e| {
        if e.is_not_found() {
            Failure::no_input(e)
        } else {
            Failure::runtime(e)
        }
    })?;
    println!("{}", written.line(out));
    Ok(())
}

/// `inventory`: reads every page matched and prints the table or JSON.
fn print_inventory(c: &MasterConfig, args: cli::InventoryArgs) -> Result<(), Failure> {
    let filters = inventory_client::Filters {
        environment: args.environment,
        generation: args.generation,
        not_generation: args.not_generation,
        failing: args.failing,
        stale: args.stale,
    };
    let master = args.master.as_deref();
    let rt = tokio::runtime::Runtime::new().map_err(Failure::runtime)?;
    let nodes = rt
        .block_on(inventory_client::fetch(c, master, &filters))
        .map_err(Failure::runtime)?;
    let labels = rt.block_on(inventory_client::labels(c, master, &nodes));
    match args.format == "json" {
        true => println!("{}", inventory_client::json(&nodes, &labels)),
        false => print!("{}", inventory_client::table(&nodes, &labels)),
    }
    Ok(())
}

/// Prints each master's rollout status (text, or one JSON array of
/// `{master, status}` / `{master, error}`); fails with the first error.
fn print_rollout(
    answers: &[(String, Result<RolloutStatus, CommandError>)],
    json: bool,
) -> Result<(), Failure> {
    if json {
        let list: Vec<serde_json::Value> = answers
            .iter()
            .map(|(m, r)| match r {
                Ok(s) => serde_json::json!({ "master": m, "status": s }),
                Err(e) => serde_json::json!({ "master": m, "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        for (m, r) in answers {
            match r {
                Ok(s) => print!("{}", rollout_client::text(m, s)),
                Err(e) => println!("{m}: error: {e}"),
            }
        }
    }
    match answers.iter().find_map(|(_, r)| r.as_ref().err()) {
        Some(e) => Err(Failure::runtime(anyhow::anyhow!("{e}"))),
        None => Ok(()),
    }
}

/// Writes `env`'s manifest to standard output, nothing else: the pipeline
/// signs exactly these bytes (docs/trust.md#the-signing-pipeline).
fn print_manifest(config: &MasterConfig, env: &str) -> Result<(), Failure> {
    use std::io::Write;
    let (bytes, _) = trust::manifest::of_tree(config, env).map_err(|e| {
        if e.is_not_found() {
            Failure::no_input(e)
        } else {
            Failure::runtime(e)
        }
    })?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::runtime(anyhow::anyhow!("cannot write the manifest: {e}")))
}

fn load(config: &Path) -> Result<MasterConfig, Failure> {
    MasterConfig::load(config).map_err(Failure::config)
}

/// Binds every listen address, then serves until SIGTERM/SIGINT.
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
    .await?;
    Ok(())
}
