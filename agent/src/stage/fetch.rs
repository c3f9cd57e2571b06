//! The two ways a download reaches its staged file: one file's body
//! ([`StagedFile`]) and a batch answer's frames ([`fetch_batch`]), each
//! hashed as it is written and kept only when it matches its digest.

use std::collections::HashMap;
use std::path::PathBuf;

use tokio::io::{AsyncSeekExt, AsyncWriteExt, BufWriter};

use pluginsync_common::checksum::Sha256Stream;
use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{FrameDecoder, FrameEvent};

use super::{create, create_with, give_mode};
use crate::client::{Body, BodyError, FetchError, Undelivered};
use crate::servers::{Servers, Source};

/// One single download's staged file: created on the first answer, started
/// over on every retry.
pub(super) struct StagedFile {
    pub(super) path: PathBuf,
    /// Buffered: a small file is one write, not one per frame.
    pub(super) file: Option<BufWriter<tokio::fs::File>>,
    /// Made in a standby being filled: its directories made on the way.
    pub(super) in_standby: bool,
}

impl StagedFile {
    /// Writes `body` into the staged file from its start, hashing as it
    /// goes; succeeds only when the bytes hash to `want`.
    pub(super) async fn take(&mut self, mut body: Body, want: Sha256) -> Result<u64, BodyError> {
        let refused = |what: &str, e: std::io::Error| BodyError::Refused(format!("{what}: {e}"));
        let file = match self.file.take() {
            Some(mut file) => {
                // A retry starts the staged file over.
                file.flush()
                    .await
                    .map_err(|e| refused("cannot write the staged file", e))?;
                file.get_mut()
                    .set_len(0)
                    .await
                    .map_err(|e| refused("cannot truncate the staged file", e))?;
                file.get_mut()
                    .rewind()
                    .await
                    .map_err(|e| refused("cannot rewind the staged file", e))?;
                file
            }
            None => {
                let std_file = create(&self.path, self.in_standby).map_err(|e| {
                    refused(
                        &format!("cannot create the staged file '{}'", self.path.display()),
                        e,
                    )
                })?;
                BufWriter::with_capacity(256 * 1024, tokio::fs::File::from_std(std_file))
            }
        };
        let file = self.file.insert(file);
        let mut hasher = Sha256Stream::new();
        let mut size = 0u64;
        while let Some(chunk) = body.chunk().await.map_err(BodyError::Cut)? {
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk)
                .await
                .map_err(|e| refused("cannot write the staged file", e))?;
        }
        let got = hasher.digest();
        if want != got {
            return Err(BodyError::Mismatch(format!(
                "content does not match its listed checksum (expected {}, got {})",
                want.to_checksum(),
                got.to_checksum()
            )));
        }
        file.flush()
            .await
            .map_err(|e| refused("cannot write the staged file", e))?;
        Ok(size)
    }
}

/// A frame up to this size is gathered in memory and handed whole to the
/// [`Writer`]; a bigger one is written as it streams.
const GATHER_AT_MOST: u64 = 256 * 1024;

/// Files handed to the [`Writer`] and not written yet, at most: with
/// [`GATHER_AT_MOST`], 16 MiB of memory.
const QUEUED_AT_MOST: usize = 64;

/// Threads writing a batch's files: creating a file costs the filesystem
/// more than receiving it costs this one.
const WRITERS: usize = 2;

/// A verified file's whole content, to be written at `path`.
struct Job {
    sha: Sha256,
    path: PathBuf,
    bytes: Vec<u8>,
    mode: Option<u32>,
    in_standby: bool,
}

/// Writes a batch's small files on a thread of its own
/// (docs/internals.md#stage), while this one reads, decrypts and hashes
/// the next frames: a first sync's thousands of files cost as much in
/// creating and writing them as in receiving them. A file it could not
/// write is removed and said by [`Writer::finish`]: fetched again
/// singly, it fails with its own error.
pub(super) struct Writer {
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    threads: Vec<std::thread::JoinHandle<Vec<(Sha256, std::io::Error)>>>,
}

impl Writer {
    /// Starts its threads; `None` if none can start (frames are then
    /// written as they stream).
    pub(super) fn start() -> Option<Writer> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(QUEUED_AT_MOST);
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        let threads: Vec<_> = (0..WRITERS)
            .filter_map(|_| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name("staged writes".into())
                    .spawn(move || {
                        let mut failed = Vec::new();
                        loop {
                            let next = queue.lock().map(|q| q.recv());
                            let Ok(Ok(job)) = next else {
                                break failed;
                            };
                            if let Err(e) = write_whole(&job) {
                                let _ = std::fs::remove_file(&job.path);
                                failed.push((job.sha, e));
                            }
                        }
                    })
                    .ok()
            })
            .collect();
        (!threads.is_empty()).then_some(Writer {
            jobs: Some(jobs),
            threads,
        })
    }

    /// Hands `job` over, waiting while [`QUEUED_AT_MOST`] are queued;
    /// gives it back if the thread is gone.
    fn send(&self, job: Job) -> Result<(), Job> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Waits until every file handed over is written; the digests of
    /// those that could not be, with why.
    pub(super) fn finish(mut self) -> Vec<(Sha256, std::io::Error)> {
        drop(self.jobs.take());
        std::mem::take(&mut self.threads)
            .into_iter()
            .filter_map(|t| t.join().ok())
            .flatten()
            .collect()
    }
}

/// Creates `job`'s file, writes it and gives it its mode.
fn write_whole(job: &Job) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = create_with(&job.path, job.in_standby, job.mode)?;
    file.write_all(&job.bytes)?;
    if let Some(mode) = job.mode {
        give_mode(&file, mode)?;
    }
    Ok(())
}

/// Why a frame received whole could not be kept.
#[derive(Debug, thiserror::Error)]
enum FrameWriteError {
    /// Its staged file could not be written.
    #[error("cannot write a staged file: {0}")]
    Write(#[source] std::io::Error),
    /// Its staged file could not be given its mode.
    #[error("cannot chmod a staged file: {0}")]
    Chmod(#[source] std::io::Error),
}

/// A frame just received whole.
struct Frame {
    sha: Sha256,
    path: PathBuf,
    verified: bool,
    mode: Option<u32>,
    in_standby: bool,
}

impl Frame {
    /// Keeps it (digest, staged file) when it hashed to its digest:
    /// handed to `writer` (or written here if there is none) when it was
    /// gathered, given its mode when it was written as it streamed;
    /// else removed. An error is said in one line.
    fn end(
        self,
        sink: Sink,
        writer: Option<&Writer>,
    ) -> Result<Option<(Sha256, PathBuf)>, FrameWriteError> {
        let Frame {
            sha,
            path,
            verified,
            mode,
            in_standby,
        } = self;
        match sink {
            Sink::Gathered(bytes) if verified => {
                let job = Job {
                    sha,
                    path: path.clone(),
                    bytes,
                    mode,
                    in_standby,
                };
                let sent = match writer {
                    Some(w) => w.send(job),
                    None => Err(job),
                };
                // No writer thread after all: written here.
                if let Err(job) = sent {
                    write_whole(&job).map_err(|e| {
                        let _ = std::fs::remove_file(&job.path);
                        FrameWriteError::Write(e)
                    })?;
                }
                Ok(Some((sha, path)))
            }
            Sink::Gathered(_) => Ok(None),
            Sink::File(file) if verified => {
                if let Some(mode) = mode {
                    give_mode(&file, mode).map_err(FrameWriteError::Chmod)?;
                }
                Ok(Some((sha, path)))
            }
            Sink::File(file) => {
                drop(file);
                let _ = std::fs::remove_file(&path);
                Ok(None)
            }
        }
    }
}

/// Where a frame goes while it streams: its file, or memory for the
/// [`Writer`].
enum Sink {
    File(std::fs::File),
    Gathered(Vec<u8>),
}

/// Reads one batch answer into staged files, each where `place` puts the
/// frame of a digest (its `n`th file); returns digest → staged file for
/// every frame that arrived whole and verified (written, or handed to
/// `writer` to be: [`Writer::finish`] says which of those failed). A missing frame (`-`) is
/// simply absent; a broken stream ends the batch early with what it has,
/// and the partial file is removed. The frames are decoded by the common
/// [`FrameDecoder`] (docs/protocol.md §7.2).
pub(super) async fn fetch_batch(
    client: &Servers,
    src: &Source<'_>,
    hashes: &[Sha256],
    place: impl Fn(&Sha256, usize) -> PathBuf,
    in_standby: bool,
    modes: &HashMap<Sha256, u32>,
    writer: Option<&Writer>,
) -> Result<HashMap<Sha256, PathBuf>, FetchError> {
    use std::io::Write;
    let Some(body) = client.batch(src, hashes).await else {
        // The replica serving this mount now has no batches.
        return Ok(HashMap::new());
    };
    let mut body = body?;
    let mut got = HashMap::new();
    let mut decoder = FrameDecoder::new();
    // The frame being received: (where it goes, path, hasher).
    let mut current: Option<(Sink, PathBuf, Sha256Stream)> = None;
    let mut n = 0usize;
    let fail = |detail: String| FetchError::Download {
        server: src.origin.server.clone(),
        what: format!("a {} batch", src.mount),
        detail: Undelivered::Rejected(detail),
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
                FrameEvent::Begin { digest, len } => {
                    let path = place(&digest, n);
                    n += 1;
                    let sink = match writer {
                        Some(_) if len <= GATHER_AT_MOST => {
                            Sink::Gathered(Vec::with_capacity(len as usize))
                        }
                        _ => Sink::File(
                            create_with(&path, in_standby, modes.get(&digest).copied()).map_err(
                                |e| fail(format!("cannot create '{}': {e}", path.display())),
                            )?,
                        ),
                    };
                    current = Some((sink, path, Sha256Stream::new()));
                }
                FrameEvent::Data(bytes) => {
                    let (sink, _, hasher) = current.as_mut().expect("data inside a frame");
                    hasher.update(bytes);
                    match sink {
                        Sink::Gathered(buf) => buf.extend_from_slice(bytes),
                        Sink::File(file) => file
                            .write_all(bytes)
                            .map_err(|e| fail(format!("cannot write a staged file: {e}")))?,
                    }
                }
                FrameEvent::End(sha) => {
                    let (sink, path, hasher) = current.take().expect("end of a frame");
                    let frame = Frame {
                        sha,
                        path,
                        verified: hasher.digest() == sha,
                        mode: modes.get(&sha).copied(),
                        in_standby,
                    };
                    if let Some((sha, path)) =
                        frame.end(sink, writer).map_err(|e| fail(e.to_string()))?
                    {
                        got.insert(sha, path);
                    }
                }
            }
        }
        match body.chunk().await {
            Ok(Some(chunk)) => decoder.feed(&chunk),
            Ok(None) => break,
            Err(e) => {
                tracing::info!(error = %e, "batch cut; the rest is fetched singly");
                break;
            }
        }
    }
    if let Some((Sink::File(_), path, _)) = current.take() {
        let _ = std::fs::remove_file(path);
    }
    Ok(got)
}
