//! What decides whether a build is published (docs/deploys.md): a tree
//! that changed under the walk (docs/deploys.md#consistent-builds) or that
//! could not be read (docs/master.md#unreadable-files) is not; a build is
//! published only once its generation is in the generation store
//! (docs/deploys.md#generations). Builds set aside are tried again
//! `index.settle` later ([`Store::retrier`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use pluginsync_common::envname::EnvName;

use super::{Store, lock};
use crate::environments;
use crate::generations::{Candidate, Published};
use crate::index::EnvIndex;

impl Store {
    /// A build of `name` that could not read part of its tree
    /// (docs/master.md#unreadable-files): logged at error level, counted,
    /// and not published, so the previous index (if `kept_previous`) stays
    /// served and agents never see a smaller tree.
    pub(super) fn unreadable(&self, name: &EnvName, idx: &EnvIndex, kept_previous: bool) {
        /// Paths logged one per line; the rest are counted.
        const LOGGED: usize = 20;
        for e in idx.unreadable.iter().take(LOGGED) {
            tracing::error!(env = %name, path = %e.path.display(), error = %e.error, "cannot read a served path");
        }
        let unreadable = idx.unreadable.len();
        self.metrics.index_error(name.as_str());
        if kept_previous {
            tracing::error!(env = %name, unreadable, "index not built: part of the environment cannot be read; still serving its previous index");
        } else {
            lock(&self.unreadable).insert(name.clone(), Instant::now());
            tracing::error!(env = %name, unreadable, "index not built: part of the environment cannot be read; not served until it can be");
        }
    }

    /// Makes `idx`'s generation and puts it in the generation store
    /// before the index is served (docs/deploys.md#generations); false
    /// when it must not be published: the tree changed under the walk
    /// (docs/deploys.md#consistent-builds) or the store failed.
    pub(super) fn publish_generation(
        &self,
        name: &EnvName,
        idx: &EnvIndex,
        real_before: &Path,
    ) -> bool {
        if !crate::generations::consistent(idx, real_before) {
            self.stats
                .inconsistent_builds
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(env = %name, "the environment changed during its index build (a link flipped); not published, built again after index.settle");
            return false;
        }
        let on_disk =
            |e: &EnvName| environments::find_environment(&self.settings.layout, e).is_some();
        let published = Candidate::of(idx).map_err(|e| e.to_string()).and_then(|c| {
            self.generations
                .publish(name, &c, &on_disk)
                .map_err(|e| e.to_string())
        });
        match published {
            Ok(Published::New(k)) => {
                tracing::info!(env = %name, generation = %k.id.short(), files = k.files, bytes = k.bytes, "generation published");
                let _once = idx.generation.set(k.id);
                true
            }
            Ok(Published::Unchanged(k)) => {
                let _once = idx.generation.set(k.id);
                true
            }
            Err(error) => {
                self.generations.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(env = %name, %error, "generation not stored; the index is not published, built again after index.settle");
                false
            }
        }
    }

    /// Has `name` built again `index.settle` from now ([`Store::retrier`]).
    pub(super) fn retry_later(&self, name: &EnvName) {
        lock(&self.retry).insert(name.clone());
        self.retry_wake.notify_one();
    }

    /// Builds again, `index.settle` after they were set aside, the
    /// environments whose last build was not published; runs for as long
    /// as the server does.
    pub async fn retrier(self: Arc<Self>) {
        loop {
            self.retry_wake.notified().await;
            tokio::time::sleep(self.settings.index.settle).await;
            let names = std::mem::take(&mut *lock(&self.retry));
            for name in names {
                self.build(&name, true).await;
            }
        }
    }
}
