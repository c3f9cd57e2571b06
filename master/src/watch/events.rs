//! What a burst of inotify events says (docs/internals.md#watch): the
//! environments each path belongs to, through the watched real
//! directories and the environmentpath entries, and whether it shows a
//! deploy in progress or done (docs/deploys.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use notify::EventKind;
use notify::event::{ModifyKind, RemoveKind, RenameMode};
use pluginsync_common::envname::EnvName;

/// r10k writes this file into an environment when its deploy is done.
const R10K_DEPLOY_INFO: &str = ".r10k-deploy.json";

/// Renames away at this depth or less (relative to the environment) are
/// directories of the module layout (`modules/<m>/lib`), not edited files.
const LAYOUT_DEPTH: usize = 3;

/// What a burst of events asks for.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Every environment (basemodulepath, an unplaceable event, a rescan).
    pub(super) all: bool,
    /// Environments touched.
    pub(super) envs: BTreeSet<EnvName>,
    /// Environments that show a deploy in progress.
    pub(super) deploying: BTreeSet<EnvName>,
    /// Environments whose deploy r10k reported done.
    pub(super) deployed: BTreeSet<EnvName>,
}

/// Where events come from: environments' real directories (the watched
/// paths) and the environmentpath entries.
#[derive(Debug, Default, Clone)]
pub(super) struct Roots {
    /// Real directory → the environments it is (usually one).
    pub(super) envs: BTreeMap<PathBuf, BTreeSet<EnvName>>,
    /// The environmentpath entries, as configured and resolved.
    pub(super) envpaths: Vec<PathBuf>,
}

/// What an event path belongs to.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// Inside these environments, at this path relative to their directory.
    Env(Vec<EnvName>, PathBuf),
    /// Under an environmentpath entry, but not a valid environment name.
    NotAnEnv,
    /// Anything else: every environment.
    Unknown,
}

impl Roots {
    fn place(&self, path: &Path) -> Place {
        // The deepest root wins (an environment inside another's tree).
        for (root, names) in self.envs.iter().rev() {
            if let Ok(rel) = path.strip_prefix(root) {
                return Place::Env(names.iter().cloned().collect(), rel.to_owned());
            }
        }
        for entry in &self.envpaths {
            if let Ok(rest) = path.strip_prefix(entry) {
                let Some(first) = rest.components().next() else {
                    return Place::Unknown;
                };
                return match first.as_os_str().to_str().and_then(|s| s.parse().ok()) {
                    Some(env) => Place::Env(vec![env], PathBuf::new()),
                    None => Place::NotAnEnv,
                };
            }
        }
        Place::Unknown
    }
}

pub(super) fn classify(ev: &notify::Result<notify::Event>, roots: &Roots, pending: &mut Pending) {
    let ev = match ev {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(error = %e, "watch error, rescanning everything");
            pending.all = true;
            return;
        }
    };
    if matches!(ev.kind, EventKind::Access(_)) {
        return;
    }
    if ev.need_rescan() {
        pending.all = true;
        return;
    }
    for (i, path) in ev.paths.iter().enumerate() {
        match roots.place(path) {
            Place::Env(envs, rel) => {
                let signal = signal(&ev.kind, i, &rel);
                for env in envs {
                    match signal {
                        Signal::Deploying => {
                            pending.deploying.insert(env.clone());
                        }
                        Signal::Deployed => {
                            pending.deployed.insert(env.clone());
                        }
                        Signal::Edit => {}
                    }
                    pending.envs.insert(env);
                }
            }
            Place::NotAnEnv => {}
            Place::Unknown => pending.all = true,
        }
    }
}

/// What one event path says about a deploy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Edit,
    Deploying,
    Deployed,
}

/// `kind` on the `index`-th path of an event, at `rel` inside an
/// environment (empty: the environment itself, seen from its
/// environmentpath entry).
fn signal(kind: &EventKind, index: usize, rel: &Path) -> Signal {
    let depth = rel.components().count();
    if rel.components().any(|c| c.as_os_str() == ".git") {
        return Signal::Deploying;
    }
    let renamed_away = matches!(kind, EventKind::Modify(ModifyKind::Name(RenameMode::From)))
        || (index == 0 && matches!(kind, EventKind::Modify(ModifyKind::Name(RenameMode::Both))));
    match kind {
        EventKind::Remove(RemoveKind::Folder) if depth > 0 => Signal::Deploying,
        _ if renamed_away && (1..=LAYOUT_DEPTH).contains(&depth) => Signal::Deploying,
        EventKind::Create(_) | EventKind::Modify(_)
            if depth == 1 && rel.as_os_str() == R10K_DEPLOY_INFO && !renamed_away =>
        {
            Signal::Deployed
        }
        _ => Signal::Edit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange};

    fn env(s: &str) -> EnvName {
        s.parse().unwrap()
    }

    #[test]
    fn events_map_to_environments_through_real_paths() {
        let mut roots = Roots {
            envpaths: vec![PathBuf::from("/envs")],
            ..Roots::default()
        };
        roots.envs.insert(
            PathBuf::from("/releases/3"),
            [env("production")].into_iter().collect(),
        );
        roots.envs.insert(
            PathBuf::from("/envs/dev"),
            [env("dev")].into_iter().collect(),
        );
        assert_eq!(
            roots.place(Path::new("/releases/3/modules/a/lib/x.rb")),
            Place::Env(vec![env("production")], PathBuf::from("modules/a/lib/x.rb"))
        );
        // The old target of a flipped link belongs to no environment.
        assert_eq!(
            roots.place(Path::new("/releases/2/modules/a")),
            Place::Unknown
        );
        assert_eq!(
            roots.place(Path::new("/envs/production")),
            Place::Env(vec![env("production")], PathBuf::new())
        );
        assert_eq!(roots.place(Path::new("/envs/not-an-env")), Place::NotAnEnv);
        assert_eq!(roots.place(Path::new("/envs")), Place::Unknown);
        assert_eq!(roots.place(Path::new("/base/mod/lib/x.rb")), Place::Unknown);
    }

    #[test]
    fn deploy_signals() {
        let rm_dir = EventKind::Remove(RemoveKind::Folder);
        let rm_file = EventKind::Remove(RemoveKind::File);
        let from = EventKind::Modify(ModifyKind::Name(RenameMode::From));
        let write = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let create = EventKind::Create(CreateKind::File);
        let p = Path::new;
        // A module directory removed or moved away: a deploy.
        assert_eq!(signal(&rm_dir, 0, p("modules/stdlib")), Signal::Deploying);
        assert_eq!(signal(&from, 0, p("modules/stdlib")), Signal::Deploying);
        assert_eq!(signal(&from, 0, p("modules/stdlib/lib")), Signal::Deploying);
        // git at work inside the environment: a deploy.
        assert_eq!(
            signal(&write, 0, p("modules/a/.git/index")),
            Signal::Deploying
        );
        // r10k's last word.
        assert_eq!(signal(&create, 0, p(".r10k-deploy.json")), Signal::Deployed);
        assert_eq!(signal(&write, 0, p(".r10k-deploy.json")), Signal::Deployed);
        // Ordinary edits, an editor's rename of a file, a flipped link.
        assert_eq!(signal(&rm_file, 0, p("modules/a/lib/x.rb")), Signal::Edit);
        assert_eq!(signal(&write, 0, p("modules/a/lib/x.rb")), Signal::Edit);
        assert_eq!(
            signal(&from, 0, p("modules/a/lib/facter/x.rb")),
            Signal::Edit
        );
        assert_eq!(signal(&from, 0, p("")), Signal::Edit);
        assert_eq!(signal(&rm_file, 0, p("")), Signal::Edit);
    }
}
