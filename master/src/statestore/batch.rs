//! The SQL `postgres.rs` builds per call (docs/internals.md#the-state-store):
//! a batch of node records and served rows, one `UNNEST` statement per
//! table for many rows with the same outcome as one upsert per row in the
//! order given; an inventory page with only the filters asked.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use pluginsync_common::generation::GenerationId;

use super::sqlite::hex;
use tokio_postgres::types::ToSql;

use super::{NodeRow, PageAsk, ServedRow};

/// Rows per statement.
pub(super) const CHUNK: usize = 5000;

/// Node records as columns (`UNNEST`), each certname once, ordered by
/// certname (replicas writing the same nodes lock them in one order);
/// a record replaced by a later one, or by one as late, as one statement
/// per row would (the upsert's `WHERE`).
pub(super) struct Batch {
    pub(super) certname: Vec<String>,
    pub(super) environment: Vec<String>,
    pub(super) generation: Vec<Option<String>>,
    pub(super) loads_ok: Vec<i64>,
    pub(super) loads_failed: Vec<i64>,
    pub(super) failed: Vec<String>,
    pub(super) last_seen_ms: Vec<i64>,
    pub(super) source: Vec<String>,
    /// Each (certname, environment, generation) once, its first row
    /// (`DO NOTHING` keeps the first), in key order.
    pub(super) served: Vec<ServedRow>,
}

impl Batch {
    pub(super) fn of(rows: &[NodeRow], served: &[ServedRow]) -> Batch {
        let mut latest: BTreeMap<&str, &NodeRow> = BTreeMap::new();
        for n in rows {
            match latest.entry(&n.certname) {
                Entry::Vacant(v) => {
                    v.insert(n);
                }
                Entry::Occupied(mut o) if n.last_seen_ms >= o.get().last_seen_ms => {
                    o.insert(n);
                }
                Entry::Occupied(_) => {}
            }
        }
        let mut first: BTreeMap<(&str, &str, GenerationId), &ServedRow> = BTreeMap::new();
        for s in served {
            first
                .entry((&s.certname, &s.environment, s.generation))
                .or_insert(s);
        }
        let n = latest.len();
        let mut b = Batch {
            certname: Vec::with_capacity(n),
            environment: Vec::with_capacity(n),
            generation: Vec::with_capacity(n),
            loads_ok: Vec::with_capacity(n),
            loads_failed: Vec::with_capacity(n),
            failed: Vec::with_capacity(n),
            last_seen_ms: Vec::with_capacity(n),
            source: Vec::with_capacity(n),
            served: first.into_values().cloned().collect(),
        };
        for r in latest.into_values() {
            b.certname.push(r.certname.clone());
            b.environment.push(r.environment.clone());
            b.generation.push(hex(&r.generation));
            b.loads_ok.push(i64::from(r.loads_ok));
            b.loads_failed.push(i64::from(r.loads_failed));
            b.failed
                .push(serde_json::to_string(&r.failed).unwrap_or_else(|_| "[]".into()));
            b.last_seen_ms.push(r.last_seen_ms as i64);
            b.source.push(r.source.clone());
        }
        b
    }
}

/// Node records, one statement for many ([`Batch`]): a node's record is
/// replaced only by one as late or later.
pub(super) const UPSERT_NODES: &str = "INSERT INTO node_reports
         (certname, environment, generation, loads_ok, loads_failed, failed_plugins,
          last_seen_ms, source)
     SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[],
                          $6::TEXT[], $7::BIGINT[], $8::TEXT[])
     ON CONFLICT (certname) DO UPDATE SET
         environment = excluded.environment, generation = excluded.generation,
         loads_ok = excluded.loads_ok, loads_failed = excluded.loads_failed,
         failed_plugins = excluded.failed_plugins,
         last_seen_ms = excluded.last_seen_ms, source = excluded.source
     WHERE excluded.last_seen_ms >= node_reports.last_seen_ms";

/// Served rows, one statement for many: a row kept from its first.
pub(super) const ADD_SERVED: &str =
    "INSERT INTO served (certname, environment, generation, replica, at_ms)
     SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[])
     ON CONFLICT (certname, environment, generation) DO NOTHING";

/// An inventory page (`StateStore::page`): the primary key's order, the
/// filters on the indexes of `migrations/0002_inventory_indexes.sql`;
/// whether the node was served its generation a merge join of the two
/// primary keys (one served row at most matches), not a probe per node.
pub(super) const PAGE: &str =
    "SELECT n.certname, n.environment, n.generation, n.loads_ok, n.loads_failed,
            n.failed_plugins, n.last_seen_ms, n.source, s.certname IS NOT NULL
     FROM node_reports n LEFT JOIN served s ON s.certname = n.certname
         AND s.environment = n.environment AND s.generation = n.generation";

/// A parameter of a query built here, sent to the store's runtime.
pub(super) type Param = Box<dyn ToSql + Sync + Send>;

/// [`PAGE`] with only the filters `ask` names: a filter written as
/// `($1 IS NULL OR …)` keeps a cached (generic) plan off the indexes, and
/// every page after the first 5 would scan and sort the whole fleet. The
/// cursor bounds both sides of the join.
pub(super) fn page_query(ask: &PageAsk) -> (String, Vec<Param>) {
    let mut sql = PAGE.to_owned();
    let mut params: Vec<Param> = Vec::new();
    let mut add = |sql: &mut String, clause: &str, p: Param| {
        params.push(p);
        sql.push_str(&clause.replace('$', &format!("${}", params.len())));
    };
    let cursor = " AND s.certname > $::TEXT WHERE n.certname > $::TEXT";
    match &ask.after {
        Some(a) => add(&mut sql, cursor, Box::new(a.clone())),
        None => sql.push_str(" WHERE TRUE"),
    }
    if let Some(e) = &ask.environment {
        add(
            &mut sql,
            " AND n.environment = $::TEXT",
            Box::new(e.clone()),
        );
    }
    if let Some(g) = &ask.generation {
        add(
            &mut sql,
            " AND n.generation LIKE $::TEXT",
            Box::new(format!("{g}%")),
        );
    }
    if ask.failing {
        sql.push_str(" AND n.loads_failed > 0");
    }
    let limit = Box::new(ask.limit as i64);
    add(&mut sql, " ORDER BY n.certname LIMIT $::BIGINT", limit);
    (sql, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u8) -> GenerationId {
        GenerationId(pluginsync_common::digest::Sha256::of(&[n]))
    }

    fn node(name: &str, at: u64, ok: u32) -> NodeRow {
        NodeRow {
            certname: name.into(),
            environment: "production".into(),
            generation: Some(g(1)),
            last_seen_ms: at,
            source: "report".into(),
            loads_ok: ok,
            loads_failed: 0,
            failed: Vec::new(),
        }
    }

    fn served(name: &str, generation: u8, at: u64) -> ServedRow {
        ServedRow {
            certname: name.into(),
            environment: "production".into(),
            generation: g(generation),
            replica: "r".into(),
            at_ms: at,
        }
    }

    /// The batch is what one upsert per row, in the order given, leaves:
    /// a later record wins, an equally late one given after wins, an
    /// earlier one loses; a served row is kept from its first.
    #[test]
    fn a_batch_keeps_what_row_by_row_upserts_would() {
        let rows = [
            node("b", 10, 1),
            node("a", 5, 1),
            node("b", 9, 2),
            node("a", 5, 2),
            node("b", 11, 3),
            node("a", 4, 3),
        ];
        let to = [served("a", 1, 7), served("a", 1, 3), served("a", 2, 1)];
        let b = Batch::of(&rows, &to);
        assert_eq!(b.certname, ["a", "b"], "each once, in certname order");
        assert_eq!(
            (b.last_seen_ms.as_slice(), b.loads_ok.as_slice()),
            (&[5, 11][..], &[2, 3][..])
        );
        assert_eq!(b.generation, [Some(g(1).to_hex()), Some(g(1).to_hex())]);
        let kept: Vec<_> = b.served.iter().map(|s| (s.generation, s.at_ms)).collect();
        assert_eq!(kept.len(), 2);
        assert!(
            kept.contains(&(g(1), 7)) && kept.contains(&(g(2), 1)),
            "{kept:?}"
        );
    }
}
