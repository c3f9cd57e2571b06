//! Rollouts: what every replica computes alike and what a node tells the
//! masters (docs/protocol.md §7.8).
//!
//! **Placement.** A node's position in an environment's fleet is
//! [`position`]: the first eight bytes of the sha256 of
//! `pluginsync-placement`, the environment and the certname (NUL between),
//! read as a fraction of 2⁶⁴. It is uniform over certnames, stable, and the
//! same on every replica without talking; a wave that opens `percent` of
//! the fleet includes exactly the nodes whose position is below
//! `percent / 100` ([`in_share`]).
//!
//! **The node report** ([`NodeReport`]) rides on the request a node makes
//! every run anyway (the per-node answer, §7.6) as the header
//! [`HEADER_REPORT`]: compact JSON, percent-encoded to visible ASCII,
//! at most [`MAX_REPORT_BYTES`] once encoded. It says which generation the
//! node has committed for the environment and what its loads did; a
//! master that cannot read it ignores it (it never fails the request).
//! Right after a run's commit and loads the agent also sends it on its
//! own, the header's value as the body of a `POST` to
//! `protocol::REPORT_PATH`, so
//! the masters see the run now rather than on the next one. A `--noop`
//! run's per-node request carries [`HEADER_NOOP`]: the master records
//! nothing of it.

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::digest::Sha256;
use crate::generation::GenerationId;

/// The request header carrying a [`NodeReport`].
pub const HEADER_REPORT: &str = "x-pluginsync-report";
/// The request header of a `--noop` run's per-node request (value `1`):
/// its report and what it is served are not recorded.
pub const HEADER_NOOP: &str = "x-pluginsync-noop";
/// The longest encoded report a node sends and a master reads (bytes).
pub const MAX_REPORT_BYTES: usize = 4096;
/// Failing plugins named in one report at most; beyond, only counted.
pub const MAX_FAILED_NAMED: usize = 16;
/// The longest failing plugin's name kept, in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// The most loads a report counts, ok or failed: a node's two mounts hold
/// at most 250,000 listing entries each (the agent's listing cap).
pub const MAX_LOADS: u32 = 500_000;

/// Bytes escaped in the header value: controls, space, `%`, and
/// everything outside ASCII (by `utf8_percent_encode` itself).
const REPORT_ESCAPE: &AsciiSet = &CONTROLS.add(b' ').add(b'%');

/// The node's position in `environment`'s fleet, in `[0, 1)`.
pub fn position(environment: &str, certname: &str) -> f64 {
    let mut input = Vec::with_capacity(32 + environment.len() + certname.len());
    input.extend_from_slice(b"pluginsync-placement\0");
    input.extend_from_slice(environment.as_bytes());
    input.push(0);
    input.extend_from_slice(certname.as_bytes());
    let d = Sha256::of(&input);
    let mut first = [0u8; 8];
    first.copy_from_slice(&d.0[..8]);
    // 53 bits of mantissa: the top 53 bits of the 64, exactly representable.
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether a node at `position` is inside a wave that opens `percent`
/// (0–100) of the fleet.
pub fn in_share(position: f64, percent: f64) -> bool {
    percent >= 100.0 || position < percent / 100.0
}

/// What a node tells the masters each run (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The generation committed for the environment, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationId>,
    /// Loads that succeeded in the last run that loaded anything.
    #[serde(default)]
    pub loads_ok: u32,
    /// Loads that failed, still failing (a failure stays reported until
    /// that plugin loads or leaves the tree).
    #[serde(default)]
    pub loads_failed: u32,
    /// The failing plugins' names (at most [`MAX_FAILED_NAMED`], each at
    /// most [`MAX_NAME_CHARS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

/// A report header refused: the master ignores it (and samples a log line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// Longer than [`MAX_REPORT_BYTES`].
    #[error("node report of {0} bytes (at most {MAX_REPORT_BYTES})")]
    TooLong(usize),
    /// Not percent-encoded UTF-8 JSON of a report.
    #[error("malformed node report: {0}")]
    Malformed(String),
    /// Names more failing plugins, or longer names, than allowed.
    #[error("node report out of bounds: {0}")]
    Bounds(String),
}

impl NodeReport {
    /// Trims the report to its bounds: names beyond [`MAX_FAILED_NAMED`]
    /// dropped (still counted), each name cut to [`MAX_NAME_CHARS`].
    pub fn bounded(mut self) -> NodeReport {
        self.failed.truncate(MAX_FAILED_NAMED);
        for name in &mut self.failed {
            if name.chars().count() > MAX_NAME_CHARS {
                *name = name.chars().take(MAX_NAME_CHARS).collect();
            }
        }
        self
    }

    /// The header value (bounded first; always within
    /// [`MAX_REPORT_BYTES`]: names are dropped until it fits).
    pub fn to_header(&self) -> String {
        let mut report = self.clone().bounded();
        loop {
            let json = serde_json::to_string(&report).unwrap_or_default();
            let value = utf8_percent_encode(&json, REPORT_ESCAPE).to_string();
            if value.len() <= MAX_REPORT_BYTES || report.failed.is_empty() {
                return value;
            }
            report.failed.pop();
        }
    }

    /// Reads a header value; refuses what a well-behaved agent never sends.
    pub fn from_header(value: &str) -> Result<NodeReport, ReportError> {
        if value.len() > MAX_REPORT_BYTES {
            return Err(ReportError::TooLong(value.len()));
        }
        let json = percent_decode_str(value)
            .decode_utf8()
            .map_err(|e| ReportError::Malformed(e.to_string()))?;
        let report: NodeReport =
            serde_json::from_str(&json).map_err(|e| ReportError::Malformed(e.to_string()))?;
        if report.failed.len() > MAX_FAILED_NAMED {
            return Err(ReportError::Bounds(format!(
                "{} failing plugins named (at most {MAX_FAILED_NAMED})",
                report.failed.len()
            )));
        }
        // The counts are bounded by the names: an agent names every failing
        // plugin it counts, up to MAX_FAILED_NAMED, and keeps at least one
        // name whatever the header's size; no node loads more plugins than
        // its two mounts' listings hold.
        let (named, counted) = (report.failed.len(), report.loads_failed as usize);
        if counted < named || (counted > 0 && named == 0) {
            return Err(ReportError::Bounds(format!(
                "{counted} failing loads counted, {named} named"
            )));
        }
        if report.loads_ok.max(report.loads_failed) > MAX_LOADS {
            return Err(ReportError::Bounds(format!(
                "more than {MAX_LOADS} loads counted"
            )));
        }
        if report
            .failed
            .iter()
            .any(|n| n.chars().count() > MAX_NAME_CHARS)
        {
            return Err(ReportError::Bounds(format!(
                "a failing plugin's name over {MAX_NAME_CHARS} characters"
            )));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_stable_uniform_and_per_environment() {
        let p = position("production", "node1.example.com");
        assert_eq!(p, position("production", "node1.example.com"));
        assert_ne!(p, position("staging", "node1.example.com"));
        let n = 20_000;
        let inside = (0..n)
            .filter(|i| in_share(position("production", &format!("n{i}.example")), 5.0))
            .count();
        // Binomial(20000, 0.05): mean 1000, sd ≈ 30.8; ±5 sd.
        assert!(
            (846..=1154).contains(&inside),
            "{inside} of {n} in a 5 % wave"
        );
        assert!((0..n).all(|i| in_share(position("e", &format!("{i}")), 100.0)));
        assert!((0..n).all(|i| !in_share(position("e", &format!("{i}")), 0.0)));
    }

    #[test]
    fn reports_round_trip_bounded_and_refuse_hostile_values() {
        let r = NodeReport {
            generation: Some(GenerationId(Sha256::of(b"g"))),
            loads_ok: 3,
            loads_failed: 40,
            failed: (0..40).map(|i| format!("facter/fäct {i}\n.rb")).collect(),
        };
        let header = r.to_header();
        assert!(header.len() <= MAX_REPORT_BYTES);
        assert!(header.bytes().all(|b| b.is_ascii_graphic()), "{header}");
        let back = NodeReport::from_header(&header).unwrap();
        assert_eq!(back.loads_failed, 40);
        assert_eq!(back.failed.len(), MAX_FAILED_NAMED);
        assert_eq!(back.failed[0], "facter/fäct 0\n.rb");
        let long = NodeReport {
            loads_failed: 1,
            failed: vec!["x".repeat(5000)],
            ..NodeReport::default()
        };
        let back = NodeReport::from_header(&long.to_header()).unwrap();
        assert_eq!(back.failed[0].len(), MAX_NAME_CHARS);
        assert!(matches!(
            NodeReport::from_header(&"a".repeat(MAX_REPORT_BYTES + 1)),
            Err(ReportError::TooLong(_))
        ));
        assert!(matches!(
            NodeReport::from_header("%7B%22loads_ok%22:-1%7D"),
            Err(ReportError::Malformed(_))
        ));
        let many = format!(
            "{{\"failed\":[{}]}}",
            vec!["\"a\""; MAX_FAILED_NAMED + 1].join(",")
        );
        assert!(matches!(
            NodeReport::from_header(&many),
            Err(ReportError::Bounds(_))
        ));
        // Counts bounded by the names carried, and by what a node holds.
        for hostile in [
            r#"{"loads_failed":4294967295}"#,
            r#"{"loads_failed":0,"failed":["a"]}"#,
            r#"{"loads_failed":4294967295,"failed":["a"]}"#,
            r#"{"loads_ok":4294967295}"#,
        ] {
            assert!(
                matches!(
                    NodeReport::from_header(hostile),
                    Err(ReportError::Bounds(_))
                ),
                "{hostile}"
            );
        }
        let fine = r#"{"loads_ok":2,"loads_failed":30,"failed":["a"]}"#;
        assert_eq!(NodeReport::from_header(fine).unwrap().loads_failed, 30);
    }
}
