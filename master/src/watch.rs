//! Keeping the indexes current: inotify events, debounced, plus a periodic
//! stat-only rescan as a backstop.
//!
//! Events are mapped to the environments they touch (a path under an
//! environmentpath entry names its environment; anything under a
//! basemodulepath entry, or an event that cannot be placed, touches every
//! environment). Access events are dropped: the master's own reads (hashing,
//! serving content) produce them, and reacting to them would rebuild forever
//! (every rebuild reads files, which makes more Access events). After the last event of a burst and a quiet
//! `debounce`, the touched environments are rebuilt; unchanged files keep
//! their digests, so only what changed is read again.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{EventKind, RecursiveMode, Watcher};
use pluginsync_common::envname::EnvName;
use tokio::sync::mpsc;

use crate::store::Store;

/// What a burst of events asks to rebuild.
#[derive(Debug, Default)]
struct Pending {
    all: bool,
    envs: BTreeSet<EnvName>,
}

/// Starts watching (when `index.watch` is on) and the periodic rescan (when
/// `index.rescan_interval` is non-zero). The returned guard keeps the
/// watcher alive; drop it to stop.
pub fn spawn(store: Arc<Store>) -> anyhow::Result<Option<notify::RecommendedWatcher>> {
    let config = store.config().clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<notify::Result<notify::Event>>();
    let watcher = if config.index.watch {
        let counted = store.clone();
        let mut w = notify::recommended_watcher(move |ev| {
            counted
                .stats
                .watch_events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _receiver_gone = tx.send(ev);
        })?;
        for dir in config
            .environmentpath
            .iter()
            .chain(config.basemodulepath.iter())
        {
            w.watch(dir, RecursiveMode::Recursive)
                .map_err(|e| anyhow::anyhow!("cannot watch '{}': {e} (raise fs.inotify.max_user_watches for very large trees, or set index.watch = false)", dir.display()))?;
        }
        Some(w)
    } else {
        None
    };
    let env_roots: Vec<PathBuf> = config
        .environmentpath
        .iter()
        .flat_map(|p| [p.clone(), p.canonicalize().unwrap_or_else(|_| p.clone())])
        .collect();
    let debounce = config.index.debounce;
    let rescan = config.index.rescan_interval;
    tokio::spawn(async move {
        let mut ticker = (!rescan.is_zero()).then(|| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + rescan, rescan);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let mut pending = Pending::default();
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { break };
                    classify(&ev, &env_roots, &mut pending);
                    // Collect the rest of the burst: until `debounce` passes
                    // with no new event, or 10 × debounce at most.
                    let deadline = tokio::time::Instant::now() + debounce * 10;
                    loop {
                        let quiet = tokio::time::sleep(debounce);
                        tokio::select! {
                            more = rx.recv() => match more {
                                Some(ev) => classify(&ev, &env_roots, &mut pending),
                                None => break,
                            },
                            _ = quiet => break,
                            _ = tokio::time::sleep_until(deadline) => break,
                        }
                    }
                }
                _ = async { match ticker.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                    pending.all = true;
                }
            }
            if pending.all {
                store.rebuild(None).await;
            } else if !pending.envs.is_empty() {
                store
                    .rebuild(Some(pending.envs.into_iter().collect()))
                    .await;
            }
        }
    });
    Ok(watcher)
}

fn classify(ev: &notify::Result<notify::Event>, env_roots: &[PathBuf], pending: &mut Pending) {
    let ev = match ev {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(error = %e, "watch error, rescanning everything");
            pending.all = true;
            return;
        }
    };
    if matches!(ev.kind, EventKind::Access(_)) {
        return;
    }
    if ev.need_rescan() {
        pending.all = true;
        return;
    }
    for path in &ev.paths {
        match env_of(path, env_roots) {
            Some(Some(env)) => {
                pending.envs.insert(env);
            }
            Some(None) => {} // a name that is not an environment
            None => pending.all = true,
        }
    }
}

/// `Some(Some(env))` for a path inside an environment, `Some(None)` for a
/// path under an environmentpath entry whose first component is not a valid
/// environment name, `None` for anything else (e.g. basemodulepath, or the
/// environmentpath directory itself: an environment was added or removed).
fn env_of(path: &Path, env_roots: &[PathBuf]) -> Option<Option<EnvName>> {
    for root in env_roots {
        if let Ok(rest) = path.strip_prefix(root) {
            let first = rest.components().next()?;
            return Some(first.as_os_str().to_str().and_then(|s| s.parse().ok()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_environments() {
        let roots = vec![PathBuf::from("/envs")];
        assert_eq!(
            env_of(Path::new("/envs/production/modules/a/lib/x.rb"), &roots),
            Some(Some("production".parse().unwrap()))
        );
        assert_eq!(env_of(Path::new("/envs/not-an-env/x"), &roots), Some(None));
        assert_eq!(env_of(Path::new("/envs"), &roots), None);
        assert_eq!(env_of(Path::new("/base/mod/lib/x.rb"), &roots), None);
    }
}
