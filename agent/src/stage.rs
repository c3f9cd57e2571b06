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

use pluginsync_common::digest::Sha256;
use pluginsync_common::fsutil::{Durable, Need, SYNCFS_ABOVE};
use pluginsync_common::protocol::MAX_BATCH;
use pluginsync_common::relpath::RelPath;

use crate::client::{Body, FetchError};
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

mod fetch;
mod writeback;

use fetch::{StagedFile, fetch_batch};

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

/// Creates a staged file: new, owner-only. In a standby being filled
/// (`in_standby`, [`Staging::fill_standby`]) its directories are made on
/// the way: the standby's container is this user's alone (0700), so no
/// other user can have put a link there.
fn create(path: &Path, in_standby: bool) -> std::io::Result<std::fs::File> {
    create_with(path, in_standby, None)
}

/// [`create`], asking for `mode` (its planned one, when known) instead of
/// owner-only: the staging directory and the standby's container are this
/// user's alone (0700), so no other user can open it before it is whole,
/// and the umask most often leaves it exact ([`give_mode`]).
fn create_with(path: &Path, in_standby: bool, mode: Option<u32>) -> std::io::Result<std::fs::File> {
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode.map_or(0o600, |m| m & MODE_MASK))
            .open(path)
    };
    match open() {
        Err(e) if in_standby && e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(path.parent().unwrap_or(path))?;
            open()
        }
        // Left by a batch that failed part-way, to be fetched again.
        Err(e) if in_standby && e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            open()
        }
        made => made,
    }
}

/// Gives the open staged `file` its planned `mode`, unless it has it
/// already ([`create_with`]): an `fstat` costs less than the `fchmod`
/// (a write of the inode) on each of a first sync's thousands of files.
fn give_mode(file: &std::fs::File, mode: u32) -> std::io::Result<()> {
    let mode = mode & MODE_MASK;
    if rustix::fs::fstat(file)?.st_mode & 0o7777 == mode {
        return Ok(());
    }
    rustix::fs::fchmod(file, rustix::fs::Mode::from_raw_mode(mode))?;
    Ok(())
}

/// A new copy of the staged file `from` at `to`, its permission bits
/// too.
fn copy_staged(from: &Path, to: &Path, in_standby: bool) -> std::io::Result<()> {
    let mut src = std::fs::File::open(from)?;
    let mut dst = create(to, in_standby)?;
    std::io::copy(&mut src, &mut dst)?;
    dst.set_permissions(src.metadata()?.permissions())
}

/// A thread making a standby's directories, giving those it made with
/// their planned mode (`commit::premake`).
pub type Premaking = std::thread::JoinHandle<std::collections::HashSet<RelPath>>;

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
    /// `dir` is a first sync's standby, each file written at its place
    /// there ([`Staging::fill_standby`]).
    pub in_standby: bool,
    /// In a standby: its directories being made while the files download
    /// (`commit::premake`), then the ones made with their planned mode
    /// ([`Staging::premade`]).
    premaking: Option<Premaking>,
    premade: std::collections::HashSet<RelPath>,
    /// Committed ([`Staging::finish`]): a drop removes nothing more.
    finished: bool,
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
            in_standby: false,
            premaking: None,
            premade: std::collections::HashSet::new(),
            finished: false,
        };
        clean_stale(dest)?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging.dir)?;
        Ok(staging)
    }

    /// Stages into `slot` instead, the empty standby of a first sync
    /// (`commit::fresh_standby`): each file is written at its relative
    /// path there, and the commit renames nothing. The standby is not
    /// live until its switch, so a file there is as invisible as in the
    /// staging directory; dropped before [`Staging::finish`], the staging
    /// removes the standby it filled.
    /// `premaking`: the thread making its directories meanwhile
    /// (`commit::premake`).
    pub fn fill_standby(
        &mut self,
        slot: PathBuf,
        premaking: Option<Premaking>,
    ) -> std::io::Result<()> {
        std::fs::remove_dir(&self.dir)?;
        self.premaking = premaking;
        self.dir = slot;
        self.in_standby = true;
        Ok(())
    }

    /// Waits for the standby's directories to be made (once the files are
    /// in: long done by then), for [`Staging::premade`].
    pub fn wait_premade(&mut self) {
        if let Some(p) = self.premaking.take() {
            self.premade = p.join().unwrap_or_default();
        }
    }

    /// The standby's directories made with their planned mode while the
    /// files downloaded (after [`Staging::wait_premade`]).
    pub fn premade(&self) -> &std::collections::HashSet<RelPath> {
        &self.premade
    }

    /// Where the file of `rel` is staged, the `n`th of this staging:
    /// `<dir>/<rel>` in a standby, else `<dir>/<name>`.
    fn place(&self, rel: &RelPath, name: impl FnOnce() -> String) -> PathBuf {
        if self.in_standby {
            rel.to_path(&self.dir)
        } else {
            self.dir.join(name())
        }
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
        self.finished = true;
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
                    let name = self.name_of(tmp);
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
            let name = self.name_of(tmp);
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

    /// A staged file's name relative to the staging directory (a path
    /// below it in a standby, whose directories are all this run's).
    fn name_of<'p>(&self, staged: &'p Path) -> &'p Path {
        staged.strip_prefix(&self.dir).unwrap_or(staged)
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
        // A content's file goes where its first path's would.
        let first: HashMap<Sha256, PathBuf> = match self.in_standby {
            true => (by_sha.iter())
                .filter_map(|(sha, rels)| Some((*sha, rels.first()?.to_path(&self.dir))))
                .collect(),
            false => HashMap::new(),
        };
        let writer = fetch::Writer::start();
        let (dir, in_standby) = (&self.dir, self.in_standby);
        let (mode_of, first, w) = (&mode_of, &first, writer.as_ref());
        let jobs = shas
            .chunks(BATCH_PER_REQUEST)
            .enumerate()
            .map(|(n, chunk)| async move {
                let place = |sha: &Sha256, i: usize| match in_standby {
                    true => first.get(sha).cloned().unwrap_or_default(),
                    false => dir.join(format!("b{n}.{i}")),
                };
                let got = fetch_batch(client, src, chunk, place, in_standby, mode_of, w).await;
                (chunk, got)
            });
        let answers: Vec<_> = futures_util::stream::iter(jobs)
            .buffer_unordered(BATCHES_IN_FLIGHT)
            .collect()
            .await;
        // Every file written before any is copied or counted.
        let unwritten = writer.map(fetch::Writer::finish).unwrap_or_default();
        for (sha, e) in &unwritten {
            tracing::info!(digest = %sha, error = %e, "cannot write a staged file; fetching it singly");
        }
        for (chunk, got) in answers {
            let mut got = got.unwrap_or_else(|e| {
                tracing::info!(error = %e, "batch failed, fetching its files singly");
                HashMap::new()
            });
            for (sha, _) in &unwritten {
                got.remove(sha);
            }
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
                                let copy = self.place(&rel, || {
                                    let name = first.file_name().unwrap_or_default();
                                    format!("{}.c{k}", name.to_string_lossy())
                                });
                                copy_staged(first, &copy, self.in_standby)
                                    .map_err(StageError::Copy)?;
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
        let in_standby = self.in_standby;
        let writes: Vec<_> = (writes.into_iter().enumerate())
            .map(|(i, (rel, digest))| {
                let path = self.place(&rel, || (base + i).to_string());
                (rel, digest, path)
            })
            .collect();
        let jobs = writes.into_iter().map(|(rel, digest, path)| {
            let mut staged = StagedFile {
                path,
                file: None,
                in_standby,
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
            let tmp = self.place(&rel, || (base + i).to_string());
            let mut from = std::fs::File::open(blob(&digest)).map_err(StageError::Copy)?;
            let mut to = create(&tmp, self.in_standby).map_err(StageError::Copy)?;
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
        // A standby it filled stays once committed: it is live, or kept.
        if self.in_standby && self.finished {
            return;
        }
        // Nothing is made in it any more once it is removed.
        self.wait_premade();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_file_gets_its_mode_and_one_that_has_it_is_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let owner_only = create(&t.path().join("a"), false).unwrap();
        give_mode(&owner_only, 0o755).unwrap();
        let md = owner_only.metadata().unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o755);
        // Already 0o700 (no umask takes owner bits): only looked at. An
        // `O_PATH` descriptor can be `fstat`ed but not `fchmod`ed, so a
        // chmod here would be an error.
        drop(create_with(&t.path().join("b"), false, Some(0o700)).unwrap());
        let path_only = rustix::fs::open(
            t.path().join("b"),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let path_only = std::fs::File::from(path_only);
        give_mode(&path_only, 0o700).expect("no chmod for a file that has its mode");
        assert!(
            give_mode(&path_only, 0o755).is_err(),
            "a chmod through O_PATH fails"
        );
    }

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
            std::io::Write::write_all(&mut create(&path, false).unwrap(), rel.as_bytes()).unwrap();
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
        create(&staging.dir.join("0"), false).unwrap();
        drop(staging);
        assert_eq!(tree(tmp.path()), vec!["lib".to_owned()]);

        // Filling a standby: files at their paths there, their directories
        // made on the way; dropped before its commit, the standby goes.
        let slot = tmp.path().join(".lib.pluginsync/next");
        std::fs::create_dir_all(&slot).unwrap();
        let mut staging = Staging::prepare(&dest).unwrap();
        staging.fill_standby(slot.clone(), None).unwrap();
        for rel in ["a.rb", "puppet/type/b.rb", "puppet/type/c.rb"] {
            let rel = RelPath::parse(rel).unwrap();
            let path = staging.place(&rel, || unreachable!("a standby's paths are its own"));
            assert_eq!(path, slot.join(rel.as_str()));
            std::io::Write::write_all(&mut create(&path, true).unwrap(), b"cut").unwrap();
            // Again (a batch cut part-way, fetched singly): a new file,
            // never a write into the old one.
            let old = std::fs::File::open(&path).unwrap();
            std::io::Write::write_all(&mut create(&path, true).unwrap(), b"whole").unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"whole");
            let mut was = String::new();
            std::io::Read::read_to_string(&mut &old, &mut was).unwrap();
            assert_eq!(was, "cut", "written into the old file");
        }
        assert_eq!(
            tree(&slot),
            vec![
                "a.rb",
                "puppet",
                "puppet/type",
                "puppet/type/b.rb",
                "puppet/type/c.rb"
            ]
        );
        assert!(
            !dest.join(STAGING_DIR).exists(),
            "no staging directory left in the live tree"
        );
        drop(staging);
        assert!(!slot.exists());
        std::fs::remove_dir(tmp.path().join(".lib.pluginsync")).unwrap();

        // Finished (after a commit), the created directories stay.
        let dest = tmp.path().join("other/lib");
        Staging::prepare(&dest).unwrap().finish();
        assert_eq!(
            tree(tmp.path()),
            vec!["lib".to_owned(), "other".to_owned(), "other/lib".to_owned()]
        );
    }
}
