//! A bundle's blobs on disk (docs/agent.md#offline-from-a-bundle): each
//! verified content written once, by digest, under `<vardir>/bundle-blobs/`
//! (private to the agent), where the run's staging copies them from; the
//! directory goes with the value, whatever way the run ends.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use pluginsync_common::digest::Sha256;

/// A bundle's blobs, one file per digest, removed with this value.
pub(super) struct Blobs {
    dir: PathBuf,
}

impl Blobs {
    /// `<vardir>/bundle-blobs/`, fresh (what a killed run left goes).
    pub(super) fn create(vardir: &Path) -> std::io::Result<Blobs> {
        let dir = vardir.join("bundle-blobs");
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(vardir)?;
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Blobs { dir })
    }

    /// The file holding `digest`'s content.
    pub(super) fn path(&self, digest: &Sha256) -> PathBuf {
        self.dir.join(digest.to_hex())
    }

    /// Writes one verified blob.
    pub(super) fn put(&self, digest: &Sha256, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(self.path(digest))?
            .write_all(bytes)
    }
}

impl Drop for Blobs {
    fn drop(&mut self) {
        let _gone_is_fine = std::fs::remove_dir_all(&self.dir);
    }
}
