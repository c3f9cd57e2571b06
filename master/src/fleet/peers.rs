//! The replicas named in `[admin] peers`, as a client: [`PeerClient`]
//! calls their admin API over mTLS with this master's own certificate
//! (which must be in each peer's `[admin] certnames`), checking theirs
//! against `[tls] ca` and the host of the peer's URL. [`run`] shares the
//! fleet with one peer (docs/operating.md#the-fleet):
//!
//! - **push**: every `[fleet] push_interval`, what this replica heard
//!   since the last push is sent (`POST /pluginsync/v1/inventory`, at
//!   most [`BATCH`] nodes a request). A peer that does not take it keeps
//!   its queue (one record per node, the latest), sent when it answers
//!   again: the replay of what it missed while it was down.
//! - **pull**: at start, until the peer first answers, and then every
//!   `[fleet] pull_interval`, the peer's whole inventory is read and
//!   merged: what a replica restarted (its memory empty) catches up with.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pluginsync_common::tls::{TlsError, install_default_provider, read_identity_pem, read_pem};

use super::{Fleet, INVENTORY_PATH};
use crate::config::MasterConfig;

/// Nodes per push request.
pub const BATCH: usize = 256;
/// The largest answer read from a peer (an inventory of 100,000 nodes
/// with their failing plugins' names fits).
pub const MAX_ANSWER: usize = 256 << 20;
/// The first wait after a failed call to a peer; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between calls to a peer that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A call to a peer that failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// This master's certificate, key or CA could not be read.
    #[error(transparent)]
    Files(#[from] TlsError),
    /// The HTTP client could not be built from them.
    #[error("peer client: {0}")]
    Setup(#[source] reqwest::Error),
    /// The request failed (connection, TLS, timeout).
    #[error("peer {peer}: {source}")]
    Request {
        /// The peer's URL.
        peer: String,
        /// What failed.
        source: reqwest::Error,
    },
    /// The peer answered another status than the call expects.
    #[error("peer {peer} answered {status}")]
    Status {
        /// The peer's URL.
        peer: String,
        /// The HTTP status.
        status: u16,
    },
    /// The answer is larger than [`MAX_ANSWER`].
    #[error("peer {peer}: answer over {MAX_ANSWER} bytes")]
    TooLarge {
        /// The peer's URL.
        peer: String,
    },
    /// The answer is not what the call expects.
    #[error("peer {peer}: {source}")]
    Body {
        /// The peer's URL.
        peer: String,
        /// The JSON error.
        source: serde_json::Error,
    },
}

/// An mTLS client of the peers' admin API (module docs).
#[derive(Debug, Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    peers: Arc<[String]>,
}

impl PeerClient {
    /// The client for `config`'s `[admin] peers`, presenting `[tls] cert`.
    pub fn new(config: &MasterConfig) -> Result<PeerClient, PeerError> {
        install_default_provider();
        let tls = &config.tls;
        let ca = reqwest::Certificate::from_pem_bundle(&read_pem("CA bundle", &tls.ca)?)
            .map_err(PeerError::Setup)?;
        let identity = reqwest::Identity::from_pem(&read_identity_pem(&tls.cert, &tls.key)?)
            .map_err(PeerError::Setup)?;
        let http = reqwest::Client::builder()
            .tls_certs_only(ca)
            .identity(identity)
            .https_only(true)
            .user_agent(concat!("pluginsync-master/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(PeerError::Setup)?;
        let peers = config
            .admin
            .peers
            .iter()
            .map(|p| p.trim_end_matches('/').to_owned())
            .collect();
        Ok(PeerClient { http, peers })
    }

    /// The peers' URLs, without a final `/`.
    pub fn peers(&self) -> &[String] {
        &self.peers
    }

    /// `GET peer + path`: the body of a `200`, at most [`MAX_ANSWER`] bytes.
    pub async fn get(&self, peer: &str, path: &str) -> Result<Bytes, PeerError> {
        let req = self
            .http
            .get(format!("{peer}{path}"))
            .header("accept", "application/json");
        self.call(peer, req, 200).await
    }

    /// `method peer + path` with a JSON body; `expect` is the status that
    /// means done. The answer's body (at most [`MAX_ANSWER`] bytes).
    pub async fn send(
        &self,
        peer: &str,
        method: reqwest::Method,
        path: &str,
        json: Vec<u8>,
        expect: u16,
    ) -> Result<Bytes, PeerError> {
        let req = self
            .http
            .request(method, format!("{peer}{path}"))
            .header("content-type", "application/json")
            .body(json);
        self.call(peer, req, expect).await
    }

    async fn call(
        &self,
        peer: &str,
        req: reqwest::RequestBuilder,
        expect: u16,
    ) -> Result<Bytes, PeerError> {
        let failed = |source| PeerError::Request {
            peer: peer.to_owned(),
            source,
        };
        let mut resp = req.send().await.map_err(failed)?;
        if resp.status().as_u16() != expect {
            return Err(PeerError::Status {
                peer: peer.to_owned(),
                status: resp.status().as_u16(),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(PeerError::TooLarge {
                    peer: peer.to_owned(),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(body))
    }

    /// Reads `peer`'s whole inventory into `fleet`, page after page (a
    /// peer from before pages answers everything at once, without
    /// `next`); returns its nodes.
    pub async fn pull(&self, peer: &str, fleet: &Fleet) -> Result<usize, PeerError> {
        let (mut after, mut count) = (None::<String>, 0);
        loop {
            let mut target = format!("{INVENTORY_PATH}?limit={}", super::MAX_PAGE);
            if let Some(a) = &after {
                let a: String = form_urlencoded::byte_serialize(a.as_bytes()).collect();
                target.push_str(&format!("&after={a}"));
            }
            let body = self.get(peer, &target).await?;
            let page: super::Page =
                serde_json::from_slice(&body).map_err(|source| PeerError::Body {
                    peer: peer.to_owned(),
                    source,
                })?;
            fleet.merge(&page.nodes);
            count += page.nodes.len();
            match page.next {
                Some(n) if after.as_ref() != Some(&n) => after = Some(n),
                _ => return Ok(count),
            }
        }
    }

    /// Sends what `fleet` queued for peer `index`, batch by batch, until
    /// the queue is empty or the peer fails (the batch is queued again).
    pub async fn push(&self, index: usize, fleet: &Fleet) -> Result<usize, PeerError> {
        let peer = &self.peers[index];
        let mut sent = 0;
        loop {
            let batch = fleet.take_outbox(index, BATCH);
            if batch.is_empty() {
                return Ok(sent);
            }
            /// The batch, serialised where it is.
            #[derive(serde::Serialize)]
            struct Batch<'a> {
                nodes: &'a [super::NodeEntry],
            }
            let body =
                serde_json::to_vec(&Batch { nodes: &batch }).map_err(|source| PeerError::Body {
                    peer: peer.clone(),
                    source,
                })?;
            let done = self
                .send(peer, reqwest::Method::POST, INVENTORY_PATH, body, 204)
                .await;
            if let Err(e) = done {
                fleet.requeue(index, &batch);
                return Err(e);
            }
            sent += 1;
        }
    }
}

/// Starts [`run`] for each of `config`'s `[admin] peers`.
pub fn spawn(
    config: &MasterConfig,
    fleet: &Arc<Fleet>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, PeerError> {
    if config.admin.peers.is_empty() {
        return Ok(Vec::new());
    }
    let client = PeerClient::new(config)?;
    let f = &config.fleet;
    Ok((0..client.peers().len())
        .map(|i| {
            let run = run(
                client.clone(),
                i,
                fleet.clone(),
                f.push_interval,
                f.pull_interval,
            );
            tokio::spawn(run)
        })
        .collect())
}

/// Shares `fleet` with peer `index` for as long as the master runs
/// (module docs). Failures are logged once per outage, at warning level.
pub async fn run(
    client: PeerClient,
    index: usize,
    fleet: Arc<Fleet>,
    push_every: Duration,
    pull_every: Duration,
) {
    let peer = client.peers()[index].clone();
    let mut pulled_at: Option<tokio::time::Instant> = None;
    let mut backoff = Duration::ZERO;
    loop {
        tokio::time::sleep(push_every.max(backoff)).await;
        let pull_due = match pulled_at {
            None => true,
            Some(at) => !pull_every.is_zero() && at.elapsed() >= pull_every,
        };
        let result = async {
            if pull_due {
                let n = client.pull(&peer, &fleet).await?;
                if pulled_at.is_none() {
                    tracing::info!(peer = %peer, nodes = n, "fleet: read the peer's inventory");
                }
                pulled_at = Some(tokio::time::Instant::now());
            }
            client.push(index, &fleet).await
        }
        .await;
        match result {
            Ok(_) => {
                if !backoff.is_zero() {
                    tracing::info!(peer = %peer, "fleet: the peer answers again");
                }
                backoff = Duration::ZERO;
            }
            Err(e) => {
                if backoff.is_zero() {
                    tracing::warn!(error = %e, "fleet: the peer did not take what this replica heard; kept for it");
                }
                backoff = (backoff * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
            }
        }
    }
}
