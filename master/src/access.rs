//! The access log (`[log] access = "off" | "text" | "json"`,
//! docs/operating.md#logs): one line per answered request, written to stderr
//! when its response body ends (or the client goes away), with the time,
//! the peer, the certname, the environment, the endpoint, the status, the
//! body bytes sent and the duration.
//!
//! The lines are written by this module, not through `tracing`, so their
//! format does not depend on `-v` or `RUST_LOG`; under the journal they
//! carry the info priority like every other line (`common::logging`).
//! Nothing in a line comes raw from the client: the path is the request
//! target as received (ASCII, percent-encoded by HTTP), the environment is
//! kept only when it is a valid environment name, and certnames are valid
//! Puppet certnames (docs/protocol.md §5.2).

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use serde::{Deserialize, Serialize};

/// `[log] access`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessFormat {
    /// No access log (the default).
    #[default]
    Off,
    /// `<time> <peer> <certname> <environment> <endpoint> <status> <bytes> <seconds> <method> <target>`,
    /// `-` for what is unknown.
    Text,
    /// One JSON object per line, the same fields by name, the time also
    /// as `timestamp` like the JSON log lines (`--log-format json`).
    Json,
}

/// An access log line in JSON: the record with its time under
/// `timestamp` too, the field name of the JSON log lines, so one parser
/// reads both; `time` stays for the parsers written before
/// (docs/operating.md#logs).
#[derive(Serialize)]
struct JsonLine<'a> {
    timestamp: &'a str,
    #[serde(flatten)]
    record: &'a Record,
}

/// One answered request.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// When the request arrived (RFC 3339, UTC).
    pub time: String,
    /// The client's address.
    pub peer: Option<SocketAddr>,
    /// The client certificate's certname.
    pub certname: Option<String>,
    /// The `environment` query parameter, when it is a valid name.
    pub environment: Option<EnvName>,
    /// The endpoint (`routes::endpoint_of`).
    pub endpoint: &'static str,
    /// The method.
    pub method: String,
    /// The request target (path and query, as received).
    pub target: String,
    /// The response status.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// From arrival to the end of the body (or the client going away).
    pub seconds: f64,
}

impl Record {
    /// The line for `format` (without the newline); `None` when off.
    pub fn line(&self, format: AccessFormat) -> Option<String> {
        let or_dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
        match format {
            AccessFormat::Off => None,
            AccessFormat::Json => serde_json::to_string(&JsonLine {
                timestamp: &self.time,
                record: self,
            })
            .ok(),
            AccessFormat::Text => Some(format!(
                "{} {} {} {} {} {} {} {:.6} {} {}",
                self.time,
                or_dash(self.peer.map(|p| p.to_string()).as_deref()),
                or_dash(self.certname.as_deref()),
                or_dash(self.environment.as_ref().map(EnvName::as_str)),
                self.endpoint,
                self.status,
                self.bytes,
                self.seconds,
                self.method,
                self.target,
            )),
        }
    }

    /// Writes the line to stderr (dropped if stderr is gone).
    pub fn write(&self, format: AccessFormat) {
        if let Some(line) = self.line(format) {
            let prefix = pluginsync_common::logging::stderr_prefix(6);
            let _unread = writeln!(std::io::stderr().lock(), "{prefix}{line}");
        }
    }
}

/// Now, as the access log writes it.
pub fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// `d` in seconds.
pub fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            time: "2026-11-24T00:00:00Z".into(),
            peer: Some("127.0.0.1:40000".parse().unwrap()),
            certname: Some("node1".into()),
            environment: Some("production".parse().unwrap()),
            endpoint: "file_metadatas",
            method: "GET".into(),
            target: "/puppet/v3/file_metadatas/plugins?environment=production".into(),
            status: 200,
            bytes: 1234,
            seconds: 0.0025,
        }
    }

    #[test]
    fn text_and_json_lines_carry_every_field() {
        let r = record();
        assert_eq!(r.line(AccessFormat::Off), None);
        assert_eq!(
            r.line(AccessFormat::Text).unwrap(),
            "2026-11-24T00:00:00Z 127.0.0.1:40000 node1 production file_metadatas 200 1234 0.002500 GET /puppet/v3/file_metadatas/plugins?environment=production"
        );
        let json: serde_json::Value =
            serde_json::from_str(&r.line(AccessFormat::Json).unwrap()).unwrap();
        assert_eq!(json["certname"], "node1");
        assert_eq!(json["status"], 200);
        assert_eq!(json["peer"], "127.0.0.1:40000");
        assert_eq!(json["timestamp"], "2026-11-24T00:00:00Z");
        assert_eq!(json["time"], json["timestamp"]);
        let anon = Record {
            certname: None,
            environment: None,
            ..record()
        };
        assert!(
            anon.line(AccessFormat::Text)
                .unwrap()
                .contains("127.0.0.1:40000 - - file_metadatas")
        );
    }
}
