//! One generation per stock agent run (docs/protocol.md §7.6): a stock
//! Puppet agent asks for the `pluginfacts` listing, then `plugins`, then
//! the content it lacks, in separate requests; a deploy between them would
//! give it a mix no environment contained. A run's first request (Puppet
//! searches the `pluginfacts` mount before anything else,
//! `Puppet::Configurer::PluginHandler`) pins the certname to the
//! current generation for at most `generations.pin`; until the next run
//! starts or the window ends, its v3 requests are answered from that
//! generation's index, kept for the window after it was replaced (one
//! previous index per environment), its content read from the generation
//! store.
//!
//! Pins are in memory only, at most [`MAX_PINS`]; past the window (or once
//! the pinned generation is neither current nor the previous one) the node
//! gets the current generation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;

use super::lock;
use crate::index::EnvIndex;

/// Pins kept at most; beyond it the expired ones are dropped, then all.
pub const MAX_PINS: usize = 100_000;

/// See the module docs.
#[derive(Debug)]
pub(super) struct Pins {
    window: Duration,
    /// Each environment's index before its current one, and when it was
    /// replaced.
    previous: Mutex<HashMap<EnvName, (Arc<EnvIndex>, Instant)>>,
    /// (environment, certname) → the generation pinned, and since when.
    pins: Mutex<HashMap<(EnvName, String), (GenerationId, Instant)>>,
}

impl Pins {
    pub(super) fn new(window: Duration) -> Pins {
        Pins {
            window,
            previous: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
        }
    }

    /// `old` was replaced as `env`'s index: kept for the window only if a
    /// run in progress is pinned to its generation, so memory holds a
    /// second index of an environment only while a stock agent needs it
    /// (and expired previous indexes are dropped).
    pub(super) fn retired(&self, env: &EnvName, old: Arc<EnvIndex>) {
        if self.window.is_zero() {
            return;
        }
        let mut previous = lock(&self.previous);
        previous.retain(|_, (_, at)| at.elapsed() < self.window);
        let Some(old_gen) = old.generation.get() else {
            return;
        };
        let pinned = lock(&self.pins)
            .iter()
            .any(|((e, _), (g, at))| e == env && g == old_gen && at.elapsed() < self.window);
        if pinned {
            previous.insert(env.clone(), (old, Instant::now()));
        } else {
            previous.remove(env);
        }
    }

    /// The index `certname` is served for `env`, whose current index is
    /// `current`: the one of the generation it is pinned to, if that is
    /// the previous one and the pin is younger than the window; else
    /// `current` (pinning it there when it has no pin, or when the request
    /// `starts_run`).
    pub(super) fn index_for(
        &self,
        env: &EnvName,
        current: Arc<EnvIndex>,
        certname: &str,
        starts_run: bool,
    ) -> Arc<EnvIndex> {
        let Some(&now_gen) = current.generation.get() else {
            return current;
        };
        if self.window.is_zero() {
            return current;
        }
        let key = (env.clone(), certname.to_owned());
        let mut pins = lock(&self.pins);
        let pinned = match pins.get(&key) {
            Some(&(g, at)) if !starts_run && at.elapsed() < self.window => g,
            _ => {
                if pins.len() >= MAX_PINS {
                    pins.retain(|_, (_, at)| at.elapsed() < self.window);
                    if pins.len() >= MAX_PINS {
                        pins.clear();
                    }
                }
                pins.insert(key, (now_gen, Instant::now()));
                return current;
            }
        };
        drop(pins);
        if pinned == now_gen {
            return current;
        }
        let mut previous = lock(&self.previous);
        match previous.get(env) {
            Some((idx, at)) if at.elapsed() < self.window => {
                (idx.generation.get() == Some(&pinned)).then(|| idx.clone())
            }
            Some(_) => previous.remove(env).and(None),
            None => None,
        }
        .unwrap_or(current)
    }
}
