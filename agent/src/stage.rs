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

use crate::client::{Client, FetchError, Source};
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

    /// Downloads `writes` (relative path, sha256) with `parallel` in flight;
    /// the first failure stops the rest and is returned.
    pub async fn download_all(
        &mut self,
        client: &Client,
        src: &Source<'_>,
        writes: Vec<(PathBuf, String)>,
        parallel: usize,
    ) -> Result<(), FetchError> {
        let jobs = writes.into_iter().enumerate().map(|(i, (rel, sha256))| {
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
