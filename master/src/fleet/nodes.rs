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
use crate::statestore::{NodeRow, ServedRow};

/// Generations remembered as served per node (its environment's newest).
pub(super) const MAX_SERVED: usize = 8;

/// How stale a stored `last_seen` may be: a record that differs from the
/// node's last written one only in its time is written at most this often
/// (docs/operating.md#the-fleet).
pub(super) const LAST_SEEN_EVERY: Duration = Duration::from_secs(60);

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
    /// The generations a replica served it in `env` (oldest first, at
    /// most [`MAX_SERVED`]).
    pub(super) served: Vec<GenerationId>,
    /// Whether `generation` is one a replica served it: only then does
    /// the health gate count it (docs/rollouts.md#the-health-gate).
    pub(super) verified: bool,
    /// The `seen_ms` of the last record of this node handed to the state
    /// store: a record is handed to it when the two are equal
    /// ([`Node::due`]).
    pub(super) written_ms: u64,
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
            verified: self.verified,
        }
    }

    /// Adds `id` to what was served (true if it is new there), and
    /// decides whether the generation reported was served.
    pub(super) fn serve(&mut self, id: Option<GenerationId>) -> bool {
        let new = id.filter(|g| !self.served.contains(g));
        if let Some(g) = new {
            self.served.push(g);
            let over = self.served.len().saturating_sub(MAX_SERVED);
            self.served.drain(..over);
        }
        self.verified |= (self.generation).is_some_and(|g| self.served.contains(&g));
        new.is_some()
    }

    /// A record read back, checked as strictly as a node's own report:
    /// a certname as the gate admits one (printable ASCII, no `/`), its
    /// failing plugins within the report's bounds.
    fn admitted(certname: &str, failed: &[String]) -> bool {
        !certname.is_empty()
            && certname.len() <= 255
            && (certname.bytes()).all(|b| matches!(b, b' '..=b'.' | b'0'..=b'~'))
            && failed.len() <= MAX_FAILED_NAMED
            && failed.iter().all(|n| n.chars().count() <= MAX_NAME_CHARS)
    }

    /// Decides whether this record, replacing `old`, is written to the
    /// state store ([`Node::is_written`]): at once if it differs from
    /// `old` in more than its time (or `always`), else once
    /// [`LAST_SEEN_EVERY`] has passed since `old`'s last write. A node's
    /// no-op runs then cost no database write each.
    pub(super) fn due(&mut self, old: Option<&Node>, always: bool) {
        let every = LAST_SEEN_EVERY.as_millis() as u64;
        let recent = old.filter(|o| {
            !always && self.same_record(o) && self.seen_ms < o.written_ms.saturating_add(every)
        });
        self.written_ms = recent.map_or(self.seen_ms, |o| o.written_ms);
    }

    /// Whether this record is the one last handed to the state store (or
    /// is to be handed to it now).
    pub(super) fn is_written(&self) -> bool {
        self.written_ms == self.seen_ms
    }

    /// Whether the state store's row of `self` and of `other` differ only
    /// in `last_seen`.
    fn same_record(&self, other: &Node) -> bool {
        self.env == other.env
            && self.generation == other.generation
            && self.source == other.source
            && self.loads_ok == other.loads_ok
            && self.loads_failed == other.loads_failed
            && self.failed == other.failed
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
    /// The same, of the nodes whose generation was served to them.
    pub(super) verified: HashMap<(EnvName, GenerationId), (u64, u64)>,
}

impl Nodes {
    fn count(&mut self, node: &Node, add: bool) {
        let failing = u64::from(node.loads_failed > 0);
        tally(
            &mut self.tally,
            (node.env.clone(), node.generation),
            failing,
            add,
        );
        if let Some(g) = node.generation.filter(|_| node.verified) {
            tally(&mut self.verified, (node.env.clone(), g), failing, add);
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

/// Counts a node (`failing`: 1 or 0) in or out of `t` under `key`.
fn tally<K: std::hash::Hash + Eq + Clone>(
    t: &mut HashMap<K, (u64, u64)>,
    key: K,
    failing: u64,
    add: bool,
) {
    let c = t.entry(key.clone()).or_default();
    if add {
        c.0 += 1;
        c.1 += failing;
    } else {
        c.0 = c.0.saturating_sub(1);
        c.1 = c.1.saturating_sub(failing);
        if c.0 == 0 {
            t.remove(&key);
        }
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

    /// A generation served to `certname` as the state store's row.
    pub(super) fn served_row(
        &self,
        certname: &str,
        id: GenerationId,
        replica: &str,
        at_ms: u64,
    ) -> ServedRow {
        ServedRow {
            certname: certname.to_owned(),
            environment: self.env.to_string(),
            generation: id,
            replica: replica.to_owned(),
            at_ms,
        }
    }

    /// A stored row, checked ([`Node::admitted`]), with what was `served`
    /// to it in its environment; its time is never later than `now_ms` (a
    /// clock ahead of ours must not pin a record). No detour through the
    /// inventory's RFC 3339: an inventory page reads thousands.
    pub(super) fn of_row(r: &NodeRow, served: &[GenerationId], now_ms: u64) -> Option<Node> {
        let source = match r.source.as_str() {
            "report" => Source::Report,
            "served" => Source::Served,
            _ => return None,
        };
        Node::admitted(&r.certname, &r.failed).then_some(())?;
        let seen_ms = r.last_seen_ms.min(now_ms);
        let mut node = Node {
            env: r.environment.parse().ok()?,
            generation: r.generation,
            seen_ms,
            source,
            loads_ok: r.loads_ok,
            loads_failed: r.loads_failed,
            failed: r.failed.clone(),
            served: served.to_vec(),
            verified: false,
            written_ms: seen_ms,
        };
        node.serve(None);
        Some(node)
    }
}
