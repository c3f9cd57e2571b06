//! Loading changed plugins, each in isolation.
//!
//! After a commit, every created or updated file under the libdir goes to
//! the first `[[loader]]` whose `match` glob fits its relative path. Nothing
//! runs unless loading is enabled (`[load] enabled` or `--load`). Each
//! launch is a child process in its own process group with a deadline: at
//! the deadline the whole group is killed, so a hanging loader takes its
//! children with it. A loader that fails, hangs, crashes or lies is one
//! `failed` entry in the report and one line on stderr; the next file loads
//! all the same (Puppet stops at the first failing file; Celerity and
//! kustomize fail the run).
//!
//! `kind = "describe"` registers executable plugins in one of four layouts
//! (Packer, Terraform, Celerity, kustomize; docs/loading.md#plugin-layouts):
//! `describe.rs`. Which loader a file goes to is the compiled table of
//! `loaders.rs`; launching children is `launch.rs`'s.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use serde::{Deserialize, Serialize};

use crate::describe::{Candidate, DescribeError, describe};
use crate::launch::{AttemptsError, run_attempts, run_isolated};
use crate::loaders::{LoadConfig, LoaderConfig, LoaderKind, LoaderTable};
use crate::plugins::Registry;

pub use crate::launch::{SUPERVISE, supervised, use_supervisor};

/// How a load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadStatus {
    /// Loaded.
    Ok,
    /// Tried and failed.
    Failed,
    /// Not tried (no loader, loading disabled, a checksum sidecar).
    Skipped,
}

/// One file's load, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadEntry {
    /// `plugins/<relative path>`, or `after_load`.
    pub path: String,
    /// The loader's name, if one matched.
    pub loader: Option<String>,
    /// What happened.
    pub status: LoadStatus,
    /// Why it failed or was skipped.
    pub error: Option<String>,
    /// Wall time.
    pub duration_ms: u64,
}

/// Why a load failed: the line its entry reports.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A `command` loader failed (every attempt).
    #[error(transparent)]
    Command(#[from] AttemptsError),
    /// A `describe` load refused the file.
    #[error(transparent)]
    Describe(#[from] DescribeError),
}

/// The loaders of one run: the compiled table, `[load]`, and the
/// environment the children are told.
pub struct Loaders<'a> {
    table: &'a LoaderTable,
    config: &'a LoadConfig,
    environment: &'a str,
}

impl<'a> Loaders<'a> {
    /// The loaders of `table` with `[load]`'s `config`, for a run of
    /// `environment`.
    pub fn new(table: &'a LoaderTable, config: &'a LoadConfig, environment: &'a str) -> Self {
        Loaders {
            table,
            config,
            environment,
        }
    }

    /// True if a file of `mount` goes to the loaders
    /// ([`LoaderTable::serves`]).
    pub fn serves(&self, mount: Mount) -> bool {
        self.table.serves(mount)
    }

    /// Loads the files in `changed` (the files a commit wrote) of the
    /// mounts the loaders serve ([`Loaders::serves`]; the others are not
    /// loaded), found under `libdir` or `factsdir`, in order, each
    /// isolated; a file goes to the first loader of its mount whose glob
    /// matches. Registers accepted describe plugins; runs `after_load` if
    /// anything loaded. `enabled` is `[load] enabled` or `--load`.
    pub async fn load(
        &self,
        libdir: &Path,
        factsdir: Option<&Path>,
        changed: &[(Mount, RelPath)],
        enabled: bool,
        registry: &mut Registry,
    ) -> Vec<LoadEntry> {
        let mut out = Vec::new();
        if enabled && !changed.is_empty() {
            self.warn_shell_interpolation();
        }
        for (mount, rel) in changed {
            if !self.serves(*mount) {
                continue;
            }
            let root = match mount {
                Mount::Plugins => libdir,
                Mount::Pluginfacts => match factsdir {
                    Some(f) => f,
                    None => continue,
                },
            };
            self.load_one(*mount, root, rel, enabled, registry, &mut out)
                .await;
        }
        if enabled
            && !self.config.after_load.is_empty()
            && out.iter().any(|e| e.status == LoadStatus::Ok)
        {
            out.push(self.after_load().await);
        }
        out
    }

    /// One warning per loader that puts a file name inside a shell script
    /// (docs/loading.md#never-put-path-in-a-shell-script): a module file
    /// named `$(…)` would run as root.
    fn warn_shell_interpolation(&self) {
        for (loader, placeholder) in self.table.shell_interpolations() {
            tracing::warn!(
                loader,
                "loader puts {placeholder} inside a shell script: a file named $(…) would run as root; pass it as an argument after the script (docs/loading.md#never-put-path-in-a-shell-script)"
            );
        }
    }

    /// Loads `rel` of `mount` (under `root`) with the first loader that
    /// matches it, and adds its entry to `out` (and those of the plugins a
    /// Celerity ID clash took out).
    async fn load_one(
        &self,
        mount: Mount,
        root: &Path,
        rel: &RelPath,
        enabled: bool,
        registry: &mut Registry,
        out: &mut Vec<LoadEntry>,
    ) {
        let path = format!("{mount}/{rel}");
        let abs = rel.to_path(root);
        let started = Instant::now();
        let Some(loader) = self.table.find(mount, rel) else {
            out.push(skipped(path, None, "not loaded (no loader)"));
            return;
        };
        let name = loader.label().to_owned();
        if !enabled {
            out.push(skipped(path, Some(name), "not loaded (loading disabled)"));
            return;
        }
        let env = self.child_env(loader, mount, rel, &abs);
        let result = match loader.kind {
            LoaderKind::Command => self.command(loader, root, rel, &abs, &env).await,
            LoaderKind::Describe => {
                if rel.as_str().ends_with("_SHA256SUM") {
                    out.push(skipped(
                        path,
                        Some(name),
                        "checksum sidecar, checked with its plugin",
                    ));
                    return;
                }
                let file = Candidate {
                    loader,
                    root,
                    rel,
                    abs: &abs,
                    prefix: &self.config.plugin_prefix,
                    env: &env,
                };
                let mut evicted = Vec::new();
                let result = describe(&file, self.table, registry, &mut evicted).await;
                for gone in evicted {
                    evict(out, mount, root, &gone, &name);
                }
                match result {
                    Ok(Some(why)) => {
                        out.push(skipped(path, Some(name), &why));
                        return;
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(LoadError::from(e)),
                }
            }
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(()) => tracing::info!(file = %path, loader = %name, "loaded"),
            Err(e) => tracing::debug!(file = %path, loader = %name, error = %e, "load failed"),
        }
        out.push(LoadEntry {
            path,
            loader: Some(name),
            status: if result.is_ok() {
                LoadStatus::Ok
            } else {
                LoadStatus::Failed
            },
            error: result.err().map(|e| e.to_string()),
            duration_ms,
        });
    }

    /// `after_load`, once, with its deadline.
    async fn after_load(&self) -> LoadEntry {
        let started = Instant::now();
        let env = BTreeMap::from([(
            "PLUGINSYNC_ENVIRONMENT".to_owned(),
            self.environment.to_owned(),
        )]);
        let result = run_isolated(
            &self.config.after_load,
            &env,
            None,
            self.config.after_load_timeout,
        )
        .await;
        LoadEntry {
            path: "after_load".into(),
            loader: None,
            status: if result.is_ok() {
                LoadStatus::Ok
            } else {
                LoadStatus::Failed
            },
            error: result.err().map(|e| e.to_string()),
            duration_ms: started.elapsed().as_millis() as u64,
        }
    }

    /// The variables the agent sets for a child loading `rel` of `mount`
    /// (over the loader's `env`): `PLUGINSYNC_ENVIRONMENT`,
    /// `PLUGINSYNC_MOUNT`, `PLUGINSYNC_PATH` and `PLUGINSYNC_RELPATH`.
    fn child_env(
        &self,
        loader: &LoaderConfig,
        mount: Mount,
        rel: &RelPath,
        abs: &Path,
    ) -> BTreeMap<String, String> {
        let mut env = loader.env.clone();
        env.insert("PLUGINSYNC_ENVIRONMENT".into(), self.environment.to_owned());
        env.insert("PLUGINSYNC_MOUNT".into(), mount.to_string());
        env.insert("PLUGINSYNC_PATH".into(), abs.to_string_lossy().into_owned());
        env.insert("PLUGINSYNC_RELPATH".into(), rel.as_str().to_owned());
        env
    }

    /// A `command` load: the placeholders substituted in one pass
    /// ([`substitute`]), run in the destination directory, up to
    /// `attempts` launches.
    async fn command(
        &self,
        loader: &LoaderConfig,
        root: &Path,
        rel: &RelPath,
        abs: &Path,
        env: &BTreeMap<String, String>,
    ) -> Result<(), LoadError> {
        // A relative path that begins with '-' would be read as an option
        // by most programs; `./-x` names the same file (the loader runs in
        // the destination directory) and cannot be.
        let relpath = if rel.as_str().starts_with('-') {
            format!("./{}", rel.as_str())
        } else {
            rel.as_str().to_owned()
        };
        let path = abs.to_string_lossy();
        let values = [
            ("path", path.as_ref()),
            ("relpath", relpath.as_str()),
            ("environment", self.environment),
        ];
        let argv: Vec<String> = loader
            .command
            .iter()
            .map(|a| substitute(a, &values))
            .collect();
        run_attempts(&argv, env, Some(root), loader.timeout, loader.attempts()).await?;
        Ok(())
    }
}

/// A Celerity plugin whose ID clash took it out of the registry: its entry
/// of this run turns failed, or a failed entry is added for it.
fn evict(out: &mut Vec<LoadEntry>, mount: Mount, root: &Path, gone: &str, loader: &str) {
    let rel = Path::new(gone)
        .strip_prefix(root)
        .unwrap_or(Path::new(gone));
    let path = format!("{mount}/{}", rel.display());
    let error = Some(
        "plugin ID is both a provider and a transformer (IDs are unique across both)".to_owned(),
    );
    match out.iter_mut().find(|e| e.path == path) {
        Some(e) => {
            e.status = LoadStatus::Failed;
            e.error = error;
        }
        None => out.push(LoadEntry {
            path,
            loader: Some(loader.to_owned()),
            status: LoadStatus::Failed,
            error,
            duration_ms: 0,
        }),
    }
}

/// Replaces `{name}` placeholders of `values` in `template` in one pass:
/// a value is never searched again, so a file named `x{environment}.rb`
/// stays `x{environment}.rb`. Unknown `{…}` are left as they are.
pub fn substitute(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match values.iter().find(|(k, _)| {
            after
                .strip_prefix(k)
                .is_some_and(|tail| tail.starts_with('}'))
        }) {
            Some((k, v)) => {
                out.push_str(v);
                rest = &after[k.len() + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn skipped(path: String, loader: Option<String>, why: &str) -> LoadEntry {
    LoadEntry {
        path,
        loader,
        status: LoadStatus::Skipped,
        error: Some(why.to_owned()),
        duration_ms: 0,
    }
}

/// The files a run is about to commit and will have to load
/// (`<vardir>/pending_loads.json`): written before the commit, removed
/// once the loads ran. A run that finds it loads them (docs/loading.md#a-killed-run-still-loads:
/// a run killed between its commit and its loads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLoads {
    /// `(mount, relative path)` of each file, in commit order.
    pub files: Vec<(Mount, String)>,
}

impl PendingLoads {
    const FILE: &'static str = "pending_loads.json";

    /// Records `files` durably (`write_atomic`, with `fsync`), before the
    /// commit: a kill needs no `fsync` (the page cache outlives the
    /// process), but a crash after the commit is durable must still find
    /// the record, or those files would never be loaded. Written only when
    /// the run writes files and loaders are configured, never by a run that
    /// changes nothing; [`PendingLoads::clear`] removes it without a sync
    /// (a removal lost in a crash loads those files once more).
    pub fn record(vardir: &Path, files: &[(Mount, RelPath)]) -> std::io::Result<()> {
        let pending = PendingLoads {
            files: files
                .iter()
                .map(|(m, r)| (*m, r.as_str().to_owned()))
                .collect(),
        };
        std::fs::create_dir_all(vardir)?;
        pluginsync_common::fsutil::write_atomic(
            &vardir.join(Self::FILE),
            &serde_json::to_vec(&pending)?,
            0o600,
        )
    }

    /// The record a previous run left, if any (a corrupt one is reported
    /// and treated as none).
    pub fn take(vardir: &Path) -> Option<Vec<(Mount, RelPath)>> {
        let path = vardir.join(Self::FILE);
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<PendingLoads>(&text) {
            Ok(p) => Some(
                p.files
                    .into_iter()
                    .filter_map(|(m, r)| Some((m, RelPath::parse(&r).ok()?)))
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "pending loads unreadable, ignored");
                Some(Vec::new())
            }
        }
    }

    /// Removes the record.
    pub fn clear(vardir: &Path) {
        match std::fs::remove_file(vardir.join(Self::FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(vardir = %vardir.display(), error = %e, "cannot remove the pending loads record")
            }
        }
    }
}

/// What the loads did, as the master is told (docs/protocol.md §7.8):
/// `<vardir>/loads.<environment>.json`, updated after each run that
/// loaded anything. A plugin that failed stays failed until it loads or
/// its file leaves the tree ([`LoadState::report`] leaves out a failed
/// file that is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadState {
    /// Loads that succeeded in the last run that loaded anything.
    pub loads_ok: u32,
    /// Failing plugins: `<mount>/<relative path>` (or `after_load`).
    pub failed: std::collections::BTreeSet<String>,
}

impl LoadState {
    fn path(vardir: &Path, env: &str) -> std::path::PathBuf {
        vardir.join(format!("loads.{env}.json"))
    }

    /// The state for `env`; anything unreadable is an empty one.
    pub fn load(vardir: &Path, env: &str) -> LoadState {
        std::fs::read(Self::path(vardir, env))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Folds in one run's loads: a success clears that plugin's failure, a
    /// failure is added; skipped loads change nothing.
    pub fn update(&mut self, loads: &[LoadEntry]) {
        let mut ok = 0;
        for entry in loads {
            match entry.status {
                LoadStatus::Ok => {
                    ok += 1;
                    self.failed.remove(&entry.path);
                }
                LoadStatus::Failed => {
                    self.failed.insert(entry.path.clone());
                }
                LoadStatus::Skipped => {}
            }
        }
        if loads.iter().any(|e| e.status != LoadStatus::Skipped) {
            self.loads_ok = ok;
        }
    }

    /// Writes the state (atomically; a hint: a lost one reports nothing).
    pub fn save(&self, vardir: &Path, env: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(vardir)?;
        let json = serde_json::to_vec(self)?;
        pluginsync_common::fsutil::replace_atomic(&Self::path(vardir, env), &json, 0o600)
    }

    /// The node report of `generation` with these loads, leaving out a
    /// failed plugin whose file `exists` says is gone (it left the tree).
    pub fn report(
        &self,
        generation: Option<pluginsync_common::generation::GenerationId>,
        exists: impl Fn(&str) -> bool,
    ) -> pluginsync_common::rollout::NodeReport {
        let failed: Vec<String> = self.failed.iter().filter(|p| exists(p)).cloned().collect();
        pluginsync_common::rollout::NodeReport {
            generation,
            loads_ok: self.loads_ok,
            loads_failed: failed.len() as u32,
            failed,
        }
        .bounded()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_stays_reported_until_it_loads_or_leaves_the_tree() {
        let entry = |path: &str, status| LoadEntry {
            path: path.into(),
            loader: None,
            status,
            error: None,
            duration_ms: 0,
        };
        let dir = tempfile::tempdir().unwrap();
        let mut state = LoadState::load(dir.path(), "production");
        state.update(&[
            entry("plugins/a.rb", LoadStatus::Failed),
            entry("plugins/b.rb", LoadStatus::Failed),
            entry("plugins/c.rb", LoadStatus::Ok),
        ]);
        state.save(dir.path(), "production").unwrap();
        // A run that loaded nothing changes nothing.
        let mut again = LoadState::load(dir.path(), "production");
        again.update(&[entry("plugins/d.rb", LoadStatus::Skipped)]);
        assert_eq!(again, state);
        let r = again.report(None, |_| true);
        assert_eq!((r.loads_ok, r.loads_failed), (1, 2));
        assert_eq!(r.failed, ["plugins/a.rb", "plugins/b.rb"]);
        // a.rb loads now; b.rb left the tree.
        again.update(&[entry("plugins/a.rb", LoadStatus::Ok)]);
        let r = again.report(None, |p| p != "plugins/b.rb");
        assert_eq!((r.loads_ok, r.loads_failed), (1, 0));
        assert!(LoadState::load(dir.path(), "staging").failed.is_empty());
    }

    #[test]
    fn placeholders_are_substituted_in_one_pass() {
        let values = [
            ("path", "/lib/x{environment}.rb"),
            ("relpath", "x{environment}.rb"),
            ("environment", "production"),
        ];
        assert_eq!(
            substitute("{path} {relpath} {environment}", &values),
            "/lib/x{environment}.rb x{environment}.rb production"
        );
        assert_eq!(
            substitute("{unknown}{{path}}", &values),
            "{unknown}{/lib/x{environment}.rb}"
        );
        assert_eq!(substitute("{path", &values), "{path");
        assert_eq!(substitute("a{}b{", &values), "a{}b{");
    }
}
