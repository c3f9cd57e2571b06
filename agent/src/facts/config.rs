//! `[facts]` in agent.toml (docs/loading.md#fact-health): whether changed
//! facts are checked, each file's deadline, which Facter, and where the
//! `pluginsync` fact goes (docs/agent.md#the-pluginsync-fact). Apart from
//! the check itself (`facts.rs`) so that the config modules that declare
//! it import nothing of the loads.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// `[facts]` in agent.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FactsConfig {
    /// Check changed facts; unset: where Facter is found.
    pub check: Option<bool>,
    /// Each fact file's deadline.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Facter's path; unset: `facter` on `PATH`.
    pub facter: Option<PathBuf>,
    /// Where the `pluginsync` fact is written; unset: Facter's directory
    /// of the node's Puppet layout (settings.rs).
    pub external_dir: Option<ExternalDir>,
}

/// `[facts] external_dir`: a directory, or a switch (`false` or `""`:
/// not written; `true`: the layout's directory).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ExternalDir {
    /// `true` or `false`.
    Switch(bool),
    /// A directory; `""` is off.
    Dir(PathBuf),
}

impl Default for FactsConfig {
    fn default() -> Self {
        FactsConfig {
            check: None,
            timeout: Duration::from_secs(10),
            facter: None,
            external_dir: None,
        }
    }
}

impl FactsConfig {
    /// The Facter to run, or `None` when facts are not checked: `check =
    /// false`, or no Facter where it is looked for (with a warning when
    /// `check = true`).
    pub fn facter(&self) -> Option<PathBuf> {
        if self.check == Some(false) {
            return None;
        }
        let found = match &self.facter {
            Some(path) => path.is_file().then(|| path.clone()),
            None => on_path("facter"),
        };
        if found.is_none() && self.check == Some(true) {
            let looked = match &self.facter {
                Some(p) => p.display().to_string(),
                None => "facter on PATH".to_owned(),
            };
            tracing::warn!(
                "[facts] check = true but Facter is not found ({looked}); facts are not checked"
            );
        }
        found
    }

    /// Where the `pluginsync` fact is written: `external_dir`'s
    /// directory, else `default` (unset or `true`); `None`: not written.
    pub fn external_dir(&self, default: Option<PathBuf>) -> Option<PathBuf> {
        match &self.external_dir {
            None | Some(ExternalDir::Switch(true)) => default,
            Some(ExternalDir::Switch(false)) => None,
            Some(ExternalDir::Dir(d)) if d.as_os_str().is_empty() => None,
            Some(ExternalDir::Dir(d)) => Some(d.clone()),
        }
    }

    /// Each setting by its dotted name, as `pluginsync-agent config` shows
    /// it: `facts.check` as it resolves on this node.
    pub fn values(&self) -> [(&'static str, String); 3] {
        let facter = match &self.facter {
            Some(path) => path.is_file().then(|| path.clone()),
            None => on_path("facter"),
        };
        let check = match (self.check, &facter) {
            (Some(c), _) => c.to_string(),
            (None, Some(_)) => "true (Facter found)".to_owned(),
            (None, None) => "false (Facter not found)".to_owned(),
        };
        let shown = self.facter.clone().or(facter);
        let timeout = humantime_serde::re::humantime::format_duration(self.timeout);
        [
            ("facts.check", check),
            ("facts.timeout", timeout.to_string()),
            (
                "facts.facter",
                shown.map(|p| p.display().to_string()).unwrap_or_default(),
            ),
        ]
    }
}

/// `name` in a directory of `PATH`, if it is a file there.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_dir_is_a_directory_or_a_switch() {
        let dir = |toml: &str| {
            let c: FactsConfig = toml::from_str(toml).unwrap();
            c.external_dir(Some("/layout".into()))
        };
        assert_eq!(dir(""), Some("/layout".into()));
        assert_eq!(dir("external_dir = true"), Some("/layout".into()));
        assert_eq!(dir("external_dir = false"), None);
        assert_eq!(dir("external_dir = \"\""), None);
        assert_eq!(
            dir("external_dir = \"/x/facts.d\""),
            Some("/x/facts.d".into())
        );
        assert!(toml::from_str::<FactsConfig>("external_dir = 3").is_err());
    }
}
