//! Phases 2 and 3 of a run: every download of every pass staged and
//! verified (`stage.rs`), then, only once all are, each pass committed
//! (`commit.rs`), reported and remembered in the cache. `--noop` reports
//! the plans instead.

use std::collections::HashMap;
use std::sync::Arc;

use pluginsync_common::digest::Sha256;
use pluginsync_common::fsutil::Durable;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use super::pass::Pass;
use super::{Run, SyncError};
use crate::cache::{self, MountCache};
use crate::catalog::FileResource;
use crate::cli::Format;
use crate::commit::{self, Prepared};
use crate::plan::{Action, ChangeKind, Plan};
use crate::progress::{self, Progress};
use crate::report::{Change, Failure, SwitchKind};
use crate::scan::LocalName;
use crate::servers::Source;
use crate::stage::{self, Staging};

/// A pass's standby record, being read ahead ([`foresee`]).
pub(super) type Foresight = std::thread::JoinHandle<Option<commit::Foreseen>>;

/// Reads ahead, on a thread per pass that changes something, what its
/// `prepare` would read of its standby (`commit::foresee`), while the
/// downloads run; a thread that cannot be had leaves it to `prepare`.
pub(super) fn foresee(passes: &[Pass], keep: usize) -> Vec<Option<Foresight>> {
    passes
        .iter()
        .map(|p| {
            let dest = p.resource.path.clone();
            let spawn = std::thread::Builder::new().name("foresee".into());
            let changes = !p.plan.actions.is_empty() && keep == 1;
            changes
                .then(|| spawn.spawn(move || commit::foresee(&dest, keep)).ok())
                .flatten()
        })
        .collect()
}

impl<'a> Run<'a> {
    /// `--noop`: the plans, reported as changes.
    pub(super) fn report_plans(&mut self, passes: &[Pass]) {
        for p in passes {
            for (name, kind) in p.plan.actions.iter().filter_map(|a| a.change()) {
                self.report.changes.push(change(&p.resource, &name, kind));
            }
        }
    }

    /// stage + verify: every download of every resource, before anything
    /// changes. On an error the stagings so far are dropped, which removes
    /// them.
    pub(super) async fn stage_all(
        &self,
        passes: &[Pass],
    ) -> Result<Vec<Option<Staging>>, SyncError> {
        let mut stagings = Vec::with_capacity(passes.len());
        // On a terminal, a text run shows its downloads as they go
        // (docs/agent.md#progress-on-a-terminal).
        let progress = Arc::new(Progress::default());
        progress.add_total(passes.iter().map(|p| p.plan.writes().count() as u64).sum());
        let _display = progress::Display::start(
            progress.clone(),
            progress::wanted(self.settings.format == Format::Text),
        );
        for p in passes {
            let Some((mut staging, writes)) = begin_staging(p, self.settings.switch.keep_previous)?
            else {
                stagings.push(None);
                continue;
            };
            staging.writeback = stage::Writeback::start(&staging, writes.len());
            staging.modes = write_modes(&p.plan)
                .into_iter()
                .map(|(rel, mode)| (rel.clone(), mode))
                .collect();
            let src = Source {
                origin: &p.origin,
                mount: p.resource.mount,
                env: &self.env,
                query: &p.query,
                etag: p.stamp.etag.as_ref(),
                by_digest: p.by_digest,
            };
            staging
                .download_all(
                    &self.servers,
                    &src,
                    writes,
                    self.settings.parallel_downloads,
                    &progress,
                )
                .await
                .map_err(SyncError::Download)?;
            staging.wait_premade();
            stagings.push(Some(staging));
        }
        // Sealed by `prepare_all` (stage.rs, module docs).
        Ok(stagings)
    }

    /// prepare: each pass that changes something gets its next generation
    /// complete and durable beside the live tree (`commit::prepare`), its
    /// staged files sealed and synced with it; `None` where it commits in
    /// place, its staged files then synced here, before any rename
    /// (stage.rs, module docs). The live trees are untouched: an error here
    /// changes nothing.
    pub(super) fn prepare_all(
        &self,
        passes: &[Pass],
        stagings: &[Option<Staging>],
        foresight: Vec<Option<Foresight>>,
    ) -> Result<Vec<Option<Prepared>>, SyncError> {
        let keep = self.settings.switch.keep_previous;
        let empty = HashMap::new();
        let mut in_place = Durable::new();
        let mut prepared = Vec::with_capacity(passes.len());
        for ((p, staging), foresight) in passes.iter().zip(stagings).zip(foresight) {
            let mut sealed = Durable::new();
            if let Some(s) = staging {
                s.seal_into(&write_modes(&p.plan), &mut sealed)
                    .map_err(SyncError::Download)?;
            }
            if p.plan.actions.is_empty() {
                prepared.push(None);
                continue;
            }
            let staged = staging.as_ref().map_or(&empty, |s| &s.files);
            let created = staging.as_ref().map_or(&[][..], |s| s.created());
            let standby = commit::prepare(
                &p.resource.path,
                &p.plan,
                (&p.local, p.local_digest),
                commit::Staged {
                    files: staged,
                    created,
                    sealed: &mut sealed,
                    in_standby: staging.as_ref().is_some_and(|s| s.in_standby),
                    foreseen: foresight.and_then(|f| f.join().ok().flatten()),
                    premade: staging.as_ref().map(Staging::premade),
                },
                &p.resource,
                keep,
            )
            .map_err(|source| SyncError::Prepare {
                dest: p.resource.path.clone(),
                source,
            })?;
            // What the standby did not take is synced before the commit.
            in_place.absorb(sealed).map_err(|source| {
                SyncError::Download(stage::StageError::Sync {
                    path: p.resource.path.clone(),
                    source,
                })
            })?;
            prepared.push(standby);
        }
        // Everything is written: what the early writeback has not written
        // yet, the durability steps do.
        for s in stagings.iter().flatten() {
            s.stop_writeback();
        }
        stage::sync_sealed(in_place).map_err(SyncError::Download)?;
        // Each standby on disk (synced while the next was prepared).
        for (p, standby) in passes.iter().zip(prepared.iter_mut()) {
            if let Some(standby) = standby {
                standby.durable().map_err(|source| SyncError::Prepare {
                    dest: p.resource.path.clone(),
                    source,
                })?;
            }
        }
        self.phase("prepared");
        Ok(prepared)
    }

    /// switch (or commit in place) → report: each resource in catalog
    /// order, its changes and failures reported; the cache remembers a
    /// clean commit (written on a thread of `scope`, while the next
    /// resource switches and the run's record is written) and forgets a
    /// failed one. Returns the files written, for the loaders.
    pub(super) fn commit_all<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        passes: &'s [Pass],
        stagings: Vec<Option<Staging>>,
        mut prepared: Vec<Option<Prepared>>,
    ) -> Vec<(Mount, RelPath)>
    where
        'a: 's,
    {
        let settings = self.settings;
        let vardir = &settings.vardir;
        self.report.applied = true;
        let mut written = Vec::new();
        let learned = learn_all(scope, passes, &mut prepared, vardir);
        let all = passes.iter().zip(stagings).zip(prepared).zip(learned);
        for (((p, staging), prepared), learned) in all {
            let (dest, mount) = (&p.resource.path, p.resource.mount);
            // Durable before it returns, so before the cache and the
            // report below claim it.
            let done = match prepared {
                Some(mut prepared) => {
                    match commit::switch(&mut prepared, settings.switch.keep_previous) {
                        Ok(retired) => {
                            self.note_switch(SwitchKind::Exchange);
                            self.switched.insert(mount);
                            if let Some(retired) = retired {
                                scope.spawn(move || retired.record());
                            }
                            prepared.committed
                        }
                        Err(e) => {
                            let mut failed = commit::Committed::default();
                            failed.failures.push((None, commit::CommitError::Switch(e)));
                            failed
                        }
                    }
                }
                None => {
                    let empty = HashMap::new();
                    let staged = staging.as_ref().map_or(&empty, |s| &s.files);
                    let created = staging.as_ref().map_or(&[][..], |s| s.created());
                    if !p.plan.actions.is_empty() {
                        self.note_switch(SwitchKind::InPlace);
                    }
                    commit::commit(dest, &p.plan, staged, created, &p.resource)
                }
            };
            for (name, kind) in done.changes {
                self.report.changes.push(change(&p.resource, &name, kind));
            }
            self.phase("renamed");
            if done.failures.is_empty() {
                if let Some(remote) = &p.remote {
                    scope.spawn(move || match learned.map(|l| l.join()) {
                        Some(Ok(learned)) => learned.save_logged(vardir, mount, &p.stamp),
                        Some(Err(_)) => MountCache::clear(vardir, mount),
                        None => {
                            let before = (&p.local, p.local_digest);
                            cache::learn(vardir, mount, dest, &p.stamp, remote, &p.plan, before)
                                .save_logged(vardir, mount, &p.stamp)
                        }
                    });
                }
            } else {
                MountCache::clear(vardir, mount);
            }
            for (name, error) in done.failures {
                // The destination itself is `<mount>/`.
                let rel = name.map(|n| n.to_string()).unwrap_or_default();
                self.report.failures.push(Failure {
                    path: format!("{mount}/{rel}"),
                    error: error.to_string(),
                });
            }
            if let Some(s) = staging {
                s.finish();
            }
            written.extend(done.written.into_iter().map(|rel| (mount, rel)));
        }
        written
    }
}

/// After a switch the live tree is the standby's, with its own inodes:
/// its scan is the stat cache's, learned on threads of `scope` while the
/// switches run (`cache::learn`), saved after each one that succeeds.
fn learn_all<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    passes: &'s [Pass],
    prepared: &mut [Option<Prepared>],
    vardir: &'s std::path::Path,
) -> Vec<Option<std::thread::ScopedJoinHandle<'s, cache::Learned>>> {
    (passes.iter().zip(prepared.iter_mut()))
        .map(|(p, prepared)| {
            let remote = p.remote.as_ref()?;
            let (after, digest) = prepared.as_mut()?.after.take()?;
            let (dest, stamp, mount) = (&p.resource.path, &p.stamp, p.resource.mount);
            let plan = Plan::default();
            let learn =
                move || cache::learn(vardir, mount, dest, stamp, remote, &plan, (&after, digest));
            Some(scope.spawn(learn))
        })
        .collect()
}

impl Run<'_> {
    /// Records how a destination's changes became live: the report says
    /// `in-place` when any did so.
    fn note_switch(&mut self, kind: SwitchKind) {
        if self.report.switch != Some(SwitchKind::InPlace) {
            self.report.switch = Some(kind);
        }
    }
}

/// Relative path → planned mode, for every file `plan` writes.
pub(super) fn write_modes(plan: &Plan) -> HashMap<&RelPath, u32> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Write { rel, mode, .. } => Some((rel, *mode)),
            _ => None,
        })
        .collect()
}

/// The report's line for a change of `name` in `resource`.
fn change(resource: &FileResource, name: &LocalName, action: ChangeKind) -> Change {
    Change {
        path: format!("{}/{name}", resource.mount),
        action,
        file: name.to_path(&resource.path).display().to_string(),
    }
}

/// A pass's files to write: where, and the content's digest.
pub(super) type Writes = Vec<(RelPath, Sha256)>;

/// The staging directory of a pass that writes files, with its writes; a
/// pass that writes none gets `None`, and a staging directory an earlier
/// run left there is removed (stage.rs, module docs). A first sync
/// stages into its standby instead (`commit::fresh_standby`; `keep`:
/// `[switch] keep_previous`). Shared by network runs and `--from-bundle`
/// runs, which differ only in where content comes from.
pub(super) fn begin_staging(p: &Pass, keep: usize) -> Result<Option<(Staging, Writes)>, SyncError> {
    let dest = &p.resource.path;
    let writes: Writes = p.plan.writes().map(|(r, d)| (r.clone(), *d)).collect();
    if writes.is_empty() {
        if let Err(e) = stage::clean_stale(dest) {
            tracing::warn!(dest = %dest.display(), error = %e, "cannot remove a stale staging directory");
        }
        return Ok(None);
    }
    let failed = |source| SyncError::Staging {
        dest: dest.clone(),
        source,
    };
    let mut staging = Staging::prepare(dest).map_err(failed)?;
    if let Some(slot) = commit::fresh_standby(dest, &p.local, keep) {
        tracing::debug!(dest = %dest.display(), "a first sync: downloads go straight into the standby");
        let dirs = p.plan.actions.iter().filter_map(|a| match a {
            Action::Mkdir { rel, mode, .. } => Some((rel.clone(), *mode)),
            _ => None,
        });
        let premaking = commit::premake(slot.clone(), dirs.collect());
        staging.fill_standby(slot, premaking).map_err(failed)?;
    }
    Ok(Some((staging, writes)))
}
