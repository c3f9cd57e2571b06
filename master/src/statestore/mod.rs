//! The state store (docs/internals.md#the-state-store): what the master
//! must not forget across a restart, in a database with one versioned
//! schema (`migrations/`): the rollout commands per environment and their
//! history, the generations this master has kept, the node reports (the
//! inventory) and which generation was served to which node.
//!
//! The backend is the embedded SQLite file under the generation store's
//! directory (`state/pluginsync.sqlite`, 0600 in a 0700 directory), the
//! default for a single master, or `[state] url = "postgresql://…"`, a
//! PostgreSQL shared by replicas (docs/operating.md#the-state-store).
//!
//! The domain (`rollout/`, `fleet/`) talks to [`StateStore`] in rows of
//! its own ([`CommandRow`], [`NodeRow`]); [`Settings`] is what the
//! configuration's `[state]` becomes, so this module never reads
//! `config.rs`.
//!
//! | file | answers |
//! |---|---|
//! | `mod.rs` | [`StateStore`], its rows, its settings, its errors. |
//! | `sqlite.rs` | The embedded backend: the file, its migrations, its queries. |
//! | `postgres.rs` | The PostgreSQL backend: the same queries, on its own runtime. |
//! | `pgconn.rs` | PostgreSQL's URL, `sslmode`, TLS and pool. |
//! | `batch.rs` | PostgreSQL's SQL per call: a batch of node records, a page. |
//! | `writer.rs` | [`Writer`]: node reports written behind the requests, batched, bounded. |

mod batch;
mod pgconn;
mod postgres;
mod sqlite;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use pluginsync_common::generation::GenerationId;
use pluginsync_common::mutex::lock;

pub use self::writer::Writer;

/// The schema versions this binary knows, in order: `(version, SQL)`.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/0001_initial.sql")),
    (2, include_str!("migrations/0002_inventory_indexes.sql")),
];

/// The `meta` key of this master's name.
pub const ORIGIN_KEY: &str = "origin";

/// The embedded store's file under the state directory.
pub const EMBEDDED_FILE: &str = "state/pluginsync.sqlite";

/// Where the state lives and how many connections may be open to it
/// (what `[state]` says, docs/operating.md#the-state-store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The backend.
    pub backend: Backend,
    /// Connections open at most (PostgreSQL; the embedded store uses one).
    pub max_connections: u32,
}

/// Which database holds the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file: [`EMBEDDED_FILE`] under this directory
    /// (the generation store's, where `rollout.json` lived).
    Embedded(PathBuf),
    /// A PostgreSQL URL (`postgresql://…`).
    Postgres(String),
}

impl Settings {
    /// The default: the embedded store under `dir`.
    pub fn embedded(dir: &Path) -> Settings {
        Settings {
            backend: Backend::Embedded(dir.to_path_buf()),
            max_connections: 1,
        }
    }

    /// `[state] url` (unset: embedded under `dir`) and `max_connections`,
    /// checked; the error is the line `check` and `serve` print.
    pub fn parse(
        url: Option<&str>,
        max_connections: u32,
        dir: &Path,
    ) -> Result<Settings, SettingsError> {
        if max_connections == 0 {
            return Err(SettingsError::NoConnections);
        }
        let backend = match url {
            None => Backend::Embedded(dir.to_path_buf()),
            Some(u) if u.starts_with("postgresql://") || u.starts_with("postgres://") => {
                Backend::Postgres(u.to_owned())
            }
            Some(u) => return Err(SettingsError::NotPostgres(redact(u))),
        };
        Ok(Settings {
            backend,
            max_connections,
        })
    }

    /// Where the store is, for lines and status (a URL without its password).
    pub fn place(&self) -> String {
        match &self.backend {
            Backend::Embedded(dir) => dir.join(EMBEDDED_FILE).display().to_string(),
            Backend::Postgres(url) => redact(url),
        }
    }
}

/// `url` with any password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((auth, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// `[state]` that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `max_connections = 0`.
    #[error("state.max_connections must be at least 1")]
    NoConnections,
    /// A URL of another database (its password hidden).
    #[error("state.url: '{0}' is not postgresql://…; leave it unset for the embedded store")]
    NotPostgres(String),
}

/// A state store that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database (or its file) failed.
    #[error("state store {place}: {message}")]
    Database {
        /// Where ([`Settings::place`]).
        place: String,
        /// What it said.
        message: String,
    },
    /// The database was migrated by a newer binary.
    #[error(
        "state store {place}: schema version {found} is newer than this pluginsync-master knows ({known}): upgrade pluginsync-master"
    )]
    Newer {
        /// Where.
        place: String,
        /// The database's version.
        found: i64,
        /// The newest this binary knows.
        known: i64,
    },
}

/// One environment's rollout commands' state, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandRow {
    /// The environment.
    pub environment: String,
    /// The logical clock of the last change.
    pub clock: u64,
    /// The master that made it.
    pub origin: String,
    /// Halted since (unix seconds), and why.
    pub halt: Option<(i64, String)>,
    /// The generation everyone is served.
    pub promoted: Option<GenerationId>,
    /// Generations withdrawn, oldest first.
    pub withdrawn: Vec<GenerationId>,
    /// The generation the gate no longer halts on.
    pub waived: Option<GenerationId>,
    /// Generations promoted earlier, still everyone's unless withdrawn.
    pub promoted_before: Vec<GenerationId>,
}

/// One node's last record, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Its certname.
    pub certname: String,
    /// Its environment.
    pub environment: String,
    /// The generation it reported (or was served).
    pub generation: Option<GenerationId>,
    /// When it was heard, unix milliseconds.
    pub last_seen_ms: u64,
    /// `report` or `served`.
    pub source: String,
    /// Loads that succeeded.
    pub loads_ok: u32,
    /// Loads still failing.
    pub loads_failed: u32,
    /// The failing plugins' names.
    pub failed: Vec<String>,
}

/// A generation served to a node, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRow {
    /// The node's certname.
    pub certname: String,
    /// Its environment.
    pub environment: String,
    /// The generation a per-node answer or a listing named to it.
    pub generation: GenerationId,
    /// The master that served it ([`StateStore::origin`]).
    pub replica: String,
    /// When it was first served, unix milliseconds.
    pub at_ms: u64,
}

/// Nodes and failing nodes of one environment on one generation: all of
/// them, and those a replica served that generation (what the gate
/// counts, docs/rollouts.md#the-health-gate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TallyRow {
    /// The environment.
    pub environment: String,
    /// The generation (`None`: nodes with none yet).
    pub generation: Option<GenerationId>,
    /// Nodes, and how many of them report load failures.
    pub all: (u64, u64),
    /// The same, of the nodes served this generation.
    pub served: (u64, u64),
}

/// Which nodes an inventory page holds (docs/operating.md#the-fleet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageAsk {
    /// Only this environment's nodes.
    pub environment: Option<String>,
    /// Only nodes whose generation's hex id starts with this.
    pub generation: Option<String>,
    /// Only nodes reporting load failures.
    pub failing: bool,
    /// Only certnames after this one.
    pub after: Option<String>,
    /// At most this many nodes.
    pub limit: usize,
}

/// The state store (module docs): one connection to the embedded file,
/// serialized, or a pool of PostgreSQL's; each call one transaction.
pub struct StateStore {
    place: String,
    db: Db,
    /// This replica's name, when the database is shared (module docs).
    replica: OnceLock<String>,
}

/// The backend's connections.
enum Db {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(postgres::Pg),
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl StateStore {
    /// Opens the store of `settings` and brings its schema to this
    /// binary's version (refused when the database's is newer).
    pub fn open(settings: &Settings) -> Result<StateStore, StoreError> {
        let place = settings.place();
        let db = match &settings.backend {
            Backend::Embedded(dir) => Db::Sqlite(Mutex::new(
                sqlite::open(&dir.join(EMBEDDED_FILE)).map_err(|e| db_error(&place, e))?,
            )),
            Backend::Postgres(url) => Db::Postgres(
                postgres::Pg::open(url, settings.max_connections)
                    .map_err(|e| db_error(&place, e))?,
            ),
        };
        let store = StateStore {
            place,
            db,
            replica: OnceLock::new(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// A store in memory, gone with it: for a master whose store cannot
    /// be opened (logged) and for tests.
    pub fn in_memory() -> StateStore {
        let store = StateStore {
            place: "(memory)".into(),
            db: Db::Sqlite(Mutex::new(sqlite::in_memory())),
            replica: OnceLock::new(),
        };
        if let Err(e) = store.migrate() {
            tracing::error!(error = %e, "in-memory state store without its schema");
        }
        store
    }

    /// Where it is ([`Settings::place`]).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// `(the database's schema version, the newest this binary knows)`.
    pub fn schema(&self) -> Result<(i64, i64), StoreError> {
        let found = self.with(sqlite::version, postgres::Pg::version)?;
        Ok((found, known()))
    }

    /// Is the database answering now (a query with a deadline)?
    pub fn up(&self) -> Result<(), StoreError> {
        self.now().map(drop)
    }

    fn migrate(&self) -> Result<(), StoreError> {
        if let Db::Postgres(pg) = &self.db {
            let applied = pg
                .migrate(MIGRATIONS)
                .map_err(|e| db_error(&self.place, e))?;
            return match applied {
                Ok(versions) => {
                    for version in versions {
                        tracing::info!(place = %self.place, version, "state store schema migrated");
                    }
                    Ok(())
                }
                Err(found) => Err(StoreError::Newer {
                    place: self.place.clone(),
                    found,
                    known: known(),
                }),
            };
        }
        let (found, known) = self.schema()?;
        if found > known {
            return Err(StoreError::Newer {
                place: self.place.clone(),
                found,
                known,
            });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
            self.with(|c| sqlite::migrate(c, *version, sql), |_| Ok(()))?;
            tracing::info!(place = %self.place, version, "state store schema migrated");
        }
        Ok(())
    }

    /// Runs `lite` on the embedded file's connection or `pg` on the
    /// PostgreSQL pool; the error names the store.
    fn with<T>(
        &self,
        lite: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T>,
        pg: impl FnOnce(&postgres::Pg) -> Result<T, pgconn::PgError>,
    ) -> Result<T, StoreError> {
        match &self.db {
            Db::Sqlite(c) => lite(&mut lock(c)).map_err(|e| db_error(&self.place, e)),
            Db::Postgres(p) => pg(p).map_err(|e| db_error(&self.place, e)),
        }
    }

    /// Is it PostgreSQL (shared by replicas)?
    pub fn shared(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }

    /// The database's time, unix seconds.
    pub fn now(&self) -> Result<i64, StoreError> {
        self.with(sqlite::now, postgres::Pg::now)
    }

    /// This master's name (for a command's origin, a served row's
    /// replica): made once, then kept in `meta`; in a shared database
    /// each replica's own, made at start.
    pub fn origin(&self) -> Result<String, StoreError> {
        let made = || {
            let seed = format!(
                "{}-{:?}-{}",
                std::process::id(),
                std::time::SystemTime::now(),
                self.place
            );
            pluginsync_common::digest::Sha256::of(seed.as_bytes()).to_hex()[..16].to_owned()
        };
        if self.shared() {
            return Ok(self.replica.get_or_init(made).clone());
        }
        if let Some(o) = self.meta(ORIGIN_KEY)? {
            return Ok(o);
        }
        let origin = made();
        self.set_meta(ORIGIN_KEY, &origin)?;
        Ok(origin)
    }

    /// A value of `meta` (e.g. this master's origin name).
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| sqlite::meta(c, key), |p| p.meta(key))
    }

    /// Sets a value of `meta`.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.with(
            |c| sqlite::set_meta(c, key, value),
            |p| p.set_meta(key, value),
        )
    }

    /// Every environment's commands' state.
    pub fn commands(&self) -> Result<Vec<CommandRow>, StoreError> {
        self.with(sqlite::commands, postgres::Pg::commands)
    }

    /// Writes `rows` (each environment's new state) and one history row
    /// each for `action` issued `by`, in one transaction.
    pub fn write_commands(
        &self,
        rows: &[CommandRow],
        action: &str,
        by: &str,
    ) -> Result<(), StoreError> {
        self.with(
            |c| sqlite::write_commands(c, rows, action, by),
            |p| p.write_commands(rows, action, by),
        )
    }

    /// The history of `environment`'s commands, newest first, at most
    /// `limit`: `(at, action, by)`.
    pub fn history(
        &self,
        environment: &str,
        limit: usize,
    ) -> Result<Vec<(i64, String, String)>, StoreError> {
        self.with(
            |c| sqlite::history(c, environment, limit),
            |p| p.history(environment, limit),
        )
    }

    /// The generations kept per environment, oldest first.
    pub fn seen(&self) -> Result<Vec<(String, GenerationId)>, StoreError> {
        self.with(sqlite::seen, postgres::Pg::seen)
    }

    /// Adds `ids` to `environment`'s seen generations, keeping the newest
    /// `max`.
    pub fn add_seen(
        &self,
        environment: &str,
        ids: &[GenerationId],
        max: usize,
    ) -> Result<(), StoreError> {
        self.with(
            |c| sqlite::add_seen(c, environment, ids, max),
            |p| p.add_seen(environment, ids, max),
        )
    }

    /// The `max` most recently seen nodes.
    pub fn nodes(&self, max: usize) -> Result<Vec<NodeRow>, StoreError> {
        self.with(|c| sqlite::nodes(c, max), |p| p.nodes(max))
    }

    /// The record of `certname` and the generations served to it in its
    /// environment (oldest first), if stored.
    pub fn node(&self, certname: &str) -> Result<Option<(NodeRow, Vec<GenerationId>)>, StoreError> {
        self.with(|c| sqlite::node(c, certname), |p| p.node(certname))
    }

    /// Writes `rows` and `served` in one transaction (a node's record
    /// replaced only by a later one, a served row kept from its first).
    pub fn write_nodes(&self, rows: &[NodeRow], served: &[ServedRow]) -> Result<(), StoreError> {
        self.with(
            |c| sqlite::write_nodes(c, rows, served),
            |p| p.write_nodes(rows, served),
        )
    }

    /// Every generation served to a node still in the inventory.
    pub fn served(&self) -> Result<Vec<ServedRow>, StoreError> {
        self.with(sqlite::served, postgres::Pg::served)
    }

    /// Every environment's and generation's counts ([`TallyRow`]): one
    /// query, asked each second by a replica on a shared store.
    pub fn tallies(&self) -> Result<Vec<TallyRow>, StoreError> {
        self.with(sqlite::tallies, postgres::Pg::tallies)
    }

    /// The nodes `ask` matches in certname order, each with whether a
    /// replica served it the generation it has: one indexed query.
    pub fn page(&self, ask: &PageAsk) -> Result<Vec<(NodeRow, bool)>, StoreError> {
        self.with(|c| sqlite::page(c, ask), |p| p.page(ask))
    }

    /// Forgets the least recently seen nodes beyond `max` (and what was
    /// served to the nodes forgotten); how many nodes.
    pub fn prune_nodes(&self, max: usize) -> Result<usize, StoreError> {
        self.with(|c| sqlite::prune_nodes(c, max), |p| p.prune_nodes(max))
    }
}

/// The newest schema version this binary knows.
fn known() -> i64 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

fn db_error(place: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Database {
        place: place.to_owned(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u8) -> GenerationId {
        GenerationId(pluginsync_common::digest::Sha256::of(&[n]))
    }

    #[test]
    fn settings_name_the_backend_and_hide_passwords() {
        let dir = Path::new("/var/lib/pluginsync/generations");
        let s = Settings::parse(None, 4, dir).unwrap();
        assert_eq!(s.backend, Backend::Embedded(dir.into()));
        assert!(s.place().ends_with("state/pluginsync.sqlite"));
        let s = Settings::parse(Some("postgresql://ps:secret@db:5432/ps"), 4, dir).unwrap();
        assert_eq!(s.place(), "postgresql://ps:***@db:5432/ps");
        let e = Settings::parse(Some("mysql://u:pw@db/x"), 4, dir)
            .unwrap_err()
            .to_string();
        assert!(e.contains("state.url") && !e.contains("pw"), "{e}");
        assert!(Settings::parse(None, 0, dir).is_err());
    }

    #[test]
    fn the_file_is_the_masters_alone_and_keeps_what_was_written() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::embedded(dir.path());
        let store = StateStore::open(&settings).unwrap();
        assert_eq!(store.schema().unwrap(), (known(), known()));
        let row = CommandRow {
            environment: "production".into(),
            clock: 3,
            origin: "a".into(),
            halt: Some((2030, "halted by op".into())),
            promoted: Some(g(1)),
            withdrawn: vec![g(2), g(3)],
            waived: None,
            promoted_before: vec![g(4)],
        };
        store
            .write_commands(std::slice::from_ref(&row), "halt", "op")
            .unwrap();
        let node = NodeRow {
            certname: "n1".into(),
            environment: "production".into(),
            generation: Some(g(1)),
            last_seen_ms: 5000,
            source: "report".into(),
            loads_ok: 2,
            loads_failed: 1,
            failed: vec!["facter/bad.rb".into()],
        };
        let older = NodeRow {
            last_seen_ms: 4000,
            generation: None,
            ..node.clone()
        };
        let served = ServedRow {
            certname: "n1".into(),
            environment: "production".into(),
            generation: g(1),
            replica: store.origin().unwrap(),
            at_ms: 4500,
        };
        store
            .write_nodes(std::slice::from_ref(&node), std::slice::from_ref(&served))
            .unwrap();
        store.write_nodes(&[older], &[]).unwrap();
        store
            .add_seen("production", &[g(1), g(2), g(3)], 2)
            .unwrap();
        drop(store);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let file = dir.path().join(EMBEDDED_FILE);
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        let again = StateStore::open(&settings).unwrap();
        assert_eq!(again.commands().unwrap(), vec![row]);
        assert_eq!(
            again.nodes(10).unwrap(),
            vec![node],
            "an older record loses"
        );
        assert_eq!(again.served().unwrap(), vec![served]);
        let seen: Vec<_> = again.seen().unwrap().into_iter().map(|s| s.1).collect();
        assert_eq!(seen, vec![g(2), g(3)]);
        let history = again.history("production", 10).unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(
            (history[0].1.as_str(), history[0].2.as_str()),
            ("halt", "op")
        );
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused_with_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::embedded(dir.path());
        let store = StateStore::open(&settings).unwrap();
        store
            .with(|c| sqlite::migrate(c, known() + 1, "SELECT 1"), |_| Ok(()))
            .unwrap();
        drop(store);
        let e = StateStore::open(&settings).unwrap_err().to_string();
        assert!(e.contains("newer than this pluginsync-master"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn tallies_count_served_nodes_and_pages_walk_the_index() {
        let store = StateStore::in_memory();
        let node = |name: &str, generation: u8, failed: u32| NodeRow {
            certname: name.into(),
            environment: "production".into(),
            generation: Some(g(generation)),
            last_seen_ms: 1000,
            source: "report".into(),
            loads_ok: 1,
            loads_failed: failed,
            failed: Vec::new(),
        };
        let served = |name: &str, generation: u8| ServedRow {
            certname: name.into(),
            environment: "production".into(),
            generation: g(generation),
            replica: "r".into(),
            at_ms: 900,
        };
        let rows = [
            node("a", 1, 1),
            node("b", 1, 0),
            node("c", 1, 1),
            node("d", 2, 0),
        ];
        let to = [
            served("a", 1),
            served("b", 1),
            served("c", 2),
            served("d", 2),
        ];
        store.write_nodes(&rows, &to).unwrap();
        let mut t = store.tallies().unwrap();
        t.sort_by_key(|r| r.generation);
        let one = t.iter().find(|r| r.generation == Some(g(1))).unwrap();
        assert_eq!((one.all, one.served), ((3, 2), (2, 1)), "c only claims 1");
        let ask = PageAsk {
            failing: true,
            limit: 1,
            ..PageAsk::default()
        };
        let page = store.page(&ask).unwrap();
        assert_eq!((page[0].0.certname.as_str(), page[0].1), ("a", true));
        let next = PageAsk {
            after: Some("a".into()),
            ..ask
        };
        let page = store.page(&next).unwrap();
        assert_eq!((page[0].0.certname.as_str(), page[0].1), ("c", false));
        let prefix = PageAsk {
            generation: Some(g(2).to_hex()[..6].to_owned()),
            limit: 10,
            ..PageAsk::default()
        };
        assert_eq!(store.page(&prefix).unwrap().len(), 1);
    }

    #[test]
    fn nodes_beyond_the_bound_are_forgotten_least_recent_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&Settings::embedded(dir.path())).unwrap();
        let rows: Vec<NodeRow> = (0..5u64)
            .map(|i| NodeRow {
                certname: format!("n{i}"),
                environment: "production".into(),
                generation: None,
                last_seen_ms: 1000 + i,
                source: "served".into(),
                loads_ok: 0,
                loads_failed: 0,
                failed: Vec::new(),
            })
            .collect();
        store.write_nodes(&rows, &[]).unwrap();
        assert_eq!(store.prune_nodes(3).unwrap(), 2);
        let names: Vec<_> = store
            .nodes(10)
            .unwrap()
            .into_iter()
            .map(|n| n.certname)
            .collect();
        assert_eq!(names, ["n4", "n3", "n2"]);
    }
}
