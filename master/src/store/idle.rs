//! Idle drop (docs/master.md#many-environments): an index not asked for
//! in `index.idle_drop` is dropped and its file digests kept, so its next
//! build walks and stats the tree but reads no unchanged file.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pluginsync_common::envname::EnvName;

use super::{Store, lock};
use crate::index::EnvIndex;
use crate::index::Publish;

impl Store {
    /// Drops the indexes not asked for in `idle` (keeping their digests);
    /// returns how many. Nothing under `index.publish = "explicit"`.
    pub fn drop_idle(&self, idle: Duration) -> usize {
        if self.settings.index.publish == Publish::Explicit || idle.is_zero() {
            return 0;
        }
        let cutoff = self.now_ms().saturating_sub(idle.as_millis() as u64);
        let held = lock(&self.held).clone();
        let locks = lock(&self.locks).clone();
        let dropped: Vec<(EnvName, Arc<EnvIndex>)> = {
            let mut envs = self.write();
            let idle: Vec<EnvName> = envs
                .iter()
                .filter(|(n, s)| s.used.load(Ordering::Relaxed) < cutoff && !held.contains(*n))
                .map(|(n, _)| n.clone())
                .collect();
            idle.into_iter()
                .filter_map(|n| {
                    // Not while it is being rebuilt: that build would put
                    // it back, and the digests kept here would linger.
                    let _building = match locks.get(&n) {
                        Some(l) => Some(l.try_lock().ok()?),
                        None => None,
                    };
                    envs.remove(&n).map(|s| (n, s.index))
                })
                .collect()
        };
        for (name, index) in &dropped {
            let digests = crate::walk::kept_digests(
                index
                    .mounts
                    .iter()
                    .flat_map(|m| m.roots.iter().flat_map(|r| r.nodes.iter())),
            );
            tracing::info!(env = %name, files = digests.len(), "idle: index dropped, digests kept");
            lock(&self.kept).insert(name.clone(), Arc::new(digests));
        }
        let n = dropped.len() as u64;
        self.stats.idle_drops.fetch_add(n, Ordering::Relaxed);
        self.stats
            .environments_indexed
            .fetch_sub(n, Ordering::Relaxed);
        n as usize
    }

    /// Drops idle indexes every `index.idle_drop / 4` (at least each
    /// second), for as long as the store lives; nothing when it is off.
    pub async fn idle_dropper(store: std::sync::Weak<Self>, idle: Duration) {
        if idle.is_zero() {
            return;
        }
        let period = (idle / 4).max(Duration::from_secs(1));
        loop {
            tokio::time::sleep(period).await;
            let Some(store) = store.upgrade() else { return };
            store.drop_idle(idle);
        }
    }
}
