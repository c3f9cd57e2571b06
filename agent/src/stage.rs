//! Stage and verify: every new or changed file is downloaded into the
//! destination's staging directory (same filesystem, so the commit is a
//! rename) and its sha256 checked while it streams, before anything in the
//! destination changes. Every file the agent writes before the commit is
//! written here: the client only hands over bodies.
//!
//! Staged files are written through a buffer. Once every download of the
//! run is verified, [`Staging::seal_into`] gives each staged file its
//! planned mode and adds it to a durability set: content and mode are on
//! disk before any rename makes the file visible, at the cost of those
//! files only: one `fsync` each, or one `syncfs` per filesystem above
//! [`SYNCFS_ABOVE`] files ([`pluginsync_common::fsutil`] has the
//! measurement). A destination committed in place syncs that set
//! ([`sync_sealed`]) before its first rename; one that switches syncs it
//! with its standby, before the exchange (renamed into the standby, a file
//! is visible to nobody yet: docs/internals.md#the-switch). A run that
//! downloads nothing seals nothing and makes no sync call.
//!
//! The staging directory is `<dest>/.pluginsync-staging` (0700), never
//! synced or purged. A [`Staging`] is a transaction: dropped before
//! [`Staging::finish`] (a failed download, a failure in another
//! destination, an early return), it removes the staging directory and the
//! destination directories it had to create to hold it, so a failed first
//! sync leaves nothing behind. A staging directory left by a killed run is
//! removed by the next one.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use tokio::io::{AsyncSeekExt, AsyncWriteExt, BufWriter};

use pluginsync_common::checksum::Sha256Stream;
use pluginsync_common::digest::Sha256;
use pluginsync_common::fsutil::{Durable, Need, SYNCFS_ABOVE};
use pluginsync_common::protocol::{FrameDecoder, FrameEvent, MAX_BATCH};
use pluginsync_common::relpath::RelPath;

use crate::client::{Body, BodyError, FetchError, Undelivered};
use crate::listing::{MODE_MASK, STAGING_DIR};
use crate::progress::Progress;
use crate::servers::{Servers, Source};

/// Batch requests in flight.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// Digests per batch request: 100 × 72 bytes of query (`sha256=`, 64 hex
/// digits, `&`) keep the request line under 8 KiB with a batch path of up
/// to ~700 bytes, the line a cache or balancer in front reads by default
/// (nginx's `large_client_header_buffers`, which answers a longer one
/// `414` and closes the connection; Apache's `LimitRequestLine`), test
/// `nginx_cache::batches_fit_the_request_line_a_cache_reads`. The master
/// takes up to [`MAX_BATCH`].
pub const BATCH_PER_REQUEST: usize = 100;
const _: () = assert!(BATCH_PER_REQUEST <= MAX_BATCH);

/// Staging failed; nothing in the destination changed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A download failed (the master, the network, a checksum, writing its
    /// staged file).
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A staged file could not be copied for a second path with the same
    /// content.
    #[error("cannot copy a staged file: {0}")]
    Copy(#[source] std::io::Error),
    /// A staged file could not be given its mode or made durable.
    #[error("cannot sync the staged file '{}': {source}", path.display())]
    Sync {
        /// The staged file (or the staging directory).
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

mod writeback;

pub use writeback::{WRITEBACK_ABOVE, Writeback};

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

/// Creates a staged file: new, owner-only.
fn create(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// The staged downloads of one destination; see the module docs for what
/// dropping it undoes.
#[derive(Debug)]
pub struct Staging {
    /// The staging directory.
    pub dir: PathBuf,
    /// Destination directories created to hold it, deepest first; kept by
    /// [`Staging::finish`], removed (if still empty) by a drop before it.
    created: Vec<PathBuf>,
    /// Relative path → staged file, for every verified download.
    pub files: HashMap<RelPath, PathBuf>,
    /// The planned mode of each file to stage (relative path → mode),
    /// when known before the downloads: a batch's files are given it as
    /// they are written, through their open descriptor.
    pub modes: HashMap<RelPath, u32>,
    /// Staged files given their mode as they were written (file → mode):
    /// [`Staging::seal_into`] sets only the others.
    preset: HashMap<PathBuf, u32>,
    /// The early writeback of a big staging ([`Writeback`]), kept running
    /// until the standby is prepared, then stopped ([`Staging::stop_writeback`]).
    pub writeback: Option<Writeback>,
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
        // From here on a failure undoes the directories just created.
        let staging = Staging {
            dir: dest.join(STAGING_DIR),
            created,
            files: HashMap::new(),
            modes: HashMap::new(),
            preset: HashMap::new(),
            writeback: None,
        };
        clean_stale(dest)?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging.dir)?;
        Ok(staging)
    }

    /// Stops its early writeback, if any: the durability step that
    /// follows syncs what is left.
    pub fn stop_writeback(&self) {
        if let Some(w) = &self.writeback {
            w.stop();
        }
    }

    /// Ends the transaction after a commit: removes the (now empty) staging
    /// directory and keeps the destination directories it created.
    pub fn finish(mut self) {
        self.created.clear();
    }

    /// The destination directories [`Staging::prepare`] created, deepest
    /// first: the commit makes their entries durable.
    pub fn created(&self) -> &[PathBuf] {
        &self.created
    }

    /// Gives every staged file its mode from `modes` (relative path →
    /// planned mode, masked with [`MODE_MASK`]) and adds it to `durable`
    /// (synced by the caller, module docs). Every file is opened from the
    /// staging directory without following a link (as the commit does,
    /// docs/internals.md#commit).
    pub fn seal_into(
        &self,
        modes: &HashMap<&RelPath, u32>,
        durable: &mut Durable,
    ) -> Result<(), StageError> {
        use rustix::fs::{Mode, OFlags};
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |e: rustix::io::Errno| StageError::Sync {
                path,
                source: e.into(),
            }
        };
        let dir = rustix::fs::open(
            &self.dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail(&self.dir))?;
        // Synced whole (one `syncfs`), so no file needs a descriptor of its
        // own: its mode is set by name, relative to the staging directory's
        // descriptor — only when that directory is still the one this agent
        // made (its owner, mode 0700: nobody else can have put a link in
        // it), else file by file below, each opened without following one.
        let st = rustix::fs::fstat(&dir).map_err(fail(&self.dir))?;
        let ours = st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o077 == 0;
        if ours && self.files.len() > SYNCFS_ABOVE {
            for (rel, tmp) in &self.files {
                if let Some(mode) = modes.get(rel)
                    && self.preset.get(tmp) != Some(&(mode & MODE_MASK))
                {
                    let name = tmp.file_name().unwrap_or_default();
                    rustix::fs::chmodat(
                        &dir,
                        name,
                        Mode::from_raw_mode(mode & MODE_MASK),
                        rustix::fs::AtFlags::empty(),
                    )
                    .map_err(fail(tmp))?;
                }
            }
            return durable
                .add_whole(dir.as_fd(), self.files.len(), &self.dir)
                .map_err(|source| StageError::Sync {
                    path: self.dir.clone(),
                    source,
                });
        }
        for (rel, tmp) in &self.files {
            let name = tmp.file_name().unwrap_or_default();
            let fd = rustix::fs::openat(
                &dir,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail(tmp))?;
            if let Some(mode) = modes.get(rel) {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & MODE_MASK))
                    .map_err(fail(tmp))?;
            }
            // fsync, not fdatasync: the mode must be on disk too.
            durable
                .add(fd.as_fd(), Need::All, tmp)
                .map_err(|source| StageError::Sync {
                    path: tmp.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Fetches the distinct checksums of `writes` through the master's
    /// batch endpoint, [`BATCH_PER_REQUEST`] per request, [`BATCHES_IN_FLIGHT`] at a
    /// time; each frame is written straight to its staged file (plain
    /// blocking writes: small and local, and far cheaper than a thread
    /// hand-off per operation) and verified. Returns the writes still to
    /// fetch singly.
    async fn download_batched(
        &mut self,
        client: &Servers,
        src: &Source<'_>,
        writes: Vec<(RelPath, Sha256)>,
        progress: &Progress,
    ) -> Result<Vec<(RelPath, Sha256)>, StageError> {
        let mut by_sha: HashMap<Sha256, Vec<RelPath>> = HashMap::new();
        let mut rest = Vec::new();
        for (rel, digest) in writes {
            by_sha.entry(digest).or_default().push(rel);
        }
        let shas: Vec<Sha256> = by_sha.keys().copied().collect();
        // Each content's file gets the mode of its first path as it is
        // written (one `fchmod`, no lookup by name in a staging directory
        // of thousands later); a copy for another path keeps it.
        let mode_of: HashMap<Sha256, u32> = by_sha
            .iter()
            .filter_map(|(sha, rels)| Some((*sha, self.modes.get(rels.first()?)? & MODE_MASK)))
            .collect();
        let (dir, mode_of) = (&self.dir, &mode_of);
        let jobs = shas
            .chunks(BATCH_PER_REQUEST)
            .enumerate()
            .map(|(n, chunk)| async move {
                let got =
                    fetch_batch(client, src, chunk, &dir.join(format!("b{n}")), mode_of).await;
                (chunk, got)
            });
        let mut stream = futures_util::stream::iter(jobs).buffer_unordered(BATCHES_IN_FLIGHT);
        while let Some((chunk, got)) = stream.next().await {
            let got = got.unwrap_or_else(|e| {
                tracing::info!(error = %e, "batch failed, fetching its files singly");
                HashMap::new()
            });
            for sha in chunk {
                let rels = by_sha.remove(sha).unwrap_or_default();
                match got.get(sha) {
                    Some(first) => {
                        if let Some(mode) = mode_of.get(sha) {
                            self.preset.insert(first.clone(), *mode);
                        }
                        for (k, rel) in rels.into_iter().enumerate() {
                            let tmp = if k == 0 {
                                first.clone()
                            } else {
                                // Named after its frame's file, whole: two
                                // groups' copies never share a name.
                                let mut copy = first.clone().into_os_string();
                                copy.push(format!(".c{k}"));
                                let copy = PathBuf::from(copy);
                                // Its permission bits too.
                                std::fs::copy(first, &copy).map_err(StageError::Copy)?;
                                if let Some(mode) = mode_of.get(sha) {
                                    self.preset.insert(copy.clone(), *mode);
                                }
                                copy
                            };
                            self.files.insert(rel, tmp);
                            progress.file_done();
                        }
                    }
                    None => rest.extend(rels.into_iter().map(|r| (r, *sha))),
                }
            }
        }
        Ok(rest)
    }

    /// Downloads `writes` (relative path, digest) with `parallel` in
    /// flight; the first failure stops the rest and is returned. Nothing is
    /// durable yet: see [`seal`].
    pub async fn download_all(
        &mut self,
        client: &Servers,
        src: &Source<'_>,
        writes: Vec<(RelPath, Sha256)>,
        parallel: usize,
        progress: &Progress,
    ) -> Result<(), StageError> {
        // Batches first where the master offers them; whatever they do not
        // deliver (not found, changed, a cut stream) is fetched singly.
        let writes = if src.origin.serves_batches() && writes.len() > 1 {
            self.download_batched(client, src, writes, progress).await?
        } else {
            writes
        };
        let base = self.files.len();
        let dir = &self.dir;
        let jobs = writes.into_iter().enumerate().map(|(i, (rel, digest))| {
            let mut staged = StagedFile {
                path: dir.join((base + i).to_string()),
                file: None,
            };
            async move {
                let mut take = async |body: Body| staged.take(body, digest).await;
                client
                    .download(src, rel.as_str(), &digest, &mut take)
                    .await?;
                Ok::<_, FetchError>((rel, staged.path))
            }
        });
        let mut stream = futures_util::stream::iter(jobs).buffer_unordered(parallel.max(1));
        while let Some(result) = stream.next().await {
            let (rel, tmp) = result?;
            self.files.insert(rel, tmp);
            progress.file_done();
        }
        Ok(())
    }
}

impl Staging {
    /// Stages `writes` from a local content source instead of a master:
    /// each file is a new copy (mode 0600, as a download) of `blob`'s file
    /// for its digest, which the caller verified (a bundle's blobs,
    /// `sync --from-bundle`, docs/agent.md#offline-from-a-bundle).
    pub fn copy_in(
        &mut self,
        writes: Vec<(RelPath, Sha256)>,
        blob: impl Fn(&Sha256) -> PathBuf,
        progress: &Progress,
    ) -> Result<(), StageError> {
        let base = self.files.len();
        for (i, (rel, digest)) in writes.into_iter().enumerate() {
            let tmp = self.dir.join((base + i).to_string());
            let mut from = std::fs::File::open(blob(&digest)).map_err(StageError::Copy)?;
            let mut to = create(&tmp).map_err(StageError::Copy)?;
            std::io::copy(&mut from, &mut to).map_err(StageError::Copy)?;
            self.files.insert(rel, tmp);
            progress.file_done();
        }
        Ok(())
    }
}

/// Syncs the sealed staged files of the destinations committed in place,
/// all in one [`Durable`] set (module docs), so destinations on one
/// filesystem share its count. Nothing sealed, no call.
pub fn sync_sealed(durable: Durable) -> Result<(), StageError> {
    durable
        .sync_logged("staged files durable")
        .map_err(|(path, source)| StageError::Sync { path, source })
}

impl Drop for Staging {
    /// Removes the staging directory with whatever is still staged in it
    /// and, unless [`Staging::finish`] kept them, the destination
    /// directories created for it (if still empty).
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove the staging directory");
            }
        }
        for d in &self.created {
            let _not_empty_is_fine = std::fs::remove_dir(d);
        }
    }
}

/// One single download's staged file: created on the first answer, started
/// over on every retry.
struct StagedFile {
    path: PathBuf,
    /// Buffered: a small file is one write, not one per frame.
    file: Option<BufWriter<tokio::fs::File>>,
}

impl StagedFile {
    /// Writes `body` into the staged file from its start, hashing as it
    /// goes; succeeds only when the bytes hash to `want`.
    async fn take(&mut self, mut body: Body, want: Sha256) -> Result<u64, BodyError> {
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
                let std_file = create(&self.path).map_err(|e| {
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
            return Err(BodyError::Refused(format!(
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

/// Reads one batch answer into staged files named `<prefix>.<i>`; returns
/// digest → staged file for every frame that arrived whole and verified.
/// A missing frame (`-`) is simply absent; a broken stream ends the batch
/// early with what it has, and the partial file is removed. The frames are
/// decoded by the common [`FrameDecoder`] (docs/protocol.md §7.2).
async fn fetch_batch(
    client: &Servers,
    src: &Source<'_>,
    hashes: &[Sha256],
    prefix: &Path,
    modes: &HashMap<Sha256, u32>,
) -> Result<HashMap<Sha256, PathBuf>, FetchError> {
    use std::io::Write;
    let Some(body) = client.batch(src, hashes).await else {
        // The replica serving this mount now has no batches.
        return Ok(HashMap::new());
    };
    let mut body = body?;
    let mut got = HashMap::new();
    let mut decoder = FrameDecoder::new();
    // The frame being written: (file, path, hasher).
    let mut current: Option<(std::fs::File, PathBuf, Sha256Stream)> = None;
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
                FrameEvent::Begin { .. } => {
                    let path = prefix.with_extension(n.to_string());
                    n += 1;
                    let file = create(&path)
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
                    if hasher.digest() == sha {
                        if let Some(mode) = modes.get(&sha) {
                            use std::os::unix::fs::PermissionsExt;
                            file.set_permissions(std::fs::Permissions::from_mode(*mode))
                                .map_err(|e| fail(format!("cannot chmod a staged file: {e}")))?;
                        }
                        drop(file);
                        got.insert(sha, path);
                    } else {
                        drop(file);
                        let _ = std::fs::remove_file(&path);
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
    if let Some((_, path, _)) = current.take() {
        let _ = std::fs::remove_file(path);
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything under `root`, relative, sorted.
    fn tree(root: &Path) -> Vec<String> {
        let mut all: Vec<String> = walkdir::WalkDir::new(root)
            .min_depth(1)
            .into_iter()
            .map(|e| {
                let e = e.unwrap();
                e.path().strip_prefix(root).unwrap().display().to_string()
            })
            .collect();
        all.sort();
        all
    }

    #[test]
    fn a_staging_dropped_before_its_commit_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        // A first sync: the destination and one parent do not exist yet.
        let dest = tmp.path().join("new/lib");
        let mut staging = Staging::prepare(&dest).unwrap();
        assert!(staging.dir.is_dir());
        for (i, rel) in ["a.rb", "facter/b.rb", "c.sh"].into_iter().enumerate() {
            let path = staging.dir.join(i.to_string());
            std::io::Write::write_all(&mut create(&path).unwrap(), rel.as_bytes()).unwrap();
            staging.files.insert(RelPath::parse(rel).unwrap(), path);
        }
        assert_eq!(tree(tmp.path()).len(), 6, "{:?}", tree(tmp.path()));
        // Dropped mid-way, as on a failed download.
        drop(staging);
        assert_eq!(tree(tmp.path()), Vec::<String>::new());

        // An existing destination stays, empty of staged files.
        std::fs::create_dir(tmp.path().join("lib")).unwrap();
        let dest = tmp.path().join("lib");
        let staging = Staging::prepare(&dest).unwrap();
        create(&staging.dir.join("0")).unwrap();
        drop(staging);
        assert_eq!(tree(tmp.path()), vec!["lib".to_owned()]);

        // Finished (after a commit), the created directories stay.
        let dest = tmp.path().join("other/lib");
        Staging::prepare(&dest).unwrap().finish();
        assert_eq!(
            tree(tmp.path()),
            vec!["lib".to_owned(), "other".to_owned(), "other/lib".to_owned()]
        );
    }
}
