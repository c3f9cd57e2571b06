//! Puppet's three file endpoints, `file_metadatas`, `file_metadata` and
//! `file_content` (docs/protocol.md §1.2–§1.4); the bytes are sent by
//! `content.rs`.
//! `file_metadatas` answers pluginsync's agent with a delta listing when
//! it asks and the environment remembers its base (§7.5, `delta_for`).
//!
//! Order of checks follows Puppet Server (docs/protocol.md §1.7): a missing
//! `environment` is a 400 before anything else; then the authorization step
//! ([`crate::auth::Gate::authorize`]: a client certificate (403), a valid
//! environment name (400), `[[authorization]]` (403)) before the
//! environment's existence is revealed (404).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag;
use pluginsync_common::metadata::FileType;
use pluginsync_common::protocol;

use crate::api_error::ApiError;
use crate::index::{CachedListing, DeltaListing, EnvIndex, ListingError, SearchParams, Served};
use crate::placement::{self, Asking, Node, Unplaced};
use crate::request::{self, MountPath, PathError, Query};
use crate::state::AppState;
use crate::store::Lookup;

use super::content::{CHANGED, CacheControl, header_value, send_file, send_stored};

/// Listings smaller than this are never gzipped.
const GZIP_MIN: usize = 512;

const JSON: &str = "application/json; charset=utf-8";

/// What every file endpoint needs once the request is accepted.
struct Accepted {
    index: Arc<EnvIndex>,
    /// A stock agent, or a client placed on a generation other than the
    /// current one: its content comes from the generation store, the
    /// exact bytes of the generation it is served, whatever the tree is
    /// now (docs/protocol.md §7.6).
    stock: bool,
    /// A `[[rollout]]` policy placed the client (docs/rollouts.md#stock-puppet-agents).
    placed: bool,
    target: MountPath,
    query: Query,
}

/// The shared front half of the file endpoints: docs/protocol.md §1.7
/// steps 1 to 7, the authorization step included, then where placement
/// puts `node` (`placement.rs`). `route` is the endpoint's path before
/// its mount.
async fn accept(
    state: &AppState,
    req: &Parts,
    node: &Node,
    route: &str,
    produces: &[&str],
) -> Result<Accepted, ApiError> {
    let query = Query::parse(req.uri.query());
    let Some(env) = query.get("environment") else {
        return Err(ApiError::bad_request(
            "An environment parameter must be specified",
        ));
    };
    let env = state.gate.authorize(req, env)?;
    let raw = req.uri.path().strip_prefix(route);
    let raw = raw.and_then(|r| r.strip_prefix('/')).unwrap_or_default();
    let target = request::mount_path(raw).map_err(|e| match e {
        PathError::Invalid(msg) => ApiError::bad_request(msg),
        PathError::UnknownMount(m) => ApiError::not_found("mount", &format!("'{m}'")),
    })?;
    request::check_accept(&req.headers, produces)?;
    let current = index_of(state, &env).await?;
    // Puppet's pluginsync starts with the search of the pluginfacts
    // mount: a new run (docs/protocol.md §7.6).
    let starts_run =
        route == protocol::FILE_METADATAS && target.mount == protocol::Mount::Pluginfacts;
    let placed = placement::place(
        &state.store,
        &state.rollouts,
        &env,
        node,
        current.generation.get().copied(),
        Asking::Files { starts_run },
    );
    let index = placement::index(&state.store, &env, current.clone(), &placed)
        .await
        .map_err(unplaced)?;
    Ok(Accepted {
        stock: (node.stock_certname().is_some() || !Arc::ptr_eq(&index, &current))
            && index.generation.get().is_some(),
        placed: state.rollouts.policy(&env).is_some(),
        index,
        target,
        query,
    })
}

/// The answer when this master cannot serve the generation a node is
/// placed on: 503, another master may (docs/rollouts.md#a-replica-that-lacks-a-generation).
pub(super) fn unplaced(e: Unplaced) -> ApiError {
    ApiError::unavailable(e.to_string(), 5)
}

/// The current index of `env`, or the answer for an environment that is
/// not on disk (404), being deployed or unreadable (503).
pub(super) async fn index_of(state: &AppState, env: &EnvName) -> Result<Arc<EnvIndex>, ApiError> {
    match state.store.get(env).await {
        Lookup::Found(index) => Ok(index),
        Lookup::Unknown => Err(ApiError::unknown_environment(env.as_str())),
        Lookup::Deploying => Err(ApiError::unavailable(
            format!("environment '{env}' is being deployed; try again shortly"),
            5,
        )),
        Lookup::Unreadable => Err(ApiError::unavailable(
            format!(
                "environment '{env}' cannot be read by the master (see its log); try again shortly"
            ),
            crate::store::RETRY_UNREADABLE.as_secs() as u32,
        )),
    }
}

/// `GET /puppet/v3/file_metadatas/<mount>[/…]`: the recursive search. The
/// path after the mount is ignored, as in Puppet.
pub async fn file_metadatas(
    State(state): State<AppState>,
    Extension(node): Extension<Arc<Node>>,
    req: Parts,
) -> Result<Response, ApiError> {
    let (state, req) = (&state, &req);
    let produces = ["application/json", "text/pson"];
    let a = accept(state, req, &node, protocol::FILE_METADATAS, &produces).await?;
    let (params, max_files) = request::search_params(&a.query)?;
    let mount = a.target.mount;
    // A stock agent is heard here: the generation its listing is served
    // from, the environment's current one or, placed by a rollout, the
    // one it was placed on (docs/operating.md#the-fleet).
    if let Some(certname) = &node.certname {
        let served = match a.placed {
            true => a.index.generation.get().copied(),
            false => state.store.generations.current(&a.index.name).map(|k| k.id),
        };
        state.fleet.heard(certname, &a.index.name, None, served);
    }
    let listing = listing_for(state, &a.index, mount, &params).await?;
    let stats = &state.store.stats;
    if let Some(max) = max_files
        && listing.count > max
    {
        return Err(ApiError::bad_request(format!(
            "The listing has {} entries, which exceeds the limit of {max} specified by the max_files parameter",
            listing.count
        )));
    }
    // Decided once each: gzip accepted, the tags If-None-Match names.
    let gzip_ok = request::accepts_gzip(&req.headers);
    let tags: Vec<&str> = request::if_none_match(&req.headers).collect();
    let gzip = gzip_ok && listing.len >= GZIP_MIN;
    let etag = if gzip {
        listing.etag.gzip()
    } else {
        listing.etag.clone()
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, header_value(etag.as_str()));
    listing_headers(&mut headers);
    if listing.etag.matched_by(tags.iter().copied()) {
        state
            .store
            .stats
            .listings_not_modified
            .fetch_add(1, Ordering::Relaxed);
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    if let Some(delta) = delta_for(req, &tags, &a.index, mount, &params, &listing).await {
        stats.listings_delta.fetch_add(1, Ordering::Relaxed);
        return delta_response(delta, gzip_ok, headers).await;
    }
    state
        .store
        .stats
        .listings_sent
        .fetch_add(1, Ordering::Relaxed);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    if gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    let body = listing_body(&listing, gzip).await?;
    Ok((StatusCode::OK, headers, body).into_response())
}

/// The listing of `mount` for `params`, counted in the store's stats as a
/// cache hit or a serialisation. The fleet's listings are cached (pinned
/// by `warm`): looked up here, on the connection's own thread; only a
/// listing to serialise, gzip or inflate goes to the blocking pool.
async fn listing_for(
    state: &AppState,
    index: &Arc<EnvIndex>,
    mount: protocol::Mount,
    params: &SearchParams,
) -> Result<Arc<CachedListing>, ApiError> {
    let (listing, served) = match index.cached_listing(mount, params) {
        Some(hit) => (hit, Served::Cached),
        None => {
            let index = index.clone();
            let p: SearchParams = params.clone();
            tokio::task::spawn_blocking(move || index.listing(mount, &p))
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "listing task failed");
                    ApiError::internal()
                })?
                .map_err(listing_error)?
        }
    };
    let stats = &state.store.stats;
    match served {
        Served::Cached => stats.listing_cache_hits.fetch_add(1, Ordering::Relaxed),
        Served::Serialised { evicted } => {
            stats
                .listing_cache_evictions
                .fetch_add(evicted, Ordering::Relaxed);
            stats.listings_serialised.fetch_add(1, Ordering::Relaxed)
        }
    };
    Ok(listing)
}

/// The headers of every listing answer besides its ETag: `Vary`,
/// `Cache-Control` and where pluginsync agents fetch content by checksum.
fn listing_headers(headers: &mut HeaderMap) {
    // A shared cache must never hand a delta (asked for with our header)
    // to a stock agent (docs/protocol.md §7.5.3).
    headers.insert(header::VARY, HeaderValue::from_static(LISTING_VARY));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tells pluginsync agents they may fetch content by checksum here.
    headers.insert(
        protocol::HEADER_BLOBS,
        HeaderValue::from_static(protocol::BLOB_PREFIX),
    );
    headers.insert(
        protocol::HEADER_BLOB_BATCH,
        HeaderValue::from_static(protocol::BATCH_PATH),
    );
    // ... and that it serves generations (docs/protocol.md §7.6).
    headers.insert(
        protocol::HEADER_GENERATIONS,
        HeaderValue::from_static(protocol::ASSIGNMENT_PATH),
    );
}

/// The `226` answer carrying `delta` (docs/protocol.md §7.5), gzipped
/// when the agent accepts it (`gzip_ok`) and it is worth it; `headers`
/// are the listing's.
async fn delta_response(
    delta: Arc<DeltaListing>,
    gzip_ok: bool,
    mut headers: HeaderMap,
) -> Result<Response, ApiError> {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(protocol::DELTA_MEDIA_TYPE),
    );
    // It answers this request's If-None-Match only.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let body = if gzip_ok && delta.len() >= GZIP_MIN {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        tokio::task::spawn_blocking(move || delta.gzip())
            .await
            .map_err(|_| ApiError::internal())?
    } else {
        delta.plain()
    };
    let status = StatusCode::from_u16(protocol::DELTA_STATUS).map_err(|_| ApiError::internal())?;
    Ok((status, headers, body).into_response())
}

/// The body of `listing`, gzipped or not: the form the listing holds is
/// answered on the connection's thread; gzipping one held plain is done
/// on the blocking pool; one kept gzipped only is inflated as it is sent
/// (`index/listing.rs`'s `Inflating`: no whole inflated copy per request).
async fn listing_body(listing: &Arc<CachedListing>, gzip: bool) -> Result<Body, ApiError> {
    let ready = if gzip {
        listing.gzip_ready()
    } else {
        listing.plain_ready()
    };
    if let Some(body) = ready {
        return Ok(Body::from(body));
    }
    if !gzip && let Some(inflating) = listing.inflating() {
        return Ok(Body::new(inflating));
    }
    let l = listing.clone();
    tokio::task::spawn_blocking(move || if gzip { l.gzip() } else { l.plain() })
        .await
        .map(Body::from)
        .map_err(|_| ApiError::internal())
}

/// `Vary` of every listing answer: the body depends on gzip and, for
/// pluginsync's agent, on whether it asked for a delta (docs/protocol.md
/// §7.5.3).
const LISTING_VARY: &str = "Accept-Encoding, X-Pluginsync-Delta";

/// At most this many tags of `If-None-Match` are looked up as delta bases.
const MAX_DELTA_BASES: usize = 4;

/// The delta answering this request, if it may have one
/// (docs/protocol.md §7.5.1): it asked with `X-Pluginsync-Delta` in the
/// version this master speaks, its `If-None-Match` (`tags`) names a
/// listing the environment remembers for these parameters (only the
/// standard ones are remembered), and the delta is smaller than `listing`.
async fn delta_for(
    req: &Parts,
    tags: &[&str],
    index: &Arc<EnvIndex>,
    mount: protocol::Mount,
    params: &SearchParams,
    listing: &Arc<CachedListing>,
) -> Option<Arc<DeltaListing>> {
    let asked = req
        .headers
        .get(protocol::HEADER_DELTA)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() == protocol::DELTA_VERSION);
    if !asked {
        return None;
    }
    let bases: Vec<String> = etag::if_none_match(tags.iter().copied())
        .map(|t| etag::core(t).to_owned())
        .filter(|t| !t.is_empty() && t != "*")
        .take(MAX_DELTA_BASES)
        .collect();
    if bases.is_empty() {
        return None;
    }
    let (index, params, listing) = (index.clone(), params.clone(), listing.clone());
    tokio::task::spawn_blocking(move || {
        let bases: Vec<&str> = bases.iter().map(String::as_str).collect();
        index.delta(mount, &params, &listing, &bases)
    })
    .await
    .ok()
    .flatten()
}

/// The answer for a listing or entry that could not be made.
fn listing_error(e: ListingError) -> ApiError {
    match e {
        ListingError::BadRequest(m) => ApiError::bad_request(m),
        ListingError::Changed => ApiError::unavailable(CHANGED, 1),
        ListingError::Internal(m) => {
            tracing::error!(error = %m, "listing failed");
            ApiError::internal()
        }
    }
}

/// `GET /puppet/v3/file_metadata/<mount>[/<path>]`: one entry, with the
/// full path in `path` and a `null` `relative_path`.
pub async fn file_metadata(
    State(state): State<AppState>,
    Extension(node): Extension<Arc<Node>>,
    req: Parts,
) -> Result<Response, ApiError> {
    let (state, req) = (&state, &req);
    let produces = ["application/json", "text/pson"];
    let a = accept(state, req, &node, protocol::FILE_METADATA, &produces).await?;
    let params = SearchParams {
        recurse: false,
        recurselimit: None,
        links: request::links(&a.query)?,
        ignore: Vec::new(),
        checksum_type: request::checksum_type(&a.query)?,
        use_permissions: request::use_permissions(&a.query)?,
    };
    let key = format!("{}/{}", a.target.mount.as_str(), a.target.path);
    let index = a.index.clone();
    let (mount, path) = (a.target.mount, a.target.path.clone());
    let entry = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let m = index.mount(mount);
        let not_found = || ApiError::not_found("file_metadata", key.trim_end_matches("/."));
        let mut entry = if m.roots.is_empty() && path.is_root() {
            let (dir, view) = &m.fallback;
            index.entry(dir, ".", view, None, &params)
        } else {
            let (root, node) = index.find(mount, &path).ok_or_else(not_found)?;
            let view = node.view(params.links).ok_or_else(not_found)?;
            index.entry(
                &root.dir,
                node.rel.as_str(),
                view,
                Some((root, node)),
                &params,
            )
        }
        .map_err(listing_error)?;
        if let Some(rel) = entry.relative_path.take()
            && rel != "."
        {
            entry.path = format!("{}/{}", entry.path, rel);
        }
        Ok(entry)
    })
    .await
    .map_err(|_| ApiError::internal())??;
    let body = serde_json::to_vec(&entry).map_err(|_| ApiError::internal())?;
    Ok((
        [(header::CONTENT_TYPE, HeaderValue::from_static(JSON))],
        body,
    )
        .into_response())
}

/// `GET /puppet/v3/file_content/<mount>/<path>`: the bytes of the winning
/// module's file. Only a file the index knows is opened, without following
/// a final symlink, and only if it is still the inode that was indexed (a
/// file replaced since gets a 503 with `Retry-After` until the index has
/// caught up, so the bytes always match the advertised checksum).
pub async fn file_content(
    State(state): State<AppState>,
    Extension(node): Extension<Arc<Node>>,
    req: Parts,
) -> Result<Response, ApiError> {
    let (state, req) = (&state, &req);
    let produces = ["application/octet-stream"];
    let a = accept(state, req, &node, protocol::FILE_CONTENT, &produces).await?;
    let key = format!("{}/{}", a.target.mount.as_str(), a.target.path);
    let not_found = || ApiError::not_found("file_content", &key);
    if a.target.path.is_root() {
        return Err(not_found());
    }
    let (root, node) = a
        .index
        .find(a.target.mount, &a.target.path)
        .ok_or_else(not_found)?;
    match node.follow.as_ref() {
        Some(view) if view.kind == FileType::File && node.has_content() => {
            // A stock agent's content comes from the generation store: the
            // generation's tree may be gone or being replaced
            // (docs/deploys.md#generations); the tree when the store lacks it.
            if a.stock
                && let Some(digest) = node.sha256
            {
                match send_stored(req, state, &digest, CacheControl::Revalidate).await {
                    Err(e) if e.status == StatusCode::NOT_FOUND => {}
                    sent => return sent,
                }
            }
            let sent = &state.store.stats.contents_sent;
            send_file(req, root, node, CacheControl::Revalidate, sent).await
        }
        _ => Err(not_found()),
    }
}
