//! One file's download across the replicas (docs/agent.md#servers-failover-for-downloads-too):
//! each attempt at one server, a failure moving on to the next that
//! serves the same listing (any server, for a generation's content), and
//! bytes that do not match their digest taken as that server's bad
//! content: warned of once, and asked of the next server
//! (docs/cache.md#a-wrong-entry).

use std::collections::{HashMap, HashSet};

use pluginsync_common::digest::Sha256;

use super::{FileWanted, Pick, Servers, Source};
use crate::client::{Attempt, Body, BodyError, FetchError, Transient, Undelivered};

impl Servers {
    /// Fetches `<mount>/<rel>` (content `digest`) and hands each 2xx body
    /// to `take`, which writes and verifies it (it must start over on every
    /// call: a retry is a whole new body, from whichever replica).
    ///
    /// Each attempt goes to one replica (`Client::content`): first the one
    /// that delivered last for this mount (the origin to begin with), after
    /// a failure the next one in `servers` order that serves the same
    /// listing (checked once per replica, `Servers::verdict`), wrapping
    /// around. A transient failure waits the one backoff before the next
    /// attempt. A replica that answered and failed `retries` times is not
    /// asked again; one that refuses connections (a master restarting) is
    /// asked again until the run's deadline. Bytes that do not match
    /// `digest` ([`BodyError::Mismatch`]) are that replica's bad content:
    /// it is not asked for this file again, the next one is (the bytes
    /// are verified whoever serves them), and the run warns once per
    /// replica (docs/cache.md#a-wrong-entry); when none is left the
    /// mismatch fails the download. A [`BodyError::Refused`] or a final
    /// status fails the download at once.
    pub async fn download<T>(
        &self,
        src: &Source<'_>,
        rel: &str,
        digest: &Sha256,
        take: &mut impl AsyncFnMut(Body) -> Result<T, BodyError>,
    ) -> Result<T, FetchError> {
        let retry = self.client.retry();
        let file = FileWanted {
            mount: src.mount,
            env: src.env,
            rel,
            digest,
        };
        let what = format!("{}/{rel}", src.mount);
        let mut failures: HashMap<String, u32> = HashMap::new();
        let mut exhausted: HashSet<String> = HashSet::new();
        let mut last: Option<(String, Transient)> = None;
        let mut mismatch: Option<FetchError> = None;
        let give_up = |last: Option<(String, Transient)>, deadline: bool| {
            let (server, detail) = match last {
                Some((server, error)) => (server, Undelivered::Failed(Box::new(error))),
                None => (src.origin.server.clone(), Undelivered::NoReplica),
            };
            let detail = match deadline {
                true => Undelivered::Deadline(Box::new(detail)),
                false => detail,
            };
            FetchError::Download {
                server,
                what: what.clone(),
                detail,
            }
        };
        for n in 0u32.. {
            if retry.remaining().is_zero() {
                return Err(give_up(last, true));
            }
            let previous = last.as_ref().map(|(s, _)| s.as_str());
            let replica = match self.pick(src, previous, &exhausted).await {
                Pick::Use(r) => r,
                Pick::GiveUp => return Err(mismatch.unwrap_or_else(|| give_up(last, false))),
                Pick::Wait => {
                    retry.backoff(n, None).await;
                    continue;
                }
            };
            let attempt = self
                .client
                .content(&replica.server, &replica.offers, &file, take)
                .await;
            match attempt {
                Attempt::Done(v) => {
                    self.prefer(src.mount, &replica.server).await;
                    return Ok(v);
                }
                Attempt::Fatal(
                    e @ FetchError::Download {
                        detail: Undelivered::Mismatch(_),
                        ..
                    },
                ) => {
                    self.served_bad_content(&replica.server, &e).await;
                    exhausted.insert(replica.server.clone());
                    self.avoid(src, &replica.server).await;
                    mismatch = Some(e);
                }
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { error, after } => {
                    let server = replica.server;
                    tracing::info!(server = %server, what = %what, attempt = n + 1, error = %error, "download failed");
                    if error.reached() {
                        let count = failures.entry(server.clone()).or_default();
                        *count += 1;
                        if *count >= retry.retries() {
                            exhausted.insert(server.clone());
                        }
                    }
                    self.avoid(src, &server).await;
                    last = Some((server, error));
                    retry.backoff(n, after).await;
                }
            }
        }
        unreachable!("the attempts loop returns")
    }

    /// `server` served bytes that do not match their digest (`error`):
    /// said once per server and run, at warning level, naming it, when
    /// there is another server to ask.
    async fn served_bad_content(&self, server: &str, error: &FetchError) {
        // With one server the run's error says it all.
        if self.list.len() < 2 {
            return;
        }
        let mut replicas = self.replicas.lock().await;
        if replicas.bad_content.insert(server.to_owned()) {
            let (what, detail) = match error {
                FetchError::Download { what, detail, .. } => (what.as_str(), detail.to_string()),
                other => ("a file", other.to_string()),
            };
            tracing::warn!(
                "{server} served bad content for {what}: {detail}; asking the next server"
            );
        }
    }
}
