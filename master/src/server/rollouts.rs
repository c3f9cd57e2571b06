//! The state the master keeps while it serves: the state store
//! (docs/operating.md#the-state-store), the fleet and the rollouts on it,
//! and the rollouts' background work: the commands read back from the
//! store, the health gate and the seen generations each second, the
//! peers' state pulled (docs/rollouts.md#replicas).

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use super::ServeError;
use crate::config::{ConfigError, MasterConfig};
use crate::fleet::Fleet;
use crate::rollout::Rollouts;
use crate::rollout_client::pull_peers;
use crate::statestore::StateStore;
use crate::store::Store;

/// The state store of `config` (`[state]`; by default the embedded file
/// under the generation store's directory), the fleet kept in it, and the
/// rollouts kept in it, their gate counting the fleet; the peers' tasks
/// and the rollouts' [`background`] task pushed onto `tasks`.
pub fn start(
    config: &Arc<MasterConfig>,
    store: &Arc<Store>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(Arc<Fleet>, Arc<Rollouts>), ServeError> {
    let dir = store.generations.dir();
    let settings = (config.state_settings(dir)).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let state = Arc::new(off_worker(|| StateStore::open(&settings))?);
    let peers = config.admin.peers.len();
    let fleet = off_worker(|| Fleet::with_store(&config.fleet, peers, state.clone()));
    let fleet = Arc::new(fleet?);
    tasks.extend(crate::fleet::peers::spawn(config, &fleet)?);
    let rollouts = off_worker(|| Rollouts::with_store(&config.rollout, state, dir));
    let rollouts = Arc::new(rollouts?);
    rollouts.set_fleet(fleet.clone());
    rollouts.set_has_peers(!config.admin.peers.is_empty());
    let task = tokio::spawn(background(
        config.clone(),
        Arc::downgrade(store),
        Arc::downgrade(&rollouts),
    ));
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

/// How often the state is pulled from the peers.
const PULL_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The rollouts' background work while the master serves: the gate and
/// the seen generations each second ([`Rollouts::tick`]), the peers'
/// state at start and every [`PULL_EVERY`]. Ends when the store is gone.
pub async fn background(config: Arc<MasterConfig>, store: Weak<Store>, rollouts: Weak<Rollouts>) {
    let mut last_pull: Option<tokio::time::Instant> = None;
    let peers = &config.admin.peers;
    loop {
        let (Some(s), Some(r)) = (store.upgrade(), rollouts.upgrade()) else {
            return;
        };
        if !peers.is_empty() && last_pull.is_none_or(|t| t.elapsed() >= PULL_EVERY) {
            last_pull = Some(tokio::time::Instant::now());
            pull_peers(&config, &r, peers).await;
        }
        let _ = tokio::task::spawn_blocking(move || {
            let _ = r.refresh();
            r.tick(&s.generations)
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
