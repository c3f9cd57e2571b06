//! What both config files share: one loader ([`load`], [`parse`]) with one
//! error type ([`ConfigError`]), TOML errors on one line, and paths taken
//! relative to the config file's directory. Each binary's config type says
//! only what is its own through [`ConfigFile`].

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// A config that cannot be used; both binaries exit with their documented
/// config-error code on these. Its message is always one line: control
/// characters from the file (a key, a path, a glob with a newline) are
/// shown escaped ([`one_line`]), so the line the binaries print cannot be
/// split or carry terminal sequences.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config '{}': {}", one_line(&path.display().to_string()), one_line(&source.to_string()))]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key, a wrong type.
    #[error("invalid config '{}': {}", one_line(&path.display().to_string()), one_line(message))]
    Parse {
        /// The config file.
        path: PathBuf,
        /// toml's message, flattened to one line.
        message: String,
    },
    /// A value that parsed but cannot work.
    #[error("invalid config: {}", one_line(.0))]
    Invalid(String),
}

/// `text` with control characters and bidirectional overrides escaped
/// (`crate::text::escape`): a config error stays one line.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    crate::text::escape(text)
}

/// A config file type: TOML with unknown keys refused (`deny_unknown_fields`),
/// its relative paths resolved against the file's directory, and checks
/// serde cannot make.
pub trait ConfigFile: DeserializeOwned {
    /// Makes every path in the config absolute with `base`.
    fn resolve_paths(&mut self, base: &RelativeTo);
    /// Cross-field checks, after parsing.
    fn check(&self) -> Result<(), ConfigError>;
}

/// Reads, parses and validates the config file at `path`.
pub fn load<T: ConfigFile>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config: T = parse(&text, path)?;
    config.check()?;
    Ok(config)
}

/// Parses `text` as if read from `path` (relative paths resolved against
/// its directory), without validating.
pub fn parse<T: ConfigFile>(text: &str, path: &Path) -> Result<T, ConfigError> {
    let mut config: T = parse_toml(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    config.resolve_paths(&RelativeTo::config_file(path));
    Ok(config)
}

/// TOML that does not parse into the config type. Shown as toml's message
/// (it names the key, the line and the column) flattened to one line; the
/// toml error is deliberately not its `source`, so an error chain printed
/// cause by cause never adds toml's multi-line text after it.
#[derive(Debug, thiserror::Error)]
#[error("{}", flatten(&.0.to_string()))]
pub struct TomlError(toml::de::Error);

/// toml's multi-line message (the line quoted, a caret under the column)
/// as one line: its non-blank lines joined by spaces.
fn flatten(message: &str) -> String {
    message
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses TOML text ([`TomlError`] on one line).
pub fn parse_toml<T: DeserializeOwned>(text: &str) -> Result<T, TomlError> {
    toml::from_str(text).map_err(TomlError)
}

/// Makes relative paths relative to the directory of the config file at
/// `config` (itself made absolute against the working directory).
#[derive(Debug, Clone)]
pub struct RelativeTo(PathBuf);

impl RelativeTo {
    /// For the config file at `config`.
    pub fn config_file(config: &Path) -> RelativeTo {
        let absolute = std::path::absolute(config).unwrap_or_else(|_| config.to_owned());
        RelativeTo(absolute.parent().unwrap_or(Path::new("/")).to_owned())
    }

    /// Rewrites `p` in place if it is relative.
    pub fn fix(&self, p: &mut PathBuf) {
        if p.is_relative() {
            *p = self.0.join(&*p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct C {
        a: u32,
    }

    #[test]
    fn one_line_errors_and_relative_paths() {
        let e = parse_toml::<C>("a = 1\nb = 2\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `b`") && !e.contains('\n'), "{e}");
        let r = RelativeTo::config_file(Path::new("/etc/pluginsync/agent.toml"));
        let (mut rel, mut abs) = (PathBuf::from("ssl"), PathBuf::from("/var/x"));
        r.fix(&mut rel);
        r.fix(&mut abs);
        assert_eq!(
            (rel, abs),
            (
                PathBuf::from("/etc/pluginsync/ssl"),
                PathBuf::from("/var/x")
            )
        );
    }

    /// Found by the agent_config fuzz target
    /// (fuzz/artifacts/agent_config/loader-match-newline): a value with a
    /// newline made a two-line error, which the master prints as is.
    #[test]
    fn messages_stay_one_line_whatever_the_file_holds() {
        let e = ConfigError::Invalid("match 'a\nb\u{1b}[31m'".into());
        assert_eq!(e.to_string(), "invalid config: match 'a\\nb\\x1b[31m'");
        let e = ConfigError::Parse {
            path: PathBuf::from("/etc/x\ny.toml"),
            message: "bad\rvalue".into(),
        };
        assert_eq!(
            e.to_string(),
            "invalid config '/etc/x\\ny.toml': bad\\rvalue"
        );
        assert_eq!(one_line("plain 'é'"), "plain 'é'");
    }
}
