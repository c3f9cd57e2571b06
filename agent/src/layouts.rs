//! What a `describe` plugin is, from where it lies: each layout of the four
//! plugin systems pluginsync learned from (docs/loading.md#plugin-layouts) turns a
//! file's path under its loader root into an identity, maybe a version and
//! API version, and the checks that system makes on names.
//!
//! The invariant: a file is either one plugin with one identity, or a
//! reason — `Skip` where the layout's system would not look at the file at
//! all (another host's `<os>_<arch>`, a data file beside a plugin), an
//! error where it would look and refuse (a non-canonical version, a plugin
//! type directory it does not know). Launching and the handshake are
//! `load.rs`'s; the names of Packer and Terraform are parsed in
//! `plugins.rs`.

use semver::Version;

use crate::loaders::Layout;
use crate::plugins::{self, NameError, host_arch, host_os};

/// Go's operating system names, to tell an `<os>_<arch>` directory.
const GO_OSES: &[&str] = &[
    "linux", "darwin", "windows", "freebsd", "openbsd", "netbsd", "solaris", "illumos", "aix",
];

/// A plugin as its path names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    /// The registry key (`[load.constraints]` uses it too).
    pub id: String,
    /// The version the path gives, if it gives one.
    pub version: Option<Version>,
    /// The API version the path gives, if it gives one (without `x`).
    pub api: Option<String>,
    /// A Terraform local build: active over every release.
    pub local: bool,
    /// Celerity's plugin type directory (`providers` or `transformers`).
    pub celerity_type: Option<&'static str>,
    /// What to show as the version when nothing else gives one (kustomize:
    /// the apiVersion's version, e.g. `v1`).
    pub fallback_version: Option<String>,
}

impl Identified {
    fn new(id: String, version: Option<Version>, api: Option<String>) -> Identified {
        Identified {
            id,
            version,
            api,
            local: false,
            celerity_type: None,
            fallback_version: None,
        }
    }
}

/// Why a layout refuses a file its system would look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// An empty path.
    #[error("no file name")]
    NoFileName,
    /// The file name or version breaks the layout's naming rules.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Terraform: an unversioned provider outside `host_dir`.
    #[error("an unversioned provider is a local build and belongs in host_dir")]
    LocalOutsideHostDir,
    /// Celerity: a type directory other than `providers`/`transformers`.
    #[error("plugin type directory '{0}' is neither 'providers' nor 'transformers'")]
    CelerityType(String),
    /// Celerity: a registry host without a `.`.
    #[error(
        "'{0}' is not a registry host (a host name contains a '.'; without one the ID is <namespace>/<name>)"
    )]
    RegistryHost(String),
    /// Celerity: a namespace or name with other characters.
    #[error("'{0}' is not a namespace or plugin name (letters, digits, '-', '_')")]
    CelerityName(String),
    /// Celerity: a `v`-prefixed version directory.
    #[error("version directory '{0}' is not canonical (MAJOR.MINOR.PATCH, no 'v')")]
    VersionDir(String),
    /// kustomize: not a Kubernetes API version.
    #[error("'{0}' is not a Kubernetes API version (v1, v2beta1, v1alpha2)")]
    ApiVersion(String),
    /// kustomize: not an API group.
    #[error("'{0}' is not an API group (a lowercase DNS name such as someteam.example.com)")]
    ApiGroup(String),
    /// kustomize: not a kind.
    #[error("'{0}' is not a kind (letters and digits)")]
    Kind(String),
}

/// What the layout makes of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A plugin, to be checked and launched.
    Plugin(Identified),
    /// Not a plugin as that system sees it; why.
    Skip(String),
}

/// Identifies the file at `within` (its path components under its loader
/// root; the last is the file name). `prefix` is Packer's name prefix;
/// `host_dir_holds` says whether the file lies in Terraform's `host_dir`.
pub fn identify(
    layout: Layout,
    within: &[&str],
    prefix: &str,
    host_dir_holds: bool,
) -> Result<Found, LayoutError> {
    let Some((file_name, dirs)) = within.split_last() else {
        return Err(LayoutError::NoFileName);
    };
    match layout {
        Layout::Packer => packer(file_name, prefix),
        Layout::Terraform => terraform(file_name, dirs, host_dir_holds),
        Layout::Celerity => celerity(file_name, dirs),
        Layout::Kustomize => kustomize(file_name, dirs),
    }
}

/// Packer lists only files whose name ends in this host's `_<os>_<arch>`
/// (the seed's "Plugin binary naming convention"), so a plugin for another
/// host is skipped, and a malformed name is refused.
fn packer(file_name: &str, prefix: &str) -> Result<Found, LayoutError> {
    let name = plugins::parse_name(file_name, prefix)?;
    if name.os != host_os() || name.arch != host_arch() {
        return Ok(Found::Skip(format!(
            "built for {}/{}, this host is {}/{}",
            name.os,
            name.arch,
            host_os(),
            host_arch()
        )));
    }
    Ok(Found::Plugin(Identified::new(
        name.name,
        Some(name.version),
        Some(name.api),
    )))
}

/// Terraform looks only in its own `<os>_<arch>` directory; an unversioned
/// provider is a local build and belongs beside the host program.
fn terraform(file_name: &str, dirs: &[&str], host_dir_holds: bool) -> Result<Found, LayoutError> {
    let name = plugins::parse_terraform(file_name)?;
    if let Some((os, arch)) = dirs
        .last()
        .and_then(|d| d.split_once('_'))
        .filter(|(os, _)| GO_OSES.contains(os))
        && (os != host_os() || arch != host_arch())
    {
        return Ok(Found::Skip(format!(
            "built for {os}/{arch}, this host is {}/{}",
            host_os(),
            host_arch()
        )));
    }
    let local = name.version.is_none();
    if local && !host_dir_holds {
        return Err(LayoutError::LocalOutsideHostDir);
    }
    let mut id = Identified::new(name.name, name.version, name.api);
    id.local = local;
    Ok(Found::Plugin(id))
}

/// Celerity's Deploy Engine (its `discover.go`): a file named `plugin` at
/// `<type>/<namespace>/<name>/<version>/plugin` or
/// `<type>/<host>/<namespace>/<name>/<version>/plugin`; the depth tells
/// whether a host is there, and the ID is everything between the type and
/// the version. Other files are not plugins. We add the checks the
/// documentation states: the type is `providers` or `transformers`, a
/// registry host is a host name (it contains a `.`), and the version
/// directory is a canonical semver version.
fn celerity(file_name: &str, dirs: &[&str]) -> Result<Found, LayoutError> {
    if *file_name != *"plugin" {
        return Ok(Found::Skip(
            "not a Celerity plugin executable (those are named 'plugin')".into(),
        ));
    }
    let (kind, parts) = match dirs {
        [kind, rest @ ..] if rest.len() == 3 || rest.len() == 4 => (*kind, rest),
        _ => {
            return Ok(Found::Skip(
                "not at <type>/[<host>/]<namespace>/<name>/<version>/plugin".into(),
            ));
        }
    };
    let celerity_type = match kind {
        "providers" => "providers",
        "transformers" => "transformers",
        other => return Err(LayoutError::CelerityType(other.to_owned())),
    };
    let (id_parts, version) = parts.split_at(parts.len() - 1);
    if id_parts.len() == 3 && !id_parts[0].contains('.') {
        return Err(LayoutError::RegistryHost(id_parts[0].to_owned()));
    }
    let (ns, name) = (id_parts[id_parts.len() - 2], id_parts[id_parts.len() - 1]);
    for part in [ns, name] {
        if !part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(LayoutError::CelerityName(part.to_owned()));
        }
    }
    let version = version[0];
    if version.starts_with('v') {
        return Err(LayoutError::VersionDir(version.to_owned()));
    }
    let mut id = Identified::new(
        id_parts.join("/"),
        Some(plugins::parse_version(version)?),
        None,
    );
    id.celerity_type = Some(celerity_type);
    Ok(Found::Plugin(id))
}

/// kustomize: `${apiVersion}/LOWERCASE(${kind})/${kind}`, where
/// `apiVersion` is `<group>/<version>` (two directories) or, for the core
/// group, `<version>` alone. kustomize looks up exactly the apiVersion and
/// kind a configuration names and never chooses among versions, so the
/// identity is `<apiVersion>/<Kind>` and carries no version of its own.
/// Other files in a plugin's directory (its source, tests, data, a Go
/// `.so`) are not exec plugins.
fn kustomize(file_name: &str, dirs: &[&str]) -> Result<Found, LayoutError> {
    let Some((kind_dir, api_dirs)) = dirs.split_last() else {
        return Ok(Found::Skip(
            "not at <apiVersion>/<lowercase kind>/<Kind>".into(),
        ));
    };
    if *kind_dir != file_name.to_lowercase() {
        return Ok(Found::Skip(format!(
            "not the exec plugin of '{kind_dir}' (that is the file whose lowercase name is the directory's)"
        )));
    }
    let (group, version) = match api_dirs {
        [version] => (None, *version),
        [group, version] => (Some(*group), *version),
        _ => {
            return Ok(Found::Skip(
                "not at <apiVersion>/<lowercase kind>/<Kind> (apiVersion is <group>/<version> or <version>)".into(),
            ));
        }
    };
    if !is_api_version(version) {
        return Err(LayoutError::ApiVersion(version.to_owned()));
    }
    if let Some(g) = group
        && (g.is_empty()
            || g.starts_with(['.', '-'])
            || !g
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'))
    {
        return Err(LayoutError::ApiGroup(g.to_owned()));
    }
    if !file_name.starts_with(|c: char| c.is_ascii_alphabetic())
        || !file_name.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(LayoutError::Kind(file_name.to_owned()));
    }
    let api_version = match group {
        Some(g) => format!("{g}/{version}"),
        None => version.to_owned(),
    };
    let mut id = Identified::new(format!("{api_version}/{file_name}"), None, None);
    id.fallback_version = Some(version.to_owned());
    Ok(Found::Plugin(id))
}

/// `v<N>`, `v<N>alpha<M>` or `v<N>beta<M>`, numbers without leading zeros.
fn is_api_version(s: &str) -> bool {
    let number =
        |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0');
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (major, tail) = rest.split_at(end);
    number(major)
        && (tail.is_empty()
            || ["alpha", "beta"]
                .iter()
                .any(|p| tail.strip_prefix(p).is_some_and(number)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(layout: Layout, path: &str) -> Result<Found, LayoutError> {
        let parts: Vec<&str> = path.split('/').collect();
        identify(layout, &parts, "pluginsync-plugin", false)
    }

    fn plugin(layout: Layout, path: &str) -> Identified {
        match id(layout, path) {
            Ok(Found::Plugin(p)) => p,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn celerity_ids_versions_and_types() {
        let p = plugin(Layout::Celerity, "providers/celerity/aws/1.2.0/plugin");
        assert_eq!(
            (
                p.id.as_str(),
                p.version.unwrap().to_string(),
                p.celerity_type
            ),
            ("celerity/aws", "1.2.0".to_owned(), Some("providers"))
        );
        let p = plugin(
            Layout::Celerity,
            "transformers/registry.example.com/celerity/azure/2.0.0/plugin",
        );
        assert_eq!(p.id, "registry.example.com/celerity/azure");
        assert_eq!(p.celerity_type, Some("transformers"));
        for skipped in [
            "providers/celerity/aws/1.2.0/README.md",
            "providers/aws/1.2.0/plugin",
            "providers/a.b/c/d/e/1.0.0/plugin",
        ] {
            assert!(
                matches!(id(Layout::Celerity, skipped), Ok(Found::Skip(_))),
                "{skipped}"
            );
        }
        for refused in [
            "widgets/celerity/aws/1.0.0/plugin",
            "providers/celerity/aws/1.00.0/plugin",
            "providers/celerity/aws/v1.0.0/plugin",
            "providers/celerity/aws/1.0/plugin",
            "providers/notahost/celerity/aws/1.0.0/plugin",
        ] {
            assert!(id(Layout::Celerity, refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn kustomize_identity_is_api_version_and_kind() {
        let p = plugin(
            Layout::Kustomize,
            "someteam.example.com/v1/chartinflator/ChartInflator",
        );
        assert_eq!(p.id, "someteam.example.com/v1/ChartInflator");
        assert_eq!(
            (p.version, p.fallback_version.as_deref()),
            (None, Some("v1"))
        );
        let p = plugin(Layout::Kustomize, "v2beta1/sedtransformer/SedTransformer");
        assert_eq!(p.id, "v2beta1/SedTransformer");
        for skipped in [
            "someteam.example.com/v1/chartinflator/ChartInflator.so",
            "someteam.example.com/v1/chartinflator/ChartInflator_test.go",
            "a/b/someteam.example.com/v1/chartinflator/ChartInflator",
            "ChartInflator",
        ] {
            assert!(
                matches!(id(Layout::Kustomize, skipped), Ok(Found::Skip(_))),
                "{skipped}"
            );
        }
        for refused in [
            "someteam.example.com/1/chartinflator/ChartInflator",
            "someteam.example.com/v01/chartinflator/ChartInflator",
            "someteam.example.com/v1gamma1/chartinflator/ChartInflator",
            "SomeTeam.example.com/v1/chartinflator/ChartInflator",
        ] {
            assert!(id(Layout::Kustomize, refused).is_err(), "{refused}");
        }
        assert!(is_api_version("v1") && is_api_version("v10alpha3"));
        assert!(!is_api_version("v1beta") && !is_api_version("v") && !is_api_version("v0"));
    }

    #[test]
    fn packer_and_terraform_skip_other_hosts() {
        let other = if host_os() == "linux" {
            "darwin"
        } else {
            "linux"
        };
        let name = format!("pluginsync-plugin-x_v1.0.0_x1.0_{other}_{}", host_arch());
        assert!(matches!(id(Layout::Packer, &name), Ok(Found::Skip(_))));
        let mine = format!(
            "pluginsync-plugin-x_v1.0.0_x1.0_{}_{}",
            host_os(),
            host_arch()
        );
        assert_eq!(plugin(Layout::Packer, &mine).id, "x");
        let foreign = format!("{other}_{}/terraform-provider-aws_v1.0.0", host_arch());
        assert!(matches!(
            id(Layout::Terraform, &foreign),
            Ok(Found::Skip(_))
        ));
        assert!(id(Layout::Terraform, "bin/terraform-provider-aws").is_err());
        let local = identify(
            Layout::Terraform,
            &["bin", "terraform-provider-aws"],
            "",
            true,
        );
        assert!(matches!(
            local,
            Ok(Found::Plugin(Identified { local: true, .. }))
        ));
    }
}
