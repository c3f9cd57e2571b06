//! The router: Puppet's v3 file-serving endpoints, the health check, and
//! the layers every response goes through (`X-Puppet-Version`, request
//! bodies refused, a request timeout, panics turned into 500s, and the
//! outermost one, [`measure`]: each answer counted by endpoint and status,
//! timed and its body bytes counted for the metrics — docs/operating.md#master-metrics).
//! Outside them all, each listener's identity layer: [`router`] (the mTLS
//! listener) sets the request's `PeerIdentity` from the TLS handshake,
//! [`proxy_router`] (the `[proxy]` listener) from a trusted proxy's headers
//! (docs/protocol.md §5.2, §5.5); both set the request's
//! [`Node`](crate::placement::Node) beside it, read once for the handlers.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pluginsync_common::PUPPET_VERSION;
use pluginsync_common::envname::EnvName;
use pluginsync_common::protocol;
use pluginsync_common::rollout::HEADER_REPORT;

use crate::access::{self, AccessFormat};
use crate::api_error::ApiError;
use crate::auth::PeerIdentity;
use crate::handlers;
use crate::placement::Node;
use crate::proxy::Trust;
use crate::rollout;
use crate::state::AppState;
use crate::store::Store;

/// The mTLS listener's router: each request's [`PeerIdentity`] is taken
/// from its TLS handshake only (the `Arc<TlsInfo>` the TLS acceptor
/// inserts); identity headers are never read here (docs/protocol.md §5.2).
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    routes(state, request_timeout).layer(middleware::from_fn(tls_identity))
}

/// The `[proxy]` listener's router: the same routes, with each request's
/// [`PeerIdentity`] taken from the headers of a trusted proxy; a request
/// from outside `[proxy] trusted` is answered 403 whatever it asks
/// (docs/protocol.md §5.5).
pub fn proxy_router(state: AppState, request_timeout: Duration, trust: Arc<Trust>) -> Router {
    routes(state, request_timeout).layer(middleware::from_fn(move |req, next| {
        proxy_identity(trust.clone(), req, next)
    }))
}

/// Sets the identity from the TLS handshake, replacing anything there:
/// the one the acceptor worked out once for the connection
/// (`server/accept.rs`), else the one in its client certificate.
async fn tls_identity(mut req: Request, next: Next) -> Response {
    let identity = match req.extensions().get::<Arc<PeerIdentity>>() {
        Some(known) => known.as_ref().clone(),
        None => PeerIdentity::from_tls(
            req.extensions()
                .get::<Arc<axum_server::tls::TlsInfo>>()
                .map(Arc::as_ref),
        ),
    };
    identify(&mut req, identity);
    next.run(req).await
}

/// Sets the request's identity and the [`Node`] it comes from: its
/// certname, the report it sends, whether it is a stock agent (read once
/// here; the handlers take the node).
fn identify(req: &mut Request, identity: PeerIdentity) {
    let headers = req.headers();
    let node = Node::new(
        identity.certname(),
        headers.get(header::USER_AGENT).map(HeaderValue::as_bytes),
        headers.get(HEADER_REPORT).map(HeaderValue::as_bytes),
    );
    req.extensions_mut().insert(identity);
    req.extensions_mut().insert(Arc::new(node));
}

/// Refuses clients outside `[proxy] trusted`, then sets the identity from
/// the proxy's headers.
async fn proxy_identity(trust: Arc<Trust>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    if !peer.is_some_and(|p| trust.trusts(p.ip())) {
        if let Some(n) = trust.untrusted.note() {
            tracing::warn!(
                peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
                refused_since_last_line = n,
                "proxy listener: refused a request from outside [proxy] trusted"
            );
        }
        return ApiError::forbidden(req.uri().path()).into_response();
    }
    let identity = trust.identity(req.headers(), rustls_pki_types::UnixTime::now());
    identify(&mut req, identity);
    next.run(req).await
}

/// The routes and layers both listeners share.
fn routes(state: AppState, request_timeout: Duration) -> Router {
    let store = state.store.clone();
    let access = state.config.log.access;
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
        .route(protocol::ASSIGNMENT_PATH, get(handlers::assignment))
        .route(
            &format!("{}{{id}}", protocol::GENERATIONS_PREFIX),
            get(handlers::manifest),
        )
        .route(protocol::STATUS_SIMPLE, get(handlers::status))
        // The signed metadata, carried (docs/trust.md#what-the-masters-serve).
        .route(
            &format!("{}{{file}}", pluginsync_common::trust::METADATA_PREFIX),
            get(crate::trust::metadata::serve),
        )
        // Puppet Server's admin API, for deploy tools (docs/protocol.md §1.10).
        .route(
            handlers::admin::ENVIRONMENT_CACHE,
            axum::routing::delete(handlers::environment_cache),
        )
        // Rollout commands and status (docs/protocol.md §7.9).
        .route(
            rollout::api::ROLLOUT_PATH,
            get(handlers::rollout::status).post(handlers::rollout::command),
        )
        // Only matched routes refuse bodies: a POST to an endpoint we do not
        // serve (a stock agent's catalog request) is a plain 404.
        .route_layer(middleware::from_fn(refuse_bodies))
        // The inventory (docs/operating.md#the-fleet): `GET` only, a `POST`
        // (what a peer heard, retired) is a 405.
        .route(handlers::admin::INVENTORY, get(handlers::inventory))
        // Puppet Server's `http` report processor (docs/protocol.md §7.10).
        .route(
            handlers::reports::PUPPET_REPORTS,
            axum::routing::post(handlers::reports::puppet_report),
        )
        // A node's report after its commit carries one too (docs/protocol.md §7.8).
        .route(
            protocol::REPORT_PATH,
            axum::routing::post(handlers::node_report),
        )
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
        .layer(middleware::from_fn(move |req, next| {
            measure(store.clone(), access, req, next)
        }))
}

/// The metrics' name for the endpoint of `path`: a bounded set, never the
/// path itself (which would name files and environments).
pub fn endpoint_of(path: &str) -> &'static str {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    if under(protocol::FILE_METADATAS) {
        "file_metadatas"
    } else if under(protocol::FILE_METADATA) {
        "file_metadata"
    } else if under(protocol::FILE_CONTENT) {
        "file_content"
    } else if path.starts_with(protocol::BLOB_PREFIX) {
        "blob"
    } else if path == protocol::BATCH_PATH {
        "blob_batch"
    } else if path == protocol::ASSIGNMENT_PATH {
        "assignment"
    } else if path.starts_with(protocol::GENERATIONS_PREFIX) {
        "generation"
    } else if path.starts_with(pluginsync_common::trust::METADATA_PREFIX) {
        "trust"
    } else if path == protocol::STATUS_SIMPLE {
        "status"
    } else if path == handlers::admin::ENVIRONMENT_CACHE || path == rollout::api::ROLLOUT_PATH {
        "admin"
    } else if path == handlers::admin::INVENTORY {
        "inventory"
    } else if path == handlers::reports::PUPPET_REPORTS {
        "puppet_report"
    } else {
        "other"
    }
}

/// Counts, times and measures every answer (the outermost layer, so
/// timeouts and panics are counted too). The latency is the time to the
/// response headers; body bytes are counted as they are sent and recorded
/// when the body ends or is dropped (a client that goes away mid-body
/// counts what was sent).
async fn measure(store: Arc<Store>, format: AccessFormat, req: Request, next: Next) -> Response {
    let endpoint = endpoint_of(req.uri().path());
    let started = Instant::now();
    let access = (format != AccessFormat::Off).then(|| access_record(&req, endpoint));
    let resp = next.run(req).await;
    store
        .metrics
        .request(endpoint, resp.status().as_u16(), started.elapsed());
    let (parts, body) = resp.into_parts();
    let counted = Counted {
        inner: body,
        bytes: 0,
        endpoint,
        store,
        access: access.map(|mut r| {
            r.status = parts.status.as_u16();
            (r, format)
        }),
        started,
    };
    Response::from_parts(parts, axum::body::Body::new(counted))
}

/// What the access log knows of a request before it is answered.
fn access_record(req: &Request, endpoint: &'static str) -> access::Record {
    let certname = req
        .extensions()
        .get::<PeerIdentity>()
        .and_then(|i| i.certname().map(str::to_owned));
    let environment = crate::request::Query::parse(req.uri().query())
        .get("environment")
        .and_then(|e| e.parse::<EnvName>().ok());
    access::Record {
        time: access::now(),
        peer: req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0),
        certname,
        environment,
        endpoint,
        method: req.method().to_string(),
        target: req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_owned(), |p| p.to_string()),
        status: 0,
        bytes: 0,
        seconds: 0.0,
    }
}

/// A response body whose bytes are counted for the metrics, and whose end
/// writes the access log line.
struct Counted {
    inner: axum::body::Body,
    bytes: u64,
    endpoint: &'static str,
    store: Arc<Store>,
    access: Option<(access::Record, AccessFormat)>,
    started: Instant,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.store.metrics.response_bytes(self.endpoint, self.bytes);
        }
        if let Some((mut record, format)) = self.access.take() {
            record.bytes = self.bytes;
            record.seconds = access::seconds(self.started.elapsed());
            record.write(format);
        }
    }
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.bytes += data.len() as u64;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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

/// The real router over a real environment tree, without TLS: requests go
/// in with [`tower::ServiceExt::oneshot`]. A client certificate is supplied
/// the way the TLS acceptor supplies it, as an `Arc<TlsInfo>` extension
/// holding the DER the client presented (docs/protocol.md §5.2).
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::Router;
    use axum::body::{Body, Bytes};
    use axum::http::{HeaderMap, Request, StatusCode, header};
    use axum_server::tls::TlsInfo;
    use pluginsync_common::digest::Sha256;
    use pluginsync_common::protocol;
    use tower::ServiceExt;

    use super::router;
    use crate::auth::{Authorizer, Gate};
    use crate::config::MasterConfig;
    use crate::state::AppState;
    use crate::store::Store;

    const PROD: &[u8] = b"Facter.add(:prod) { setcode { 'production' } }\n";
    const DMZ: &[u8] = b"Facter.add(:dmz) { setcode { 'dmz' } }\n";

    /// The file endpoints, each with a path that exists in `production`.
    const FILE_ENDPOINTS: [&str; 3] = [
        "/puppet/v3/file_metadatas/plugins",
        "/puppet/v3/file_metadata/plugins/prod.rb",
        "/puppet/v3/file_content/plugins/prod.rb",
    ];

    /// A router over `production` (`prod.rb`) and `dmz` (`dmz.rb`), with
    /// `agent1` allowed `production` only and `admin` every environment.
    struct Master {
        app: Router,
        _tree: tempfile::TempDir,
    }

    async fn master(client_auth: &str) -> Master {
        let tree = tempfile::tempdir().unwrap();
        let envs = tree.path().join("envs");
        for (env, file, body) in [("production", "prod.rb", PROD), ("dmz", "dmz.rb", DMZ)] {
            let lib = envs.join(env).join("modules/m/lib");
            std::fs::create_dir_all(&lib).unwrap();
            std::fs::write(lib.join(file), body).unwrap();
        }
        let toml = format!(
            r#"environmentpath = ["{}"]
[tls]
cert = "unused-cert.pem"
key = "unused-key.pem"
ca = "unused-ca.pem"
client_auth = "{client_auth}"

[[authorization]]
certname = "agent1"
environments = ["production"]

[[authorization]]
certname = "admin"
environments = ["*"]
"#,
            envs.display()
        );
        let config = MasterConfig::parse(&toml, &tree.path().join("master.toml")).unwrap();
        config.validate().unwrap();
        let gate = Gate::new(
            Authorizer::new(&config.authorization).unwrap(),
            config.tls.client_auth.into(),
        );
        let config_fleet = config.fleet.clone();
        let config = Arc::new(config);
        let store = Store::new(config.store_settings());
        store.rebuild(crate::store::Scope::Every).await;
        let fleet = Arc::new(crate::fleet::Fleet::new(&config_fleet));
        let rollouts = Arc::new(crate::rollout::Rollouts::new(&[], store.generations.dir()));
        let state = AppState {
            config,
            store,
            gate,
            rollouts,
            fleet,
            trust_timestamp: Default::default(),
        };
        let app = router(state, Duration::from_secs(10));
        Master { app, _tree: tree }
    }

    /// What the TLS acceptor attaches for a client that presented a
    /// certificate with this subject CN (`None`: a subject without a CN).
    fn presented(cn: Option<&str>) -> Arc<TlsInfo> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "pluginsync tests");
        let cert = params.self_signed(&key).unwrap();
        let mut info = TlsInfo::default();
        info.peer_certificates = vec![cert.der().to_vec()];
        Arc::new(info)
    }

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    }

    impl Answer {
        /// Asserts a Puppet error body: status, `issue_kind`, `message`.
        fn error(&self, status: StatusCode, kind: &str, message: &str) {
            assert_eq!(self.status, status, "{:?}", self.body);
            let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
            assert_eq!(v["issue_kind"], kind, "{v}");
            assert_eq!(v["message"], message, "{v}");
        }

        fn forbidden(&self, path: &str) {
            self.error(
                StatusCode::FORBIDDEN,
                "FAILED_AUTHORIZATION",
                &format!("Not Authorized: Forbidden request: {path} (method GET)"),
            );
        }
    }

    async fn get(m: &Master, uri: &str, client: Option<&Arc<TlsInfo>>) -> Answer {
        let mut req = Request::get(uri).body(Body::empty()).unwrap();
        if let Some(info) = client {
            req.extensions_mut().insert(info.clone());
        }
        let resp = m.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(
            headers.contains_key(protocol::HEADER_PUPPET_VERSION),
            "{uri}: no X-Puppet-Version"
        );
        Answer {
            status,
            headers,
            body,
        }
    }

    /// docs/protocol.md §1.7: 400 missing `environment` → 403 no
    /// certificate → 400 bad name → 403 `[[authorization]]` → 404 unknown
    /// environment, each case failing the later checks too, so the status
    /// shows which check ran first; then 200 for an allowed request.
    #[tokio::test]
    async fn file_endpoints_check_in_puppets_order() {
        let m = master("optional").await;
        let agent1 = presented(Some("agent1"));
        let admin = presented(Some("admin"));
        for path in FILE_ENDPOINTS {
            let at = |query: &str| format!("{path}?{query}");

            // 1. No environment: 400 even without a certificate.
            get(&m, path, None).await.error(
                StatusCode::BAD_REQUEST,
                "RUNTIME_ERROR",
                "Bad Request: An environment parameter must be specified",
            );
            // 2. No certificate: 403 even for a bad environment name.
            get(&m, &at("environment=bad-name"), None)
                .await
                .forbidden(path);
            get(&m, &at("environment=production"), None)
                .await
                .forbidden(path);
            // A certificate without a CN is no identity.
            get(&m, &at("environment=production"), Some(&presented(None)))
                .await
                .forbidden(path);
            // 3. Bad name: 400, before any rule is consulted.
            get(&m, &at("environment=bad-name"), Some(&agent1))
                .await
                .error(
                    StatusCode::BAD_REQUEST,
                    "RUNTIME_ERROR",
                    "Bad Request: The environment must be purely alphanumeric, not 'bad-name'",
                );
            // 4. Refused by [[authorization]]: 403, whether the environment
            // exists or not, so a refused client cannot probe for it.
            get(&m, &at("environment=dmz"), Some(&agent1))
                .await
                .forbidden(path);
            get(&m, &at("environment=nosuch"), Some(&agent1))
                .await
                .forbidden(path);
            // 5. Allowed but unknown: 404.
            get(&m, &at("environment=nosuch"), Some(&admin))
                .await
                .error(
                    StatusCode::NOT_FOUND,
                    "RUNTIME_ERROR",
                    "Not Found: Could not find environment 'nosuch'",
                );
            // Allowed and known: 200.
            for who in [&agent1, &admin] {
                let ok = get(&m, &at("environment=production"), Some(who)).await;
                assert_eq!(ok.status, StatusCode::OK, "{path}: {:?}", ok.body);
            }
        }
        // admin's rule reaches dmz too.
        let listing = get(
            &m,
            "/puppet/v3/file_metadatas/plugins?environment=dmz",
            Some(&admin),
        )
        .await;
        assert_eq!(listing.status, StatusCode::OK, "{:?}", listing.body);
        let content = get(
            &m,
            "/puppet/v3/file_content/plugins/prod.rb?environment=production",
            Some(&agent1),
        )
        .await;
        assert_eq!(&content.body[..], PROD);
    }

    /// docs/protocol.md §7.1: the same gate, then only environments the
    /// client may read are searched.
    #[tokio::test]
    async fn blob_goes_through_the_same_gate() {
        let m = master("optional").await;
        let agent1 = presented(Some("agent1"));
        let admin = presented(Some("admin"));
        let blob = |d: &[u8]| format!("{}{}", protocol::BLOB_PREFIX, Sha256::of(d));
        let bad = format!("{}NOT-HEX", protocol::BLOB_PREFIX);

        // No certificate: 403 before the name is even looked at.
        get(&m, &bad, None).await.forbidden(&bad);
        get(&m, &blob(PROD), None).await.forbidden(&blob(PROD));
        get(&m, &blob(PROD), Some(&presented(None)))
            .await
            .forbidden(&blob(PROD));
        get(&m, &bad, Some(&agent1)).await.error(
            StatusCode::BAD_REQUEST,
            "RUNTIME_ERROR",
            "Bad Request: a blob is named by 64 lowercase hex digits of its sha256",
        );
        // dmz's file exists, but not for agent1.
        get(&m, &blob(DMZ), Some(&agent1)).await.error(
            StatusCode::NOT_FOUND,
            "RESOURCE_NOT_FOUND",
            &format!("Not Found: Could not find blob {}", Sha256::of(DMZ)),
        );
        let ok = get(&m, &blob(PROD), Some(&agent1)).await;
        assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, PROD));
        // Rules restrict who reads what: no shared cache may keep it (§7.4).
        assert_eq!(
            ok.headers[header::CACHE_CONTROL],
            "private, max-age=31536000, immutable"
        );
        let ok = get(&m, &blob(DMZ), Some(&admin)).await;
        assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, DMZ));
    }

    /// docs/protocol.md §7.2.1: the same gate; a blob the client may not
    /// read is a "missing" frame, like one that does not exist.
    #[tokio::test]
    async fn batch_goes_through_the_same_gate() {
        let m = master("optional").await;
        let (prod, dmz) = (Sha256::of(PROD), Sha256::of(DMZ));
        let uri = format!(
            "{}?{k}={prod}&{k}={dmz}",
            protocol::BATCH_PATH,
            k = protocol::BATCH_QUERY_KEY
        );
        get(&m, &uri, None).await.forbidden(protocol::BATCH_PATH);
        get(&m, &uri, Some(&presented(None)))
            .await
            .forbidden(protocol::BATCH_PATH);
        get(&m, protocol::BATCH_PATH, Some(&presented(Some("agent1"))))
            .await
            .error(
                StatusCode::BAD_REQUEST,
                "RUNTIME_ERROR",
                "Bad Request: ask for 1 to 128 sha256 values",
            );

        let found = |d: &Sha256, body: &[u8]| {
            let mut f = protocol::frame_header(d, Some(body.len() as u64)).into_bytes();
            f.extend_from_slice(body);
            f
        };
        let agent1 = get(&m, &uri, Some(&presented(Some("agent1")))).await;
        assert_eq!(agent1.status, StatusCode::OK);
        let mut want = found(&prod, PROD);
        want.extend_from_slice(protocol::frame_header(&dmz, None).as_bytes());
        assert_eq!(&agent1.body[..], &want[..]);

        let admin = get(&m, &uri, Some(&presented(Some("admin")))).await;
        assert_eq!(admin.status, StatusCode::OK);
        let mut want = found(&prod, PROD);
        want.extend_from_slice(&found(&dmz, DMZ));
        assert_eq!(&admin.body[..], &want[..]);
    }

    /// docs/protocol.md §5.1: `client_auth = "none"` needs no certificate
    /// and ignores `[[authorization]]`; a missing or bad environment is
    /// still refused in the same order.
    #[tokio::test]
    async fn client_auth_none_opens_every_environment() {
        let m = master("none").await;
        for path in FILE_ENDPOINTS {
            let ok = get(&m, &format!("{path}?environment=dmz"), None).await;
            // dmz has no prod.rb: the listing is 200, the others 404, but
            // never 403.
            assert_ne!(ok.status, StatusCode::FORBIDDEN, "{path}");
            get(&m, &format!("{path}?environment=bad-name"), None)
                .await
                .error(
                    StatusCode::BAD_REQUEST,
                    "RUNTIME_ERROR",
                    "Bad Request: The environment must be purely alphanumeric, not 'bad-name'",
                );
            get(&m, &format!("{path}?environment=nosuch"), None)
                .await
                .error(
                    StatusCode::NOT_FOUND,
                    "RUNTIME_ERROR",
                    "Not Found: Could not find environment 'nosuch'",
                );
        }
        let ok = get(
            &m,
            &format!("{}{}", protocol::BLOB_PREFIX, Sha256::of(DMZ)),
            None,
        )
        .await;
        assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, DMZ));
    }

    /// The health check is outside the gate: no certificate needed.
    #[tokio::test]
    async fn status_needs_no_certificate() {
        let m = master("optional").await;
        let ok = get(&m, protocol::STATUS_SIMPLE, None).await;
        assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, &b"running"[..]));
    }
}
