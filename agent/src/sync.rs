//! One sync run, read as its diagram (ARCHITECTURE.md, Agent):
//!
//! ```text
//! catalog → listing (HTTP) + local scan → plan (pure) → stage + verify → commit → report → load
//! ```
//!
//! [`run`] takes the run lock (not for `--noop`), builds the catalog (one
//! resource per destination: pluginfacts, then plugins) and drives a
//! [`Run`] through its phases, one method each:
//!
//! 1. [`Run::plan`], per resource: the listing (from the run's [`Origin`],
//!    or the cache on a 304), the scan of the destination, the plan.
//!    Reading only. `--noop` reports the plans and stops here.
//! 2. [`Run::stage_all`]: every download of every resource, verified.
//! 3. [`Run::commit_all`]: only then each resource is committed and
//!    reported, and the cache updated.
//! 4. [`Run::load_changed`]: the files written under the libdir go to the
//!    loaders.
//!
//! Any failure in 1 or 2 (the lock, TLS, unreachable masters, an error
//! status, a malformed or hostile listing, an unknown environment, a failed
//! or mismatching download, a destination without room for the commit:
//! [`commit::check_space`]) stops the run with one [`SyncError`] and leaves
//! every destination as it was: the staged files are removed when their
//! [`Staging`] is dropped, and nothing is ever purged because of an error.
//!
//! SIGTERM and SIGINT ([`Interrupts`], README "Signals") race phases 1 and
//! 2 and stop the run the same way; once the commit has started they are
//! only noted: the commit finishes, is reported and remembered, and the
//! run ends without its loads (kept in the pending-loads record).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pluginsync_common::digest::Sha256;
use pluginsync_common::fsutil::remove_leftovers;
use pluginsync_common::ignore::IgnoreError;
use pluginsync_common::protocol::{ListingQuery, Mount};
use pluginsync_common::relpath::RelPath;

use crate::cache::{self, ListingStamp, MountCache, NotModified};
use crate::catalog::{self, FileResource};
use crate::cli::Format;
use crate::client::{Client, FetchError, ListingAnswer, Origin, SetupError, Source};
use crate::commit;
use crate::config::{EnvironmentSource, SourcePermissions};
use crate::delta;
use crate::exit::ExitStatus;
use crate::listing::{self, ListingError, RemoteTree};
use crate::load::{LoadStatus, Loaders, PendingLoads};
use crate::lock::{self, LockError};
use crate::plan::{self, ChangeKind, Plan};
use crate::plugins::Registry;
use crate::progress::{self, Progress};
use crate::report::{Change, Failure, Report};
use crate::scan::{self, LocalTree, ScanError};
use crate::settings::Settings;
use crate::signals::{Interrupt, Interrupts};
use crate::stage::{self, StageError, Staging};

/// Why a run stopped before changing anything; one line each, the text of
/// the report's `error`.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Another run holds the lock, or it cannot be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The HTTP client could not be set up (TLS files).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// An ignore glob does not compile.
    #[error(transparent)]
    Ignore(#[from] IgnoreError),
    /// A destination could not be scanned or hashed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// A listing could not be fetched, or is not a listing.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A listing was refused (hostile or malformed entries).
    #[error("malformed listing from {server}: {mount} mount: {source}")]
    Listing {
        /// The master that sent it.
        server: String,
        /// Its mount.
        mount: Mount,
        /// What is wrong with it.
        source: ListingError,
    },
    /// A destination's staging directory could not be prepared.
    #[error("cannot stage downloads in '{}': {source}", dest.display())]
    Staging {
        /// The destination.
        dest: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A download could not be staged and verified.
    #[error("{0}; nothing was changed")]
    Download(#[source] StageError),
    /// A destination's filesystem cannot hold what the commit creates.
    #[error(transparent)]
    Space(#[from] commit::SpaceError),
    /// The removal guard (README, "The removal guard"): the plan of `mount`
    /// takes away more than `max_removal_percent` of its destination's
    /// files; nothing was changed.
    #[error(
        "refusing to remove {} of {} files in {mount}: the master's environment looks incomplete; --allow-mass-removal to proceed",
        thousands(removal.removed),
        thousands(removal.total)
    )]
    MassRemoval {
        /// The mount whose destination it is.
        mount: Mount,
        /// What the plan takes away.
        removal: plan::Removal,
    },
    /// SIGTERM or SIGINT stopped the run.
    #[error("interrupted by {signal} {}", match .committed {
        false => "before the commit; nothing was changed",
        true => "during the run; the commit was finished, its loads are left to the next run",
    })]
    Interrupted {
        /// The signal.
        signal: Interrupt,
        /// Whether the commit had started (and so was finished).
        committed: bool,
    },
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The report (also for failed runs).
    pub report: Report,
    /// Why the run stopped, if it did.
    pub error: Option<SyncError>,
    /// `[load] failures_are_errors`.
    pub load_failures_are_errors: bool,
}

impl Outcome {
    /// How the process exits: with `detailed`, 0 no change, 2 changes,
    /// 4 failures, 6 both; 1 when nothing was applied. Without it, 0 or 1.
    /// A signal: 130 (SIGINT) or 143 (SIGTERM), whatever was applied.
    pub fn exit_status(&self, detailed: bool) -> ExitStatus {
        match &self.error {
            Some(SyncError::Interrupted { signal, .. }) => return signal.exit_status(),
            Some(SyncError::Lock(LockError::Busy { .. })) => return ExitStatus::Busy,
            Some(_) => return ExitStatus::Failure,
            None => {}
        }
        let failed = !self.report.failures.is_empty()
            || (self.load_failures_are_errors
                && self
                    .report
                    .loads
                    .iter()
                    .any(|l| l.status == LoadStatus::Failed));
        let changed = !self.report.changes.is_empty();
        match (detailed, changed, failed) {
            (false, _, false) => ExitStatus::Success,
            (false, _, true) => ExitStatus::Failure,
            (true, false, false) => ExitStatus::Success,
            (true, true, false) => ExitStatus::Changes,
            (true, false, true) => ExitStatus::Failures,
            (true, true, true) => ExitStatus::ChangesAndFailures,
        }
    }
}

/// Runs a sync; never panics on bad input, always returns a report (saved
/// to `<vardir>` unless `--noop`). `interrupts`: SIGTERM/SIGINT, see the
/// module docs.
pub async fn run(settings: &Settings, interrupts: &Interrupts) -> Outcome {
    let started = Instant::now();
    let mut report = Report {
        environment: settings.environment.to_string(),
        server: None,
        noop: settings.noop,
        changes: Vec::new(),
        failures: Vec::new(),
        unchanged: 0,
        duration_ms: 0,
        applied: false,
        error: None,
        started_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        loads: Vec::new(),
    };
    let error = Run::execute(settings, &mut report, interrupts).await.err();
    report.duration_ms = started.elapsed().as_millis() as u64;
    report.error = error.as_ref().map(ToString::to_string);
    // A skipped run leaves the running one's report alone.
    let skipped = matches!(error, Some(SyncError::Lock(LockError::Busy { .. })));
    if !settings.noop
        && !skipped
        && let Err(e) = report.save(&settings.vardir)
    {
        tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the report");
    }
    Outcome {
        report,
        error,
        load_failures_are_errors: settings.load.failures_are_errors,
    }
}

/// The environment the run syncs: the configured one, or with
/// `environment_source = "server"` the one the servers' node endpoint
/// assigns (docs/protocol.md §4.10), unless `--environment` named it (as
/// Puppet's agent, which then does not ask). A server without the node
/// endpoint (404) leaves the configured one, with one warning.
async fn environment(settings: &Settings, client: &Client) -> Result<String, SyncError> {
    let configured = settings.environment.to_string();
    if settings.environment_source != EnvironmentSource::Server
        || settings.environment_origin == crate::settings::Source::CommandLine
    {
        return Ok(configured);
    }
    match client
        .node_environment(&settings.servers, &settings.certname, &configured)
        .await?
    {
        None => {
            tracing::warn!(
                environment = %configured,
                "the servers do not serve the node endpoint; syncing the configured environment"
            );
            Ok(configured)
        }
        Some((server, assigned)) => {
            let env = crate::config::environment(&assigned).map_err(|e| FetchError::Status {
                server,
                status: "200 OK".into(),
                what: "the node".into(),
                message: format!("assigned {e}"),
            })?;
            if env.as_str() != configured {
                tracing::info!(configured = %configured, assigned = %env, "switching to the environment the server assigns");
            }
            Ok(env.to_string())
        }
    }
}

/// One resource after the reading phases: its plan and what it was made
/// from.
struct Pass {
    resource: FileResource,
    plan: Plan,
    /// The validated listing; `None` when a 304 and an unchanged scan
    /// ended the pass early.
    remote: Option<RemoteTree>,
    /// The scan before any change.
    local: LocalTree,
    /// The listing as the cache records it.
    stamp: ListingStamp,
    /// The listing's query string: a replica must answer it with the same
    /// ETag before it may serve this pass's content (docs/protocol.md
    /// §4.7).
    query: String,
}

/// The state of one run.
struct Run<'a> {
    settings: &'a Settings,
    report: &'a mut Report,
    client: Client,
    /// The environment, as sent.
    env: String,
    /// The master serving the run, once one answered the first listing.
    origin: Option<Origin>,
    /// For the phase timings in the debug log.
    started: Instant,
}

impl<'a> Run<'a> {
    /// The whole run, phase by phase; see the module docs.
    async fn execute(
        settings: &'a Settings,
        report: &'a mut Report,
        interrupts: &Interrupts,
    ) -> Result<(), SyncError> {
        let _lock = if settings.noop {
            None
        } else {
            Some(lock::acquire(&settings.vardir)?)
        };
        if !settings.noop {
            // Under the lock no other run writes: what a killed run left
            // half-written in the vardir and its cache goes now.
            let removed = remove_leftovers(&settings.vardir)
                + remove_leftovers(&settings.vardir.join("cache"));
            if removed > 0 {
                tracing::info!(removed, "removed temporary files a killed run left");
            }
        }
        let catalog = catalog::build(settings);
        let deadline = Instant::now() + settings.timeout;
        let client = Client::new(&settings.tls, settings.retries, deadline)?;
        let env = tokio::select! {
            biased;
            signal = interrupts.wait() => return Err(SyncError::Interrupted { signal, committed: false }),
            env = environment(settings, &client) => env?,
        };
        report.environment.clone_from(&env);
        let mut run = Run {
            settings,
            report,
            client,
            env,
            origin: None,
            started: Instant::now(),
        };
        let interrupted = |signal, committed| SyncError::Interrupted { signal, committed };
        // Everything before the commit, raced with the signals: dropping
        // it drops the stagings made so far, which removes them.
        let before_commit = async {
            if !settings.noop {
                run.recover_loads().await;
            }
            let mut passes = Vec::with_capacity(catalog.resources.len());
            for resource in catalog.resources {
                passes.push(run.plan(resource).await?);
            }
            if settings.noop {
                run.report_plans(&passes);
                return Ok(None);
            }
            run.phase("planned");
            guard(settings, &passes)?;
            let stagings = run.stage_all(&passes).await?;
            run.phase("staged");
            Ok::<_, SyncError>(Some((passes, stagings)))
        };
        let (passes, stagings) = tokio::select! {
            biased;
            signal = interrupts.wait() => return Err(interrupted(signal, false)),
            ready = before_commit => match ready? {
                Some(ready) => ready,
                None => return Ok(()),
            },
        };
        // A signal during the last synchronous stretch still comes first.
        if let Some(signal) = interrupts.received() {
            return Err(interrupted(signal, false));
        }
        commit::check_space(passes.iter().map(|p| (p.resource.path.as_path(), &p.plan)))?;
        run.record_loads(&passes);
        // From here on a signal is only noted (see the module docs).
        run.phase("commit started");
        let written = run.commit_all(&passes, stagings);
        run.phase("committed");
        if let Some(signal) = interrupts.received() {
            return Err(interrupted(signal, true));
        }
        tokio::select! {
            biased;
            // The loaders' groups are killed by the signal thread; what
            // they did not finish stays in the pending-loads record.
            signal = interrupts.wait() => return Err(interrupted(signal, true)),
            () = run.load_changed(&written) => {}
        }
        PendingLoads::clear(&settings.vardir);
        Ok(())
    }

    fn phase(&self, name: &str) {
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            "{name}"
        );
    }

    /// listing + local scan → plan, for one resource; reads only.
    async fn plan(&mut self, resource: FileResource) -> Result<Pass, SyncError> {
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
            environment: &env,
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
        let mut etag = answer.etag;
        let (body, fresh) = match answer.body {
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
                        let b = Bytes::from(b);
                        (b.clone(), Some(b))
                    }
                    Err(e) => {
                        // Once, unconditionally: no If-None-Match, so no
                        // delta (docs/protocol.md §7.5.4).
                        tracing::info!(server = %server, mount = %mount, error = %e, "delta listing not used; fetching the whole listing");
                        let again = self.listing(mount, &query, &|_| None).await?;
                        etag = again.etag;
                        let b = again.body.unwrap_or_default();
                        (b.clone(), Some(b))
                    }
                }
            }
            Some(b) => (b.clone(), Some(b)),
            None => match cache.not_modified(vardir, mount, &digest) {
                NotModified::Unchanged => {
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
                            listing_sha256: cache.listing_sha256.clone(),
                        },
                        query: query_string,
                    });
                }
                NotModified::Cached(b) => (Bytes::from(b), None),
                NotModified::Refetch => {
                    let again = self.listing(mount, &query, &|_| None).await?;
                    // The tag of the body refetched, not of the 304 (the
                    // tree may have changed in between).
                    etag = again.etag;
                    let b = again.body.unwrap_or_default();
                    (b.clone(), Some(b))
                }
            },
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
            cache.sha256(rel, stat).map(str::to_owned)
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
            Some(_) => Some(Sha256::of(&body).to_hex()),
            None => cache.listing_sha256.clone(),
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

    /// `--noop`: the plans, reported as changes.
    fn report_plans(&mut self, passes: &[Pass]) {
        for p in passes {
            for (rel, kind) in p.plan.actions.iter().filter_map(|a| a.change()) {
                self.report.changes.push(change(&p.resource, rel, kind));
            }
        }
    }

    /// stage + verify: every download of every resource, before anything
    /// changes. On an error the stagings so far are dropped, which removes
    /// them.
    async fn stage_all(&self, passes: &[Pass]) -> Result<Vec<Option<Staging>>, SyncError> {
        // Every pass with downloads had a listing answered, so the origin
        // is known here.
        let origin = self.origin.clone().unwrap_or_default();
        let mut stagings = Vec::with_capacity(passes.len());
        // On a terminal, a text run shows its downloads as they go
        // (README, "The agent").
        let progress = Arc::new(Progress::default());
        progress.add_total(passes.iter().map(|p| p.plan.writes().count() as u64).sum());
        let _display = progress::Display::start(
            progress.clone(),
            progress::wanted(self.settings.format == Format::Text),
        );
        for p in passes {
            let dest = &p.resource.path;
            let writes: Vec<(PathBuf, String)> = p
                .plan
                .writes()
                .map(|(r, s)| (r.to_owned(), s.to_owned()))
                .collect();
            if writes.is_empty() {
                if let Err(e) = stage::clean_stale(dest) {
                    tracing::warn!(dest = %dest.display(), error = %e, "cannot remove a stale staging directory");
                }
                stagings.push(None);
                continue;
            }
            let mut staging = Staging::prepare(dest).map_err(|source| SyncError::Staging {
                dest: dest.clone(),
                source,
            })?;
            let src = Source {
                origin: &origin,
                mount: p.resource.mount,
                env: &self.env,
                servers: &self.settings.servers,
                query: &p.query,
                etag: p.stamp.etag.as_deref(),
            };
            staging
                .download_all(
                    &self.client,
                    &src,
                    writes,
                    self.settings.parallel_downloads,
                    &progress,
                )
                .await
                .map_err(SyncError::Download)?;
            stagings.push(Some(staging));
        }
        // Every staged file durable with its mode before any rename
        // (stage.rs, module docs).
        let sealing: Vec<_> = passes
            .iter()
            .zip(&stagings)
            .filter_map(|(p, s)| Some((s.as_ref()?, write_modes(&p.plan))))
            .collect();
        stage::seal(&sealing).await.map_err(SyncError::Download)?;
        Ok(stagings)
    }

    /// commit → report: each resource in catalog order, its changes and
    /// failures reported; the cache remembers a clean commit and forgets a
    /// failed one. Returns the files written, for the loaders.
    fn commit_all(
        &mut self,
        passes: &[Pass],
        stagings: Vec<Option<Staging>>,
    ) -> Vec<(Mount, RelPath)> {
        let settings = self.settings;
        let vardir = &settings.vardir;
        self.report.applied = true;
        let mut written = Vec::new();
        for (p, staging) in passes.iter().zip(stagings) {
            let (dest, mount) = (&p.resource.path, p.resource.mount);
            let empty = HashMap::new();
            let staged = staging.as_ref().map_or(&empty, |s| &s.files);
            let created = staging.as_ref().map_or(&[][..], |s| s.created());
            // Durable before it returns, so before the cache and the
            // report below claim it.
            let done = commit::commit(dest, &p.plan, staged, created, &p.resource);
            for (rel, kind) in done.changes {
                self.report.changes.push(change(&p.resource, &rel, kind));
            }
            self.phase("renamed");
            if done.failures.is_empty() {
                if let Some(remote) = &p.remote {
                    cache::remember(vardir, mount, dest, &p.stamp, remote, &p.plan, &p.local);
                }
                self.phase("remembered");
            } else {
                MountCache::clear(vardir, mount);
            }
            for (rel, error) in done.failures {
                self.report.failures.push(Failure {
                    path: format!("{mount}/{}", rel.display()),
                    error,
                });
            }
            if let Some(s) = staging {
                s.finish();
            }
            written.extend(done.written.into_iter().map(|rel| (mount, rel)));
        }
        written
    }

    /// load: the files this run wrote under the libdir go to the loaders,
    /// each isolated; the plugin registry drops plugins whose file is gone.
    async fn load_changed(&mut self, written: &[(Mount, RelPath)]) {
        let settings = self.settings;
        let mut registry = Registry::load(&settings.vardir);
        let before = registry.clone();
        for (name, version) in registry.prune_missing() {
            tracing::info!(plugin = %name, version = %version, "plugin file gone, unregistered");
        }
        if !settings.loaders.is_empty() {
            let loaders = Loaders::new(&settings.loaders, &settings.load, &self.env);
            if written.iter().any(|(m, _)| loaders.serves(*m)) {
                let loads = loaders
                    .load(
                        &settings.libdir,
                        settings.factsdir.as_deref(),
                        written,
                        settings.load_enabled,
                        &mut registry,
                    )
                    .await;
                self.report.loads.extend(loads);
            }
        }
        if registry != before
            && let Err(e) = registry.save(&settings.vardir)
        {
            tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the plugin registry");
        }
    }
}

impl Run<'_> {
    /// Before the commit: records the files it is about to write, so that
    /// a run killed between its commit and its loads leaves them to the
    /// next run ([`Run::recover_loads`]). Only with loaders configured.
    fn record_loads(&self, passes: &[Pass]) {
        let settings = self.settings;
        if settings.loaders.is_empty() {
            return;
        }
        let files: Vec<(Mount, RelPath)> = passes
            .iter()
            .flat_map(|p| {
                p.plan
                    .writes()
                    .filter_map(|(rel, _)| RelPath::parse(&rel.to_string_lossy()).ok())
                    .map(|rel| (p.resource.mount, rel))
            })
            .collect();
        if files.is_empty() {
            return;
        }
        if let Err(e) = PendingLoads::record(&settings.vardir, &files) {
            tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot record the pending loads");
        }
    }

    /// At the start of a run: a previous run that died between its commit
    /// and its loads left its record; its files that are still there are
    /// loaded now, once, with the current loaders, and the record cleared.
    async fn recover_loads(&mut self) {
        let vardir = &self.settings.vardir;
        let Some(files) = PendingLoads::take(vardir) else {
            return;
        };
        let settings = self.settings;
        let present: Vec<(Mount, RelPath)> = files
            .into_iter()
            .filter(|(m, rel)| {
                let root = match m {
                    Mount::Plugins => Some(settings.libdir.as_path()),
                    Mount::Pluginfacts => settings.factsdir.as_deref(),
                };
                root.is_some_and(|r| rel.to_path(r).is_file())
            })
            .collect();
        tracing::info!(
            files = present.len(),
            "loading the files a killed run committed"
        );
        self.load_changed(&present).await;
        PendingLoads::clear(vardir);
    }
}

/// The removal guard, over every pass before anything is staged, so a
/// refusal changes nothing in any destination.
fn guard(settings: &Settings, passes: &[Pass]) -> Result<(), SyncError> {
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

/// Relative path → planned mode, for every file `plan` writes.
fn write_modes(plan: &Plan) -> HashMap<&Path, u32> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            plan::Action::Write { rel, mode, .. } => Some((rel.as_path(), *mode)),
            _ => None,
        })
        .collect()
}

/// `3093` as `3,093`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn change(resource: &FileResource, rel: &Path, action: ChangeKind) -> Change {
    Change {
        path: format!("{}/{}", resource.mount, rel.display()),
        action,
        file: resource.path.join(rel).display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_line_names_counts_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(3093), "3,093");
        assert_eq!(thousands(1_234_567), "1,234,567");
        let e = SyncError::MassRemoval {
            mount: Mount::Plugins,
            removal: plan::Removal {
                removed: 2941,
                total: 3093,
            },
        };
        assert_eq!(
            e.to_string(),
            "refusing to remove 2,941 of 3,093 files in plugins: the master's environment looks incomplete; --allow-mass-removal to proceed"
        );
    }
}
