//! `pluginsync-master bundle ENVIRONMENT [--generation ID] --out FILE`:
//! one generation as an offline bundle (docs/protocol.md §7.7), for
//! air-gapped sites and for seeding new nodes.
//!
//! With `--generation` (an id or a unique prefix of one), a generation the
//! store keeps (`[generations] dir`), even when its tree is gone. With
//! `--certname`, the generation placement serves that node now. Without
//! either, the generation everyone is on: what placement serves a node
//! outside every open wave (docs/rollouts.md#placement), so a bundle never
//! carries a generation still in its waves past them. Placement is asked
//! through its pure decision (`placement::decide`) on the rollout state
//! the masters left (`rollout_state`). When the store keeps none for the
//! environment (no `dir` set, or nothing published yet), the environment
//! is indexed and hashed as the master would, and the bundle's
//! publication time is the Unix epoch: the generation was never published. The file is written
//! beside `--out` under a temporary name, synced and renamed, so a reader
//! never sees half a bundle; the same generation gives the same bytes
//! (`common/src/bundle.rs`).
//!
//! With `[trust] metadata`, the bundle carries the TUF metadata signing
//! its generation (format 2, docs/trust.md#signed-bundles): every
//! `N.root.json` of the directory (a node follows the chain from its own),
//! `timestamp.json`, and the snapshot and targets versions they name
//! ([`trust_files`]).

use std::io::BufWriter;
use std::path::{Path, PathBuf};

use pluginsync_common::bundle::{BundleError, BundleHeader, BundleWriter, is_metadata_name};
use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, Manifest, ManifestError};

use crate::config::MasterConfig;
use crate::environments;
use crate::generations::{Candidate, Generations, Kept, StoreError};
use crate::index::EnvIndex;
use crate::placement::{Facts, Placement, decide};
use crate::rollout::{Command, Policy, Rollouts, status_of};
use crate::walk::FileSig;

/// The publication time of a bundle made from a tree no master published.
pub const UNPUBLISHED: &str = "1970-01-01T00:00:00Z";

/// Why no bundle was written.
#[derive(Debug, thiserror::Error)]
pub enum BundleFailure {
    /// The environment name is not one.
    #[error("'{0}' is not an environment name")]
    BadName(String),
    /// `[trust] metadata` cannot be read, or names no complete set.
    #[error("trust metadata {}: {reason}", path.display())]
    TrustMetadata {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Neither on disk nor in the store.
    #[error("no environment '{0}' on the environmentpath or in the generation store")]
    UnknownEnvironment(String),
    /// No kept generation has that id or prefix.
    #[error(
        "environment '{env}' keeps no generation '{id}' (pluginsync-master check lists the kept ones)"
    )]
    UnknownGeneration {
        /// The environment.
        env: String,
        /// What was asked for.
        id: String,
    },
    /// More than one kept generation starts with the prefix.
    #[error("'{id}' names {count} kept generations of '{env}'; give more digits")]
    Ambiguous {
        /// The environment.
        env: String,
        /// What was asked for.
        id: String,
        /// How many match.
        count: usize,
    },
    /// The environment cannot be indexed whole.
    #[error("environment '{env}': {count} path(s) cannot be read, first {}", first.display())]
    Unreadable {
        /// The environment.
        env: String,
        /// How many.
        count: usize,
        /// The first.
        first: PathBuf,
    },
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The manifest could not be made.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The bundle could not be written (or a file changed while it was).
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The output file.
    #[error("{}: {source}", path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl BundleFailure {
    /// True when what was asked for does not exist (exit 66, `exit.rs`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            BundleFailure::BadName(_)
                | BundleFailure::UnknownEnvironment(_)
                | BundleFailure::UnknownGeneration { .. }
                | BundleFailure::Ambiguous { .. }
        )
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The generation.
    pub generation: GenerationId,
    /// Its files and their bytes.
    pub files: u64,
    /// Bytes of the bundle.
    pub size: u64,
}

/// Which generation a bundle holds (module docs).
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    /// The one everyone is on.
    Everyone,
    /// A kept one, by id or unique prefix.
    Generation(&'a str),
    /// The one placement serves this node now.
    Certname(&'a str),
}

/// Writes the bundle of `env`'s generation `which` to `out`; `said` is
/// told which generation and why before it is written. See the module
/// docs.
pub fn run(
    config: &MasterConfig,
    env: &str,
    which: Which,
    out: &Path,
    said: impl FnOnce(&str),
) -> Result<Written, BundleFailure> {
    let name: EnvName = env
        .parse()
        .map_err(|_| BundleFailure::BadName(env.to_owned()))?;
    let trust = trust_files(config.trust.metadata.as_deref())?;
    let store = Generations::new(&config.generations);
    if config.generations.dir.is_some() {
        store.open(false)?;
    }
    let kept = match which {
        Which::Generation(prefix) => Some(store.find(&name, prefix).map_err(|v| {
            if v.is_empty() {
                BundleFailure::UnknownGeneration {
                    env: env.to_owned(),
                    id: prefix.to_owned(),
                }
            } else {
                BundleFailure::Ambiguous {
                    env: env.to_owned(),
                    id: prefix.to_owned(),
                    count: v.len(),
                }
            }
        })?),
        _ => None,
    };
    let (kept, why) = match (kept, which) {
        (Some(k), _) => (Some(k), "asked for".to_owned()),
        (None, Which::Certname(node)) => placed(config, &store, &name, Some(node)),
        (None, _) => placed(config, &store, &name, None),
    };
    match kept {
        Some(k) => {
            let label = k
                .label
                .as_ref()
                .map(|l| format!(" [{l}]"))
                .unwrap_or_default();
            said(&format!(
                "bundle: generation {}{label} ({why})",
                k.id.short()
            ));
            from_store(&store, &name, &k, out, &trust)
        }
        None => {
            said("bundle: the tree as it is now (no generation of it published)");
            from_tree(config, &name, out, &trust)
        }
    }
}

/// The rollout state of `env` as the masters left it: its policy and its
/// commands' state (halt, promoted, withdrawn), read from `rollout.json`
/// beside the generation store (docs/rollouts.md#replicas) without a
/// master running. The one place a command reads it offline.
pub fn rollout_state(config: &MasterConfig, env: &EnvName) -> (Option<Policy>, Command) {
    let policy = crate::rollout::Policies::new(&config.rollout)
        .ok()
        .and_then(|p| p.of(env.as_str()).cloned());
    let Some(dir) = config.generations.dir.as_deref() else {
        return (policy, Command::default());
    };
    (policy, Rollouts::new(&[], dir).command(env))
}

/// The generation placement serves `node` in `env` now (`None`: a node
/// outside every open wave, the one everyone is on), and why in words.
fn placed(
    config: &MasterConfig,
    store: &Generations,
    env: &EnvName,
    node: Option<&str>,
) -> (Option<Kept>, String) {
    let kept = store.kept(env);
    let (policy, command) = rollout_state(config, env);
    let facts = Facts {
        kept: &kept,
        command: &command,
        policy: policy.as_ref(),
        // 1.0 lies past every position, inside only a share of 100 %.
        position: node.map_or(1.0, |n| {
            pluginsync_common::rollout::position(env.as_str(), n)
        }),
        now: crate::generations::Stamp::now(),
        current: store.current(env).map(|k| k.id),
        reported: None,
        elsewhere: false,
        pin: None,
    };
    let chosen = match decide(&facts) {
        Placement::Serve(k) => Some(k),
        _ => store.current(env),
    };
    let Some(k) = chosen else {
        return (None, String::new());
    };
    let whose = node.map_or_else(|| "everyone's".to_owned(), |n| format!("{n}'s placement"));
    let newer: Vec<String> = (kept.iter().take_while(|n| n.id != k.id))
        .map(|n| match command.withdrawn.contains(&n.id) {
            true => format!("{} is rolled back", n.id.short()),
            false => {
                let (open, wave) = status_of(policy.as_ref(), &command, n);
                let halted = if command.halt.is_some() {
                    ", halted"
                } else {
                    ""
                };
                format!("{} is in wave {wave} at {open} %{halted}", n.id.short())
            }
        })
        .collect();
    match newer.is_empty() {
        true => (Some(k), format!("{whose}: the newest")),
        false => (Some(k), format!("{whose}: {}", newer.join("; "))),
    }
}

/// A kept generation, from the store.
fn from_store(
    store: &Generations,
    env: &EnvName,
    kept: &Kept,
    out: &Path,
    trust: &[(String, Vec<u8>)],
) -> Result<Written, BundleFailure> {
    let manifest =
        store
            .manifest(env, &kept.id)?
            .ok_or_else(|| BundleFailure::UnknownGeneration {
                env: env.to_string(),
                id: kept.id.to_hex(),
            })?;
    let header = header(env, kept.id, &kept.published.to_string(), trust);
    write(out, &header, &manifest, trust, |d| {
        let path = store.blob_path(d);
        std::fs::File::open(&path).map_err(|e| BundleFailure::Output { path, source: e })
    })
}

/// The environment's tree as it is now, indexed and hashed.
fn from_tree(
    config: &MasterConfig,
    env: &EnvName,
    out: &Path,
    trust: &[(String, Vec<u8>)],
) -> Result<Written, BundleFailure> {
    let layout = config.layout();
    let dir = environments::find_environment(&layout, env)
        .ok_or_else(|| BundleFailure::UnknownEnvironment(env.to_string()))?;
    let idx = EnvIndex::build_now(&layout, &config.index, env.clone(), dir);
    if let Some(first) = idx.unreadable.first() {
        return Err(BundleFailure::Unreadable {
            env: env.to_string(),
            count: idx.unreadable.len(),
            first: first.path.clone(),
        });
    }
    let candidate = Candidate::of(&idx)?;
    let header = header(env, candidate.id, UNPUBLISHED, trust);
    write(out, &header, &candidate.bytes, trust, |d| {
        let (path, sig): (PathBuf, FileSig) =
            (candidate.source)(d).ok_or(BundleFailure::Store(StoreError::NoSource(*d)))?;
        crate::walk::open_indexed(&path, sig)
            .map(|(f, _)| f)
            .map_err(|e| BundleFailure::Output { path, source: e })
    })
}

fn header(
    env: &EnvName,
    generation: GenerationId,
    published: &str,
    trust: &[(String, Vec<u8>)],
) -> BundleHeader {
    let names: Vec<String> = trust.iter().map(|(n, _)| n.clone()).collect();
    BundleHeader {
        format: BundleHeader::format_for(&names),
        environment: env.to_string(),
        generation,
        published: published.to_owned(),
        trust: names,
    }
}

/// The metadata files of `dir` a node needs to verify a generation
/// offline (module docs), by name; none without `[trust] metadata`.
pub fn trust_files(dir: Option<&Path>) -> Result<Vec<(String, Vec<u8>)>, BundleFailure> {
    let Some(dir) = dir else {
        return Ok(Vec::new());
    };
    let fail = |path: PathBuf, reason: String| BundleFailure::TrustMetadata { path, reason };
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| fail(path, e.to_string()))
    };
    let mut roots: Vec<(u64, String)> = std::fs::read_dir(dir)
        .map_err(|e| fail(dir.to_owned(), e.to_string()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_suffix(".root.json")?.parse().ok()?;
            is_metadata_name(&name).then_some((version, name))
        })
        .collect();
    roots.sort();
    let mut files = Vec::new();
    for (_, name) in roots {
        files.push((name.clone(), read(&name)?));
    }
    let timestamp = read("timestamp.json")?;
    let snapshot = format!(
        "{}.snapshot.json",
        meta_version(&timestamp, "snapshot.json")
    );
    let snapshot_bytes = read(&snapshot)?;
    let targets = format!(
        "{}.targets.json",
        meta_version(&snapshot_bytes, "targets.json")
    );
    let targets_bytes = read(&targets)?;
    files.push(("timestamp.json".to_owned(), timestamp));
    files.push((snapshot, snapshot_bytes));
    files.push((targets, targets_bytes));
    Ok(files)
}

/// The version TUF metadata `bytes` names for `role` in its `meta` (0
/// when it names none: the file read next is then missing, and said so).
fn meta_version(bytes: &[u8], role: &str) -> u64 {
    let json: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    json["signed"]["meta"][role]["version"]
        .as_u64()
        .unwrap_or_default()
}

/// Writes the bundle through a temporary file beside `out`, then renames
/// it over `out`; `open` gives each blob's content.
fn write(
    out: &Path,
    header: &BundleHeader,
    manifest: &[u8],
    trust: &[(String, Vec<u8>)],
    open: impl Fn(&Sha256) -> Result<std::fs::File, BundleFailure>,
) -> Result<Written, BundleFailure> {
    let io = |source: std::io::Error| BundleFailure::Output {
        path: out.to_owned(),
        source,
    };
    let parsed = Manifest::parse(manifest, &header.generation)?;
    let sizes: std::collections::HashMap<Sha256, u64> = crate::generations::digest_sizes(&parsed)
        .into_iter()
        .collect();
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".pluginsync-bundle-")
        .tempfile_in(dir)
        .map_err(io)?;
    let contents: Vec<Vec<u8>> = trust.iter().map(|(_, c)| c.clone()).collect();
    let mut w = BundleWriter::signed(BufWriter::new(tmp), header, manifest, &contents)?;
    while let Some(d) = w.remaining().first().copied() {
        let size = sizes.get(&d).copied().unwrap_or_default();
        w.add_blob(&d, size, open(&d)?)?;
    }
    let tmp = w.finish()?.into_inner().map_err(|e| io(e.into_error()))?;
    tmp.as_file().sync_all().map_err(io)?;
    let size = tmp.as_file().metadata().map_err(io)?.len();
    tmp.persist(out).map_err(|e| io(e.error))?;
    let (files, _) = parsed.totals();
    Ok(Written {
        generation: header.generation,
        files,
        size,
    })
}

impl Written {
    /// The line `bundle` prints.
    pub fn line(&self, out: &Path) -> String {
        format!(
            "bundle of generation {} ({} files) written to {} ({} bytes)",
            self.generation,
            self.files,
            out.display(),
            self.size
        )
    }
}
