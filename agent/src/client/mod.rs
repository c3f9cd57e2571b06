//! HTTP to the masters, and nothing else: one TLS configuration
//! (`tls.rs`), one retry policy (`retry.rs`), typed errors (`error.rs`),
//! capped bodies (`body.rs`), and the requests of a stock agent
//! (docs/protocol.md §1.6, §4.2) built with `pluginsync_common::protocol`,
//! so a stock Puppet Server serves them too. This module never touches the
//! filesystem (the staging does, `stage.rs`) and never chooses a master:
//! every request names its server, and which one that is — the run's
//! origin, failover, replicas — is `servers.rs`.
//!
//! The generation requests (the per-node answer, a manifest) are
//! `generation.rs`. A listing the agent holds is revalidated with `If-None-Match` plus
//! `X-Pluginsync-Delta`, and a delta answer is handed back as one
//! ([`ListingAnswer::Delta`], docs/protocol.md §7.5). Failures that may
//! pass (connection refused or reset, timeouts, 5xx, 429 and 503, a body
//! cut mid-transfer) are retried ([`retry::Retry`]), all before the run's
//! deadline.

mod body;
mod error;
mod generation;
mod offers;
mod retry;
mod tls;

use std::time::Duration;

use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::metadata::{ApiErrorBody, FileMetadata};
use pluginsync_common::protocol::{self, ListingQuery, Mount};
use reqwest::StatusCode;
use reqwest::header::ACCEPT;

pub use body::{
    Body, BodyError, MAX_ERROR_BODY, MAX_LISTING_BYTES, MAX_LISTING_ENTRIES, MAX_NODE_BYTES,
};
use body::{Capped, error_body, read_capped};
pub use error::{
    Answered, FetchError, GenerationProblem, NodeProblem, SetupError, Transient, Undelivered,
    Unreached,
};
pub use generation::{AssignmentAnswer, ManifestAnswer, NodeReportHeader, ReportSendError};
pub use offers::{ContentBy, Offers, OriginPath, same_origin_path};
pub use retry::{Attempt, Retry};

use crate::config::TlsFiles;

/// A listing answer.
#[derive(Debug, Clone)]
pub enum ListingAnswer {
    /// `304 Not Modified`: the listing `If-None-Match` named is current.
    NotModified {
        /// The `ETag` of the answer, if any.
        etag: Option<ETag>,
    },
    /// The whole listing.
    Full {
        /// The body.
        body: Bytes,
        /// Its `ETag`, if any.
        etag: Option<ETag>,
    },
    /// A delta from the listing `If-None-Match` named (docs/protocol.md
    /// §7.5), not a listing: `crate::delta` rebuilds it.
    Delta {
        /// The delta.
        body: Bytes,
        /// The `ETag` of the whole listing it makes, if any.
        etag: Option<ETag>,
    },
}

impl ListingAnswer {
    /// The answer's `ETag` (of the whole listing, also for a delta).
    pub fn etag(&self) -> Option<&ETag> {
        match self {
            ListingAnswer::NotModified { etag }
            | ListingAnswer::Full { etag, .. }
            | ListingAnswer::Delta { etag, .. } => etag.as_ref(),
        }
    }

    /// An answer to a request without `If-None-Match` (so never a 304 or
    /// a delta): its body and `ETag`.
    pub fn into_full(self) -> (Bytes, Option<ETag>) {
        match self {
            ListingAnswer::Full { body, etag } | ListingAnswer::Delta { body, etag } => {
                (body, etag)
            }
            ListingAnswer::NotModified { etag } => (Bytes::new(), etag),
        }
    }
}

/// One file a download asks for.
#[derive(Debug, Clone, Copy)]
pub struct FileWanted<'a> {
    /// `plugins` or `pluginfacts`.
    pub mount: Mount,
    /// The environment.
    pub env: &'a EnvName,
    /// Its path in the mount.
    pub rel: &'a str,
    /// Its content's digest.
    pub digest: &'a Sha256,
}

/// Whether a server serves the listing an `ETag` names
/// ([`Client::revalidate`]).
#[derive(Debug, Clone)]
pub enum Revalidated {
    /// It does (`304`), with what it offers.
    Same(Offers),
    /// It serves another listing, or said something final.
    Other,
    /// It could not be asked now.
    Unknown,
}

/// The agent's HTTP client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    tls: TlsFiles,
    retry: Retry,
}

impl Client {
    /// Builds a client for `tls`; `retries` attempts per server, and the
    /// run must finish by `deadline`.
    pub fn new(
        tls: &TlsFiles,
        retries: u32,
        deadline: std::time::Instant,
    ) -> Result<Client, SetupError> {
        Ok(Client {
            http: tls::http_client(tls)?,
            tls: tls.clone(),
            retry: Retry::new(retries, deadline),
        })
    }

    /// A client for a run that makes no request at all (`sync
    /// --from-bundle`): no TLS files are read, and nothing may be asked.
    pub fn offline(tls: &TlsFiles, deadline: std::time::Instant) -> Client {
        pluginsync_common::tls::install_default_provider();
        Client {
            http: reqwest::Client::new(),
            tls: tls.clone(),
            retry: Retry::new(1, deadline),
        }
    }

    /// The underlying HTTP client (the one TLS configuration), for
    /// requests made by another library (`trust::MasterTransport`).
    pub fn http(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// The retry policy.
    pub fn retry(&self) -> &Retry {
        &self.retry
    }

    /// Why `server` closed the connection, if a plain TLS probe can tell
    /// (a refused client certificate: TLS 1.3 alerts come after the
    /// handshake, `certs::probe`).
    pub async fn explain(&self, server: &str) -> Option<String> {
        crate::certs::probe(server, &self.tls).await
    }

    /// A GET of `url` as a stock agent sends it.
    fn get(&self, url: &str, accept: &'static str) -> reqwest::RequestBuilder {
        self.http
            .get(url)
            .header(ACCEPT, accept)
            .header(
                protocol::HEADER_PUPPET_VERSION,
                pluginsync_common::PUPPET_VERSION,
            )
            .timeout(self.retry.remaining())
    }

    /// The request for the listing `url`, revalidating `if_none_match`;
    /// with `delta`, a delta may come back (docs/protocol.md §7.5.1).
    fn listing_request(
        &self,
        url: &str,
        if_none_match: Option<&ETag>,
        delta: bool,
    ) -> reqwest::RequestBuilder {
        let mut req = self.get(url, protocol::ACCEPT_LISTING);
        if let Some(tag) = if_none_match {
            req = req.header("If-None-Match", tag.as_str());
            if delta {
                req = req.header(protocol::HEADER_DELTA, protocol::DELTA_VERSION);
            }
        }
        req
    }

    /// One attempt at a listing from `server`, and what its headers
    /// offer; which server, and whether to try again, is `servers.rs`'s.
    /// Sends `If-None-Match` when given (with `X-Pluginsync-Delta`: only
    /// with a cached listing to apply it to, since a delta names its base
    /// by this very tag, docs/protocol.md §7.5.1).
    pub async fn listing(
        &self,
        server: &str,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: Option<&ETag>,
    ) -> Attempt<(Offers, ListingAnswer)> {
        let url = query.url(server, mount);
        let what = format!("the {mount} listing");
        let req = self.listing_request(&url, if_none_match, true);
        match req.send().await {
            Ok(resp) => {
                let env = query.environment;
                self.listing_answer(server, mount, env, &what, if_none_match, resp)
                    .await
            }
            Err(e) => Attempt::transient(&e),
        }
    }

    /// What one listing response says.
    async fn listing_answer(
        &self,
        server: &str,
        mount: Mount,
        env: &str,
        what: &str,
        if_none_match: Option<&ETag>,
        resp: reqwest::Response,
    ) -> Attempt<(Offers, ListingAnswer)> {
        let offers = Offers::of(server, resp.headers(), true);
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let etag = header("etag").map(ETag::new);
        if resp.status() == StatusCode::NOT_MODIFIED && if_none_match.is_some() {
            return Attempt::Done((offers, ListingAnswer::NotModified { etag }));
        }
        // A delta only counts as one when it was asked for; anything else
        // in a 2xx is read as a listing (and refused if it is not).
        let delta = if_none_match.is_some()
            && resp.status().as_u16() == protocol::DELTA_STATUS
            && header("content-type").is_some_and(|t| t.starts_with(protocol::DELTA_MEDIA_TYPE));
        let resp = match self.check_status(server, env, what, resp).await {
            Ok(r) => r,
            Err(a) => return a,
        };
        match read_capped(resp, MAX_LISTING_BYTES).await {
            Ok(Capped::Whole(body)) if delta => {
                Attempt::Done((offers, ListingAnswer::Delta { body, etag }))
            }
            Ok(Capped::Whole(body)) => Attempt::Done((offers, ListingAnswer::Full { body, etag })),
            Ok(Capped::Over) => Attempt::Fatal(FetchError::ListingTooLarge {
                server: server.to_owned(),
                mount,
                limit: MAX_LISTING_BYTES,
            }),
            Err(e) => Attempt::transient(&e),
        }
    }

    /// Whether `server` serves the listing `etag` names: one request
    /// (`If-None-Match: <ETag>`, the listing's own query, no delta), only a
    /// `304` says yes (docs/protocol.md §4.7).
    pub async fn revalidate(
        &self,
        server: &str,
        mount: Mount,
        query: &str,
        etag: &ETag,
    ) -> Revalidated {
        let url = protocol::listing_url(server, mount, query);
        let req = self
            .listing_request(&url, Some(etag), false)
            .timeout(self.retry.remaining().min(Duration::from_secs(10)));
        match req.send().await {
            Ok(resp) if resp.status() == StatusCode::NOT_MODIFIED => {
                Revalidated::Same(Offers::of(server, resp.headers(), false))
            }
            // Any other final answer: another listing (a 200 is never read).
            Ok(resp)
                if !resp.status().is_server_error()
                    && resp.status() != StatusCode::TOO_MANY_REQUESTS =>
            {
                Revalidated::Other
            }
            Ok(resp) => {
                tracing::info!(server = %server, status = %resp.status(), "replica could not be asked");
                Revalidated::Unknown
            }
            Err(e) => {
                tracing::info!(server = %server, error = %Transient::of(&e), "replica could not be asked");
                Revalidated::Unknown
            }
        }
    }

    /// Asks `server` which environment the node classifier assigns to
    /// `certname`: `GET /puppet/v3/node/<certname>` with the query and
    /// headers of Puppet's agent (docs/protocol.md §4.10); one attempt.
    /// `Ok(None)` when it says 404 (a pluginsync master does not serve the
    /// node endpoint). The answer is read up to [`MAX_NODE_BYTES`].
    pub async fn node_environment(
        &self,
        server: &str,
        certname: &str,
        configured: &EnvName,
        transaction: &str,
    ) -> Attempt<Option<EnvName>> {
        let what = "the node";
        let configured = configured.as_str();
        let url = format!(
            "{server}/puppet/v3/node/{}?environment={}&configured_environment={}&transaction_uuid={transaction}",
            pluginsync_common::urlpath::encode_path(certname),
            pluginsync_common::urlpath::encode_query_value(configured),
            pluginsync_common::urlpath::encode_query_value(configured),
        );
        let resp = match self.get(&url, "application/json").send().await {
            Ok(r) => r,
            Err(e) => return Attempt::transient(&e),
        };
        if resp.status() == StatusCode::NOT_FOUND {
            return Attempt::Done(None);
        }
        let resp = match self.check_status(server, configured, what, resp).await {
            Ok(r) => r,
            Err(a) => return a,
        };
        let problem = |problem| {
            Attempt::Fatal(FetchError::Node {
                server: server.to_owned(),
                problem,
            })
        };
        match read_capped(resp, MAX_NODE_BYTES).await {
            Ok(Capped::Whole(b)) => match serde_json::from_slice::<NodeAnswer>(&b) {
                Ok(n) => match crate::config::environment(&n.environment) {
                    Ok(env) => Attempt::Done(Some(env)),
                    Err(e) => problem(NodeProblem::Assigned(e)),
                },
                Err(e) => problem(NodeProblem::NotNode(e)),
            },
            Ok(Capped::Over) => problem(NodeProblem::TooLarge(MAX_NODE_BYTES)),
            Err(e) => Attempt::transient(&e),
        }
    }

    /// Asks `server`'s batch endpoint at `path` for `hashes`; returns the
    /// body to read frame by frame (retried on transient failures before
    /// the first byte).
    pub async fn batch(
        &self,
        server: &str,
        path: &OriginPath,
        env: &EnvName,
        what: &str,
        hashes: &[Sha256],
    ) -> Result<Body, FetchError> {
        let url = format!(
            "{}{}?{}",
            server.trim_end_matches('/'),
            path.as_str(),
            protocol::batch_query(hashes)
        );
        let attempt = async || {
            let req = self
                .http
                .get(&url)
                .header(ACCEPT, protocol::BLOBS_MEDIA_TYPE)
                .timeout(self.retry.remaining());
            match req.send().await {
                Ok(resp) => match self.check_status(server, env.as_str(), what, resp).await {
                    Ok(response) => Attempt::Done(Body::new(response)),
                    Err(a) => a,
                },
                Err(e) => Attempt::transient(&e),
            }
        };
        self.retry.retrying(server, what, attempt).await
    }

    /// One attempt at `file` from `server`: by checksum where it offers
    /// blobs, else from Puppet's `file_content`, which is also the fallback
    /// when a blob is not found. Each 2xx body goes to `take`.
    pub async fn content<T>(
        &self,
        server: &str,
        offers: &Offers,
        file: &FileWanted<'_>,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Attempt<T> {
        let FileWanted {
            mount,
            env,
            rel,
            digest,
        } = *file;
        let what = format!("{mount}/{rel}");
        let base = server.trim_end_matches('/');
        if let ContentBy::Blobs(prefix) = &offers.content {
            // A generation's content: by digest only. A server without
            // the blob does not keep the generation; the next may.
            let url = format!("{base}{}{}", prefix.as_str(), digest.to_hex());
            return match self.fetch_into(server, env, &url, &what, take).await {
                Attempt::Fatal(FetchError::Status(a)) if a.status == StatusCode::NOT_FOUND => {
                    Attempt::Retry {
                        error: Transient::Status(a),
                        after: None,
                    }
                }
                other => other,
            };
        }
        if let ContentBy::Checksum(prefix) = &offers.content {
            let url = format!("{base}{}{}", prefix.as_str(), digest.to_hex());
            match self.fetch_into(server, env, &url, &what, take).await {
                Attempt::Fatal(FetchError::Status(a)) if a.status == StatusCode::NOT_FOUND => {
                    tracing::info!(file = %rel, "blob not found, falling back to file_content");
                }
                other => return other,
            }
        }
        let url = protocol::content_url(base, mount, rel, env.as_str());
        self.fetch_into(server, env, &url, &what, take).await
    }

    /// One GET of `url` into `take`.
    async fn fetch_into<T>(
        &self,
        server: &str,
        env: &EnvName,
        url: &str,
        what: &str,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Attempt<T> {
        let resp = match self.get(url, protocol::ACCEPT_CONTENT).send().await {
            Ok(r) => r,
            Err(e) => return Attempt::transient(&e),
        };
        let response = match self.check_status(server, env.as_str(), what, resp).await {
            Ok(r) => r,
            Err(a) => return a,
        };
        match take(Body::new(response)).await {
            Ok(v) => Attempt::Done(v),
            Err(BodyError::Cut(error)) => Attempt::Retry { error, after: None },
            Err(BodyError::Refused(detail)) => Attempt::Fatal(FetchError::Download {
                server: server.to_owned(),
                what: what.to_owned(),
                detail: Undelivered::Rejected(detail),
            }),
            Err(BodyError::Mismatch(detail)) => Attempt::Fatal(FetchError::Download {
                server: server.to_owned(),
                what: what.to_owned(),
                detail: Undelivered::Mismatch(detail),
            }),
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
        let body = error_body(resp).await;
        let answered = |message: String| Answered {
            server: server.to_owned(),
            status,
            what: what.to_owned(),
            message,
        };
        let fatal = |message: String| Err(Attempt::Fatal(FetchError::Status(answered(message))));
        if status.is_redirection() {
            return fatal(format!(
                "redirect to {} not followed",
                location.as_deref().unwrap_or("nowhere")
            ));
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
                error: Transient::Status(answered(message)),
                after: retry_after,
            });
        }
        fatal(message)
    }

    /// Parses a listing body: a JSON array of at most
    /// [`MAX_LISTING_ENTRIES`] metadata objects.
    pub fn parse_listing(server: &str, body: &[u8]) -> Result<Vec<FileMetadata>, FetchError> {
        body::parse_listing(server, body)
    }
}

/// What the agent reads of a node object: the assigned environment.
#[derive(serde::Deserialize)]
struct NodeAnswer {
    environment: String,
}

/// A random (version 4) UUID, as Puppet's agent sends one per run.
pub fn transaction_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = pluginsync_common::hex::encode(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(error::refused(&e), "{e:?}");
        assert!(matches!(
            Attempt::<()>::transient(&e),
            Attempt::Retry { ref error, .. } if !error.reached()
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
        assert!(!error::refused(&e), "{e:?}");
        assert!(Transient::of(&e).reached());
    }
}
