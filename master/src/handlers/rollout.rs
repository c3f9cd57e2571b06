//! The rollout calls of the admin API (docs/protocol.md §7.9), at
//! [`ROLLOUT_PATH`](crate::rollout::api::ROLLOUT_PATH).
//!
//! `GET {ROLLOUT_PATH}?environment=ENV` answers the rollout's status;
//! `POST {ROLLOUT_PATH}?environment=ENV&action=ACTION` applies a command
//! and answers the new status; either without an environment is a 400.
//! `&generation=ID` (64 hex digits or a unique prefix of at least 12) names
//! what a rollback withdraws: the same rollback again is then a no-op
//! (docs/rollouts.md#commands).
//! Who may call them: as the re-index call, `[admin] certnames` and the
//! master's own certificate ([`super::admin::admitted`]).

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::envname::EnvName;
use serde::Serialize;

use super::admin::admitted;
use crate::api_error::ApiError;
use crate::request::Query;
use crate::rollout::{Action, RolloutError, Rollouts};
use crate::state::AppState;

fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The environment a call names, if any; 400 for a malformed one.
fn environment(req: &Request) -> Result<Option<EnvName>, ApiError> {
    Query::parse(req.uri().query())
        .get("environment")
        .map(|e| e.parse::<EnvName>())
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `GET {ROLLOUT_PATH}?environment=ENV`: see the module docs.
pub async fn status(State(state): State<AppState>, req: Request) -> Response {
    if let Err(refused) = admitted(&state, &req) {
        return refused.into_response();
    }
    match environment(&req) {
        Err(e) => e.into_response(),
        Ok(None) => ApiError::bad_request("an environment must be named").into_response(),
        Ok(Some(env)) => json(
            StatusCode::OK,
            &state.rollouts.status(&state.store.generations, &env),
        ),
    }
}

/// `POST {ROLLOUT_PATH}?environment=ENV&action=ACTION`: see the module
/// docs. 409 for a rollback that leaves nothing served or a command on an
/// environment that keeps none.
pub async fn command(State(state): State<AppState>, req: Request) -> Response {
    let certname = match admitted(&state, &req) {
        Ok(c) => c,
        Err(refused) => return refused.into_response(),
    };
    let env = match environment(&req) {
        Ok(Some(env)) => env,
        Ok(None) => return ApiError::bad_request("an environment must be named").into_response(),
        Err(e) => return e.into_response(),
    };
    let query = Query::parse(req.uri().query());
    let action = match query.get("action").unwrap_or_default().parse::<Action>() {
        Ok(a) => a,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let named = query.get("generation").map(str::to_owned);
    if named.is_some() && !matches!(action, Action::Rollback(_)) {
        let why = "generation= names what a rollback withdraws; halt, resume and promote take none";
        return ApiError::bad_request(why).into_response();
    }
    let by = format!("admin API ({certname})");
    let applied = tokio::task::spawn_blocking(move || {
        let (r, g) = (&state.rollouts, &state.store.generations);
        let action = match named {
            Some(text) => Action::Rollback(Some(Rollouts::named(g, &env, &text)?)),
            None => action,
        };
        r.apply(g, &env, action, &by).map(|_| r.status(g, &env))
    })
    .await;
    match applied {
        Ok(Ok(status)) => json(StatusCode::OK, &status),
        Ok(Err(
            e @ (RolloutError::NothingEarlier(_)
            | RolloutError::NoGeneration(_)
            | RolloutError::UnknownGeneration { .. }
            | RolloutError::NotNewest { .. }),
        )) => ApiError::conflict(e.to_string()).into_response(),
        // The database away (docs/operating.md#the-state-store): refused,
        // saying which, so the operator knows to retry once it is back.
        Ok(Err(e @ RolloutError::Store(_))) => {
            tracing::error!(error = %e, "rollout command not applied");
            ApiError::unavailable(format!("command not applied: {e}"), 5).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "rollout command not applied");
            ApiError::internal().into_response()
        }
        Err(_) => ApiError::internal().into_response(),
    }
}
