//! Generation-addressed answers (docs/protocol.md §7.6): the per-node
//! answer, `GET /pluginsync/v1/assignment?environment=<env>`
//! ([`assignment`]), and a kept generation's manifest, whole or as a delta
//! from another kept one, `GET /pluginsync/v1/generations/<id>?environment=<env>[&since=<id>]`
//! ([`manifest`]).
//!
//! Both pass the same authorization step as the file endpoints
//! ([`crate::auth::Gate::authorize`]). The manifest is immutable (its URL
//! names its bytes): `public` for a shared cache where no
//! `[[authorization]]` rule applies, `private` otherwise (§7.4). The
//! per-node answer is `private, no-cache`, revalidated each run: an
//! unchanged answer is one `304`. It is also where a node is heard: its
//! report, or what it is served, goes to the fleet (`fleet/mod.rs`),
//! unless the request is a `--noop` run's (`X-Pluginsync-Noop`).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::generation::{Assignment, GenerationId};
use pluginsync_common::protocol;

use crate::api_error::ApiError;
use crate::placement::{self, Asking, Node, Placement, Unplaced};
use crate::request::{self, Query};
use crate::state::AppState;

use super::blobs::shareable;
use super::content::{CacheControl, header_value};
use super::files::{index_of, unplaced};

/// The environment a request names, admitted by the authorization step:
/// 400 without one, then Puppet's order (docs/protocol.md §1.7).
fn environment(state: &AppState, req: &Parts, query: &Query) -> Result<EnvName, ApiError> {
    let Some(env) = query.get("environment") else {
        return Err(ApiError::bad_request(
            "An environment parameter must be specified",
        ));
    };
    state.gate.authorize(req, env)
}

/// `GET /pluginsync/v1/assignment?environment=<env>`: see the module docs.
/// Its `ETag` names the environment and the generation only, so every
/// replica that serves the same generation answers a revalidation `304`
/// (the publication time in the body is each replica's own).
pub async fn assignment(
    State(state): State<AppState>,
    Extension(node): Extension<Arc<Node>>,
    req: Parts,
) -> Result<Response, ApiError> {
    let query = Query::parse(req.uri.query());
    let env = environment(&state, &req, &query)?;
    request::check_accept(&req.headers, &["application/json"])?;
    // The environment exists and its index (so its current generation) is
    // published; an unknown or deploying one is answered as for listings.
    let current = index_of(&state, &env).await?;
    let current = current.generation.get().copied();
    let kept = match placement::place(
        &state.store,
        &state.rollouts,
        &env,
        &node,
        current,
        Asking::Assignment,
    ) {
        Placement::Serve(kept) => kept,
        Placement::Elsewhere(id) => {
            return Err(unplaced(Unplaced::Elsewhere { id, env }));
        }
        Placement::Current | Placement::Pinned { .. } => {
            return Err(ApiError::unavailable(
                format!("environment '{env}' has no generation yet; try again shortly"),
                5,
            ));
        }
    };
    // A `--noop` run's request is not recorded: it committed nothing
    // (docs/protocol.md §7.8).
    let noop = req
        .headers
        .contains_key(pluginsync_common::rollout::HEADER_NOOP);
    if let Some(certname) = &node.certname
        && !noop
    {
        state
            .fleet
            .heard_read(certname, &env, node.report.as_ref(), Some(kept.id));
    }
    let etag = ETag::of_digest(&Sha256::of(format!("{env}\n{}", kept.id).as_bytes()).0[..20]);
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, header_value(etag.as_str()));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    headers.insert(protocol::HEADER_GENERATION, header_value(&kept.id.to_hex()));
    // What a node under `[trust]` needs to know to ask no metadata, or all
    // it needs at once (docs/trust.md#requests-per-run).
    for (name, value) in crate::trust::metadata::served(&state).iter() {
        headers.insert(*name, value.clone());
    }
    if request::not_modified(&req.headers, &etag) {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    let body = serde_json::to_vec(&Assignment {
        environment: env.to_string(),
        generation: kept.id,
        published: kept.published.to_string(),
        files: kept.files,
        bytes: kept.bytes,
    })
    .map_err(|_| ApiError::internal())?;
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok((StatusCode::OK, headers, body).into_response())
}

/// `GET /pluginsync/v1/generations/<id>?environment=<env>[&since=<id>]`:
/// see the module docs. 404 for a generation `env` does not keep; a
/// `since` it does not keep (or malformed) is ignored: the whole manifest.
pub async fn manifest(State(state): State<AppState>, req: Parts) -> Result<Response, ApiError> {
    let query = Query::parse(req.uri.query());
    let env = environment(&state, &req, &query)?;
    let raw = req
        .uri
        .path()
        .strip_prefix(protocol::GENERATIONS_PREFIX)
        .unwrap_or_default();
    let id: GenerationId = raw.parse().map_err(|_| {
        ApiError::bad_request("a generation is named by 64 lowercase hex digits of its sha256")
    })?;
    request::check_accept(
        &req.headers,
        &[
            protocol::MANIFEST_MEDIA_TYPE,
            protocol::MANIFEST_DELTA_MEDIA_TYPE,
        ],
    )?;
    let since = query
        .get(protocol::SINCE_QUERY_KEY)
        .and_then(|s| s.parse::<GenerationId>().ok())
        .filter(|s| *s != id);
    let mut headers = HeaderMap::new();
    let cache = CacheControl::Immutable {
        public: shareable(&state),
    };
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(cache.header()),
    );
    headers.insert(protocol::HEADER_GENERATION, header_value(&id.to_hex()));
    let store = state.store.clone();
    let found = tokio::task::spawn_blocking(move || {
        let g = &store.generations;
        let delta = match since {
            Some(s) => g.delta(&env, &s, &id)?,
            None => None,
        };
        match delta {
            Some(d) => Ok(Some((
                axum::body::Bytes::from_owner(d),
                protocol::MANIFEST_DELTA_MEDIA_TYPE,
            ))),
            None => Ok(g
                .manifest(&env, &id)?
                .map(|m| (m.into(), protocol::MANIFEST_MEDIA_TYPE))),
        }
    })
    .await
    .map_err(|_| ApiError::internal())?
    .map_err(|e: crate::generations::StoreError| {
        tracing::error!(error = %e, "generation not read");
        ApiError::internal()
    })?;
    let Some((body, media)) = found else {
        return Err(ApiError::not_found("generation", raw));
    };
    let etag = match since {
        Some(s) if media == protocol::MANIFEST_DELTA_MEDIA_TYPE => {
            ETag::from_core(&format!("{s}-{id}"))
        }
        _ => ETag::from_core(&id.to_hex()),
    };
    headers.insert(header::ETAG, header_value(etag.as_str()));
    if request::not_modified(&req.headers, &etag) {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    Ok((StatusCode::OK, headers, body).into_response())
}
