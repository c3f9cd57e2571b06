//! The set of environment indexes and how they are (re)built.
//!
//! Handlers call [`Store::get`], which returns the current `Arc<EnvIndex>`
//! of an environment without blocking on I/O in the common case. Builds run
//! on the blocking pool: at startup for every environment, from the watcher
//! when files change, and once on first request for an environment created
//! since the last build. Builds are serialised by one async mutex so two
//! rebuilds of the same tree never race, and an index is replaced whole, so
//! a request sees either the old tree or the new one, never a mix.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use pluginsync_common::envname::EnvName;

use crate::config::MasterConfig;
use crate::environments;
use crate::index::{EnvIndex, Hashing, Mount};
use crate::metrics::Metrics;

/// Counters, exposed for tests and `/metrics`-style introspection.
#[derive(Debug, Default)]
pub struct Stats {
    /// Files actually read and hashed (digest reuse does not count).
    pub files_hashed: AtomicU64,
    /// Environment index builds completed.
    pub index_builds: AtomicU64,
    /// Listings answered with a body (200).
    pub listings_sent: AtomicU64,
    /// Listings answered `304 Not Modified`.
    pub listings_not_modified: AtomicU64,
    /// Listings answered with a delta (226, docs/protocol.md §7.5).
    pub listings_delta: AtomicU64,
    /// File bodies sent (`file_content` and blobs).
    pub contents_sent: AtomicU64,
    /// Listing requests answered from the listing cache (200 and 304).
    pub listing_cache_hits: AtomicU64,
    /// Listings serialised on the request path (cache misses); the
    /// standard listings are serialised by the index build instead.
    pub listings_serialised: AtomicU64,
    /// Listings evicted from the listing caches.
    pub listing_cache_evictions: AtomicU64,
    /// Filesystem events the watcher received.
    pub watch_events: AtomicU64,
    /// Deploys the watcher noticed and held back until they settled
    /// (README, "Deploys").
    pub deploys_held: AtomicU64,
    /// Environment directories the watcher watches now (real paths).
    pub watched_environments: AtomicU64,
    /// Explicit re-indexes: the admin API, `reindex`, SIGHUP.
    pub reindexes: AtomicU64,
}

/// Every environment's index.
#[derive(Debug)]
pub struct Store {
    config: Arc<MasterConfig>,
    envs: RwLock<HashMap<EnvName, Arc<EnvIndex>>>,
    build_lock: tokio::sync::Mutex<()>,
    /// Counters.
    pub stats: Stats,
    /// The labelled metrics (README, "Metrics").
    pub metrics: Metrics,
    /// True once SIGTERM/SIGINT arrived: the health check answers 503.
    pub draining: AtomicBool,
}

impl Store {
    /// An empty store.
    pub fn new(config: Arc<MasterConfig>) -> Arc<Self> {
        Arc::new(Store {
            config,
            envs: RwLock::new(HashMap::new()),
            build_lock: tokio::sync::Mutex::new(()),
            stats: Stats::default(),
            metrics: Metrics::new(),
            draining: AtomicBool::new(false),
        })
    }

    /// The config.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// The current index of `name`, building it if the environment exists
    /// on disk but has no index yet; `None` if there is no such environment.
    pub async fn get(self: &Arc<Self>, name: &EnvName) -> Option<Arc<EnvIndex>> {
        if let Some(idx) = self.read().get(name) {
            return Some(idx.clone());
        }
        environments::find_environment(&self.config, name)?;
        self.rebuild(Some(vec![name.clone()])).await;
        self.read().get(name).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<EnvName, Arc<EnvIndex>>> {
        self.envs.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Snapshot of every current index.
    pub fn all(&self) -> Vec<Arc<EnvIndex>> {
        let mut v: Vec<_> = self.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Rebuilds the named environments, or every environment (including
    /// new ones, and dropping removed ones) for `None`.
    pub async fn rebuild(self: &Arc<Self>, names: Option<Vec<EnvName>>) {
        let _guard = self.build_lock.lock().await;
        let this = self.clone();
        let result = tokio::task::spawn_blocking(move || this.rebuild_blocking(names)).await;
        if let Err(e) = result {
            tracing::error!(error = %e, "index build panicked");
        }
    }

    /// An explicit re-index (the admin API, `pluginsync-master reindex`,
    /// SIGHUP): `env`, or every environment; returns once the new indexes
    /// are served. Under `index.publish = "explicit"` this is the only way
    /// a changed tree is published.
    pub async fn reindex(self: &Arc<Self>, env: Option<EnvName>, by: &str) {
        self.stats.reindexes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            env = env.as_ref().map(EnvName::as_str).unwrap_or("*"),
            by,
            "re-indexing on request"
        );
        self.rebuild(env.map(|e| vec![e])).await;
    }

    fn rebuild_blocking(&self, names: Option<Vec<EnvName>>) {
        let targets: Vec<EnvName> = match names {
            Some(n) => n,
            None => {
                let mut all: Vec<EnvName> = environments::list_environments(&self.config)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                for existing in self.read().keys() {
                    if !all.contains(existing) {
                        all.push(existing.clone());
                    }
                }
                all
            }
        };
        for name in targets {
            let Some(dir) = environments::find_environment(&self.config, &name) else {
                if self
                    .envs
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&name)
                    .is_some()
                {
                    tracing::info!(env = %name, "environment removed");
                }
                continue;
            };
            let started = Instant::now();
            let previous = self.read().get(&name).cloned();
            let before = self.stats.files_hashed.load(Ordering::Relaxed);
            let idx = EnvIndex::build(
                &self.config,
                name.clone(),
                dir,
                previous.as_deref(),
                Hashing::Hash {
                    files_hashed: &self.stats.files_hashed,
                },
            );
            let hashed = self.stats.files_hashed.load(Ordering::Relaxed) - before;
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
                "index built"
            );
            self.envs
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, Arc::new(idx));
            self.stats.index_builds.fetch_add(1, Ordering::Relaxed);
        }
    }
}
