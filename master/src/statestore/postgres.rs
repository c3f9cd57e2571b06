//! The PostgreSQL backend, shared by replicas: the same schema as the
//! embedded file (`migrations/`, SQLite's `INTEGER PRIMARY KEY
//! AUTOINCREMENT` read as `BIGSERIAL PRIMARY KEY`, the one difference),
//! the same rows, times from the database's `now()`.
//!
//! The domain calls the store synchronously (from blocking threads: the
//! writer's, `spawn_blocking`); each call here is a task on the store's
//! own one-thread runtime, where the pool's connections live, and the
//! caller waits on a channel: never a tokio worker of the master's blocked
//! on the network, and never longer than [`QUERY_TIMEOUT`] (a dead
//! database answers an error, it does not hang a request).

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use pluginsync_common::generation::GenerationId;
use tokio_postgres::types::ToSql;

use super::batch::{ADD_SERVED, Batch, CHUNK, UPSERT_NODES, page_query};
use super::pgconn::{self, PgError};
use super::sqlite::{TALLY, count, hex, id_of, ids_json, ids_of};
use super::{CommandRow, NodeRow, PageAsk, ServedRow, TallyRow};

/// How long one call (a checkout and its queries) may take.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The key of the advisory lock replicas take to migrate one at a time.
const MIGRATION_LOCK: i64 = 0x706c_7567_696e_7379; // "pluginsy"

/// The database's time in unix seconds, as SQL.
const NOW_S: &str = "EXTRACT(EPOCH FROM now())::BIGINT";

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A pool on its own runtime (module docs).
pub(super) struct Pg {
    rt: Option<tokio::runtime::Runtime>,
    pool: Pool,
}

impl Drop for Pg {
    fn drop(&mut self) {
        // Dropped anywhere, an async context included.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// An error and its causes on one line.
fn line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !s.contains(&more) {
            s = format!("{s}: {more}");
        }
        cause = c.source();
    }
    s.replace('\n', " ")
}

impl Pg {
    /// The pool of `url` (at most `max` connections); nothing connects yet.
    pub(super) fn open(url: &str, max: u32) -> Result<Pg, PgError> {
        let target = pgconn::parse(url)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("state-postgres")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let pool = {
            let _in = rt.enter();
            pgconn::pool(target, max, QUERY_TIMEOUT)?
        };
        Ok(Pg { rt: Some(rt), pool })
    }

    /// Runs `f`'s future on the store's runtime and waits for it, at most
    /// [`QUERY_TIMEOUT`].
    fn run<T, Fut>(&self, f: impl FnOnce(Pool) -> Fut) -> Result<T, PgError>
    where
        T: Send + 'static,
        Fut: Future<Output = R<T>> + Send + 'static,
    {
        let Some(rt) = &self.rt else {
            return Err(PgError("closed".into()));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = f(self.pool.clone());
        rt.spawn(async move {
            let r = match tokio::time::timeout(QUERY_TIMEOUT, fut).await {
                Ok(r) => r.map_err(|e| PgError(line(e.as_ref()))),
                Err(_) => Err(PgError(format!(
                    "no answer within {} s",
                    QUERY_TIMEOUT.as_secs()
                ))),
            };
            let _ = tx.send(r);
        });
        rx.recv_timeout(QUERY_TIMEOUT + Duration::from_secs(1))
            .unwrap_or_else(|_| {
                let late = format!("no answer within {} s", QUERY_TIMEOUT.as_secs());
                Err(PgError(late))
            })
    }

    /// Brings the schema to `migrations` under an advisory lock, in one
    /// transaction (replicas starting at once apply each version once);
    /// `Err(found)` inside when the database's version is newer.
    pub(super) fn migrate(
        &self,
        migrations: &'static [(i64, &'static str)],
    ) -> Result<Result<Vec<i64>, i64>, PgError> {
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version BIGINT PRIMARY KEY,
                     applied_at BIGINT NOT NULL
                 )",
            )
            .await?;
            let found = version_in(&tx).await?;
            let known = migrations.last().map_or(0, |m| m.0);
            if found > known {
                return Ok(Err(found));
            }
            let mut applied = Vec::new();
            for (version, sql) in migrations.iter().filter(|m| m.0 > found) {
                tx.batch_execute(&dialect(sql)).await?;
                let add = format!(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, {NOW_S})"
                );
                tx.execute(&add, &[version]).await?;
                applied.push(*version);
            }
            tx.commit().await?;
            Ok(Ok(applied))
        })
    }

    /// The newest applied schema version (0: none).
    pub(super) fn version(&self) -> Result<i64, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            version_in(&c).await
        })
    }

    pub(super) fn now(&self) -> Result<i64, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            Ok(c.query_one(&format!("SELECT {NOW_S}"), &[]).await?.get(0))
        })
    }

    pub(super) fn meta(&self, key: &str) -> Result<Option<String>, PgError> {
        let key = key.to_owned();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let row = c
                .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    pub(super) fn set_meta(&self, key: &str, value: &str) -> Result<(), PgError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.run(move |pool| async move {
            let c = pool.get().await?;
            c.execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&key, &value],
            )
            .await?;
            Ok(())
        })
    }

    pub(super) fn commands(&self) -> Result<Vec<CommandRow>, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT environment, clock, origin, halted_at, halt_reason, promoted,
                            withdrawn, waived, promoted_before
                     FROM rollout_commands ORDER BY environment",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(command_of).collect())
        })
    }

    pub(super) fn write_commands(
        &self,
        rows: &[CommandRow],
        action: &str,
        by: &str,
    ) -> Result<(), PgError> {
        let (rows, action, by) = (rows.to_vec(), action.to_owned(), by.to_owned());
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            for row in &rows {
                write_command(&tx, row, &action, &by).await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn history(
        &self,
        environment: &str,
        limit: usize,
    ) -> Result<Vec<(i64, String, String)>, PgError> {
        let env = environment.to_owned();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT at, action, issued_by FROM rollout_history
                     WHERE environment = $1 ORDER BY id DESC LIMIT $2",
                    &[&env, &(limit as i64)],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
    }

    pub(super) fn seen(&self) -> Result<Vec<(String, GenerationId)>, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT environment, generation FROM rollout_seen
                     ORDER BY environment, seq",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| id_of(Some(r.get(1))).map(|id| (r.get(0), id)))
                .collect())
        })
    }

    pub(super) fn add_seen(
        &self,
        environment: &str,
        ids: &[GenerationId],
        max: usize,
    ) -> Result<(), PgError> {
        let (env, ids) = (environment.to_owned(), ids.to_vec());
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            for id in &ids {
                tx.execute(
                    "INSERT INTO rollout_seen (environment, generation, seq)
                     SELECT $1::TEXT, $2::TEXT, COALESCE(MAX(seq), 0) + 1
                     FROM rollout_seen WHERE environment = $1::TEXT
                     ON CONFLICT (environment, generation) DO NOTHING",
                    &[&env, &id.to_hex()],
                )
                .await?;
            }
            tx.execute(
                "DELETE FROM rollout_seen WHERE environment = $1 AND seq NOT IN
                     (SELECT seq FROM rollout_seen WHERE environment = $1
                      ORDER BY seq DESC LIMIT $2)",
                &[&env, &(max as i64)],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn nodes(&self, max: usize) -> Result<Vec<NodeRow>, PgError> {
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT certname, environment, generation, loads_ok, loads_failed,
                            failed_plugins, last_seen_ms, source
                     FROM node_reports ORDER BY last_seen_ms DESC, certname LIMIT $1",
                    &[&(max as i64)],
                )
                .await?;
            Ok(rows.iter().map(node_of).collect())
        })
    }

    pub(super) fn node(
        &self,
        certname: &str,
    ) -> Result<Option<(NodeRow, Vec<GenerationId>)>, PgError> {
        let name = certname.to_owned();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let row = c
                .query_opt(
                    "SELECT certname, environment, generation, loads_ok, loads_failed,
                            failed_plugins, last_seen_ms, source
                     FROM node_reports WHERE certname = $1",
                    &[&name],
                )
                .await?;
            let Some(row) = row.as_ref().map(node_of) else {
                return Ok(None);
            };
            let served = c
                .query(
                    "SELECT generation FROM served WHERE certname = $1 AND environment = $2
                     ORDER BY at_ms, generation",
                    &[&name, &row.environment],
                )
                .await?;
            let served = served.iter().filter_map(|r| id_of(r.get(0))).collect();
            Ok(Some((row, served)))
        })
    }

    /// [`super::StateStore::write_nodes`]: one statement per table per
    /// [`CHUNK`] rows ([`Batch`]), not a round trip per row.
    pub(super) fn write_nodes(
        &self,
        rows: &[NodeRow],
        served: &[ServedRow],
    ) -> Result<(), PgError> {
        let batch = Batch::of(rows, served);
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            if !batch.certname.is_empty() {
                let up = tx.prepare_cached(UPSERT_NODES).await?;
                for i in (0..batch.certname.len()).step_by(CHUNK) {
                    let j = (i + CHUNK).min(batch.certname.len());
                    let params: [&(dyn ToSql + Sync); 8] = [
                        &&batch.certname[i..j],
                        &&batch.environment[i..j],
                        &&batch.generation[i..j],
                        &&batch.loads_ok[i..j],
                        &&batch.loads_failed[i..j],
                        &&batch.failed[i..j],
                        &&batch.last_seen_ms[i..j],
                        &&batch.source[i..j],
                    ];
                    tx.execute(&up, &params).await?;
                }
            }
            if !batch.served.is_empty() {
                let add = tx.prepare_cached(ADD_SERVED).await?;
                for chunk in batch.served.chunks(CHUNK) {
                    let col = |f: fn(&ServedRow) -> String| chunk.iter().map(f).collect::<Vec<_>>();
                    let at: Vec<i64> = chunk.iter().map(|s| s.at_ms as i64).collect();
                    let params: [&(dyn ToSql + Sync); 5] = [
                        &col(|s| s.certname.clone()),
                        &col(|s| s.environment.clone()),
                        &col(|s| s.generation.to_hex()),
                        &col(|s| s.replica.clone()),
                        &at,
                    ];
                    tx.execute(&add, &params).await?;
                }
            }
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn served(&self) -> Result<Vec<ServedRow>, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT s.certname, s.environment, s.generation, s.replica, s.at_ms
                     FROM served s JOIN node_reports n ON n.certname = s.certname
                     ORDER BY s.certname, s.at_ms",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some(ServedRow {
                        certname: r.get(0),
                        environment: r.get(1),
                        generation: id_of(Some(r.get(2)))?,
                        replica: r.get(3),
                        at_ms: r.get::<_, i64>(4) as u64,
                    })
                })
                .collect())
        })
    }

    pub(super) fn tallies(&self) -> Result<Vec<TallyRow>, PgError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let q = c.prepare_cached(TALLY).await?;
            let rows = c.query(&q, &[]).await?;
            Ok(rows
                .iter()
                .map(|r| TallyRow {
                    environment: r.get(0),
                    generation: id_of(r.get(1)),
                    all: (count(r.get(2)), count(r.get(3))),
                    served: (count(r.get(4)), count(r.get(5))),
                })
                .collect())
        })
    }

    pub(super) fn page(&self, ask: &PageAsk) -> Result<Vec<(NodeRow, bool)>, PgError> {
        let (sql, params) = page_query(ask);
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let q = c.prepare_cached(&sql).await?;
            let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
            let rows = c.query(&q, &params).await?;
            Ok(rows.iter().map(|r| (node_of(r), r.get(8))).collect())
        })
    }

    pub(super) fn prune_nodes(&self, max: usize) -> Result<usize, PgError> {
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            let n = tx
                .execute(
                    "DELETE FROM node_reports WHERE certname IN (
                         SELECT certname FROM node_reports
                         ORDER BY last_seen_ms DESC, certname OFFSET $1)",
                    &[&(max as i64)],
                )
                .await?;
            // An anti-join, and only when nodes went: `NOT IN` over a
            // fleet larger than `work_mem` compares every pair of rows.
            if n > 0 {
                tx.execute(
                    "DELETE FROM served s WHERE NOT EXISTS
                         (SELECT 1 FROM node_reports n WHERE n.certname = s.certname)",
                    &[],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(n as usize)
        })
    }
}

/// The migrations' SQL in PostgreSQL's words (module docs).
fn dialect(sql: &str) -> String {
    sql.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
}

async fn version_in(c: &impl GenericClient) -> R<i64> {
    let row = c
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

async fn write_command(
    tx: &deadpool_postgres::Transaction<'_>,
    row: &CommandRow,
    action: &str,
    by: &str,
) -> R<()> {
    let (halted_at, reason) = match &row.halt {
        Some((at, why)) => (Some(*at), Some(why.as_str())),
        None => (None, None),
    };
    let withdrawn = ids_json(&row.withdrawn);
    tx.execute(
        "INSERT INTO rollout_commands
             (environment, clock, origin, halted_at, halt_reason, promoted, withdrawn, waived,
              promoted_before)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (environment) DO UPDATE SET
             clock = excluded.clock, origin = excluded.origin,
             halted_at = excluded.halted_at, halt_reason = excluded.halt_reason,
             promoted = excluded.promoted, withdrawn = excluded.withdrawn,
             waived = excluded.waived, promoted_before = excluded.promoted_before",
        &[
            &row.environment,
            &(row.clock as i64),
            &row.origin,
            &halted_at,
            &reason,
            &hex(&row.promoted),
            &withdrawn,
            &hex(&row.waived),
            &ids_json(&row.promoted_before),
        ],
    )
    .await?;
    let history = format!(
        "INSERT INTO rollout_history
             (environment, action, issued_by, at, halted_at, halt_reason, promoted, withdrawn,
              waived)
         VALUES ($1, $2, $3, {NOW_S}, $4, $5, $6, $7, $8)"
    );
    tx.execute(
        &history,
        &[
            &row.environment,
            &action,
            &by,
            &halted_at,
            &reason,
            &hex(&row.promoted),
            &withdrawn,
            &hex(&row.waived),
        ],
    )
    .await?;
    Ok(())
}

fn command_of(r: &tokio_postgres::Row) -> CommandRow {
    let halted_at: Option<i64> = r.get(3);
    let reason: Option<String> = r.get(4);
    CommandRow {
        environment: r.get(0),
        clock: r.get::<_, i64>(1) as u64,
        origin: r.get(2),
        halt: halted_at.map(|at| (at, reason.unwrap_or_default())),
        promoted: id_of(r.get(5)),
        withdrawn: ids_of(r.get(6)),
        waived: id_of(r.get(7)),
        promoted_before: ids_of(r.get(8)),
    }
}

fn node_of(r: &tokio_postgres::Row) -> NodeRow {
    NodeRow {
        certname: r.get(0),
        environment: r.get(1),
        generation: id_of(r.get(2)),
        loads_ok: r.get::<_, i64>(3) as u32,
        loads_failed: r.get::<_, i64>(4) as u32,
        failed: serde_json::from_str(r.get(5)).unwrap_or_default(),
        last_seen_ms: r.get::<_, i64>(6) as u64,
        source: r.get(7),
    }
}
