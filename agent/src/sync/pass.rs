//! Phase 1 of a run, per resource: the listing (from the run's origin, a
//! delta rebuilt on the cached listing, or the cache on a 304) and the
//! scan of its destination, planned. Reading only. The removal guard
//! ([`guard`]) then looks at every pass before anything is staged.

use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::protocol::{ListingQuery, Mount};

use super::{Run, SyncError};
use crate::cache::{ListingStamp, MountCache, NotModified};
use crate::catalog::FileResource;
use crate::client::{Client, FetchError, ListingAnswer};
use crate::config::SourcePermissions;
use crate::delta;
use crate::listing::{self, RemoteTree};
use crate::plan::{self, Plan};
use crate::scan::{self, LocalTree, ScanError};
use crate::servers::Origin;
use crate::settings::Settings;

/// A destination with its scan (and the scan's digest), started before
/// the master is asked (`Run::plan_all`): the walk needs nothing from the
/// network, so it runs while the master answers
/// (docs/internals.md#the-scan-beside-the-masters-answer). The first state
/// of a destination in a run (`dest.rs`, module docs).
pub(super) struct Scanning {
    pub(super) resource: FileResource,
    scan: tokio::task::JoinHandle<Result<(LocalTree, Sha256), ScanError>>,
}

/// Starts the scan of every destination: walked while the client is set
/// up and the servers answer.
pub(super) fn start_scans(resources: Vec<FileResource>) -> Vec<Scanning> {
    resources.into_iter().map(Scanning::start).collect()
}

impl Scanning {
    /// Starts the scan of `resource`'s destination on a blocking thread.
    fn start(resource: FileResource) -> Scanning {
        let (dest, ignore) = (resource.path.clone(), resource.ignore.clone());
        let scan = tokio::task::spawn_blocking(move || {
            let tree = scan::scan(&dest, &ignore)?;
            let digest = tree.digest();
            Ok((tree, digest))
        });
        Scanning { resource, scan }
    }

    /// The resource, and its scan once done.
    pub(super) async fn scanned(self) -> (FileResource, Result<(LocalTree, Sha256), ScanError>) {
        let Scanning { resource, scan } = self;
        let scanned = scan.await.unwrap_or_else(|e| {
            Err(ScanError::Io {
                path: resource.path.clone(),
                source: std::io::Error::other(e),
            })
        });
        (resource, scanned)
    }
}

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
    /// Its digest, taken once when it was scanned (the sha256s hashing
    /// adds to it are not in it).
    pub(super) local_digest: Sha256,
    /// The listing as the cache records it.
    pub(super) stamp: ListingStamp,
    /// The listing's query string: a replica must answer it with the same
    /// ETag before it may serve this pass's content (docs/protocol.md
    /// §4.7).
    pub(super) query: String,
    /// The master the listing came from.
    pub(super) origin: Origin,
    /// Planned from a generation: content by digest from any server
    /// (`servers::Source::by_digest`).
    pub(super) by_digest: bool,
}

/// The listing body a pass plans against, from the master's answer.
enum Listed {
    /// A 304 (with this `ETag`), and the scan is the one recorded: neither
    /// side changed.
    Unchanged { etag: Option<ETag> },
    /// The body: `fresh` when it came from the master (to cache), with
    /// the `ETag` of the answer that carried it.
    Body {
        body: Bytes,
        fresh: Option<Bytes>,
        etag: Option<ETag>,
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
    pub(super) async fn plan(&mut self, scanning: Scanning) -> Result<Pass, SyncError> {
        let settings = self.settings;
        let (vardir, mount) = (&settings.vardir, scanning.resource.mount);
        let mut cache = MountCache::load(vardir, mount);
        self.phase("cache loaded");
        let (resource, scanned) = scanning.scanned().await;
        let (mut local, digest) = scanned?;
        let ignore = &resource.ignore;
        self.phase("scanned");
        let env = self.env.clone();
        let query = query_of(&resource, &env);
        let query_string = query.to_query();
        let key_for = |server: &str| MountCache::key(server, mount, &query_string);
        let (origin, answer) = self
            .listing(mount, &query, &|s| cache.if_none_match(&key_for(s)))
            .await?;
        let server = origin.server.clone();
        let key = key_for(&server);
        self.phase("listing answered");
        // What `-v` (and `--test`) shows of a run, as Puppet's
        // "Retrieving plugin" (docs/agent.md#puppet-style-flags).
        tracing::info!(server = %server, environment = %env, "retrieving {mount}");
        let ask = Ask {
            mount,
            query: &query,
            digest,
        };
        let (body, fresh, etag) = match self.listing_body(answer, &ask, &cache, &server).await? {
            Listed::Body { body, fresh, etag } => (body, fresh, etag),
            Listed::Unchanged { etag } => {
                self.report.unchanged += cache.entries;
                return Ok(Pass {
                    resource,
                    plan: Plan::default(),
                    remote: None,
                    local,
                    local_digest: digest,
                    stamp: ListingStamp {
                        key,
                        etag,
                        fresh: None,
                        listing_sha256: cache.listing_sha256,
                    },
                    query: query_string,
                    origin,
                    by_digest: false,
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
        let plan = self.planned(&resource, &mut local, &mut cache, &remote)?;
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
            local_digest: digest,
            stamp: ListingStamp {
                key,
                etag,
                fresh,
                listing_sha256,
            },
            query: query_string,
            origin,
            by_digest: false,
        })
    }

    /// The local files hashed where the stat cache cannot vouch for them,
    /// and the plan from `remote` to `local`.
    pub(super) fn planned(
        &mut self,
        resource: &FileResource,
        local: &mut LocalTree,
        cache: &mut MountCache,
        remote: &RemoteTree,
    ) -> Result<Plan, SyncError> {
        let mount = resource.mount;
        cache.load_files(&self.settings.vardir, mount);
        let read = scan::hash_files(&resource.path, local, remote, |rel, stat| {
            cache.sha256(rel, stat)
        })?;
        tracing::debug!(mount = %mount, hashed = read, "local files hashed");
        let plan = plan::plan(
            remote,
            local,
            resource.source_permissions == SourcePermissions::Use,
        );
        self.report.unchanged += plan.unchanged;
        Ok(plan)
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
        server: &str,
    ) -> Result<Listed, SyncError> {
        let (vardir, mount) = (&self.settings.vardir, ask.mount);
        let body = match answer {
            ListingAnswer::Delta { body: d, etag } => {
                let rebuilt = MountCache::load_listing(vardir, mount)
                    .filter(|cached| cache.describes(cached))
                    .ok_or_else(|| "the cached listing is gone".to_owned())
                    .and_then(|cached| {
                        delta::rebuild(&cached, &d, etag.as_ref()).map_err(|e| e.to_string())
                    });
                match rebuilt {
                    Ok(b) => {
                        tracing::debug!(mount = %mount, delta = d.len(), listing = b.len(), "listing rebuilt from a delta");
                        (Bytes::from(b), etag)
                    }
                    Err(e) => {
                        // Once, unconditionally: no If-None-Match, so no
                        // delta (docs/protocol.md §7.5.4).
                        tracing::info!(server = %server, mount = %mount, error = %e, "delta listing not used; fetching the whole listing");
                        return self.refetch(ask).await;
                    }
                }
            }
            ListingAnswer::Full { body, etag } => (body, etag),
            ListingAnswer::NotModified { etag } => {
                match cache.not_modified(vardir, mount, &ask.digest) {
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
                }
            }
        };
        let (body, etag) = body;
        Ok(Listed::Body {
            body: body.clone(),
            fresh: Some(body),
            etag,
        })
    }

    /// The whole listing again, unconditionally (no `If-None-Match`, so
    /// no delta).
    async fn refetch(&mut self, ask: &Ask<'_>) -> Result<Listed, SyncError> {
        let (_, again) = self.listing(ask.mount, ask.query, &|_| None).await?;
        let (body, etag) = again.into_full();
        Ok(Listed::Body {
            body: body.clone(),
            fresh: Some(body),
            etag,
        })
    }

    /// The listing of `mount` from the run's servers (`Servers::listing`:
    /// the first that answers becomes the run's origin and the report's
    /// server).
    async fn listing(
        &mut self,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: &dyn Fn(&str) -> Option<ETag>,
    ) -> Result<(Origin, ListingAnswer), FetchError> {
        let (origin, answer) = self.servers.listing(mount, query, if_none_match).await?;
        self.report
            .server
            .get_or_insert_with(|| origin.server.clone());
        Ok((origin, answer))
    }
}

/// The listing query of `resource` in `env` (also the key a pass
/// planned from a generation is cached under).
pub(super) fn query_of<'q>(resource: &'q FileResource, env: &'q EnvName) -> ListingQuery<'q> {
    ListingQuery {
        environment: env.as_str(),
        source_permissions: match resource.source_permissions {
            SourcePermissions::Use => "use",
            SourcePermissions::Ignore => "ignore",
        },
        ignore: resource.ignore.patterns(),
    }
}

/// The removal guard, over every pass before anything is staged, so a
/// refusal changes nothing in any destination.
pub(super) fn guard(settings: &Settings, passes: &[Pass]) -> Result<(), SyncError> {
    for p in passes {
        let Some(remote) = &p.remote else { continue };
        let removal = plan::Removal::count(remote, &p.local, p.resource.purge);
        if let Some(limit) = settings
            .max_removal_percent
            .filter(|&max| removal.refused(Some(max)))
        {
            let mount = p.resource.mount;
            let paths = plan::Removal::paths(remote, &p.local, p.resource.purge);
            return Err(SyncError::MassRemoval {
                mount,
                removal,
                limit,
                modules: MountCache::modules_of(&settings.vardir, mount, &paths),
            });
        }
    }
    Ok(())
}
