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
}

impl Default for Limits {
    fn default() -> Self {
        let pin = Duration::ZERO; // off: docs/protocol.md §7.6 says when to turn it on
        Limits {
            keep: 5,
            dir: None,
            max_mib: 2048,
            pin,
        }
    }
}
