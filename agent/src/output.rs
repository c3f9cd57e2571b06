//! What `pluginsync-agent` prints on stdout and stderr: the report (text or
//! JSON), the `plugins` table, load failures and error lines.
//!
//! Every line is made of text from outside (names from a listing or the
//! disk, a master's error messages, a loader's output): it goes through
//! [`escape`] first, so it stays one line and sends no control sequence to
//! a terminal or a cron mail.
//!
//! Writes to a closed stdout or stderr (`pluginsync-agent sync | head`) are
//! dropped instead of panicking: the sync has happened and its exit status
//! must still say how it went.

use std::io::Write;

use crate::cli::Format;
use crate::load::{LoadStatus, Loaders};
use crate::plugins::Registry;
use crate::report::{Report, escape};

/// Writes `text` to stdout, ignoring a reader that went away.
pub fn stdout(text: &str) {
    let _unread = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Writes `line`, escaped ([`escape`]: it stays one line), and a newline to
/// stderr, ignoring a reader that went away.
pub fn stderr_line(line: &str) {
    let _unread = writeln!(std::io::stderr().lock(), "{}", escape(line));
}

/// The one line an error becomes; under the journal it carries the err
/// priority, so `journalctl -p err` shows a failed sync's cause
/// (`common::logging`).
pub fn error(message: &dyn std::fmt::Display) {
    prioritised_line(3, &format!("error: {message}"));
}

/// `line`, escaped, on stderr with the syslog `priority` prefix when stderr
/// is the journal (`common::logging::stderr_prefix`).
fn prioritised_line(priority: u8, line: &str) {
    let _unread = writeln!(
        std::io::stderr().lock(),
        "{}{}",
        pluginsync_common::logging::stderr_prefix(priority),
        escape(line)
    );
}

/// Prints a report: one line per change and a summary, or one JSON object.
pub fn report(report: &Report, format: Format) {
    match format {
        Format::Text => stdout(&report.text()),
        Format::Json => stdout(&format!(
            "{}\n",
            serde_json::to_string(report).unwrap_or_default()
        )),
    }
}

/// Prints ONE stderr line for the run's failed changes, however many
/// (a full disk once made 2,655 lines): their count and the
/// first; every one of them is in the report (stdout and
/// `<vardir>/last_run_report.json`).
pub fn commit_failures(report: &Report) {
    let Some(first) = report.failures.first() else {
        return;
    };
    let n = report.failures.len();
    stderr_line(&if n == 1 {
        format!("error: 1 change failed: {}: {}", first.path, first.error)
    } else {
        format!(
            "error: {n} changes failed (all in the report); the first: {}: {}",
            first.path, first.error
        )
    });
}

/// Prints one stderr line per failed load (each is also in the report).
pub fn load_failures(report: &Report) {
    for l in report
        .loads
        .iter()
        .filter(|l| l.status == LoadStatus::Failed)
    {
        stderr_line(&format!(
            "load failed: {} ({}): {}",
            l.path,
            l.loader.as_deref().unwrap_or("after_load"),
            l.error.as_deref().unwrap_or("failed")
        ));
    }
}

/// `pluginsync-agent report`: the last run's report, and in text a line
/// saying so when it changed nothing.
pub fn last_report(r: &Report, format: Format) {
    report(r, format);
    if format != Format::Text {
        return;
    }
    if let Some(e) = &r.error {
        stdout(&format!(
            "FAILED: the last run ({}) stopped: {}\n",
            escape(&r.environment),
            escape(e)
        ));
    } else if !r.failures.is_empty() {
        stdout(&format!(
            "FAILED: the last run ({}) had {} failures\n",
            escape(&r.environment),
            r.failures.len()
        ));
    } else if r.changes.is_empty() {
        stdout(&format!(
            "no changes in the last run ({}, ok)\n",
            escape(&r.environment)
        ));
    }
}

/// One `warning: …` line on stderr (the warning priority under the
/// journal).
pub fn warning(message: &str) {
    prioritised_line(4, &format!("warning: {message}"));
}

/// `pluginsync-agent plugins`: the registry as a table (name, version,
/// api, status, path) or as JSON.
pub fn plugins(registry: &Registry, loaders: &Loaders, format: Format) {
    if format == Format::Json {
        stdout(&format!(
            "{}\n",
            serde_json::to_string(registry).unwrap_or_default()
        ));
        return;
    }
    let mut out = format!(
        "{:<24} {:<14} {:<6} {:<9} PATH\n",
        "NAME", "VERSION", "API", "STATUS"
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
            out.push_str(&format!(
                "{:<24} {:<14} {:<6} {:<9} {}\n",
                escape(name),
                escape(&r.version.to_string()),
                format!("x{}", r.api_version),
                status,
                escape(&r.path)
            ));
        }
    }
    stdout(&out);
}
