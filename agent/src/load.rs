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
//! `kind = "describe"` follows Packer: the name must parse
//! ([`crate::plugins::parse_name`]) and target this host, the file must be
//! executable, an optional `<file>_SHA256SUM` must match its sha256, and
//! `<file> describe` must print JSON whose `version` and `api_version` match
//! the name. Accepted plugins go to the registry.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use globset::{GlobBuilder, GlobMatcher};
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::config::{Layout, LoadConfig, LoaderConfig, LoaderKind};
use crate::plugins::{self, Constraint, Registered, Registry};

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

/// Go's operating system names, to tell an `<os>_<arch>` directory.
const GO_OSES: &[&str] = &[
    "linux", "darwin", "windows", "freebsd", "openbsd", "netbsd", "solaris", "illumos", "aix",
];

/// Bytes of a child's output kept (the rest is drained and dropped).
const CAPTURE: usize = 64 * 1024;

/// A finished child.
#[derive(Debug)]
pub struct ChildOutput {
    /// Standard output (first 64 KiB).
    pub stdout: Vec<u8>,
    /// Standard error (first 64 KiB).
    pub stderr: Vec<u8>,
}

async fn capture(mut r: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = CAPTURE.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let last: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    last.iter()
        .rev()
        .take(1)
        .map(|l| l.chars().take(300).collect::<String>())
        .collect()
}

/// Runs `argv` in its own process group with `env` added; kills the group
/// at `timeout`. `Ok` only for exit status 0.
pub async fn run_isolated(
    argv: &[String],
    env: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<ChildOutput, String> {
    let (program, args) = argv.split_first().ok_or("empty command")?;
    let mut cmd = match SUPERVISOR.get() {
        // The agent binary in its supervisor mode, which execs nothing
        // itself but runs `argv` and dies with its process group when the
        // agent dies (see `supervise`).
        Some(agent) => {
            let mut cmd = tokio::process::Command::new(agent);
            cmd.arg(SUPERVISE)
                .arg(std::process::id().to_string())
                .arg(program);
            cmd
        }
        None => tokio::process::Command::new(program),
    };
    cmd.args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run '{program}': {e}"))?;
    let pid = child.id();
    let out = tokio::spawn(capture(child.stdout.take().ok_or("no stdout")?));
    let err = tokio::spawn(capture(child.stderr.take().ok_or("no stderr")?));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status.map_err(|e| format!("waiting for '{program}': {e}"))?,
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _already_gone =
                    rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.wait().await;
            return Err(format!(
                "timed out after {} (killed with its process group)",
                humantime(timeout)
            ));
        }
    };
    // Output readers end when the pipes close; a grandchild that escaped the
    // group could hold them open, so do not wait for it forever.
    let grace = Duration::from_secs(1);
    let stdout = tokio::time::timeout(grace, out)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let stderr = tokio::time::timeout(grace, err)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    if status.success() {
        return Ok(ChildOutput { stdout, stderr });
    }
    let why = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "failed".to_owned(),
    };
    let detail = tail(&stderr);
    Err(if detail.is_empty() {
        why
    } else {
        format!("{why}: {detail}")
    })
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
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
                LoaderKind::Command => self.command(loader, rel, &abs).await,
                LoaderKind::Describe => {
                    if rel.as_str().ends_with("_SHA256SUM") {
                        out.push(skipped(
                            path,
                            Some(name),
                            "checksum sidecar, checked with its plugin",
                        ));
                        continue;
                    }
                    match self.describe(loader, root, rel, &abs, registry).await {
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
            let result = run_isolated(
                &self.config.after_load,
                &BTreeMap::new(),
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

    async fn command(
        &self,
        loader: &LoaderConfig,
        rel: &RelPath,
        abs: &Path,
    ) -> Result<(), String> {
        let argv: Vec<String> = loader
            .command
            .iter()
            .map(|a| {
                a.replace("{path}", &abs.to_string_lossy())
                    .replace("{relpath}", rel.as_str())
                    .replace("{environment}", &self.environment)
            })
            .collect();
        let mut last = String::new();
        for attempt in 1..=loader.attempts {
            match run_isolated(&argv, &loader.env, loader.timeout).await {
                Ok(_) => return Ok(()),
                Err(e) => {
                    last = if loader.attempts > 1 {
                        format!("{e} (attempt {attempt} of {})", loader.attempts)
                    } else {
                        e
                    };
                }
            }
        }
        Err(last)
    }

    /// A `describe` load: the layout gives the identity, version and
    /// target from the path; then the roots, the exec bit, the optional
    /// `_SHA256SUM` sidecar and the `describe` handshake. `Ok(Some(why))`:
    /// skipped (outside the roots, shadowed, another os/arch where the
    /// layout's system ignores those).
    async fn describe(
        &self,
        loader: &LoaderConfig,
        root: &Path,
        rel: &RelPath,
        abs: &Path,
        registry: &mut Registry,
    ) -> Result<Option<String>, String> {
        let file_name = abs
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("file name is not UTF-8")?;
        let roots: Vec<PathBuf> = loader.roots.iter().map(|r| root.join(r)).collect();
        let root_of = |p: &Path| roots.iter().position(|r| p.starts_with(r));
        let my_root = if roots.is_empty() {
            0
        } else {
            match root_of(abs) {
                Some(i) => i,
                None => return Ok(Some("outside the loader's roots".into())),
            }
        };
        let (id, version, api, local) = match loader.layout {
            Layout::Packer => {
                let name = plugins::parse_name(file_name, &self.config.plugin_prefix)?;
                if name.os != plugins::host_os() || name.arch != plugins::host_arch() {
                    return Err(format!(
                        "built for {}/{}, this host is {}/{}",
                        name.os,
                        name.arch,
                        plugins::host_os(),
                        plugins::host_arch()
                    ));
                }
                (name.name, Some(name.version), Some(name.api), false)
            }
            Layout::Terraform => {
                let name = plugins::parse_terraform(file_name)?;
                // Terraform looks only in its own <os>_<arch> directory.
                let parent = rel.parent().unwrap_or_else(RelPath::root);
                if let Some((os, arch)) = parent
                    .file_name()
                    .and_then(|d| d.split_once('_'))
                    .filter(|(os, _)| GO_OSES.contains(os))
                    && (os != plugins::host_os() || arch != plugins::host_arch())
                {
                    return Ok(Some(format!(
                        "built for {os}/{arch}, this host is {}/{}",
                        plugins::host_os(),
                        plugins::host_arch()
                    )));
                }
                let local = name.version.is_none();
                if local
                    && loader.host_dir.as_deref().map(|d| d.trim_end_matches('/'))
                        != Some(parent.as_str())
                {
                    return Err(
                        "an unversioned provider is a local build and belongs in host_dir".into(),
                    );
                }
                (name.name, name.version, name.api, local)
            }
        };
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
        let md = std::fs::metadata(abs).map_err(|e| format!("cannot stat: {e}"))?;
        if md.permissions().mode() & 0o111 == 0 {
            return Err("not executable (is source_permissions = \"ignore\"?)".into());
        }
        let bytes = std::fs::read(abs).map_err(|e| format!("cannot read: {e}"))?;
        let sha256 = pluginsync_common::checksum::ChecksumType::Sha256
            .digest_reader(&bytes[..])
            .map_err(|e| e.to_string())?["{sha256}".len()..]
            .to_owned();
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
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {file_name}_SHA256SUM: {e}")),
        }
        let argv = vec![abs.to_string_lossy().into_owned(), "describe".to_owned()];
        let mut last = String::new();
        let mut output = None;
        for _ in 0..loader.attempts {
            match run_isolated(&argv, &loader.env, loader.timeout).await {
                Ok(o) => {
                    output = Some(o);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let output = output.ok_or_else(|| format!("describe: {last}"))?;
        #[derive(Deserialize)]
        struct Described {
            version: String,
            api_version: String,
        }
        let d: Described = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("describe did not print the expected JSON: {e}"))?;
        let described = plugins::parse_version(&d.version).map_err(|e| format!("describe: {e}"))?;
        let version = match version {
            Some(named) if named != described => {
                return Err(format!(
                    "describe says version {} but the name says {named}",
                    d.version
                ));
            }
            Some(named) => named,
            None => described,
        };
        let said = d.api_version.strip_prefix('x').unwrap_or(&d.api_version);
        let api = match api {
            Some(named) if said != named => {
                return Err(format!(
                    "describe says api_version {} but the name says x{named}",
                    d.api_version
                ));
            }
            Some(named) => named,
            None => said.to_owned(),
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
                version: version.to_string(),
                api_version: api,
                path: abs.to_string_lossy().into_owned(),
                sha256,
                loaded_at: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                local,
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

fn skipped(path: String, loader: Option<String>, why: &str) -> LoadEntry {
    LoadEntry {
        path,
        loader,
        status: LoadStatus::Skipped,
        error: Some(why.to_owned()),
        duration_ms: 0,
    }
}

/// `argv[1]` of the agent binary when it runs as a loader's supervisor:
/// `pluginsync-agent __supervise-loader <agent pid> <program> [<arg>…]`.
pub const SUPERVISE: &str = "__supervise-loader";

/// Exit status of a supervisor that could not run its program (as a shell's
/// "command not found").
const CANNOT_RUN: i32 = 127;

static SUPERVISOR: OnceLock<PathBuf> = OnceLock::new();

/// Makes every later [`run_isolated`] launch its command through `agent`
/// (this binary) in supervisor mode, so loader children die with the agent
/// even when it is killed with SIGKILL. Called once by `main`; without it
/// (unit tests, other binaries) commands are spawned directly.
pub fn use_supervisor(agent: PathBuf) {
    let _first_call_wins = SUPERVISOR.set(agent);
}

/// If this process was started as a supervisor (`argv[1]` is
/// [`SUPERVISE`]), supervises and returns the exit status to exit with.
///
/// Why a re-exec and not `pre_exec`: `PR_SET_PDEATHSIG` must be set in the
/// child, between fork and exec, which std only offers through the unsafe
/// `CommandExt::pre_exec`, and the workspace forbids `unsafe_code`. The
/// supervisor is the agent's direct child, so it sets the signal on itself
/// with rustix's safe `set_parent_process_death_signal` and then runs the
/// loader. It asks for SIGTERM, not SIGKILL, so that it can catch it and
/// kill its whole process group (the loader and the loader's own children,
/// which a death signal does not reach: it is cleared on fork). The agent
/// dying by SIGKILL, SIGTERM or SIGINT therefore takes every loader process
/// with it. The supervisor passes the loader's exit status through (a
/// signal by re-raising it on itself), so reports read as before.
pub fn supervised() -> Option<i32> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != SUPERVISE {
        return None;
    }
    let parent = args
        .next()
        .and_then(|p| p.to_str()?.parse::<i32>().ok())
        .and_then(rustix::process::Pid::from_raw);
    let argv: Vec<std::ffi::OsString> = args.collect();
    let (Some(parent), Some((program, rest))) = (parent, argv.split_first()) else {
        eprintln!("usage: pluginsync-agent {SUPERVISE} <agent pid> <program> [<arg>...]");
        return Some(64);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("supervisor: cannot start the runtime: {e}");
            return Some(CANNOT_RUN);
        }
    };
    Some(runtime.block_on(supervise(parent, program, rest)))
}

async fn supervise(
    parent: rustix::process::Pid,
    program: &std::ffi::OsStr,
    args: &[std::ffi::OsString],
) -> i32 {
    use rustix::process::{Signal, getpgrp, getpid, getppid, kill_process, kill_process_group};
    let kill_group = || {
        let _ = kill_process_group(getpgrp(), Signal::KILL);
    };
    // The handler first, then the death signal, then the check that the
    // agent did not die before the death signal was armed.
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("supervisor: cannot handle SIGTERM: {e}");
            return CANNOT_RUN;
        }
    };
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::TERM)) {
        eprintln!("supervisor: cannot set the parent death signal: {e}");
        return CANNOT_RUN;
    }
    if getppid() != Some(parent) {
        return CANNOT_RUN;
    }
    let mut child = match tokio::process::Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot run '{}': {e}", program.to_string_lossy());
            return CANNOT_RUN;
        }
    };
    tokio::select! {
        status = child.wait() => match status {
            Ok(s) => match (s.code(), s.signal().and_then(Signal::from_named_raw)) {
                (Some(code), _) => code,
                (None, Some(sig)) => {
                    let _ = kill_process(getpid(), sig);
                    // Not reached for deadly signals; a stopped child is a
                    // failure all the same.
                    128 + sig.as_raw()
                }
                (None, None) => 1,
            },
            Err(e) => {
                eprintln!("supervisor: waiting for the loader: {e}");
                kill_group();
                1
            }
        },
        _ = term.recv() => {
            kill_group();
            128 + Signal::TERM.as_raw()
        }
    }
}

/// The files a run is about to commit and will have to load
/// (`<vardir>/pending_loads.json`): written before the commit, removed
/// once the loads ran. A run that finds it loads them (ARCHITECTURE.md,
/// Agent: a run killed between its commit and its loads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLoads {
    /// `(mount, relative path)` of each file, in commit order.
    pub files: Vec<(Mount, String)>,
}

impl PendingLoads {
    const FILE: &'static str = "pending_loads.json";

    /// Records `files` (durably: it must survive the agent being killed).
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
