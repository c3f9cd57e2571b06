//! The embedded backend: one SQLite file (WAL, `synchronous = FULL`: a
//! transaction that returned survives a crash or a power cut), created
//! 0600 in a 0700 directory. Each function is one transaction or one
//! query; lists are JSON arrays, generation ids hex.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;

use pluginsync_common::generation::GenerationId;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{CommandRow, NodeRow, PageAsk, ServedRow, TallyRow};

/// Opens (creating) the file at `path`, its directory the master's alone.
pub(super) fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Some(dir) = path.parent() {
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
        let tightened = made
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)));
        if let Err(e) = tightened {
            return Err(io_error(dir, e));
        }
    }
    // Created 0600 before SQLite opens it, so it is never readable by others.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)))
        .map_err(|e| io_error(path, e))?;
    let c = Connection::open(path)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    versioned(&c)?;
    Ok(c)
}

/// A database in memory (`StateStore::in_memory`); SQLite opens one
/// without touching a file, so only memory exhaustion could fail it.
pub(super) fn in_memory() -> Connection {
    let c = Connection::open_in_memory().expect("SQLite opens a database in memory");
    if let Err(e) = versioned(&c) {
        tracing::error!(error = %e, "in-memory state store without its schema table");
    }
    c
}

/// The table of applied migrations, created if missing.
fn versioned(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version BIGINT PRIMARY KEY,
             applied_at BIGINT NOT NULL
         )",
    )
}

fn io_error(path: &Path, e: std::io::Error) -> rusqlite::Error {
    rusqlite::Error::InvalidPath(path.join(format!("({e})")))
}

/// The newest applied schema version (0: none).
pub(super) fn version(c: &mut Connection) -> rusqlite::Result<i64> {
    c.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )
}

/// Applies migration `version` (`sql`) in one transaction.
pub(super) fn migrate(c: &mut Connection, version: i64, sql: &str) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    tx.execute_batch(sql)?;
    tx.execute(
        "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, unixepoch())",
        [version],
    )?;
    tx.commit()
}

/// The database's time, unix seconds.
pub(super) fn now(c: &mut Connection) -> rusqlite::Result<i64> {
    c.query_row("SELECT unixepoch()", [], |r| r.get(0))
}

pub(super) fn meta(c: &mut Connection, key: &str) -> rusqlite::Result<Option<String>> {
    c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
}

pub(super) fn set_meta(c: &mut Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )
    .map(drop)
}

pub(super) fn hex(id: &Option<GenerationId>) -> Option<String> {
    id.map(|g| g.to_hex())
}

pub(super) fn ids_json(ids: &[GenerationId]) -> String {
    serde_json::to_string(&ids.iter().map(GenerationId::to_hex).collect::<Vec<_>>())
        .unwrap_or_else(|_| "[]".into())
}

/// A generation id column; a value that is not one reads as none.
pub(super) fn id_of(v: Option<String>) -> Option<GenerationId> {
    v.and_then(|s| GenerationId::from_str(&s).ok())
}

pub(super) fn ids_of(json: &str) -> Vec<GenerationId> {
    serde_json::from_str::<Vec<String>>(json)
        .unwrap_or_default()
        .iter()
        .filter_map(|s| GenerationId::from_str(s).ok())
        .collect()
}

fn command_of(r: &Row<'_>) -> rusqlite::Result<CommandRow> {
    let halted_at: Option<i64> = r.get(3)?;
    let reason: Option<String> = r.get(4)?;
    let withdrawn: String = r.get(6)?;
    let before: String = r.get(8)?;
    Ok(CommandRow {
        environment: r.get(0)?,
        clock: r.get::<_, i64>(1)? as u64,
        origin: r.get(2)?,
        halt: halted_at.map(|at| (at, reason.unwrap_or_default())),
        promoted: id_of(r.get(5)?),
        withdrawn: ids_of(&withdrawn),
        waived: id_of(r.get(7)?),
        promoted_before: ids_of(&before),
    })
}

pub(super) fn commands(c: &mut Connection) -> rusqlite::Result<Vec<CommandRow>> {
    // Read each second (`Rollouts::refresh`): parsed once.
    let mut q = c.prepare_cached(
        "SELECT environment, clock, origin, halted_at, halt_reason, promoted, withdrawn, waived,
                promoted_before
         FROM rollout_commands ORDER BY environment",
    )?;
    q.query_map([], command_of)?.collect()
}

pub(super) fn write_commands(
    c: &mut Connection,
    rows: &[CommandRow],
    action: &str,
    by: &str,
) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    for row in rows {
        let (halted_at, reason) = match &row.halt {
            Some((at, why)) => (Some(*at), Some(why.as_str())),
            None => (None, None),
        };
        let withdrawn = ids_json(&row.withdrawn);
        tx.execute(
            "INSERT INTO rollout_commands
                 (environment, clock, origin, halted_at, halt_reason, promoted, withdrawn, waived,
                  promoted_before)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (environment) DO UPDATE SET
                 clock = excluded.clock, origin = excluded.origin,
                 halted_at = excluded.halted_at, halt_reason = excluded.halt_reason,
                 promoted = excluded.promoted, withdrawn = excluded.withdrawn,
                 waived = excluded.waived, promoted_before = excluded.promoted_before",
            params![
                row.environment,
                row.clock as i64,
                row.origin,
                halted_at,
                reason,
                hex(&row.promoted),
                withdrawn,
                hex(&row.waived),
                ids_json(&row.promoted_before)
            ],
        )?;
        tx.execute(
            "INSERT INTO rollout_history
                 (environment, action, issued_by, at, halted_at, halt_reason, promoted, withdrawn, waived)
             VALUES (?1, ?2, ?3, unixepoch(), ?4, ?5, ?6, ?7, ?8)",
            params![
                row.environment,
                action,
                by,
                halted_at,
                reason,
                hex(&row.promoted),
                withdrawn,
                hex(&row.waived)
            ],
        )?;
    }
    tx.commit()
}

pub(super) fn history(
    c: &mut Connection,
    environment: &str,
    limit: usize,
) -> rusqlite::Result<Vec<(i64, String, String)>> {
    let mut q = c.prepare(
        "SELECT at, action, issued_by FROM rollout_history
         WHERE environment = ?1 ORDER BY id DESC LIMIT ?2",
    )?;
    q.query_map(params![environment, limit as i64], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?
    .collect()
}

pub(super) fn seen(c: &mut Connection) -> rusqlite::Result<Vec<(String, GenerationId)>> {
    let mut q =
        c.prepare("SELECT environment, generation FROM rollout_seen ORDER BY environment, seq")?;
    let rows = q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (env, id) = row?;
        if let Some(id) = id_of(Some(id)) {
            out.push((env, id));
        }
    }
    Ok(out)
}

pub(super) fn add_seen(
    c: &mut Connection,
    environment: &str,
    ids: &[GenerationId],
    max: usize,
) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    for id in ids {
        tx.execute(
            "INSERT INTO rollout_seen (environment, generation, seq)
             SELECT ?1, ?2, COALESCE(MAX(seq), 0) + 1 FROM rollout_seen WHERE environment = ?1
             ON CONFLICT (environment, generation) DO NOTHING",
            params![environment, id.to_hex()],
        )?;
    }
    tx.execute(
        "DELETE FROM rollout_seen WHERE environment = ?1 AND seq NOT IN
             (SELECT seq FROM rollout_seen WHERE environment = ?1 ORDER BY seq DESC LIMIT ?2)",
        params![environment, max as i64],
    )?;
    tx.commit()
}

fn node_of(r: &Row<'_>) -> rusqlite::Result<NodeRow> {
    let failed: String = r.get(5)?;
    Ok(NodeRow {
        certname: r.get(0)?,
        environment: r.get(1)?,
        generation: id_of(r.get(2)?),
        loads_ok: r.get::<_, i64>(3)? as u32,
        loads_failed: r.get::<_, i64>(4)? as u32,
        failed: serde_json::from_str(&failed).unwrap_or_default(),
        last_seen_ms: r.get::<_, i64>(6)? as u64,
        source: r.get(7)?,
    })
}

pub(super) fn nodes(c: &mut Connection, max: usize) -> rusqlite::Result<Vec<NodeRow>> {
    let mut q = c.prepare(
        "SELECT certname, environment, generation, loads_ok, loads_failed, failed_plugins,
                last_seen_ms, source
         FROM node_reports ORDER BY last_seen_ms DESC, certname LIMIT ?1",
    )?;
    q.query_map([max as i64], node_of)?.collect()
}

/// One node's record and the generations served to it in its
/// environment, oldest first.
pub(super) fn node(
    c: &mut Connection,
    certname: &str,
) -> rusqlite::Result<Option<(NodeRow, Vec<GenerationId>)>> {
    let mut q = c.prepare_cached(
        "SELECT certname, environment, generation, loads_ok, loads_failed, failed_plugins,
                last_seen_ms, source
         FROM node_reports WHERE certname = ?1",
    )?;
    let Some(row) = q.query_map([certname], node_of)?.next().transpose()? else {
        return Ok(None);
    };
    let mut q = c.prepare_cached(
        "SELECT generation FROM served WHERE certname = ?1 AND environment = ?2
         ORDER BY at_ms, generation",
    )?;
    let served = q
        .query_map([certname, row.environment.as_str()], |r| {
            r.get::<_, String>(0)
        })?
        .filter_map(|g| id_of(g.ok()))
        .collect();
    Ok(Some((row, served)))
}

pub(super) fn write_nodes(
    c: &mut Connection,
    rows: &[NodeRow],
    served: &[ServedRow],
) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    {
        let mut up = tx.prepare_cached(
            "INSERT INTO node_reports
                 (certname, environment, generation, loads_ok, loads_failed, failed_plugins,
                  last_seen_ms, source)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (certname) DO UPDATE SET
                 environment = excluded.environment, generation = excluded.generation,
                 loads_ok = excluded.loads_ok, loads_failed = excluded.loads_failed,
                 failed_plugins = excluded.failed_plugins,
                 last_seen_ms = excluded.last_seen_ms, source = excluded.source
             WHERE excluded.last_seen_ms >= node_reports.last_seen_ms",
        )?;
        for n in rows {
            up.execute(params![
                n.certname,
                n.environment,
                hex(&n.generation),
                i64::from(n.loads_ok),
                i64::from(n.loads_failed),
                serde_json::to_string(&n.failed).unwrap_or_else(|_| "[]".into()),
                n.last_seen_ms as i64,
                n.source
            ])?;
        }
        let mut add = tx.prepare_cached(
            "INSERT INTO served (certname, environment, generation, replica, at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (certname, environment, generation) DO NOTHING",
        )?;
        for s in served {
            add.execute(params![
                s.certname,
                s.environment,
                s.generation.to_hex(),
                s.replica,
                s.at_ms as i64
            ])?;
        }
    }
    tx.commit()
}

pub(super) fn served(c: &mut Connection) -> rusqlite::Result<Vec<ServedRow>> {
    let mut q = c.prepare(
        "SELECT s.certname, s.environment, s.generation, s.replica, s.at_ms
         FROM served s JOIN node_reports n ON n.certname = s.certname
         ORDER BY s.certname, s.at_ms",
    )?;
    let rows = q.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, i64>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (certname, environment, generation, replica, at) = row?;
        if let Some(generation) = id_of(Some(generation)) {
            out.push(ServedRow {
                certname,
                environment,
                generation,
                replica,
                at_ms: at as u64,
            });
        }
    }
    Ok(out)
}

/// Nodes and failing nodes per environment and generation, all and
/// served (`TallyRow`): the same SQL in both backends.
pub(super) const TALLY: &str = "SELECT n.environment, n.generation, COUNT(*),
        SUM(CASE WHEN n.loads_failed > 0 THEN 1 ELSE 0 END), COUNT(s.certname),
        SUM(CASE WHEN s.certname IS NOT NULL AND n.loads_failed > 0 THEN 1 ELSE 0 END)
     FROM node_reports n LEFT JOIN served s ON s.certname = n.certname
         AND s.environment = n.environment AND s.generation = n.generation
     GROUP BY n.environment, n.generation";

/// A count read back (never negative).
pub(super) fn count(n: Option<i64>) -> u64 {
    n.unwrap_or(0).max(0) as u64
}

pub(super) fn tallies(c: &mut Connection) -> rusqlite::Result<Vec<TallyRow>> {
    let mut q = c.prepare_cached(TALLY)?;
    q.query_map([], |r| {
        Ok(TallyRow {
            environment: r.get(0)?,
            generation: id_of(r.get(1)?),
            all: (count(r.get(2)?), count(r.get(3)?)),
            served: (count(r.get(4)?), count(r.get(5)?)),
        })
    })?
    .collect()
}

pub(super) fn page(c: &mut Connection, ask: &PageAsk) -> rusqlite::Result<Vec<(NodeRow, bool)>> {
    let mut q = c.prepare_cached(
        "SELECT n.certname, n.environment, n.generation, n.loads_ok, n.loads_failed,
                n.failed_plugins, n.last_seen_ms, n.source,
                EXISTS (SELECT 1 FROM served s WHERE s.certname = n.certname
                        AND s.environment = n.environment AND s.generation = n.generation)
         FROM node_reports n
         WHERE (?1 IS NULL OR n.environment = ?1) AND (?2 IS NULL OR n.generation LIKE ?2)
           AND (?3 = 0 OR n.loads_failed > 0) AND (?4 IS NULL OR n.certname > ?4)
         ORDER BY n.certname LIMIT ?5",
    )?;
    let prefix = ask.generation.as_ref().map(|g| format!("{g}%"));
    let args = params![
        ask.environment,
        prefix,
        ask.failing,
        ask.after,
        ask.limit as i64
    ];
    q.query_map(args, |r| Ok((node_of(r)?, r.get::<_, bool>(8)?)))?
        .collect()
}

/// Forgets the least recently seen nodes beyond `max` (a scan of the
/// age index: called now and then, not per write).
pub(super) fn prune_nodes(c: &mut Connection, max: usize) -> rusqlite::Result<usize> {
    let tx = c.transaction()?;
    let n = tx.execute(
        "DELETE FROM node_reports WHERE certname IN (
             SELECT certname FROM node_reports
             ORDER BY last_seen_ms DESC, certname LIMIT -1 OFFSET ?1)",
        [max as i64],
    )?;
    tx.execute(
        "DELETE FROM served WHERE certname NOT IN (SELECT certname FROM node_reports)",
        [],
    )?;
    tx.commit()?;
    Ok(n)
}
