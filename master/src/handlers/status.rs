//! `GET /status/v1/simple`, the health check (docs/protocol.md §1.9).

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::auth::{PeerIdentity, Via};
use crate::state::AppState;

/// `GET /status/v1/simple`: `running`; 503 `starting` until the
/// environments named in `index.warm` are indexed (docs/master.md#many-environments:
/// every other environment is served correctly before it is
/// indexed, its first request waits for its build); 503 `stopping` while
/// draining; on the mTLS listener, 503 with the reason while the served
/// certificate is expired or not yet valid (every agent refuses it, so the
/// balancer must send them elsewhere; docs/master.md#endpoints). No client
/// certificate needed: it is the load balancer's health check.
pub async fn status(
    State(state): State<AppState>,
    identity: Option<Extension<PeerIdentity>>,
) -> Response {
    let tls = identity.is_none_or(|Extension(i)| i.via == Via::Tls);
    let refused = || {
        tls.then(|| state.store.certificate.refused_at(SystemTime::now()))
            .flatten()
    };
    let (code, body) = if state.store.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping".into())
    } else if !state.store.is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "starting".into())
    } else if let Some(out_of_date) = refused() {
        (StatusCode::SERVICE_UNAVAILABLE, out_of_date.to_string())
    } else {
        (StatusCode::OK, "running".to_owned())
    };
    (code, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}
