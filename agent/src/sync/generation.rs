//! Phase 1 from one generation (docs/protocol.md §4.11, §7.6): the per-node
//! answer names the generation the node should have, its manifest (a
//! delta from the one the agent holds, or whole) gives both mounts, and
//! every resource is planned from it, so a run never plans facts from one
//! deploy and plugins from another. A server that does not serve
//! generations leaves the run to Puppet's listings (`pass.rs`), and the
//! agent remembers it (`cache::GenerationRecord`).
//!
//! The manifest is trusted only once it hashes to the generation's id
//! (whole, or rebuilt from a delta: `ManifestDelta::apply`); the content
//! is then fetched by digest and verified against it, whoever delivers it.

use pluginsync_common::DEFAULT_IGNORE;
use pluginsync_common::envname::EnvName;
use pluginsync_common::fsutil::Written;
use pluginsync_common::generation::{GenerationId, Manifest, ManifestDelta, ManifestError};
use pluginsync_common::protocol::Mount;
use pluginsync_common::trust::served::Served;

use std::path::PathBuf;

use pluginsync_common::bundle::BundleError;

use super::blobs::Blobs;
use super::pass::{Pass, Scanning};
use super::{Run, SyncError};
use crate::cache::{GenerationRecord, ListingStamp, MountCache};
use crate::catalog::FileResource;
use crate::client::{AssignmentAnswer, MAX_LISTING_ENTRIES, ManifestAnswer, Offers};
use crate::listing;
use crate::plan::Plan;
use crate::servers::Origin;
use crate::settings::Settings;
use crate::trust::{Refused, held_len};

/// The most entries a manifest delta may add or change: a generation
/// holds both mounts, each a listing of at most [`MAX_LISTING_ENTRIES`]
/// (docs/protocol.md §7.6).
const MAX_MANIFEST_ENTRIES: usize = 2 * MAX_LISTING_ENTRIES;

/// A master's manifest delta from `held`, bounded as it is parsed: no more
/// removals than `held` has entries, no more upserts than
/// [`MAX_MANIFEST_ENTRIES`].
fn untrusted_delta(d: &[u8], held: &Manifest) -> Result<ManifestDelta, ManifestError> {
    ManifestDelta::parse_within(d, held.entries().len(), MAX_MANIFEST_ENTRIES)
}

/// A generation refused or not to be had; the run stops before anything
/// changes.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// A manifest (or a delta rebuilt) does not prove itself.
    #[error("generation {} from {server} refused: {source}", id.short())]
    Manifest {
        /// Who delivered it.
        server: String,
        /// The generation asked for.
        id: GenerationId,
        /// What is wrong.
        source: ManifestError,
    },
    /// A bundle that cannot be read, or its blobs written.
    #[error("cannot read the bundle '{}': {source}", path.display())]
    BundleIo {
        /// The bundle.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A bundle refused (docs/protocol.md §7.7): nothing was changed.
    #[error("'{}' refused: {source}; nothing was changed", path.display())]
    Bundle {
        /// The bundle.
        path: PathBuf,
        /// What is wrong with it.
        source: BundleError,
    },
    /// A bundle of another environment than `--environment` (or of an
    /// invalid one).
    #[error("the bundle '{}' is of environment '{bundle}'{}", path.display(), match asked {
        Some(a) => format!(", not '{a}' (--environment)"),
        None => ", not a valid name".to_owned(),
    })]
    BundleEnvironment {
        /// The bundle.
        path: PathBuf,
        /// Its environment.
        bundle: String,
        /// `--environment`, when that is what it contradicts.
        asked: Option<String>,
    },
    /// No server keeps the generation the per-node answer names, asked
    /// twice.
    #[error("no server keeps generation {} of environment '{env}'", id.short())]
    Gone {
        /// The generation.
        id: GenerationId,
        /// The environment.
        env: String,
    },
}

impl From<GenerationError> for SyncError {
    fn from(e: GenerationError) -> SyncError {
        SyncError::Generation(Box::new(e))
    }
}

/// The generation a run plans from.
pub(super) struct Held {
    /// Its id.
    pub(super) id: GenerationId,
    /// Its manifest, once needed (a run whose destinations are unchanged
    /// never parses it).
    pub(super) manifest: Option<Manifest>,
    /// Its canonical bytes when fetched in this run, to keep.
    pub(super) fresh: Option<Vec<u8>>,
    /// The record to keep after a clean commit.
    pub(super) record: GenerationRecord,
    /// Whether `record` differs from what is on disk.
    pub(super) changed: bool,
    /// The master that named it (content comes by digest from any).
    pub(super) origin: Origin,
    /// A bundle's blobs, the content source of `sync --from-bundle`.
    pub(super) blobs: Option<Blobs>,
    /// What the per-node answer said of the signed metadata its master
    /// serves (docs/trust.md#requests-per-run).
    pub(super) trust: Option<Served>,
}

/// The manifest of `held`, when this run fetched a new one, written
/// beside its place in the cache on a thread of `scope`, to be put there
/// by `Run::remember_generation` after the switches, which it runs beside.
pub(super) fn write_manifest_ahead<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    settings: &'s Settings,
    env: &'s EnvName,
    held: Option<&'s Held>,
) -> Option<std::thread::ScopedJoinHandle<'s, std::io::Result<Written>>> {
    let bytes = held.filter(|h| h.changed)?.fresh.as_deref()?;
    let write = move || GenerationRecord::write_manifest(&settings.vardir, env.as_str(), bytes);
    Some(scope.spawn(write))
}

/// Whether every resource ignores at least Puppet's default patterns: a
/// manifest lists what the standard listing serves (docs/protocol.md
/// §7.6), so a resource that wants a name those patterns drop syncs
/// Puppet's listings instead.
fn ignores_the_defaults<'r>(mut resources: impl Iterator<Item = &'r FileResource>) -> bool {
    resources.all(|r| {
        let have = r.ignore.patterns();
        DEFAULT_IGNORE
            .iter()
            .all(|d| have.iter().any(|p| p.as_str() == *d))
    })
}

impl Run<'_> {
    /// The run's generation, or `None` when it syncs Puppet's listings;
    /// under `[trust]` only a signed one, verified against the run's
    /// master's metadata (refreshed while the manifest is fetched) before
    /// anything is planned or staged (docs/agent.md#signed-generations).
    pub(super) async fn generation(
        &mut self,
        scans: &[Scanning],
    ) -> Result<Option<Held>, SyncError> {
        let (settings, vardir) = (self.settings, &self.settings.vardir);
        let Some(config) = settings.trust.as_ref() else {
            return self.assigned(scans, true).await;
        };
        let listings = Refused::Unsigned("the servers serve no generation (Puppet's listings)");
        let Some(mut held) = self.assigned(scans, false).await? else {
            return Err(listings.into());
        };
        let (env, server) = (self.env.clone(), held.origin.server.clone());
        let (http, said) = (self.servers.http(), held.trust.take());
        let refresh = crate::trust::refresh(config, vardir, http, &server, said.as_ref());
        let trusted = if held.record.generation == Some(held.id) {
            refresh.await
        } else {
            let (fetched, trusted) = tokio::join!(self.fetch_manifest(&mut held, &env), refresh);
            fetched.map(|()| trusted)?
        }
        .map_err(Refused::Verify)?;
        let len = match held_len(&trusted, vardir, &mut held.fresh, (&env, &held.id)) {
            Some(len) => len,
            None => {
                held.record.generation = None;
                self.fetch_manifest(&mut held, &env).await?;
                held.fresh.as_ref().map_or(0, |b| b.len() as u64)
            }
        };
        let checked = trusted.check(&env, &held.id, len);
        checked.map_err(Refused::Verify)?;
        self.phase("generation verified");
        Ok(Some(held))
    }

    /// The generation the servers assign, unverified; its manifest
    /// fetched when the node does not hold it and `get`.
    async fn assigned(&mut self, scans: &[Scanning], get: bool) -> Result<Option<Held>, SyncError> {
        let (vardir, env) = (&self.settings.vardir, self.env.clone());
        if !self.settings.generations {
            return Ok(None);
        }
        if !ignores_the_defaults(scans.iter().map(|s| &s.resource)) {
            tracing::info!("an ignore list without Puppet's defaults: syncing listings");
            return Ok(None);
        }
        let mut record = GenerationRecord::load(vardir, env.as_str());
        let servers_key = self.settings.servers.join(",");
        if record.listings_only.as_deref() == Some(servers_key.as_str()) {
            tracing::debug!("the servers serve no generations: syncing listings");
            return Ok(None);
        }
        let inm = |server: &str| {
            (server == record.server && record.generation.is_some())
                .then(|| record.assignment_etag.clone())
                .flatten()
        };
        let report = self.node_report(record.generation);
        let report = self.report_header(&report);
        let (server, answer) = self.servers.assignment(&env, &inm, &report).await?;
        self.report.server.get_or_insert_with(|| server.clone());
        let (id, changed, trust) = match answer {
            AssignmentAnswer::NotServed => {
                tracing::info!(server = %server, "the server serves no generations; syncing its listings");
                record.listings_only = Some(servers_key);
                if !self.settings.noop
                    && let Err(e) = record.save(vardir, env.as_str(), None)
                {
                    tracing::warn!(error = %e, "cannot save the sync cache");
                }
                return Ok(None);
            }
            // If-None-Match is sent only with a generation held.
            AssignmentAnswer::NotModified { trust } => match record.generation {
                Some(id) => (id, false, trust),
                None => return Ok(None),
            },
            AssignmentAnswer::Assigned {
                assignment,
                etag,
                trust,
            } => {
                let changed = record.assignment_etag != etag || record.server != server;
                record.assignment_etag = etag;
                record.server = server.clone();
                (assignment.generation, changed, trust)
            }
        };
        self.phase("generation assigned");
        tracing::info!(server = %server, environment = %env, generation = %id.short(), "retrieving generation");
        let mut held = Held {
            id,
            manifest: None,
            fresh: None,
            changed: changed || record.generation != Some(id),
            record,
            origin: Origin {
                server,
                offers: Offers::generation(),
            },
            blobs: None,
            trust,
        };
        if get && held.record.generation != Some(id) {
            self.fetch_manifest(&mut held, &env).await?;
        }
        Ok(Some(held))
    }

    /// Whether the per-node answer, asked again (`held.id` evicted
    /// everywhere), names a generation, now `held`'s.
    async fn reassigned(&mut self, held: &mut Held, env: &EnvName) -> Result<bool, SyncError> {
        let report = self.node_report(held.record.generation);
        let report = self.report_header(&report);
        let (_, again) = self.servers.assignment(env, &|_| None, &report).await?;
        let AssignmentAnswer::Assigned {
            assignment,
            etag,
            trust,
        } = again
        else {
            return Ok(false);
        };
        held.id = assignment.generation;
        held.record.assignment_etag = etag;
        held.trust = trust.or(held.trust.take());
        Ok(true)
    }

    /// The manifest of `held.id`: a delta from the one held where the
    /// master keeps that one, else whole; a generation no server keeps is
    /// asked of the per-node answer once more.
    async fn fetch_manifest(&mut self, held: &mut Held, env: &EnvName) -> Result<(), SyncError> {
        // The held manifest is read and parsed on a thread while the
        // first request is answered: a delta is asked for whenever one is
        // held, and a base that turns out unreadable sends the next round
        // for the whole manifest.
        let mut reading = held.record.generation.map(|since| {
            let (vardir, env) = (self.settings.vardir.clone(), env.to_string());
            tokio::task::spawn_blocking(move || {
                // Not hashed here: a delta applied to it must hash to its
                // target (`ManifestDelta::apply`), which a wrong base never does.
                let bytes = GenerationRecord::load_manifest(&vardir, &env)?;
                let m = Manifest::parse_unverified(&bytes).ok()?;
                Some((since, m))
            })
        });
        let mut since = held.record.generation;
        let mut base = None;
        for round in 0..3 {
            let asked = self.servers.manifest(env, &held.id, since.as_ref());
            let got = match reading.take() {
                Some(reading) => {
                    let (got, read) = tokio::join!(asked, reading);
                    base = read.ok().flatten();
                    self.phase("held manifest read");
                    got?
                }
                None => asked.await?,
            };
            self.phase("manifest fetched");
            let (server, answer) = match got {
                Some(g) => g,
                None if since.is_some() => {
                    since = None;
                    continue;
                }
                None if round < 2 && self.reassigned(held, env).await? => continue,
                None => break,
            };
            let refused = |source| GenerationError::Manifest {
                server: server.clone(),
                id: held.id,
                source,
            };
            let (manifest, bytes) = match answer {
                ManifestAnswer::Whole(b) => {
                    let m = Manifest::parse(&b, &held.id).map_err(refused)?;
                    (m, b.to_vec())
                }
                ManifestAnswer::Delta(d) => {
                    let Some((bid, bm)) = base.as_ref() else {
                        tracing::info!(server = %server, "the held manifest cannot be read; fetching the whole manifest");
                        since = None;
                        continue;
                    };
                    let applied = untrusted_delta(&d, bm).and_then(|delta| {
                        if delta.target != held.id {
                            return Err(ManifestError::Malformed(
                                "a delta to another generation".into(),
                            ));
                        }
                        delta.apply(bm, *bid)
                    });
                    match applied {
                        Ok(pair) => pair,
                        Err(e) => {
                            tracing::info!(server = %server, error = %e, "manifest delta not used; fetching the whole manifest");
                            since = None;
                            continue;
                        }
                    }
                }
                // servers.rs passes a 404 on to the next server.
                ManifestAnswer::NotKept => continue,
            };
            self.phase("manifest checked");
            held.origin.server = server;
            held.manifest = Some(manifest);
            held.fresh = Some(bytes);
            held.changed = true;
            return Ok(());
        }
        Err(GenerationError::Gone {
            id: held.id,
            env: env.to_string(),
        }
        .into())
    }

    /// listing of the generation + local scan → plan, for one resource;
    /// reads only. A destination whose scan is the one recorded after the
    /// last commit of this very generation (and query) is done at once.
    pub(super) async fn plan_from(
        &mut self,
        held: &mut Held,
        scanning: Scanning,
    ) -> Result<Pass, SyncError> {
        let (vardir, mount) = (&self.settings.vardir, scanning.resource.mount);
        let mut cache = MountCache::load(vardir, mount);
        // A manifest fetched in this run means a change: its listing and
        // the stat cache are made while the scan is still running (a
        // run that keeps its generation parses neither unless it must).
        let early = match held.manifest.as_ref() {
            Some(manifest) => {
                // The stat cache is decoded on a thread meanwhile.
                let remote = std::thread::scope(|s| {
                    let _loading = s.spawn(|| cache.load_files(vardir, mount));
                    listing::from_manifest(manifest, mount, &scanning.resource.ignore)
                })
                .map_err(|source| SyncError::Listing {
                    server: held.origin.server.clone(),
                    mount,
                    source,
                })?;
                Some(remote)
            }
            None => None,
        };
        let (resource, scanned) = scanning.scanned().await;
        let (mut local, digest) = scanned?;
        self.phase("scanned");
        let query = super::pass::query_of(&resource, &self.env).to_query();
        let key = format!("generation {}|{mount}|{query}", held.id);
        let stamp = ListingStamp {
            key: key.clone(),
            etag: None,
            fresh: None,
            listing_sha256: None,
        };
        let unchanged = cache.key == key && cache.scan_digest == Some(digest);
        let (plan, remote) = if unchanged {
            self.report.unchanged += cache.entries;
            (Plan::default(), None)
        } else {
            let remote = match early {
                Some(remote) => remote,
                None => {
                    let manifest = self.manifest_of(held).await?;
                    listing::from_manifest(manifest, mount, &resource.ignore).map_err(|source| {
                        SyncError::Listing {
                            server: held.origin.server.clone(),
                            mount,
                            source,
                        }
                    })?
                }
            };
            self.phase("manifest mount checked");
            let plan = self.planned(&resource, &mut local, &mut cache, &remote)?;
            (plan, Some(remote))
        };
        Ok(Pass {
            resource,
            plan,
            remote,
            local,
            local_digest: digest,
            stamp,
            query,
            origin: held.origin.clone(),
            by_digest: true,
        })
    }

    /// The held manifest, read from the cache (and checked against the id)
    /// the first time a pass needs it; fetched whole when the cache lost
    /// it (the same generation only: a pass may already be planned).
    async fn manifest_of<'h>(&mut self, held: &'h mut Held) -> Result<&'h Manifest, SyncError> {
        if held.manifest.is_none() {
            let env = self.env.clone();
            let bytes = GenerationRecord::load_manifest(&self.settings.vardir, env.as_str());
            match bytes.map(|b| Manifest::parse(&b, &held.id)) {
                Some(Ok(m)) => held.manifest = Some(m),
                _ => {
                    tracing::info!("the kept manifest is gone; fetching it");
                    let id = held.id;
                    held.record.generation = None;
                    self.fetch_manifest(held, &env).await?;
                    if held.id != id {
                        return Err(GenerationError::Gone {
                            id,
                            env: env.to_string(),
                        }
                        .into());
                    }
                }
            }
        }
        Ok(held.manifest.as_ref().expect("just set"))
    }

    /// A per-node answer that said "no generations" while the listings
    /// came from a pluginsync master (its `X-Pluginsync-*` headers) is a
    /// balancer that routes Puppet's plugin paths to the masters but not
    /// `/pluginsync/v1/`: a warning, once per run
    /// (docs/puppet-fleet.md#the-node-side). A stock Puppet Server sends
    /// no such headers and stays quiet.
    pub(super) fn routing_gap(&self, passes: &[Pass]) {
        let Some(server) = self.servers.unassigned() else {
            return;
        };
        if passes.iter().any(|p| p.origin.offers.from_pluginsync()) {
            tracing::warn!(
                server = %server,
                "the listings come from a pluginsync master but GET /pluginsync/v1/assignment does not: \
                 the balancer does not route /pluginsync/v1/ to the masters \
                 (packaging/haproxy-puppet.cfg, packaging/nginx-puppet.conf); \
                 syncing listings, without generations or node reports"
            );
        }
    }

    /// A run that synced listings because its servers served no
    /// generations asks the per-node answer again next time if a listing
    /// now says they do (`X-Pluginsync-Generations`).
    pub(super) fn reprobe(&self, passes: &[Pass]) {
        if self.settings.noop || !passes.iter().any(|p| p.origin.offers.generations) {
            return;
        }
        let (vardir, env) = (&self.settings.vardir, self.env.as_str());
        let mut record = GenerationRecord::load(vardir, env);
        if record.listings_only.take().is_some()
            && let Err(e) = record.save(vardir, env, None)
        {
            tracing::warn!(error = %e, "cannot save the sync cache");
        }
    }

    /// After a clean commit: the generation, its manifest (when fetched)
    /// and the per-node answer's `ETag` are kept (the mounts' listings go
    /// in [`Run::forget_listings`]). Nothing is written when nothing
    /// changed. After a commit with failures, the `ETag` is forgotten.
    pub(super) fn remember_generation(
        &mut self,
        held: Option<&Held>,
        manifest: Option<std::io::Result<Written>>,
    ) {
        let Some(held) = held else { return };
        let vardir = &self.settings.vardir;
        if !self.report.failures.is_empty() {
            // Not all of it is in place: the next run must not take a 304
            // for "done", so the per-node answer is asked afresh (the
            // manifest stays, a base for the next delta).
            let mut record = GenerationRecord::load(vardir, self.env.as_str());
            record.assignment_etag = None;
            if let Err(e) = record.save(vardir, self.env.as_str(), None) {
                tracing::warn!(vardir = %vardir.display(), error = %e, "cannot save the sync cache");
            }
            return;
        }
        self.report.generation = Some(held.id.to_hex());
        if !held.changed {
            return;
        }
        let mut record = held.record.clone();
        record.generation = Some(held.id);
        record.listings_only = None;
        let env = self.env.as_str();
        let saved = match manifest {
            Some(Ok(written)) => record.save_written(vardir, env, Some(written)),
            _ => record.save(vardir, env, held.fresh.as_deref()),
        };
        if let Err(e) = saved {
            tracing::warn!(vardir = %vardir.display(), error = %e, "cannot save the sync cache");
        }
    }

    /// A pass planned from a generation keeps no listing: the one a
    /// listings-only run cached goes (after the pass's own cache is
    /// written, which never writes one then).
    pub(super) fn forget_listings(&self, held: Option<&Held>, mounts: &[Mount]) {
        if held.is_some_and(|h| h.changed) && self.report.failures.is_empty() {
            for &mount in mounts {
                MountCache::forget_listing(&self.settings.vardir, mount);
            }
        }
    }
}
