//! The state the master keeps while it serves: the state store
//! (docs/operating.md#the-state-store), the fleet and the rollouts on it,
//! and the rollouts' background work: the commands read back from the
//! store, the health gate and the seen generations each second
//! (docs/rollouts.md#replicas).

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use super::ServeError;
use crate::config::{ConfigError, MasterConfig};
use crate::fleet::Fleet;
use crate::rollout::Rollouts;
use crate::statestore::StateStore;
use crate::store::Store;

/// The state store of `config` (`[state]`; by default the embedded file
/// under the generation store's directory), the fleet kept in it, and the
/// rollouts kept in it, their gate counting the fleet; the rollouts'
/// [`background`] task pushed onto `tasks`.
pub fn start(
    config: &Arc<MasterConfig>,
    store: &Arc<Store>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(Arc<Fleet>, Arc<Rollouts>), ServeError> {
    let dir = store.generations.dir();
    let settings = (config.state_settings(dir)).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let state = Arc::new(off_worker(|| StateStore::open(&settings))?);
    let fleet = off_worker(|| Fleet::with_store(&config.fleet, state.clone()));
    let fleet = Arc::new(fleet?);
    let rollouts = off_worker(|| Rollouts::with_store(&config.rollout, state, dir));
    let rollouts = Arc::new(rollouts?);
    rollouts.set_fleet(fleet.clone());
    let task = tokio::spawn(background(Arc::downgrade(store), Arc::downgrade(&rollouts)));
    tasks.push(task);
    Ok((fleet, rollouts))
}

/// Runs `f` (which waits on the state store's database) where it blocks
/// no tokio worker: through `block_in_place` on the master's multi-thread
/// runtime, directly elsewhere (a test's current-thread runtime).
fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The rollouts' background work while the master serves: the commands
/// read back from the store ([`Rollouts::refresh`]), the gate and the
/// seen generations ([`Rollouts::tick`]), each second. Ends when the
/// store is gone.
pub async fn background(store: Weak<Store>, rollouts: Weak<Rollouts>) {
    loop {
        let (Some(s), Some(r)) = (store.upgrade(), rollouts.upgrade()) else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || {
            let _ = r.refresh();
            r.tick(&s.generations)
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
