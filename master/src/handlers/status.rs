//! `GET /status/v1/simple`, the health check (docs/protocol.md §1.9).

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// `GET /status/v1/simple`: `running`; 503 `starting` until the
/// environments named in `index.warm` are indexed (docs/master.md#many-environments:
/// every other environment is served correctly before it is
/// indexed, its first request waits for its build); 503 `stopping` while
/// draining. No client certificate needed: it is the load balancer's
/// health check.
pub async fn status(State(state): State<AppState>) -> Response {
    let (code, body) = if state.store.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping")
    } else if !state.store.is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    } else {
        (StatusCode::OK, "running")
    };
    (code, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}
