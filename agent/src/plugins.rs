//! Executable plugins after Packer's rules, and the registry of accepted
//! ones (`<vardir>/plugins.json`).
//!
//! A plugin file is named `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`,
//! e.g. `pluginsync-plugin-hello_v1.0.1_x1.0_linux_amd64`. The version must
//! be canonical semver (`1.00.01` is refused) with no pre-release but
//! `-dev`; os and arch must be this host's (Go's names: `linux`, `amd64`,
//! `arm64`). Versions order as semver does, so `1.0.0 < 1.0.1-dev < 1.0.1`.
//! The registry keeps every accepted version of each name; the active one
//! is the highest that satisfies the name's constraint, if any.
//!
//! Terraform's layout ([`parse_terraform`]) names providers
//! `terraform-provider-<name>_v<X.Y.Z>[_x<api>]`; an unversioned
//! `terraform-provider-<name>` beside the host program is a local build,
//! active over every release (docs/loading.md#plugin-layouts).

use std::collections::BTreeMap;
use std::path::Path;

use semver::Version;
use serde::{Deserialize, Serialize};

/// A parsed plugin file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginName {
    /// The plugin's name.
    pub name: String,
    /// Its version.
    pub version: Version,
    /// Its API version, `<major>.<minor>` (without the `x`).
    pub api: String,
    /// Target OS.
    pub os: String,
    /// Target architecture.
    pub arch: String,
}

/// Why a plugin file name or version is refused (the line a failed load
/// reports).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not `MAJOR.MINOR.PATCH`.
    #[error("version '{0}' is not canonical semver (MAJOR.MINOR.PATCH)")]
    NotCanonical(String),
    /// `+build` metadata.
    #[error("version '{0}' has build metadata")]
    BuildMetadata(String),
    /// A pre-release other than `-dev`.
    #[error("version '{0}' has a pre-release other than -dev")]
    PreRelease(String),
    /// A Terraform release with a pre-release.
    #[error("version '{0}' is not a release")]
    NotRelease(String),
    /// The name lacks the prefix (`<prefix>-`, `terraform-provider-`).
    #[error("'{file}' does not start with '{prefix}'")]
    Prefix {
        /// The file name.
        file: String,
        /// The prefix it should start with, dash included.
        prefix: String,
    },
    /// Not `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
    #[error("'{0}' is not <prefix>-<name>_v<version>_x<api>_<os>_<arch>")]
    Shape(String),
    /// No `_v<version>`.
    #[error("'{0}' has no _v<version>")]
    NoVersion(String),
    /// An empty name or one with other characters.
    #[error("'{0}' has no usable plugin name")]
    NoPluginName(String),
    /// An empty provider name or one with other characters.
    #[error("'{0}' has no usable provider name")]
    NoProviderName(String),
    /// Packer's `_x<major>.<minor>` missing or malformed.
    #[error("'{0}' has no valid _x<major>.<minor> API version")]
    NoApi(String),
    /// Terraform's `_x<api>` malformed.
    #[error("'{0}' has no valid _x<api>")]
    NoTerraformApi(String),
}

/// Why a `[load.constraints]` value is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// A comparison without a version.
    #[error("'{0}' has no version")]
    NoVersion(String),
    /// An operator other than `=`, `!=`, `>`, `>=`, `<`, `<=`, `~>`.
    #[error("unknown operator '{0}'")]
    Operator(String),
    /// A version semver cannot read.
    #[error("'{version}': {source}")]
    Version {
        /// The version as written (without `v`).
        version: String,
        /// semver's reason.
        source: semver::Error,
    },
}

/// This host's OS in Go's naming.
pub fn host_os() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    }
}

/// This host's architecture in Go's naming.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64",
        other => other,
    }
}

/// Parses a canonical `MAJOR.MINOR.PATCH[-dev]` (a leading `v` allowed).
pub fn parse_version(v: &str) -> Result<Version, NameError> {
    let bare = v.strip_prefix('v').unwrap_or(v);
    let parsed = Version::parse(bare).map_err(|_| NameError::NotCanonical(v.to_owned()))?;
    if !parsed.build.is_empty() {
        return Err(NameError::BuildMetadata(v.to_owned()));
    }
    if !parsed.pre.is_empty() && parsed.pre.as_str() != "dev" {
        return Err(NameError::PreRelease(v.to_owned()));
    }
    Ok(parsed)
}

/// Parses `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
pub fn parse_name(file_name: &str, prefix: &str) -> Result<PluginName, NameError> {
    let rest = file_name
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .ok_or_else(|| NameError::Prefix {
            file: file_name.to_owned(),
            prefix: format!("{prefix}-"),
        })?;
    let mut parts = rest.rsplitn(4, '_');
    let (Some(arch), Some(os), Some(api), Some(head)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(NameError::Shape(file_name.to_owned()));
    };
    let (name, version) = head
        .rsplit_once("_v")
        .ok_or_else(|| NameError::NoVersion(file_name.to_owned()))?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(NameError::NoPluginName(file_name.to_owned()));
    }
    let api = api
        .strip_prefix('x')
        .filter(|a| {
            let mut it = a.split('.');
            matches!((it.next(), it.next(), it.next()), (Some(x), Some(y), None) if !x.is_empty() && !y.is_empty() && x.bytes().chain(y.bytes()).all(|b| b.is_ascii_digit()))
        })
        .ok_or_else(|| NameError::NoApi(file_name.to_owned()))?;
    Ok(PluginName {
        name: name.to_owned(),
        version: parse_version(version)?,
        api: api.to_owned(),
        os: os.to_owned(),
        arch: arch.to_owned(),
    })
}

/// A Terraform provider file name: `terraform-provider-<name>` (a local
/// build, no version) or `terraform-provider-<name>_v<X.Y.Z>[_x<api>]` (an
/// installed release; `X.Y.Z` canonical, no pre-release).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerraformName {
    /// The provider's name (its identity).
    pub name: String,
    /// The release's version; `None` for a local build.
    pub version: Option<Version>,
    /// The plugin protocol version of `_x<api>`, if named.
    pub api: Option<String>,
}

/// Parses a Terraform provider file name.
pub fn parse_terraform(file_name: &str) -> Result<TerraformName, NameError> {
    let rest = file_name
        .strip_prefix("terraform-provider-")
        .ok_or_else(|| NameError::Prefix {
            file: file_name.to_owned(),
            prefix: "terraform-provider-".into(),
        })?;
    let (name, tail) = match rest.split_once("_v") {
        Some((n, t)) => (n, Some(t)),
        None => (rest, None),
    };
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(NameError::NoProviderName(file_name.to_owned()));
    }
    let (version, api) = match tail {
        None => (None, None),
        Some(t) => {
            let (v, api) = match t.split_once("_x") {
                Some((v, a)) if !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit()) => {
                    (v, Some(a.to_owned()))
                }
                Some(_) => return Err(NameError::NoTerraformApi(file_name.to_owned())),
                None => (t, None),
            };
            let parsed = parse_version(v)?;
            if !parsed.pre.is_empty() {
                return Err(NameError::NotRelease(v.to_owned()));
            }
            (Some(parsed), api)
        }
    };
    Ok(TerraformName {
        name: name.to_owned(),
        version,
        api,
    })
}

/// A version constraint: comparisons joined by commas, all must hold
/// (`>=1.0.0, <2.0.0`; operators `=`, `!=`, `>`, `>=`, `<`, `<=`, and
/// `~>` for "this minor/patch series"). A `-dev` version is compared as
/// its release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint(Vec<(String, Version, usize)>);

impl Constraint {
    /// Parses a constraint.
    pub fn parse(s: &str) -> Result<Constraint, ConstraintError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            let op_len = part
                .find(|c: char| c.is_ascii_digit() || c == 'v')
                .ok_or_else(|| ConstraintError::NoVersion(part.to_owned()))?;
            let (op, v) = (part[..op_len].trim(), part[op_len..].trim());
            let op = if op.is_empty() { "=" } else { op };
            if !["=", "!=", ">", ">=", "<", "<=", "~>"].contains(&op) {
                return Err(ConstraintError::Operator(op.to_owned()));
            }
            let v = v.strip_prefix('v').unwrap_or(v);
            let parts = v.split('.').count();
            let padded = match parts {
                1 => format!("{v}.0.0"),
                2 => format!("{v}.0"),
                _ => v.to_owned(),
            };
            let version = Version::parse(&padded).map_err(|source| ConstraintError::Version {
                version: v.to_owned(),
                source,
            })?;
            out.push((op.to_owned(), version, parts));
        }
        Ok(Constraint(out))
    }

    /// True if `v` satisfies every comparison.
    pub fn matches(&self, v: &Version) -> bool {
        let v = Version::new(v.major, v.minor, v.patch);
        self.0.iter().all(|(op, c, parts)| match op.as_str() {
            "=" => v == *c,
            "!=" => v != *c,
            ">" => v > *c,
            ">=" => v >= *c,
            "<" => v < *c,
            "<=" => v <= *c,
            // ~> 1.2 allows 1.x from 1.2; ~> 1.2.3 allows 1.2.x from 1.2.3.
            _ => {
                v >= *c
                    && if *parts >= 3 {
                        v.major == c.major && v.minor == c.minor
                    } else {
                        v.major == c.major
                    }
            }
        })
    }
}

/// One accepted plugin version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// Its version, as in the name (without `v`).
    pub version: String,
    /// API version (without `x`).
    pub api_version: String,
    /// The file.
    pub path: String,
    /// sha256 of the file when it was accepted.
    pub sha256: String,
    /// Unix time of acceptance.
    pub loaded_at: u64,
    /// A local build (Terraform's provider beside its host program): active
    /// whatever its version and the constraint.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local: bool,
}

/// `<vardir>/plugins.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    /// Name → accepted versions.
    pub plugins: BTreeMap<String, Vec<Registered>>,
}

impl Registry {
    /// Reads the registry; a missing file is an empty registry, a corrupt
    /// one is reported and replaced.
    pub fn load(vardir: &Path) -> Registry {
        let path = vardir.join("plugins.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "plugin registry unreadable, starting afresh");
                Registry::default()
            }),
            Err(_) => Registry::default(),
        }
    }

    /// Writes the registry atomically and durably (`write_atomic`, with
    /// `fsync`): it records plugin versions accepted after their describe
    /// handshake, and a registry lost in a crash would leave a committed
    /// plugin unregistered until its file changes again. Written only when
    /// it changed (a load, or a plugin file gone), never by a run that
    /// changes nothing.
    pub fn save(&self, vardir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(vardir)?;
        pluginsync_common::fsutil::write_atomic(
            &vardir.join("plugins.json"),
            &serde_json::to_vec_pretty(self)?,
            0o600,
        )
    }

    /// Adds (or replaces, by path) an accepted version.
    pub fn add(&mut self, name: &str, entry: Registered) {
        let versions = self.plugins.entry(name.to_owned()).or_default();
        versions.retain(|r| r.path != entry.path);
        versions.push(entry);
        versions.sort_by_key(|r| version_of(&r.version));
    }

    /// Drops versions whose file is gone; returns `(name, version)` of each.
    pub fn prune_missing(&mut self) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        for (name, versions) in self.plugins.iter_mut() {
            versions.retain(|r| {
                let keep = Path::new(&r.path).is_file();
                if !keep {
                    gone.push((name.clone(), r.version.clone()));
                }
                keep
            });
        }
        self.plugins.retain(|_, v| !v.is_empty());
        gone
    }

    /// The active version of `name`: the highest satisfying `constraint`.
    pub fn active(&self, name: &str, constraint: Option<&Constraint>) -> Option<&Registered> {
        let versions = self.plugins.get(name)?;
        if let Some(local) = versions.iter().find(|r| r.local) {
            return Some(local);
        }
        versions
            .iter()
            .filter(|r| constraint.is_none_or(|c| c.matches(&version_of(&r.version))))
            .max_by(|a, b| version_of(&a.version).cmp(&version_of(&b.version)))
    }
}

fn version_of(s: &str) -> Version {
    Version::parse(s).unwrap_or(Version::new(0, 0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "pluginsync-plugin";

    #[test]
    fn names() {
        let n = parse_name("pluginsync-plugin-hello_v1.0.1_x1.0_linux_amd64", P).unwrap();
        assert_eq!(
            (
                n.name.as_str(),
                n.version.to_string().as_str(),
                n.api.as_str(),
                n.os.as_str(),
                n.arch.as_str()
            ),
            ("hello", "1.0.1", "1.0", "linux", "amd64")
        );
        let n = parse_name("pluginsync-plugin-my_tool_v2.3.4-dev_x5.0_darwin_arm64", P).unwrap();
        assert_eq!(
            (n.name.as_str(), n.version.to_string().as_str()),
            ("my_tool", "2.3.4-dev")
        );
        for bad in [
            "pluginsync-plugin-hello_v1.00.01_x1.0_linux_amd64",
            "pluginsync-plugin-hello_v1.0.1-beta_x1.0_linux_amd64",
            "pluginsync-plugin-hello_v1.0_x1.0_linux_amd64",
            "pluginsync-plugin-hello_1.0.1_x1.0_linux_amd64",
            "pluginsync-plugin-hello_v1.0.1_1.0_linux_amd64",
            "other-hello_v1.0.1_x1.0_linux_amd64",
            "pluginsync-plugin-hello_v1.0.1_x1.0_linux",
            "pluginsync-plugin-hello_v1.0.1+build_x1.0_linux_amd64",
        ] {
            assert!(parse_name(bad, P).is_err(), "{bad}");
        }
    }

    #[test]
    fn terraform_names() {
        let n = parse_terraform("terraform-provider-aws_v2.10.0_x4").unwrap();
        assert_eq!(
            (n.name.as_str(), n.version.unwrap().to_string(), n.api),
            ("aws", "2.10.0".to_owned(), Some("4".to_owned()))
        );
        let n = parse_terraform("terraform-provider-my-cloud").unwrap();
        assert_eq!((n.name.as_str(), n.version), ("my-cloud", None));
        for bad in [
            "terraform-provider-aws_v2.10",
            "terraform-provider-aws_v02.1.0",
            "terraform-provider-aws_v2.1.0-dev",
            "terraform-provider-aws_v2.1.0_xfour",
            "terraform-provider-",
            "terraform-aws_v1.0.0",
        ] {
            assert!(parse_terraform(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn version_order_and_constraints() {
        let v = |s: &str| parse_version(s).unwrap();
        assert!(v("1.0.0") < v("1.0.1-dev") && v("1.0.1-dev") < v("1.0.1"));
        let c = Constraint::parse(">= 1.0.0, < 2.0.0").unwrap();
        assert!(c.matches(&v("1.5.0")) && c.matches(&v("1.0.1-dev")) && !c.matches(&v("2.0.0")));
        let p = Constraint::parse("~> 1.2").unwrap();
        assert!(p.matches(&v("1.9.0")) && !p.matches(&v("1.1.0")) && !p.matches(&v("2.0.0")));
        let p = Constraint::parse("~> 1.2.3").unwrap();
        assert!(p.matches(&v("1.2.9")) && !p.matches(&v("1.3.0")));
        assert!(Constraint::parse("=> 1").is_err());
        assert!(Constraint::parse(">= x").is_err());
    }

    #[test]
    fn registry_keeps_all_and_selects_the_highest() {
        let d = tempfile::tempdir().unwrap();
        let mut r = Registry::default();
        let add = |r: &mut Registry, ver: &str| {
            let path = d.path().join(format!("hello_{ver}"));
            std::fs::write(&path, "x").unwrap();
            r.add(
                "hello",
                Registered {
                    version: ver.into(),
                    api_version: "1.0".into(),
                    path: path.display().to_string(),
                    sha256: String::new(),
                    loaded_at: 0,
                    local: false,
                },
            );
            path
        };
        add(&mut r, "1.0.0");
        let dev = add(&mut r, "1.0.1-dev");
        assert_eq!(r.active("hello", None).unwrap().version, "1.0.1-dev");
        let rel = add(&mut r, "1.0.1");
        assert_eq!(
            r.active("hello", None).unwrap().version,
            "1.0.1",
            "-dev loses to its release"
        );
        let c = Constraint::parse("< 1.0.1").unwrap();
        assert_eq!(r.active("hello", Some(&c)).unwrap().version, "1.0.0");
        std::fs::remove_file(rel).unwrap();
        std::fs::remove_file(dev).unwrap();
        assert_eq!(r.prune_missing().len(), 2);
        assert_eq!(r.active("hello", None).unwrap().version, "1.0.0");
        r.save(d.path()).unwrap();
        assert_eq!(Registry::load(d.path()), r);
    }
}
