//! What every handler shares: the indexes and the authorization step.
//!
//! Built once by the server's `serve`, handed to the router, and cloned
//! (cheaply: `Arc`s) into each request (docs/internals.md#state). It
//! imports only what it holds, so routes, handlers and server can all
//! import it without importing each other.

use std::sync::Arc;

use crate::auth::Gate;
use crate::config::MasterConfig;
use crate::fleet::Fleet;
use crate::rollout::Rollouts;
use crate::store::Store;
use crate::trust::timestamp::TimestampCache;

/// Shared state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The config the master serves with (`[admin]`, `[log]`, `[tls]`,
    /// `[[authorization]]` as the handlers read them).
    pub config: Arc<MasterConfig>,
    /// The indexes, and the counters and drain flag kept beside them.
    pub store: Arc<Store>,
    /// `tls.client_auth` and the compiled `[[authorization]]`: who may
    /// read what.
    pub gate: Gate,
    /// Rollout policies and state (docs/rollouts.md).
    pub rollouts: Arc<Rollouts>,
    /// What the nodes reported (docs/operating.md#the-fleet).
    pub fleet: Arc<Fleet>,
    /// `[trust] metadata`'s timestamp answer, kept while unchanged
    /// (docs/trust.md#requests-per-run).
    pub trust_timestamp: Arc<TimestampCache>,
}

/// The health gate counts the fleet's nodes (docs/rollouts.md#the-health-gate).
impl crate::rollout::FleetCounts for Fleet {
    fn on_generation(
        &self,
        env: &pluginsync_common::envname::EnvName,
        generation: &pluginsync_common::generation::GenerationId,
    ) -> (u64, u64) {
        Fleet::on_generation(self, env, generation)
    }
}
