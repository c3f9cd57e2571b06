//! `sync --from-bundle FILE` (docs/agent.md#offline-from-a-bundle,
//! docs/protocol.md §7.7): a generation from a bundle instead of a master.
//! The bundle is read and checked whole (`read_bundle`: every digest, the
//! header's seal, every byte) while its blobs are written to
//! `<vardir>/bundle-blobs/`; only then is anything planned. The run is a
//! network run's from there on — plans from the manifest, the removal
//! guard, staging (copies of the blobs), the commit, the report with the
//! generation, the loads, the cache — and makes no request at all. Under
//! `[trust]`, the generation is verified against the signed metadata the
//! bundle carries before anything is planned (docs/trust.md#signed-bundles).

use std::path::Path;
use std::sync::Arc;

use pluginsync_common::bundle::read_bundle;

use super::apply::begin_staging;
use super::blobs::Blobs;
use super::dest::{Planned, Staged};
use super::generation::{GenerationError, Held};
use super::{Run, SyncError};
use crate::cache::GenerationRecord;
use crate::client::{MAX_LISTING_BYTES, Offers};
use crate::progress::Progress;
use crate::servers::Origin;
use crate::settings::Source;

/// The largest blob a bundle may hold (each is checked in memory).
const MAX_BLOB: u64 = MAX_LISTING_BYTES as u64;

impl Run<'_> {
    /// The bundle at `path`, read and checked whole; the run's environment
    /// becomes the bundle's (refused when `--environment` names another).
    pub(super) async fn bundled(&mut self, path: &Path) -> Result<Held, SyncError> {
        let vardir = &self.settings.vardir;
        let io = |source| GenerationError::BundleIo {
            path: path.to_owned(),
            source,
        };
        let blobs = Blobs::create(vardir).map_err(io)?;
        let file = std::fs::File::open(path).map_err(io)?;
        let read = read_bundle(std::io::BufReader::new(file), MAX_BLOB, |d, b| {
            blobs.put(d, b)
        })
        .map_err(|source| GenerationError::Bundle {
            path: path.to_owned(),
            source,
        })?;
        let header = read.header;
        let env = crate::config::environment(&header.environment).map_err(|_| {
            GenerationError::BundleEnvironment {
                path: path.to_owned(),
                bundle: header.environment.clone(),
                asked: None,
            }
        })?;
        if self.settings.environment_origin == Source::CommandLine
            && env != self.settings.environment
        {
            return Err(GenerationError::BundleEnvironment {
                path: path.to_owned(),
                bundle: header.environment,
                asked: Some(self.settings.environment.to_string()),
            }
            .into());
        }
        if let Some(config) = &self.settings.trust {
            // Never an unsigned bundle (docs/trust.md#signed-bundles).
            let len = read.manifest_bytes.len() as u64;
            let generation = (&env, &header.generation, len);
            crate::trust::verify_bundle(config, vardir, &read.trust, generation).await?;
            self.phase("bundle verified");
        }
        tracing::info!(bundle = %path.display(), environment = %env, generation = %header.generation.short(), "syncing from a bundle");
        self.report.environment = env.to_string();
        let mut record = GenerationRecord::load(vardir, env.as_str());
        record.server.clear();
        record.assignment_etag = None;
        self.env = env;
        self.phase("bundle read");
        Ok(Held {
            id: header.generation,
            manifest: Some(read.manifest),
            fresh: Some(read.manifest_bytes),
            record,
            changed: true,
            origin: Origin {
                server: String::new(),
                offers: Offers::generation(),
            },
            blobs: Some(blobs),
            trust: None,
        })
    }

    /// Phase 2 for every destination from the bundle's blobs (copies).
    pub(super) fn stage_bundled(
        &self,
        planned: Vec<Planned>,
        blobs: &Blobs,
    ) -> Result<Vec<Staged>, SyncError> {
        let progress = Arc::new(Progress::default());
        let mut staged = Vec::with_capacity(planned.len());
        for d in planned {
            let Some((mut staging, writes)) =
                begin_staging(&d.pass, self.settings.switch.keep_previous)?
            else {
                staged.push(d.staged(None));
                continue;
            };
            staging
                .copy_in(writes, |d| blobs.path(d), &progress)
                .map_err(SyncError::Download)?;
            staging.wait_premade();
            staged.push(d.staged(Some(staging)));
        }
        // Sealed by `prepare_all` (stage.rs, module docs).
        Ok(staged)
    }
}
