//! Environments and their modules, as Puppet's directory environments have
//! them (docs/protocol.md §3.4, §3.1).
//!
//! An environment is `<environmentpath entry>/<name>/` whose name matches
//! `^\w+$`; the first entry that has it wins. Its modulepath is
//! `<env>/modules` followed by `basemodulepath`. A module is a directory in a
//! modulepath entry whose name matches `^[a-z][a-z0-9_]*$`; a name seen in an
//! earlier entry shadows later ones. Puppet orders modules of one directory
//! by readdir order, which differs between hosts; we sort by name so every
//! replica resolves collisions the same way ("first wins").

use std::path::{Path, PathBuf};

use pluginsync_common::envname::EnvName;

use crate::config::MasterConfig;

/// A module on the modulepath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// The module name (the directory name).
    pub name: String,
    /// The module directory.
    pub dir: PathBuf,
}

/// The directory of environment `name`, if one exists.
pub fn find_environment(config: &MasterConfig, name: &EnvName) -> Option<PathBuf> {
    config
        .environmentpath
        .iter()
        .map(|dir| dir.join(name.as_str()))
        .find(|candidate| candidate.is_dir())
}

/// Every environment on the environmentpath, sorted by name, first entry
/// winning for duplicate names.
pub fn list_environments(config: &MasterConfig) -> Vec<(EnvName, PathBuf)> {
    let mut found: Vec<(EnvName, PathBuf)> = Vec::new();
    for root in &config.environmentpath {
        let Ok(entries) = std::fs::read_dir(root) else {
            tracing::warn!(dir = %root.display(), "cannot read environmentpath entry");
            continue;
        };
        for entry in entries.flatten() {
            let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<EnvName>().ok())
            else {
                continue;
            };
            if entry.path().is_dir() && !found.iter().any(|(n, _)| n == &name) {
                found.push((name, entry.path()));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The modulepath of the environment at `env_dir`.
pub fn modulepath(config: &MasterConfig, env_dir: &Path) -> Vec<PathBuf> {
    std::iter::once(env_dir.join("modules"))
        .chain(config.basemodulepath.iter().cloned())
        .collect()
}

/// True for a valid Puppet module name.
pub fn is_module_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The modules of a modulepath, in resolution order: modulepath order, then
/// name; a name already seen is shadowed.
pub fn modules(modulepath: &[PathBuf]) -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    for dir in modulepath {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<Module> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                if !is_module_name(&name) {
                    tracing::debug!(dir = %e.path().display(), "not a module name, skipped");
                    return None;
                }
                e.path().is_dir().then(|| Module {
                    name,
                    dir: e.path(),
                })
            })
            .collect();
        here.sort_by(|a, b| a.name.cmp(&b.name));
        for m in here {
            if !out.iter().any(|o| o.name == m.name) {
                out.push(m);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        for ok in ["a", "stdlib", "my_mod2"] {
            assert!(is_module_name(ok), "{ok}");
        }
        for bad in ["", "Foo", "bad-name", "2x", "_x", "a.b"] {
            assert!(!is_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn order_and_shadowing() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for d in ["a/zeta", "a/alpha", "a/Bad-Name", "b/alpha", "b/beta"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        std::fs::write(a.join("file_not_dir"), "").unwrap();
        let m = modules(&[a.clone(), b.clone(), t.path().join("missing")]);
        let names: Vec<_> = m
            .iter()
            .map(|m| (m.name.as_str(), m.dir.parent().unwrap().to_owned()))
            .collect();
        assert_eq!(names, vec![("alpha", a.clone()), ("zeta", a), ("beta", b)]);
    }
}
