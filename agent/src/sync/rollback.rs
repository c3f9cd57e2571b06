//! Rolling back (docs/agent.md#generations-and-rollback): the node made
//! to hold the generation live before the current one again, every
//! destination at once and both mounts from that one generation, offline
//! — no master, no network. The history (`history.rs`) says which
//! generation that was and keeps its manifest; for each destination the
//! tree holding that generation's mount is found by comparing the live
//! tree, then the kept ones (`commit::Standby`, newest first), with the
//! manifest: a live tree that holds it stays, a kept one is exchanged
//! with it. When a destination has no tree holding it, nothing is changed
//! and the error says which and why. What changes is listed before the
//! switch by comparing the two trees (`commit::Mirror`, listing only),
//! reported as a sync's changes, and the files it brings back go to the
//! loaders. The cache of each mount rolled back is forgotten, so the next
//! `sync` plans against the tree now live.
//!
//! The exchanges are journaled (`<vardir>/rollback.json`, durable,
//! written before the first): a rollback cut short (killed between two
//! destinations) is finished by the next run, `rollback` or `sync`, which
//! tells an exchange done from one not done by the inode now live, so the
//! node ends on the new generation whole, never on a mix.
//!
//! Two ways in: `pluginsync-agent rollback` ([`rollback`]), and a sync
//! whose loads failed under `[load] rollback_on_failure`
//! (`Run::rollback_on_failure`).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pluginsync_common::fsutil::write_atomic;
use pluginsync_common::generation::Manifest;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use serde::{Deserialize, Serialize};

use super::history::{self, History, Live};
use super::{Outcome, Run, SyncError, loads, new_report};
use crate::cache::{GenerationRecord, MountCache};
use crate::catalog::{self, FileResource};
use crate::commit::{Mirror, MirrorError, Standby, SwitchError};
use crate::load::LoadStatus;
use crate::lock;
use crate::plan::ChangeKind;
use crate::report::{Change, Report};
use crate::scan::LocalName;
use crate::settings::Settings;
use crate::signals::Interrupts;

/// The test hook that pauses a rollback for a minute before its second
/// exchange (`tests/e2e/agent_switch_rollback.rs`), nothing else.
const PAUSE_ENV: &str = "PLUGINSYNC_TEST_ROLLBACK_PAUSE";

/// A rollback could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    /// No tree was live before the current one.
    #[error("no previous generation to roll back to in {}; nothing was changed", dests(.0))]
    NoPrevious(Vec<PathBuf>),
    /// The tree live before the current one was no generation.
    #[error(
        "cannot roll back: the tree live before this one was no generation (synced from Puppet's listings, or committed with failures); nothing was changed"
    )]
    NotAGeneration,
    /// The previous generation's manifest is not kept.
    #[error(
        "cannot roll back to generation {0}: its manifest is not kept in the vardir; nothing was changed"
    )]
    NoManifest(String),
    /// No tree of a destination holds the previous generation's mount.
    #[error(
        "cannot roll back to generation {generation}: no tree of '{}' holds its {mount} (replaced since, or never kept); nothing was changed",
        crate::report::escape(&dest.display().to_string())
    )]
    NotKept {
        /// The destination.
        dest: PathBuf,
        /// Its mount.
        mount: Mount,
        /// The generation, short.
        generation: String,
    },
    /// A rollback cut short found a destination neither before nor after.
    #[error(
        "a rollback cut short cannot be finished: '{}' changed since; run sync",
        crate::report::escape(&.0.display().to_string())
    )]
    Diverged(PathBuf),
    /// The journal or the history could not be written.
    #[error("cannot record the rollback in '{}': {source}", path.display())]
    Record {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The standby trees.
    #[error(transparent)]
    Switch(#[from] SwitchError),
    /// Comparing the generations.
    #[error(transparent)]
    Compare(#[from] MirrorError),
}

fn dests(paths: &[PathBuf]) -> String {
    let quoted: Vec<String> = paths
        .iter()
        .map(|p| format!("'{}'", crate::report::escape(&p.display().to_string())))
        .collect();
    quoted.join(", ")
}

/// The journal of a rollback: its target and each exchange to make.
#[derive(Debug, Serialize, Deserialize)]
struct Intent {
    /// The tree the node rolls back to.
    target: Live,
    /// One per destination whose live tree changes.
    exchanges: Vec<Exchange>,
}

/// One destination's exchange.
#[derive(Debug, Serialize, Deserialize)]
struct Exchange {
    dest: PathBuf,
    mount: Mount,
    /// The kept tree to make live, by its name in the container.
    slot: String,
    /// Its (device, inode): live once the exchange is done.
    tree: (u64, u64),
}

impl Intent {
    fn path(vardir: &Path) -> PathBuf {
        vardir.join("rollback.json")
    }

    /// The journal a rollback cut short left, if any.
    fn pending(vardir: &Path) -> Option<Intent> {
        let bytes = std::fs::read(Self::path(vardir)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Written durably, before the first exchange.
    fn write(&self, vardir: &Path) -> Result<(), RollbackError> {
        let path = Self::path(vardir);
        let json = serde_json::to_vec(self).map_err(std::io::Error::from);
        json.and_then(|j| write_atomic(&path, &j, 0o600))
            .map_err(|source| RollbackError::Record { path, source })
    }
}

/// (device, inode) of the directory at `path`, if it is one.
fn inode(path: &Path) -> Option<(u64, u64)> {
    let m = std::fs::symlink_metadata(path).ok()?;
    m.is_dir().then(|| (m.dev(), m.ino()))
}

/// Where each destination finds the previous generation's mount: `None`
/// when its live tree holds it (it stays), else the kept tree's name.
fn find_trees(
    resources: &[FileResource],
    manifest: &Manifest,
    short: &str,
) -> Result<Vec<Option<String>>, RollbackError> {
    let mut found = Vec::new();
    for r in resources {
        if history::holds(&r.path, manifest, r) {
            found.push(None);
            continue;
        }
        let not_kept = || RollbackError::NotKept {
            dest: r.path.clone(),
            mount: r.mount,
            generation: short.to_owned(),
        };
        let standby = Standby::open(&r.path, false)?.ok_or_else(not_kept)?;
        let mut kept = standby.previous()?.into_iter().rev().map(|(_, name)| name);
        let slot = kept.find(|name| history::holds(&standby.path(name), manifest, r));
        found.push(Some(slot.ok_or_else(not_kept)?));
    }
    Ok(found)
}

/// Plans the rollback to the tree live before the current one and
/// reports what will change in `report`; returns the journal to carry
/// out and the files it brings back (for the loaders).
fn plan(
    settings: &Settings,
    report: &mut Report,
) -> Result<(Intent, Vec<(Mount, RelPath)>), RollbackError> {
    let resources = catalog::build(settings).resources;
    let history = History::load(&settings.vardir);
    let Some(target) = history.previous().cloned() else {
        let dests = resources.into_iter().map(|r| r.path).collect();
        return Err(RollbackError::NoPrevious(dests));
    };
    let id = target.id().ok_or(RollbackError::NotAGeneration)?;
    let (manifest, _) = History::manifest(&settings.vardir, &id)
        .ok_or_else(|| RollbackError::NoManifest(id.short()))?;
    let found = find_trees(&resources, &manifest, &id.short())?;
    let (mut exchanges, mut written) = (Vec::new(), Vec::new());
    for (r, slot) in resources.iter().zip(found) {
        let Some(slot) = slot else { continue };
        let gone = || RollbackError::Diverged(r.path.clone());
        let standby = Standby::open(&r.path, false)?.ok_or_else(gone)?;
        let tree = inode(&standby.path(&slot)).ok_or_else(gone)?;
        let skip = HashSet::new();
        let mut diff = Mirror::new(&r.path, &skip, false);
        diff.run(&standby.path(&slot), &r.path)?;
        written.extend(report_changes(report, &r.path, r.mount, diff.diffs));
        let (dest, mount) = (r.path.clone(), r.mount);
        exchanges.push(Exchange {
            dest,
            mount,
            slot,
            tree,
        });
    }
    Ok((Intent { target, exchanges }, written))
}

/// The changes of one destination in `report`; returns the regular
/// files brought back.
fn report_changes(
    report: &mut Report,
    dest: &Path,
    mount: Mount,
    diffs: Vec<(LocalName, ChangeKind)>,
) -> Vec<(Mount, RelPath)> {
    let mut written = Vec::new();
    for (name, kind) in diffs {
        // The destination itself is `<mount>/` (and `<dest>/`).
        let (rel, file) = match &name {
            LocalName::Rel(r) if r.is_root() => (String::new(), dest.join("")),
            _ => (name.to_string(), name.to_path(dest)),
        };
        report.changes.push(Change {
            path: format!("{mount}/{rel}"),
            action: kind,
            file: file.display().to_string(),
        });
        let brought = matches!(kind, ChangeKind::Created | ChangeKind::Updated);
        if let LocalName::Rel(rel) = name
            && brought
            && !rel.is_root()
            && std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_file())
        {
            written.push((mount, rel));
        }
    }
    written
}

/// Makes the journaled exchanges not done yet, retires the trees they
/// replaced, records the target as live (the history, the environment's
/// generation record) and removes the journal. What a kill cut short,
/// the next call finishes.
fn carry_out(settings: &Settings, intent: &Intent) -> Result<(), RollbackError> {
    let vardir = &settings.vardir;
    let pause = std::env::var_os(PAUSE_ENV).is_some_and(|v| v == "1");
    let mut exchanged = 0;
    for x in &intent.exchanges {
        if inode(&x.dest) == Some(x.tree) {
            continue; // done before a kill
        }
        let gone = || RollbackError::Diverged(x.dest.clone());
        let standby = Standby::open(&x.dest, false)?.ok_or_else(gone)?;
        if inode(&standby.path(&x.slot)) != Some(x.tree) {
            return Err(gone());
        }
        if pause && exchanged == 1 {
            tracing::info!("test hook: the rollback pauses between two exchanges");
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        standby.exchange(&x.slot)?;
        standby.sync()?;
        MountCache::clear(vardir, x.mount);
        exchanged += 1;
    }
    for x in &intent.exchanges {
        let Some(standby) = Standby::open(&x.dest, false)? else {
            continue;
        };
        // The tree rolled back from, now in the slot, becomes the newest
        // previous one: a second rollback goes forward again.
        if inode(&standby.path(&x.slot)).is_some_and(|t| t != x.tree) {
            standby.retire(&x.slot, usize::MAX)?;
        }
    }
    record_target(vardir, &intent.target)?;
    let path = Intent::path(vardir);
    std::fs::remove_file(&path).map_err(|source| RollbackError::Record { path, source })
}

/// The target made live: last in the history, and the generation its
/// environment's record holds (with its manifest, the base of the next
/// delta; no `ETag`, so the next run asks afresh).
fn record_target(vardir: &Path, target: &Live) -> Result<(), RollbackError> {
    let record = |source| RollbackError::Record {
        path: vardir.to_owned(),
        source,
    };
    History::push(vardir, target.clone(), || None).map_err(record)?;
    let Some(id) = target.id() else { return Ok(()) };
    let env = target.environment.as_str();
    let mut kept = GenerationRecord::load(vardir, env);
    kept.generation = Some(id);
    kept.assignment_etag = None;
    kept.listings_only = None;
    let bytes = History::manifest(vardir, &id).map(|(_, b)| b);
    kept.save(vardir, env, bytes.as_deref()).map_err(record)
}

/// The node rolled back (or a rollback cut short finished): the report
/// says so and names the generation now live. Returns the files brought
/// back, for the loaders (none for one cut short: its report said them).
fn roll_back_all(
    settings: &Settings,
    report: &mut Report,
) -> Result<Vec<(Mount, RelPath)>, RollbackError> {
    let vardir = &settings.vardir;
    let (intent, written) = match Intent::pending(vardir) {
        Some(intent) => (intent, Vec::new()),
        None => {
            let (intent, written) = plan(settings, report)?;
            intent.write(vardir)?;
            (intent, written)
        }
    };
    carry_out(settings, &intent)?;
    report.rolled_back = true;
    report.generation = intent.target.generation.clone();
    report.environment = intent.target.environment;
    Ok(written)
}

/// Under the run lock, before a sync: a rollback cut short is finished
/// first, so the sync plans against one generation whole.
pub(super) fn finish_cut(settings: &Settings) -> Result<(), RollbackError> {
    if let Some(intent) = Intent::pending(&settings.vardir) {
        tracing::warn!("finishing a rollback that was cut short");
        carry_out(settings, &intent)?;
    }
    Ok(())
}

/// `pluginsync-agent rollback`: under the run lock, after a Puppet run
/// holding its lock (as a sync's switch), the node rolled back to the
/// previous generation, reported, and the files brought back loaded.
pub async fn rollback(settings: &Settings, interrupts: &Interrupts) -> Outcome {
    let started = Instant::now();
    let mut report = new_report(settings);
    let error = async {
        let _lock = lock::acquire(&settings.vardir)?;
        let waited = tokio::select! {
            biased;
            signal = interrupts.wait() => return Err(SyncError::Interrupted { signal, committed: false }),
            waited = lock::wait_for_puppet(&settings.puppet_lock) => waited,
        };
        report.puppet_lock_waited_ms = match &waited {
            Ok(w) => w.map(|d| d.as_millis() as u64),
            Err(e) => Some(e.waited.as_millis() as u64),
        };
        waited?;
        let written = roll_back_all(settings, &mut report)?;
        report.applied = true;
        let env = report.environment.clone();
        let loads = loads::load_files(settings, &env, &written).await;
        report.loads.extend(loads);
        loads::write_fact(settings, &env);
        Ok(())
    }
    .await
    .err();
    report.duration_ms = started.elapsed().as_millis() as u64;
    report.error = error.as_ref().map(ToString::to_string);
    let nothing = matches!(error, Some(SyncError::Lock(lock::LockError::Busy { .. })));
    if !nothing && let Err(e) = report.save(&settings.vardir) {
        tracing::warn!(vardir = %settings.vardir.display(), error = %e, "cannot save the report");
    }
    Outcome {
        report,
        error,
        load_failures_are_errors: settings.load.failures_are_errors,
    }
}

impl Run<'_> {
    /// `[load] rollback_on_failure`: when a load of this run failed, after
    /// it switched a destination, the node goes back to the previous
    /// generation (both mounts), and the report says so (`rolled_back`). Their files are not loaded
    /// again: they were live before this run.
    pub(super) fn rollback_on_failure(&mut self, switched: &HashSet<Mount>) {
        let failed = self
            .report
            .loads
            .iter()
            .any(|l| l.status == LoadStatus::Failed);
        if !failed || switched.is_empty() {
            return;
        }
        match roll_back_all(self.settings, self.report) {
            Ok(_) => tracing::warn!(
                "a load failed: the previous generation is live again ([load] rollback_on_failure)"
            ),
            Err(e) => tracing::warn!(error = %e, "a load failed but the rollback did not happen"),
        }
    }
}
