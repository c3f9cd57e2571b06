//! Phase 4 of a run, and what makes it survive a kill: the files the
//! commit wrote go to the loaders (`load.rs`); the pending-loads record
//! written before the commit hands them to the next run if this one dies
//! in between. What the loads did is kept for the node report, sent to
//! the master that served the run right after them ([`Run::send_report`])
//! and carried by the next per-node request (docs/protocol.md §7.8), and
//! given to Puppet's own inventory as the `pluginsync` external fact
//! ([`write_fact`], docs/agent.md#the-pluginsync-fact).

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use pluginsync_common::generation::GenerationId;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use pluginsync_common::rollout::NodeReport;
use serde::{Deserialize, Serialize};

use super::Run;
use super::generation::Held;
use super::pass::Pass;
use crate::cache::GenerationRecord;
use crate::client::NodeReportHeader;
use crate::load::{LoadEntry, LoadState, LoadStatus, Loaders, PendingLoads};
use crate::plugins::Registry;
use crate::settings::Settings;

impl Run<'_> {
    /// load: the files this run wrote under the libdir go to the loaders,
    /// each isolated; the plugin registry drops plugins whose file is gone.
    pub(super) async fn load_changed(&mut self, written: &[(Mount, RelPath)]) {
        let loads = load_files(self.settings, self.env.as_str(), written).await;
        if !loads.is_empty() {
            self.remember_loads(&loads);
        }
        self.report.loads.extend(loads);
    }

    /// Before the commit: records the files it is about to write, so that
    /// a run killed between its commit and its loads leaves them to the
    /// next run ([`Run::recover_loads`]). Only with loaders configured.
    pub(super) fn record_loads<'p>(&self, passes: impl Iterator<Item = &'p Pass>) {
        let settings = self.settings;
        if settings.loaders.is_empty() {
            return;
        }
        let files: Vec<(Mount, RelPath)> = passes
            .flat_map(|p| {
                p.plan
                    .writes()
                    .map(|(rel, _)| (p.resource.mount, rel.clone()))
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
    pub(super) async fn recover_loads(&mut self) {
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

    /// After the loads: what they did is kept in the vardir for the node
    /// report ([`LoadState`]).
    fn remember_loads(&self, loads: &[LoadEntry]) {
        let (vardir, env) = (&self.settings.vardir, self.env.as_str());
        let mut state = LoadState::load(vardir, env);
        let before = state.clone();
        state.update(loads);
        if state != before
            && let Err(e) = state.save(vardir, env)
        {
            tracing::warn!(vardir = %vardir.display(), error = %e, "cannot save the load state");
        }
    }

    /// The node report's header value (docs/protocol.md §7.8): the
    /// generation committed for the environment and what the loads did, a
    /// failed plugin whose file is gone left out.
    pub(super) fn node_report(&self, generation: Option<GenerationId>) -> String {
        report_of(self.settings, self.env.as_str(), generation).to_header()
    }

    /// The node report `value` as a per-node request carries it, flagged
    /// for a `--noop` run (the master records nothing of it).
    pub(super) fn report_header<'r>(&self, value: &'r str) -> NodeReportHeader<'r> {
        NodeReportHeader {
            value,
            noop: self.settings.noop,
        }
    }

    /// Right after the commit, the loads and the fact check: the node
    /// report goes to the master that served the run's generation
    /// (docs/protocol.md §7.8), so the gate and the inventory see this run
    /// now, not on the next one. Only when the run changed what the
    /// report says (the per-node request carried the rest); never for
    /// `--noop` or a bundle. A master without the endpoint is one debug
    /// line; a failure one warning, never the run's: the next run's
    /// header carries the report.
    pub(super) async fn send_report(&self, held: Option<&Held>) {
        let Some(held) = held else { return };
        let r = &self.report;
        let changed = held.changed || !r.changes.is_empty() || !r.loads.is_empty();
        if self.settings.noop || self.bundle.is_some() || !changed {
            return;
        }
        let (vardir, env) = (&self.settings.vardir, self.env.as_str());
        let report = self.node_report(GenerationRecord::load(vardir, env).generation);
        let server = held.origin.server.as_str();
        match self.servers.post_report(server, &self.env, &report).await {
            Ok(true) => tracing::debug!(server, "node report sent"),
            Ok(false) => tracing::debug!(
                server,
                "the server takes no node reports; the next run's request carries it"
            ),
            Err(e) => tracing::warn!(
                server,
                error = %e,
                "cannot send the node report; the next run's request carries it"
            ),
        }
    }
}

/// The node report of `generation` in `environment`: its load state, a
/// failed plugin whose file is gone left out.
fn report_of(s: &Settings, environment: &str, generation: Option<GenerationId>) -> NodeReport {
    let state = LoadState::load(&s.vardir, environment);
    let exists = |path: &str| match path.split_once('/') {
        Some(("plugins", rel)) => s.libdir.join(rel).exists(),
        Some(("pluginfacts", rel)) => s.factsdir.as_ref().is_some_and(|d| d.join(rel).exists()),
        _ => true,
    };
    state.report(generation, exists)
}

/// The `pluginsync` fact's file in Facter's external directory.
const FACT_FILE: &str = "pluginsync.json";

/// The `pluginsync` fact: per environment, what the node holds. Nothing
/// but generation ids, times and plugin names.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Fact {
    pluginsync: BTreeMap<String, FactEntry>,
}

/// One environment's entry of the `pluginsync` fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FactEntry {
    /// The generation committed (its full id); `None`: none (a sync of
    /// Puppet's listings).
    generation: Option<String>,
    /// When the node first held it (RFC 3339, UTC).
    committed: String,
    /// Its failing plugins (`plugins/…`, `pluginfacts/…`).
    failing: Vec<String>,
}

/// After a run's commit (or a rollback): `environment`'s entry of the
/// `pluginsync` fact, in `[facts] external_dir`, made what the node holds
/// now: its generation, since when, its failing plugins. Written
/// atomically (0644, the directory made 0755 if missing) and only when
/// it changed; a failure is one warning, never the run's.
pub(super) fn write_fact(settings: &Settings, environment: &str) {
    let Some(dir) = &settings.fact_dir else {
        return;
    };
    let generation = GenerationRecord::load(&settings.vardir, environment).generation;
    let failing = report_of(settings, environment, generation).failed;
    let entry = (generation.map(|g| g.to_hex()), failing);
    match update_fact(dir, environment, entry) {
        Ok(true) => tracing::debug!(dir = %dir.display(), "pluginsync fact written"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            path = %dir.join(FACT_FILE).display(),
            error = %e,
            "cannot write the pluginsync fact"
        ),
    }
}

/// [`write_fact`]'s file in `dir`: `environment`'s entry set to
/// `(generation, failing)`, its time kept while the generation is the
/// same. Whether it was written.
fn update_fact(
    dir: &Path,
    environment: &str,
    (generation, failing): (Option<String>, Vec<String>),
) -> std::io::Result<bool> {
    let path = dir.join(FACT_FILE);
    let old = std::fs::read(&path).ok();
    // Anything else in it (unreadable, or not ours) is replaced.
    let mut fact: Fact = (old.as_deref())
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let committed = match fact.pluginsync.get(environment) {
        Some(e) if e.generation == generation => e.committed.clone(),
        _ => humantime_serde::re::humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string(),
    };
    let entry = FactEntry {
        generation,
        committed,
        failing,
    };
    fact.pluginsync.insert(environment.to_owned(), entry);
    let mut bytes = serde_json::to_vec_pretty(&fact)?;
    bytes.push(b'\n');
    if old.as_deref() == Some(bytes.as_slice()) {
        return Ok(false);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    pluginsync_common::fsutil::write_atomic(&path, &bytes, 0o644)?;
    Ok(true)
}

/// The files `written` (under the live destinations of `settings`) go to
/// the loaders of `environment`, each isolated; the plugin registry drops
/// plugins whose file is gone. A sync's loads and a rollback's.
pub(super) async fn load_files(
    settings: &Settings,
    environment: &str,
    written: &[(Mount, RelPath)],
) -> Vec<LoadEntry> {
    let mut registry = Registry::load(&settings.vardir);
    let before = registry.clone();
    for (name, version) in registry.prune_missing() {
        tracing::info!(plugin = %name, version = %version, "plugin file gone, unregistered");
    }
    let mut loads = Vec::new();
    if !settings.loaders.is_empty() {
        let loaders = Loaders::new(&settings.loaders, &settings.load, environment);
        if written.iter().any(|(m, _)| loaders.serves(*m)) {
            loads = loaders
                .load(
                    &settings.libdir,
                    settings.factsdir.as_deref(),
                    written,
                    settings.load_enabled,
                    &mut registry,
                )
                .await;
        }
    }
    // Fact health (docs/loading.md#fact-health): on by default, loaders
    // or not; one entry per changed fact file, loader `facter`, and per
    // file still failing from an earlier check (a failure under load
    // passes once retried; a passing unchanged file is not re-run).
    let (libdir, factsdir) = (settings.libdir.as_path(), settings.factsdir.as_deref());
    let mut facts = written.to_vec();
    facts.extend(still_failing(settings, environment, written));
    let checked = crate::facts::check(
        &settings.load.facts,
        libdir,
        factsdir,
        &settings.vardir,
        &facts,
    );
    loads.extend(checked.await.into_iter().map(|c| LoadEntry {
        path: c.path,
        loader: Some(crate::facts::LOADER.to_owned()),
        status: match c.error {
            None => LoadStatus::Ok,
            Some(_) => LoadStatus::Failed,
        },
        error: c.error,
        duration_ms: c.duration_ms,
    }));
    if registry != before
        && let Err(e) = registry.save(&settings.vardir)
    {
        tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the plugin registry");
    }
    loads
}

/// The files of `environment`'s load state still failing, not among
/// `written` and still live under `settings`' destinations: the fact
/// check takes them again (it checks only fact files among them).
fn still_failing(
    settings: &Settings,
    environment: &str,
    written: &[(Mount, RelPath)],
) -> Vec<(Mount, RelPath)> {
    let state = LoadState::load(&settings.vardir, environment);
    (state.failed.iter())
        .filter_map(|path| {
            let (mount, rel) = path.split_once('/')?;
            let (mount, root) = match mount {
                "plugins" => (Mount::Plugins, settings.libdir.as_path()),
                "pluginfacts" => (Mount::Pluginfacts, settings.factsdir.as_deref()?),
                _ => return None,
            };
            let rel = RelPath::parse(rel).ok()?;
            let again = !written.iter().any(|(m, r)| *m == mount && *r == rel);
            (again && rel.to_path(root).is_file()).then_some((mount, rel))
        })
        .collect()
}
