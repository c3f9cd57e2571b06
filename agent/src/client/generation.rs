//! The generation requests (docs/protocol.md §7.6): the per-node answer
//! ([`Client::assignment`]) and a generation's manifest, whole or as a
//! delta from one the agent holds ([`Client::manifest`]). One attempt
//! each; which server, and what a `404` leads to, is `servers.rs`'s and
//! the run's. Nothing here trusts a manifest: its bytes are checked
//! against the generation's id by the caller (`Manifest::parse`,
//! `ManifestDelta::apply`).

use bytes::Bytes;
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::generation::{
    Assignment, GenerationId, assignment_url, manifest_url, report_url,
};
use pluginsync_common::protocol;
use pluginsync_common::trust::served::Served;
use reqwest::StatusCode;

use super::body::{Capped, read_capped};
use super::{Attempt, Client, FetchError, GenerationProblem, MAX_LISTING_BYTES, MAX_NODE_BYTES};

/// What a server said to the per-node answer.
#[derive(Debug, Clone)]
pub enum AssignmentAnswer {
    /// `304`: the generation the `If-None-Match` answer named is still
    /// the node's.
    NotModified {
        /// What the server says of the signed metadata it serves.
        trust: Option<Served>,
    },
    /// The node's generation now, and the answer's `ETag`.
    Assigned {
        /// The answer.
        assignment: Assignment,
        /// Its `ETag`, for the next run's `If-None-Match`.
        etag: Option<ETag>,
        /// What the server says of the signed metadata it serves.
        trust: Option<Served>,
    },
    /// The server does not serve generations (a stock Puppet Server, an
    /// older pluginsync master): the run syncs Puppet's listings.
    NotServed,
}

/// The node report a per-node request carries: the header's value, and
/// whether the run is a `--noop` one (`X-Pluginsync-Noop`: the master
/// records nothing of it).
#[derive(Debug, Clone, Copy)]
pub struct NodeReportHeader<'a> {
    /// `X-Pluginsync-Report`'s value.
    pub value: &'a str,
    /// A `--noop` run.
    pub noop: bool,
}

/// What a server said to a manifest request.
#[derive(Debug, Clone)]
pub enum ManifestAnswer {
    /// The canonical manifest.
    Whole(Bytes),
    /// A delta from the generation asked as `since`.
    Delta(Bytes),
    /// `404`: this server does not keep that generation (any more).
    NotKept,
}

impl Client {
    /// One attempt at `server`'s per-node answer for `env`, revalidating
    /// `if_none_match`, carrying the node report `report` (the header's
    /// value, docs/protocol.md §7.8; flagged for a `--noop` run). `404`, `403` and `405` (a server without the
    /// endpoint; Puppet Server's default rule forbids unknown paths)
    /// are [`AssignmentAnswer::NotServed`], except an unknown environment,
    /// which stops the run as for a listing.
    pub async fn assignment(
        &self,
        server: &str,
        env: &EnvName,
        if_none_match: Option<&ETag>,
        report: &NodeReportHeader<'_>,
    ) -> Attempt<AssignmentAnswer> {
        let url = assignment_url(server, env.as_str());
        let mut req = self
            .get(&url, "application/json")
            .header(pluginsync_common::rollout::HEADER_REPORT, report.value);
        if report.noop {
            req = req.header(pluginsync_common::rollout::HEADER_NOOP, "1");
        }
        if let Some(tag) = if_none_match {
            req = req.header("If-None-Match", tag.as_str());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Attempt::transient(&e),
        };
        // docs/trust.md#requests-per-run: on a 304 too.
        let trust = Served::from_headers(|name| {
            let v = resp.headers().get(name)?.to_str().ok()?;
            Some(v.to_owned())
        });
        if resp.status() == StatusCode::NOT_MODIFIED && if_none_match.is_some() {
            return Attempt::Done(AssignmentAnswer::NotModified { trust });
        }
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(ETag::new);
        let what = "the per-node answer";
        let resp = match self.check_status(server, env.as_str(), what, resp).await {
            Ok(r) => r,
            Err(Attempt::Fatal(FetchError::Status(a))) if not_served(a.status) => {
                return Attempt::Done(AssignmentAnswer::NotServed);
            }
            Err(a) => return a,
        };
        let problem = |detail| {
            Attempt::Fatal(FetchError::Generation {
                server: server.to_owned(),
                what: what.to_owned(),
                detail,
            })
        };
        // Whatever a server answers to a path it does not know (a
        // catch-all, a listing) is not a per-node answer: it serves no
        // generations, and Puppet's listings are checked as ever.
        let json = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        if !json {
            return Attempt::Done(AssignmentAnswer::NotServed);
        }
        match read_capped(resp, MAX_NODE_BYTES).await {
            Ok(Capped::Whole(b)) => match serde_json::from_slice::<Assignment>(&b) {
                Ok(a) if a.environment != env.as_str() => {
                    problem(GenerationProblem::OtherEnvironment(a.environment))
                }
                Ok(assignment) => Attempt::Done(AssignmentAnswer::Assigned {
                    assignment,
                    etag,
                    trust,
                }),
                Err(e) => {
                    tracing::info!(server = %server, error = %e, "not a per-node answer");
                    Attempt::Done(AssignmentAnswer::NotServed)
                }
            },
            // Too large to be one: not a per-node answer either.
            Ok(Capped::Over) => Attempt::Done(AssignmentAnswer::NotServed),
            Err(e) => Attempt::transient(&e),
        }
    }

    /// One attempt at generation `id`'s manifest from `server`, as a delta
    /// from `since` when given and the server keeps it. Read up to the
    /// listing cap ([`MAX_LISTING_BYTES`]).
    pub async fn manifest(
        &self,
        server: &str,
        env: &EnvName,
        id: &GenerationId,
        since: Option<&GenerationId>,
    ) -> Attempt<ManifestAnswer> {
        let url = manifest_url(server, env.as_str(), id, since);
        let accept = "application/x-pluginsync-manifest, application/x-pluginsync-manifest-delta";
        let resp = match self.get(&url, accept).send().await {
            Ok(r) => r,
            Err(e) => return Attempt::transient(&e),
        };
        let delta = since.is_some()
            && resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with(protocol::MANIFEST_DELTA_MEDIA_TYPE));
        let what = format!("generation {}", id.short());
        let resp = match self.check_status(server, env.as_str(), &what, resp).await {
            Ok(r) => r,
            Err(Attempt::Fatal(FetchError::Status(a))) if a.status == StatusCode::NOT_FOUND => {
                return Attempt::Done(ManifestAnswer::NotKept);
            }
            Err(a) => return a,
        };
        match read_capped(resp, MAX_LISTING_BYTES).await {
            Ok(Capped::Whole(b)) if delta => Attempt::Done(ManifestAnswer::Delta(b)),
            Ok(Capped::Whole(b)) => Attempt::Done(ManifestAnswer::Whole(b)),
            Ok(Capped::Over) => Attempt::Fatal(FetchError::Generation {
                server: server.to_owned(),
                what,
                detail: GenerationProblem::TooLarge(MAX_LISTING_BYTES),
            }),
            Err(e) => Attempt::transient(&e),
        }
    }
}

/// Statuses that say a server has no per-node answer at all.
/// A node report that could not be sent after the commit.
#[derive(Debug, thiserror::Error)]
pub enum ReportSendError {
    /// No answer.
    #[error(transparent)]
    Transport(super::error::Transient),
    /// An answer other than success or "not served".
    #[error("{server} answered {status}")]
    Status {
        /// The server.
        server: String,
        /// Its status.
        status: StatusCode,
    },
}

/// The longest a node report sent after the commit may take: it never
/// holds up the run's end for long (the next run's header carries it).
const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Client {
    /// Sends the node report `report` (the header's value) to `server`
    /// right after the commit, one attempt (docs/protocol.md §7.8):
    /// `Ok(true)` recorded, `Ok(false)` a server that takes no reports
    /// (404, 403, 405: a stock Puppet Server, an older master), else why.
    pub async fn post_report(
        &self,
        server: &str,
        env: &EnvName,
        report: &str,
    ) -> Result<bool, ReportSendError> {
        let resp = self
            .http
            .post(report_url(server, env.as_str()))
            .header(reqwest::header::CONTENT_TYPE, "text/plain")
            .header(
                protocol::HEADER_PUPPET_VERSION,
                pluginsync_common::PUPPET_VERSION,
            )
            .timeout(self.retry.remaining().min(REPORT_TIMEOUT))
            .body(report.to_owned())
            .send()
            .await
            .map_err(|e| ReportSendError::Transport(super::error::Transient::of(&e)))?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            s if not_served(s) => Ok(false),
            status => Err(ReportSendError::Status {
                server: server.to_owned(),
                status,
            }),
        }
    }
}

fn not_served(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::NOT_FOUND | StatusCode::FORBIDDEN | StatusCode::METHOD_NOT_ALLOWED
    )
}
