//! `pluginsync-master manifest ENVIRONMENT`: the canonical manifest of the
//! environment's tree as it is now, byte for byte what a master publishing
//! it computes (`generations::Candidate::of`, the one implementation), so
//! its sha256 is the generation id the masters serve. The deploy pipeline
//! signs these bytes (docs/trust.md#the-signing-pipeline).
//!
//! Like the master, it refuses a tree it cannot read whole and a tree that
//! changed under the walk (docs/deploys.md#consistent-builds): the pipeline
//! must never sign a manifest no master would publish.

use std::path::PathBuf;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, ManifestError};

use crate::config::MasterConfig;
use crate::environments;
use crate::generations::{Candidate, consistent};
use crate::index::EnvIndex;

/// Why no manifest was printed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestFailure {
    /// The environment name is not one.
    #[error("'{0}' is not an environment name")]
    BadName(String),
    /// Not on the environmentpath.
    #[error("no environment '{0}' on the environmentpath")]
    UnknownEnvironment(String),
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
    /// The tree changed under the walk: the manifest would be of no tree.
    #[error(
        "environment '{0}' changed while it was read (a link flipped); run again once the deploy is done"
    )]
    Inconsistent(String),
    /// The manifest could not be made.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

impl ManifestFailure {
    /// True when what was asked for does not exist (exit 66, `exit.rs`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ManifestFailure::BadName(_) | ManifestFailure::UnknownEnvironment(_)
        )
    }
}

/// The manifest of `env`'s tree as it is now: its bytes and its id (the
/// sha256 of the bytes).
pub fn of_tree(
    config: &MasterConfig,
    env: &str,
) -> Result<(Vec<u8>, GenerationId), ManifestFailure> {
    let name: EnvName = env
        .parse()
        .map_err(|_| ManifestFailure::BadName(env.to_owned()))?;
    let layout = config.layout();
    let dir = environments::find_environment(&layout, &name)
        .ok_or_else(|| ManifestFailure::UnknownEnvironment(env.to_owned()))?;
    let real_before = std::fs::canonicalize(&dir)
        .map_err(|_| ManifestFailure::UnknownEnvironment(env.to_owned()))?;
    let idx = EnvIndex::build_now(&layout, &config.index, name, dir);
    if let Some(first) = idx.unreadable.first() {
        return Err(ManifestFailure::Unreadable {
            env: env.to_owned(),
            count: idx.unreadable.len(),
            first: first.path.clone(),
        });
    }
    if !consistent(&idx, &real_before) {
        return Err(ManifestFailure::Inconsistent(env.to_owned()));
    }
    let candidate = Candidate::of(&idx)?;
    Ok((candidate.bytes, candidate.id))
}
