//! A `kind = "describe"` load: is this file a plugin, and which
//! (docs/loading.md#plugin-layouts)? The layout names it from its path
//! ([`layouts::identify`]) under the loader's roots (an earlier root
//! shadows the same identity in a later one); a Celerity ID must not be
//! both a provider and a transformer; the file must be executable; a
//! Packer or Terraform `<file>_SHA256SUM` must match its sha256; and
//! `<file> describe` (the one handshake of every layout, up to `attempts`
//! launches each with its deadline) must print JSON whose `version`,
//! `api_version` and `id` agree with the path. Accepted plugins go to the
//! registry. Which file goes to which loader is `loaders.rs`'s; the run of
//! the loaders, `load.rs`'s.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use pluginsync_common::relpath::RelPath;
use semver::Version;
use serde::Deserialize;

use crate::launch::{AttemptsError, run_attempts};
use crate::layouts::{self, Found, Identified, LayoutError};
use crate::loaders::{Layout, LoaderConfig, LoaderTable};
use crate::plugins::{self, NameError, Registered, Registry};

/// Why a file its layout names as a plugin is not accepted: the line its
/// failed load reports.
#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    /// The file name is not UTF-8.
    #[error("file name is not UTF-8")]
    FileNameNotUtf8,
    /// The file is not under the root it was found in.
    #[error("not under its root")]
    NotUnderRoot,
    /// A component of the path is not UTF-8.
    #[error("path is not UTF-8")]
    PathNotUtf8,
    /// The layout refuses the path.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Celerity: the ID is a provider's and a transformer's.
    #[error("plugin ID '{0}' is both a provider and a transformer (IDs are unique across both)")]
    IdClash(String),
    /// The file cannot be stat'ed.
    #[error("cannot stat: {0}")]
    Stat(std::io::Error),
    /// No exec bit.
    #[error("not executable (is source_permissions = \"ignore\"?)")]
    NotExecutable,
    /// The file cannot be read for its sha256.
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    /// The `_SHA256SUM` sidecar names another digest.
    #[error("sha256 {sha256} does not match {file_name}_SHA256SUM ({want})")]
    Sidecar {
        /// The file's sha256.
        sha256: String,
        /// The file's name.
        file_name: String,
        /// The sidecar's first word.
        want: String,
    },
    /// The `_SHA256SUM` sidecar exists but cannot be read.
    #[error("cannot read {file_name}_SHA256SUM: {source}")]
    SidecarRead {
        /// The file's name.
        file_name: String,
        /// Why.
        source: std::io::Error,
    },
    /// The `describe` launch failed.
    #[error("describe: {0}")]
    Launch(AttemptsError),
    /// `describe` printed no JSON of the expected shape.
    #[error("describe did not print the expected JSON: {0}")]
    Json(serde_json::Error),
    /// `describe` names another identity.
    #[error("describe says id '{said}' but the path says '{path}'")]
    Id {
        /// What describe says.
        said: String,
        /// What the path says.
        path: String,
    },
    /// `describe`'s version is not a plugin version.
    #[error("describe: {0}")]
    Version(NameError),
    /// `describe`'s version is not the path's.
    #[error("describe says version {said} but the name says {named}")]
    VersionMismatch {
        /// What describe says, as written.
        said: String,
        /// What the path says.
        named: Version,
    },
    /// `describe`'s API version is not the path's.
    #[error("describe says api_version x{said} but the name says x{named}")]
    ApiMismatch {
        /// What describe says (without `x`).
        said: String,
        /// What the path says.
        named: String,
    },
}

/// One changed file for a `describe` loader.
pub struct Candidate<'a> {
    /// The loader it matched.
    pub loader: &'a LoaderConfig,
    /// The destination directory it lies in.
    pub root: &'a Path,
    /// Its path relative to `root`.
    pub rel: &'a RelPath,
    /// Its absolute path.
    pub abs: &'a Path,
    /// Packer's name prefix (`[load] plugin_prefix`).
    pub prefix: &'a str,
    /// The environment of the `describe` child.
    pub env: &'a BTreeMap<String, String>,
}

/// Where a candidate lies among its loader's roots.
struct Placed {
    /// Its loader's root directories (empty: the destination is the one
    /// root).
    roots: Vec<PathBuf>,
    /// The index of the root it lies in.
    root: usize,
    /// That root's directory.
    base: PathBuf,
}

impl Placed {
    /// The index of the root `p` lies in.
    fn root_of(&self, p: &Path) -> Option<usize> {
        self.roots.iter().position(|r| p.starts_with(r))
    }
}

/// Describes `file`: `Ok(Some(why))` when it is skipped (outside the
/// roots, shadowed, not a plugin as the layout's system sees it),
/// `Ok(None)` when it was registered. Registry entries a Celerity ID clash
/// takes out are pushed to `evicted`; `table` gives the constraint the
/// active version is chosen by.
pub async fn describe(
    file: &Candidate<'_>,
    table: &LoaderTable,
    registry: &mut Registry,
    evicted: &mut Vec<String>,
) -> Result<Option<String>, DescribeError> {
    let loader = file.loader;
    let file_name = file
        .abs
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or(DescribeError::FileNameNotUtf8)?;
    let Some(placed) = place(file) else {
        return Ok(Some("outside the loader's roots".into()));
    };
    let ident = match identify(file, &placed)? {
        Found::Skip(why) => return Ok(Some(why)),
        Found::Plugin(p) => p,
    };
    if let Some(why) = shadowed(loader, &placed, &ident.id, registry) {
        return Ok(Some(why));
    }
    if let Some(mine) = ident.celerity_type {
        celerity_clash(&placed.base, mine, &ident.id, registry, evicted)?;
    }
    let sha256 = check_file(file.abs, file_name, loader.layout)?;
    let (version, api_version) = version(file, &ident).await?;
    if !placed.roots.is_empty()
        && let Some(versions) = registry.plugins.get_mut(&ident.id)
    {
        // This root wins over the later ones that held the identity.
        versions.retain(|r| {
            placed
                .root_of(Path::new(&r.path))
                .is_none_or(|i| i <= placed.root)
        });
    }
    registry.add(
        &ident.id,
        Registered {
            version: version.clone(),
            api_version,
            path: file.abs.to_string_lossy().into_owned(),
            sha256,
            loaded_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            local: ident.local,
        },
    );
    let active = registry
        .active(&ident.id, table.constraint(&ident.id))
        .map_or_else(|| "none".to_owned(), |r| r.version.to_string());
    tracing::info!(plugin = %ident.id, version = %version, active = %active, "plugin registered");
    Ok(None)
}

/// The root `file` lies in, or `None` when it lies in none of them.
fn place(file: &Candidate<'_>) -> Option<Placed> {
    let roots: Vec<PathBuf> = file
        .loader
        .roots
        .iter()
        .map(|r| file.root.join(r))
        .collect();
    if roots.is_empty() {
        return Some(Placed {
            roots,
            root: 0,
            base: file.root.to_path_buf(),
        });
    }
    let root = roots.iter().position(|r| file.abs.starts_with(r))?;
    let base = roots[root].clone();
    Some(Placed { roots, root, base })
}

/// What the layout makes of `file`'s path under its root.
fn identify(file: &Candidate<'_>, placed: &Placed) -> Result<Found, DescribeError> {
    let within: Vec<&str> = file
        .abs
        .strip_prefix(&placed.base)
        .map_err(|_| DescribeError::NotUnderRoot)?
        .iter()
        .map(|c| c.to_str().ok_or(DescribeError::PathNotUtf8))
        .collect::<Result<_, _>>()?;
    let parent = file.rel.parent().unwrap_or_else(RelPath::root);
    let host_dir_holds = file
        .loader
        .host_dir
        .as_deref()
        .map(|d| d.trim_end_matches('/'))
        == Some(parent.as_str());
    Ok(layouts::identify(
        file.loader.layout,
        &within,
        file.prefix,
        host_dir_holds,
    )?)
}

/// Why `id` is skipped when an earlier root holds it.
fn shadowed(
    loader: &LoaderConfig,
    placed: &Placed,
    id: &str,
    registry: &Registry,
) -> Option<String> {
    if placed.roots.is_empty() {
        return None;
    }
    let earlier = registry
        .plugins
        .get(id)
        .into_iter()
        .flatten()
        .filter_map(|r| placed.root_of(Path::new(&r.path)))
        .find(|&i| i < placed.root)?;
    Some(format!(
        "'{id}' is in an earlier root ({}), which wins",
        loader.roots[earlier]
    ))
}

/// Celerity: "a transformer plugin and a provider plugin must not have the
/// same ID". Checked on disk, so it holds whichever of the two arrived
/// first: both are failed, neither is active (the other's registry
/// entries go to `evicted`).
fn celerity_clash(
    base: &Path,
    mine: &str,
    id: &str,
    registry: &mut Registry,
    evicted: &mut Vec<String>,
) -> Result<(), DescribeError> {
    let other = if mine == "providers" {
        "transformers"
    } else {
        "providers"
    };
    let other_dir = base.join(other).join(id);
    if !other_dir.is_dir() {
        return Ok(());
    }
    if let Some(versions) = registry.plugins.get_mut(id) {
        versions.retain(|r| {
            let clashes = Path::new(&r.path).starts_with(&other_dir);
            if clashes {
                evicted.push(r.path.clone());
            }
            !clashes
        });
    }
    registry.plugins.retain(|_, v| !v.is_empty());
    Err(DescribeError::IdClash(id.to_owned()))
}

/// The exec bit, then the sha256 (returned) and, for Packer and Terraform,
/// the sidecar.
fn check_file(abs: &Path, file_name: &str, layout: Layout) -> Result<String, DescribeError> {
    let md = std::fs::metadata(abs).map_err(DescribeError::Stat)?;
    if md.permissions().mode() & 0o111 == 0 {
        return Err(DescribeError::NotExecutable);
    }
    let sha256 = sha256_of(abs)?;
    if matches!(layout, Layout::Packer | Layout::Terraform) {
        check_sidecar(abs, file_name, &sha256)?;
    }
    Ok(sha256)
}

/// The version and API version to register: the handshake's, checked
/// against the path, or without the handshake the path's own.
async fn version(
    file: &Candidate<'_>,
    ident: &Identified,
) -> Result<(String, String), DescribeError> {
    let loader = file.loader;
    if !loader.handshake() {
        return Ok((
            ident
                .version
                .as_ref()
                .map(Version::to_string)
                .or(ident.fallback_version.clone())
                .unwrap_or_default(),
            ident.api.clone().unwrap_or_default(),
        ));
    }
    let argv = vec![
        file.abs.to_string_lossy().into_owned(),
        "describe".to_owned(),
    ];
    let output = run_attempts(&argv, file.env, None, loader.timeout, loader.attempts())
        .await
        .map_err(DescribeError::Launch)?;
    let (v, a) = handshake(ident, &output.stdout)?;
    Ok((v.to_string(), a))
}

/// The sha256 of a file, streamed.
fn sha256_of(abs: &Path) -> Result<String, DescribeError> {
    let file = std::fs::File::open(abs).map_err(DescribeError::Read)?;
    let digest = pluginsync_common::checksum::ChecksumType::Sha256
        .digest_reader(std::io::BufReader::new(file))
        .map_err(DescribeError::Read)?;
    Ok(digest["{sha256}".len()..].to_owned())
}

/// Packer's `<file>_SHA256SUM`: if present, its first word must be the
/// file's sha256.
fn check_sidecar(abs: &Path, file_name: &str, sha256: &str) -> Result<(), DescribeError> {
    let sidecar = abs.with_file_name(format!("{file_name}_SHA256SUM"));
    match std::fs::read_to_string(&sidecar) {
        Ok(text) => {
            let want = text
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if want != sha256 {
                return Err(DescribeError::Sidecar {
                    sha256: sha256.to_owned(),
                    file_name: file_name.to_owned(),
                    want,
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DescribeError::SidecarRead {
            file_name: file_name.to_owned(),
            source,
        }),
    }
}

/// The `describe` answer against what the path says: `version` (required)
/// must equal the path's version if it has one, `api_version` the path's
/// API version if it has one, and `id`, if given, the path's identity.
/// Returns the version and API version to register.
fn handshake(ident: &Identified, stdout: &[u8]) -> Result<(Version, String), DescribeError> {
    #[derive(Deserialize)]
    struct Described {
        version: String,
        #[serde(default)]
        api_version: Option<String>,
        #[serde(default)]
        id: Option<String>,
    }
    let d: Described = serde_json::from_slice(stdout).map_err(DescribeError::Json)?;
    if let Some(said) = &d.id
        && *said != ident.id
    {
        return Err(DescribeError::Id {
            said: said.clone(),
            path: ident.id.clone(),
        });
    }
    let described = plugins::parse_version(&d.version).map_err(DescribeError::Version)?;
    let version = match &ident.version {
        Some(named) if *named != described => {
            return Err(DescribeError::VersionMismatch {
                said: d.version,
                named: named.clone(),
            });
        }
        Some(named) => named.clone(),
        None => described,
    };
    let said = d
        .api_version
        .as_deref()
        .map(|a| a.strip_prefix('x').unwrap_or(a).to_owned());
    let api = match (&ident.api, said) {
        (Some(named), Some(said)) if said != *named => {
            return Err(DescribeError::ApiMismatch {
                said,
                named: named.clone(),
            });
        }
        (Some(named), _) => named.clone(),
        (None, said) => said.unwrap_or_default(),
    };
    Ok((version, api))
}
