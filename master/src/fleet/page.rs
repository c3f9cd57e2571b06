//! One page of the inventory (docs/operating.md#the-fleet,
//! docs/protocol.md §7.11): the nodes a [`Query`] matches, in certname
//! order, after a cursor, at most a page; [`Fleet::page`] is the one query
//! the admin API and `pluginsync-master inventory` ask.
//!
//! On a shared store (PostgreSQL, docs/rollouts.md#replicas) the whole
//! fleet is the store's, not what this replica heard: a page is one
//! indexed query per request, and the counts the gate and the metrics
//! read ([`Shared`]) are one query a second, kept between. The embedded
//! store (one master) answers from memory: the same data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use serde::{Deserialize, Serialize};

use super::nodes::Node;
use super::{Fleet, NodeEntry, now_ms};
use crate::statestore::{NodeRow, PageAsk, StateStore, StoreError};

/// How often a replica on a shared store reads the fleet's counts.
pub const REFRESH: Duration = Duration::from_secs(1);

/// An environment and a generation (`None`: nodes with none yet).
pub(super) type Key = (EnvName, Option<GenerationId>);
/// `(nodes, failing nodes)` per [`Key`].
pub(super) type Tally = HashMap<Key, (u64, u64)>;

/// The fleet's counts as the shared store last answered (module docs).
#[derive(Debug)]
pub(super) struct Shared {
    store: Arc<StateStore>,
    /// Every node, and the nodes served the generation they have.
    counts: Mutex<(Tally, Tally)>,
}

impl Shared {
    /// The counts of `store`, read now and then every [`REFRESH`] by a
    /// thread that ends with them.
    pub(super) fn start(store: Arc<StateStore>) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            store,
            counts: Mutex::default(),
        });
        if let Err(e) = shared.refresh() {
            tracing::warn!(error = %e, "fleet counts not read from the state store yet");
        }
        let weak = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("fleet-counts".into())
            .spawn(move || refresh_each_second(&weak));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "fleet counts not refreshed: the gate sees the start's");
        }
        shared
    }

    /// Reads the counts once; on an error the last answer stays.
    fn refresh(&self) -> Result<(), StoreError> {
        let (mut all, mut served) = (Tally::new(), Tally::new());
        for row in self.store.tallies()? {
            let Ok(env) = row.environment.parse::<EnvName>() else {
                continue;
            };
            all.insert((env.clone(), row.generation), row.all);
            if row.generation.is_some() && row.served.0 > 0 {
                served.insert((env, row.generation), row.served);
            }
        }
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = (all, served);
        Ok(())
    }

    /// Nodes of `env` served `generation` and on it, and the failing.
    pub(super) fn on_generation(&self, env: &EnvName, generation: &GenerationId) -> (u64, u64) {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let key = (env.clone(), Some(*generation));
        counts.1.get(&key).copied().unwrap_or_default()
    }

    /// Every node's count per environment and generation.
    pub(super) fn tally(&self) -> Vec<(Key, (u64, u64))> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.0.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// The stored record of `certname` and what was served to it; `None`
    /// also when the store does not answer (logged).
    pub(super) fn node(&self, certname: &str) -> Option<(NodeRow, Vec<GenerationId>)> {
        self.store.node(certname).unwrap_or_else(|e| {
            tracing::warn!(certname, error = %e, "node record not read from the state store");
            None
        })
    }

    /// The page `q` asks for, from the store: `limit` nodes, one more
    /// asked to know whether a next page exists.
    fn page(&self, q: &Query, limit: usize) -> Result<Page, StoreError> {
        let ask = PageAsk {
            environment: q.environment.as_ref().map(ToString::to_string),
            generation: q.generation.clone(),
            failing: q.failing,
            after: q.after.clone(),
            limit: limit + 1,
        };
        let mut rows = self.store.page(&ask)?;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let now = now_ms();
        let nodes: Vec<NodeEntry> = (rows.iter())
            .filter_map(|(row, served)| {
                let mut node = Node::of_row(row, &[], now)?;
                node.verified = *served;
                Some(node.entry(&row.certname))
            })
            .collect();
        let next = more.then(|| rows.last().map(|(r, _)| r.certname.clone()));
        Ok(Page {
            nodes,
            next: next.flatten(),
        })
    }
}

/// The thread of [`Shared::start`]: one log line when reads start
/// failing and one when they recover.
fn refresh_each_second(shared: &Weak<Shared>) {
    let mut failing = false;
    loop {
        std::thread::sleep(REFRESH);
        let Some(s) = shared.upgrade() else { return };
        match s.refresh() {
            Ok(()) if failing => {
                failing = false;
                tracing::warn!("fleet counts read from the state store again");
            }
            Err(e) if !failing => {
                failing = true;
                tracing::error!(error = %e, "fleet counts not read: the gate keeps the last answer");
            }
            _ => {}
        }
    }
}

/// Nodes in a page when the query names no `limit`.
pub const DEFAULT_PAGE: usize = 1000;
/// The most nodes a page may hold (`limit`).
pub const MAX_PAGE: usize = 10_000;

/// Which nodes, from where, how many.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Only this environment's nodes.
    pub environment: Option<EnvName>,
    /// Only nodes whose generation's hex id starts with this (lowercase).
    pub generation: Option<String>,
    /// Only nodes reporting load failures.
    pub failing: bool,
    /// Only certnames after this one (the previous page's `next`).
    pub after: Option<String>,
    /// At most this many nodes (1 to [`MAX_PAGE`]).
    pub limit: usize,
}

/// A page: the nodes, and the cursor of the next page if there are more.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    /// The nodes matched, by certname.
    pub nodes: Vec<NodeEntry>,
    /// The last certname of this page when more nodes match after it
    /// (send it back as `after`); absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl Query {
    /// Whether the node `certname` of `env` on `generation`, failing or
    /// not, is asked for (the cursor included).
    fn matches(&self, certname: &str, node: &super::Node) -> bool {
        self.after.as_deref().is_none_or(|a| certname > a)
            && self.environment.as_ref().is_none_or(|e| *e == node.env)
            && (!self.failing || node.loads_failed > 0)
            && self
                .generation
                .as_deref()
                .is_none_or(|g| node.generation.is_some_and(|id| id.to_hex().starts_with(g)))
    }
}

impl Fleet {
    /// The page of nodes `q` asks for (module docs): the first `q.limit`
    /// matching certnames after `q.after`, with `next` set when more match.
    pub fn page(&self, q: &Query) -> Page {
        let limit = q.limit.clamp(1, MAX_PAGE);
        if let Some(shared) = &self.shared {
            match shared.page(q, limit) {
                Ok(page) => return page,
                Err(e) => {
                    tracing::warn!(error = %e, "inventory page from this replica's memory: the state store did not answer");
                }
            }
        }
        let nodes = self.lock();
        let mut names: Vec<&String> = (nodes.by_name.iter())
            .filter(|(c, n)| q.matches(c, n))
            .map(|(c, _)| c)
            .collect();
        let more = names.len() > limit;
        if more {
            names.select_nth_unstable(limit);
            names.truncate(limit);
        }
        names.sort_unstable();
        let list: Vec<NodeEntry> = (names.iter())
            .filter_map(|c| nodes.by_name.get(*c).map(|n| n.entry(c)))
            .collect();
        let next = more
            .then(|| list.last().map(|e| e.certname.clone()))
            .flatten();
        Page { nodes: list, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FleetConfig;
    use pluginsync_common::digest::Sha256;
    use pluginsync_common::generation::GenerationId;
    use pluginsync_common::rollout::NodeReport;

    #[test]
    fn pages_follow_the_cursor_in_certname_order_and_filter() {
        let fleet = Fleet::new(&FleetConfig::default());
        let (prod, test): (EnvName, EnvName) =
            ("production".parse().unwrap(), "test".parse().unwrap());
        let g = GenerationId(Sha256::of(b"g"));
        for i in (0..25).rev() {
            let env = if i % 5 == 0 { &test } else { &prod };
            let report = (i % 4 == 0).then(|| {
                Ok(NodeReport {
                    generation: Some(g),
                    loads_failed: 1,
                    failed: vec!["a.rb".into()],
                    ..NodeReport::default()
                })
            });
            fleet.heard_read(&format!("n{i:02}"), env, report.as_ref(), Some(g));
        }
        let mut q = Query {
            limit: 10,
            ..Query::default()
        };
        let mut seen = Vec::new();
        loop {
            let p = fleet.page(&q);
            assert!(p.nodes.len() <= 10);
            seen.extend(p.nodes.iter().map(|n| n.certname.clone()));
            match p.next {
                Some(n) => q.after = Some(n),
                None => break,
            }
        }
        let want: Vec<String> = (0..25).map(|i| format!("n{i:02}")).collect();
        assert_eq!(seen, want, "every node once, in order");
        let only = |q: Query| fleet.page(&Query { limit: 100, ..q }).nodes.len();
        assert_eq!(
            only(Query {
                environment: Some(test),
                ..Query::default()
            }),
            5
        );
        assert_eq!(
            only(Query {
                failing: true,
                ..Query::default()
            }),
            7
        );
        let prefix = Some(g.to_hex()[..8].to_owned());
        assert_eq!(
            only(Query {
                generation: prefix,
                ..Query::default()
            }),
            25
        );
        assert_eq!(
            only(Query {
                generation: Some("00".into()),
                ..Query::default()
            }),
            0
        );
    }
}
