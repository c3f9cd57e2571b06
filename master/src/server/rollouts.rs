//! The rollouts' background work while the master serves: the health
//! gate and the seen generations each second, the peers' state pulled
//! (docs/rollouts.md#replicas).

use std::sync::{Arc, Weak};

use crate::config::MasterConfig;
use crate::rollout::{FleetCounts, Rollouts};
use crate::rollout_client::pull_peers;
use crate::store::Store;

/// The rollouts of `config`, their gate counting `fleet`, and their
/// [`background`] task.
pub fn start(
    config: &Arc<MasterConfig>,
    store: &Arc<Store>,
    fleet: Arc<dyn FleetCounts>,
) -> (Arc<Rollouts>, tokio::task::JoinHandle<()>) {
    let rollouts = Arc::new(Rollouts::new(&config.rollout, store.generations.dir()));
    rollouts.set_fleet(fleet);
    rollouts.set_has_peers(!config.admin.peers.is_empty());
    let task = tokio::spawn(background(
        config.clone(),
        Arc::downgrade(store),
        Arc::downgrade(&rollouts),
    ));
    (rollouts, task)
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
        let _ = tokio::task::spawn_blocking(move || r.tick(&s.generations)).await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
