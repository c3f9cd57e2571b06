//! Agent metrics for node_exporter's textfile collector (`[metrics]
//! textfile`, docs/operating.md#agent-metrics): after every run, failed ones
//! included, the file is replaced atomically (`common::fsutil`), so the
//! collector never reads half of it and an operator can alert on "no
//! successful sync in 2 hours".
//!
//! The agent is a timer job with nothing to scrape, so every series is a
//! gauge describing the last run (`pluginsync_agent_last_run_…`), except
//! `pluginsync_agent_last_success_timestamp_seconds`, which a failed run
//! carries over from the previous file.

use std::path::Path;

use metrics::{Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use pluginsync_common::fsutil::replace_atomic;

use crate::load::LoadStatus;
use crate::plan::ChangeKind;
use crate::report::Report;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The series that survives a failed run.
const LAST_SUCCESS: &str = "pluginsync_agent_last_success_timestamp_seconds";

/// What a run adds to its report for the textfile.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFacts {
    /// The process's exit code.
    pub exit_code: u8,
    /// When the client certificate expires (Unix seconds), if readable.
    pub cert_expiry: Option<i64>,
}

/// True if the run applied without any failure.
pub fn succeeded(report: &Report) -> bool {
    report.error.is_none() && report.failures.is_empty()
}

/// The textfile for `report`; `previous` is the file the last run wrote
/// (its last-success time is kept when this run failed).
pub fn render(report: &Report, facts: RunFacts, previous: Option<&str>) -> String {
    let g = Gauges(PrometheusBuilder::new().build_recorder());
    last_run(&g, report, facts, previous);
    changes(&g, report);
    failures_and_loads(&g, report);
    identity(&g, report, facts);
    g.0.handle().render()
}

/// One textfile's gauges, on a recorder of its own.
struct Gauges(PrometheusRecorder);

impl Gauges {
    /// `name`'s unit and help line.
    fn describe(&self, name: &'static str, unit: Option<Unit>, help: &'static str) {
        self.0
            .describe_gauge(name.into(), unit, SharedString::const_str(help));
    }

    /// Sets `name{labels}` to `value`.
    fn set(&self, name: &'static str, labels: Vec<Label>, value: f64) {
        self.0
            .register_gauge(&Key::from_parts(name, labels), &METADATA)
            .set(value);
    }
}

/// When the last run started and succeeded, whether it did, how long it
/// took, its exit code.
fn last_run(g: &Gauges, report: &Report, facts: RunFacts, previous: Option<&str>) {
    let ok = succeeded(report);
    let started = report.started_at as f64;
    g.describe(
        "pluginsync_agent_last_run_timestamp_seconds",
        Some(Unit::Seconds),
        "When the last run started (Unix time).",
    );
    g.set(
        "pluginsync_agent_last_run_timestamp_seconds",
        vec![],
        started,
    );
    g.describe(
        LAST_SUCCESS,
        Some(Unit::Seconds),
        "When the last run without any failure started (Unix time).",
    );
    let last_success = if ok {
        Some(started)
    } else {
        previous.and_then(|p| {
            p.lines()
                .find_map(|l| l.strip_prefix(LAST_SUCCESS)?.trim().parse::<f64>().ok())
        })
    };
    if let Some(t) = last_success {
        g.set(LAST_SUCCESS, vec![], t);
    }
    g.describe(
        "pluginsync_agent_last_run_success",
        None,
        "1 if the last run applied without any failure, else 0.",
    );
    g.set(
        "pluginsync_agent_last_run_success",
        vec![],
        if ok { 1.0 } else { 0.0 },
    );
    g.describe(
        "pluginsync_agent_last_run_duration_seconds",
        Some(Unit::Seconds),
        "Wall time of the last run.",
    );
    g.set(
        "pluginsync_agent_last_run_duration_seconds",
        vec![],
        report.duration_ms as f64 / 1000.0,
    );
    g.describe(
        "pluginsync_agent_last_run_exit_code",
        None,
        "Exit code of the last run.",
    );
    g.set(
        "pluginsync_agent_last_run_exit_code",
        vec![],
        f64::from(facts.exit_code),
    );
}

/// The last run's changes, by action and mount.
fn changes(g: &Gauges, report: &Report) {
    g.describe(
        "pluginsync_agent_last_run_changes",
        None,
        "Changes the last run applied, by action and mount.",
    );
    for mount in ["plugins", "pluginfacts"] {
        for kind in [
            ChangeKind::Created,
            ChangeKind::Updated,
            ChangeKind::Removed,
            ChangeKind::Mode,
        ] {
            let n = report
                .changes
                .iter()
                .filter(|c| c.action == kind && c.path.split('/').next() == Some(mount))
                .count();
            g.set(
                "pluginsync_agent_last_run_changes",
                vec![
                    Label::new("action", kind.as_str()),
                    Label::new("mount", mount),
                ],
                n as f64,
            );
        }
    }
}

/// The last run's failures, and its loads by status.
fn failures_and_loads(g: &Gauges, report: &Report) {
    g.describe(
        "pluginsync_agent_last_run_failures",
        None,
        "Failures of the last run (a run that stopped counts 1).",
    );
    let failures = report.failures.len() + usize::from(report.error.is_some());
    g.set(
        "pluginsync_agent_last_run_failures",
        vec![],
        failures as f64,
    );
    g.describe(
        "pluginsync_agent_last_run_loads",
        None,
        "Loads of the last run's changed files, by status.",
    );
    for (status, name) in [
        (LoadStatus::Ok, "ok"),
        (LoadStatus::Failed, "failed"),
        (LoadStatus::Skipped, "skipped"),
    ] {
        let n = report.loads.iter().filter(|l| l.status == status).count();
        g.set(
            "pluginsync_agent_last_run_loads",
            vec![Label::new("status", name)],
            n as f64,
        );
    }
}

/// The agent's version and environment, and when its certificate
/// expires.
fn identity(g: &Gauges, report: &Report, facts: RunFacts) {
    g.describe(
        "pluginsync_agent_info",
        None,
        "The agent's version and the environment of its last run.",
    );
    g.set(
        "pluginsync_agent_info",
        vec![
            Label::new("version", report.agent_version.clone()),
            Label::new("environment", report.environment.clone()),
        ],
        1.0,
    );
    if let Some(generation) = &report.generation {
        g.describe(
            "pluginsync_agent_last_run_generation_info",
            None,
            "The generation the last run left in place (docs/protocol.md §4.11), first 12 hex digits.",
        );
        let short = generation.get(..12).unwrap_or(generation).to_owned();
        g.set(
            "pluginsync_agent_last_run_generation_info",
            vec![Label::new("generation", short)],
            1.0,
        );
    }
    if let Some(expiry) = facts.cert_expiry {
        g.describe(
            "pluginsync_agent_client_certificate_expiry_timestamp_seconds",
            Some(Unit::Seconds),
            "When the agent's client certificate expires (Unix time).",
        );
        g.set(
            "pluginsync_agent_client_certificate_expiry_timestamp_seconds",
            vec![],
            expiry as f64,
        );
    }
}

/// Writes the textfile for `report` at `path`, atomically; the previous
/// file, if any, gives the last success of a failed run. Without `fsync`
/// (`replace_atomic`): it is rewritten after every run, a no-op included,
/// which must make no sync call (the test
/// `agent_durable::a_run_that_changes_nothing_makes_no_sync_call`). A crash can
/// lose it, never tear it (`pluginsync_common::fsutil`'s module docs):
/// node_exporter then shows the previous run, or no series, until the
/// next run replaces it — the last-run timestamp shows how old it is.
pub fn write_textfile(path: &Path, report: &Report, facts: RunFacts) -> std::io::Result<()> {
    let previous = std::fs::read_to_string(path).ok();
    let text = render(report, facts, previous.as_deref());
    replace_atomic(path, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Change, Failure};

    fn report(failed: bool) -> Report {
        Report {
            environment: "production".into(),
            server: Some("https://puppet:8140".into()),
            noop: false,
            changes: vec![Change {
                path: "plugins/facter/x.rb".into(),
                action: ChangeKind::Created,
                file: "/var/lib/x.rb".into(),
            }],
            failures: if failed {
                vec![Failure {
                    path: "plugins/y.rb".into(),
                    error: "disk full".into(),
                }]
            } else {
                Vec::new()
            },
            unchanged: 3,
            duration_ms: 1500,
            applied: true,
            error: None,
            started_at: if failed { 2_000 } else { 1_000 },
            agent_version: "0.1.0".into(),
            loads: Vec::new(),
            puppet_lock_waited_ms: None,
            generation: None,
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_failed_run_keeps_the_last_success() {
        let good = render(&report(false), RunFacts::default(), None);
        assert_eq!(value(&good, LAST_SUCCESS), Some(1000.0));
        assert_eq!(value(&good, "pluginsync_agent_last_run_success"), Some(1.0));
        assert_eq!(
            value(
                &good,
                "pluginsync_agent_last_run_changes{action=\"created\",mount=\"plugins\"}"
            ),
            Some(1.0)
        );
        let bad = render(
            &report(true),
            RunFacts {
                exit_code: 1,
                cert_expiry: Some(1_900_000_000),
            },
            Some(&good),
        );
        assert_eq!(value(&bad, LAST_SUCCESS), Some(1000.0), "{bad}");
        assert_eq!(
            value(&bad, "pluginsync_agent_last_run_timestamp_seconds"),
            Some(2000.0)
        );
        assert_eq!(value(&bad, "pluginsync_agent_last_run_success"), Some(0.0));
        assert_eq!(
            value(&bad, "pluginsync_agent_last_run_exit_code"),
            Some(1.0)
        );
        assert_eq!(value(&bad, "pluginsync_agent_last_run_failures"), Some(1.0));
        assert_eq!(
            value(
                &bad,
                "pluginsync_agent_client_certificate_expiry_timestamp_seconds"
            ),
            Some(1.9e9)
        );
    }
}
