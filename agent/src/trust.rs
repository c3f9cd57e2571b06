//! Signed generations on the node (docs/trust.md#what-a-node-verifies):
//! `[trust]` of agent.toml ([`TrustConfig`]), the TUF metadata fetched
//! from the run's master over the agent's own mTLS client
//! ([`MasterTransport`]) and kept under the vardir ([`datastore`]), and
//! the one check a run makes before anything is staged ([`verify`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::trust::{self, Expiry, METADATA_PREFIX, TrustError};
use serde::Deserialize;

use tough::{Bytes, Transport, TransportError, TransportErrorKind, TransportStream, async_trait};

/// The largest metadata file the agent reads (the master serves no
/// larger, `master/src/trust/metadata.rs`); tough bounds each role
/// tighter where its limits say so.
const MAX_METADATA_BYTES: usize = 32 << 20;

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(60);

/// `[trust]` in agent.toml (docs/agent.md#signed-generations).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustConfig {
    /// The installed root metadata (version 1 or later) every generation
    /// is verified from.
    pub root: PathBuf,
    /// How long past its `expires` metadata is still accepted
    /// (docs/trust.md#expiry); unset: [`DEFAULT_GRACE`].
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub grace: Duration,
    /// `sync --from-bundle --allow-expired-metadata`: a bundle's metadata
    /// is accepted past its expiry (air-gapped sites,
    /// docs/trust.md#signed-bundles); never set from the file, never for
    /// a network run.
    #[serde(skip)]
    pub allow_expired_metadata: bool,
}

/// `[trust] grace` when unset: a timestamp renewed an hour late does not
/// stop the fleet.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

fn default_grace() -> Duration {
    DEFAULT_GRACE
}

impl TrustConfig {
    /// Each setting by its dotted name, as `pluginsync-agent config` shows it.
    pub fn values(&self) -> [(&'static str, String); 2] {
        [
            ("trust.root", self.root.display().to_string()),
            (
                "trust.grace",
                humantime_serde::re::humantime::format_duration(self.grace).to_string(),
            ),
        ]
    }
}

/// Why a run under `[trust]` takes no generation; the run stops before
/// anything is staged, with [`crate::exit::ExitStatus::Untrusted`].
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The signed metadata, or the generation, does not verify.
    #[error(transparent)]
    Verify(#[from] TrustError),
    /// What the run would sync is not a signed generation at all.
    #[error("unsigned content refused: {0} ([trust] is set: only signed generations are synced)")]
    Unsigned(&'static str),
}

/// Where a node keeps the metadata it trusted: `<vardir>/trust/` (tough's
/// datastore: the highest versions seen, across runs and rollbacks).
pub fn datastore(vardir: &Path) -> PathBuf {
    vardir.join("trust")
}

/// Refreshes the signed metadata from `server` (timestamp → snapshot →
/// targets) over `http`, and checks that generation `id` of `env`, whose
/// manifest is `len` bytes, is a signed target.
pub async fn verify(
    config: &TrustConfig,
    vardir: &Path,
    http: reqwest::Client,
    server: &str,
    (env, id, len): (&EnvName, &GenerationId, u64),
) -> Result<(), TrustError> {
    let base = format!("{}{METADATA_PREFIX}", server.trim_end_matches('/'));
    let url =
        url::Url::parse(&base).map_err(|e| TrustError::Unavailable(format!("{base}: {e}")))?;
    let expiry = Expiry {
        grace: config.grace,
        ignore: false,
    };
    let store = datastore(vardir);
    let trusted = trust::load(
        &config.root,
        &store,
        url,
        MasterTransport::new(http),
        expiry,
    )
    .await?;
    trusted.check(env, id, len)
}

/// Verifies generation `id` of `env`, whose manifest is `len` bytes,
/// against the TUF metadata a bundle carries (`files`, by name), as a
/// network run verifies it: from the node's root and its datastore (so
/// metadata older than what the node trusts is a rollback), with expiry
/// ignored only under `--allow-expired-metadata`. A bundle carrying none
/// is refused (docs/trust.md#signed-bundles).
pub async fn verify_bundle(
    config: &TrustConfig,
    vardir: &Path,
    files: &[(String, Vec<u8>)],
    (env, id, len): (&EnvName, &GenerationId, u64),
) -> Result<(), Refused> {
    if files.is_empty() {
        return Err(Refused::Unsigned("the bundle carries no signed metadata"));
    }
    let dir = vardir.join("bundle-trust");
    let written = (|| {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes)?;
        }
        Ok(())
    })();
    written.map_err(|source| TrustError::Datastore {
        path: dir.clone(),
        source,
    })?;
    let expiry = Expiry {
        grace: config.grace,
        ignore: config.allow_expired_metadata,
    };
    let trusted = trust::load_dir(&config.root, &datastore(vardir), &dir, expiry).await;
    let _ = std::fs::remove_dir_all(&dir);
    trusted?.check(env, id, len)?;
    Ok(())
}

/// tough's transport over the agent's HTTP client: a 404 is "not found"
/// (how TUF learns there is no newer root), anything but a 200 an error.
#[derive(Debug, Clone)]
pub struct MasterTransport {
    http: reqwest::Client,
}

impl MasterTransport {
    /// Over `http` (the agent's mTLS client).
    pub fn new(http: reqwest::Client) -> MasterTransport {
        MasterTransport { http }
    }
}

#[async_trait]
impl Transport for MasterTransport {
    async fn fetch(&self, url: url::Url) -> Result<TransportStream, TransportError> {
        let fail = |kind, e: String| TransportError::new_with_cause(kind, url.clone(), e);
        let resp = self
            .http
            .get(url.as_str())
            .timeout(METADATA_TIMEOUT)
            .send()
            .await
            .map_err(|e| fail(TransportErrorKind::Other, e.to_string()))?;
        match resp.status().as_u16() {
            200 => {}
            404 => return Err(TransportError::new(TransportErrorKind::FileNotFound, url)),
            s => return Err(fail(TransportErrorKind::Other, format!("HTTP {s}"))),
        }
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| fail(TransportErrorKind::Other, e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_METADATA_BYTES {
                return Err(fail(
                    TransportErrorKind::Other,
                    format!("larger than {MAX_METADATA_BYTES} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let one: Result<Bytes, TransportError> = Ok(Bytes::from(body));
        Ok(Box::pin(futures_util::stream::iter([one])))
    }
}
