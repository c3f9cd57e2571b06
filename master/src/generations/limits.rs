//! `[generations]` as the generation store reads it: how many generations
//! it keeps, where, within what bound, and how long a stock agent stays
//! pinned (docs/deploys.md#generations). `config.rs` parses the key into
//! this type; the store never reads the config file's types.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// `[generations]` (docs/deploys.md#generations).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Generations kept per environment, the current one included.
    pub keep: usize,
    /// The store's directory; unset: a temporary one, removed on exit.
    pub dir: Option<PathBuf>,
    /// The store's bound in MiB: beyond it, the oldest non-current go.
    pub max_mib: u64,
    /// How long a stock Puppet agent stays on the generation its run began
    /// with (docs/protocol.md §7.6); `"0s"` (the default): never pinned.
    #[serde(with = "humantime_serde")]
    pub pin: Duration,
    /// How long between background passes re-hashing every blob and
    /// manifest (docs/deploys.md#scrubbing-the-store); `"0s"`: none.
    #[serde(with = "humantime_serde")]
    pub scrub_interval: Duration,
    /// What a pass reads, in MiB a second at most; 0: no pass.
    pub scrub_mib_per_second: u64,
}

impl Default for Limits {
    fn default() -> Self {
        let pin = Duration::ZERO; // off: docs/protocol.md §7.6 says when to turn it on
        Limits {
            keep: 5,
            dir: None,
            max_mib: 2048,
            pin,
            scrub_interval: Duration::from_secs(24 * 3600),
            scrub_mib_per_second: 8,
        }
    }
}
