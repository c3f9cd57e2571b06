//! Signed generations on the node (docs/trust.md#what-a-node-verifies):
//! `[trust]` of agent.toml ([`TrustConfig`]), the TUF metadata fetched
//! from the run's master over the agent's own mTLS client
//! ([`MasterTransport`]) and kept under the vardir ([`datastore`]), and
//! the refresh a run makes before anything is staged ([`refresh`],
//! then `Trusted::check`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, Manifest};
use pluginsync_common::trust::served::Served;
use pluginsync_common::trust::{self, Expiry, METADATA_PREFIX, TrustError, Trusted};
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

/// The signed metadata of `server`, refreshed (timestamp → snapshot →
/// targets) over `http`; `said` is what its per-node answer said of them
/// (docs/trust.md#requests-per-run). When the master still serves the
/// timestamp kept (as `said` names it, else as its revalidation answers),
/// names no newer root, and every file the last full load verified is
/// unchanged in the vardir, that load's result is taken again
/// (`trust::recall`) — with `said`, without a request; else tough loads
/// and verifies everything (the files `said` names fetched at once
/// beforehand), and its result is recorded.
pub async fn refresh(
    config: &TrustConfig,
    vardir: &Path,
    http: reqwest::Client,
    server: &str,
    said: Option<&Served>,
) -> Result<Trusted, TrustError> {
    let base = format!("{}{METADATA_PREFIX}", server.trim_end_matches('/'));
    let url =
        url::Url::parse(&base).map_err(|e| TrustError::Unavailable(format!("{base}: {e}")))?;
    let expiry = Expiry {
        grace: config.grace,
        ignore: false,
    };
    let store = datastore(vardir);
    let files = store.join("files");
    let kept = |[_, _, snapshot, targets]: [u64; 4]| {
        let targets = files.join(format!("{targets}.targets.json"));
        trust::Kept {
            files: vec![
                files.join("timestamp.json"),
                files.join(format!("{snapshot}.snapshot.json")),
                targets.clone(),
            ],
            targets,
        }
    };
    let transport = MasterTransport::new(http, files.clone());
    if let Some(said) = said
        && transport.kept_etag().as_deref() == Some(said.timestamp.as_str())
        && let Some(trusted) = trust::recall(&config.root, &store, kept, expiry)
        && said.root <= trusted.versions()[0]
    {
        return Ok(trusted);
    }
    // Said, and not what the node keeps: tough's datastore is renewed
    // (`trust::renew`, file writes) while the new files are asked.
    let renewed = match said {
        Some(said) => {
            let store = store.clone();
            let renew = tokio::task::spawn_blocking(move || trust::renew(&store));
            let ((), renewed) = tokio::join!(transport.prefetch(&url, said), renew);
            renewed.is_ok()
        }
        None => false,
    };
    if let Some(newest_root) = transport.revalidate(&url).await
        && !transport.timestamp_changed()
        && let Some(trusted) = trust::recall(&config.root, &store, kept, expiry)
        && newest_root <= trusted.versions()[0]
    {
        return Ok(trusted);
    }
    trust::forget(&store);
    let loading = load_beside(&config.root, &store, url, transport, expiry, renewed);
    let trusted = match loading.await {
        Ok(t) => t,
        Err(e) => {
            // Nothing kept that did not verify is read again.
            let _ = std::fs::remove_dir_all(&files);
            return Err(e);
        }
    };
    prune(&files, trusted.versions());
    if let Err(e) = trust::remember(&trusted, &config.root, &store, kept) {
        tracing::debug!(error = %e, "cannot record the verified metadata: the next run verifies it again");
    }
    Ok(trusted)
}

/// `trust::load` on a thread of its own (`renewed`: the datastore was
/// renewed already), so its parsing and signature
/// checks run beside the manifest's (fetched and checked meanwhile on the
/// run's thread) rather than taking turns with them; its requests and
/// file operations are still driven by the run's runtime (`block_on` of
/// its handle: the run's thread is in `Runtime::block_on` meanwhile).
async fn load_beside(
    root: &Path,
    store: &Path,
    url: url::Url,
    transport: MasterTransport,
    expiry: Expiry,
    renewed: bool,
) -> Result<Trusted, TrustError> {
    let handle = tokio::runtime::Handle::current();
    let (root, store) = (root.to_owned(), store.to_owned());
    let load = move || {
        if !renewed {
            trust::renew(&store);
        }
        handle.block_on(trust::load_renewed(&root, &store, url, transport, expiry))
    };
    match tokio::task::spawn_blocking(load).await {
        Ok(loaded) => loaded,
        Err(e) => Err(TrustError::Unavailable(format!(
            "the verification stopped: {e}"
        ))),
    }
}

/// The length of generation `id`'s manifest: of the `fresh` bytes; or
/// else of the file the node holds for `env`, its size when that is the
/// signed length (a no-op run checks the signed target without reading
/// the manifest back), else its bytes read back (into `fresh`) when they
/// are the generation's; `None`: the manifest must be fetched again.
pub fn held_len(
    trusted: &Trusted,
    vardir: &Path,
    fresh: &mut Option<Vec<u8>>,
    (env, id): (&EnvName, &GenerationId),
) -> Option<u64> {
    use crate::cache::GenerationRecord;
    if fresh.is_none() {
        let len = GenerationRecord::manifest_len(vardir, env.as_str());
        if let Some(len) = len.filter(|&n| trusted.check(env, id, n).is_ok()) {
            return Some(len);
        }
        let bytes = GenerationRecord::load_manifest(vardir, env.as_str())?;
        *fresh = Some(bytes).filter(|b| Manifest::parse(b, id).is_ok());
    }
    fresh.as_ref().map(|b| b.len() as u64)
}

/// Removes the kept versioned files but those of the `versions` trusted
/// now (root, timestamp, snapshot, targets): older ones are never read
/// again.
fn prune(files: &Path, [root, _, snapshot, targets]: [u64; 4]) {
    let keep = [
        format!("{root}.root.json"),
        format!("{snapshot}.snapshot.json"),
        format!("{targets}.targets.json"),
    ];
    for e in std::fs::read_dir(files).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") && name != "timestamp.json" && !keep.contains(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
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
/// (how TUF learns there is no newer root), anything but a 200 (or a 304
/// for the timestamp) an error.
///
/// A load asks each file at most once (docs/trust.md#requests-per-run):
/// versioned files (`N.root.json`, `N.snapshot.json`, `N.targets.json`)
/// never change (consistent snapshots), so they are kept in
/// `<vardir>/trust/files/` and read from there; `timestamp.json` is asked
/// with the `If-None-Match` of the copy kept (a 304: that copy), once a
/// run ([`MasterTransport::revalidate`]); and the probe for the next root
/// is answered "not found" without a request when the timestamp's answer
/// says (`X-Pluginsync-Trust-Root`) the master has no newer root, which is
/// all the probe would learn. tough verifies every file, kept or fetched,
/// exactly as before; a failed load clears the kept files ([`refresh`]).
#[derive(Debug, Clone)]
pub struct MasterTransport {
    http: reqwest::Client,
    files: PathBuf,
    /// The timestamp fetched ahead, and the newest root version the
    /// master said it has.
    ahead: std::sync::Arc<std::sync::Mutex<Ahead>>,
}

#[derive(Debug, Default)]
struct Ahead {
    timestamp: Option<Vec<u8>>,
    root: Option<u64>,
    asked: bool,
    /// The timestamp asked is not the one kept.
    changed: bool,
}

impl MasterTransport {
    /// Over `http` (the agent's mTLS client), keeping files in `files`.
    pub fn new(http: reqwest::Client, files: PathBuf) -> MasterTransport {
        MasterTransport {
            http,
            files,
            ahead: Default::default(),
        }
    }

    fn ahead(&self) -> std::sync::MutexGuard<'_, Ahead> {
        pluginsync_common::mutex::lock(&self.ahead)
    }

    /// Whether the timestamp [`MasterTransport::revalidate`] asked is not
    /// the copy kept (so the last full load's result is not the answer).
    pub fn timestamp_changed(&self) -> bool {
        self.ahead().changed
    }

    /// The `ETag` of the kept `timestamp.json`, as its master sent it.
    pub fn kept_etag(&self) -> Option<String> {
        std::fs::read_to_string(self.files.join("timestamp.etag"))
            .ok()
            .filter(|t| !t.is_empty())
    }

    /// The files `said` names, asked together under `base` (the metadata
    /// URL): the timestamp revalidated ([`MasterTransport::revalidate`]),
    /// the snapshot and targets versions it leads to fetched and kept
    /// unless kept already, so tough then reads them without a round trip
    /// each. A failure here is tough's to meet and report when it asks.
    pub async fn prefetch(&self, base: &url::Url, said: &Served) {
        let versioned = [
            said.snapshot.map(|v| format!("{v}.snapshot.json")),
            said.targets.map(|v| format!("{v}.targets.json")),
        ];
        let fetches = versioned.into_iter().flatten().map(|name| async move {
            if let Ok(url) = base.join(&name) {
                let _ = self.fetch_kept(&url, &name, false).await;
            }
        });
        tokio::join!(
            self.revalidate(base),
            futures_util::future::join_all(fetches)
        );
    }

    /// Asks the master's `timestamp.json` (under `base`, the metadata
    /// URL) once, ahead of tough, which is then answered from it: the
    /// newest root version the master serves, when it says.
    pub async fn revalidate(&self, base: &url::Url) -> Option<u64> {
        if std::mem::replace(&mut self.ahead().asked, true) {
            return self.ahead().root;
        }
        let url = base.join("timestamp.json").ok()?;
        let bytes = self.timestamp(&url).await.ok()?;
        let mut ahead = self.ahead();
        ahead.timestamp = Some(bytes);
        ahead.root
    }

    /// `GET url`, conditional on `etag`: the status, the `ETag`, the
    /// root version header and the body.
    async fn get(&self, url: &url::Url, etag: Option<&str>) -> Result<Fetched, TransportError> {
        let fail =
            |e: String| TransportError::new_with_cause(TransportErrorKind::Other, url.clone(), e);
        let mut req = self.http.get(url.as_str()).timeout(METADATA_TIMEOUT);
        if let Some(tag) = etag {
            req = req.header(reqwest::header::IF_NONE_MATCH, tag);
        }
        let mut resp = req.send().await.map_err(|e| fail(e.to_string()))?;
        let header = |name: &str| {
            let v = resp.headers().get(name)?.to_str().ok()?;
            Some(v.to_owned())
        };
        let (etag, root) = (header("etag"), header(trust::HEADER_ROOT_VERSION));
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| fail(e.to_string()))? {
            if body.len() + chunk.len() > MAX_METADATA_BYTES {
                return Err(fail(format!("larger than {MAX_METADATA_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            status,
            etag,
            root: root.and_then(|r| r.parse().ok()),
            body,
        })
    }

    /// `name` fetched from `url`, conditional on the copy kept when
    /// `revalidate` (the timestamp) and else read from it when there is
    /// one (a versioned file never changes); what a 200 brings is kept
    /// (each file written new, `trust::write_new`).
    async fn fetch_kept(
        &self,
        url: &url::Url,
        name: &str,
        revalidate: bool,
    ) -> Result<Vec<u8>, TransportError> {
        let stem = name.strip_suffix(".json").unwrap_or(name);
        let (kept, tag) = (
            self.files.join(name),
            self.files.join(format!("{stem}.etag")),
        );
        let old = std::fs::read(&kept).ok();
        if !revalidate && let Some(old) = old {
            return Ok(old);
        }
        let etag = old
            .as_ref()
            .and_then(|_| std::fs::read_to_string(&tag).ok());
        let got = self.get(url, etag.as_deref()).await?;
        if revalidate {
            self.ahead().root = got.root;
        }
        match (got.status, old) {
            (304, Some(old)) if revalidate => Ok(old),
            (200, old) => {
                if revalidate {
                    self.ahead().changed = old.is_none_or(|o| o != got.body);
                }
                let _ = std::fs::create_dir_all(&self.files);
                let _ = trust::write_new(&kept, &got.body);
                if revalidate {
                    let _ = trust::write_new(&tag, got.etag.unwrap_or_default().as_bytes());
                }
                Ok(got.body)
            }
            (s, _) => Err(refused(url, s)),
        }
    }

    /// `timestamp.json`, revalidated against the copy kept.
    async fn timestamp(&self, url: &url::Url) -> Result<Vec<u8>, TransportError> {
        self.fetch_kept(url, "timestamp.json", true).await
    }

    async fn fetch_bytes(&self, url: &url::Url) -> Result<Vec<u8>, TransportError> {
        let name = url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .unwrap_or_default()
            .to_owned();
        if name == "timestamp.json" {
            if let Some(bytes) = self.ahead().timestamp.take() {
                return Ok(bytes);
            }
            return self.timestamp(url).await;
        }
        if let Some(version) = name
            .strip_suffix(".root.json")
            .and_then(|v| v.parse::<u64>().ok())
        {
            // The root probe comes first: the timestamp is asked now, once.
            let base = url.join(".").map_err(|e| {
                TransportError::new_with_cause(TransportErrorKind::Other, url.clone(), e)
            })?;
            if self
                .revalidate(&base)
                .await
                .is_some_and(|newest| version > newest)
            {
                return Err(TransportError::new(
                    TransportErrorKind::FileNotFound,
                    url.clone(),
                ));
            }
        }
        if pluginsync_common::bundle::is_metadata_name(&name) {
            return self.fetch_kept(url, &name, false).await;
        }
        let got = self.get(url, None).await?;
        match got.status {
            200 => Ok(got.body),
            s => Err(refused(url, s)),
        }
    }
}

/// A status other than 200 (or a 304 answering a kept copy): a 404 is
/// "not found", anything else an error.
fn refused(url: &url::Url, status: u16) -> TransportError {
    match status {
        404 => TransportError::new(TransportErrorKind::FileNotFound, url.clone()),
        s => TransportError::new_with_cause(
            TransportErrorKind::Other,
            url.clone(),
            format!("HTTP {s}"),
        ),
    }
}

/// One answer of the master.
struct Fetched {
    status: u16,
    etag: Option<String>,
    root: Option<u64>,
    body: Vec<u8>,
}

#[async_trait]
impl Transport for MasterTransport {
    async fn fetch(&self, url: url::Url) -> Result<TransportStream, TransportError> {
        let body = self.fetch_bytes(&url).await?;
        let one: Result<Bytes, TransportError> = Ok(Bytes::from(body));
        Ok(Box::pin(futures_util::stream::iter([one])))
    }
}
