//! The nodes as a replica keeps them in memory ([`Nodes`]: by name, by
//! age, tallied per environment and generation) and as the state store
//! keeps them ([`NodeRow`]): what the fleet answers from, and what it
//! reads back at start.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, UNIX_EPOCH};

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{MAX_FAILED_NAMED, MAX_NAME_CHARS};

use super::{NodeEntry, Source};
use crate::statestore::NodeRow;

/// A node as kept.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) env: EnvName,
    pub(super) generation: Option<GenerationId>,
    /// Unix milliseconds.
    pub(super) seen_ms: u64,
    pub(super) source: Source,
    pub(super) loads_ok: u32,
    pub(super) loads_failed: u32,
    pub(super) failed: Vec<String>,
}

impl Node {
    pub(super) fn entry(&self, certname: &str) -> NodeEntry {
        let when = UNIX_EPOCH + Duration::from_millis(self.seen_ms);
        NodeEntry {
            certname: certname.to_owned(),
            environment: self.env.to_string(),
            generation: self.generation,
            last_seen: humantime::format_rfc3339_millis(when).to_string(),
            source: self.source,
            loads_ok: self.loads_ok,
            load_failures: self.loads_failed,
            failed_plugins: self.failed.clone(),
        }
    }

    /// A peer's entry, checked as strictly as a node's own report; its
    /// time is never later than `now_ms` (a peer's clock ahead of ours
    /// must not pin a record).
    pub(super) fn of_entry(e: &NodeEntry, now_ms: u64) -> Option<Node> {
        // A certname as the gate admits one (printable ASCII, no `/`).
        let valid_name = !e.certname.is_empty()
            && e.certname.len() <= 255
            && (e.certname.bytes()).all(|b| matches!(b, b' '..=b'.' | b'0'..=b'~'));
        let bounded = e.failed_plugins.len() <= MAX_FAILED_NAMED
            && e.failed_plugins
                .iter()
                .all(|n| n.chars().count() <= MAX_NAME_CHARS);
        let seen = humantime::parse_rfc3339(&e.last_seen).ok()?;
        let seen_ms = seen.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        (valid_name && bounded).then_some(())?;
        Some(Node {
            env: e.environment.parse().ok()?,
            generation: e.generation,
            seen_ms: seen_ms.min(now_ms),
            source: e.source,
            loads_ok: e.loads_ok,
            loads_failed: e.load_failures,
            failed: e.failed_plugins.clone(),
        })
    }
}

/// Nodes, with their age order and the tally per environment and
/// generation kept in step.
#[derive(Debug, Default)]
pub(super) struct Nodes {
    pub(super) by_name: HashMap<String, Node>,
    pub(super) by_age: BTreeSet<(u64, String)>,
    /// `(nodes, failing nodes)` per environment and generation.
    pub(super) tally: HashMap<(EnvName, Option<GenerationId>), (u64, u64)>,
}

impl Nodes {
    fn count(&mut self, node: &Node, add: bool) {
        let key = (node.env.clone(), node.generation);
        let t = self.tally.entry(key.clone()).or_default();
        let failing = u64::from(node.loads_failed > 0);
        if add {
            t.0 += 1;
            t.1 += failing;
        } else {
            t.0 = t.0.saturating_sub(1);
            t.1 = t.1.saturating_sub(failing);
            if t.0 == 0 {
                self.tally.remove(&key);
            }
        }
    }

    pub(super) fn remove(&mut self, certname: &str) {
        if let Some(old) = self.by_name.remove(certname) {
            self.by_age.remove(&(old.seen_ms, certname.to_owned()));
            self.count(&old, false);
        }
    }

    /// Keeps `node` unless a later record of `certname` is kept; then
    /// forgets the least recently seen beyond `max`.
    pub(super) fn upsert(&mut self, certname: &str, node: Node, max: usize) -> bool {
        if self
            .by_name
            .get(certname)
            .is_some_and(|old| old.seen_ms > node.seen_ms)
        {
            return false;
        }
        self.remove(certname);
        self.by_age.insert((node.seen_ms, certname.to_owned()));
        self.count(&node, true);
        self.by_name.insert(certname.to_owned(), node);
        while self.by_name.len() > max {
            let Some((_, oldest)) = self.by_age.first().cloned() else {
                break;
            };
            self.remove(&oldest);
        }
        true
    }
}

impl Node {
    /// `certname`'s record as the state store's row.
    pub(super) fn row(&self, certname: &str) -> NodeRow {
        NodeRow {
            certname: certname.to_owned(),
            environment: self.env.to_string(),
            generation: self.generation,
            last_seen_ms: self.seen_ms,
            source: match self.source {
                Source::Report => "report",
                Source::Served => "served",
            }
            .to_owned(),
            loads_ok: self.loads_ok,
            loads_failed: self.loads_failed,
            failed: self.failed.clone(),
        }
    }

    /// A stored row, checked as a peer's entry is ([`Node::of_entry`]).
    pub(super) fn of_row(r: &NodeRow, now_ms: u64) -> Option<Node> {
        let source = match r.source.as_str() {
            "report" => Source::Report,
            "served" => Source::Served,
            _ => return None,
        };
        let when = UNIX_EPOCH + Duration::from_millis(r.last_seen_ms);
        let entry = NodeEntry {
            certname: r.certname.clone(),
            environment: r.environment.clone(),
            generation: r.generation,
            last_seen: humantime::format_rfc3339_millis(when).to_string(),
            source,
            loads_ok: r.loads_ok,
            load_failures: r.loads_failed,
            failed_plugins: r.failed.clone(),
        };
        Node::of_entry(&entry, now_ms)
    }
}
