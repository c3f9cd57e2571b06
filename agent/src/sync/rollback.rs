//! Rolling back (docs/agent.md#generations-and-rollback): the newest
//! previous generation of each destination made live again by one
//! exchange (`commit::Standby`), offline — no master, no network. What
//! changed is listed before the switch by comparing the two trees
//! (`commit::Mirror`, listing only), reported as a sync's changes, and
//! the files it brings back go to the loaders. The cache of each mount
//! rolled back is forgotten, so the next `sync` plans against the tree
//! now live and converges back to the master's generation.
//!
//! Two ways in: `pluginsync-agent rollback` ([`rollback`]), and a sync
//! whose loads failed under `[load] rollback_on_failure`
//! (`Run::rollback_on_failure`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use super::{Outcome, Run, SyncError, loads, new_report};
use crate::cache::MountCache;
use crate::catalog;
use crate::commit::{Mirror, MirrorError, Standby, SwitchError};
use crate::load::LoadStatus;
use crate::lock;
use crate::plan::ChangeKind;
use crate::report::{Change, Report};
use crate::scan::LocalName;
use crate::settings::Settings;
use crate::signals::Interrupts;

/// A rollback could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    /// No destination has a previous generation.
    #[error("no previous generation to roll back to in {}; nothing was changed", dests(.0))]
    NoPrevious(Vec<PathBuf>),
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

/// Makes the newest previous generation of `dest` live; returns what
/// changed in the live tree (relative path, change), or `None` when there
/// is no previous generation (nothing changed).
pub fn rollback_dest(dest: &Path) -> Result<Option<Vec<(LocalName, ChangeKind)>>, RollbackError> {
    let Some(standby) = Standby::open(dest, false)? else {
        return Ok(None);
    };
    let Some((_, newest)) = standby.previous()?.pop() else {
        return Ok(None);
    };
    let skip = HashSet::new();
    let mut diff = Mirror::new(dest, &skip, false);
    diff.run(&standby.path(&newest), dest)?;
    standby.exchange(&newest)?;
    // The generation rolled back from is now the newest previous one: a
    // second rollback goes forward again.
    standby.retire(&newest, usize::MAX)?;
    Ok(Some(diff.diffs))
}

/// Rolls back every destination of `settings` that has a previous
/// generation; returns the files brought back (for the loaders).
fn roll_back_all(
    settings: &Settings,
    report: &mut Report,
    mounts: Option<&HashSet<Mount>>,
) -> Result<Vec<(Mount, RelPath)>, RollbackError> {
    let mut none = Vec::new();
    let mut written = Vec::new();
    for resource in catalog::build(settings).resources {
        let (dest, mount) = (&resource.path, resource.mount);
        if mounts.is_some_and(|m| !m.contains(&mount)) {
            continue;
        }
        let Some(diffs) = rollback_dest(dest)? else {
            none.push(dest.clone());
            continue;
        };
        MountCache::clear(&settings.vardir, mount);
        report.rolled_back = true;
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
    }
    if !report.rolled_back {
        return Err(RollbackError::NoPrevious(none));
    }
    Ok(written)
}

/// `pluginsync-agent rollback`: under the run lock, after a Puppet run
/// holding its lock (as a sync's switch), every destination with a
/// previous generation rolled back, reported, and its files loaded.
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
        let written = roll_back_all(settings, &mut report, None)?;
        report.applied = true;
        let loads = loads::load_files(settings, settings.environment.as_str(), &written).await;
        report.loads.extend(loads);
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
    /// `[load] rollback_on_failure`: when a load of this run failed, the
    /// destinations it switched go back to their previous generation, and
    /// the report says so (`rolled_back`). Their files are not loaded
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
        match roll_back_all(self.settings, self.report, Some(switched)) {
            Ok(_) => tracing::warn!(
                "a load failed: the previous generation is live again ([load] rollback_on_failure)"
            ),
            Err(e) => tracing::warn!(error = %e, "a load failed but the rollback did not happen"),
        }
    }
}
