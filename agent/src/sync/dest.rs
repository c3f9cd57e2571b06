//! One destination through a run: one value that moves through its
//! states, each transition consuming the state before it (so a
//! destination is never switched before its standby is on disk, nor
//! prepared before its downloads are verified):
//!
//! ```text
//! Scanning ─scanned→ Pass ─foresee→ Planned ─staged→ Staged ─prepare→ Preparing
//!   ─durable→ Ready ─learn_ahead→ Switching ─(Run::commit_one)→ committed
//! ```
//!
//! `Scanning` and `Pass` are `pass.rs` (phase 1); the run drives every
//! destination through one transition before the next (`sync.rs`, module
//! docs). The threads a state waits for (the scan, the standby record read
//! ahead, the standby's sync, the stat cache learned ahead) are held by
//! the state itself, never by the domain values it carries
//! (`commit::Prepared`, `stage::Staging`).

use pluginsync_common::fsutil::Durable;

use super::SyncError;
use super::pass::Pass;
use crate::cache;
use crate::commit::{self, Prepared, Syncing};
use crate::plan::{Action, Plan};
use crate::stage::{self, Staging};
use pluginsync_common::relpath::RelPath;
use std::collections::HashMap;

/// A destination planned, its standby record being read ahead
/// (`commit::foresee`) while the downloads run.
pub(super) struct Planned {
    pub(super) pass: Pass,
    foresight: Option<std::thread::JoinHandle<Option<commit::Foreseen>>>,
}

impl Pass {
    /// Reads ahead, on a thread when the pass changes something, what its
    /// `prepare` would read of its standby; a thread that cannot be had
    /// leaves it to `prepare`. `keep`: `[switch] keep_previous`.
    pub(super) fn foresee(self, keep: usize) -> Planned {
        let changes = !self.plan.actions.is_empty() && keep == 1;
        let foresight = changes
            .then(|| {
                let dest = self.resource.path.clone();
                let spawn = std::thread::Builder::new().name("foresee".into());
                spawn.spawn(move || commit::foresee(&dest, keep)).ok()
            })
            .flatten();
        Planned {
            pass: self,
            foresight,
        }
    }
}

impl Planned {
    /// Its downloads staged and verified (`None`: it writes no file).
    pub(super) fn staged(self, staging: Option<Staging>) -> Staged {
        Staged {
            pass: self.pass,
            foresight: self.foresight,
            staging,
        }
    }
}

/// A destination whose downloads are staged and verified.
pub(super) struct Staged {
    pub(super) pass: Pass,
    foresight: Option<std::thread::JoinHandle<Option<commit::Foreseen>>>,
    staging: Option<Staging>,
}

impl Staged {
    /// Its staged files sealed; when it changes something, its next
    /// generation complete beside the live tree (`commit::prepare`), the
    /// sealed files synced with it; else (or where it commits in place)
    /// its sealed files go into `in_place`, synced by the run before any
    /// rename (stage.rs, module docs). The live tree is untouched: an
    /// error here changes nothing.
    pub(super) fn prepare(
        self,
        keep: usize,
        in_place: &mut Durable,
    ) -> Result<Preparing, SyncError> {
        let Staged {
            pass: p,
            foresight,
            staging,
        } = self;
        let mut sealed = Durable::new();
        if let Some(s) = &staging {
            s.seal_into(&write_modes(&p.plan), &mut sealed)
                .map_err(SyncError::Download)?;
        }
        if p.plan.actions.is_empty() {
            return Ok(Preparing {
                pass: p,
                staging,
                syncing: None,
            });
        }
        let empty = std::collections::HashMap::new();
        let standby = commit::prepare(
            &p.resource.path,
            &p.plan,
            (&p.local, p.local_digest),
            commit::Staged {
                files: staging.as_ref().map_or(&empty, |s| &s.files),
                created: staging.as_ref().map_or(&[][..], |s| s.created()),
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
        Ok(Preparing {
            pass: p,
            staging,
            syncing: standby,
        })
    }
}

/// A destination prepared: its next generation being synced beside the
/// live tree (`None`: it commits in place, or changes nothing).
pub(super) struct Preparing {
    pub(super) pass: Pass,
    staging: Option<Staging>,
    syncing: Option<(Prepared, Syncing)>,
}

impl Preparing {
    /// Everything is written: what the early writeback of its staging has
    /// not written yet, the durability steps do.
    pub(super) fn stop_writeback(&self) {
        if let Some(s) = &self.staging {
            s.stop_writeback();
        }
    }

    /// Its standby on disk (synced while the next was prepared).
    pub(super) fn durable(self) -> Result<Ready, SyncError> {
        let standby = match self.syncing {
            Some((prepared, syncing)) => {
                syncing.wait().map_err(|source| SyncError::Prepare {
                    dest: self.pass.resource.path.clone(),
                    source,
                })?;
                Some(prepared)
            }
            None => None,
        };
        Ok(Ready {
            pass: self.pass,
            staging: self.staging,
            standby,
        })
    }
}

/// A destination ready for its switch (`standby`), or for its commit in
/// place.
pub(super) struct Ready {
    pub(super) pass: Pass,
    staging: Option<Staging>,
    standby: Option<Prepared>,
}

/// The stat cache of a destination after its commit
/// (`cache::learn`, saved only after a clean one).
pub(super) enum Learning<'s> {
    /// Learned on a thread of the run's scope while the switches run,
    /// from the standby's scan (the listing went with it).
    Ahead(std::thread::ScopedJoinHandle<'s, cache::Learned>),
    /// Learned after the commit, from the pass's scan and plan (when it
    /// has a listing).
    After,
    /// Not learned: another process wrote in the standby while it was
    /// prepared (`commit::Prepared::foreign`); the stat cache is cleared.
    Forget,
}

impl Ready {
    /// After a switch the live tree is the standby's, with its own
    /// inodes: its scan is the stat cache's, learned on a thread of
    /// `scope` while the switches run, saved after a clean one.
    pub(super) fn learn_ahead<'s>(
        mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        vardir: &'s std::path::Path,
    ) -> Switching<'s> {
        let p = &mut self.pass;
        if self.standby.as_ref().is_some_and(|s| s.foreign.is_some()) {
            return Switching {
                pass: self.pass,
                staging: self.staging,
                standby: self.standby,
                learning: Learning::Forget,
            };
        }
        let after = self.standby.as_mut().and_then(|s| s.after.take());
        let learning = match (after, p.remote.take()) {
            (Some((after, digest)), Some(remote)) => {
                let (dest, mount, stamp) =
                    (p.resource.path.clone(), p.resource.mount, p.stamp.clone());
                Learning::Ahead(scope.spawn(move || {
                    let plan = Plan::default();
                    cache::learn(
                        vardir,
                        mount,
                        &dest,
                        &stamp,
                        &remote,
                        &plan,
                        (&after, digest),
                    )
                }))
            }
            (_, remote) => {
                p.remote = remote;
                Learning::After
            }
        };
        Switching {
            pass: self.pass,
            staging: self.staging,
            standby: self.standby,
            learning,
        }
    }
}

/// A destination at its switch (`standby`; `None`: its commit in place),
/// its stat cache being learned.
pub(super) struct Switching<'s> {
    pub(super) pass: Pass,
    pub(super) staging: Option<Staging>,
    pub(super) standby: Option<Prepared>,
    pub(super) learning: Learning<'s>,
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
