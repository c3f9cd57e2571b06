//! Staging and committing one destination: its downloads staged and
//! verified (`stage.rs`), then, once every destination is prepared
//! (`Run::prepare_all`), its commit (`commit.rs`), reported and remembered
//! in the cache. `--noop` reports the plans instead.

use std::collections::HashMap;
use std::sync::Arc;

use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use super::dest::{Learning, Planned, Staged, Switching, write_modes};
use super::pass::Pass;
use super::{Run, SyncError};
use crate::cache::{self, MountCache};
use crate::catalog::FileResource;
use crate::cli::Format;
use crate::commit;
use crate::plan::{Action, ChangeKind};
use crate::progress::{self, Progress};
use crate::report::{Change, Failure, SwitchKind};
use crate::scan::LocalName;
use crate::servers::Source;
use crate::stage::{self, Staging};

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
    pub(super) async fn stage_all(&self, planned: Vec<Planned>) -> Result<Vec<Staged>, SyncError> {
        let mut staged = Vec::with_capacity(planned.len());
        // On a terminal, a text run shows its downloads as they go
        // (docs/agent.md#progress-on-a-terminal).
        let progress = Arc::new(Progress::default());
        let writes = planned.iter().map(|d| d.pass.plan.writes().count() as u64);
        progress.add_total(writes.sum());
        let _display = progress::Display::start(
            progress.clone(),
            progress::wanted(self.settings.format == Format::Text),
        );
        for d in planned {
            let p = &d.pass;
            let Some((mut staging, writes)) = begin_staging(p, self.settings.switch.keep_previous)?
            else {
                staged.push(d.staged(None));
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
            staged.push(d.staged(Some(staging)));
        }
        // Sealed by `prepare_all` (stage.rs, module docs).
        Ok(staged)
    }

    /// One destination of [`Run::commit_all`]: switched or committed in
    /// place (durable before this returns, so before the cache and the
    /// report claim it), reported, remembered; its files written go to
    /// `written`.
    pub(super) fn commit_one<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        d: Switching<'s>,
        written: &mut Vec<(Mount, RelPath)>,
    ) where
        'a: 's,
    {
        let settings = self.settings;
        let vardir = &settings.vardir;
        let Switching {
            pass: p,
            staging,
            standby,
            learning,
        } = d;
        let mount = p.resource.mount;
        let done = match standby {
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
                commit::commit(&p.resource.path, &p.plan, staged, created, &p.resource)
            }
        };
        for (name, kind) in done.changes {
            self.report.changes.push(change(&p.resource, &name, kind));
        }
        self.phase("renamed");
        if !done.failures.is_empty() {
            MountCache::clear(vardir, mount);
        } else {
            match learning {
                Learning::Ahead(learned) => {
                    scope.spawn(move || match learned.join() {
                        Ok(learned) => learned.save_logged(vardir, mount, &p.stamp),
                        Err(_) => MountCache::clear(vardir, mount),
                    });
                }
                Learning::After if p.remote.is_some() => {
                    scope.spawn(move || {
                        let Some(remote) = &p.remote else { return };
                        let (dest, before) = (&p.resource.path, (&p.local, p.local_digest));
                        cache::learn(vardir, mount, dest, &p.stamp, remote, &p.plan, before)
                            .save_logged(vardir, mount, &p.stamp)
                    });
                }
                Learning::After => {}
                Learning::Forget => MountCache::clear(vardir, mount),
            }
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
