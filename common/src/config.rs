//! What both config files share: TOML parsing with errors on one line,
//! and paths taken relative to the config file's directory.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Parses TOML text; the error is toml's message flattened to one line
/// (it names the key, the line and the column).
pub fn parse_toml<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| {
        e.to_string()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" ")
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

    #[test]
    fn one_line_errors_and_relative_paths() {
        let e = parse_toml::<C>("a = 1\nb = 2\n").unwrap_err();
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
}
