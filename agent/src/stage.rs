//! Stage and verify: every new or changed file is downloaded into the
//! destination's staging directory (same filesystem, so the commit is a
//! rename) and its sha256 checked while it streams, before anything in the
//! destination changes.
//!
//! Staged files are written through a buffer and made durable together by
//! one `syncfs` of the destination's filesystem, before any rename.
//!
//! The staging directory is `<dest>/.pluginsync-staging` (0700), never
//! synced or purged. A run that fails here removes it, and also removes the
//! destination directories it had to create to hold it, so a failed first
//! sync leaves nothing behind. A staging directory left by a killed run is
//! removed by the next one.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use futures_util::StreamExt;

use pluginsync_common::checksum::Sha256Stream;
use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{FrameDecoder, FrameEvent, MAX_BATCH};

use crate::client::{Client, FetchError, Source};

/// Batch requests in flight.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// Reads one batch answer into staged files named `<prefix>.<i>`; returns
/// digest → staged file for every frame that arrived whole and verified.
/// A missing frame (`-`) is simply absent; a broken stream ends the batch
/// early with what it has, and the partial file is removed. The frames are
/// decoded by the common [`FrameDecoder`] (docs/protocol.md §7.2).
async fn fetch_batch(
    client: &Client,
    src: &Source<'_>,
    hashes: &[Sha256],
    prefix: &std::path::Path,
) -> Result<HashMap<Sha256, PathBuf>, FetchError> {
    use std::io::Write;
    let resp = client.batch(src, hashes).await?;
    let mut body = resp.bytes_stream();
    let mut got = HashMap::new();
    let mut decoder = FrameDecoder::new();
    // The frame being written: (file, path, hasher).
    let mut current: Option<(std::fs::File, PathBuf, Sha256Stream)> = None;
    let mut n = 0usize;
    let fail = |detail: String| FetchError::Download {
        server: src.server.to_owned(),
        what: format!("a {} batch", src.mount),
        detail,
    };
    loop {
        while let Some(event) = decoder.next_event().map_err(|e| fail(e.to_string()))? {
            match event {
                FrameEvent::Missing(sha) | FrameEvent::Begin { digest: sha, .. }
                    if !hashes.contains(&sha) =>
                {
                    return Err(fail(format!("unrequested blob {sha}")));
                }
                FrameEvent::Missing(_) => {}
                FrameEvent::Begin { .. } => {
                    let path = prefix.with_extension(n.to_string());
                    n += 1;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&path)
                        .map_err(|e| fail(format!("cannot create '{}': {e}", path.display())))?;
                    current = Some((file, path, Sha256Stream::new()));
                }
                FrameEvent::Data(bytes) => {
                    let (file, _, hasher) = current.as_mut().expect("data inside a frame");
                    hasher.update(bytes);
                    file.write_all(bytes)
                        .map_err(|e| fail(format!("cannot write a staged file: {e}")))?;
                }
                FrameEvent::End(sha) => {
                    let (file, path, hasher) = current.take().expect("end of a frame");
                    drop(file);
                    if hasher.digest() == sha {
                        got.insert(sha, path);
                    } else {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
        match body.next().await {
            Some(Ok(chunk)) => decoder.feed(&chunk),
            Some(Err(e)) => {
                tracing::info!(error = %crate::client::request_error(&e), "batch cut; the rest is fetched singly");
                break;
            }
            None => break,
        }
    }
    if let Some((_, path, _)) = current.take() {
        let _ = std::fs::remove_file(path);
    }
    Ok(got)
}
use crate::listing::STAGING_DIR;

/// The staged downloads of one destination.
#[derive(Debug)]
pub struct Staging {
    /// The staging directory.
    pub dir: PathBuf,
    /// Destination directories created to hold it, deepest first.
    created: Vec<PathBuf>,
    /// Relative path → staged file, for every verified download.
    pub files: HashMap<PathBuf, PathBuf>,
}

/// Removes a staging directory left by an interrupted run, if any.
pub fn clean_stale(dest: &Path) -> std::io::Result<()> {
    let dir = dest.join(STAGING_DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(&dir),
        Ok(_) => std::fs::remove_file(&dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl Staging {
    /// Makes sure `dest` exists (recording what had to be created) and
    /// creates a fresh staging directory in it.
    pub fn prepare(dest: &Path) -> std::io::Result<Staging> {
        let mut created = Vec::new();
        let mut p = dest;
        while !p.exists() {
            created.push(p.to_owned());
            match p.parent() {
                Some(parent) => p = parent,
                None => break,
            }
        }
        std::fs::create_dir_all(dest)?;
        clean_stale(dest)?;
        let dir = dest.join(STAGING_DIR);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Staging {
            dir,
            created,
            files: HashMap::new(),
        })
    }

    /// Undoes [`Staging::prepare`]: removes the staged files and the
    /// directories created for them (if still empty).
    pub fn abort(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove the staging directory");
        }
        for d in &self.created {
            let _not_empty_is_fine = std::fs::remove_dir(d);
        }
    }

    /// Removes the (now empty) staging directory after a commit.
    pub fn finish(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove the staging directory");
        }
    }

    /// Fetches the distinct checksums of `writes` through the master's
    /// batch endpoint, [`MAX_BATCH`] per request, [`BATCHES_IN_FLIGHT`] at a
    /// time; each frame is written straight to its staged file (plain
    /// blocking writes: small and local, and far cheaper than a thread
    /// hand-off per operation) and verified. Returns the writes still to
    /// fetch singly.
    async fn download_batched(
        &mut self,
        client: &Client,
        src: &Source<'_>,
        writes: Vec<(PathBuf, String)>,
    ) -> Result<Vec<(PathBuf, String)>, FetchError> {
        let mut by_sha: HashMap<Sha256, Vec<PathBuf>> = HashMap::new();
        let mut rest = Vec::new();
        for (rel, sha) in writes {
            match Sha256::from_hex(&sha) {
                Ok(digest) => by_sha.entry(digest).or_default().push(rel),
                Err(_) => rest.push((rel, sha)),
            }
        }
        let shas: Vec<Sha256> = by_sha.keys().copied().collect();
        let dir = self.dir.clone();
        let jobs = shas.chunks(MAX_BATCH).enumerate().map(|(n, chunk)| {
            let dir = dir.clone();
            let chunk = chunk.to_vec();
            async move {
                let got = fetch_batch(client, src, &chunk, &dir.join(format!("b{n}"))).await;
                (chunk, got)
            }
        });
        let mut stream = futures_util::stream::iter(jobs).buffer_unordered(BATCHES_IN_FLIGHT);
        while let Some((chunk, got)) = stream.next().await {
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    tracing::info!(error = %e, "batch failed, fetching its files singly");
                    HashMap::new()
                }
            };
            for sha in chunk {
                let rels = by_sha.remove(&sha).unwrap_or_default();
                match got.get(&sha) {
                    Some(first) => {
                        for (k, rel) in rels.into_iter().enumerate() {
                            let tmp = if k == 0 {
                                first.clone()
                            } else {
                                let copy = first.with_extension(format!("c{k}"));
                                std::fs::copy(first, &copy).map_err(|e| {
                                    FetchError::Setup(format!("cannot copy a staged file: {e}"))
                                })?;
                                copy
                            };
                            self.files.insert(rel, tmp);
                        }
                    }
                    None => rest.extend(rels.into_iter().map(|r| (r, sha.to_hex()))),
                }
            }
        }
        Ok(rest)
    }

    /// Downloads `writes` (relative path, sha256) with `parallel` in flight;
    /// the first failure stops the rest and is returned.
    pub async fn download_all(
        &mut self,
        client: &Client,
        src: &Source<'_>,
        writes: Vec<(PathBuf, String)>,
        parallel: usize,
    ) -> Result<(), FetchError> {
        // Batches first where the master offers them; whatever they do not
        // deliver (not found, changed, a cut stream) is fetched singly.
        let writes = if src.batch.is_some() && writes.len() > 1 {
            self.download_batched(client, src, writes).await?
        } else {
            writes
        };
        let base = self.files.len();
        let jobs = writes.into_iter().enumerate().map(|(i, (rel, sha256))| {
            let i = base + i;
            let tmp = self.dir.join(i.to_string());
            async move {
                let setup = |e: std::io::Error| FetchError::Download {
                    server: src.server.to_owned(),
                    what: format!("{}/{}", src.mount, rel.display()),
                    detail: format!("cannot create the staged file '{}': {e}", tmp.display()),
                };
                let std_file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(setup)?;
                // Buffered: a small file is one write, not one per frame.
                let mut file = tokio::io::BufWriter::with_capacity(
                    256 * 1024,
                    tokio::fs::File::from_std(std_file),
                );
                let rel_str = rel.to_str().unwrap_or_default().to_owned();
                client.download(src, &rel_str, &sha256, &mut file).await?;
                tokio::io::AsyncWriteExt::flush(&mut file)
                    .await
                    .map_err(setup)?;
                Ok::<_, FetchError>((rel, tmp))
            }
        });
        let mut stream = futures_util::stream::iter(jobs).buffer_unordered(parallel.max(1));
        while let Some(result) = stream.next().await {
            let (rel, tmp) = result?;
            self.files.insert(rel, tmp);
        }
        drop(stream);
        // One syncfs for every staged file instead of one fsync each: the
        // data is durable before any rename makes it visible.
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let d = std::fs::File::open(&dir)?;
            rustix::fs::syncfs(&d)?;
            Ok(())
        })
        .await
        .map_err(|e| FetchError::Setup(format!("syncfs task: {e}")))?
        .map_err(|e| {
            FetchError::Setup(format!(
                "cannot sync the staged files in '{}': {e}",
                self.dir.display()
            ))
        })?;
        Ok(())
    }
}
