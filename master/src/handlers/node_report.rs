//! The node report sent right after a run's commit (docs/protocol.md
//! §7.8): `POST /pluginsync/v1/report?environment=<env>`, the body the
//! `X-Pluginsync-Report` header's value (at most 4,096 bytes), recorded
//! for the request's identity exactly as that header is
//! (`Fleet::heard_read`), so the gate and the inventory see a run when
//! it ends rather than on the node's next run. The same authorization
//! step as the per-node answer; 204 once recorded, 400 for a body that is
//! not a report (nothing recorded).

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pluginsync_common::rollout::{MAX_REPORT_BYTES, NodeReport, ReportError};

use crate::api_error::ApiError;
use crate::placement::Node;
use crate::request::Query;
use crate::state::AppState;

/// `POST /pluginsync/v1/report?environment=<env>`: see the module docs.
pub async fn node_report(
    State(state): State<AppState>,
    Extension(node): Extension<Arc<Node>>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let query = Query::parse(parts.uri.query());
    let Some(env) = query.get("environment") else {
        return ApiError::bad_request("An environment parameter must be specified").into_response();
    };
    let env = match state.gate.authorize(&parts, env) {
        Ok(env) => env,
        Err(refused) => return refused.into_response(),
    };
    let Some(certname) = &node.certname else {
        return ApiError::forbidden(parts.uri.path()).into_response();
    };
    let Ok(body) = axum::body::to_bytes(body, MAX_REPORT_BYTES).await else {
        let text = format!("a node report is at most {MAX_REPORT_BYTES} bytes");
        return ApiError::bad_request(text).into_response();
    };
    let read = std::str::from_utf8(&body)
        .map_err(|e| ReportError::Malformed(e.to_string()))
        .and_then(NodeReport::from_header);
    if let Err(e) = &read {
        return ApiError::bad_request(e.to_string()).into_response();
    }
    state.fleet.heard_read(certname, &env, Some(&read), None);
    StatusCode::NO_CONTENT.into_response()
}
