//! The router: Puppet's v3 file-serving endpoints, the health check, and
//! the layers every response goes through (`X-Puppet-Version`, request
//! bodies refused, a request timeout, panics turned into 500s).

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pluginsync_common::PUPPET_VERSION;
use pluginsync_common::protocol;

use crate::api_error::ApiError;
use crate::handlers;
use crate::state::AppState;

/// Builds the application router.
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    Router::new()
        .route(
            &format!("{}/{{*rest}}", protocol::FILE_METADATAS),
            get(handlers::file_metadatas),
        )
        .route(
            &format!("{}/{{*rest}}", protocol::FILE_METADATA),
            get(handlers::file_metadata),
        )
        .route(
            &format!("{}/{{*rest}}", protocol::FILE_CONTENT),
            get(handlers::file_content),
        )
        .route(
            &format!("{}{{digest}}", protocol::BLOB_PREFIX),
            get(handlers::blob),
        )
        .route(protocol::BATCH_PATH, get(handlers::blobs_batch))
        .route(protocol::STATUS_SIMPLE, get(handlers::status))
        // Only matched routes refuse bodies: a POST to an endpoint we do not
        // serve (a stock agent's catalog request) is a plain 404.
        .route_layer(middleware::from_fn(refuse_bodies))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::internal().into_response()
        }))
        .layer(middleware::map_response(puppet_version))
}

async fn fallback(req: Request) -> Response {
    ApiError::no_route(req.uri().path()).into_response()
}

async fn method_not_allowed(method: Method) -> Response {
    let mut r = ApiError::method_not_allowed(method.as_str()).into_response();
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    r
}

/// Every endpoint is a GET: a request that carries a body is refused before
/// any of it is read.
async fn refuse_bodies(req: Request, next: Next) -> Response {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if has_body {
        return ApiError::body_refused().into_response();
    }
    next.run(req).await
}

async fn puppet_version(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        protocol::HEADER_PUPPET_VERSION,
        HeaderValue::from_static(PUPPET_VERSION),
    );
    resp
}
