//! Talking to masters: mutual TLS, failover, retries, verified downloads.
//!
//! Only the configured CA is trusted (no system roots), the node presents
//! its certificate, and plain HTTP is refused. Requests are exactly a stock
//! agent's (PROTOCOL.md §7.2), so a stock Puppet Server serves them too.
//!
//! Failures that may pass (connection refused or reset, timeouts, 5xx, 429
//! and 503) are retried `retries` times per server with capped exponential
//! backoff and full jitter, honouring `Retry-After`; then the next server in
//! `servers` is tried, all before the run's deadline. The first server that
//! answers the first listing serves the whole run, so listings and content
//! come from the same master.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pluginsync_common::checksum::Sha256Stream;
use pluginsync_common::digest::Sha256;
use pluginsync_common::metadata::{ApiErrorBody, FileMetadata};
use pluginsync_common::protocol::{self, ListingQuery, Mount};
use reqwest::StatusCode;
use reqwest::header::ACCEPT;
use tokio::io::AsyncWriteExt;

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
    /// A download that failed or did not match its checksum.
    #[error("download of {what} from {server} failed: {detail}")]
    Download {
        /// The server.
        server: String,
        /// Mount and path.
        what: String,
        /// What happened.
        detail: String,
    },
    /// The TLS files could not be loaded.
    #[error("{0}")]
    Setup(String),
}

/// Flattens an error and its sources into one line.
pub fn chain(e: &dyn std::error::Error) -> String {
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
pub fn request_error(e: &reqwest::Error) -> String {
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

/// The agent's HTTP client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    retries: u32,
    deadline: Instant,
}

/// Where content comes from: the run's server, the mount, the
/// environment, and the master's blob prefix if it advertised one.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// `https://host:port`.
    pub server: &'a str,
    /// `plugins` or `pluginfacts`.
    pub mount: Mount,
    /// The environment.
    pub env: &'a str,
    /// `X-Pluginsync-Blobs` of the listing, if any.
    pub blobs: Option<&'a str>,
    /// `X-Pluginsync-Blob-Batch` of the listing, if any.
    pub batch: Option<&'a str>,
}

/// A listing answer.
#[derive(Debug, Clone)]
pub struct ListingAnswer {
    /// The body, or `None` for `304 Not Modified`.
    pub body: Option<bytes::Bytes>,
    /// The `ETag`, if any.
    pub etag: Option<String>,
    /// `X-Pluginsync-Blobs`: where this master serves content by checksum.
    pub blobs: Option<String>,
    /// `X-Pluginsync-Blob-Batch`: where it serves many blobs at once.
    pub batch: Option<String>,
}

/// What one attempt says about retrying.
enum Attempt<T> {
    Done(T),
    Fatal(FetchError),
    Retry {
        detail: String,
        after: Option<Duration>,
    },
}

impl Client {
    /// Builds a client for `tls`; the run must finish by `deadline`.
    pub fn new(tls: &TlsFiles, retries: u32, deadline: Instant) -> Result<Client, FetchError> {
        pluginsync_common::tls::install_default_provider();
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p).map_err(|e| {
                FetchError::Setup(format!("cannot read {what} '{}': {e}", p.display()))
            })
        };
        let ca =
            reqwest::Certificate::from_pem_bundle(&read(&tls.ca, "CA bundle")?).map_err(|e| {
                FetchError::Setup(format!("CA bundle '{}': {}", tls.ca.display(), chain(&e)))
            })?;
        let mut identity = read(&tls.cert, "certificate")?;
        identity.push(b'\n');
        identity.extend(read(&tls.key, "private key")?);
        let identity = reqwest::Identity::from_pem(&identity).map_err(|e| {
            FetchError::Setup(format!(
                "certificate '{}' and key '{}': {}",
                tls.cert.display(),
                tls.key.display(),
                chain(&e)
            ))
        })?;
        let mut b = reqwest::Client::builder()
            .tls_certs_only(ca)
            .identity(identity)
            .https_only(true)
            .user_agent(concat!("pluginsync-agent/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(8)
            .no_proxy();
        if let Some(crl) = &tls.crl {
            let crls = reqwest::tls::CertificateRevocationList::from_pem_bundle(&read(crl, "CRL")?)
                .map_err(|e| {
                    FetchError::Setup(format!("CRL '{}': {}", crl.display(), chain(&e)))
                })?;
            b = b.tls_crls_only(crls);
        }
        let http = b
            .build()
            .map_err(|e| FetchError::Setup(format!("TLS client: {}", chain(&e))))?;
        Ok(Client {
            http,
            retries: retries.max(1),
            deadline,
        })
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Fetches a listing from the first server of `servers` that answers;
    /// returns that server with the entries. Errors that are the master's
    /// final word (404 environment, 403, 400) do not fail over.
    pub async fn first_listing(
        &self,
        servers: &[String],
        mount: Mount,
        env: &str,
        source_permissions: &str,
        ignore: &[String],
        if_none_match: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(String, ListingAnswer), FetchError> {
        let mut last = String::from("no server configured");
        for server in servers {
            let inm = if_none_match(server);
            match self
                .listing(
                    server,
                    mount,
                    env,
                    source_permissions,
                    ignore,
                    inm.as_deref(),
                )
                .await
            {
                Ok(answer) => return Ok((server.clone(), answer)),
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
        Err(FetchError::Unreachable {
            servers: servers.join(", "),
            detail: last,
        })
    }

    /// Fetches one listing from `server`, with retries; sends
    /// `If-None-Match` when given and returns `body: None` on a 304.
    pub async fn listing(
        &self,
        server: &str,
        mount: Mount,
        env: &str,
        source_permissions: &str,
        ignore: &[String],
        if_none_match: Option<&str>,
    ) -> Result<ListingAnswer, FetchError> {
        let url = ListingQuery {
            environment: env,
            source_permissions,
            ignore,
        }
        .url(server, mount);
        let what = format!("the {mount} listing");
        self.with_retries(server, || async {
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
                req = req.header("If-None-Match", tag);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    return Attempt::Retry {
                        detail: request_error(&e),
                        after: None,
                    };
                }
            };
            let header = |resp: &reqwest::Response, name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let (etag, blobs) = (header(&resp, "etag"), header(&resp, protocol::HEADER_BLOBS));
            let batch = header(&resp, protocol::HEADER_BLOB_BATCH);
            if resp.status() == StatusCode::NOT_MODIFIED && if_none_match.is_some() {
                return Attempt::Done(ListingAnswer {
                    body: None,
                    etag,
                    blobs,
                    batch,
                });
            }
            match self.check_status(server, env, &what, resp).await {
                Ok(resp) => match resp.bytes().await {
                    Ok(b) => Attempt::Done(ListingAnswer {
                        body: Some(b),
                        etag,
                        blobs,
                        batch,
                    }),
                    Err(e) => Attempt::Retry {
                        detail: request_error(&e),
                        after: None,
                    },
                },
                Err(a) => a,
            }
        })
        .await
    }

    /// Asks `src`'s batch endpoint for `hashes`; returns the streaming
    /// response (retried on transient failures before the first byte).
    pub async fn batch(
        &self,
        src: &Source<'_>,
        hashes: &[Sha256],
    ) -> Result<reqwest::Response, FetchError> {
        let path = src.batch.unwrap_or(protocol::BATCH_PATH);
        let url = format!(
            "{}{path}?{}",
            src.server.trim_end_matches('/'),
            protocol::batch_query(hashes)
        );
        let what = format!("a batch of {} {} files", hashes.len(), src.mount);
        self.with_retries(src.server, || async {
            let req = self
                .http
                .get(&url)
                .header(ACCEPT, protocol::BLOBS_MEDIA_TYPE)
                .timeout(self.remaining());
            match req.send().await {
                Ok(resp) => match self.check_status(src.server, src.env, &what, resp).await {
                    Ok(r) => Attempt::Done(r),
                    Err(a) => a,
                },
                Err(e) => Attempt::Retry {
                    detail: request_error(&e),
                    after: None,
                },
            }
        })
        .await
    }

    /// Parses a listing body.
    pub fn parse_listing(server: &str, body: &[u8]) -> Result<Vec<FileMetadata>, FetchError> {
        serde_json::from_slice::<Vec<FileMetadata>>(body).map_err(|e| FetchError::Malformed {
            server: server.to_owned(),
            detail: e.to_string(),
        })
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
        let body = resp.bytes().await.unwrap_or_default();
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
            });
        }
        Err(Attempt::Fatal(FetchError::Status {
            server: server.to_owned(),
            status: status.to_string(),
            what: what.to_owned(),
            message,
        }))
    }

    async fn with_retries<T, F, Fut>(&self, server: &str, mut attempt: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let mut last = String::new();
        for n in 0..self.retries {
            if self.remaining().is_zero() {
                last = format!("run deadline reached ({last})");
                break;
            }
            match attempt().await {
                Attempt::Done(v) => return Ok(v),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { detail, after } => {
                    tracing::info!(server = %server, attempt = n + 1, error = %detail, "request failed");
                    last = detail;
                    if n + 1 < self.retries {
                        self.backoff(n, after).await;
                    }
                }
            }
        }
        Err(FetchError::Unreachable {
            servers: server.to_owned(),
            detail: last,
        })
    }

    /// Waits before attempt `n + 1` (capped exponential backoff with full
    /// jitter, or the server's `Retry-After`), within the deadline.
    async fn backoff(&self, n: u32, after: Option<Duration>) {
        let cap = Duration::from_millis(200 * (1u64 << n.min(5))).min(Duration::from_secs(5));
        let wait = after.unwrap_or_else(|| cap.mul_f64(rand::random::<f64>()));
        tokio::time::sleep(wait.min(self.remaining())).await;
    }

    /// Streams `<mount>/<rel>` of `src` into `file`, hashing as it goes;
    /// fails unless the bytes match `sha256` (lowercase hex). Content comes
    /// by checksum where the master offers blobs (cacheable by any HTTP
    /// cache in front of it), else from Puppet's `file_content`, which is
    /// also the fallback when a blob is not found. Retried as a whole on
    /// transient failures (the staged file is truncated first).
    pub async fn download(
        &self,
        src: &Source<'_>,
        rel: &str,
        sha256: &str,
        file: &mut tokio::io::BufWriter<tokio::fs::File>,
    ) -> Result<u64, FetchError> {
        let server = src.server.trim_end_matches('/');
        if let Some(prefix) = src.blobs.filter(|p| p.starts_with('/')) {
            let url = format!("{server}{prefix}{sha256}");
            match self.download_from(src, &url, rel, sha256, file).await {
                Err(FetchError::Status { status, .. }) if status.starts_with("404") => {
                    tracing::info!(file = %rel, "blob not found, falling back to file_content");
                }
                other => return other,
            }
        }
        let url = protocol::content_url(server, src.mount, rel, src.env);
        self.download_from(src, &url, rel, sha256, file).await
    }

    /// Downloads `url` into `file` with retries; see [`Client::download`].
    async fn download_from(
        &self,
        src: &Source<'_>,
        url: &str,
        rel: &str,
        sha256: &str,
        file: &mut tokio::io::BufWriter<tokio::fs::File>,
    ) -> Result<u64, FetchError> {
        let (server, mount, env) = (src.server, src.mount, src.env);
        let what = format!("{mount}/{rel}");
        let fail = |detail: String| FetchError::Download {
            server: server.to_owned(),
            what: what.clone(),
            detail,
        };
        let mut last = String::new();
        for n in 0..self.retries {
            if self.remaining().is_zero() {
                return Err(fail(format!("run deadline reached ({last})")));
            }
            match self
                .download_once(server, env, url, &what, sha256, file)
                .await
            {
                Attempt::Done(size) => return Ok(size),
                Attempt::Fatal(FetchError::Download { detail, .. }) => return Err(fail(detail)),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { detail, after } => {
                    tracing::info!(server = %server, file = %what, attempt = n + 1, error = %detail, "download failed");
                    last = detail;
                    if n + 1 < self.retries {
                        self.backoff(n, after).await;
                    }
                }
            }
        }
        Err(fail(last))
    }

    async fn download_once(
        &self,
        server: &str,
        env: &str,
        url: &str,
        what: &str,
        sha256: &str,
        file: &mut tokio::io::BufWriter<tokio::fs::File>,
    ) -> Attempt<u64> {
        let fatal = |detail: String| {
            Attempt::Fatal(FetchError::Download {
                server: server.to_owned(),
                what: what.to_owned(),
                detail,
            })
        };
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
            Err(e) => {
                return Attempt::Retry {
                    detail: request_error(&e),
                    after: None,
                };
            }
        };
        let resp = match self.check_status(server, env, what, resp).await {
            Ok(r) => r,
            Err(a) => return a,
        };
        // A retry starts the staged file over.
        if let Err(e) = file.flush().await {
            return fatal(format!("cannot write the staged file: {e}"));
        }
        if let Err(e) = file.get_mut().set_len(0).await {
            return fatal(format!("cannot truncate the staged file: {e}"));
        }
        if let Err(e) = tokio::io::AsyncSeekExt::rewind(file.get_mut()).await {
            return fatal(format!("cannot rewind the staged file: {e}"));
        }
        let mut hasher = Sha256Stream::new();
        let mut size = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    return Attempt::Retry {
                        detail: format!("transfer cut after {size} bytes: {}", request_error(&e)),
                        after: None,
                    };
                }
            };
            hasher.update(&chunk);
            size += chunk.len() as u64;
            if let Err(e) = file.write_all(&chunk).await {
                return fatal(format!("cannot write the staged file: {e}"));
            }
        }
        let (got, want) = (hasher.finish(), format!("{{sha256}}{sha256}"));
        if got != want {
            return fatal(format!(
                "content does not match its listed checksum (expected {want}, got {got})"
            ));
        }
        if let Err(e) = file.flush().await {
            return fatal(format!("cannot write the staged file: {e}"));
        }
        Attempt::Done(size)
    }
}
