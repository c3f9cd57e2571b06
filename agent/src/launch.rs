//! Launching loader children, each in isolation (docs/loading.md;
//! docs/internals.md#load-launch-layouts-and-plugins).
//!
//! Every child (a `command` loader, a `describe` handshake, `after_load`)
//! runs in its own process group with a deadline: at the deadline the whole
//! group is killed, so a hanging loader takes its children with it. In the
//! agent binary each launch goes through a supervisor (the binary re-run as
//! [`SUPERVISE`]) that kills the group when the agent dies, by any signal.
//!
//! Children never inherit the agent's environment: it is cleared, and only
//! [`ALLOWED_ENV`] (plus `LC_*`) is passed on, then the variables the agent
//! sets (`PLUGINSYNC_*`) and the loader's own `env`. An agent run from a
//! shell holding credentials (`AWS_*`, tokens, `SSH_AUTH_SOCK`) does not
//! hand them to every plugin (the test
//! `agent_load::loader_arguments_and_environment_are_what_the_loader_asked_for`).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// The variables of the agent's own environment a child inherits (and
/// every `LC_*`); everything else is cleared.
pub const ALLOWED_ENV: &[&str] = &["PATH", "LANG", "LANGUAGE", "TZ"];

/// True if a child may inherit the agent's variable `name`.
pub fn inherits(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| ALLOWED_ENV.contains(&n) || n.starts_with("LC_"))
}

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

/// Why a launch failed: the line a failed load reports.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// An empty argv.
    #[error("empty command")]
    EmptyCommand,
    /// The program could not be started.
    #[error("cannot run '{program}': {source}")]
    Spawn {
        /// `argv[0]`.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A pipe of the child was not there to read.
    #[error("no {0}")]
    NoPipe(&'static str),
    /// Waiting for the child failed.
    #[error("waiting for '{program}': {source}")]
    Wait {
        /// `argv[0]`.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The deadline passed; the group was killed.
    #[error("timed out after {} (killed with its process group)", humantime(*.0))]
    TimedOut(Duration),
    /// The child ended other than with status 0; the last line of its
    /// stderr, if any, follows.
    #[error("{ended}{}", if .stderr.is_empty() { String::new() } else { format!(": {}", .stderr) })]
    Failed {
        /// How it ended.
        ended: Ended,
        /// The last non-empty line of its stderr (at most 300 characters).
        stderr: String,
    },
}

/// How a failed child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    /// With a non-zero status.
    #[error("exited with status {0}")]
    Status(i32),
    /// By a signal.
    #[error("killed by signal {0}")]
    Signal(i32),
    /// Neither (a stopped child).
    #[error("failed")]
    Other,
}

/// Kills a child's process group when dropped, unless disarmed (`.0 =
/// None`) once the child was waited for.
struct GroupGuard(Option<rustix::process::Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            let _already_gone =
                rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Runs `argv` in its own process group, in `cwd` if given, with a cleared
/// environment: the agent's [`inherits`] variables, then `env`; kills the
/// group at `timeout`. `Ok` only for exit status 0.
pub async fn run_isolated(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    timeout: Duration,
) -> Result<ChildOutput, LaunchError> {
    let (status, output) = run_output(argv, env, cwd, timeout).await?;
    if status.success() {
        return Ok(output);
    }
    let ended = match (status.code(), status.signal()) {
        (Some(code), _) => Ended::Status(code),
        (None, Some(sig)) => Ended::Signal(sig),
        _ => Ended::Other,
    };
    Err(LaunchError::Failed {
        ended,
        stderr: tail(&output.stderr),
    })
}

/// [`run_isolated`], but a child that ran to its end is `Ok` whatever its
/// status, with all of its (bounded) output: for a caller that judges the
/// output itself (`facts.rs`: Facter's `ERROR` lines).
pub async fn run_output(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, ChildOutput), LaunchError> {
    let (program, args) = argv.split_first().ok_or(LaunchError::EmptyCommand)?;
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
        .env_clear()
        .envs(std::env::vars_os().filter(|(k, _)| inherits(k)))
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id();
    // Dropped before the child was waited for (the run stopped by a signal,
    // a failure elsewhere): the whole process group is killed, not only the
    // supervisor (`kill_on_drop` alone orphaned the loader and its children,
    // and once the supervisor was reaped nothing could find them).
    let mut group = GroupGuard(pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)));
    let out = tokio::spawn(capture(
        child.stdout.take().ok_or(LaunchError::NoPipe("stdout"))?,
    ));
    let err = tokio::spawn(capture(
        child.stderr.take().ok_or(LaunchError::NoPipe("stderr"))?,
    ));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => {
            group.0 = None;
            status.map_err(|source| LaunchError::Wait {
                program: program.clone(),
                source,
            })?
        }
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _already_gone =
                    rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.wait().await;
            return Err(LaunchError::TimedOut(timeout));
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
    Ok((status, ChildOutput { stdout, stderr }))
}

/// The last of `attempts` failed launches; the count is named when there
/// was more than one.
#[derive(Debug, thiserror::Error)]
#[error("{last}{}", if *.attempts > 1 { format!(" (attempt {0} of {0})", .attempts) } else { String::new() })]
pub struct AttemptsError {
    /// Why the last launch failed.
    pub last: LaunchError,
    /// How many launches were tried.
    pub attempts: u32,
}

/// Launches `argv` up to `attempts` times (at least once), each with its
/// `timeout` (Celerity's registration deadline: a launch that does not
/// answer in time is killed with its process group and tried again).
pub async fn run_attempts(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    timeout: Duration,
    attempts: u32,
) -> Result<ChildOutput, AttemptsError> {
    let attempts = attempts.max(1);
    let mut attempt = 1;
    loop {
        match run_isolated(argv, env, cwd, timeout).await {
            Ok(o) => {
                if attempt > 1 {
                    tracing::info!(program = %argv[0], attempt, "answered after failed launches");
                }
                return Ok(o);
            }
            Err(last) if attempt == attempts => return Err(AttemptsError { last, attempts }),
            Err(_) => attempt += 1,
        }
    }
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowlist_is_inherited() {
        for yes in ["PATH", "LANG", "TZ", "LC_ALL", "LC_CTYPE"] {
            assert!(inherits(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "HOME",
            "AWS_SECRET_ACCESS_KEY",
            "SSH_AUTH_SOCK",
            "LD_PRELOAD",
            "PATHX",
            "RUST_LOG",
        ] {
            assert!(!inherits(OsStr::new(no)), "{no}");
        }
    }
}
