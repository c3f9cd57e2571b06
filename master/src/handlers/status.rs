//! `GET /status/v1/simple`, the health check (docs/protocol.md §1.9).

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// `GET /status/v1/simple`: `running`, or 503 `stopping` while draining.
/// No client certificate needed: it is the load balancer's health check.
pub async fn status(State(state): State<AppState>) -> Response {
    if state.store.draining.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain")],
            "stopping",
        )
            .into_response()
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain")],
            "running",
        )
            .into_response()
    }
}
