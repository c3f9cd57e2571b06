//! The one logging setup of both binaries: `tracing` to stderr, the level
//! from `-v` unless `RUST_LOG` says otherwise, colour only on a terminal,
//! and log lines nobody reads any more dropped instead of panicking.
//!
//! Two things make the lines usable under systemd (docs/operating.md#logs):
//! - when stderr is the journal (`JOURNAL_STREAM` names stderr's device and
//!   inode, as systemd sets it for a unit's output), each line starts with
//!   its syslog priority, `<3>` for errors, `<4>` warnings, `<6>` info and
//!   `<7>` debug (sd-daemon(3)), and carries no timestamp of its own:
//!   `journalctl -p err` then shows a failed sync's cause;
//! - the `-v` levels apply to pluginsync's own crates only; libraries
//!   (HTTP/2, TLS, inotify) stay at `warn` until the most verbose level.
//!
//! [`LogFormat::Json`] writes one JSON object per line instead of text.

use std::fmt;
use std::str::FromStr;

use clap::builder::TypedValueParser;

use tracing::Level;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable text (the default).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// A `--log-format` that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format '{0}' (expected 'text' or 'json')")]
pub struct UnknownLogFormat(pub String);

/// `-v` and `--log-format`: the logging flags of both binaries, declared
/// once and flattened into each one's command line (`cli.rs`).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// More log output on stderr (-v info, -vv debug, -vvv trace, the same
    /// levels in the agent and the master); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Log lines as text or as one JSON object per line (docs/operating.md#logs).
    #[arg(long, global = true, default_value = "text", value_parser = clap::builder::PossibleValuesParser::new(["text", "json"]).map(|s| s.parse::<LogFormat>().unwrap_or_default()))]
    pub log_format: LogFormat,
}

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, UnknownLogFormat> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

/// The crates whose lines `-v` turns up.
const OWN_CRATES: [&str; 3] = ["pluginsync_master", "pluginsync_agent", "pluginsync_common"];

/// The `EnvFilter` directives for `level` (`"warn"`, `"info"`, `"debug"`,
/// `"trace"`): pluginsync's crates at `level`, libraries at `warn`, or at
/// `debug` when `level` is `trace` (the "show me everything" setting).
pub fn directives(level: &str) -> String {
    let libraries = if level == "trace" { "debug" } else { "warn" };
    let mut d = libraries.to_owned();
    for krate in OWN_CRATES {
        d.push_str(&format!(",{krate}={level}"));
    }
    d
}

/// The syslog priority of a level (sd-daemon(3)).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// True when stderr is the systemd journal's stream: `JOURNAL_STREAM` is
/// `<device>:<inode>` of the stream systemd connected (systemd.exec(5)),
/// compared with stderr's own, so a child whose stderr was redirected
/// does not prefix lines meant for a file.
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => m.dev() == dev && m.ino() == ino,
        Err(_) => false,
    }
}

/// The prefix for a line a binary writes to stderr itself (its final
/// `error: …` line, say) at syslog `priority`: `<N>` when stderr is the
/// journal, else nothing — so `journalctl -p err` shows it too.
pub fn stderr_prefix(priority: u8) -> String {
    static JOURNAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *JOURNAL.get_or_init(stderr_is_journal) {
        format!("<{priority}>")
    } else {
        String::new()
    }
}

/// An event format that starts each line with its syslog priority.
struct Prioritised<F>(F);

impl<S, N, F> FormatEvent<S, N> for Prioritised<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs the global subscriber; `level` (`"warn"`, `"info"`, `"debug"`,
/// `"trace"`) is the level of pluginsync's own lines (see [`directives`])
/// used when `RUST_LOG` is unset or invalid.
pub fn init_with(level: &str, format: LogFormat) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(directives(level)))
    };
    let journal = stderr_is_journal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(!journal && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr's reader gone) is
        // dropped; by default tracing-subscriber reports it with
        // `eprintln!`, which panics on that same broken pipe and kills the
        // task that logged (it once killed the master's shutdown task).
        .log_internal_errors(false);
    // The result is an error only when a subscriber is already set (tests).
    let _already_set = match (format, journal) {
        (LogFormat::Text, false) => builder.try_init(),
        (LogFormat::Text, true) => builder
            .event_format(Prioritised(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .try_init(),
        (LogFormat::Json, false) => builder.json().try_init(),
        (LogFormat::Json, true) => builder
            .json()
            .event_format(Prioritised(tracing_subscriber::fmt::format().json()))
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_turns_up_our_crates_not_the_libraries() {
        assert_eq!(
            directives("info"),
            "warn,pluginsync_master=info,pluginsync_agent=info,pluginsync_common=info"
        );
        assert!(directives("trace").starts_with("debug,"));
        for level in ["warn", "info", "debug", "trace"] {
            tracing_subscriber::EnvFilter::try_new(directives(level)).expect("valid directives");
        }
    }

    #[test]
    fn priorities_are_syslogs() {
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::DEBUG), 7);
        assert_eq!(priority(&Level::TRACE), 7);
    }

    #[test]
    fn formats_parse_and_refuse_with_a_message() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!(
            "xml"
                .parse::<LogFormat>()
                .unwrap_err()
                .to_string()
                .contains("'xml'")
        );
    }
}
