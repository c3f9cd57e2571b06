//! Which generations are signed, as a master with `[trust] root` sees them
//! (docs/trust.md#what-the-masters-serve): the metadata the deploy
//! pipeline wrote in `[trust] metadata`, verified from the root with
//! `common::trust` (the agents' verification), and each generation's
//! [`State`]: signed (until the metadata expires), expired, or unsigned.
//!
//! The store publishes a generation only while it is [`State::Signed`]
//! (`store/publish.rs`); `check`, the inventory and `/metrics` report the
//! states. The directory is read again whenever its files change
//! ([`Signatures::refresh`] compares names, sizes and times), so metadata
//! signed after a tree was deployed is seen without a restart. `config.rs`
//! makes the [`Settings`]; nothing here reads the config file's types.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::mutex::lock;
use pluginsync_common::trust::{Expiry, Trusted, load_dir};

/// `[trust] root` and what goes with it in master.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The root metadata the signatures are verified from.
    pub root: PathBuf,
    /// Where the pipeline writes the metadata (`[trust] metadata`).
    pub metadata: PathBuf,
    /// How long past its expiry metadata still makes a generation signed
    /// (`[trust] grace`).
    pub grace: Duration,
}

/// A generation as the signatures see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A target of metadata valid until `expires` (plus the grace).
    Signed {
        /// The earliest expiry of the metadata that signs it.
        expires: SystemTime,
    },
    /// A target, but of metadata past `expires` and the grace.
    Expired {
        /// When the metadata expired.
        expires: SystemTime,
    },
    /// Not a target, or no metadata verifies: why, in one line.
    Unsigned(String),
}

impl State {
    /// `signed`, `expired` or `unsigned`: the metric's `state` label.
    pub fn label(&self) -> &'static str {
        match self {
            State::Signed { .. } => "signed",
            State::Expired { .. } => "expired",
            State::Unsigned(_) => "unsigned",
        }
    }

    /// The label with the expiry, as `check` and the inventory print it:
    /// `signed until 2027-01-01T00:00:00Z`.
    pub fn describe(&self) -> String {
        let at = |t: &SystemTime| humantime::format_rfc3339_seconds(*t).to_string();
        match self {
            State::Signed { expires } => format!("signed until {}", at(expires)),
            State::Expired { expires } => format!("expired at {}", at(expires)),
            State::Unsigned(_) => "unsigned".to_owned(),
        }
    }
}

/// Why the metadata does not verify: tough's refusal (a
/// `common::trust::TrustError`, as one line), kept to say again.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Unverified(String);

/// The verified metadata, reloaded when the directory changes.
#[derive(Debug)]
pub struct Signatures {
    settings: Option<Settings>,
    /// tough's datastore for this process: versions only move forward.
    datastore: Option<tempfile::TempDir>,
    loaded: Mutex<Loaded>,
    /// Generations already warned about as not published.
    warned: Mutex<HashSet<(EnvName, GenerationId)>>,
}

#[derive(Debug, Default)]
struct Loaded {
    /// The directory's files (name, size, mtime) when last loaded.
    seen: Option<Vec<(String, u64, Option<SystemTime>)>>,
    trusted: Option<Result<Arc<Trusted>, Unverified>>,
}

impl Signatures {
    /// Off with `None`: every generation is published, none is checked.
    pub fn new(settings: Option<Settings>) -> Signatures {
        let datastore = settings.as_ref().and_then(|_| tempfile::tempdir().ok());
        Signatures {
            settings,
            datastore,
            loaded: Mutex::new(Loaded::default()),
            warned: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `[trust] root` is set.
    pub fn is_on(&self) -> bool {
        self.settings.is_some()
    }

    /// Reads the metadata again if its files changed since last read;
    /// true when they did. Blocking: call it off the async workers (it
    /// runs tough's loader to completion).
    pub fn refresh(&self) -> bool {
        let Some(settings) = &self.settings else {
            return false;
        };
        let now = listing(&settings.metadata);
        if lock(&self.loaded).seen.as_ref() == Some(&now) {
            return false;
        }
        let result = verify(settings, self.datastore.as_ref().map(|d| d.path()));
        if let Err(error) = &result {
            tracing::warn!(metadata = %settings.metadata.display(), %error, "the signed metadata does not verify: no new generation is published until it does");
        }
        let mut loaded = lock(&self.loaded);
        loaded.seen = Some(now);
        loaded.trusted = Some(result.map(Arc::new));
        true
    }

    /// The state of generation `id` of `env`, whose manifest is `len`
    /// bytes when known, under the metadata the last
    /// [`Signatures::refresh`] read; [`State::Unsigned`] when off.
    pub fn state(&self, env: &EnvName, id: &GenerationId, len: Option<u64>) -> State {
        let (Some(settings), Some(trusted)) = (&self.settings, self.trusted()) else {
            return State::Unsigned("[trust] root is not set".to_owned());
        };
        let trusted = match trusted {
            Ok(t) => t,
            Err(e) => return State::Unsigned(e.0),
        };
        if let Err(e) = trusted.check_target(env, id, len) {
            return State::Unsigned(e.to_string());
        }
        let expires = trusted.expires();
        match SystemTime::now() > expires + settings.grace {
            true => State::Expired { expires },
            false => State::Signed { expires },
        }
    }

    /// What the last [`Signatures::refresh`] read; never reads (so never
    /// blocks): before the first read, nothing is signed.
    fn trusted(&self) -> Option<Result<Arc<Trusted>, Unverified>> {
        let loaded = lock(&self.loaded).trusted.clone();
        Some(
            loaded.unwrap_or_else(|| {
                Err(Unverified("the signed metadata is not read yet".to_owned()))
            }),
        )
    }

    /// Why the metadata last read does not verify (`None`: it does, or
    /// `[trust] root` is not set).
    pub fn error(&self) -> Option<String> {
        match &lock(&self.loaded).trusted {
            Some(Err(e)) => Some(e.0.clone()),
            _ => None,
        }
    }

    /// True the first time generation `id` of `env` is refused
    /// publication: one warning per generation, not per build.
    pub fn first_refusal(&self, env: &EnvName, id: &GenerationId) -> bool {
        lock(&self.warned).insert((env.clone(), *id))
    }
}

/// The metadata directory's files, sorted: what [`Signatures::refresh`]
/// compares.
fn listing(dir: &Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let md = e.metadata().ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                md.len(),
                md.modified().ok(),
            ))
        })
        .collect();
    files.sort();
    files
}

/// Loads the metadata of `settings` with tough, to completion, on this
/// thread; expiry is judged per generation ([`Signatures::state`]).
fn verify(settings: &Settings, datastore: Option<&Path>) -> Result<Trusted, Unverified> {
    let Some(datastore) = datastore else {
        return Err(Unverified(
            "no temporary directory for the trust datastore".to_owned(),
        ));
    };
    let expiry = Expiry {
        grace: settings.grace,
        ignore: true,
    };
    let load = load_dir(&settings.root, datastore, &settings.metadata, expiry);
    let result = match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(load),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Unverified(e.to_string()))?
            .block_on(load),
    };
    result.map_err(|e| Unverified(e.to_string()))
}
