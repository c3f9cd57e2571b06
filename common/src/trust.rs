//! Signed generations (docs/trust.md): the TUF repository the deploy
//! pipeline signs, loaded and verified with `tough` (root → timestamp →
//! snapshot → targets, TUF's order and rules), and the one question both
//! sides ask of it: is this manifest a signed target?
//!
//! A generation's manifest is the target `ENV.<generation id>.manifest`
//! ([`target_name`]: a file name, since `tuftool` names a target by the
//! file it adds); its signed length and sha256 must be the manifest's
//! (the sha256 is the generation id). The target's `custom` may carry
//! `environment`; when it does, it must name the environment
//! (docs/trust.md#targets).
//!
//! [`load`] keeps what it trusted in a datastore directory (tough's: the
//! newest root, timestamp, snapshot and targets), so the highest versions
//! seen are remembered across runs and older metadata is refused
//! (rollback); it starts the root chain from the newer of the installed
//! root and the datastore's, so a node that once followed a rotation never
//! trusts the rotated-out keys again. Expiry is checked here rather than by
//! tough, with a grace ([`Expiry`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tough::error::Error as ToughError;
use tough::schema::{Root, Signed, Targets};
use tough::{ExpirationEnforcement, RepositoryLoader, Transport};

use crate::envname::EnvName;
use crate::generation::GenerationId;

pub mod served;

/// Where the masters serve the TUF metadata: `{METADATA_PREFIX}<file>`,
/// e.g. `timestamp.json`, `3.targets.json` (docs/trust.md#what-the-masters-serve).
pub const METADATA_PREFIX: &str = "/pluginsync/v1/trust/";

/// The header a master sends with `timestamp.json` (200 or 304): the
/// newest `N.root.json` version it serves, so a node need not probe for
/// `N+1.root.json` (docs/trust.md#requests-per-run).
pub const HEADER_ROOT_VERSION: &str = "x-pluginsync-trust-root";

/// What a manifest's target name ends with.
pub const TARGET_SUFFIX: &str = ".manifest";

/// The target naming generation `id` of `env`:
/// `ENV.<generation id>.manifest` (docs/trust.md#targets). A file name
/// (no `/`): `tuftool` names each target it adds by its file's name, and
/// an environment name has no `.`, so the name parses back unambiguously.
pub fn target_name(env: &EnvName, id: &GenerationId) -> String {
    format!("{env}.{}{TARGET_SUFFIX}", id.to_hex())
}

/// How expiry is enforced (docs/trust.md#expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// How long past its `expires` metadata is still accepted.
    pub grace: Duration,
    /// Accept expired metadata at all (air-gapped bundles only, by an
    /// explicit flag).
    pub ignore: bool,
}

/// Why the signed metadata, or a generation, is refused. Each one line
/// naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The installed root cannot be read or is not a root that verifies.
    #[error("trust root '{}': {reason}", path.display())]
    Root {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Metadata older than what this node already trusts.
    #[error("rollback refused: {0}")]
    Rollback(String),
    /// Metadata whose signatures (or hashes) do not verify, the root chain
    /// included.
    #[error("signature refused: {0}")]
    Signature(String),
    /// Metadata past its expiry and the grace.
    #[error(
        "freeze refused: the {role} metadata expired at {expires} (grace {}s)",
        grace.as_secs()
    )]
    Expired {
        /// `timestamp`, `snapshot`, `targets` or `root`.
        role: &'static str,
        /// When.
        expires: String,
        /// The grace allowed.
        grace: Duration,
    },
    /// The metadata could not be fetched.
    #[error("cannot fetch the signed metadata: {0}")]
    Unavailable(String),
    /// Anything else tough refused.
    #[error("signed metadata refused: {0}")]
    Metadata(String),
    /// The generation is not a signed target: never signed, or withdrawn.
    #[error(
        "generation {id} of '{env}' is not signed (no target {target}: unsigned, or withdrawn by the signers)"
    )]
    Unsigned {
        /// The environment.
        env: String,
        /// The generation.
        id: String,
        /// The target name looked up.
        target: String,
    },
    /// The manifest is not the one the target signs.
    #[error("the manifest of generation {id} does not match its signed target: {what}")]
    Mismatch {
        /// The generation.
        id: String,
        /// What differs.
        what: String,
    },
    /// The datastore directory cannot be made or read.
    #[error("trust datastore '{}': {source}", path.display())]
    Datastore {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<ToughError> for TrustError {
    fn from(e: ToughError) -> TrustError {
        let text = e.to_string();
        match e {
            ToughError::OlderMetadata { .. } | ToughError::OlderSnapshotInTimestamp { .. } => {
                TrustError::Rollback(text)
            }
            ToughError::VerifyMetadata { .. }
            | ToughError::VerifyRoleMetadata { .. }
            | ToughError::VerifyTrustedMetadata { .. }
            | ToughError::HashMismatch { .. } => TrustError::Signature(text),
            ToughError::Transport { .. } | ToughError::MaxSizeExceeded { .. } => {
                TrustError::Unavailable(text)
            }
            _ => TrustError::Metadata(text),
        }
    }
}

/// The verified metadata: which generations are signed.
#[derive(Debug)]
pub struct Trusted {
    /// Root, timestamp, snapshot, targets.
    versions: [u64; 4],
    /// Timestamp, snapshot, targets, root (the order [`Trusted::check_expiry`] reports in).
    expires: [jiff::Timestamp; 4],
    /// The top-level targets, with any delegated roles tough loaded.
    targets: Signed<Targets>,
}

/// The roles of [`Trusted::expires`], in its order.
const EXPIRY_ROLES: [&str; 4] = ["timestamp", "snapshot", "targets", "root"];

impl From<tough::Repository> for Trusted {
    fn from(repo: tough::Repository) -> Trusted {
        Trusted {
            versions: [
                repo.root().signed.version.get(),
                repo.timestamp().signed.version.get(),
                repo.snapshot().signed.version.get(),
                repo.targets().signed.version.get(),
            ],
            expires: [
                repo.timestamp().signed.expires,
                repo.snapshot().signed.expires,
                repo.targets().signed.expires,
                repo.root().signed.expires,
            ],
            targets: repo.targets().clone(),
        }
    }
}

/// Loads and verifies the repository whose metadata is at `metadata`
/// through `transport`, starting from the newer of the root installed at
/// `root` and the one `datastore` (a directory, made if missing) holds;
/// then checks every role's expiry against `expiry`.
pub async fn load(
    root: &Path,
    datastore: &Path,
    metadata: url::Url,
    transport: impl Transport + 'static,
    expiry: Expiry,
) -> Result<Trusted, TrustError> {
    renew(datastore);
    load_renewed(root, datastore, metadata, transport, expiry).await
}

/// [`load`] of a datastore the caller has just [`renew`]ed (the agent
/// does it while the metadata is fetched).
pub async fn load_renewed(
    root: &Path,
    datastore: &Path,
    metadata: url::Url,
    transport: impl Transport + 'static,
    expiry: Expiry,
) -> Result<Trusted, TrustError> {
    std::fs::create_dir_all(datastore).map_err(|source| TrustError::Datastore {
        path: datastore.to_owned(),
        source,
    })?;
    let installed = std::fs::read(root).map_err(|e| TrustError::Root {
        path: root.to_owned(),
        reason: e.to_string(),
    })?;
    let installed_version = root_version(&installed, root)?;
    // The datastore's root was verified along the chain when written.
    let kept_path = datastore.join("root.json");
    let kept = std::fs::read(&kept_path).ok();
    let start = match kept {
        Some(k) if root_version(&k, &kept_path).is_ok_and(|v| v > installed_version) => k,
        _ => installed,
    };
    // tough's own expiry check has no grace: expiry is checked below.
    let repo = RepositoryLoader::new(&start, metadata.clone(), metadata)
        .transport(transport)
        .datastore(datastore)
        .expiration_enforcement(ExpirationEnforcement::Unsafe)
        .load()
        .await?;
    let trusted = Trusted::from(repo);
    if !expiry.ignore {
        trusted.check_expiry(expiry.grace)?;
    }
    Ok(trusted)
}

/// The files tough rewrites in place on every load (truncated, then
/// written), each written again now as a new file with the same bytes:
/// truncating a file whose blocks are allocated waits on ext4 for their
/// release and for the flush `auto_da_alloc` starts, a few milliseconds
/// each, while truncating one just written costs nothing
/// (docs/trust.md#requests-per-run). A crash in between loses the copy as
/// a crash during tough's own truncation would.
pub fn renew(datastore: &Path) {
    for name in [
        "latest_known_time.json",
        "timestamp.json",
        "snapshot.json",
        "targets.json",
    ] {
        let path = datastore.join(name);
        if let Ok(bytes) = std::fs::read(&path) {
            let _ = write_new(&path, &bytes);
        }
    }
}

/// [`load`] of the metadata in the local directory `dir` (a master's
/// `[trust] metadata`, a bundle's, docs/trust.md#what-the-masters-serve).
pub async fn load_dir(
    root: &Path,
    datastore: &Path,
    dir: &Path,
    expiry: Expiry,
) -> Result<Trusted, TrustError> {
    let absolute = std::path::absolute(dir).map_err(|e| TrustError::Datastore {
        path: dir.to_owned(),
        source: e,
    })?;
    let url = url::Url::from_directory_path(&absolute).map_err(|()| {
        TrustError::Unavailable(format!("'{}' is not a directory path", dir.display()))
    })?;
    load(root, datastore, url, tough::FilesystemTransport, expiry).await
}

/// What a load read besides the installed root and tough's datastore
/// files, for the trusted `versions` (root, timestamp, snapshot,
/// targets): the caller's copies of the metadata as fetched, `targets`
/// the one of the targets role ([`remember`], [`recall`]).
#[derive(Debug, Clone)]
pub struct Kept {
    /// Every file, `targets` included.
    pub files: Vec<PathBuf>,
    /// The targets metadata as signed.
    pub targets: PathBuf,
}

/// The record of the last full load, `<datastore>/verified.json`
/// (docs/trust.md#requests-per-run).
const RECORD: &str = "verified.json";

/// The files of tough's datastore a load reads (`latest_known_time.json`
/// is checked on its own, [`recall`]).
const DATASTORE_READ: [&str; 3] = ["root.json", "timestamp.json", "snapshot.json"];

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    /// sha256 (hex) of every file the load read, by path.
    files: Vec<(PathBuf, String)>,
    versions: [u64; 4],
    /// RFC 3339, in [`Trusted::expires`]'s order.
    expires: [String; 4],
}

/// Writes `path` as a new file: the old one removed first, since
/// truncating a file that has blocks costs a flush on ext4
/// (`auto_da_alloc`); a torn write is a file that does not parse.
pub fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::write(path, bytes)
}

/// The inputs of a load: the installed `root`, tough's datastore files
/// and the caller's `kept` copies for `versions`.
fn inputs(root: &Path, datastore: &Path, kept: &Kept) -> Vec<PathBuf> {
    let mut all = vec![root.to_owned()];
    all.extend(DATASTORE_READ.iter().map(|f| datastore.join(f)));
    all.extend(kept.files.iter().cloned());
    all
}

/// Records that `trusted` is what a full [`load`] made of the files it
/// read (the installed `root`, `datastore`'s, and `kept` for its
/// versions), by their sha256, so that [`recall`] can trust them again
/// while they are unchanged.
pub fn remember(
    trusted: &Trusted,
    root: &Path,
    datastore: &Path,
    kept: impl Fn([u64; 4]) -> Kept,
) -> std::io::Result<()> {
    let mut files = Vec::new();
    for path in inputs(root, datastore, &kept(trusted.versions)) {
        let digest = crate::digest::Sha256::of(&std::fs::read(&path)?);
        files.push((path, digest.to_hex()));
    }
    let record = Record {
        files,
        versions: trusted.versions,
        expires: trusted.expires.map(|t| t.to_string()),
    };
    let bytes = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
    write_new(&datastore.join(RECORD), &bytes)
}

/// Forgets the record of the last load ([`remember`]).
pub fn forget(datastore: &Path) {
    let _ = std::fs::remove_file(datastore.join(RECORD));
}

/// The metadata the last full [`load`] verified, without verifying it
/// again, when every file it read is byte for byte the same (the
/// installed root, the datastore's, `kept`), the clock has not gone back
/// past the datastore's `latest_known_time.json`, the targets delegate
/// nothing, and nothing has expired under `expiry`; else `None` (a full
/// load decides). Why this is safe: docs/trust.md#requests-per-run.
pub fn recall(
    root: &Path,
    datastore: &Path,
    kept: impl Fn([u64; 4]) -> Kept,
    expiry: Expiry,
) -> Option<Trusted> {
    let record: Record =
        serde_json::from_slice(&std::fs::read(datastore.join(RECORD)).ok()?).ok()?;
    let kept = kept(record.versions);
    let expected = inputs(root, datastore, &kept);
    if record.files.len() != expected.len() {
        return None;
    }
    for ((path, digest), want) in record.files.iter().zip(&expected) {
        let bytes = std::fs::read(want).ok()?;
        if path != want || crate::digest::Sha256::of(&bytes).to_hex() != *digest {
            return None;
        }
    }
    let latest = std::fs::read(datastore.join("latest_known_time.json")).ok()?;
    let latest: jiff::Timestamp = serde_json::from_slice(&latest).ok()?;
    if jiff::Timestamp::now() < latest {
        return None;
    }
    let targets: Signed<Targets> =
        serde_json::from_slice(&std::fs::read(&kept.targets).ok()?).ok()?;
    let delegates = (targets.signed.delegations.as_ref()).is_some_and(|d| !d.roles.is_empty());
    if delegates || targets.signed.version.get() != record.versions[3] {
        return None;
    }
    let mut expires = [jiff::Timestamp::MIN; 4];
    for (e, text) in expires.iter_mut().zip(&record.expires) {
        *e = text.parse().ok()?;
    }
    let trusted = Trusted {
        versions: record.versions,
        expires,
        targets,
    };
    (expiry.ignore || trusted.check_expiry(expiry.grace).is_ok()).then_some(trusted)
}

/// The version of the root metadata `bytes` (read from `path`), which
/// must verify itself.
fn root_version(bytes: &[u8], path: &Path) -> Result<u64, TrustError> {
    let refused = |reason: String| TrustError::Root {
        path: path.to_owned(),
        reason,
    };
    let root: Signed<Root> = serde_json::from_slice(bytes).map_err(|e| refused(e.to_string()))?;
    root.signed
        .verify_role(&root)
        .map_err(|e| refused(e.to_string()))?;
    Ok(root.signed.version.get())
}

impl Trusted {
    /// Refuses metadata past its `expires` plus `grace`, timestamp first
    /// (the one that expires soonest).
    fn check_expiry(&self, grace: Duration) -> Result<(), TrustError> {
        let now = jiff::Timestamp::now();
        let roles = EXPIRY_ROLES.into_iter().zip(self.expires);
        let grace_span = jiff::SignedDuration::try_from(grace).unwrap_or(jiff::SignedDuration::MAX);
        for (role, expires) in roles {
            let until = expires
                .checked_add(grace_span)
                .unwrap_or(jiff::Timestamp::MAX);
            if now > until {
                return Err(TrustError::Expired {
                    role,
                    expires: expires.to_string(),
                    grace,
                });
            }
        }
        Ok(())
    }

    /// When the verified metadata stops being valid: the earliest
    /// `expires` of timestamp, snapshot, targets and root (a signed
    /// generation's expiry, docs/trust.md#expiry).
    pub fn expires(&self) -> std::time::SystemTime {
        let earliest = self
            .expires
            .into_iter()
            .min()
            .unwrap_or(jiff::Timestamp::MIN);
        std::time::SystemTime::from(earliest)
    }

    /// Whether generation `id` of `env`, whose manifest is `len` bytes, is
    /// a signed target: named, of that length and sha256, and of that
    /// environment when the target says which.
    pub fn check(&self, env: &EnvName, id: &GenerationId, len: u64) -> Result<(), TrustError> {
        self.check_target(env, id, Some(len))
    }

    /// [`Trusted::check`] of a generation whose manifest's length is not
    /// at hand (`None`: not compared; its sha256, the id, still is).
    pub fn check_target(
        &self,
        env: &EnvName,
        id: &GenerationId,
        len: Option<u64>,
    ) -> Result<(), TrustError> {
        let name = target_name(env, id);
        let target = self
            .targets
            .signed
            .targets_iter()
            .find(|(n, _)| n.raw() == name)
            .map(|(_, t)| t)
            .ok_or_else(|| TrustError::Unsigned {
                env: env.to_string(),
                id: id.to_hex(),
                target: name.clone(),
            })?;
        let mismatch = |what: String| TrustError::Mismatch {
            id: id.to_hex(),
            what,
        };
        if target.hashes.sha256.as_ref() != id.0.0.as_slice() {
            return Err(mismatch("sha256 differs".to_owned()));
        }
        if let Some(len) = len
            && target.length != len
        {
            return Err(mismatch(format!(
                "{len} bytes, signed as {}",
                target.length
            )));
        }
        match target.custom.get("environment") {
            Some(e) if e.as_str() != Some(env.as_str()) => {
                Err(mismatch(format!("signed for environment {e}")))
            }
            _ => Ok(()),
        }
    }

    /// The signed generations of `env`, by id.
    pub fn signed(&self, env: &EnvName) -> Vec<GenerationId> {
        let prefix = format!("{env}.");
        self.targets
            .signed
            .targets_iter()
            .filter_map(|(n, _)| {
                let rest = n.raw().strip_prefix(&prefix)?;
                rest.strip_suffix(TARGET_SUFFIX)?.parse().ok()
            })
            .collect()
    }

    /// The versions trusted: root, timestamp, snapshot, targets.
    pub fn versions(&self) -> [u64; 4] {
        self.versions
    }
}
