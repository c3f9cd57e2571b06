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
//! Off unless `generations.pin` is set; only the request that starts a run
//! pins, so a replica that did not see it serves the current generation.
//! Pins are in memory only, at most [`MAX_PINS`]; past the window (or once
//! the pinned generation is neither current nor the previous one) the node
//! gets the current generation.
//!
//! **Placed clients** (docs/rollouts.md#stock-puppet-agents): where a
//! `[[rollout]]` policy places a v3 client on a generation other than the
//! current one, its requests are answered from that generation's index
//! made back from the generation store ([`Store::placed_index`]; at most
//! [`MAX_PLACED`] kept in memory, the least recently used dropped). A
//! stock agent's run is pinned to the generation its first request was
//! placed on, whichever it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;

use super::{Store, lock};
use crate::generations::StoreError;
use crate::index::{EnvIndex, RecordError};

/// Indexes of generations other than the current ones kept in memory at
/// most (docs/rollouts.md#stock-puppet-agents).
pub const MAX_PLACED: usize = 8;

/// A generation a rollout places a client on that this master cannot
/// answer from.
#[derive(Debug, thiserror::Error)]
pub enum PlacedError {
    /// Not kept, or kept without its index (published by a master from
    /// before indexes were stored beside generations).
    #[error("generation {0} is not kept with its index")]
    NotStored(GenerationId),
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored index does not read back.
    #[error(transparent)]
    Record(#[from] RecordError),
}

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
    /// Indexes made back from the store, and when each was last used.
    placed: Mutex<HashMap<(EnvName, GenerationId), Placed>>,
    /// Generations that could not be made back, logged once each.
    failed: Mutex<std::collections::HashSet<(EnvName, GenerationId)>>,
}

/// An index made back from the store, and when it was last used.
type Placed = (Arc<EnvIndex>, Instant);

type PinMap = HashMap<(EnvName, String), (GenerationId, Instant)>;

impl Pins {
    pub(super) fn new(window: Duration) -> Pins {
        Pins {
            window,
            previous: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
            placed: Mutex::new(HashMap::new()),
            failed: Mutex::new(Default::default()),
        }
    }

    /// Pins `key` to `generation` now, within [`MAX_PINS`] (the expired
    /// dropped first, then all).
    fn pin(&self, pins: &mut PinMap, key: (EnvName, String), generation: GenerationId) {
        if pins.len() >= MAX_PINS {
            pins.retain(|_, (_, at)| at.elapsed() < self.window);
            if pins.len() >= MAX_PINS {
                pins.clear();
            }
        }
        pins.insert(key, (generation, Instant::now()));
    }

    /// The generation `certname`'s run of `env` is pinned to, if the pin
    /// is younger than the window.
    pub(super) fn pinned(&self, env: &EnvName, certname: &str) -> Option<GenerationId> {
        if self.window.is_zero() {
            return None;
        }
        let key = (env.clone(), certname.to_owned());
        lock(&self.pins)
            .get(&key)
            .filter(|(_, at)| at.elapsed() < self.window)
            .map(|(g, _)| *g)
    }

    /// Pins `certname`'s run of `env`, starting now, to `generation`.
    pub(super) fn pin_run(&self, env: &EnvName, certname: &str, generation: GenerationId) {
        if self.window.is_zero() {
            return;
        }
        let key = (env.clone(), certname.to_owned());
        self.pin(&mut lock(&self.pins), key, generation);
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

    /// `env`'s index before its current one, if it is of generation
    /// `pinned` and was replaced less than the window ago.
    pub(super) fn previous(&self, env: &EnvName, pinned: GenerationId) -> Option<Arc<EnvIndex>> {
        let mut previous = lock(&self.previous);
        match previous.get(env) {
            Some((idx, at)) if at.elapsed() < self.window => {
                (idx.generation.get() == Some(&pinned)).then(|| idx.clone())
            }
            Some(_) => previous.remove(env).and(None),
            None => None,
        }
    }
}

impl Store {
    /// The generation a stock agent `certname`'s run of `name` is pinned
    /// to, within `generations.pin` (placement.rs asks).
    pub fn run_pin(&self, name: &EnvName, certname: &str) -> Option<GenerationId> {
        self.pins.pinned(name, certname)
    }

    /// Pins the run of stock agent `certname` starting now to `generation`
    /// of `name` (nothing when `generations.pin` is unset).
    pub fn pin_run(&self, name: &EnvName, certname: &str, generation: GenerationId) {
        self.pins.pin_run(name, certname, generation);
    }

    /// The index `name` served before its current one, of generation
    /// `pinned`, kept for a stock run pinned to it within the window.
    pub fn previous_index(&self, name: &EnvName, pinned: GenerationId) -> Option<Arc<EnvIndex>> {
        self.pins.previous(name, pinned)
    }

    /// The index of generation `id` of `name` if it is at hand: `current`
    /// when it is that generation, or one made back from the store before.
    pub fn placed_at_hand(
        &self,
        name: &EnvName,
        current: &Arc<EnvIndex>,
        id: GenerationId,
    ) -> Option<Arc<EnvIndex>> {
        if current.generation.get() == Some(&id) {
            return Some(current.clone());
        }
        let mut placed = lock(&self.pins.placed);
        let (idx, used) = placed.get_mut(&(name.clone(), id))?;
        *used = Instant::now();
        Some(idx.clone())
    }

    /// The index of generation `id` of `name` (`chosen` when `id`, a
    /// pinned one, is no longer kept): at hand, or made back from the
    /// generation store and kept ([`MAX_PLACED`] at most). Blocking: reads
    /// and parses the stored index on a miss.
    pub fn placed_index(
        &self,
        name: &EnvName,
        current: &Arc<EnvIndex>,
        id: GenerationId,
        chosen: GenerationId,
    ) -> Result<Arc<EnvIndex>, PlacedError> {
        match self.stored_index(name, current, id) {
            Err(PlacedError::NotStored(_)) if id != chosen => {
                self.stored_index(name, current, chosen)
            }
            found => found,
        }
    }

    /// True the first time generation `id` of `name` could not be made
    /// back (then logged; at most [`MAX_PINS`] remembered).
    pub fn placed_failed(&self, name: &EnvName, id: GenerationId) -> bool {
        let mut failed = lock(&self.pins.failed);
        if failed.len() >= MAX_PINS {
            failed.clear();
        }
        failed.insert((name.clone(), id))
    }

    fn stored_index(
        &self,
        name: &EnvName,
        current: &Arc<EnvIndex>,
        id: GenerationId,
    ) -> Result<Arc<EnvIndex>, PlacedError> {
        if let Some(idx) = self.placed_at_hand(name, current, id) {
            return Ok(idx);
        }
        let bytes = self
            .generations
            .index_record(name, &id)?
            .ok_or(PlacedError::NotStored(id))?;
        let blobs = self.generations.stored_blobs();
        let idx = EnvIndex::restore(&self.settings.index, name.clone(), id, &bytes, blobs)?;
        idx.warm();
        let idx = Arc::new(idx);
        let mut placed = lock(&self.pins.placed);
        if placed.len() >= MAX_PLACED
            && let Some(oldest) = placed
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            placed.remove(&oldest);
        }
        placed.insert((name.clone(), id), (idx.clone(), Instant::now()));
        Ok(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::digest::Sha256;

    #[test]
    fn a_placed_stock_run_stays_on_the_generation_its_first_request_was_placed_on() {
        let env: EnvName = "production".parse().unwrap();
        let (a, b) = (
            GenerationId(Sha256::of(b"a")),
            GenerationId(Sha256::of(b"b")),
        );
        // As placement.rs uses them: a run's first request pins what it is
        // placed on (`chosen`); the run's later ones read the pin.
        let generation_for = |pins: &Pins, certname: &str, starts_run: bool, chosen| {
            if starts_run {
                pins.pin_run(&env, certname, chosen);
                return chosen;
            }
            pins.pinned(&env, certname).unwrap_or(chosen)
        };
        let pins = Pins::new(Duration::from_secs(60));
        assert_eq!(generation_for(&pins, "n1", true, a), a, "a run starts");
        assert_eq!(
            generation_for(&pins, "n1", false, b),
            a,
            "a wave opened during the run: it stays"
        );
        assert_eq!(generation_for(&pins, "n2", false, b), b, "not pinned");
        assert_eq!(generation_for(&pins, "n1", true, b), b, "the next run");
        let off = Pins::new(Duration::ZERO);
        generation_for(&off, "n1", true, a);
        assert_eq!(generation_for(&off, "n1", false, b), b, "pin off");
    }
}
