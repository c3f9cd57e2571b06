//! Errors as Puppet's file server sends them: a status code and a JSON body
//! `{"message": "<Prefix>: <text>", "issue_kind": "<KIND>"}` (docs/protocol.md
//! §1.7). Stock agents branch only on the status and log the body, so the
//! prefixes and kinds follow Puppet's. Internal details (file-system paths,
//! I/O errors) are logged, never sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::metadata::ApiErrorBody;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Text after the status prefix.
    pub text: String,
    /// Puppet issue kind.
    pub issue_kind: &'static str,
    /// Seconds for `Retry-After`, for 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, text: impl Into<String>) -> Self {
        ApiError {
            status,
            text: text.into(),
            issue_kind: kind,
            retry_after: None,
        }
    }

    /// 400 with `RUNTIME_ERROR`.
    pub fn bad_request(text: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "RUNTIME_ERROR", text)
    }

    /// 403: no client certificate, or not allowed by `[[authorization]]`.
    pub fn forbidden(path: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "FAILED_AUTHORIZATION",
            format!("Forbidden request: {path} (method GET)"),
        )
    }

    /// 404 for an unknown environment (Puppet's kind is `RUNTIME_ERROR`).
    pub fn unknown_environment(env: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "RUNTIME_ERROR",
            format!("Could not find environment '{env}'"),
        )
    }

    /// 404 for a missing file, as `Could not find <indirection> <key>`.
    pub fn not_found(what: &str, key: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "RESOURCE_NOT_FOUND",
            format!("Could not find {what} {key}"),
        )
    }

    /// 404 for a path no route serves.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "HANDLER_NOT_FOUND",
            format!("No route for GET {path}"),
        )
    }

    /// 405.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("method {method} is not supported, only GET and HEAD"),
        )
    }

    /// 406.
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            "UNSUPPORTED_FORMAT",
            format!("No supported formats are acceptable (Accept: {accept})"),
        )
    }

    /// 413: this API takes no request bodies.
    pub fn body_refused() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RUNTIME_ERROR",
            "request bodies are not accepted",
        )
    }

    /// 500 with a generic text; log the detail where it happened.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "RUNTIME_ERROR",
            "internal error, see the master's log",
        )
    }

    /// 409: the command does not apply to the state (docs/rollouts.md#commands).
    pub fn conflict(text: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "RUNTIME_ERROR", text)
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(text: impl Into<String>, retry_after: u32) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "RUNTIME_ERROR", text);
        e.retry_after = Some(retry_after);
        e
    }

    fn prefix(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "Bad Request",
            StatusCode::FORBIDDEN => "Not Authorized",
            StatusCode::NOT_FOUND => "Not Found",
            StatusCode::METHOD_NOT_ALLOWED => "Method Not Allowed",
            StatusCode::NOT_ACCEPTABLE => "Not Acceptable",
            StatusCode::PAYLOAD_TOO_LARGE => "Payload Too Large",
            StatusCode::CONFLICT => "Conflict",
            StatusCode::SERVICE_UNAVAILABLE => "Service Unavailable",
            _ => "Server Error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ApiErrorBody {
            message: format!("{}: {}", self.prefix(), self.text),
            issue_kind: self.issue_kind.to_owned(),
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = (self.status, json).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
