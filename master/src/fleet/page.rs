//! One page of the inventory (docs/operating.md#the-fleet,
//! docs/protocol.md §7.11): the nodes a [`Query`] matches, in certname
//! order, after a cursor, at most a page; [`Fleet::page`] is the one query
//! the admin API and `pluginsync-master inventory` ask, so a store other
//! than memory reimplements this function alone.

use pluginsync_common::envname::EnvName;
use serde::{Deserialize, Serialize};

use super::{Fleet, NodeEntry};

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
        let fleet = Fleet::new(&FleetConfig::default(), 0);
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
