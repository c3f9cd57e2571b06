//! Puppet Server's admin API, the part deploy tools call:
//! `DELETE /puppet-admin-api/v1/environment-cache[?environment=NAME]`
//! (docs/protocol.md §1.10). Puppet Server drops its cached environments; we
//! re-index the named environment (or every one) and answer once the new
//! index is served, so r10k's `postrun` hook returns to a published tree.
//!
//! pluginsync's own admin calls, allowed alike: the fleet's inventory,
//! `GET /pluginsync/v1/inventory` (docs/operating.md#the-fleet), and the
//! rollout calls.
//!
//! Who may call them: the certnames of `[admin] certnames` (exact names; the
//! list is empty by default, so everyone gets 403, as Puppet Server without
//! an allowlist entry), and the master's own certificate, known by its
//! public key, which `pluginsync-master reindex` presents. The identity is the TLS client
//! certificate's CN, as for every endpoint (docs/protocol.md §5.2).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum_server::tls::TlsInfo;
use pluginsync_common::envname::EnvName;

use crate::api_error::ApiError;
use crate::request::Query;
use crate::state::AppState;

/// The endpoint's path, as Puppet Server spells it.
pub const ENVIRONMENT_CACHE: &str = "/puppet-admin-api/v1/environment-cache";
/// The inventory's path (`fleet/mod.rs`).
pub use crate::fleet::INVENTORY_PATH as INVENTORY;

/// `DELETE /puppet-admin-api/v1/environment-cache`: 204 once re-indexed;
/// 403 for a client not on the allowlist (or without a certificate); 400
/// for a malformed `environment`. An environment that does not exist is a
/// 204 too (Puppet Server's answer; its index, if any, is dropped).
pub async fn environment_cache(State(state): State<AppState>, req: Request) -> Response {
    let certname = match admitted(&state, &req) {
        Ok(c) => c,
        Err(refused) => return refused.into_response(),
    };
    let query = Query::parse(req.uri().query());
    let env = match query.get("environment") {
        None => None,
        Some(name) => match name.parse::<EnvName>() {
            Ok(env) => Some(env),
            Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
        },
    };
    let by = format!("admin API ({certname})");
    state.store.reindex(env, &by).await;
    StatusCode::NO_CONTENT.into_response()
}

/// Who may call the admin API (module docs): the caller's certname, or
/// the 403 (logged).
pub fn admitted(state: &AppState, req: &Request) -> Result<String, ApiError> {
    let leaf = req
        .extensions()
        .get::<Arc<TlsInfo>>()
        .and_then(|info| info.peer_certificates.first().cloned());
    let certname = leaf
        .as_ref()
        .and_then(|der| crate::auth::certname_of(der).ok());
    let config = &state.config;
    let allowed = certname.as_deref().is_some_and(|name| {
        config.admin.certnames.iter().any(|c| c == name)
            || leaf.as_ref().is_some_and(|der| is_own(config, der))
    });
    match certname {
        Some(name) if allowed => Ok(name),
        _ => {
            tracing::warn!(
                certname = certname.as_deref().unwrap_or("-"),
                "admin API refused: not in [admin] certnames"
            );
            Err(ApiError::forbidden(req.uri().path()))
        }
    }
}

/// Whether `der` carries the public key of the master's own certificate
/// (read at each call, so a certificate rotated under SIGHUP is followed).
/// The key, not the name: the CA may have issued another certificate under
/// the master's certname, and only the holder of the master's key is the
/// master (docs/protocol.md §1.10).
fn is_own(config: &crate::config::MasterConfig, der: &[u8]) -> bool {
    let Ok(certs) = pluginsync_common::tls::load_certs("certificate", &config.tls.cert) else {
        return false;
    };
    certs
        .first()
        .is_some_and(|own| crate::auth::same_public_key(own, der))
}
