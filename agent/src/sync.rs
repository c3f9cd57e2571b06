//! One sync run, read as its diagram (ARCHITECTURE.md#pipelines):
//!
//! ```text
//! catalog → listing (HTTP) + local scan → plan (pure) → stage + verify → commit → report → load
//! ```
//!
//! [`run`] takes the run lock (not for `--noop`), builds the catalog (one
//! resource per destination: pluginfacts, then plugins) and drives a
//! [`Run`] through its phases. Each destination is one value moving
//! through its states (`dest.rs`: `Scanning → Pass → Planned → Staged →
//! Preparing → Ready → Switching`), every destination through one
//! transition before the next; the phases, read top-down in this file:
//!
//! 1. `Run::plan_all`, per resource: the listing (from the run's
//!    generation, `generation.rs`, or Puppet's listings, `pass.rs`, or
//!    the cache on a 304), the scan of the destination, the plan. Reading
//!    only. `--noop` reports the plans and stops here.
//! 2. `Run::stage`: every download of every resource, verified
//!    (`apply.rs`; from a bundle's blobs, `bundle.rs`); `Run::prepare_all`:
//!    each changed destination's next generation complete beside it
//!    (docs/internals.md#the-switch); then a Puppet run holding its lock is
//!    waited for (`lock::wait_for_puppet`).
//! 3. `Run::commit_all`: only then each resource is switched (or, without
//!    `RENAME_EXCHANGE`, committed in place) and reported, and the cache
//!    updated (`apply.rs`, `Run::commit_one`).
//! 4. `Run::load_changed` (`loads.rs`): the files written under the libdir
//!    go to the loaders.
//!
//! How the run ended, [`SyncError`] and [`Outcome`], is `outcome.rs`.
//!
//! Any failure in 1 or 2 (the lock, TLS, unreachable masters, an error
//! status, a malformed or hostile listing, an unknown environment, a failed
//! or mismatching download, a destination without room for the commit:
//! [`commit::check_space`]) stops the run with one [`SyncError`] and leaves
//! every destination as it was: the staged files are removed when their
//! [`Staging`](crate::stage::Staging) is dropped, and nothing is ever purged because of an error.
//!
//! SIGTERM and SIGINT ([`Interrupts`], docs/operating.md#signals) race phases 1 and
//! 2 and stop the run the same way; once the commit has started they are
//! only noted: the commit finishes, is reported and remembered, and the
//! run ends without its loads (kept in the pending-loads record).

mod apply;
mod blobs;
mod bundle;
mod dest;
mod generation;
mod history;
mod loads;
mod outcome;
mod pass;
mod rollback;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pluginsync_common::envname::EnvName;
use pluginsync_common::fsutil::remove_leftovers;
use pluginsync_common::protocol::Mount;

use dest::{Planned, Preparing, Ready, Staged, Switching};
use generation::Held;
use pass::{Pass, Scanning};
use pluginsync_common::fsutil::Durable;
use pluginsync_common::relpath::RelPath;

use crate::catalog;
use crate::client::Client;
use crate::commit;
use crate::config::EnvironmentSource;
use crate::load::PendingLoads;
use crate::lock::{self, LockError};
use crate::report::Report;
use crate::servers::Servers;
use crate::settings::Settings;
use crate::signals::Interrupts;
use crate::stage;

pub use outcome::{Outcome, SyncError};
pub use rollback::{RollbackError, rollback};

/// Runs a sync; never panics on bad input, always returns a report (saved
/// to `<vardir>` unless `--noop`). `bundle`: `--from-bundle`, the
/// generation from that file and no request at all (`bundle.rs`).
/// `interrupts`: SIGTERM/SIGINT, see the module docs.
pub async fn run(settings: &Settings, bundle: Option<&Path>, interrupts: &Interrupts) -> Outcome {
    let started = Instant::now();
    let mut report = new_report(settings);
    let error = Run::execute(settings, bundle, &mut report, interrupts)
        .await
        .err();
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

/// A run's report before anything happened.
fn new_report(settings: &Settings) -> Report {
    Report {
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
        puppet_lock_waited_ms: None,
        generation: None,
        switch: None,
        rolled_back: false,
    }
}

/// The run's servers, whose client a bundle's run never uses (no TLS file
/// is read for it: `bundle.rs`).
fn servers_of(settings: &Settings, bundle: Option<&Path>) -> Result<Servers, SyncError> {
    let deadline = Instant::now() + settings.timeout;
    let client = match bundle {
        Some(_) => Client::offline(&settings.tls, deadline),
        None => Client::new(&settings.tls, settings.retries, deadline)?,
    };
    Ok(Servers::new(client, settings.servers.clone()))
}

/// The environment the run syncs: the configured one, or with
/// `environment_source = "server"` the one the servers' node endpoint
/// assigns (docs/protocol.md §4.10), unless `--environment` named it (as
/// Puppet's agent, which then does not ask). A server without the node
/// endpoint (404) leaves the configured one, with one warning.
/// A bundle names its own (`bundle.rs`).
async fn environment(
    settings: &Settings,
    bundle: Option<&Path>,
    servers: &Servers,
) -> Result<EnvName, SyncError> {
    let configured = &settings.environment;
    if bundle.is_some()
        || settings.environment_source != EnvironmentSource::Server
        || settings.environment_origin == crate::settings::Source::CommandLine
    {
        return Ok(configured.clone());
    }
    match servers
        .node_environment(&settings.certname, configured)
        .await?
    {
        None => {
            tracing::warn!(
                environment = %configured,
                "the servers do not serve the node endpoint; syncing the configured environment"
            );
            Ok(configured.clone())
        }
        Some(env) => {
            if env != *configured {
                tracing::info!(configured = %configured, assigned = %env, "switching to the environment the server assigns");
            }
            Ok(env)
        }
    }
}

/// The state of one run.
struct Run<'a> {
    settings: &'a Settings,
    report: &'a mut Report,
    /// The servers, and the one serving the run once it answered.
    servers: Servers,
    /// The environment, as sent.
    env: EnvName,
    /// `--from-bundle`: the bundle the generation comes from.
    bundle: Option<&'a Path>,
    /// For the phase timings in the debug log.
    started: Instant,
    /// The mounts whose destination was switched by an exchange.
    switched: HashSet<Mount>,
}

impl<'a> Run<'a> {
    /// The whole run, phase by phase; see the module docs.
    async fn execute(
        settings: &'a Settings,
        bundle: Option<&'a Path>,
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
            rollback::finish_cut(settings)?;
        }
        let scans = pass::start_scans(catalog::build(settings).resources);
        let servers = servers_of(settings, bundle)?;
        let env = tokio::select! {
            biased;
            signal = interrupts.wait() => return Err(SyncError::Interrupted { signal, committed: false }),
            env = environment(settings, bundle, &servers) => env?,
        };
        report.environment = env.to_string();
        let mut run = Run {
            settings,
            report,
            servers,
            env,
            bundle,
            started: Instant::now(),
            switched: HashSet::new(),
        };
        let interrupted = |signal, committed| SyncError::Interrupted { signal, committed };
        // Everything before the commit, raced with the signals: dropping
        // it drops the stagings made so far, which removes them.
        let before_commit = async {
            if !settings.noop {
                run.recover_loads().await;
            }
            let (passes, held) = run.plan_all(scans).await?;
            if settings.noop {
                run.report_plans(&passes);
                run.report.generation = held.map(|g| g.id.to_hex());
                return Ok(None);
            }
            run.phase("planned");
            pass::guard(settings, &passes)?;
            let keep = settings.switch.keep_previous;
            let planned = passes.into_iter().map(|p| p.foresee(keep)).collect();
            let staged = run.stage(planned, held.as_ref()).await?;
            run.phase("staged");
            let plans = staged
                .iter()
                .map(|d| (d.pass.resource.path.as_path(), &d.pass.plan));
            commit::check_space(plans)?;
            let ready = run.prepare_all(staged)?;
            // Never under a Puppet run using the tree, just before the
            // switch; a run that changes nothing does not look
            // (docs/agent.md#a-puppet-run-in-progress).
            if ready.iter().any(|d| !d.pass.plan.actions.is_empty()) {
                run.wait_for_puppet().await?;
            }
            Ok::<_, SyncError>(Some((ready, held)))
        };
        let (ready, held) = tokio::select! {
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
        run.record_loads(ready.iter().map(|d| &d.pass));
        run.commit_and_load(ready, held.as_ref(), interrupts).await
    }

    /// switch → cache → report → load, once everything is prepared; from
    /// here on a signal is only noted (see the module docs).
    async fn commit_and_load(
        &mut self,
        ready: Vec<dest::Ready>,
        held: Option<&generation::Held>,
        interrupts: &Interrupts,
    ) -> Result<(), SyncError> {
        let interrupted = |signal, committed| SyncError::Interrupted { signal, committed };
        self.phase("commit started");
        // The caches are written on threads of the scope while the run's
        // record is; all of them before the loads.
        let (settings, env) = (self.settings, self.env.clone());
        let mounts: Vec<Mount> = ready.iter().map(|d| d.pass.resource.mount).collect();
        let written = std::thread::scope(|scope| {
            // The new manifest is written beside its place while the
            // switches run, and put there after them.
            let manifest = generation::write_manifest_ahead(scope, settings, &env, held);
            let written = self.commit_all(scope, ready);
            self.phase("committed");
            self.remember_generation(held, manifest.and_then(|m| m.join().ok()));
            written
        });
        self.phase("remembered");
        self.remember_live(held);
        self.forget_listings(held, &mounts);
        if let Some(signal) = interrupts.received() {
            return Err(interrupted(signal, true));
        }
        tokio::select! {
            biased;
            // The loaders' groups are killed by the signal thread; what
            // they did not finish stays in the pending-loads record.
            signal = interrupts.wait() => return Err(interrupted(signal, true)),
            () = self.load_changed(&written) => {}
        }
        PendingLoads::clear(&self.settings.vardir);
        if self.settings.load.rollback_on_failure {
            let switched = std::mem::take(&mut self.switched);
            self.rollback_on_failure(&switched);
        }
        self.send_report(held).await;
        loads::write_fact(self.settings, self.env.as_str());
        Ok(())
    }

    /// Phase 1 for every resource, from one generation when the servers
    /// serve them, else from Puppet's listings.
    /// `scans`: each resource with its scan, started before the servers
    /// were asked anything (`pass::Scanning`).
    pub(super) async fn plan_all(
        &mut self,
        scans: Vec<Scanning>,
    ) -> Result<(Vec<Pass>, Option<Held>), SyncError> {
        let mut held = match self.bundle {
            Some(path) => Some(self.bundled(path).await?),
            None => self.generation(&scans).await?,
        };
        let mut passes = Vec::with_capacity(scans.len());
        for scanning in scans {
            passes.push(match held.as_mut() {
                Some(g) => self.plan_from(g, scanning).await?,
                None => self.plan(scanning).await?,
            });
        }
        if held.is_none() {
            self.routing_gap(&passes);
            self.reprobe(&passes);
        }
        Ok((passes, held))
    }

    /// Phase 2 for every destination: from the bundle's blobs when the
    /// run has some, else downloads (`Run::stage_all`). The files the
    /// last change replaced are freed meanwhile (`commit::sweep_trash`).
    pub(super) async fn stage(
        &self,
        planned: Vec<Planned>,
        held: Option<&Held>,
    ) -> Result<Vec<Staged>, SyncError> {
        let dests = planned.iter().map(|d| d.pass.resource.path.clone());
        crate::commit::sweep_trash(dests.collect());
        let Some(blobs) = held.and_then(|h| h.blobs.as_ref()) else {
            return self.stage_all(planned).await;
        };
        self.stage_bundled(planned, blobs)
    }

    /// prepare: each destination that changes something gets its next
    /// generation complete and durable beside the live tree
    /// (`Staged::prepare`); the staged files of those that commit in place
    /// are synced here, before any rename (stage.rs, module docs). The
    /// live trees are untouched: an error here changes nothing.
    pub(super) fn prepare_all(&self, staged: Vec<Staged>) -> Result<Vec<Ready>, SyncError> {
        let keep = self.settings.switch.keep_previous;
        let mut in_place = Durable::new();
        let preparing = (staged.into_iter())
            .map(|d| d.prepare(keep, &mut in_place))
            .collect::<Result<Vec<_>, _>>()?;
        for d in &preparing {
            d.stop_writeback();
        }
        stage::sync_sealed(in_place).map_err(SyncError::Download)?;
        let ready = (preparing.into_iter())
            .map(Preparing::durable)
            .collect::<Result<Vec<_>, _>>()?;
        self.phase("prepared");
        Ok(ready)
    }

    /// switch (or commit in place) → report: each resource in catalog
    /// order, its changes and failures reported; the cache remembers a
    /// clean commit (written on a thread of `scope`, while the next
    /// resource switches and the run's record is written) and forgets a
    /// failed one. Returns the files written, for the loaders.
    pub(super) fn commit_all<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        ready: Vec<Ready>,
    ) -> Vec<(Mount, RelPath)>
    where
        'a: 's,
    {
        let vardir = &self.settings.vardir;
        self.report.applied = true;
        let mut written = Vec::new();
        let switching: Vec<Switching<'s>> = (ready.into_iter())
            .map(|d| d.learn_ahead(scope, vardir))
            .collect();
        for d in switching {
            self.commit_one(scope, d, &mut written);
        }
        written
    }

    /// Waits while a Puppet run holds its lock (`lock::wait_for_puppet`);
    /// the report says how long, when it waited.
    async fn wait_for_puppet(&mut self) -> Result<(), SyncError> {
        let waited = lock::wait_for_puppet(&self.settings.puppet_lock).await;
        let ms = |d: std::time::Duration| Some(d.as_millis() as u64);
        self.report.puppet_lock_waited_ms = match &waited {
            Ok(w) => w.and_then(ms),
            Err(e) => ms(e.waited),
        };
        waited?;
        self.phase("puppet lock free");
        Ok(())
    }

    fn phase(&self, name: &str) {
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            "{name}"
        );
    }
}
