//! The run report: what changed, what failed, how long it took.
//!
//! Text output is one line per change, `<action>  <mount>/<relative path>`
//! (`created`, `updated`, `removed`, `mode`), plus one summary line, and
//! nothing at all when nothing changed or failed, so cron mails only when
//! there is news. `--format json` prints the whole report. Every real run
//! (not `--noop`) also writes it to `<vardir>/last_run_report.json`,
//! atomically, for `pluginsync-agent report`.

use std::borrow::Cow;
use std::path::Path;

use pluginsync_common::fsutil::replace_atomic;
use serde::{Deserialize, Serialize};

use crate::load::{LoadEntry, LoadStatus};
use crate::plan::ChangeKind;

/// Text from outside made safe for a terminal, a log or a cron mail
/// (`common::text::escape`). Every line the agent prints goes through it
/// (`report.rs` for the text report, `output.rs` for the rest).
pub fn escape(text: &str) -> Cow<'_, str> {
    pluginsync_common::text::escape(text)
}

/// Why the last report cannot be read (`pluginsync-agent report`).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file cannot be read.
    #[error("cannot read '{}': {source}", .path.display())]
    Read {
        /// `<vardir>/last_run_report.json`.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a report.
    #[error("'{}' is not a report: {source}", .path.display())]
    NotReport {
        /// `<vardir>/last_run_report.json`.
        path: std::path::PathBuf,
        /// serde_json's reason.
        source: serde_json::Error,
    },
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `<mount>/<relative path>`, e.g. `plugins/facter/x.rb`.
    pub path: String,
    /// What happened.
    pub action: ChangeKind,
    /// The absolute path on this node.
    pub file: String,
}

/// One failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// `<mount>/<relative path>`, or the mount for a whole-pass failure.
    pub path: String,
    /// One line.
    pub error: String,
}

/// A run's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The environment.
    pub environment: String,
    /// The master that served the run, if one answered.
    pub server: Option<String>,
    /// `--noop`: `changes` are what would have changed.
    pub noop: bool,
    /// Changes, in the order applied.
    pub changes: Vec<Change>,
    /// Individual failures of an applied run.
    pub failures: Vec<Failure>,
    /// Entries already in sync.
    pub unchanged: usize,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// False when the run stopped before changing anything.
    pub applied: bool,
    /// Why the run stopped, when it did.
    pub error: Option<String>,
    /// Unix time of the run's start.
    pub started_at: u64,
    /// The agent's version.
    pub agent_version: String,
    /// What happened to each changed file's load.
    #[serde(default)]
    pub loads: Vec<LoadEntry>,
    /// The generation the destinations hold after the run, for the whole
    /// run (both mounts are one generation, docs/protocol.md §4.11): set
    /// when the run was planned from one and committed it (or found the
    /// destinations in sync with it); absent for a failed run and for a
    /// run that synced Puppet's listings. Under `--noop`, the generation
    /// the plans were made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    /// How long the commit waited for a Puppet run's lock, only when it
    /// did (docs/agent.md#a-puppet-run-in-progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub puppet_lock_waited_ms: Option<u64>,
}

impl Report {
    /// The text report: empty when nothing changed and nothing failed.
    /// Every field from outside goes through [`escape`]: one line per
    /// change, whatever its name.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.changes {
            out.push_str(&format!("{:<8} {}\n", c.action.as_str(), escape(&c.path)));
        }
        for f in &self.failures {
            out.push_str(&format!(
                "{:<8} {}: {}\n",
                "failed",
                escape(&f.path),
                escape(&f.error)
            ));
        }
        if self.changes.is_empty() && self.failures.is_empty() {
            return out;
        }
        if self.loads.iter().any(|l| l.status != LoadStatus::Skipped) {
            let n = |s: LoadStatus| self.loads.iter().filter(|l| l.status == s).count();
            out.push_str(&format!(
                "loads: {} ok, {} failed, {} skipped\n",
                n(LoadStatus::Ok),
                n(LoadStatus::Failed),
                n(LoadStatus::Skipped)
            ));
        }
        let count = |k: ChangeKind| self.changes.iter().filter(|c| c.action == k).count();
        out.push_str(&format!(
            "{}: {} created, {} updated, {} removed, {} mode, {} failed, {} unchanged ({}{} from {}, {:.2}s){}\n",
            if self.noop { "noop, would apply" } else { "pluginsync" },
            count(ChangeKind::Created),
            count(ChangeKind::Updated),
            count(ChangeKind::Removed),
            count(ChangeKind::Mode),
            self.failures.len(),
            self.unchanged,
            escape(&self.environment),
            match &self.generation {
                Some(g) => format!(" generation {}", escape(g.get(..12).unwrap_or(g))),
                None => String::new(),
            },
            escape(self.server.as_deref().unwrap_or("no server")),
            self.duration_ms as f64 / 1000.0,
            if self.noop { "; nothing was changed" } else { "" },
        ));
        out
    }

    /// Writes `<vardir>/last_run_report.json` atomically, without `fsync`
    /// (`replace_atomic`): every run writes it, a run that changes nothing
    /// included, and such a run makes no sync call (the test
    /// `agent_durable::a_run_that_changes_nothing_makes_no_sync_call`).
    /// After a crash it can be lost but never torn (the argument
    /// is in `pluginsync_common::fsutil`'s module docs): the name holds
    /// this report or the previous one — or, on some filesystems, an empty
    /// or short file that [`Report::load`] refuses as not a report — and the
    /// next run writes a new one. What it claims is durable before it is
    /// written: the commit syncs before `sync.rs` saves it.
    pub fn save(&self, vardir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(vardir)?;
        // Serialised in memory first: straight into the file, serde_json
        // would make one write(2) per token.
        let mut json = serde_json::to_vec_pretty(self)?;
        json.push(b'\n');
        replace_atomic(&vardir.join("last_run_report.json"), &json, 0o600)
    }

    /// Reads the last report.
    pub fn load(vardir: &Path) -> Result<Report, ReportError> {
        let path = vardir.join("last_run_report.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(source) => return Err(ReportError::Read { path, source }),
        };
        serde_json::from_str(&text).map_err(|source| ReportError::NotReport { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(changes: Vec<Change>) -> Report {
        Report {
            environment: "production".into(),
            server: Some("https://m:8140".into()),
            noop: false,
            changes,
            failures: vec![],
            unchanged: 3,
            duration_ms: 1500,
            applied: true,
            error: None,
            started_at: 0,
            agent_version: "0".into(),
            loads: vec![],
            puppet_lock_waited_ms: None,
            generation: None,
        }
    }

    #[test]
    fn silent_when_nothing_changed() {
        assert_eq!(report(vec![]).text(), "");
    }

    #[test]
    fn one_line_per_change_and_a_summary() {
        let r = report(vec![
            Change {
                path: "plugins/a.rb".into(),
                action: ChangeKind::Created,
                file: "/l/a.rb".into(),
            },
            Change {
                path: "pluginfacts/b.sh".into(),
                action: ChangeKind::Mode,
                file: "/f/b.sh".into(),
            },
        ]);
        let t = r.text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "created  plugins/a.rb");
        assert_eq!(lines[1], "mode     pluginfacts/b.sh");
        assert!(lines[2].starts_with(
            "pluginsync: 1 created, 0 updated, 0 removed, 1 mode, 0 failed, 3 unchanged"
        ));
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("unchanged (production from https://m:8140, 1.50s)"));
        let mut g = r.clone();
        g.generation = Some("0123456789abcdef".repeat(4));
        assert!(
            g.text()
                .contains("(production generation 0123456789ab from https://m:8140, 1.50s)"),
            "{}",
            g.text()
        );
    }

    #[test]
    fn names_and_messages_cannot_forge_lines_or_reach_the_terminal() {
        let mut r = report(vec![Change {
            path: "plugins/a\u{1b}[2J\npluginsync: 0 created\u{202e}.rb".into(),
            action: ChangeKind::Created,
            file: "/l/x".into(),
        }]);
        r.failures.push(Failure {
            path: "plugins/b\rc".into(),
            error: "boom\u{7}\u{9b}31m\tend".into(),
        });
        let t = r.text();
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(t.starts_with(
            "created  plugins/a\\x1b[2J\\npluginsync: 0 created\\u{202e}.rb\n\
             failed   plugins/b\\rc: boom\\x07\\x9b31m\\tend\n"
        ));
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'));
        assert!(matches!(escape("plain é ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn saves_and_loads() {
        let d = tempfile::tempdir().unwrap();
        let r = report(vec![]);
        r.save(d.path()).unwrap();
        assert_eq!(Report::load(d.path()).unwrap(), r);
    }
}
