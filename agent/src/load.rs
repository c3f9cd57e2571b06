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
//! (Packer, Terraform, Celerity, kustomize; docs/loading.md#plugin-layouts): the
//! layout names the plugin from its path ([`crate::layouts::identify`]),
//! the file must be executable, a Packer or Terraform `<file>_SHA256SUM`
//! must match its sha256, and `<file> describe` (the one handshake of every
//! layout, up to `attempts` launches each with its deadline) must print JSON
//! whose `version`, `api_version` and `id` agree with the path. Accepted
//! plugins go to the registry. Launching children is `launch.rs`'s.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use globset::{GlobBuilder, GlobMatcher};
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::config::{Layout, LoadConfig, LoaderConfig, LoaderKind};
use crate::launch::{ChildOutput, run_isolated};
use crate::layouts::{self, Found, Identified};
use crate::plugins::{self, Constraint, Registered, Registry};

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

/// The configured loaders, compiled.
pub struct Loaders {
    loaders: Vec<(GlobMatcher, LoaderConfig)>,
    config: LoadConfig,
    constraints: BTreeMap<String, Constraint>,
    environment: String,
}

impl Loaders {
    /// Compiles the loaders (the config was validated already).
    pub fn new(loaders: &[LoaderConfig], config: &LoadConfig, environment: &str) -> Loaders {
        Loaders {
            loaders: loaders
                .iter()
                .filter_map(|l| {
                    let g = GlobBuilder::new(&l.pattern)
                        .literal_separator(true)
                        .build()
                        .ok()?;
                    Some((g.compile_matcher(), l.clone()))
                })
                .collect(),
            config: config.clone(),
            constraints: config
                .constraints
                .iter()
                .filter_map(|(n, c)| Some((n.clone(), Constraint::parse(c).ok()?)))
                .collect(),
            environment: environment.to_owned(),
        }
    }

    /// True if a file of `mount` goes to the loaders: always for
    /// `plugins`; for `pluginfacts` when a loader has `mount =
    /// "pluginfacts"`.
    pub fn serves(&self, mount: Mount) -> bool {
        mount == Mount::Plugins || self.loaders.iter().any(|(_, l)| l.mount == mount)
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
            let path = format!("{mount}/{rel}");
            let abs = rel.to_path(root);
            let started = Instant::now();
            let Some((_, loader)) = self
                .loaders
                .iter()
                .find(|(g, l)| l.mount == *mount && g.is_match(rel.as_str()))
            else {
                out.push(skipped(path, None, "not loaded (no loader)"));
                continue;
            };
            let name = loader
                .name
                .clone()
                .unwrap_or_else(|| loader.pattern.clone());
            if !enabled {
                out.push(skipped(path, Some(name), "not loaded (loading disabled)"));
                continue;
            }
            let result = match loader.kind {
                LoaderKind::Command => self.command(loader, *mount, root, rel, &abs).await,
                LoaderKind::Describe => {
                    if rel.as_str().ends_with("_SHA256SUM") {
                        out.push(skipped(
                            path,
                            Some(name),
                            "checksum sidecar, checked with its plugin",
                        ));
                        continue;
                    }
                    let mut evicted = Vec::new();
                    let result = self
                        .describe(loader, *mount, root, rel, &abs, registry, &mut evicted)
                        .await;
                    for gone in evicted {
                        evict(&mut out, *mount, root, &gone, &name);
                    }
                    match result {
                        Ok(Some(why)) => {
                            out.push(skipped(path, Some(name), &why));
                            continue;
                        }
                        Ok(None) => Ok(()),
                        Err(e) => Err(e),
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
                error: result.err(),
                duration_ms,
            });
        }
        if enabled
            && !self.config.after_load.is_empty()
            && out.iter().any(|e| e.status == LoadStatus::Ok)
        {
            let started = Instant::now();
            let env = BTreeMap::from([(
                "PLUGINSYNC_ENVIRONMENT".to_owned(),
                self.environment.clone(),
            )]);
            let result = run_isolated(
                &self.config.after_load,
                &env,
                None,
                self.config.after_load_timeout,
            )
            .await;
            out.push(LoadEntry {
                path: "after_load".into(),
                loader: None,
                status: if result.is_ok() {
                    LoadStatus::Ok
                } else {
                    LoadStatus::Failed
                },
                error: result.err(),
                duration_ms: started.elapsed().as_millis() as u64,
            });
        }
        out
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
        env.insert("PLUGINSYNC_ENVIRONMENT".into(), self.environment.clone());
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
        mount: Mount,
        root: &Path,
        rel: &RelPath,
        abs: &Path,
    ) -> Result<(), String> {
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
            ("environment", self.environment.as_str()),
        ];
        let argv: Vec<String> = loader
            .command
            .iter()
            .map(|a| substitute(a, &values))
            .collect();
        let env = self.child_env(loader, mount, rel, abs);
        launch_attempts(loader, &argv, &env, Some(root))
            .await
            .map(|_| ())
    }

    /// A `describe` load: the layout gives the identity, version and
    /// target from the path ([`layouts::identify`]); then the roots, the
    /// Celerity ID's uniqueness, the exec bit, the `_SHA256SUM` sidecar
    /// (Packer, Terraform) and the `describe` handshake (unless
    /// `handshake = false`). `Ok(Some(why))`: skipped (outside the roots,
    /// shadowed, not a plugin as the layout's system sees it). Registry
    /// entries a Celerity ID clash takes out are pushed to `evicted`.
    #[allow(clippy::too_many_arguments)]
    async fn describe(
        &self,
        loader: &LoaderConfig,
        mount: Mount,
        root: &Path,
        rel: &RelPath,
        abs: &Path,
        registry: &mut Registry,
        evicted: &mut Vec<String>,
    ) -> Result<Option<String>, String> {
        let file_name = abs
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("file name is not UTF-8")?;
        let roots: Vec<PathBuf> = loader.roots.iter().map(|r| root.join(r)).collect();
        let root_of = |p: &Path| roots.iter().position(|r| p.starts_with(r));
        let (my_root, base) = if roots.is_empty() {
            (0, root.to_path_buf())
        } else {
            match root_of(abs) {
                Some(i) => (i, roots[i].clone()),
                None => return Ok(Some("outside the loader's roots".into())),
            }
        };
        let within: Vec<&str> = abs
            .strip_prefix(&base)
            .map_err(|_| "not under its root")?
            .iter()
            .map(|c| c.to_str().ok_or("path is not UTF-8"))
            .collect::<Result<_, _>>()?;
        let parent = rel.parent().unwrap_or_else(RelPath::root);
        let host_dir_holds =
            loader.host_dir.as_deref().map(|d| d.trim_end_matches('/')) == Some(parent.as_str());
        let ident = match layouts::identify(
            loader.layout,
            &within,
            &self.config.plugin_prefix,
            host_dir_holds,
        )? {
            Found::Skip(why) => return Ok(Some(why)),
            Found::Plugin(p) => p,
        };
        let id = ident.id.clone();
        if !roots.is_empty()
            && let Some(earlier) = registry
                .plugins
                .get(&id)
                .into_iter()
                .flatten()
                .filter_map(|r| root_of(Path::new(&r.path)))
                .find(|&i| i < my_root)
        {
            return Ok(Some(format!(
                "'{id}' is in an earlier root ({}), which wins",
                loader.roots[earlier]
            )));
        }
        if let Some(mine) = ident.celerity_type {
            // Celerity: "a transformer plugin and a provider plugin must not
            // have the same ID". Checked on disk, so it holds whichever of
            // the two arrived first: both are failed, neither is active.
            let other = if mine == "providers" {
                "transformers"
            } else {
                "providers"
            };
            let other_dir = base.join(other).join(&id);
            if other_dir.is_dir() {
                if let Some(versions) = registry.plugins.get_mut(&id) {
                    versions.retain(|r| {
                        let clashes = Path::new(&r.path).starts_with(&other_dir);
                        if clashes {
                            evicted.push(r.path.clone());
                        }
                        !clashes
                    });
                }
                registry.plugins.retain(|_, v| !v.is_empty());
                return Err(format!(
                    "plugin ID '{id}' is both a provider and a transformer (IDs are unique across both)"
                ));
            }
        }
        let md = std::fs::metadata(abs).map_err(|e| format!("cannot stat: {e}"))?;
        if md.permissions().mode() & 0o111 == 0 {
            return Err("not executable (is source_permissions = \"ignore\"?)".into());
        }
        let sha256 = sha256_of(abs)?;
        if matches!(loader.layout, Layout::Packer | Layout::Terraform) {
            check_sidecar(abs, file_name, &sha256)?;
        }
        let (version, api) = if loader.handshake() {
            let argv = vec![abs.to_string_lossy().into_owned(), "describe".to_owned()];
            let env = self.child_env(loader, mount, rel, abs);
            let output = launch_attempts(loader, &argv, &env, None)
                .await
                .map_err(|e| format!("describe: {e}"))?;
            let (v, a) = handshake(&ident, &output.stdout)?;
            (v.to_string(), a)
        } else {
            (
                ident
                    .version
                    .as_ref()
                    .map(Version::to_string)
                    .or(ident.fallback_version.clone())
                    .unwrap_or_default(),
                ident.api.clone().unwrap_or_default(),
            )
        };
        if !roots.is_empty()
            && let Some(versions) = registry.plugins.get_mut(&id)
        {
            // This root wins over the later ones that held the identity.
            versions.retain(|r| root_of(Path::new(&r.path)).is_none_or(|i| i <= my_root));
        }
        registry.add(
            &id,
            Registered {
                version: version.clone(),
                api_version: api,
                path: abs.to_string_lossy().into_owned(),
                sha256,
                loaded_at: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                local: ident.local,
            },
        );
        let active = registry
            .active(&id, self.constraints.get(&id))
            .map(|r| r.version.clone());
        tracing::info!(plugin = %id, version = %version, active = ?active, "plugin registered");
        Ok(None)
    }

    /// The constraint of a plugin name, if configured.
    pub fn constraint(&self, name: &str) -> Option<&Constraint> {
        self.constraints.get(name)
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

/// Launches `argv` up to the loader's `attempts` times, each with its
/// `timeout` (Celerity's registration deadline: a launch that does not
/// answer in time is killed with its process group and tried again).
async fn launch_attempts(
    loader: &LoaderConfig,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<ChildOutput, String> {
    let attempts = loader.attempts();
    let mut last = String::new();
    for attempt in 1..=attempts {
        match run_isolated(argv, env, cwd, loader.timeout).await {
            Ok(o) => {
                if attempt > 1 {
                    tracing::info!(program = %argv[0], attempt, "answered after failed launches");
                }
                return Ok(o);
            }
            Err(e) => last = e,
        }
    }
    Err(if attempts > 1 {
        format!("{last} (attempt {attempts} of {attempts})")
    } else {
        last
    })
}

/// The sha256 of a file, streamed.
fn sha256_of(abs: &Path) -> Result<String, String> {
    let file = std::fs::File::open(abs).map_err(|e| format!("cannot read: {e}"))?;
    let digest = pluginsync_common::checksum::ChecksumType::Sha256
        .digest_reader(std::io::BufReader::new(file))
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(digest["{sha256}".len()..].to_owned())
}

/// Packer's `<file>_SHA256SUM`: if present, its first word must be the
/// file's sha256.
fn check_sidecar(abs: &Path, file_name: &str, sha256: &str) -> Result<(), String> {
    let sidecar = abs.with_file_name(format!("{file_name}_SHA256SUM"));
    match std::fs::read_to_string(&sidecar) {
        Ok(text) => {
            let want = text
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if want != sha256 {
                return Err(format!(
                    "sha256 {sha256} does not match {file_name}_SHA256SUM ({want})"
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot read {file_name}_SHA256SUM: {e}")),
    }
}

/// The `describe` answer against what the path says: `version` (required)
/// must equal the path's version if it has one, `api_version` the path's
/// API version if it has one, and `id`, if given, the path's identity.
/// Returns the version and API version to register.
fn handshake(ident: &Identified, stdout: &[u8]) -> Result<(Version, String), String> {
    #[derive(Deserialize)]
    struct Described {
        version: String,
        #[serde(default)]
        api_version: Option<String>,
        #[serde(default)]
        id: Option<String>,
    }
    let d: Described = serde_json::from_slice(stdout)
        .map_err(|e| format!("describe did not print the expected JSON: {e}"))?;
    if let Some(said) = &d.id
        && *said != ident.id
    {
        return Err(format!(
            "describe says id '{said}' but the path says '{}'",
            ident.id
        ));
    }
    let described = plugins::parse_version(&d.version).map_err(|e| format!("describe: {e}"))?;
    let version = match &ident.version {
        Some(named) if *named != described => {
            return Err(format!(
                "describe says version {} but the name says {named}",
                d.version
            ));
        }
        Some(named) => named.clone(),
        None => described,
    };
    let said = d
        .api_version
        .as_deref()
        .map(|a| a.strip_prefix('x').unwrap_or(a).to_owned());
    let api = match (&ident.api, said) {
        (Some(named), Some(said)) if said != *named => {
            return Err(format!(
                "describe says api_version x{said} but the name says x{named}"
            ));
        }
        (Some(named), _) => named.clone(),
        (None, said) => said.unwrap_or_default(),
    };
    Ok((version, api))
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

#[cfg(test)]
mod tests {
    use super::*;

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
