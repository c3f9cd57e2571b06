//! Which master answers the generation requests (docs/protocol.md §7.6):
//! the per-node answer is asked as the first listing is (the first server
//! that answers becomes the run's origin), a manifest of the origin and
//! then of each server after it, a server that does not keep the
//! generation passing it on to the next.

use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::generation::GenerationId;

use super::{Origin, Servers, failover};
use crate::client::{
    AssignmentAnswer, FetchError, ManifestAnswer, NodeReportHeader, Offers, ReportSendError,
};

impl Servers {
    /// The node report (the header's value) sent to `server`, the master
    /// that served the run, right after its commit (docs/protocol.md
    /// §7.8); see `Client::post_report`.
    pub async fn post_report(
        &self,
        server: &str,
        env: &EnvName,
        report: &str,
    ) -> Result<bool, ReportSendError> {
        self.client.post_report(server, env, report).await
    }

    /// The per-node answer for `env` (docs/protocol.md §7.6) from the first
    /// server that answers, as the first listing is asked
    /// ([`Servers::listing`]); `if_none_match` gives the `If-None-Match`
    /// for a server; `report` is the node report's header value
    /// (docs/protocol.md §7.8). A server that serves generations becomes
    /// the run's origin.
    pub async fn assignment(
        &mut self,
        env: &EnvName,
        if_none_match: &dyn Fn(&str) -> Option<ETag>,
        report: &NodeReportHeader<'_>,
    ) -> Result<(String, AssignmentAnswer), FetchError> {
        let ring = self.ring();
        let answered = failover(
            self.client.retry(),
            "server unavailable, trying the next one",
            &ring,
            self.refused_until(),
            async |_| Some(true),
            async |server| {
                let inm = if_none_match(server);
                self.client
                    .assignment(server, env, inm.as_ref(), report)
                    .await
            },
        )
        .await;
        let (server, answer) = self.explained(answered).await?;
        if matches!(answer, AssignmentAnswer::NotServed) {
            self.unassigned = Some(server.clone());
        } else {
            self.origin = Some(Origin {
                server: server.clone(),
                offers: Offers::generation(),
            });
        }
        Ok((server, answer))
    }

    /// Generation `id`'s manifest (a delta from `since` where a server
    /// keeps it): from the origin, then each server after it; one that
    /// does not keep the generation (404) passes it on to the next. The
    /// server that delivers becomes the origin. `None`: no server keeps
    /// it.
    pub async fn manifest(
        &mut self,
        env: &EnvName,
        id: &GenerationId,
        since: Option<&GenerationId>,
    ) -> Result<Option<(String, ManifestAnswer)>, FetchError> {
        let servers: Vec<String> = self.ring().into_iter().map(str::to_owned).collect();
        let log = "server unavailable for the manifest, trying the next one";
        let mut last = None;
        for server in &servers {
            let got = failover(
                self.client.retry(),
                log,
                &[server.as_str()],
                self.refused_until(),
                async |_| Some(true),
                async |s| self.client.manifest(s, env, id, since).await,
            )
            .await;
            match got {
                Ok((_, ManifestAnswer::NotKept)) => {
                    tracing::info!(server = %server, generation = %id.short(), "server does not keep the generation");
                }
                Ok((s, answer)) => {
                    self.origin = Some(Origin {
                        server: s.clone(),
                        offers: Offers::generation(),
                    });
                    return Ok(Some((s, answer)));
                }
                Err(e @ FetchError::Unreachable { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        match last {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}
