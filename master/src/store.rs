//! The set of environment indexes and how they are (re)built.
//!
//! Handlers call [`Store::get`], which returns the current `Arc<EnvIndex>`
//! of an environment without blocking on I/O in the common case.
//!
//! **Lazily** (docs/master.md#many-environments): startup
//! builds nothing before listening. An environment is indexed the first
//! time it is asked for (that request waits for that environment only,
//! and concurrent first requests share one build: one lock per
//! environment), and in the background by the warmer ([`Store::warm`]),
//! one environment at a time, those named in `index.warm` first. The
//! health check answers `starting` until the environments *named* in
//! `index.warm` are indexed (an unindexed environment is served correctly,
//! only later; a named one is what the operator asked to have hot).
//!
//! **Rebuilds** run on the blocking pool, at most one per core at once,
//! from the watcher when files change and on explicit re-indexes; they
//! touch only environments that are indexed ([`Store::refresh`]): one that
//! is not is read whole, as it is then, on its next request anyway. An
//! index is replaced whole, so a request sees either the old tree or the
//! new one, never a mix.
//!
//! **The first build is watched** (docs/master.md#many-environments): every
//! build first asks the watcher to watch the environment's directory
//! ([`Store::watch_before_walk`]), so a change made while the walk runs is
//! an event; an event for an environment whose first build is running
//! rebuilds it once that build is done. An untouched tree sees no event and
//! is built once.
//!
//! **Idle drop**: an index not asked for in `index.idle_drop` is dropped
//! ([`Store::drop_idle`]) and its file digests kept (a few dozen bytes a
//! file, keyed by the file's [`FileSig`](crate::walk::FileSig)), so its
//! next request walks and stats the tree again but reads no unchanged file.
//! Never under `index.publish = "explicit"` (a rebuild would publish what
//! the operator has not), never while the watcher holds a deploy.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use pluginsync_common::envname::EnvName;
use pluginsync_common::mutex::lock;

use crate::environments;
use crate::generations::Generations;
use crate::index::{EnvIndex, Hashing, Mount};
use crate::metrics::Metrics;
pub use crate::metrics::Stats;
use crate::walk::KeptDigests;

mod idle;
mod pins;
mod publish;

pub use self::pins::PlacedError;

/// One indexed environment and when it was last asked for.
#[derive(Debug)]
struct Slot {
    index: Arc<EnvIndex>,
    /// Milliseconds since [`Store::epoch`] of the last [`Store::get`].
    used: AtomicU64,
}

/// What [`Store::get`] found for an environment name.
#[derive(Debug)]
pub enum Lookup {
    /// Its current index.
    Found(Arc<EnvIndex>),
    /// No such environment on disk.
    Unknown,
    /// Not indexed, and a deploy of it is in progress (held by the
    /// watcher): ask again later.
    Deploying,
    /// Not indexed: its first build could not read part of the tree
    /// (docs/master.md#unreadable-files). Nothing is served rather than a
    /// smaller tree; tried again on a request [`RETRY_UNREADABLE`] later.
    Unreadable,
}

/// How long after a first build that could not read its tree a request
/// answers [`Lookup::Unreadable`] without trying again: the `Retry-After`
/// of that answer.
pub const RETRY_UNREADABLE: Duration = Duration::from_secs(5);

/// What the store reads of the config: where the environments are, the
/// `[index]` settings and the `[generations]` limits. `config.rs` makes it
/// (`MasterConfig::store_settings`);
/// the store never reads the config file's types.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `environmentpath`, `basemodulepath`, `index.allow_external_roots`.
    pub layout: environments::Layout,
    /// `[index]`.
    pub index: crate::index::Settings,
    /// `[generations]`.
    pub generations: crate::generations::Limits,
    /// `[trust] root`: publish only signed generations (`None`: all).
    pub trust: Option<crate::trust::signed::Settings>,
}

/// Every environment's index.
#[derive(Debug)]
pub struct Store {
    settings: Settings,
    envs: RwLock<HashMap<EnvName, Slot>>,
    /// One build lock per environment: concurrent first requests, the
    /// warmer and the watcher never build the same environment twice at
    /// once, and never wait for another environment's build.
    locks: Mutex<HashMap<EnvName, Arc<tokio::sync::Mutex<()>>>>,
    /// Builds running at once, at most one per core.
    builders: tokio::sync::Semaphore,
    /// Digests of the indexes dropped for being idle, for their next build.
    kept: Mutex<HashMap<EnvName, Arc<KeptDigests>>>,
    /// Environments whose deploy the watcher holds: never dropped.
    held: Mutex<BTreeSet<EnvName>>,
    /// Environments whose first build is running: a change the watcher
    /// reports for one rebuilds it once that build is done
    /// ([`Store::refresh`]).
    first_builds: Mutex<BTreeSet<EnvName>>,
    /// Called before each walk: the watcher's (docs/master.md#many-environments).
    before_walk: OnceLock<BeforeWalk>,
    /// Environments with no index whose last build could not read part
    /// of the tree, and when (docs/master.md#unreadable-files).
    unreadable: Mutex<HashMap<EnvName, Instant>>,
    epoch: Instant,
    /// True once the environments named in `index.warm` are indexed.
    ready: AtomicBool,
    /// True once the warmer is done (every `index.warm` target tried).
    warmed: AtomicBool,
    /// True once the watcher's initial watches are in place (or there is
    /// no watcher).
    watching: AtomicBool,
    /// Counters.
    pub stats: Stats,
    /// The labelled metrics (docs/operating.md#master-metrics).
    pub metrics: Metrics,
    /// True once SIGTERM/SIGINT arrived: the health check answers 503.
    pub draining: AtomicBool,
    /// The served certificate's validity: outside it, the health check
    /// answers 503.
    pub certificate: crate::tls::Validity,
    /// The generations each publication made, kept on disk
    /// (docs/deploys.md#generations).
    pub generations: Generations,
    /// Environments whose last build was not published (a tree that
    /// changed under the walk, a store that failed): built again
    /// `index.settle` later ([`Store::retrier`]).
    retry: Mutex<BTreeSet<EnvName>>,
    retry_wake: tokio::sync::Notify,
    /// Stock agents kept on one generation for a run (docs/protocol.md §7.6).
    pins: pins::Pins,
    /// Which generations are signed, under `[trust] root`
    /// (docs/trust.md#what-the-masters-serve).
    pub signatures: crate::trust::signed::Signatures,
    /// Environments whose tree is not signed (yet): built again when the
    /// signed metadata changes (`store/publish.rs`).
    unsigned: Mutex<BTreeSet<EnvName>>,
}

/// What a build calls before walking an environment (its name and
/// directory): the watcher watches that directory, if it does not yet.
pub struct BeforeWalk(Box<WalkHook>);

/// The function in a [`BeforeWalk`].
type WalkHook = dyn Fn(&EnvName, &Path) + Send + Sync;

impl std::fmt::Debug for BeforeWalk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeWalk")
    }
}

/// An environment's first build in progress, in `Store::first_builds`
/// until dropped.
struct FirstBuild<'a>(&'a Store, EnvName);

impl<'a> FirstBuild<'a> {
    fn start(store: &'a Store, name: &EnvName) -> Self {
        lock(&store.first_builds).insert(name.clone());
        FirstBuild(store, name.clone())
    }
}

impl Drop for FirstBuild<'_> {
    fn drop(&mut self) {
        lock(&self.0.first_builds).remove(&self.1);
    }
}

/// Which environments a [`Store::rebuild`] or [`Store::refresh`] covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every environment, and the store forgets those gone from disk.
    Every,
    /// These environments only.
    Only(Vec<EnvName>),
}

impl Store {
    /// An empty store.
    pub fn new(settings: Settings) -> Arc<Self> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(Store {
            envs: RwLock::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            builders: tokio::sync::Semaphore::new(cores),
            kept: Mutex::new(HashMap::new()),
            held: Mutex::new(BTreeSet::new()),
            first_builds: Mutex::new(BTreeSet::new()),
            before_walk: OnceLock::new(),
            unreadable: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            ready: AtomicBool::new(false),
            warmed: AtomicBool::new(false),
            watching: AtomicBool::new(false),
            stats: Stats::default(),
            metrics: Metrics::new(),
            draining: AtomicBool::new(false),
            certificate: crate::tls::Validity::default(),
            generations: Generations::new(&settings.generations),
            retry: Mutex::new(BTreeSet::new()),
            retry_wake: tokio::sync::Notify::new(),
            pins: pins::Pins::new(settings.generations.pin),
            signatures: crate::trust::signed::Signatures::new(settings.trust.clone()),
            unsigned: Mutex::new(BTreeSet::new()),
            settings,
        })
    }

    /// What the store reads of the config.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// True once the environments named in `index.warm` are indexed: what
    /// the health check reports (docs/master.md#many-environments).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// True once the warmer has tried every `index.warm` target.
    pub fn is_warmed(&self) -> bool {
        self.warmed.load(Ordering::Acquire)
    }

    /// True once the watcher watches every environment (set up in the
    /// background: a watch per directory takes a while on many
    /// environments), or there is no watcher.
    pub fn is_watching(&self) -> bool {
        self.watching.load(Ordering::Acquire)
    }

    /// Has `hook` called before every walk of an environment, with its
    /// name and directory: the watcher watches the directory there, so the
    /// first build of an environment is covered by its watch
    /// (docs/master.md#many-environments). Set once, before any build.
    pub fn watch_before_walk(&self, hook: impl Fn(&EnvName, &Path) + Send + Sync + 'static) {
        let _set_once = self.before_walk.set(BeforeWalk(Box::new(hook)));
    }

    /// Marks the watcher's initial watches as in place.
    pub fn set_watching(&self) {
        self.watching.store(true, Ordering::Release);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The current index of `name`, building it if the environment exists
    /// on disk but has no index yet (this call then waits for that build
    /// only, shared with any concurrent caller).
    ///
    /// An environment with no index whose deploy the watcher holds is
    /// [`Lookup::Deploying`], never built: there is no complete index to
    /// hold, and a listing read from a half-written tree would make agents
    /// purge what the deploy has not written yet (docs/protocol.md §4.7;
    /// the handler answers 503 with `Retry-After`).
    pub async fn get(self: &Arc<Self>, name: &EnvName) -> Lookup {
        if let Some(idx) = self.current(name) {
            return Lookup::Found(idx);
        }
        if environments::find_environment(&self.settings.layout, name).is_none() {
            return Lookup::Unknown;
        }
        if self.is_held(name) {
            return Lookup::Deploying;
        }
        self.build(name, false).await;
        match self.current(name) {
            Some(idx) => Lookup::Found(idx),
            None if self.is_held(name) || self.is_waiting(name) => Lookup::Deploying,
            None if lock(&self.unreadable).contains_key(name) => Lookup::Unreadable,
            None => Lookup::Unknown,
        }
    }

    /// Whether the watcher holds a deploy of `name` now.
    fn is_held(&self, name: &EnvName) -> bool {
        lock(&self.held).contains(name)
    }

    /// The index of `name` if it is indexed, marked as used now.
    fn current(&self, name: &EnvName) -> Option<Arc<EnvIndex>> {
        let envs = self.read();
        let slot = envs.get(name)?;
        slot.used.store(self.now_ms(), Ordering::Relaxed);
        Some(slot.index.clone())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<EnvName, Slot>> {
        self.envs.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<EnvName, Slot>> {
        self.envs.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Snapshot of every current index.
    pub fn all(&self) -> Vec<Arc<EnvIndex>> {
        let mut v: Vec<_> = self.read().values().map(|s| s.index.clone()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The names of the environments indexed now.
    pub fn indexed(&self) -> Vec<EnvName> {
        let mut v: Vec<_> = self.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// Builds (or, with `again`, rebuilds) one environment, under its own
    /// lock. Without `again` an indexed environment is left as it is, so
    /// concurrent first requests wait for the first one's build and share
    /// it; with `again` it is always built anew (the caller saw a change
    /// that a build already running may have missed).
    async fn build(self: &Arc<Self>, name: &EnvName, again: bool) {
        let env_lock = lock(&self.locks).entry(name.clone()).or_default().clone();
        let _guard = env_lock.lock().await;
        let failed = lock(&self.unreadable).get(name).copied();
        let failed = failed.is_some_and(|at| at.elapsed() < RETRY_UNREADABLE);
        if !again && (failed || self.read().contains_key(name) || self.is_unsigned(name)) {
            // Built (or found unreadable) by the caller this one waited
            // for, or just before: one build shared.
            return;
        }
        if !again && self.is_held(name) {
            // A first build (a request or the warmer) during a deploy the
            // watcher holds would index a half-written tree: the deploy's
            // release builds it (`refresh` after `hold(env, false)`).
            return;
        }
        let _first = (!again).then(|| FirstBuild::start(self, name));
        let Ok(_permit) = self.builders.acquire().await else {
            return;
        };
        let this = self.clone();
        let name = name.clone();
        let result = tokio::task::spawn_blocking(move || this.build_blocking(name)).await;
        if let Err(e) = result {
            tracing::error!(error = %e, "index build panicked");
        }
    }

    /// Rebuilds the environments of `scope` — [`Scope::Every`]: every
    /// environment on disk (and drops the indexes of those gone) —,
    /// indexing those not indexed yet too; after [`Scope::Every`] the store
    /// is ready and warmed. Tests use it; serving uses [`Store::refresh`],
    /// lazy builds and the warmer instead.
    pub async fn rebuild(self: &Arc<Self>, scope: Scope) {
        let everything = scope == Scope::Every;
        let targets = match scope {
            Scope::Only(n) => n,
            Scope::Every => {
                let mut all: Vec<EnvName> = environments::list_environments(&self.settings.layout)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                for n in self.indexed() {
                    if !all.contains(&n) {
                        all.push(n);
                    }
                }
                all
            }
        };
        for name in targets {
            self.build(&name, true).await;
        }
        if everything {
            self.ready.store(true, Ordering::Release);
            self.warmed.store(true, Ordering::Release);
        }
    }

    /// Rebuilds the environments of `scope` among those indexed now (an
    /// unindexed one is read as it is on its next request) and, for
    /// [`Scope::Only`] (the watcher saw them change), those whose first
    /// build is running: it walked under a watch, so the change may have
    /// come after it read that part of the tree; the rebuild waits for it
    /// and reads only what changed. With [`Scope::Every`], also forgets
    /// what it kept of environments gone from disk. What the watcher and
    /// explicit re-indexes call.
    pub async fn refresh(self: &Arc<Self>, scope: Scope) {
        let indexed = self.indexed();
        let targets: Vec<EnvName> = match scope {
            Scope::Only(n) => {
                let building = lock(&self.first_builds).clone();
                n.into_iter()
                    .filter(|n| indexed.contains(n) || building.contains(n))
                    .collect()
            }
            Scope::Every => {
                // The kept digests of dropped environments gone from disk.
                let on_disk: BTreeSet<EnvName> =
                    environments::list_environments(&self.settings.layout)
                        .into_iter()
                        .map(|(n, _)| n)
                        .collect();
                lock(&self.kept).retain(|n, _| on_disk.contains(n));
                indexed
            }
        };
        for name in targets {
            self.build(&name, true).await;
        }
    }

    /// An explicit re-index (the admin API, `pluginsync-master reindex`,
    /// SIGHUP): `env`, or every indexed environment; returns once the new
    /// indexes are served. Under `index.publish = "explicit"` this is the
    /// only way a changed tree is published (an environment not indexed
    /// yet is read as it is then, on its first request).
    pub async fn reindex(self: &Arc<Self>, env: Option<EnvName>, by: &str) {
        self.stats.reindexes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            env = env.as_ref().map(EnvName::as_str).unwrap_or("*"),
            by,
            "re-indexing on request"
        );
        self.refresh(env.map_or(Scope::Every, |e| Scope::Only(vec![e])))
            .await;
    }

    /// The background warmer: indexes the `index.warm` targets one at a
    /// time ([`warm_targets`]), then marks the store ready and warmed.
    /// Requests for other environments are not delayed by it beyond one
    /// build slot.
    pub async fn warm(self: Arc<Self>) {
        let on_disk: Vec<EnvName> = environments::list_environments(&self.settings.layout)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let (named, rest) = environments::warm_targets(&self.settings.index.warm, &on_disk);
        tracing::info!(
            named = named.len(),
            others = rest.len(),
            environments = on_disk.len(),
            "indexing in the background"
        );
        for name in &named {
            self.build(name, false).await;
        }
        self.ready.store(true, Ordering::Release);
        tracing::info!(indexed = named.len(), "ready");
        for name in &rest {
            self.build(name, false).await;
        }
        self.warmed.store(true, Ordering::Release);
        tracing::info!(
            indexed = self.stats.environments_indexed.load(Ordering::Relaxed),
            "background indexing done"
        );
    }

    /// Marks `env` as held (or no longer held) by the watcher during a
    /// deploy: a held environment is never dropped for idleness.
    pub fn hold(&self, env: &EnvName, held: bool) {
        let mut h = lock(&self.held);
        if held {
            h.insert(env.clone());
        } else {
            h.remove(env);
        }
    }

    fn build_blocking(&self, name: EnvName) {
        let Some(dir) = environments::find_environment(&self.settings.layout, &name) else {
            if self.write().remove(&name).is_some() {
                self.stats
                    .environments_indexed
                    .fetch_sub(1, Ordering::Relaxed);
                tracing::info!(env = %name, "environment removed");
            }
            lock(&self.kept).remove(&name);
            return;
        };
        if let Some(hook) = self.before_walk.get() {
            (hook.0)(&name, &dir);
        }
        let Ok(real_before) = std::fs::canonicalize(&dir) else {
            return self.retry_later(&name);
        };
        let started = Instant::now();
        let previous = self.read().get(&name).map(|s| s.index.clone());
        let kept = lock(&self.kept).remove(&name);
        let before = self.stats.files_hashed.load(Ordering::Relaxed);
        let idx = EnvIndex::build(
            &self.settings.layout,
            &self.settings.index,
            name.clone(),
            dir,
            previous.as_deref(),
            Hashing::Hash {
                files_hashed: &self.stats.files_hashed,
                kept: kept.as_deref(),
            },
        );
        if !idx.unreadable.is_empty() {
            if let Some(kept) = kept {
                lock(&self.kept).insert(name.clone(), kept);
            }
            return self.unreadable(&name, &idx, previous.is_some());
        }
        lock(&self.unreadable).remove(&name);
        let published = self.publish_generation(&name, &idx, &real_before);
        if published != publish::Publish::Done {
            if let Some(kept) = kept {
                lock(&self.kept).insert(name.clone(), kept);
            }
            return match published {
                publish::Publish::Unsigned => self.keep_signed(&name, previous.is_some()),
                _ => self.retry_later(&name),
            };
        }
        let hashed = self.stats.files_hashed.load(Ordering::Relaxed) - before;
        let walked = started.elapsed();
        idx.warm();
        let mounts = Mount::ALL.map(|m| {
            let (files, bytes) = idx.served(m);
            (m.as_str(), files, bytes)
        });
        self.metrics
            .index_built(name.as_str(), started.elapsed(), &mounts);
        tracing::info!(
            env = %name,
            plugins = idx.file_count(Mount::Plugins),
            pluginfacts = idx.file_count(Mount::Pluginfacts),
            hashed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            walk_ms = walked.as_millis() as u64,
            "index built"
        );
        self.stats.index_builds.fetch_add(1, Ordering::Relaxed);
        let (was, now) = (
            previous.as_ref().and_then(|p| p.generation.get().copied()),
            idx.generation.get().copied(),
        );
        let slot = Slot {
            index: Arc::new(idx),
            used: AtomicU64::new(self.now_ms()),
        };
        match self.write().insert(name.clone(), slot) {
            Some(old) => self.pins.retired(&name, old.index),
            None => {
                _ = self
                    .stats
                    .environments_indexed
                    .fetch_add(1, Ordering::Relaxed)
            }
        }
        // Every node that held the previous generation asks for this
        // delta next (docs/protocol.md §7.6): computed now, once, off the
        // first node's run, while the index is already served.
        if let (Some(was), Some(now)) = (was, now)
            && was != now
            && let Err(e) = self.generations.delta(&name, &was, &now)
        {
            tracing::debug!(env = %name, error = %e, "delta from the previous generation not computed");
        }
    }
}
