//! Phase 1 of a run, per resource: the listing (from the run's origin, a
//! delta rebuilt on the cached listing, or the cache on a 304) and the
//! scan of its destination, planned. Reading only. The removal guard
//! ([`guard`]) then looks at every pass before anything is staged.

use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{ListingQuery, Mount};

use super::{Run, SyncError};
use crate::cache::{ListingStamp, MountCache, NotModified};
use crate::catalog::FileResource;
use crate::client::{Client, FetchError, ListingAnswer};
use crate::config::SourcePermissions;
use crate::delta;
use crate::listing::{self, RemoteTree};
use crate::plan::{self, Plan};
use crate::scan::{self, LocalTree};
use crate::settings::Settings;

/// One resource after the reading phases: its plan and what it was made
/// from.
pub(super) struct Pass {
    pub(super) resource: FileResource,
    pub(super) plan: Plan,
    /// The validated listing; `None` when a 304 and an unchanged scan
    /// ended the pass early.
    pub(super) remote: Option<RemoteTree>,
    /// The scan before any change.
    pub(super) local: LocalTree,
    /// The listing as the cache records it.
    pub(super) stamp: ListingStamp,
    /// The listing's query string: a replica must answer it with the same
    /// ETag before it may serve this pass's content (docs/protocol.md
    /// §4.7).
    pub(super) query: String,
}

/// The listing body a pass plans against, from the master's answer.
enum Listed {
    /// A 304 (with this `ETag`), and the scan is the one recorded: neither
    /// side changed.
    Unchanged { etag: Option<String> },
    /// The body: `fresh` when it came from the master (to cache), with
    /// the `ETag` of the answer that carried it.
    Body {
        body: Bytes,
        fresh: Option<Bytes>,
        etag: Option<String>,
    },
}

/// What one pass asks the master for.
struct Ask<'q> {
    mount: Mount,
    query: &'q ListingQuery<'q>,
    /// The digest of the destination's scan.
    digest: Sha256,
}

impl Run<'_> {
    /// listing + local scan → plan, for one resource; reads only.
    pub(super) async fn plan(&mut self, resource: FileResource) -> Result<Pass, SyncError> {
        let settings = self.settings;
        let (vardir, mount) = (&settings.vardir, resource.mount);
        let ignore = &resource.ignore;
        let mut cache = MountCache::load(vardir, mount);
        self.phase("cache loaded");
        let mut local = scan::scan(&resource.path, ignore)?;
        let digest = local.digest();
        self.phase("scanned");
        let env = self.env.clone();
        let query = ListingQuery {
            environment: env.as_str(),
            source_permissions: match resource.source_permissions {
                SourcePermissions::Use => "use",
                SourcePermissions::Ignore => "ignore",
            },
            ignore: resource.ignore.patterns(),
        };
        let query_string = query.to_query();
        let key_for = |server: &str| MountCache::key(server, mount, &query_string);
        let answer = self
            .listing(mount, &query, &|s| cache.if_none_match(&key_for(s)))
            .await?;
        let server = self.server().to_owned();
        let key = key_for(&server);
        self.phase("listing answered");
        let ask = Ask {
            mount,
            query: &query,
            digest,
        };
        let (body, fresh, etag) = match self.listing_body(answer, &ask, &cache).await? {
            Listed::Body { body, fresh, etag } => (body, fresh, etag),
            Listed::Unchanged { etag } => {
                self.report.unchanged += cache.entries;
                return Ok(Pass {
                    resource,
                    plan: Plan::default(),
                    remote: None,
                    local,
                    stamp: ListingStamp {
                        key,
                        etag,
                        fresh: None,
                        listing_sha256: cache.listing_sha256,
                    },
                    query: query_string,
                });
            }
        };
        let entries = Client::parse_listing(&server, &body)?;
        let remote = listing::validate(entries, ignore).map_err(|source| SyncError::Listing {
            server,
            mount,
            source,
        })?;
        self.phase("listing validated");
        cache.load_files(vardir, mount);
        let read = scan::hash_files(&resource.path, &mut local, &remote, |rel, stat| {
            cache.sha256(rel, stat)
        })?;
        tracing::debug!(mount = %mount, hashed = read, "local files hashed");
        let plan = plan::plan(
            &remote,
            &local,
            resource.source_permissions == SourcePermissions::Use,
        );
        self.report.unchanged += plan.unchanged;
        // A cached body was verified against its record; a fresh one is
        // hashed once, here.
        let listing_sha256 = match &fresh {
            Some(_) => Some(Sha256::of(&body)),
            None => cache.listing_sha256,
        };
        Ok(Pass {
            resource,
            plan,
            remote: Some(remote),
            local,
            stamp: ListingStamp {
                key,
                etag,
                fresh,
                listing_sha256,
            },
            query: query_string,
        })
    }

    /// The body `answer` stands for: itself, a delta rebuilt on the cached
    /// listing, or on a 304 the cached listing; fetched again (once,
    /// unconditionally) when a delta cannot be rebuilt or the cached
    /// listing is gone.
    async fn listing_body(
        &mut self,
        answer: ListingAnswer,
        ask: &Ask<'_>,
        cache: &MountCache,
    ) -> Result<Listed, SyncError> {
        let (vardir, mount) = (&self.settings.vardir, ask.mount);
        let etag = answer.etag;
        let body = match answer.body {
            Some(d) if answer.delta => {
                let rebuilt = MountCache::load_listing(vardir, mount)
                    .filter(|cached| cache.describes(cached))
                    .ok_or_else(|| "the cached listing is gone".to_owned())
                    .and_then(|cached| {
                        delta::rebuild(&cached, &d, etag.as_deref()).map_err(|e| e.to_string())
                    });
                match rebuilt {
                    Ok(b) => {
                        tracing::debug!(mount = %mount, delta = d.len(), listing = b.len(), "listing rebuilt from a delta");
                        Bytes::from(b)
                    }
                    Err(e) => {
                        // Once, unconditionally: no If-None-Match, so no
                        // delta (docs/protocol.md §7.5.4).
                        tracing::info!(server = %self.server(), mount = %mount, error = %e, "delta listing not used; fetching the whole listing");
                        return self.refetch(ask).await;
                    }
                }
            }
            Some(b) => b,
            None => match cache.not_modified(vardir, mount, &ask.digest) {
                NotModified::Unchanged => return Ok(Listed::Unchanged { etag }),
                NotModified::Cached(b) => {
                    return Ok(Listed::Body {
                        body: Bytes::from(b),
                        fresh: None,
                        etag,
                    });
                }
                // The tag of the body refetched, not of the 304 (the tree
                // may have changed in between).
                NotModified::Refetch => return self.refetch(ask).await,
            },
        };
        Ok(Listed::Body {
            body: body.clone(),
            fresh: Some(body),
            etag,
        })
    }

    /// The whole listing again, unconditionally.
    async fn refetch(&mut self, ask: &Ask<'_>) -> Result<Listed, SyncError> {
        let again = self.listing(ask.mount, ask.query, &|_| None).await?;
        let body = again.body.unwrap_or_default();
        Ok(Listed::Body {
            body: body.clone(),
            fresh: Some(body),
            etag: again.etag,
        })
    }

    /// The listing of `mount`: the run's first comes from the first master
    /// that answers, which becomes the run's origin (and the report's
    /// server); every later one from that origin.
    async fn listing(
        &mut self,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ListingAnswer, FetchError> {
        if let Some(origin) = &self.origin {
            let inm = if_none_match(&origin.server);
            return self
                .client
                .listing(origin, mount, query, inm.as_deref())
                .await;
        }
        let (origin, answer) = self
            .client
            .first_listing(&self.settings.servers, mount, query, if_none_match)
            .await?;
        self.report.server = Some(origin.server.clone());
        self.origin = Some(origin);
        Ok(answer)
    }

    /// The run's master (empty before one answered).
    fn server(&self) -> &str {
        self.origin.as_ref().map_or("", |o| o.server.as_str())
    }
}

/// The removal guard, over every pass before anything is staged, so a
/// refusal changes nothing in any destination.
pub(super) fn guard(settings: &Settings, passes: &[Pass]) -> Result<(), SyncError> {
    for p in passes {
        let Some(remote) = &p.remote else { continue };
        let removal = plan::Removal::count(remote, &p.local, p.resource.purge);
        if removal.refused(settings.max_removal_percent) {
            return Err(SyncError::MassRemoval {
                mount: p.resource.mount,
                removal,
            });
        }
    }
    Ok(())
}
