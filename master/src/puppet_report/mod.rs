//! Puppet's run reports, as Puppet Server's `http` report processor posts
//! them (docs/puppet-fleet.md#stock-agents-reports): the YAML dump of a
//! `Puppet::Transaction::Report`, Ruby tags and all
//! (`!ruby/object:Puppet::Transaction::Report`, `!ruby/sym err` in older
//! Puppets). Read as a stream of events ([`saphyr_parser`]), never built
//! into a tree: only `host`, `environment`, `time`, `status`,
//! `transaction_uuid` and each log's `level`, `message` and `source` are
//! kept, everything else is walked past (docs/internals.md#puppet-run-reports).
//!
//! Bounded whatever the body says: nesting deeper than [`MAX_DEPTH`] is
//! refused as soon as it is seen (so the parser's own stack stays small),
//! an alias is never expanded (one to a kept scalar is read from at most
//! [`MAX_ANCHORS`] remembered ones; one to a collection stands for
//! nothing), at most [`MAX_LOGS`] logs of at most [`MAX_MESSAGE`]
//! characters are kept, and the walk gives up after [`MAX_EVENTS`] events
//! or [`MAX_PARSE_TIME`]. The body's size is bounded before it gets here
//! (`[reports] max_body_mib`, [`ReportsConfig`]).

pub mod plugins;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pluginsync_common::config::ConfigError;
use saphyr_parser::{Event, Parser, StrInput};
use serde::Deserialize;

/// Deepest nesting of collections accepted (a report is 5 deep).
pub const MAX_DEPTH: usize = 64;
/// Logs kept per report; later ones are not read.
pub const MAX_LOGS: usize = 10_000;
/// Characters of a log's message (and source) kept: enough for the paths
/// a Facter or autoload error names first.
pub const MAX_MESSAGE: usize = 2048;
/// Anchored scalars remembered, so that an alias to one reads it.
pub const MAX_ANCHORS: usize = 1024;
/// Events walked at most (a 16 MiB report of short logs has ~3 million).
pub const MAX_EVENTS: u64 = 20_000_000;
/// Wall-clock time a walk may take.
pub const MAX_PARSE_TIME: Duration = Duration::from_secs(10);

/// `[reports]`: Puppet Server's `http` report processor posting stock
/// agents' run reports (docs/operating.md#stock-agents-reports).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportsConfig {
    /// Certnames allowed to post reports for other nodes (Puppet Server's
    /// own certificate); empty (the default): every post is refused, 403.
    pub puppetserver_certnames: Vec<String>,
    /// The largest report body accepted, in MiB (413 beyond).
    pub max_body_mib: u64,
}

impl Default for ReportsConfig {
    fn default() -> Self {
        ReportsConfig {
            puppetserver_certnames: Vec::new(),
            max_body_mib: 16,
        }
    }
}

impl ReportsConfig {
    /// Checks `[reports]` (`MasterConfig::validate`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(bad) =
            (self.puppetserver_certnames.iter()).find(|c| !crate::auth::is_valid_certname(c))
        {
            return Err(ConfigError::Invalid(format!(
                "reports.puppetserver_certnames: '{bad}' is not a certname"
            )));
        }
        if !(1..=1024).contains(&self.max_body_mib) {
            return Err(ConfigError::Invalid(
                "reports.max_body_mib must be between 1 and 1024".into(),
            ));
        }
        Ok(())
    }

    /// [`Self::max_body_mib`] in bytes.
    pub fn max_body(&self) -> usize {
        (self.max_body_mib as usize) << 20
    }
}

/// One log line of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLine {
    /// `debug` … `emerg` (a `!ruby/sym` tag dropped).
    pub level: String,
    /// Its text, at most [`MAX_MESSAGE`] characters.
    pub message: String,
    /// What logged it (`Puppet`, `Facter`, a resource).
    pub source: String,
}

impl LogLine {
    /// Whether Puppet logged it at `err` or above.
    pub fn is_error(&self) -> bool {
        matches!(self.level.as_str(), "err" | "crit" | "alert" | "emerg")
    }
}

/// What is kept of a run report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// The node's certname.
    pub host: String,
    /// The environment it ran in.
    pub environment: String,
    /// When the run started (as written).
    pub time: String,
    /// `changed`, `unchanged` or `failed`.
    pub status: String,
    /// The run's id.
    pub transaction_uuid: String,
    /// Its logs, in order, at most [`MAX_LOGS`].
    pub logs: Vec<LogLine>,
}

/// Why a body is not a report we read: one line, never quoting the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// Not YAML (with where).
    #[error("not YAML: {0}")]
    Yaml(String),
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// Beyond [`MAX_EVENTS`] or [`MAX_PARSE_TIME`].
    #[error("too large to read ({0})")]
    TooLarge(&'static str),
    /// A document that is not a report's mapping, or without a `host`
    /// (or one that is not a certname), or a body that is not UTF-8.
    #[error("not a Puppet run report: {0}")]
    NotAReport(&'static str),
}

/// The walk over the parser's events, with its bounds.
struct Walk<'a> {
    parser: Parser<'a, StrInput<'a>>,
    events: u64,
    started: Instant,
    anchors: HashMap<usize, String>,
}

/// A node's value as far as the report is concerned.
enum Value {
    Scalar(String),
    Map,
    Seq,
}

impl<'a> Walk<'a> {
    fn next(&mut self) -> Result<Event<'a>, ReportError> {
        self.events += 1;
        if self.events > MAX_EVENTS {
            return Err(ReportError::TooLarge("too many YAML events"));
        }
        if self.events.is_multiple_of(4096) && self.started.elapsed() > MAX_PARSE_TIME {
            return Err(ReportError::TooLarge("parse time exceeded"));
        }
        match self.parser.next_event() {
            Some(Ok((event, _))) => Ok(event),
            // The scanner's own bound on flow nesting (`[[[…`).
            Some(Err(e)) if e.info().contains("recursion limit") => Err(ReportError::TooDeep),
            Some(Err(e)) => Err(ReportError::Yaml(format!(
                "line {}, column {}: {}",
                e.marker().line(),
                e.marker().col(),
                e.info()
            ))),
            None => Err(ReportError::Yaml("unexpected end".into())),
        }
    }

    /// The next node's start: a scalar read (bounded), or a collection
    /// entered. `None`: the end of the enclosing collection.
    fn node(&mut self) -> Result<Option<Value>, ReportError> {
        Ok(Some(match self.next()? {
            Event::Scalar(text, _, anchor, _) => {
                let text: String = text.chars().take(MAX_MESSAGE).collect();
                if anchor != 0 && self.anchors.len() < MAX_ANCHORS {
                    self.anchors.insert(anchor, text.clone());
                }
                Value::Scalar(text)
            }
            Event::Alias(id) => Value::Scalar(self.anchors.get(&id).cloned().unwrap_or_default()),
            Event::MappingStart(..) => Value::Map,
            Event::SequenceStart(..) => Value::Seq,
            Event::MappingEnd | Event::SequenceEnd => return Ok(None),
            _ => return Err(ReportError::Yaml("unexpected event".into())),
        }))
    }

    /// Walks past the rest of a collection entered at `depth`.
    fn skip(&mut self, depth: usize) -> Result<(), ReportError> {
        let mut open = 1usize;
        while open > 0 {
            match self.next()? {
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    open += 1;
                    if depth + open > MAX_DEPTH {
                        return Err(ReportError::TooDeep);
                    }
                }
                Event::MappingEnd | Event::SequenceEnd => open -= 1,
                Event::StreamEnd | Event::DocumentEnd => {
                    return Err(ReportError::Yaml("unexpected end".into()));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Walks past `value` (a scalar is already read).
    fn past(&mut self, value: &Value, depth: usize) -> Result<(), ReportError> {
        match value {
            Value::Scalar(_) => Ok(()),
            Value::Map | Value::Seq => self.skip(depth + 1),
        }
    }

    /// The entries of a mapping entered at `depth`: `each(walk, key,
    /// value)` for every scalar key (it must walk past a collection value).
    fn entries(
        &mut self,
        depth: usize,
        mut each: impl FnMut(&mut Self, &str, Value) -> Result<(), ReportError>,
    ) -> Result<(), ReportError> {
        if depth > MAX_DEPTH {
            return Err(ReportError::TooDeep);
        }
        while let Some(key) = self.node()? {
            let Value::Scalar(key) = key else {
                // A complex key: walked past with its value.
                self.past(&key, depth)?;
                let value = self.node()?.ok_or(ReportError::Yaml("no value".into()))?;
                self.past(&value, depth)?;
                continue;
            };
            let value = self.node()?.ok_or(ReportError::Yaml("no value".into()))?;
            each(self, &key, value)?;
        }
        Ok(())
    }

    /// The `logs` sequence entered at depth 2.
    fn logs(&mut self, out: &mut Vec<LogLine>) -> Result<(), ReportError> {
        while let Some(item) = self.node()? {
            if !matches!(item, Value::Map) || out.len() >= MAX_LOGS {
                self.past(&item, 2)?;
                continue;
            }
            let mut line = LogLine::default();
            self.entries(3, |w, key, value| {
                let slot = match key {
                    "level" => &mut line.level,
                    "message" => &mut line.message,
                    "source" => &mut line.source,
                    _ => return w.past(&value, 3),
                };
                match value {
                    Value::Scalar(s) => *slot = s,
                    other => w.past(&other, 3)?,
                }
                Ok(())
            })?;
            out.push(line);
        }
        Ok(())
    }
}

/// Reads a run report from `body` (the module docs' bounds).
pub fn parse(body: &str) -> Result<RunReport, ReportError> {
    let mut walk = Walk {
        parser: Parser::new_from_str(body),
        events: 0,
        started: Instant::now(),
        anchors: HashMap::new(),
    };
    // The stream, then the first document (any later one is not read).
    let mut top = None;
    while top.is_none() {
        match walk.next()? {
            Event::StreamStart | Event::DocumentStart(_) | Event::Nothing => {}
            Event::MappingStart(..) => top = Some(()),
            _ => return Err(ReportError::NotAReport("its document is not a mapping")),
        }
    }
    let mut report = RunReport::default();
    walk.entries(1, |w, key, value| {
        let slot = match key {
            "host" => &mut report.host,
            "environment" => &mut report.environment,
            "time" => &mut report.time,
            "status" => &mut report.status,
            "transaction_uuid" => &mut report.transaction_uuid,
            "logs" if matches!(value, Value::Seq) => return w.logs(&mut report.logs),
            _ => return w.past(&value, 1),
        };
        match value {
            Value::Scalar(s) => *slot = s,
            other => w.past(&other, 1)?,
        }
        Ok(())
    })?;
    if report.host.is_empty() {
        return Err(ReportError::NotAReport("it has no host"));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    // The parser on a report captured from Debian's Puppet 7 (Puppet Server's
    // stored copy of what its `http` processor posts, from the e2e test
    // `puppet_reports`), on Ruby-tagged logs, and on bombs; the matching of
    // log lines to a generation's plugins.

    use std::time::{Duration, Instant};

    use pluginsync_common::digest::Sha256;
    use pluginsync_common::generation::{EntryKind, Manifest, ManifestEntry};
    use pluginsync_common::protocol::Mount;
    use pluginsync_common::relpath::RelPath;

    use super::plugins::{Reason, failing};
    use super::*;

    /// A report of node `stock1` whose pluginsync took a generation with a
    /// fact that does not load (`broken.rb`), one raising in `setcode`
    /// (`raises.rb`), one raising in a file not named after it
    /// (`misnamed.rb`) and a facts.d script writing to stderr and exiting 3.
    const CAPTURED: &str = include_str!("../../tests/fixtures/puppet-run-report.yaml");

    fn manifest(files: &[(Mount, &str)]) -> Manifest {
        let mut entries: Vec<ManifestEntry> = Mount::ALL
            .iter()
            .map(|&mount| ManifestEntry {
                mount,
                path: RelPath::root(),
                mode: 0o755,
                kind: EntryKind::Directory,
            })
            .collect();
        for &(mount, path) in files {
            let mut dirs: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
            dirs.retain(|d| {
                !entries
                    .iter()
                    .any(|e| e.mount == mount && e.path.as_str() == *d)
            });
            for d in dirs {
                entries.push(ManifestEntry {
                    mount,
                    path: RelPath::parse(d).unwrap(),
                    mode: 0o755,
                    kind: EntryKind::Directory,
                });
            }
            entries.push(ManifestEntry {
                mount,
                path: RelPath::parse(path).unwrap(),
                mode: 0o644,
                kind: EntryKind::File {
                    sha256: Sha256::of(path.as_bytes()),
                    size: 1,
                },
            });
        }
        Manifest::new(entries).unwrap()
    }

    /// The generation the captured node was served.
    fn served() -> Manifest {
        manifest(&[
            (Mount::Plugins, "facter/good.rb"),
            (Mount::Plugins, "facter/broken.rb"),
            (Mount::Plugins, "facter/raises.rb"),
            (Mount::Plugins, "facter/misnamed.rb"),
            (Mount::Pluginfacts, "good.txt"),
            (Mount::Pluginfacts, "bad.sh"),
        ])
    }

    #[test]
    fn a_captured_report_reads_and_blames_the_plugins_of_its_generation() {
        let r = parse(CAPTURED).unwrap();
        assert_eq!(r.host, "stock1");
        assert_eq!(r.environment, "production");
        assert!(!r.transaction_uuid.is_empty() && !r.time.is_empty());
        assert!(["changed", "unchanged", "failed"].contains(&r.status.as_str()));
        assert!(r.logs.iter().any(|l| l.is_error()), "{r:?}");
        let names: Vec<(String, Reason)> = failing(&r.logs, &served());
        let mut only: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        only.sort();
        assert_eq!(
            only,
            [
                "pluginfacts/bad.sh",
                "plugins/facter/broken.rb",
                "plugins/facter/raises.rb"
            ]
        );
        assert!(names.contains(&("plugins/facter/raises.rb".into(), Reason::Resolve)));
        assert!(names.contains(&("plugins/facter/broken.rb".into(), Reason::Error)));
        assert!(names.contains(&("pluginfacts/bad.sh".into(), Reason::Stderr)));
        // A generation without those files: the same errors blame nothing.
        let other = manifest(&[(Mount::Plugins, "facter/good.rb")]);
        assert_eq!(failing(&r.logs, &other), Vec::new());
    }

    #[test]
    fn ruby_tags_anchors_and_other_documents_are_read_as_plain_values() {
        let yaml = "--- !ruby/object:Puppet::Transaction::Report\n\
            metrics: {a: [1, 2, {b: c}]}\n\
            host: &h node1\n\
            ? [complex, key]\n\
            : ignored\n\
            logs:\n\
            - !ruby/object:Puppet::Util::Log\n  \
              level: !ruby/sym err\n  \
              message: 'Could not autoload puppet/type/foo: no such file'\n  \
              source: *h\n\
            - !ruby/object:Puppet::Util::Log\n  \
              level: !ruby/sym err\n  \
              message: 'Could not autoload puppet/type/elsewhere: x'\n\
            - level: warning\n  \
              message: Error loading fact /var/cache/puppet/lib/facter/w.rb\n\
            - level: err\n  \
              message: Error loading fact /usr/lib/ruby/vendor_ruby/facter/x.rb\n\
            - *h\n\
            environment: production\n\
            --- {host: other}\n";
        let r = parse(yaml).unwrap();
        assert_eq!(r.host, "node1");
        assert_eq!(r.environment, "production");
        assert_eq!(r.logs.len(), 4, "{r:?}");
        assert_eq!(r.logs[0].level, "err");
        assert_eq!(r.logs[0].source, "node1");
        let m = manifest(&[
            (Mount::Plugins, "puppet/type/foo.rb"),
            (Mount::Plugins, "facter/w.rb"),
            (Mount::Plugins, "facter/x.rb"),
        ]);
        // Only the err-level line naming a file of the generation counts: not
        // the warning, not a path outside a libdir, not another type.
        let blamed = failing(&r.logs, &m);
        assert_eq!(
            blamed,
            vec![("plugins/puppet/type/foo.rb".to_owned(), Reason::Autoload)]
        );
    }

    #[test]
    fn a_body_that_is_not_a_report_is_refused_in_one_line() {
        for (body, want) in [
            ("- a\n- b\n", "not a Puppet run report"),
            ("{logs: []}", "no host"),
            ("host: [unclosed", "not YAML"),
            ("", "not a Puppet run report"),
        ] {
            let e = parse(body).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{body:?}: {e}");
        }
        let e = parse("host: x\nmessage: \"secret-9 unterminated\n").unwrap_err();
        assert!(!e.to_string().contains("secret-9"), "{e}");
    }

    /// Bombs are refused (nesting) or cost nothing (aliases never expanded),
    /// quickly: the walk stops at the first level past [`MAX_DEPTH`], so
    /// neither it nor the parser under it holds more than that many levels.
    #[test]
    fn yaml_bombs_are_refused_or_harmless_in_bounded_time() {
        let started = Instant::now();
        let deep_flow = format!("host: x\nlogs: {}", "[".repeat(8 << 20));
        assert_eq!(parse(&deep_flow), Err(ReportError::TooDeep));
        let deep_block: String = (0..200)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert_eq!(parse(&deep_block), Err(ReportError::TooDeep));
        let deep_logs = format!("host: x\nlogs:\n- message: {}", "[".repeat(100));
        assert_eq!(parse(&deep_logs), Err(ReportError::TooDeep));
        // Billion laughs: each level nine aliases of the last.
        let mut lol = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 9].join(", ");
            lol.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        lol.push_str("host: x\nlogs: [*a9, *a9, *a9]\n");
        let r = parse(&lol).unwrap();
        assert!(r.logs.is_empty(), "{r:?}");
        // Many logs: at most MAX_LOGS kept, each message bounded.
        let mut many = String::from("host: x\nlogs:\n");
        for _ in 0..MAX_LOGS + 10 {
            many.push_str("- {level: err, message: m}\n");
        }
        assert_eq!(parse(&many).unwrap().logs.len(), MAX_LOGS);
        let long = format!(
            "host: x\nlogs:\n- {{level: err, message: {}}}\n",
            "m".repeat(MAX_MESSAGE * 4)
        );
        let r = parse(&long).unwrap();
        assert_eq!(r.logs[0].message.chars().count(), MAX_MESSAGE);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn reports_config_defaults_to_nobody_and_checks_its_keys() {
        let d = ReportsConfig::default();
        assert!(d.puppetserver_certnames.is_empty());
        assert_eq!(d.max_body(), 16 << 20);
        d.validate().unwrap();
        let bad = ReportsConfig {
            puppetserver_certnames: vec!["a/b".into()],
            ..ReportsConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("a/b"));
        let zero = ReportsConfig {
            max_body_mib: 0,
            ..ReportsConfig::default()
        };
        assert!(zero.validate().is_err());
    }
}
