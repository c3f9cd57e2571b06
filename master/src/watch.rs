//! Keeping the indexes current: inotify events, debounced, held while an
//! environment is being deployed, plus a periodic stat-only rescan as a
//! backstop (docs/internals.md#watch, docs/deploys.md).
//!
//! **What is watched.** Each environmentpath entry itself (not recursively:
//! environments appear, vanish and are flipped there), each environment's
//! *real* directory recursively, and each basemodulepath entry recursively.
//! An environment's directory is watched before any build walks it
//! (`Store::watch_before_walk` calls [`watch_env`]), so a file written while
//! the master builds its first index is an event like any other. inotify
//! watches an inode: the real paths are resolved again after every burst,
//! and a flipped link's new target (`production -> releases/3`), or a new
//! directory moved in under an environment's name (another inode at the
//! same path), is watched anew, the old one unwatched. Events carry real
//! paths, mapped back to environment names through that table.
//!
//! **Events.** Mapped to the environments they touch (anything under a
//! basemodulepath entry, or an event that cannot be placed, touches every
//! environment); access events are dropped (the master's own reads make
//! them). After a burst and a quiet `debounce` (at most 10 × `debounce`)
//! the touched environments are rebuilt, only if indexed (`Store::refresh`;
//! docs/master.md#many-environments); unchanged files keep their digests.
//!
//! **Deploys** (docs/deploys.md). An environment is taken to be deploying
//! when, in a burst, one of its directories was removed or renamed away
//! (depth 3 or less for renames: a module, its `lib/` or `facts.d/`,
//! `modules/`), git wrote inside it, or the burst never paused for
//! `debounce`. Its last complete index stays served until it has been
//! quiet for `index.settle`, `index.settle_max` has passed, or r10k wrote
//! its `.r10k-deploy.json`; a held environment is never dropped for being
//! idle (`Store::hold`). Ordinary edits are served after `debounce`.
//!
//! With `index.publish = "explicit"` nothing here runs: only the admin API,
//! `pluginsync-master reindex` and SIGHUP re-index.

mod events;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use notify::{EventKind, RecursiveMode, Watcher};
use pluginsync_common::envname::EnvName;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::environments;
use crate::index::Publish;
use crate::store::{Scope, Store};
use events::{Pending, Roots, classify};

/// An event as the watcher thread received it, stamped on arrival.
type Stamped = (Instant, notify::Result<notify::Event>);

/// A deploy in progress: when it was noticed and when it last changed.
#[derive(Debug, Clone, Copy)]
struct Deploy {
    since: Instant,
    last: Instant,
}

/// The watcher and the table of what it watches, shared by the watcher's
/// task and the builds that call [`watch_env`] before walking.
struct Watched {
    /// `None` with `index.watch = false` (the rescan still runs).
    watcher: Option<notify::RecommendedWatcher>,
    roots: Roots,
    /// The inode (device, number) of each watched real directory.
    inodes: BTreeMap<PathBuf, (u64, u64)>,
}

/// The inode of the directory at `path`, if it can be had.
fn inode_of(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The shared [`Watched`], through poisoning (each holder changes it in
/// one step).
fn lock(shared: &Mutex<Watched>) -> std::sync::MutexGuard<'_, Watched> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps the watcher task alive; dropping it stops watching.
#[derive(Debug)]
pub struct WatchGuard {
    task: tokio::task::AbortHandle,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// No inotify instance.
    #[error(transparent)]
    Start(#[from] notify::Error),
    /// A directory could not be watched. The notify error is part of the
    /// message, not a cause printed again after it.
    #[error("cannot watch '{}': {error} (raise fs.inotify.max_user_watches for very large trees, or set index.watch = false)", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// What notify said.
        error: notify::Error,
    },
}

/// Starts watching (when `index.watch` is on) and the periodic rescan (when
/// `index.rescan_interval` is non-zero); nothing with `index.publish =
/// "explicit"`. The returned guard keeps both alive; drop it to stop.
pub fn spawn(store: Arc<Store>) -> Result<Option<WatchGuard>, WatchError> {
    let config = store.settings().clone();
    if config.index.publish == Publish::Explicit {
        tracing::info!(
            "index.publish = \"explicit\": re-indexing only on the admin API, `reindex` or SIGHUP"
        );
        store.set_watching();
        return Ok(None);
    }
    let (tx, rx) = mpsc::unbounded_channel::<Stamped>();
    let roots = Roots {
        envpaths: config
            .layout
            .environmentpath
            .iter()
            .flat_map(|p| [p.clone(), p.canonicalize().unwrap_or_else(|_| p.clone())])
            .collect(),
        ..Roots::default()
    };
    let watcher = if config.index.watch {
        let counted = store.clone();
        let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            counted.stats.watch_events.fetch_add(1, Ordering::Relaxed);
            // The master's own reads (every file of every environment it
            // indexes) are access events: dropped here, not queued for
            // `classify` to drop (measured: hundreds of thousands of them
            // queued while environments were indexed).
            if matches!(&ev, Ok(e) if matches!(e.kind, EventKind::Access(_))) {
                return;
            }
            let _receiver_gone = tx.send((Instant::now(), ev));
        })?;
        let cannot = |dir: &Path, error: notify::Error| WatchError::Dir {
            dir: dir.to_owned(),
            error,
        };
        for dir in &config.layout.environmentpath {
            w.watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| cannot(dir, e))?;
        }
        for dir in &config.layout.basemodulepath {
            w.watch(dir, RecursiveMode::Recursive)
                .map_err(|e| cannot(dir, e))?;
        }
        Some(w)
    } else {
        None
    };
    let shared = Arc::new(Mutex::new(Watched {
        watcher,
        roots,
        inodes: BTreeMap::new(),
    }));
    if lock(&shared).watcher.is_some() {
        // Weak both ways: the store outlives no watcher, and the hook keeps
        // neither alive once the task is gone.
        let (weak_store, weak_shared) = (Arc::downgrade(&store), Arc::downgrade(&shared));
        store.watch_before_walk(move |name, dir| {
            if let (Some(store), Some(shared)) = (weak_store.upgrade(), weak_shared.upgrade()) {
                watch_env(&store, &shared, name, dir);
            }
        });
    }
    let task = tokio::spawn(async move {
        // Watching every environment recursively adds a watch per
        // directory: 20 s for 100 environments of 1,300 directories each
        // (measured). Done off the startup path, one directory at a time;
        // a build watches its own environment before walking it
        // (`watch_env`), so none is indexed unwatched and none needs a
        // second build here.
        if lock(&shared).watcher.is_some() {
            let (s, w) = (store.clone(), shared.clone());
            if let Err(e) = tokio::task::spawn_blocking(move || resync(&s, &w)).await {
                tracing::error!(error = %e, "cannot watch the environments: only the periodic rescan picks up changes");
                lock(&shared).watcher = None;
            }
        }
        store.set_watching();
        run(store, shared, rx).await
    });
    Ok(Some(WatchGuard {
        task: task.abort_handle(),
    }))
}

/// The watcher's loop: bursts, deploys held and released, rescans.
async fn run(
    store: Arc<Store>,
    shared: Arc<Mutex<Watched>>,
    mut rx: mpsc::UnboundedReceiver<Stamped>,
) {
    let index = store.settings().index.clone();
    let (debounce, settle, settle_max) = (index.debounce, index.settle, index.settle_max);
    let rescan = index.rescan_interval;
    let mut ticker = (!rescan.is_zero()).then(|| {
        let mut t = tokio::time::interval_at(Instant::now() + rescan, rescan);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut deploys: BTreeMap<EnvName, Deploy> = BTreeMap::new();
    // Without a watcher (`index.watch = false`) nothing ever sends: the
    // loop then waits for the rescan instead of ending
    // (`without_a_watch_the_rescan_still_picks_changes_up`).
    let mut events = true;
    loop {
        let mut pending = Pending::default();
        // The next held deploy due for publishing, if any.
        let due = deploys
            .values()
            .map(|d| (d.last + settle).min(d.since + settle_max))
            .min();
        tokio::select! {
            ev = rx.recv(), if events => {
                let Some((first, ev)) = ev else {
                    events = false;
                    continue;
                };
                classify(&ev, &lock(&shared).roots, &mut pending);
                // Collect the rest of the burst: until `debounce` passes
                // with no new event, or 10 × debounce at most. A burst cut
                // short that way whose events (as stamped when they
                // arrived, so a busy runtime cannot fake it) span half of
                // that without a pause is a tree that keeps changing.
                let deadline = Instant::now() + debounce * 10;
                let (mut last, mut paused) = (first, false);
                loop {
                    let quiet = tokio::time::sleep(debounce);
                    tokio::select! {
                        more = rx.recv() => match more {
                            Some((at, ev)) => {
                                paused |= at.saturating_duration_since(last) >= debounce;
                                last = at;
                                classify(&ev, &lock(&shared).roots, &mut pending);
                            }
                            None => break,
                        },
                        _ = quiet => break,
                        _ = tokio::time::sleep_until(deadline) => {
                            if !paused && last.saturating_duration_since(first) >= debounce * 5 {
                                let touched = pending.envs.clone();
                                pending.deploying.extend(touched);
                            }
                            break;
                        }
                    }
                }
            }
            _ = async { match ticker.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                pending.all = true;
            }
            _ = async { match due { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
        }
        // An environment whose directory is gone was removed, not deployed
        // (the events of its removal look like one now that its first
        // build watches it): rebuilt now, it is no longer served.
        pending
            .deploying
            .retain(|env| environments::find_environment(&store.settings().layout, env).is_some());
        let now = Instant::now();
        let mut ready = hold(&mut deploys, &pending, now, &store);
        release(&mut deploys, now, settle, settle_max, &mut ready);
        for env in &ready {
            store.hold(env, false);
        }
        resync(&store, &shared);
        let targets = targets(&pending, &deploys, ready, &store);
        if targets != Scope::Only(Vec::new()) {
            store.refresh(targets).await;
        }
    }
}

/// What a burst rebuilds: the environments `pending` touched and those
/// `ready` to publish, none whose deploy is held; everything for a rescan.
/// Only indexed ones are rebuilt (`Store::refresh`): one not indexed is
/// read as it is on its next request.
fn targets(
    pending: &Pending,
    deploys: &BTreeMap<EnvName, Deploy>,
    mut ready: BTreeSet<EnvName>,
    store: &Store,
) -> Scope {
    if pending.all && deploys.is_empty() {
        Scope::Every
    } else if pending.all {
        let indexed = store.indexed().into_iter();
        Scope::Only(indexed.filter(|n| !deploys.contains_key(n)).collect())
    } else {
        let touched = pending.envs.iter().filter(|n| !deploys.contains_key(*n));
        ready.extend(touched.cloned());
        Scope::Only(ready.into_iter().collect())
    }
}

/// Starts or extends the deploys `pending` shows; ends those r10k reported
/// done. Returns the environments to publish now.
fn hold(
    deploys: &mut BTreeMap<EnvName, Deploy>,
    pending: &Pending,
    now: Instant,
    store: &Store,
) -> BTreeSet<EnvName> {
    let mut ready = BTreeSet::new();
    for env in &pending.envs {
        let started = pending.deploying.contains(env) && !deploys.contains_key(env);
        if started {
            store.stats.deploys_held.fetch_add(1, Ordering::Relaxed);
            store.hold(env, true);
            tracing::info!(env = %env, "deploy in progress: serving the last complete index until it settles");
            deploys.insert(
                env.clone(),
                Deploy {
                    since: now,
                    last: now,
                },
            );
        } else if let Some(d) = deploys.get_mut(env) {
            d.last = now;
        }
    }
    for env in &pending.deployed {
        if let Some(d) = deploys.remove(env) {
            tracing::info!(env = %env, held_ms = (now - d.since).as_millis() as u64, "deploy done (.r10k-deploy.json): publishing");
            ready.insert(env.clone());
        }
    }
    ready
}

/// Moves the deploys quiet for `settle`, or held for `settle_max`, to
/// `ready`.
fn release(
    deploys: &mut BTreeMap<EnvName, Deploy>,
    now: Instant,
    settle: std::time::Duration,
    settle_max: std::time::Duration,
    ready: &mut BTreeSet<EnvName>,
) {
    deploys.retain(|env, d| {
        let quiet = now >= d.last + settle;
        let too_long = now >= d.since + settle_max;
        if quiet || too_long {
            let held_ms = (now - d.since).as_millis() as u64;
            if quiet {
                tracing::info!(env = %env, held_ms, "deploy settled: publishing");
            } else {
                tracing::warn!(env = %env, held_ms, "deploy still changing after index.settle_max: publishing anyway");
            }
            ready.insert(env.clone());
        }
        !(quiet || too_long)
    });
}

/// Watches every environment's current real directory, and only those:
/// a flipped symlink's old target is unwatched and its new one watched.
/// One directory per lock, so a build waiting in [`watch_env`] waits for
/// one watch, not for all of them.
fn resync(store: &Store, shared: &Mutex<Watched>) {
    let mut now: BTreeMap<PathBuf, BTreeSet<EnvName>> = BTreeMap::new();
    for (name, dir) in environments::list_environments(&store.settings().layout) {
        match dir.canonicalize() {
            Ok(real) => {
                now.entry(real).or_default().insert(name);
            }
            Err(e) => tracing::debug!(env = %name, error = %e, "cannot resolve the environment"),
        }
    }
    let gone: Vec<PathBuf> = (lock(shared).roots.envs.keys())
        .filter(|p| !now.contains_key(*p))
        .cloned()
        .collect();
    for gone in gone {
        let mut w = lock(shared);
        // A deleted directory's watches went with it: nothing to undo.
        if let Some(watcher) = w.watcher.as_mut()
            && let Err(e) = watcher.unwatch(&gone)
        {
            tracing::debug!(dir = %gone.display(), error = %e, "unwatch");
        }
        w.roots.envs.remove(&gone);
        w.inodes.remove(&gone);
        tracing::debug!(dir = %gone.display(), "no longer an environment's directory: unwatched");
    }
    for (real, names) in now {
        let mut w = lock(shared);
        // One that cannot be watched is tried again after the next event
        // or rescan.
        if w.is_watched(&real) || w.watch(&real, &names) {
            w.roots.envs.insert(real, names);
        }
    }
    let watched = lock(shared).roots.envs.len() as u64;
    store
        .stats
        .watched_environments
        .store(watched, Ordering::Relaxed);
}

/// Watches the real directory of environment `name` (at `dir`) unless it
/// is watched already: what a build calls before walking it
/// (`Store::watch_before_walk`), so every change made while it walks is an
/// event.
fn watch_env(store: &Store, shared: &Mutex<Watched>, name: &EnvName, dir: &Path) {
    let Ok(real) = dir.canonicalize() else {
        return; // the build finds no environment there either
    };
    let mut w = lock(shared);
    if w.is_watched(&real)
        && let Some(names) = w.roots.envs.get_mut(&real)
    {
        names.insert(name.clone());
        return;
    }
    let names = BTreeSet::from([name.clone()]);
    if w.watch(&real, &names) {
        w.roots.envs.insert(real, names);
        let watched = w.roots.envs.len() as u64;
        store
            .stats
            .watched_environments
            .store(watched, Ordering::Relaxed);
    }
}

impl Watched {
    /// Whether `real` is watched, and still the directory that was: one
    /// replaced under the same path since is not (its watches stayed
    /// with the old inode), and its stale watches are dropped here.
    fn is_watched(&mut self, real: &Path) -> bool {
        if !self.roots.envs.contains_key(real) {
            return false;
        }
        let now = inode_of(real);
        if now.is_some() && self.inodes.get(real) == now.as_ref() {
            return true;
        }
        tracing::debug!(dir = %real.display(), "an environment's directory was replaced: watching the new one");
        if let Some(watcher) = self.watcher.as_mut()
            && let Err(e) = watcher.unwatch(real)
        {
            // Gone with the old inode already.
            tracing::debug!(dir = %real.display(), error = %e, "unwatch");
        }
        self.roots.envs.remove(real);
        self.inodes.remove(real);
        false
    }

    /// Adds a recursive watch on `real`, the directory of `names`; false
    /// (said, with what to do about the watch limit) if it cannot be.
    fn watch(&mut self, real: &Path, names: &BTreeSet<EnvName>) -> bool {
        let Some(watcher) = self.watcher.as_mut() else {
            return false;
        };
        // Taken before the watch: a directory replaced in between looks
        // replaced at the next burst, and is watched again then.
        let inode = inode_of(real);
        match watcher.watch(real, RecursiveMode::Recursive) {
            Ok(()) => {
                if let Some(inode) = inode {
                    self.inodes.insert(real.to_owned(), inode);
                }
                let envs: Vec<&str> = names.iter().map(EnvName::as_str).collect();
                tracing::debug!(dir = %real.display(), envs = %envs.join(","), "watching");
                true
            }
            Err(e) if matches!(e.kind, notify::ErrorKind::MaxFilesWatch) => {
                tracing::warn!(dir = %real.display(), error = %e, "cannot watch an environment (raise fs.inotify.max_user_watches for very large trees)");
                false
            }
            Err(e) => {
                tracing::warn!(dir = %real.display(), error = %e, "cannot watch an environment");
                false
            }
        }
    }
}
