//! The rules a value of agent.toml must pass, and the command line's and puppet.conf's values
//! of the same settings too (`settings.rs`): the masters, the environment, and two destinations
//! kept apart as the filesystem resolves them.

use std::path::{Path, PathBuf};

use pluginsync_common::config::ConfigError;
use pluginsync_common::envname::EnvName;

/// Refuses a `factsdir` that is `libdir` or inside it or around it,
/// compared as the filesystem resolves them: `..` and symlinks must not
/// hide one destination inside the other (each purge would delete the
/// other's files).
pub(super) fn destinations_apart(libdir: &Path, factsdir: &Path) -> Result<(), ConfigError> {
    let (facts, lib) = (real_path(factsdir), real_path(libdir));
    if facts == lib {
        return Err(ConfigError::Invalid(
            "libdir and factsdir must differ".into(),
        ));
    }
    if facts.starts_with(&lib) || lib.starts_with(&facts) {
        return Err(ConfigError::Invalid(format!(
            "libdir and factsdir must not contain each other ('{}' and '{}' resolve to '{}' and '{}')",
            libdir.display(),
            factsdir.display(),
            lib.display(),
            facts.display()
        )));
    }
    Ok(())
}

/// [`destinations_apart`]; a `factsdir` that was `defaulted` (`<vardir>/facts.d`) says how to
/// set it.
pub fn apart(libdir: &Path, factsdir: &Path, defaulted: bool) -> Result<(), ConfigError> {
    match destinations_apart(libdir, factsdir) {
        Err(ConfigError::Invalid(e)) if defaulted => Err(ConfigError::Invalid(format!(
            "{e} (factsdir is unset, so <vardir>/facts.d: set factsdir, or factsdir = \"\" for no pluginfacts pass)"
        ))),
        other => other,
    }
}

/// Why a server URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// Not `https://`.
    #[error("server '{0}' must start with https://")]
    NotHttps(String),
    /// A path, a query, user info, or no host.
    #[error("server '{0}' must be https://host[:port] with no path")]
    NotHostPort(String),
}

/// The masters of a run: at least one, each `https://host[:port]`
/// ([`validate_server`]); returned without trailing slashes.
pub fn servers(list: &[String]) -> Result<Vec<String>, ConfigError> {
    if list.is_empty() {
        return Err(ConfigError::Invalid(
            "servers must name at least one master".into(),
        ));
    }
    list.iter()
        .map(|s| {
            validate_server(s).map_err(|e| ConfigError::Invalid(e.to_string()))?;
            Ok(s.trim_end_matches('/').to_owned())
        })
        .collect()
}

/// The environment of a run, checked as Puppet names environments.
pub fn environment(name: &str) -> Result<EnvName, ConfigError> {
    name.parse::<EnvName>()
        .map_err(|e| ConfigError::Invalid(format!("environment: {e}")))
}

/// A server URL must be `https://host[:port]`, with no path.
pub fn validate_server(s: &str) -> Result<(), ServerError> {
    let rest = s
        .strip_prefix("https://")
        .ok_or_else(|| ServerError::NotHttps(s.to_owned()))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains('?') || rest.contains('@') {
        return Err(ServerError::NotHostPort(s.to_owned()));
    }
    Ok(())
}

/// `p` as the filesystem resolves it: its longest existing prefix made
/// canonical (symlinks followed), the rest applied lexically (`..` pops,
/// `.` is skipped), so paths that do not exist yet compare correctly too.
pub fn real_path(p: &Path) -> PathBuf {
    use std::path::Component;
    let parts: Vec<Component<'_>> = p.components().collect();
    for i in (0..=parts.len()).rev() {
        let prefix: PathBuf = parts[..i].iter().collect();
        let base = if prefix.as_os_str().is_empty() {
            std::env::current_dir().ok()
        } else {
            prefix.canonicalize().ok()
        };
        let Some(mut out) = base else { continue };
        for c in &parts[i..] {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::CurDir => {}
                other => out.push(other.as_os_str()),
            }
        }
        return out;
    }
    p.to_owned()
}
