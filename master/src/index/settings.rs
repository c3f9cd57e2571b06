//! `[index]` as the indexes read it: when a changed tree is indexed and
//! published, how many listings each index caches, which environments are
//! warmed (docs/master.md#many-environments). `config.rs` parses the key
//! into this type; the index and the store never read the config file's
//! types.

use std::time::Duration;

use pluginsync_common::config::ConfigError;
use serde::Deserialize;

/// `[index]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Watch the trees with inotify and re-index on change.
    pub watch: bool,
    /// Quiet time after the last change event before re-indexing.
    #[serde(with = "humantime_serde")]
    pub debounce: Duration,
    /// A full re-scan (stat only; unchanged files are not re-hashed) at this
    /// interval, as a backstop for missed events; `"0s"` disables it.
    #[serde(with = "humantime_serde")]
    pub rescan_interval: Duration,
    /// Serialised listings kept per environment (distinct parameter sets).
    pub cached_responses: usize,
    /// Memory those listings may take per environment, in MiB (bodies plus
    /// their gzipped copies); the oldest are dropped first.
    pub cache_mib: usize,
    /// Absolute path globs: a module directory, `lib/` or `facts.d/` whose
    /// real path (or one of its ancestors) matches one is served even though
    /// it is outside the code tree (the environment directory and the
    /// `basemodulepath` entries, real paths). Empty: none is.
    pub allow_external_roots: Vec<String>,
    /// During a deploy (a directory of the environment removed, git at
    /// work, or changes that never pause), the last complete index is kept
    /// until the environment has been quiet this long (docs/deploys.md).
    #[serde(with = "humantime_serde")]
    pub settle: Duration,
    /// A deploy that never settles is published after this long anyway.
    #[serde(with = "humantime_serde")]
    pub settle_max: Duration,
    /// `"watch"` or `"explicit"`.
    pub publish: Publish,
    /// Environments indexed in the background after startup, one at a
    /// time, in this order; `"*"` stands for every other one (by name).
    /// The health check answers `starting` until the named ones are
    /// indexed; any other environment is indexed on its first request
    /// (docs/master.md#many-environments).
    pub warm: Vec<String>,
    /// An index not asked for in this long is dropped (its file digests
    /// kept) and rebuilt on its next request; `"0s"`: never. Ignored under
    /// `publish = "explicit"`.
    #[serde(with = "humantime_serde")]
    pub idle_drop: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            watch: true,
            debounce: Duration::from_millis(200),
            rescan_interval: Duration::from_secs(600),
            cached_responses: 64,
            cache_mib: 64,
            allow_external_roots: Vec::new(),
            settle: DEFAULT_SETTLE,
            settle_max: DEFAULT_SETTLE_MAX,
            publish: Publish::Watch,
            warm: vec!["production".into(), "*".into()],
            idle_drop: DEFAULT_IDLE_DROP,
        }
    }
}

impl Settings {
    /// `allow_external_roots`, compiled: `*` and `?` stay within one path
    /// component; every pattern must be absolute.
    pub fn external_roots(&self) -> Result<globset::GlobSet, ConfigError> {
        crate::environments::external_roots(&self.allow_external_roots)
    }
}

/// Default of `index.settle`: longer than the pauses of a real r10k
/// redeploy, where git or the Forge is fetching the next module and the
/// tree is briefly silent (about 1–2 s per module, measured on r10k redeploys;
/// docs/deploys.md), and
/// short enough that a deploy is served seconds after it ends. r10k's
/// `.r10k-deploy.json`, written when an environment's deploy is done, ends
/// the wait at once.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(5);
/// Default of `index.idle_drop`: two agent runs at Puppet's default
/// 30-minute interval; an environment no node asked for in that long is
/// rebuilt (walk and stat, no unchanged file read) when one does.
pub const DEFAULT_IDLE_DROP: Duration = Duration::from_secs(3600);
/// Default of `index.settle_max`.
pub const DEFAULT_SETTLE_MAX: Duration = Duration::from_secs(60);

/// `index.publish`: what makes a changed tree served (docs/deploys.md#explicit-publishing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Publish {
    /// The watcher re-indexes on change (after `settle` during a deploy).
    #[default]
    Watch,
    /// Only the admin API, `pluginsync-master reindex` or SIGHUP re-index;
    /// the watcher never does (the periodic rescan neither).
    Explicit,
}
