//! HTTP to the masters, and nothing else: mutual TLS, failover, one retry
//! policy, status mapping, and the bytes of listings and downloads handed
//! back to the caller (this module never touches the filesystem: the
//! staging does, see `stage.rs`).
//!
//! Only the configured CA is trusted (no system roots), the node presents
//! its certificate, and plain HTTP is refused. Requests are exactly a stock
//! agent's (docs/protocol.md §1.6, §4.2), built with `pluginsync_common::protocol`, so
//! a stock Puppet Server serves them too; a listing the agent holds is
//! revalidated with `If-None-Match` plus `X-Pluginsync-Delta`, and a delta
//! answer is handed back marked as one (§7.5).
//!
//! Failures that may pass (connection refused or reset, timeouts, 5xx, 429
//! and 503, a body cut mid-transfer) are retried with capped exponential
//! backoff and full jitter, honouring `Retry-After` ([`Client::backoff`]),
//! all before the run's deadline. Listings: `retries` attempts per server,
//! then the next server in `servers`; the first server that answers the
//! first listing is the run's [`Origin`] and answers every listing of the
//! run ([`Client::retrying`]). Downloads fail over (docs/protocol.md §4.7):
//! content is addressed by sha256 and verified as it streams, so any
//! replica serving the *same listing* may serve it — a replica is used only
//! once it answered `304 Not Modified` to the listing's own ETag
//! ([`Client::download`], [`Replicas`]), and a master that refuses
//! connections (restarting) is waited for until the deadline.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::metadata::{ApiErrorBody, FileMetadata};
use pluginsync_common::protocol::{self, ListingQuery, Mount};
use pluginsync_common::tls::TlsError;
use reqwest::StatusCode;
use reqwest::header::ACCEPT;

use crate::config::TlsFiles;

/// A request that did not produce what was asked; one line each.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No server could be reached (or kept failing) before the deadline.
    #[error("cannot reach {servers}: {detail}")]
    Unreachable {
        /// The servers tried.
        servers: String,
        /// The last error.
        detail: String,
    },
    /// The environment does not exist on the master.
    #[error("environment '{env}' not found on {server}")]
    EnvironmentNotFound {
        /// The environment.
        env: String,
        /// The server.
        server: String,
    },
    /// A non-2xx answer that retrying will not fix.
    #[error("{server} answered {status} for {what}: {message}")]
    Status {
        /// The server.
        server: String,
        /// The status line.
        status: String,
        /// What was asked.
        what: String,
        /// The server's message.
        message: String,
    },
    /// A 2xx answer that is not a listing.
    #[error("malformed listing from {server}: {detail}")]
    Malformed {
        /// The server.
        server: String,
        /// What is wrong.
        detail: String,
    },
    /// A download that failed, did not match its checksum, or could not be
    /// staged (what the body's consumer refused, see [`BodyError`]).
    #[error("download of {what} from {server} failed: {detail}")]
    Download {
        /// The server.
        server: String,
        /// Mount and path.
        what: String,
        /// What happened.
        detail: String,
    },
}

/// The client could not be set up; only [`Client::new`] says this.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A TLS file could not be read.
    #[error(transparent)]
    Read(#[from] TlsError),
    /// The CA bundle or the CRL was read but the TLS stack refused it.
    #[error("{what} '{}': {detail}", path.display())]
    Unusable {
        /// `CA bundle` or `CRL`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The TLS stack's reason, on one line.
        detail: String,
    },
    /// The certificate and key were read but do not make an identity.
    #[error("certificate '{}' and key '{}': {detail}", cert.display(), key.display())]
    Identity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The TLS stack's reason, on one line.
        detail: String,
    },
    /// The HTTP client could not be built.
    #[error("TLS client: {0}")]
    Build(String),
    /// This node's certificate is expired or not yet valid.
    #[error(transparent)]
    Certificate(#[from] crate::certs::Unusable),
}

/// Flattens an error and its sources into one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let next = c.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = c.source();
    }
    s
}

/// One line for a request error: no URL (the caller names the server),
/// and for connection failures just the innermost cause.
fn request_error(e: &reqwest::Error) -> String {
    if let Some(cause) = crate::certs::explain(e) {
        return cause;
    }
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connect() {
        let mut inner: &dyn std::error::Error = e;
        while let Some(next) = inner.source() {
            inner = next;
        }
        return format!("connection failed: {inner}");
    }
    let mut e2 = e.to_string();
    if let Some(u) = e.url() {
        e2 = e2.replace(&format!(" for url ({u})"), "");
    }
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        e2.push_str(": ");
        e2.push_str(&c.to_string());
        cur = c.source();
    }
    e2
}

/// A master and what it offers beyond Puppet's API (docs/protocol.md §7).
/// The run's origin is the master that answered its first listing: every
/// listing of the run comes from it, and content too unless it fails and a
/// replica serving the same listing takes over (docs/protocol.md §4.7).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// `https://host:port`, as configured.
    pub server: String,
    /// `X-Pluginsync-Blobs`: where it serves content by checksum, if it
    /// said so.
    pub blobs: Option<String>,
    /// `X-Pluginsync-Blob-Batch`: where it serves many blobs at once, if it
    /// said so.
    pub batch: Option<String>,
}

impl Origin {
    /// Whether it serves batches of blobs.
    pub fn serves_batches(&self) -> bool {
        self.batch.is_some()
    }
}

/// Where one resource's content comes from: the run's origin, the mount,
/// the environment, and the listing it was planned from, which a replica
/// must be serving too before it may serve the content (docs/protocol.md
/// §4.7).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The run's master.
    pub origin: &'a Origin,
    /// `plugins` or `pluginfacts`.
    pub mount: Mount,
    /// The environment.
    pub env: &'a str,
    /// `servers`, in failover order: the replicas content may come from.
    pub servers: &'a [String],
    /// The listing's query string ([`ListingQuery::to_query`]).
    pub query: &'a str,
    /// The listing's `ETag`. Without one (Puppet Server sends none) no
    /// replica can be shown to serve the same listing, and content comes
    /// from the origin only.
    pub etag: Option<&'a str>,
}

/// A listing answer.
#[derive(Debug, Clone)]
pub struct ListingAnswer {
    /// The body, or `None` for `304 Not Modified`.
    pub body: Option<Bytes>,
    /// The `ETag`, if any (of the whole listing, also for a delta).
    pub etag: Option<String>,
    /// The body is a delta from the listing `If-None-Match` named
    /// (docs/protocol.md §7.5), not a listing: `crate::delta` rebuilds it.
    pub delta: bool,
}

/// The body of a 2xx answer, read chunk by chunk as it arrives.
#[derive(Debug)]
pub struct Body {
    response: reqwest::Response,
    received: u64,
}

impl Body {
    /// The next chunk, `None` at the end; the error is one line,
    /// `transfer cut after <n> bytes: …`.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, String> {
        match self.response.chunk().await {
            Ok(chunk) => {
                if let Some(c) = &chunk {
                    self.received += c.len() as u64;
                }
                Ok(chunk)
            }
            Err(e) => Err(format!(
                "transfer cut after {} bytes: {}",
                self.received,
                request_error(&e)
            )),
        }
    }
}

/// Why the consumer of a download's [`Body`] did not take it whole.
#[derive(Debug)]
pub enum BodyError {
    /// The transfer broke off: another attempt may do better.
    Cut(String),
    /// Anything else (the bytes do not match, the staged file cannot be
    /// written): the download fails with this.
    Refused(String),
}

/// What one attempt says about retrying.
enum Attempt<T> {
    Done(T),
    Fatal(FetchError),
    Retry {
        detail: String,
        after: Option<Duration>,
        /// Whether the server was there at all: `false` only for a refused
        /// connection (nothing listens: a master that is restarting).
        reached: bool,
    },
}

/// What the run knows of the replicas, shared by every download
/// (docs/protocol.md §4.7).
#[derive(Debug, Default)]
pub struct Replicas {
    /// `(server, mount, listing ETag)` → the server's offers when it
    /// serves that very listing (it answered 304 to the ETag), `None` when
    /// it serves another. Absent: not asked yet, or it could not be asked.
    verdicts: HashMap<(String, Mount, String), Option<Origin>>,
    /// Per mount, the server the next download starts at: the last one
    /// that delivered (the origin until one failed).
    preferred: HashMap<Mount, String>,
}

/// Which replica a download's next attempt goes to.
enum Pick {
    /// This one.
    Use(Origin),
    /// None now, but a replica that could not be asked may be later.
    Wait,
    /// None: every replica failed for good or serves another listing.
    GiveUp,
}

/// The agent's HTTP client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    tls: TlsFiles,
    retries: u32,
    deadline: Instant,
    replicas: Arc<tokio::sync::Mutex<Replicas>>,
}

impl Client {
    /// Builds a client for `tls`; the run must finish by `deadline`.
    pub fn new(tls: &TlsFiles, retries: u32, deadline: Instant) -> Result<Client, SetupError> {
        use pluginsync_common::tls::{install_default_provider, read_identity_pem, read_pem};
        install_default_provider();
        // This node's certificate, before any connection: a master would
        // only answer "connection closed" (docs/tls.md#certificate-checks).
        match crate::certs::check_own(
            &tls.cert,
            std::time::SystemTime::now(),
            tls.cert_expiry_warning,
        ) {
            Ok(None) => {}
            Ok(Some(warning)) => tracing::warn!("{warning}"),
            Err(e) => return Err(SetupError::Certificate(e)),
        }
        let ca = reqwest::Certificate::from_pem_bundle(&read_pem("CA bundle", &tls.ca)?).map_err(
            |e| SetupError::Unusable {
                what: "CA bundle",
                path: tls.ca.clone(),
                detail: chain(&e),
            },
        )?;
        let identity = reqwest::Identity::from_pem(&read_identity_pem(&tls.cert, &tls.key)?)
            .map_err(|e| SetupError::Identity {
                cert: tls.cert.clone(),
                key: tls.key.clone(),
                detail: chain(&e),
            })?;
        let mut b = reqwest::Client::builder()
            .tls_certs_only(ca)
            .identity(identity)
            .https_only(true)
            .user_agent(concat!("pluginsync-agent/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            // HTTP/2 where the master offers it (ALPN): a run's parallel
            // downloads are streams of one connection, one handshake. An
            // HTTP/1.1-only agent was measured and not kept: no
            // difference in the master's CPU per no-op run beyond the
            // bench's noise (A/B, 60 runs each: 1.07/1.42 ms HTTP/2 against
            // 1.15/1.32 ms), and more connections, so more full
            // handshakes, on runs that download. Up to 16 idle connections
            // per server (HTTP/1.1 masters: one per download in flight).
            .pool_max_idle_per_host(crate::config::DEFAULT_PARALLEL_DOWNLOADS)
            // A 3xx is an answer, never a hop: the node's certificate and
            // its requests go to the configured server only
            // (docs/protocol.md §4.4).
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(crl) = &tls.crl {
            let crls =
                reqwest::tls::CertificateRevocationList::from_pem_bundle(&read_pem("CRL", crl)?)
                    .map_err(|e| SetupError::Unusable {
                        what: "CRL",
                        path: crl.clone(),
                        detail: chain(&e),
                    })?;
            b = b.tls_crls_only(crls);
        }
        let http = b.build().map_err(|e| SetupError::Build(chain(&e)))?;
        Ok(Client {
            http,
            tls: tls.clone(),
            retries: retries.max(1),
            deadline,
            replicas: Arc::default(),
        })
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Fetches a listing from the first server of `servers` that answers;
    /// that server, with what its answer offers, becomes the run's
    /// [`Origin`]. `if_none_match` gives the `If-None-Match` for a server.
    /// Errors that are the master's final word (404 environment, 403, 400)
    /// do not fail over.
    pub async fn first_listing(
        &self,
        servers: &[String],
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Origin, ListingAnswer), FetchError> {
        let mut last = String::from("no server configured");
        for server in servers {
            let inm = if_none_match(server);
            match self
                .fetch_listing(server, mount, query, inm.as_deref())
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(FetchError::Unreachable { detail, .. }) => {
                    tracing::info!(server = %server, error = %detail, "server unavailable, trying the next one");
                    last = detail;
                }
                Err(e) => return Err(e),
            }
            if self.remaining().is_zero() {
                break;
            }
        }
        // A closed connection may be a refused client certificate (TLS 1.3
        // alerts come after the handshake): ask once more, plainly, why.
        if !last.contains("Connection refused")
            && last != "timed out"
            && let Some(server) = servers.last()
            && let Some(cause) = crate::certs::probe(server, &self.tls).await
        {
            last = cause;
        }
        Err(FetchError::Unreachable {
            servers: servers.join(", "),
            detail: last,
        })
    }

    /// Fetches one listing from the run's `origin`; sends `If-None-Match`
    /// when given (with `X-Pluginsync-Delta`: a delta may come back,
    /// docs/protocol.md §7.5) and returns `body: None` on a 304.
    pub async fn listing(
        &self,
        origin: &Origin,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: Option<&str>,
    ) -> Result<ListingAnswer, FetchError> {
        let (_, answer) = self
            .fetch_listing(&origin.server, mount, query, if_none_match)
            .await?;
        Ok(answer)
    }

    /// One listing from `server`, with retries, and what its headers offer.
    async fn fetch_listing(
        &self,
        server: &str,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: Option<&str>,
    ) -> Result<(Origin, ListingAnswer), FetchError> {
        let url = query.url(server, mount);
        let what = format!("the {mount} listing");
        let header = |resp: &reqwest::Response, name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let attempt = async || {
            let mut req = self
                .http
                .get(&url)
                .header(ACCEPT, protocol::ACCEPT_LISTING)
                .header(
                    protocol::HEADER_PUPPET_VERSION,
                    pluginsync_common::PUPPET_VERSION,
                )
                .timeout(self.remaining());
            if let Some(tag) = if_none_match {
                // Only with a cached listing to apply it to: a delta names
                // its base by this very tag (docs/protocol.md §7.5.1).
                req = req
                    .header("If-None-Match", tag)
                    .header(protocol::HEADER_DELTA, protocol::DELTA_VERSION);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => return transient(&e),
            };
            let offered = |name: &str| {
                let value = header(&resp, name)?;
                let path = same_origin_path(server, &value);
                if path.is_none() {
                    tracing::warn!(server = %server, header = %name, value = %value.escape_debug(), "not a path on this server, ignored");
                }
                path
            };
            let origin = Origin {
                server: server.to_owned(),
                blobs: offered(protocol::HEADER_BLOBS),
                batch: offered(protocol::HEADER_BLOB_BATCH),
            };
            let etag = header(&resp, "etag");
            if resp.status() == StatusCode::NOT_MODIFIED && if_none_match.is_some() {
                return Attempt::Done((
                    origin,
                    ListingAnswer {
                        body: None,
                        etag,
                        delta: false,
                    },
                ));
            }
            // A delta only counts as one when it was asked for; anything
            // else in a 2xx is read as a listing (and refused if it is not).
            let delta = if_none_match.is_some()
                && resp.status().as_u16() == protocol::DELTA_STATUS
                && header(&resp, "content-type")
                    .is_some_and(|t| t.starts_with(protocol::DELTA_MEDIA_TYPE));
            let resp = match self
                .check_status(server, query.environment, &what, resp)
                .await
            {
                Ok(r) => r,
                Err(a) => return a,
            };
            match read_capped(resp, MAX_LISTING_BYTES).await {
                (b, Ok(true)) => Attempt::Done((
                    origin,
                    ListingAnswer {
                        body: Some(b),
                        etag,
                        delta,
                    },
                )),
                (_, Ok(false)) => Attempt::Fatal(FetchError::Malformed {
                    server: server.to_owned(),
                    detail: format!(
                        "the {mount} listing is larger than {} MiB (inflated); refused",
                        MAX_LISTING_BYTES >> 20
                    ),
                }),
                (_, Err(e)) => transient(&e),
            }
        };
        self.retrying(server, &what, attempt, |detail| FetchError::Unreachable {
            servers: server.to_owned(),
            detail,
        })
        .await
    }

    /// Asks `servers`, in order, which environment the node classifier
    /// assigns to `certname`: `GET /puppet/v3/node/<certname>` with the
    /// query and headers of Puppet's agent (docs/protocol.md §4.10).
    /// `Ok(None)` when the first server that answers says 404 (a pluginsync
    /// master does not serve the node endpoint); an unreachable server
    /// fails over to the next. The answer is read up to [`MAX_NODE_BYTES`].
    pub async fn node_environment(
        &self,
        servers: &[String],
        certname: &str,
        configured: &str,
    ) -> Result<Option<(String, String)>, FetchError> {
        let uuid = transaction_uuid();
        let what = "the node";
        let mut last = String::from("no server configured");
        for server in servers {
            let url = format!(
                "{server}/puppet/v3/node/{}?environment={}&configured_environment={}&transaction_uuid={uuid}",
                pluginsync_common::urlpath::encode_path(certname),
                pluginsync_common::urlpath::encode_query_value(configured),
                pluginsync_common::urlpath::encode_query_value(configured),
            );
            let attempt = async || {
                let resp = match self
                    .http
                    .get(&url)
                    .header(ACCEPT, "application/json")
                    .header(
                        protocol::HEADER_PUPPET_VERSION,
                        pluginsync_common::PUPPET_VERSION,
                    )
                    .timeout(self.remaining())
                    .send()
                    .await
                {
                    Ok(r) => r,
                    Err(e) => return transient(&e),
                };
                if resp.status() == StatusCode::NOT_FOUND {
                    return Attempt::Done(None);
                }
                let resp = match self.check_status(server, configured, what, resp).await {
                    Ok(r) => r,
                    Err(a) => return a,
                };
                let malformed = |detail: String| {
                    Attempt::Fatal(FetchError::Status {
                        server: server.clone(),
                        status: "200 OK".into(),
                        what: what.into(),
                        message: detail,
                    })
                };
                match read_capped(resp, MAX_NODE_BYTES).await {
                    (b, Ok(true)) => match serde_json::from_slice::<NodeAnswer>(&b) {
                        Ok(n) => Attempt::Done(Some((server.clone(), n.environment))),
                        Err(e) => malformed(format!("not a node object: {e}")),
                    },
                    (_, Ok(false)) => malformed(format!(
                        "the node object is larger than {} KiB; refused",
                        MAX_NODE_BYTES >> 10
                    )),
                    (_, Err(e)) => transient(&e),
                }
            };
            match self
                .retrying(server, what, attempt, |detail| FetchError::Unreachable {
                    servers: server.clone(),
                    detail,
                })
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(FetchError::Unreachable { detail, .. }) => {
                    tracing::info!(server = %server, error = %detail, "server unavailable for the node request, trying the next one");
                    last = detail;
                }
                Err(e) => return Err(e),
            }
            if self.remaining().is_zero() {
                break;
            }
        }
        Err(FetchError::Unreachable {
            servers: servers.join(", "),
            detail: last,
        })
    }

    /// Parses a listing body: a JSON array of at most
    /// [`MAX_LISTING_ENTRIES`] metadata objects (refused as soon as the one
    /// after the last allowed is read, before it is kept).
    pub fn parse_listing(server: &str, body: &[u8]) -> Result<Vec<FileMetadata>, FetchError> {
        serde_json::from_slice::<Capped>(body)
            .map(|c| c.0)
            .map_err(|e| FetchError::Malformed {
                server: server.to_owned(),
                detail: e.to_string(),
            })
    }

    /// Asks the batch endpoint of the replica that serves `src` now (the
    /// origin until a download failed over) for `hashes`; returns the body
    /// to read frame by frame (retried on transient failures before the
    /// first byte). `None` when that replica serves no batches.
    pub async fn batch(
        &self,
        src: &Source<'_>,
        hashes: &[Sha256],
    ) -> Option<Result<Body, FetchError>> {
        let replica = match self.pick(src, None, &HashSet::new()).await {
            Pick::Use(r) => r,
            Pick::Wait | Pick::GiveUp => src.origin.clone(),
        };
        let path = replica.batch.as_deref()?;
        let server = replica.server.as_str();
        let url = format!(
            "{}{path}?{}",
            server.trim_end_matches('/'),
            protocol::batch_query(hashes)
        );
        let what = format!("a batch of {} {} files", hashes.len(), src.mount);
        let attempt = async || {
            let req = self
                .http
                .get(&url)
                .header(ACCEPT, protocol::BLOBS_MEDIA_TYPE)
                .timeout(self.remaining());
            match req.send().await {
                Ok(resp) => match self.check_status(server, src.env, &what, resp).await {
                    Ok(response) => Attempt::Done(Body {
                        response,
                        received: 0,
                    }),
                    Err(a) => a,
                },
                Err(e) => transient(&e),
            }
        };
        Some(
            self.retrying(server, &what, attempt, |detail| FetchError::Unreachable {
                servers: server.to_owned(),
                detail,
            })
            .await,
        )
    }

    /// Fetches `<mount>/<rel>` and hands each 2xx body to `take`, which
    /// writes and verifies it (it must start over on every call: a retry
    /// is a whole new body, from whichever replica).
    ///
    /// Each attempt goes to one replica ([`Client::download_once`]): first
    /// the one that delivered last for this mount (the origin to begin
    /// with), after a failure the next one in `servers` order that serves
    /// the same listing (checked once per replica, [`Client::verdict`]),
    /// wrapping around. A transient failure waits the one backoff
    /// ([`Client::backoff`]) before the next attempt. A replica that
    /// answered and failed `retries` times is not asked again; one that
    /// refuses connections (a master restarting) is asked again until the
    /// run's deadline. A [`BodyError::Refused`], a checksum mismatch or a
    /// final status fails the download at once.
    pub async fn download<T>(
        &self,
        src: &Source<'_>,
        rel: &str,
        sha256: &str,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Result<T, FetchError> {
        let what = format!("{}/{rel}", src.mount);
        let mut failures: HashMap<String, u32> = HashMap::new();
        let mut exhausted: HashSet<String> = HashSet::new();
        let mut last: Option<(String, String)> = None;
        let give_up = |last: Option<(String, String)>, why: &str| {
            let (server, detail) =
                last.unwrap_or_else(|| (src.origin.server.clone(), "no replica left".into()));
            FetchError::Download {
                server,
                what: what.clone(),
                detail: format!("{why}{detail}"),
            }
        };
        for n in 0u32.. {
            if self.remaining().is_zero() {
                let why = "run deadline reached: ";
                return Err(give_up(last, why));
            }
            let previous = last.as_ref().map(|(s, _)| s.as_str());
            let replica = match self.pick(src, previous, &exhausted).await {
                Pick::Use(r) => r,
                Pick::GiveUp => return Err(give_up(last, "")),
                Pick::Wait => {
                    self.backoff(n, None).await;
                    continue;
                }
            };
            match self.download_once(&replica, src, rel, sha256, take).await {
                Attempt::Done(v) => {
                    self.prefer(src.mount, &replica.server).await;
                    return Ok(v);
                }
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry {
                    detail,
                    after,
                    reached,
                } => {
                    let server = replica.server;
                    tracing::info!(server = %server, what = %what, attempt = n + 1, error = %detail, "download failed");
                    if reached {
                        let count = failures.entry(server.clone()).or_default();
                        *count += 1;
                        if *count >= self.retries {
                            exhausted.insert(server.clone());
                        }
                    }
                    self.avoid(src, &server).await;
                    last = Some((server, detail));
                    self.backoff(n, after).await;
                }
            }
        }
        unreachable!("the attempts loop returns")
    }

    /// One attempt at `replica`: by checksum where it offers blobs (cacheable
    /// by any HTTP cache in front of it), else from Puppet's `file_content`,
    /// which is also the fallback when a blob is not found.
    async fn download_once<T>(
        &self,
        replica: &Origin,
        src: &Source<'_>,
        rel: &str,
        sha256: &str,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Attempt<T> {
        let server = replica.server.trim_end_matches('/');
        if let Some(prefix) = replica.blobs.as_deref().filter(|p| p.starts_with('/')) {
            let url = format!("{server}{prefix}{sha256}");
            match self.fetch_into(replica, src, &url, rel, take).await {
                Attempt::Fatal(FetchError::Status { status, .. }) if status.starts_with("404") => {
                    tracing::info!(file = %rel, "blob not found, falling back to file_content");
                }
                other => return other,
            }
        }
        let url = protocol::content_url(server, src.mount, rel, src.env);
        self.fetch_into(replica, src, &url, rel, take).await
    }

    /// One GET of `url` into `take`.
    async fn fetch_into<T>(
        &self,
        replica: &Origin,
        src: &Source<'_>,
        url: &str,
        rel: &str,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Attempt<T> {
        let server = replica.server.as_str();
        let what = format!("{}/{rel}", src.mount);
        let req = self
            .http
            .get(url)
            .header(ACCEPT, protocol::ACCEPT_CONTENT)
            .header(
                protocol::HEADER_PUPPET_VERSION,
                pluginsync_common::PUPPET_VERSION,
            )
            .timeout(self.remaining());
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return transient(&e),
        };
        let response = match self.check_status(server, src.env, &what, resp).await {
            Ok(r) => r,
            Err(a) => return a,
        };
        match take(Body {
            response,
            received: 0,
        })
        .await
        {
            Ok(v) => Attempt::Done(v),
            Err(BodyError::Cut(detail)) => Attempt::Retry {
                detail,
                after: None,
                reached: true,
            },
            Err(BodyError::Refused(detail)) => Attempt::Fatal(FetchError::Download {
                server: server.to_owned(),
                what,
                detail,
            }),
        }
    }

    /// The replica for `src`'s next attempt: the servers in order from the
    /// one after `after` (a first attempt: from the preferred one), minus
    /// `exhausted`; the origin is always eligible, any other server only
    /// once it showed that it serves the same listing.
    async fn pick(
        &self,
        src: &Source<'_>,
        after: Option<&str>,
        exhausted: &HashSet<String>,
    ) -> Pick {
        let ring = ring(src);
        let start = match after {
            Some(s) => ring.iter().position(|r| *r == s).map_or(0, |i| i + 1),
            None => {
                let preferred = self
                    .replicas
                    .lock()
                    .await
                    .preferred
                    .get(&src.mount)
                    .cloned();
                preferred
                    .and_then(|p| ring.iter().position(|r| *r == p))
                    .unwrap_or(0)
            }
        };
        let mut unknown = false;
        for k in 0..ring.len() {
            let server = ring[(start + k) % ring.len()];
            if exhausted.contains(server) {
                continue;
            }
            if server == src.origin.server {
                return Pick::Use(src.origin.clone());
            }
            match self.verdict(src, server).await {
                Some(Some(offers)) => return Pick::Use(offers),
                Some(None) => {}
                None => unknown = true,
            }
        }
        if unknown { Pick::Wait } else { Pick::GiveUp }
    }

    /// Whether `server` serves the listing `src` was planned from: asked
    /// once per run and mount (`If-None-Match: <ETag>`, one attempt; only
    /// a `304` says yes), and remembered unless it could not be asked.
    /// `Some(None)`: it serves another listing, or there is no ETag to
    /// compare; `None`: it could not be asked now.
    async fn verdict(&self, src: &Source<'_>, server: &str) -> Option<Option<Origin>> {
        let Some(etag) = src.etag else {
            return Some(None);
        };
        let key = (server.to_owned(), src.mount, etag.to_owned());
        // Held while asking, so that parallel downloads ask once.
        let mut replicas = self.replicas.lock().await;
        if let Some(v) = replicas.verdicts.get(&key) {
            return Some(v.clone());
        }
        let url = format!(
            "{}{}/{}?{}",
            server.trim_end_matches('/'),
            protocol::FILE_METADATAS,
            src.mount,
            src.query
        );
        let req = self
            .http
            .get(&url)
            .header(ACCEPT, protocol::ACCEPT_LISTING)
            .header(
                protocol::HEADER_PUPPET_VERSION,
                pluginsync_common::PUPPET_VERSION,
            )
            .header("If-None-Match", etag)
            .timeout(self.remaining().min(Duration::from_secs(10)));
        let verdict = match req.send().await {
            Ok(resp) if resp.status() == StatusCode::NOT_MODIFIED => {
                let offered = |name: &str| {
                    let value = resp.headers().get(name)?.to_str().ok()?;
                    same_origin_path(server, value)
                };
                Some(Origin {
                    server: server.to_owned(),
                    blobs: offered(protocol::HEADER_BLOBS),
                    batch: offered(protocol::HEADER_BLOB_BATCH),
                })
            }
            // Any other final answer: another listing (a 200 is never read).
            Ok(resp)
                if !resp.status().is_server_error()
                    && resp.status() != StatusCode::TOO_MANY_REQUESTS =>
            {
                None
            }
            Ok(resp) => {
                tracing::info!(server = %server, status = %resp.status(), "replica could not be asked");
                return None;
            }
            Err(e) => {
                tracing::info!(server = %server, error = %request_error(&e), "replica could not be asked");
                return None;
            }
        };
        match &verdict {
            Some(_) => {
                tracing::info!(server = %server, mount = %src.mount, "replica serves the same listing")
            }
            None => {
                tracing::info!(server = %server, mount = %src.mount, "replica serves another listing; not used")
            }
        }
        replicas.verdicts.insert(key, verdict.clone());
        Some(verdict)
    }

    /// `server` delivered: the next downloads of `mount` start there.
    async fn prefer(&self, mount: Mount, server: &str) {
        let mut replicas = self.replicas.lock().await;
        if replicas.preferred.get(&mount).map(String::as_str) != Some(server) {
            replicas.preferred.insert(mount, server.to_owned());
        }
    }

    /// `server` failed: if the next downloads of `src`'s mount would start
    /// there, they start at the server after it instead.
    async fn avoid(&self, src: &Source<'_>, server: &str) {
        let ring = ring(src);
        let mut replicas = self.replicas.lock().await;
        let current = replicas
            .preferred
            .get(&src.mount)
            .map_or(src.origin.server.as_str(), String::as_str);
        if current == server
            && let Some(i) = ring.iter().position(|r| *r == server)
        {
            let next = ring[(i + 1) % ring.len()].to_owned();
            replicas.preferred.insert(src.mount, next);
        }
    }

    /// Turns a response into itself (2xx) or the right kind of failure.
    async fn check_status<T>(
        &self,
        server: &str,
        env: &str,
        what: &str,
        resp: reqwest::Response,
    ) -> Result<reqwest::Response, Attempt<T>> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = read_capped(resp, MAX_ERROR_BODY).await.0;
        if status.is_redirection() {
            return Err(Attempt::Fatal(FetchError::Status {
                server: server.to_owned(),
                status: status.to_string(),
                what: what.to_owned(),
                message: format!(
                    "redirect to {} not followed",
                    location.as_deref().unwrap_or("nowhere")
                ),
            }));
        }
        let message = serde_json::from_slice::<ApiErrorBody>(&body)
            .map(|b| b.message)
            .unwrap_or_else(|_| {
                String::from_utf8_lossy(&body)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect()
            });
        if status == StatusCode::NOT_FOUND && message.contains("Could not find environment") {
            return Err(Attempt::Fatal(FetchError::EnvironmentNotFound {
                env: env.to_owned(),
                server: server.to_owned(),
            }));
        }
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            return Err(Attempt::Retry {
                detail: format!("{server} answered {status} for {what}: {message}"),
                after: retry_after,
                reached: true,
            });
        }
        Err(Attempt::Fatal(FetchError::Status {
            server: server.to_owned(),
            status: status.to_string(),
            what: what.to_owned(),
            message,
        }))
    }

    /// The one retry policy: up to `retries` attempts at `server`, waiting
    /// in between ([`Client::backoff`]), never past the run's deadline.
    /// When the attempts or the time run out, `give_up` turns the last
    /// transient failure into the error.
    async fn retrying<T>(
        &self,
        server: &str,
        what: &str,
        mut attempt: impl AsyncFnMut() -> Attempt<T>,
        give_up: impl FnOnce(String) -> FetchError,
    ) -> Result<T, FetchError> {
        let mut last = String::new();
        for n in 0..self.retries {
            if self.remaining().is_zero() {
                return Err(give_up(format!("run deadline reached ({last})")));
            }
            match attempt().await {
                Attempt::Done(v) => return Ok(v),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { detail, after, .. } => {
                    tracing::info!(server = %server, what = %what, attempt = n + 1, error = %detail, "request failed");
                    last = detail;
                    if n + 1 < self.retries {
                        self.backoff(n, after).await;
                    }
                }
            }
        }
        Err(give_up(last))
    }

    /// Waits before attempt `n + 1` (capped exponential backoff with full
    /// jitter, or the server's `Retry-After`), within the deadline.
    async fn backoff(&self, n: u32, after: Option<Duration>) {
        let cap = Duration::from_millis(200 * (1u64 << n.min(5))).min(Duration::from_secs(5));
        let wait = after.unwrap_or_else(|| cap.mul_f64(rand::random::<f64>()));
        tokio::time::sleep(wait.min(self.remaining())).await;
    }
}

/// `value` (an `X-Pluginsync-Blobs` or `X-Pluginsync-Blob-Batch` header)
/// if it is an absolute path on `server` itself, else `None`: it starts
/// with one `/`, has no `..` segment, no `@`, `\\`, `?`, `#`, scheme,
/// space or control character, and `server` followed by it parses as a URL
/// of the same origin with exactly that path. The agent's requests (and its
/// client certificate) never go to a host a listing names
/// (docs/protocol.md §7.3).
pub fn same_origin_path(server: &str, value: &str) -> Option<String> {
    let plain = value.starts_with('/')
        && !value.starts_with("//")
        && !value.contains("://")
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'@' | b'\\' | b'?' | b'#'))
        && !value.split('/').any(|seg| seg == ".." || seg == ".");
    if !plain {
        return None;
    }
    let base = reqwest::Url::parse(server).ok()?;
    let url = reqwest::Url::parse(&format!("{}{value}", server.trim_end_matches('/'))).ok()?;
    (url.origin() == base.origin() && url.path() == value && url.username().is_empty())
        .then(|| value.to_owned())
}

/// The most bytes of a listing body the agent reads, after gzip is undone
/// (docs/protocol.md §4.3): a real listing of 100,000 entries is ~40 MiB.
pub const MAX_LISTING_BYTES: usize = 256 << 20;

/// The most entries a listing may have (docs/protocol.md §4.3).
pub const MAX_LISTING_ENTRIES: usize = 250_000;

/// The most bytes of an error answer's body read for its message; the rest
/// is dropped with the connection.
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// Reads `resp`'s body (inflated, when the master gzipped it) up to `cap`
/// bytes. `Ok(false)` with what was read when there was more: the rest is
/// never read (the connection is dropped), so a gzip bomb or an endless
/// body costs at most `cap` bytes of memory.
async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> (Bytes, Result<bool, reqwest::Error>) {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    let room = cap - body.len();
                    body.extend_from_slice(&chunk[..room]);
                    return (Bytes::from(body), Ok(false));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return (Bytes::from(body), Ok(true)),
            Err(e) => return (Bytes::from(body), Err(e)),
        }
    }
}

/// The most bytes of a node object read (docs/protocol.md §4.10): a node
/// with its facts and parameters is a few KiB; more is refused.
pub const MAX_NODE_BYTES: usize = 1 << 20;

/// What the agent reads of a node object: the assigned environment.
#[derive(serde::Deserialize)]
struct NodeAnswer {
    environment: String,
}

/// A random (version 4) UUID, as Puppet's agent sends one per run.
fn transaction_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A listing of at most [`MAX_LISTING_ENTRIES`] entries.
struct Capped(Vec<FileMetadata>);

impl<'de> serde::Deserialize<'de> for Capped {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Capped, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Capped;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array of file metadata")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Capped, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(m) = seq.next_element::<FileMetadata>()? {
                    if out.len() == MAX_LISTING_ENTRIES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_LISTING_ENTRIES} entries; refused"
                        )));
                    }
                    out.push(m);
                }
                Ok(Capped(out))
            }
        }
        d.deserialize_seq(Visitor)
    }
}

/// A request that failed before an answer: worth another attempt.
fn transient<T>(e: &reqwest::Error) -> Attempt<T> {
    Attempt::Retry {
        detail: request_error(e),
        after: None,
        reached: !refused(e),
    }
}

/// Whether `e` is a refused connection: nothing listens on the port (a
/// master that is down or restarting), as opposed to one that answered
/// badly.
fn refused(e: &reqwest::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// `src`'s replicas in the order downloads try them: the origin, then the
/// servers after it in `servers`, wrapping around.
fn ring<'a>(src: &'a Source<'a>) -> Vec<&'a str> {
    let servers: Vec<&str> = src.servers.iter().map(String::as_str).collect();
    match servers.iter().position(|s| *s == src.origin.server) {
        Some(i) => servers[i..].iter().chain(&servers[..i]).copied().collect(),
        None => std::iter::once(src.origin.server.as_str())
            .chain(servers)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_locations_are_paths_on_the_server_itself() {
        let s = "https://puppet:8140";
        for ok in [
            "/pluginsync/v1/blobs",
            "/pluginsync/v1/blobs/sha256/",
            "/a%20b/",
        ] {
            assert_eq!(same_origin_path(s, ok).as_deref(), Some(ok), "{ok}");
        }
        for bad in [
            "@127.0.0.1:9/x",
            "/@127.0.0.1:9/x",
            "//evil:443/x",
            "https://evil/x",
            "/x/../../y",
            "/./x",
            "x/y",
            "",
            "/a b",
            "/a\\b",
            "/a?b",
            "/a#b",
            "/a\u{1b}b",
            "/a:b@evil/",
        ] {
            assert_eq!(same_origin_path(s, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn downloads_try_the_origin_then_the_servers_after_it() {
        let servers: Vec<String> = ["https://a", "https://b", "https://c"]
            .map(str::to_owned)
            .to_vec();
        let origin = |s: &str| Origin {
            server: s.to_owned(),
            ..Origin::default()
        };
        let src = |o: &'static Origin, servers: &'static [String]| Source {
            origin: o,
            mount: Mount::Plugins,
            env: "production",
            servers,
            query: "",
            etag: None,
        };
        let servers: &'static [String] = servers.leak();
        let b: &'static Origin = Box::leak(Box::new(origin("https://b")));
        assert_eq!(
            ring(&src(b, servers)),
            ["https://b", "https://c", "https://a"]
        );
        // `--server` lists may not name the origin (never in practice).
        let x: &'static Origin = Box::leak(Box::new(origin("https://x")));
        assert_eq!(
            ring(&src(x, servers)),
            ["https://x", "https://a", "https://b", "https://c"]
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_told_from_a_server_that_answered_badly() {
        pluginsync_common::tls::install_default_provider();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert!(refused(&e), "{e:?}");
        assert!(matches!(
            transient::<()>(&e),
            Attempt::Retry { reached: false, .. }
        ));
        // A peer that accepts and hangs up without an answer was reached.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || drop(l.accept()));
        let e = reqwest::Client::new()
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap_err();
        assert!(!refused(&e), "{e:?}");
    }

    #[test]
    fn a_listing_with_too_many_entries_is_refused() {
        let entry = r#"{"path":"/m","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{"type":"ctime","value":"{ctime}x"},"type":"directory","destination":null}"#;
        let body = |n: usize| format!("[{}]", vec![entry; n].join(","));
        let ok = Client::parse_listing("s", body(MAX_LISTING_ENTRIES).as_bytes()).unwrap();
        assert_eq!(ok.len(), MAX_LISTING_ENTRIES);
        let e = Client::parse_listing("s", body(MAX_LISTING_ENTRIES + 1).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 250000 entries"), "{e}");
        assert!(Client::parse_listing("s", b"{}").is_err());
    }
}
