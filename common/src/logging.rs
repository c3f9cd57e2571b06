//! The one logging setup of both binaries: `tracing` to stderr, the level
//! from `-v` unless `RUST_LOG` says otherwise, colour only on a terminal,
//! and log lines nobody reads any more dropped instead of panicking.

/// Installs the global subscriber; `default_level` is an `EnvFilter`
/// directive (`"warn"`, `"info"`, `"pluginsync_agent=debug"`, …) used when
/// `RUST_LOG` is unset or invalid.
pub fn init(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _already_set_in_a_test = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr's reader gone) is
        // dropped; by default tracing-subscriber reports it with
        // `eprintln!`, which panics on that same broken pipe and kills the
        // task that logged (it once killed the master's shutdown task).
        .log_internal_errors(false)
        .try_init();
}
