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
/// (it names the key, the line and the column) flattened to one line; an
/// unknown key also says where it is, `in [tls]` or `at the top level`
/// ([`with_table`]): a key appended after the last table lands in that
/// table, and toml's message alone names only the key. The toml error is
/// deliberately not its `source`, so an error chain printed cause by cause
/// never adds toml's multi-line text after it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TomlError(String);

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
    toml::from_str(text).map_err(|e: toml::de::Error| TomlError(flatten(&with_table(text, &e))))
}

/// toml's error text with `unknown field `key`` followed by the table the
/// key is in (`in [tls]`, `in [[loader]]`, `in [load.constraints]`) or
/// `at the top level`, found from the error's span in the document;
/// unchanged for every other error, or when the key cannot be found.
fn with_table(text: &str, e: &toml::de::Error) -> String {
    let full = e.to_string();
    let message = e.message();
    let (Some(span), Some(rest)) = (e.span(), message.strip_prefix("unknown field `")) else {
        return full;
    };
    let Some(end) = rest.find('`') else {
        return full;
    };
    let Some(place) = table_of_key_at(text, span.start) else {
        return full;
    };
    let head = "unknown field `".len() + end + 1;
    let located = format!("{}{place}{}", &message[..head], &message[head..]);
    match full.rfind(message) {
        Some(at) => format!("{}{located}{}", &full[..at], &full[at + message.len()..]),
        None => full,
    }
}

/// Where the key whose name starts at byte `offset` of `text` is, as a
/// config error says it: ` in [a.b]`, ` in [[a]]` (an array of tables),
/// or ` at the top level`. `None` when no key starts there.
fn table_of_key_at(text: &str, offset: usize) -> Option<String> {
    use toml::de::{DeTable, DeValue};
    /// The path to the key at `offset`, each step with whether it is an
    /// array of tables; depth-first, bounded by the parser's own nesting
    /// limit.
    fn find(table: &DeTable<'_>, offset: usize, path: &mut Vec<(String, bool)>) -> bool {
        for (key, value) in table.iter() {
            if key.span().contains(&offset) {
                return true;
            }
            let tables: Vec<(&DeTable<'_>, bool)> = match value.get_ref() {
                DeValue::Table(t) => vec![(t, false)],
                DeValue::Array(a) => a
                    .iter()
                    .filter_map(|v| match v.get_ref() {
                        DeValue::Table(t) => Some((t, true)),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            for (t, in_array) in tables {
                path.push((key.get_ref().to_string(), in_array));
                if find(t, offset, path) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let doc = DeTable::parse(text).ok()?;
    let mut path = Vec::new();
    if !find(doc.get_ref(), offset, &mut path) {
        return None;
    }
    let Some((_, in_array)) = path.last() else {
        return Some(" at the top level".into());
    };
    let name = path
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(".");
    Some(if *in_array {
        format!(" in [[{name}]]")
    } else {
        format!(" in [{name}]")
    })
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

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Tables {
        a: Option<u32>,
        tls: Option<C>,
        #[serde(default)]
        loader: Vec<C>,
    }

    /// A key appended after the last table lands in it: the error says
    /// which table, whatever way the table was written.
    #[test]
    fn an_unknown_key_names_its_table() {
        for (text, place) in [
            ("a = 1\n[tls]\na = 2\nservers = [\"x\"]\n", "in [tls]"),
            ("tls = { a = 1, servers = 1 }\n", "in [tls]"),
            ("tls.servers = 1\n", "in [tls]"),
            (
                "[[loader]]\na = 1\n[[loader]]\na = 2\nservers = 1\n",
                "in [[loader]]",
            ),
            ("servers = 1\n[tls]\na = 1\n", "at the top level"),
        ] {
            let e = parse_toml::<Tables>(text).unwrap_err().to_string();
            assert!(
                e.contains(&format!("unknown field `servers` {place}, expected")),
                "{text:?}: {e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        // Other errors are toml's, unchanged.
        let e = parse_toml::<Tables>("a = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("invalid type") && !e.contains(" in ["), "{e}");
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
