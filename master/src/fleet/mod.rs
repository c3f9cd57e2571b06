//! The fleet: the last thing the master heard from each node, in memory
//! (docs/operating.md#the-fleet).
//!
//! A node is heard on its per-node request: pluginsync's agent sends its
//! report there (`X-Pluginsync-Report`, docs/protocol.md §7.8: the
//! generation it committed and what its loads did); a stock Puppet agent
//! is recorded with the generation the master served its listing. The
//! record is keyed by the request's identity, never by anything the
//! report says, and a report that does not parse or breaks its bounds is
//! ignored (logged as a sample). Replicas share no records with each
//! other: they share one PostgreSQL store (below, docs/rollouts.md#replicas).
//!
//! Bounded: at most `[fleet] max_nodes` nodes, the least recently seen
//! forgotten first; per node at most 16 failing plugins' names.
//!
//! Kept: every record is also handed to the state store's writer
//! (`statestore/writer.rs`, behind the request), and a master on the
//! embedded store reads the stored nodes back at start
//! ([`Fleet::with_store`]), so a restart forgets neither the inventory nor
//! the gate's evidence. On a shared store (PostgreSQL) the inventory
//! pages, the gate's counts and the fleet series are read from the store
//! ([`page`]): the whole fleet, whichever replica heard each node; so a
//! replica reads no node at start and holds only those it heard since (a
//! node it has not, [`Fleet::record_of`] reads from the store).
//!
//! | file | answers |
//! |---|---|
//! | `mod.rs` | [`Fleet`]: what was heard, the counts, the inventory. |
//! | `nodes.rs` | A node in memory and as stored; the tally. |
//! | `page.rs` | An inventory page; on a shared store, the store's pages and counts. |

mod nodes;
mod page;

pub use page::{DEFAULT_PAGE, MAX_PAGE, Page, Query};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use pluginsync_common::config::ConfigError;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{MAX_FAILED_NAMED, MAX_NAME_CHARS, NodeReport, ReportError};
use serde::{Deserialize, Serialize};

use self::nodes::{Node, Nodes};
use crate::config::FleetConfig;
use crate::metrics::FleetCount;
use crate::sample::Sampler;
use crate::statestore::{StateStore, StoreError, Writer};

/// `GET` of the fleet's inventory, an admin API call
/// (docs/operating.md#the-fleet).
pub const INVENTORY_PATH: &str = "/pluginsync/v1/inventory";

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            max_nodes: 100_000,
            push_interval: None,
            pull_interval: None,
        }
    }
}

impl FleetConfig {
    /// Checks `[fleet]` (`MasterConfig::validate`); its retired
    /// intervals are only warned of (`MasterConfig::warnings`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_nodes == 0 {
            return Err(ConfigError::Invalid(
                "fleet.max_nodes must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// What a node's record rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// pluginsync's agent's report: the generation it committed, its loads.
    Report,
    /// What the master served (a stock Puppet agent): no load data.
    Served,
}

/// One node of the inventory, as `GET /pluginsync/v1/inventory` lists it
/// (docs/operating.md#the-fleet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The node's certname (its request's identity).
    pub certname: String,
    /// Its environment.
    pub environment: String,
    /// The generation it has (or was served); `null`: none yet.
    pub generation: Option<GenerationId>,
    /// When a replica last heard it (RFC 3339, UTC, milliseconds).
    pub last_seen: String,
    /// `report` or `served`.
    pub source: Source,
    /// Loads that succeeded.
    #[serde(default)]
    pub loads_ok: u32,
    /// Loads still failing.
    #[serde(default)]
    pub load_failures: u32,
    /// The failing plugins' names (at most 16).
    #[serde(default)]
    pub failed_plugins: Vec<String>,
    /// Whether a replica served the node `generation` (a per-node answer
    /// or a listing named it): only then does the health gate count it
    /// (docs/rollouts.md#the-health-gate); `false`: only claimed.
    #[serde(default)]
    pub verified: bool,
}

/// The inventory's JSON: every node, by certname.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Inventory {
    /// The nodes.
    pub nodes: Vec<NodeEntry>,
}

/// The fleet (module docs). One per master, in the handlers' shared state.
#[derive(Debug)]
pub struct Fleet {
    max_nodes: usize,
    nodes: Mutex<Nodes>,
    /// The state store's queue of records to write, if kept.
    writer: Option<Arc<Writer>>,
    /// This master's name in the store's `served` rows.
    replica: String,
    /// The fleet's counts from a shared store ([`page`]'s module docs).
    shared: Option<Arc<page::Shared>>,
    /// Reports ignored (malformed, oversized).
    pub bad_reports: Sampler,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Fleet {
    /// An empty fleet for `config`.
    pub fn new(config: &FleetConfig) -> Fleet {
        Fleet {
            max_nodes: config.max_nodes,
            nodes: Mutex::default(),
            writer: None,
            replica: String::new(),
            shared: None,
            bad_reports: Sampler::default(),
        }
    }

    /// [`Fleet::new`] kept in `store`: the nodes stored there read back
    /// (the `max_nodes` most recently seen), and every record written
    /// there behind the requests.
    pub fn with_store(config: &FleetConfig, store: Arc<StateStore>) -> Result<Fleet, StoreError> {
        let mut fleet = Fleet::new(config);
        fleet.replica = store.origin()?;
        if store.shared() {
            // The store answers pages and counts: a replica reads no node
            // at start, and keeps only those it hears (module docs).
            fleet.shared = Some(page::Shared::start(store.clone()));
            fleet.writer = Some(Writer::start(store, config.max_nodes, config.max_nodes));
            return Ok(fleet);
        }
        let rows = store.nodes(config.max_nodes)?;
        let mut served: HashMap<(String, String), Vec<GenerationId>> = HashMap::new();
        for s in store.served()? {
            served
                .entry((s.certname, s.environment))
                .or_default()
                .push(s.generation);
        }
        let now = now_ms();
        {
            let mut nodes = fleet.lock();
            for r in &rows {
                let key = (r.certname.clone(), r.environment.clone());
                let to_it = served.get(&key).map_or(&[][..], Vec::as_slice);
                if let Some(node) = Node::of_row(r, to_it, now) {
                    nodes.upsert(&r.certname, node, config.max_nodes);
                }
            }
        }
        tracing::info!(place = %store.place(), nodes = fleet.len(), "fleet read from the state store");
        fleet.writer = Some(Writer::start(store, config.max_nodes, config.max_nodes));
        Ok(fleet)
    }

    /// Writes the records not yet in the state store now (at shutdown),
    /// the latest `last_seen` of every node included; a failure is logged.
    pub fn flush(&self) {
        let Some(w) = &self.writer else { return };
        let mut nodes = self.lock();
        for (certname, node) in &mut nodes.by_name {
            if !node.is_written() {
                node.written_ms = node.seen_ms;
                w.push(node.row(certname));
            }
        }
        drop(nodes);
        if let Err(e) = w.flush() {
            tracing::error!(error = %e, "node reports heard last not written");
        }
    }

    /// Hands `node` of `certname` to the state store's writer, if kept
    /// and due ([`Node::due`]).
    fn persist(&self, certname: &str, node: &Node) {
        if let Some(w) = &self.writer
            && node.is_written()
        {
            w.push(node.row(certname));
        }
    }

    /// Records a node heard on its per-node request or a listing:
    /// `certname` is the request's identity; `report` the value of its
    /// `X-Pluginsync-Report` header, if any (a report that cannot be read
    /// is ignored and logged as a sample: nothing is recorded); without
    /// one, `served` is what the master served it (nothing: nothing
    /// recorded).
    pub fn heard(
        &self,
        certname: &str,
        env: &EnvName,
        report: Option<&[u8]>,
        served: Option<GenerationId>,
    ) {
        let read = report.map(|raw| {
            std::str::from_utf8(raw)
                .map_err(|e| ReportError::Malformed(e.to_string()))
                .and_then(NodeReport::from_header)
        });
        self.heard_read(certname, env, read.as_ref(), served);
    }

    /// [`Fleet::heard`] with the report already read (the request's
    /// `placement::Node`).
    pub fn heard_read(
        &self,
        certname: &str,
        env: &EnvName,
        report: Option<&Result<NodeReport, ReportError>>,
        served: Option<GenerationId>,
    ) {
        let report = match report {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                if let Some(n) = self.bad_reports.note() {
                    tracing::warn!(
                        certname,
                        error = %e,
                        ignored_since_last_line = n,
                        "node report ignored"
                    );
                }
                return;
            }
            None => None,
        };
        // One lock from reading the old record to keeping the new one, its
        // time read inside: a record kept meanwhile (a stock run report,
        // [`Fleet::heard_puppet_run`]) can never look newer than this one
        // by a clock read before it, and so never wins over it.
        let mut nodes = self.lock();
        let old = (nodes.by_name.get(certname)).filter(|old| old.env == *env);
        let mut node = match (report, served) {
            (Some(r), _) => Node {
                env: env.clone(),
                generation: r.generation,
                seen_ms: now_ms(),
                source: Source::Report,
                loads_ok: r.loads_ok,
                loads_failed: r.loads_failed,
                failed: r.failed.clone(),
                served: Vec::new(),
                verified: false,
                written_ms: 0,
            },
            (None, Some(generation)) => {
                // What its last Puppet run report said of this same
                // generation holds until the next report.
                let (loads_failed, failed) = old
                    .filter(|o| o.source == Source::Served && o.generation == Some(generation))
                    .map_or((0, Vec::new()), |o| (o.loads_failed, o.failed.clone()));
                Node {
                    env: env.clone(),
                    generation: Some(generation),
                    seen_ms: now_ms(),
                    source: Source::Served,
                    loads_ok: 0,
                    loads_failed,
                    failed,
                    served: Vec::new(),
                    verified: false,
                    written_ms: 0,
                }
            }
            (None, None) => return,
        };
        if let Some(old) = old {
            node.served.clone_from(&old.served);
        }
        // A shared store may hold another replica's later record: written.
        node.due(old, self.shared.is_some());
        if node.serve(served)
            && let (Some(w), Some(id)) = (&self.writer, served)
        {
            w.served(node.served_row(certname, id, &self.replica, node.seen_ms));
        }
        self.persist(certname, &node);
        nodes.upsert(certname, node, self.max_nodes);
    }

    /// Records what a stock agent's Puppet run report blames
    /// (docs/puppet-fleet.md#stock-agents-reports): `failed`, the plugins'
    /// names, on `generation`, which the master served it and which must
    /// still be its record's (else the report is older news and nothing is
    /// recorded); an empty `failed` clears its failures (a clean run).
    /// Names beyond [`MAX_FAILED_NAMED`] are counted, not kept. Returns
    /// whether it was recorded.
    pub fn heard_puppet_run(
        &self,
        certname: &str,
        env: &EnvName,
        generation: GenerationId,
        failed: &[String],
    ) -> bool {
        // One lock from the check to the write: a record heard meanwhile
        // (an agent's report, a newer listing) is never overwritten by
        // this older news.
        let mut nodes = self.lock();
        let Some(old) = (nodes.by_name.get(certname)).filter(|old| {
            old.source == Source::Served && old.env == *env && old.generation == Some(generation)
        }) else {
            return false;
        };
        let mut node = Node {
            env: env.clone(),
            generation: Some(generation),
            seen_ms: now_ms(),
            source: Source::Served,
            loads_ok: 0,
            loads_failed: u32::try_from(failed.len()).unwrap_or(u32::MAX),
            failed: (failed.iter().take(MAX_FAILED_NAMED))
                .map(|n| n.chars().take(MAX_NAME_CHARS).collect())
                .collect(),
            served: old.served.clone(),
            verified: false,
            written_ms: 0,
        };
        node.serve(None);
        node.due(Some(old), self.shared.is_some());
        self.persist(certname, &node);
        nodes.upsert(certname, node, self.max_nodes);
        true
    }

    /// The record of `certname`, if kept; on a shared store, one this
    /// replica has not heard is read from the store (a query: call it off
    /// the async runtime) and kept from then on.
    pub fn record_of(&self, certname: &str) -> Option<NodeEntry> {
        if let Some(n) = self.lock().by_name.get(certname) {
            return Some(n.entry(certname));
        }
        let (row, served) = self.shared.as_ref()?.node(certname)?;
        let node = Node::of_row(&row, &served, now_ms())?;
        let mut nodes = self.lock();
        nodes.upsert(certname, node, self.max_nodes);
        nodes.by_name.get(certname).map(|n| n.entry(certname))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nodes of `env` on `generation`, and how many of them report load
    /// failures, over the whole fleet (on a shared store, what every
    /// replica heard): only
    /// the nodes a replica served `generation` (a claim alone moves no
    /// gate, docs/rollouts.md#the-health-gate).
    pub fn on_generation(&self, env: &EnvName, generation: &GenerationId) -> (u64, u64) {
        if let Some(shared) = &self.shared {
            return shared.on_generation(env, generation);
        }
        self.lock()
            .verified
            .get(&(env.clone(), *generation))
            .copied()
            .unwrap_or_default()
    }

    /// Nodes kept now.
    pub fn len(&self) -> usize {
        self.lock().by_name.len()
    }

    /// Whether no node is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every node, by certname.
    pub fn inventory(&self) -> Inventory {
        let nodes = self.lock();
        let mut list: Vec<NodeEntry> = nodes.by_name.iter().map(|(c, n)| n.entry(c)).collect();
        drop(nodes);
        list.sort_by(|a, b| a.certname.cmp(&b.certname));
        Inventory { nodes: list }
    }

    /// The fleet series (docs/operating.md#master-metrics): per
    /// environment with generations kept here (`kept`), nodes and failing
    /// nodes per kept generation; the others are summed as `other`, nodes
    /// with none yet as `none`. So at most `keep + 2` series per such
    /// environment, whatever the nodes report.
    pub fn counts(&self, kept: impl Fn(&EnvName) -> Vec<GenerationId>) -> Vec<FleetCount> {
        let tally: Vec<_> = match &self.shared {
            Some(shared) => shared.tally(),
            None => (self.lock().tally.iter())
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        };
        let mut known: HashMap<EnvName, Vec<GenerationId>> = HashMap::new();
        let mut sums: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for ((env, generation), (n, failing)) in tally {
            let ids = known.entry(env.clone()).or_insert_with(|| kept(&env));
            if ids.is_empty() {
                continue;
            }
            let label = match generation {
                None => "none".to_owned(),
                Some(g) if ids.contains(&g) => g.to_hex(),
                Some(_) => "other".to_owned(),
            };
            let s = sums.entry((env.to_string(), label)).or_default();
            s.0 += n;
            s.1 += failing;
        }
        sums.into_iter()
            .map(|((environment, generation), (nodes, failing))| FleetCount {
                environment,
                generation,
                nodes,
                failing,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn env(s: &str) -> EnvName {
        s.parse().unwrap()
    }

    fn g(n: u8) -> GenerationId {
        GenerationId(pluginsync_common::digest::Sha256::of(&[n]))
    }

    fn fleet(max: usize) -> Fleet {
        let config = FleetConfig {
            max_nodes: max,
            ..FleetConfig::default()
        };
        Fleet::new(&config)
    }

    fn report(generation: GenerationId, failed: &[&str]) -> String {
        NodeReport {
            generation: Some(generation),
            loads_ok: 2,
            loads_failed: failed.len() as u32,
            failed: failed.iter().map(|s| s.to_string()).collect(),
        }
        .to_header()
    }

    #[test]
    fn reports_are_counted_per_generation_keyed_by_identity_and_bounded() {
        let f = fleet(3);
        let prod = env("production");
        let r = report(g(1), &["facter/bad.rb"]);
        let tick = || std::thread::sleep(Duration::from_millis(3));
        f.heard("a", &prod, Some(r.as_bytes()), Some(g(2)));
        tick();
        f.heard("b", &prod, Some(report(g(1), &[]).as_bytes()), None);
        tick();
        f.heard("c", &prod, None, Some(g(2)));
        tick();
        assert_eq!(
            f.on_generation(&prod, &g(1)),
            (0, 0),
            "a generation claimed but never served counts nothing"
        );
        assert_eq!(f.on_generation(&prod, &g(2)), (1, 0));
        assert!(!f.inventory().nodes[0].verified, "recorded as claimed");
        // Served the generation they report: counted.
        f.heard("a", &prod, Some(r.as_bytes()), Some(g(1)));
        tick();
        f.heard("b", &prod, Some(report(g(1), &[]).as_bytes()), Some(g(1)));
        tick();
        f.heard("c", &prod, None, Some(g(2)));
        tick();
        assert_eq!(f.on_generation(&prod, &g(1)), (2, 1));
        assert_eq!(f.on_generation(&prod, &g(2)), (1, 0));
        // A report that cannot be read changes nothing, for anyone.
        f.heard("b", &prod, Some(b"%7Bnot json"), Some(g(2)));
        f.heard("b", &prod, Some("x".repeat(5000).as_bytes()), Some(g(2)));
        assert_eq!(f.on_generation(&prod, &g(1)), (2, 1));
        assert_eq!(f.bad_reports.total(), 2);
        // A node moves: counted once, on its new generation.
        f.heard("a", &prod, Some(report(g(2), &[]).as_bytes()), None);
        assert_eq!(f.on_generation(&prod, &g(1)), (1, 0));
        assert_eq!(f.on_generation(&prod, &g(2)), (2, 0));
        // Beyond max_nodes the least recently seen go.
        tick();
        f.heard("d", &prod, None, Some(g(2)));
        assert_eq!(f.len(), 3);
        let names: Vec<_> = f
            .inventory()
            .nodes
            .into_iter()
            .map(|n| n.certname)
            .collect();
        assert!(!names.contains(&"b".to_owned()), "{names:?}");
    }

    #[test]
    fn a_stock_run_report_never_overwrites_a_record_heard_meanwhile() {
        // A Puppet run report of g1 races the node's listing of g2: in
        // either order the record ends on g2 (the report first, then
        // the listing; or the listing first, and the report is old news).
        let f = fleet(100_000);
        let prod = env("production");
        let bad = vec!["plugins/facter/broken.rb".to_owned()];
        const RUNS: usize = 20_000;
        let names: Vec<String> = (0..RUNS).map(|i| format!("n{i}")).collect();
        for n in &names {
            f.heard(n, &prod, None, Some(g(1)));
        }
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in &names {
                    barrier.wait();
                    f.heard_puppet_run(n, &prod, g(1), &bad);
                }
            });
            s.spawn(|| {
                for n in &names {
                    barrier.wait();
                    f.heard(n, &prod, None, Some(g(2)));
                }
            });
        });
        let lost: Vec<&String> = (names.iter())
            .filter(|n| f.record_of(n).and_then(|e| e.generation) != Some(g(2)))
            .collect();
        assert!(
            lost.is_empty(),
            "{} of {RUNS} listings lost: {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
    }

    #[test]
    fn stock_agents_run_reports_fail_them_on_the_generation_served() {
        let f = fleet(100);
        let prod = env("production");
        let bad = vec!["plugins/facter/broken.rb".to_owned()];
        // Nothing served: nothing recorded.
        assert!(!f.heard_puppet_run("s1", &prod, g(1), &bad));
        f.heard("s1", &prod, None, Some(g(1)));
        f.heard("s2", &prod, None, Some(g(1)));
        assert!(f.heard_puppet_run("s1", &prod, g(1), &bad));
        assert_eq!(f.on_generation(&prod, &g(1)), (2, 1));
        let e = f.record_of("s1").unwrap();
        assert_eq!((e.source, e.load_failures), (Source::Served, 1));
        assert_eq!(e.failed_plugins, bad);
        // Its next listing of the same generation keeps the failures.
        f.heard("s1", &prod, None, Some(g(1)));
        assert_eq!(f.on_generation(&prod, &g(1)), (2, 1));
        assert_eq!(f.record_of("s1").unwrap().load_failures, 1);
        // A report of a generation the node has left, or of another
        // environment, records nothing; a clean run clears.
        assert!(!f.heard_puppet_run("s1", &prod, g(2), &[]));
        assert!(!f.heard_puppet_run("s1", &env("staging"), g(1), &[]));
        assert!(f.heard_puppet_run("s1", &prod, g(1), &[]));
        assert_eq!(f.on_generation(&prod, &g(1)), (2, 0));
        // Moved on: served another generation, failing nothing there.
        f.heard_puppet_run("s2", &prod, g(1), &bad);
        f.heard("s2", &prod, None, Some(g(2)));
        assert_eq!(f.on_generation(&prod, &g(2)), (1, 0));
        // Many failures: counted, 16 named.
        let many: Vec<String> = (0..40).map(|i| format!("plugins/p{i}.rb")).collect();
        assert!(f.heard_puppet_run("s2", &prod, g(2), &many));
        let e = f.record_of("s2").unwrap();
        assert_eq!(
            (e.load_failures, e.failed_plugins.len()),
            (40, MAX_FAILED_NAMED)
        );
        // A pluginsync agent's report is not a stock agent's record.
        f.heard("a", &prod, Some(report(g(1), &[]).as_bytes()), None);
        assert!(!f.heard_puppet_run("a", &prod, g(1), &bad));
    }

    #[test]
    fn a_fleet_kept_in_the_store_reads_its_nodes_back() {
        use crate::statestore::Settings;
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::embedded(dir.path());
        let open = || Arc::new(StateStore::open(&settings).unwrap());
        let config = FleetConfig::default();
        let prod = env("production");
        let f = Fleet::with_store(&config, open()).unwrap();
        f.heard(
            "a",
            &prod,
            Some(report(g(1), &["x"]).as_bytes()),
            Some(g(1)),
        );
        f.heard("b", &prod, None, Some(g(2)));
        f.heard(
            "c",
            &prod,
            Some(report(g(1), &["x"]).as_bytes()),
            Some(g(2)),
        );
        f.flush();
        let before = f.inventory().nodes;
        assert_eq!(before.len(), 3);
        drop(f);
        let again = Fleet::with_store(&config, open()).unwrap();
        assert_eq!(again.inventory().nodes, before, "the same inventory");
        assert_eq!(
            again.on_generation(&prod, &g(1)),
            (1, 1),
            "what was served is kept: the same counts"
        );
    }

    /// A node's no-op runs cost no database write each: a record that
    /// differs from the stored one only in its time is written once a
    /// minute (docs/operating.md#the-fleet), any other change at once, and
    /// the latest time of every node at shutdown.
    #[test]
    fn a_record_changed_only_in_its_time_is_written_once_a_minute_and_at_shutdown() {
        use crate::statestore::Settings;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(StateStore::open(&Settings::embedded(dir.path())).unwrap());
        let f = Fleet::with_store(&FleetConfig::default(), store.clone()).unwrap();
        let prod = env("production");
        let writer = f.writer.clone().unwrap();
        let stored = || {
            writer.flush().unwrap();
            let rows = store.nodes(10).unwrap();
            let row = rows.into_iter().find(|r| r.certname == "a").unwrap();
            (row.generation, row.last_seen_ms)
        };
        let in_memory = || {
            let e = f.record_of("a").unwrap();
            let at = humantime::parse_rfc3339(&e.last_seen).unwrap();
            at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
        };
        let tick = || std::thread::sleep(Duration::from_millis(3));
        f.heard("a", &prod, None, Some(g(1)));
        let first = stored();
        assert_eq!(first, (Some(g(1)), in_memory()), "a new node: written");
        tick();
        f.heard("a", &prod, None, Some(g(1)));
        assert!(in_memory() > first.1);
        assert_eq!(stored(), first, "only its time changed: not written");
        tick();
        f.heard("a", &prod, Some(report(g(1), &["x"]).as_bytes()), None);
        let reported = stored();
        assert_eq!(
            reported.1,
            in_memory(),
            "its loads changed: written at once"
        );
        tick();
        f.heard("a", &prod, None, Some(g(2)));
        assert_eq!(
            stored(),
            (Some(g(2)), in_memory()),
            "moved: written at once"
        );
        let moved = stored();
        tick();
        f.heard("a", &prod, None, Some(g(2)));
        assert_eq!(stored(), moved);
        f.flush();
        assert_eq!(
            stored(),
            (Some(g(2)), in_memory()),
            "shutdown writes the latest"
        );
        // A minute after its last write, the same record is written again.
        let mut old = f.lock().by_name.get("a").cloned().unwrap();
        old.written_ms = old.seen_ms;
        let mut later = old.clone();
        let every = nodes::LAST_SEEN_EVERY.as_millis() as u64;
        later.seen_ms = old.seen_ms + every - 1;
        later.due(Some(&old), false);
        assert!(!later.is_written());
        later.due(Some(&old), true);
        assert!(later.is_written(), "always: a shared store");
        later.seen_ms = old.seen_ms + every;
        later.due(Some(&old), false);
        assert!(later.is_written());
    }

    #[test]
    fn series_are_bounded_by_kept_generations() {
        let there = fleet(100);
        let prod = env("production");
        there.heard("n1", &prod, Some(report(g(2), &[]).as_bytes()), Some(g(2)));
        for i in 0..50u8 {
            there.heard(&format!("m{i}"), &prod, None, Some(g(10 + i)));
        }
        there.heard("s", &env("staging"), None, Some(g(3)));
        let counts = there.counts(|e| {
            if e.as_str() == "production" {
                vec![g(2), g(10)]
            } else {
                Vec::new()
            }
        });
        let labels: Vec<_> = counts
            .iter()
            .map(|c| (c.generation.as_str(), c.nodes))
            .collect();
        assert_eq!(counts.len(), 3, "{labels:?}");
        assert!(labels.contains(&("other", 49)), "{labels:?}");
    }
}
