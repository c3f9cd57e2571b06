//! One sync run, end to end.
//!
//! 1. Take the run lock (not for `--noop`).
//! 2. For every resource of the catalog (pluginfacts, then plugins): fetch
//!    and validate the listing, scan the destination, plan.
//! 3. `--noop`: report the plan and stop.
//! 4. Stage every download of every resource and verify each.
//! 5. Only then commit each resource, and report.
//!
//! Any failure in 1, 2 or 4 (unreachable masters, TLS, an error status, a
//! malformed or hostile listing, an unknown environment, a failed or
//! mismatching download) stops the run with one line and leaves every
//! destination as it was: nothing is ever purged because of an error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pluginsync_common::ignore::IgnoreSet;

use crate::cache::MountCache;
use crate::catalog::{self, FileResource};
use crate::client::{Client, FetchError};
use crate::commit;
use crate::config::SourcePermissions;
use crate::exit::ExitStatus;
use crate::listing;
use crate::plan::{self, Plan};
use crate::report::{Change, Failure, Report};
use crate::scan;
use crate::settings::Settings;
use crate::stage::{self, Staging};

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The report (also for failed runs).
    pub report: Report,
    /// The one-line reason the run stopped, if it did.
    pub error: Option<String>,
    /// `[load] failures_are_errors`.
    pub load_failures_are_errors: bool,
}

impl Outcome {
    /// How the process exits: with `detailed`, 0 no change, 2 changes,
    /// 4 failures, 6 both; 1 when nothing was applied. Without it, 0 or 1.
    pub fn exit_status(&self, detailed: bool) -> ExitStatus {
        if self.error.is_some() {
            return ExitStatus::Failure;
        }
        let failed = !self.report.failures.is_empty()
            || (self.load_failures_are_errors
                && self
                    .report
                    .loads
                    .iter()
                    .any(|l| l.status == crate::load::LoadStatus::Failed));
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

/// One resource, planned.
struct Planned {
    resource: FileResource,
    plan: Plan,
    /// The validated listing; `None` when a 304 and an unchanged scan
    /// ended the pass early.
    remote: Option<listing::RemoteTree>,
    /// The scan before any change.
    local: scan::LocalTree,
    /// Cache key (server, mount, parameters) of this listing.
    key: String,
    /// The listing's ETag.
    etag: Option<String>,
    /// A newly fetched listing body, to cache.
    fresh: Option<bytes::Bytes>,
}

/// Runs a sync; never panics on bad input, always returns a report.
pub async fn run(settings: &Settings) -> Outcome {
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
    let result = run_inner(settings, &mut report).await;
    report.duration_ms = started.elapsed().as_millis() as u64;
    let error = result.err();
    report.error = error.clone();
    if !settings.noop
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

async fn run_inner(settings: &Settings, report: &mut Report) -> Result<(), String> {
    let _lock = if settings.noop {
        None
    } else {
        Some(crate::lock::acquire(&settings.vardir).map_err(|e| e.to_string())?)
    };
    let catalog = catalog::build(settings);
    let deadline = Instant::now() + settings.timeout;
    let client =
        Client::new(&settings.tls, settings.retries, deadline).map_err(|e| e.to_string())?;
    let env = catalog.environment.to_string();
    let t0 = Instant::now();
    let phase =
        |name: &str| tracing::debug!(elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0, "{name}");

    // Scans, listings and plans: reading only.
    let mut server: Option<String> = None;
    let mut blobs: Option<String> = None;
    let mut batch: Option<String> = None;
    let mut planned = Vec::new();
    for resource in catalog.resources {
        let ignore = IgnoreSet::new(&resource.ignore).map_err(|e| e.to_string())?;
        let perms = match resource.source_permissions {
            SourcePermissions::Use => "use",
            SourcePermissions::Ignore => "ignore",
        };
        let mut cache = MountCache::load(&settings.vardir, resource.mount);
        phase("cache loaded");
        let mut local = scan::scan(&resource.path, &ignore).map_err(|e| e.to_string())?;
        let digest = local.digest();
        phase("scanned");
        let query = pluginsync_common::protocol::ListingQuery {
            environment: &env,
            source_permissions: perms,
            ignore: &resource.ignore,
        }
        .to_query();
        let key_for = |server: &str| format!("{server}|{}|{query}", resource.mount);
        let inm_for = |server: &str| {
            if cache.key == key_for(server) {
                cache.etag.clone()
            } else {
                None
            }
        };
        let answer = match &server {
            None => {
                let (s, answer) = client
                    .first_listing(
                        &settings.servers,
                        resource.mount,
                        &env,
                        perms,
                        &resource.ignore,
                        &inm_for,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                server = Some(s);
                report.server = server.clone();
                blobs = answer.blobs.clone();
                batch = answer.batch.clone();
                answer
            }
            Some(s) => client
                .listing(
                    s,
                    resource.mount,
                    &env,
                    perms,
                    &resource.ignore,
                    inm_for(s).as_deref(),
                )
                .await
                .map_err(|e| e.to_string())?,
        };
        let server_name = server.clone().unwrap_or_default();
        let key = key_for(&server_name);
        phase("listing answered");
        let (body, fresh) = match answer.body {
            Some(b) => (b.to_vec(), Some(b)),
            None if cache.scan_digest.as_deref() == Some(digest.as_str()) => {
                // Neither the master's tree nor ours changed: done.
                report.unchanged += cache.entries;
                planned.push(Planned {
                    resource,
                    plan: Plan::default(),
                    remote: None,
                    local,
                    key,
                    etag: answer.etag,
                    fresh: None,
                });
                continue;
            }
            None => match MountCache::load_listing(&settings.vardir, resource.mount) {
                Some(b) => (b, None),
                None => {
                    let again = client
                        .listing(
                            &server_name,
                            resource.mount,
                            &env,
                            perms,
                            &resource.ignore,
                            None,
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    let b = again.body.unwrap_or_default();
                    (b.to_vec(), Some(b))
                }
            },
        };
        let entries = Client::parse_listing(&server_name, &body).map_err(|e| e.to_string())?;
        let remote = listing::validate(entries, &ignore).map_err(|e| {
            FetchError::Malformed {
                server: server_name.clone(),
                detail: format!("{} mount: {e}", resource.mount),
            }
            .to_string()
        })?;
        phase("listing validated");
        cache.load_files(&settings.vardir, resource.mount);
        let read = scan::hash_files(&resource.path, &mut local, &remote, &cache)
            .map_err(|e| e.to_string())?;
        tracing::debug!(mount = %resource.mount, hashed = read, "local files hashed");
        let plan = plan::plan(
            &remote,
            &local,
            resource.source_permissions == SourcePermissions::Use,
        );
        report.unchanged += plan.unchanged;
        planned.push(Planned {
            resource,
            plan,
            remote: Some(remote),
            local,
            key,
            etag: answer.etag,
            fresh,
        });
    }
    let server = server.unwrap_or_default();

    if settings.noop {
        for p in &planned {
            for (rel, kind) in p.plan.actions.iter().filter_map(|a| a.change()) {
                report.changes.push(change(&p.resource, rel, kind));
            }
        }
        return Ok(());
    }

    phase("planned");
    // Stage and verify every download before changing anything.
    let mut stagings: Vec<Option<Staging>> = Vec::new();
    for p in &planned {
        let writes: Vec<(PathBuf, String)> = p
            .plan
            .writes()
            .map(|(r, s)| (r.to_owned(), s.to_owned()))
            .collect();
        if writes.is_empty() {
            if let Err(e) = stage::clean_stale(&p.resource.path) {
                tracing::warn!(dest = %p.resource.path.display(), error = %e, "cannot remove a stale staging directory");
            }
            stagings.push(None);
            continue;
        }
        let mut staging = match Staging::prepare(&p.resource.path) {
            Ok(s) => s,
            Err(e) => {
                abort(stagings);
                return Err(format!(
                    "cannot stage downloads in '{}': {e}",
                    p.resource.path.display()
                ));
            }
        };
        let result = staging
            .download_all(
                &client,
                &crate::client::Source {
                    server: &server,
                    mount: p.resource.mount,
                    env: &env,
                    blobs: blobs.as_deref(),
                    batch: batch.as_deref(),
                },
                writes,
                settings.parallel_downloads,
            )
            .await;
        stagings.push(Some(staging));
        if let Err(e) = result {
            abort(stagings);
            return Err(format!("{e}; nothing was changed"));
        }
    }

    phase("staged");
    // Commit.
    report.applied = true;
    for (p, staging) in planned.iter().zip(stagings) {
        let empty = HashMap::new();
        let staged = staging.as_ref().map(|s| &s.files).unwrap_or(&empty);
        let done = commit::commit(&p.resource.path, &p.plan, staged, &p.resource);
        for (rel, kind) in done.changes {
            report.changes.push(change(&p.resource, &rel, kind));
        }
        phase("renamed");
        if done.failures.is_empty() {
            remember(settings, p);
            phase("remembered");
        } else {
            MountCache::clear(&settings.vardir, p.resource.mount);
        }
        for (rel, error) in done.failures {
            report.failures.push(Failure {
                path: format!("{}/{}", p.resource.mount, rel.display()),
                error,
            });
        }
        if let Some(s) = staging {
            s.finish();
        }
    }

    phase("committed");
    // Load what changed under the libdir; each load isolated.
    let mut registry = crate::plugins::Registry::load(&settings.vardir);
    let before = registry.clone();
    for (name, version) in registry.prune_missing() {
        tracing::info!(plugin = %name, version = %version, "plugin file gone, unregistered");
    }
    if !settings.loaders.is_empty() {
        let changed = changed_files(&settings.libdir, &report.changes);
        if !changed.is_empty() {
            let loaders = crate::load::Loaders::new(&settings.loaders, &settings.load, &env);
            report.loads = loaders
                .load(&changed, settings.load_enabled, &mut registry)
                .await;
        }
    }
    if registry != before
        && let Err(e) = registry.save(&settings.vardir)
    {
        tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the plugin registry");
    }
    Ok(())
}

/// The regular files under `libdir` this run created or updated, as
/// (path relative to the libdir, absolute path): what the loaders see.
fn changed_files(libdir: &std::path::Path, changes: &[Change]) -> Vec<(PathBuf, PathBuf)> {
    changes
        .iter()
        .filter(|c| {
            matches!(
                c.action,
                plan::ChangeKind::Created | plan::ChangeKind::Updated
            )
        })
        .filter_map(|c| {
            let rel = c.path.strip_prefix("plugins/")?;
            let abs = libdir.join(rel);
            std::fs::symlink_metadata(&abs)
                .ok()?
                .is_file()
                .then(|| (PathBuf::from(rel), abs))
        })
        .collect()
}

/// Records what a clean commit left: the listing, its ETag, the stat of
/// every synced file with its (verified) sha256, and the scan digest.
fn remember(settings: &Settings, p: &Planned) {
    let Some(remote) = &p.remote else { return };
    // The scan from before the commit, with every path the plan touched
    // (and their parent directories) stat'ed again: no second walk.
    let touched: Vec<PathBuf> = p
        .plan
        .actions
        .iter()
        .filter_map(|a| a.change().map(|(rel, _)| rel.to_owned()))
        .chain(std::iter::once(PathBuf::new()))
        .collect();
    let after = p.local.updated(&p.resource.path, &touched);
    let written: std::collections::HashSet<&std::path::Path> =
        p.plan.writes().map(|(r, _)| r).collect();
    let now_by: std::collections::HashMap<&std::path::Path, &scan::LocalEntry> = after
        .entries
        .iter()
        .map(|(k, v)| (k.as_path(), v))
        .collect();
    let before_by: std::collections::HashMap<&std::path::Path, &scan::LocalEntry> = p
        .local
        .entries
        .iter()
        .map(|(k, v)| (k.as_path(), v))
        .collect();
    let mut files = std::collections::HashMap::new();
    for (rel, entry) in remote.entries.iter() {
        let listing::RemoteKind::File { sha256 } = &entry.kind else {
            continue;
        };
        let path = std::path::Path::new(rel.as_str());
        let Some(now) = now_by.get(path) else {
            continue;
        };
        // A file we did not write must still be the one we hashed (or
        // found in the cache); otherwise it changed under us: not cached.
        let unchanged = written.contains(path)
            || before_by
                .get(path)
                .is_some_and(|before| before.stat == now.stat);
        if unchanged {
            files.insert(rel.as_str().to_owned(), (now.stat, sha256.clone()));
        }
    }
    let cache = MountCache {
        key: p.key.clone(),
        etag: p.etag.clone(),
        scan_digest: Some(after.digest()),
        entries: remote.entries.len(),
        files,
    };
    if let Err(e) = cache.save(&settings.vardir, p.resource.mount, p.fresh.as_deref()) {
        tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the sync cache");
    }
}

fn change(resource: &FileResource, rel: &std::path::Path, action: plan::ChangeKind) -> Change {
    Change {
        path: format!("{}/{}", resource.mount, rel.display()),
        action,
        file: resource.path.join(rel).display().to_string(),
    }
}

fn abort(stagings: Vec<Option<Staging>>) {
    for s in stagings.into_iter().flatten() {
        s.abort();
    }
}
