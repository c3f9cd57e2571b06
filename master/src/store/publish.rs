//! What decides whether a build is published (docs/deploys.md): a tree
//! that changed under the walk (docs/deploys.md#consistent-builds) or that
//! could not be read (docs/master.md#unreadable-files) is not; a build is
//! published only once its generation is in the generation store
//! (docs/deploys.md#generations). Builds set aside are tried again
//! `index.settle` later ([`Store::retrier`]).
//!
//! Under `[trust] root` (docs/trust.md#what-the-masters-serve), a build is
//! published only while its generation is signed (`trust/signed.rs`); an
//! unsigned one is warned about once per generation and the environment
//! keeps serving its previous index, or, with none in memory, the newest
//! signed generation it keeps ([`Store::keep_signed`]). The metadata is
//! read again every [`SIGNATURES_POLL`] when its files changed, and the
//! environments waiting for a signature are built again then.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pluginsync_common::envname::EnvName;

use super::{Slot, Store, lock};
use crate::environments;
use crate::generations::{Candidate, Published};
use crate::index::EnvIndex;
use crate::trust::signed::State;

/// How often the signed metadata's directory is looked at for changes.
pub const SIGNATURES_POLL: Duration = Duration::from_secs(1);

/// What became of a build ([`Store::publish_generation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publish {
    /// Its generation is stored: serve the index.
    Done,
    /// Not now (a tree changed under the walk, a store that failed):
    /// built again `index.settle` later.
    Retry,
    /// Not signed under `[trust] root`: built again when the signed
    /// metadata changes.
    Unsigned,
}

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
    /// before the index is served (docs/deploys.md#generations); not when
    /// the tree changed under the walk (docs/deploys.md#consistent-builds),
    /// the store failed, or, under `[trust] root`, it is not signed.
    pub(super) fn publish_generation(
        &self,
        name: &EnvName,
        idx: &EnvIndex,
        real_before: &Path,
    ) -> Publish {
        if !crate::generations::consistent(idx, real_before) {
            self.stats
                .inconsistent_builds
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(env = %name, "the environment changed during its index build (a link flipped); not published, built again after index.settle");
            return Publish::Retry;
        }
        let on_disk =
            |e: &EnvName| environments::find_environment(&self.settings.layout, e).is_some();
        let published = Candidate::of(idx).map_err(|e| e.to_string()).and_then(|c| {
            if !self.is_signed(name, &c) {
                return Ok(None);
            }
            (self.generations.publish(name, &c, &on_disk))
                .map(Some)
                .map_err(|e| e.to_string())
        });
        match published {
            Ok(None) => Publish::Unsigned,
            Ok(Some(Published::New(k))) => {
                tracing::info!(env = %name, generation = %k.id.short(), files = k.files, bytes = k.bytes, "generation published");
                let _once = idx.generation.set(k.id);
                Publish::Done
            }
            Ok(Some(Published::Unchanged(k))) => {
                let _once = idx.generation.set(k.id);
                Publish::Done
            }
            Err(error) => {
                self.generations.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(env = %name, %error, "generation not stored; the index is not published, built again after index.settle");
                Publish::Retry
            }
        }
    }

    /// Whether candidate `c` of `name` may be published: always without
    /// `[trust] root`; with it, only while signed (the metadata read again
    /// first if it changed). An unsigned one is warned about once.
    fn is_signed(&self, name: &EnvName, c: &Candidate) -> bool {
        if !self.signatures.is_on() {
            return true;
        }
        self.signatures.refresh();
        let state = self
            .signatures
            .state(name, &c.id, Some(c.bytes.len() as u64));
        if let State::Signed { .. } = state {
            lock(&self.unsigned).remove(name);
            return true;
        }
        lock(&self.unsigned).insert(name.clone());
        if self.signatures.first_refusal(name, &c.id) {
            let why = match &state {
                State::Unsigned(why) => why.clone(),
                other => other.describe(),
            };
            tracing::warn!(env = %name, generation = %c.id.short(), %why, "generation not published: not signed under [trust] root; still serving the last signed generation");
        }
        false
    }

    /// Whether `name`'s tree as last built waits for a signature.
    pub fn is_unsigned(&self, name: &EnvName) -> bool {
        lock(&self.unsigned).contains(name)
    }

    /// Whether a request for `name`, not indexed, should come back later
    /// (its build is retried, or its tree waits for a signature).
    pub(super) fn is_waiting(&self, name: &EnvName) -> bool {
        lock(&self.retry).contains(name) || self.is_unsigned(name)
    }

    /// After an unsigned build of `name`: its previous index stays served
    /// (`indexed`); with none in memory (a restart), the newest signed
    /// generation it keeps is served, made back from the generation store.
    pub(super) fn keep_signed(&self, name: &EnvName, indexed: bool) {
        if indexed {
            return;
        }
        let signed = self.generations.kept(name).into_iter().find(|k| {
            matches!(
                self.signatures.state(name, &k.id, None),
                State::Signed { .. }
            )
        });
        let Some(k) = signed else {
            return tracing::warn!(env = %name, "no signed generation kept: nothing served until the tree is signed");
        };
        let cannot = |error: String| {
            tracing::error!(env = %name, generation = %k.id.short(), %error, "the newest signed generation kept cannot be served");
        };
        let bytes = match self.generations.index_record(name, &k.id) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return cannot("not kept with its index".to_owned()),
            Err(e) => return cannot(e.to_string()),
        };
        let blobs = self.generations.stored_blobs();
        let idx = match EnvIndex::restore(&self.settings.index, name.clone(), k.id, &bytes, blobs) {
            Ok(idx) => idx,
            Err(e) => return cannot(e.to_string()),
        };
        idx.warm();
        tracing::info!(env = %name, generation = %k.id.short(), "serving the newest signed generation kept");
        let slot = Slot {
            index: Arc::new(idx),
            used: std::sync::atomic::AtomicU64::new(self.now_ms()),
        };
        if self.write().insert(name.clone(), slot).is_none() {
            self.stats
                .environments_indexed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many generations each environment keeps, for `/metrics`.
    pub fn generations_kept(&self) -> Vec<(String, u64)> {
        (self.generations.counts().into_iter())
            .map(|(e, n)| (e.to_string(), n as u64))
            .collect()
    }

    /// Each environment's kept generations by [`State`] label (signed,
    /// unsigned, expired); none without `[trust] root`. For `/metrics`.
    pub fn generation_states(&self) -> Vec<(String, [(&'static str, u64); 3])> {
        if !self.signatures.is_on() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (env, _) in self.generations.counts() {
            let mut counts = [("signed", 0), ("unsigned", 0), ("expired", 0)];
            for k in self.generations.kept(&env) {
                let label = self.signatures.state(&env, &k.id, None).label();
                if let Some(c) = counts.iter_mut().find(|(l, _)| *l == label) {
                    c.1 += 1;
                }
            }
            out.push((env.to_string(), counts));
        }
        out.sort();
        out
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
        if self.signatures.is_on() {
            tokio::spawn(self.clone().signatures_watch());
        }
        loop {
            self.retry_wake.notified().await;
            tokio::time::sleep(self.settings.index.settle).await;
            let names = std::mem::take(&mut *lock(&self.retry));
            for name in names {
                self.build(&name, true).await;
            }
        }
    }

    /// Every [`SIGNATURES_POLL`]: reads the signed metadata again if its
    /// files changed, then builds again the environments waiting for a
    /// signature, so a generation signed after its deploy is published
    /// without a restart.
    async fn signatures_watch(self: Arc<Self>) {
        loop {
            tokio::time::sleep(SIGNATURES_POLL).await;
            let this = self.clone();
            let changed = tokio::task::spawn_blocking(move || this.signatures.refresh()).await;
            if !changed.unwrap_or(false) {
                continue;
            }
            let waiting: Vec<EnvName> = lock(&self.unsigned).iter().cloned().collect();
            for name in waiting {
                self.build(&name, true).await;
            }
        }
    }
}
