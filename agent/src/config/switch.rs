//! `[switch]` of agent.toml: how many previous generations the switch
//! keeps beside each destination (`commit/switch.rs`), and when it makes a
//! change durable with one `syncfs`; each value checked where it is read.

use serde::Deserialize;

/// `[switch]` in agent.toml (docs/agent.md#generations-and-rollback).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwitchConfig {
    /// Previous generations kept beside each destination for `rollback`
    /// (1 to [`MAX_KEEP_PREVIOUS`]).
    #[serde(deserialize_with = "keep_previous")]
    pub keep_previous: usize,
    /// A change of up to `SYNCFS_ABOVE` files is made durable with one
    /// `syncfs` of its filesystem while the machine holds at most this
    /// many MiB of dirty and under-writeback data, else one `fsync` per
    /// file and directory (`common/src/fsutil.rs`, module docs); 0: always
    /// one by one. At most [`MAX_SYNCFS_BELOW_DIRTY_MIB`].
    #[serde(deserialize_with = "syncfs_below_dirty_mib")]
    pub syncfs_below_dirty_mib: u64,
}

/// The largest `[switch] syncfs_below_dirty_mib` (1 TiB).
pub const MAX_SYNCFS_BELOW_DIRTY_MIB: u64 = 1 << 20;

/// `syncfs_below_dirty_mib`, checked.
fn syncfs_below_dirty_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n > MAX_SYNCFS_BELOW_DIRTY_MIB {
        return Err(serde::de::Error::custom(format!(
            "syncfs_below_dirty_mib must be at most {MAX_SYNCFS_BELOW_DIRTY_MIB}, not {n}"
        )));
    }
    Ok(n)
}

/// The most previous generations `[switch] keep_previous` may keep.
pub const MAX_KEEP_PREVIOUS: usize = 16;

/// `keep_previous`, checked.
fn keep_previous<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if !(1..=MAX_KEEP_PREVIOUS).contains(&n) {
        return Err(serde::de::Error::custom(format!(
            "keep_previous must be between 1 and {MAX_KEEP_PREVIOUS}, not {n}"
        )));
    }
    Ok(n)
}

impl SwitchConfig {
    /// Each setting by its dotted name, as `pluginsync-agent config` shows it.
    pub fn values(&self) -> [(&'static str, String); 2] {
        [
            ("switch.keep_previous", self.keep_previous.to_string()),
            (
                "switch.syncfs_below_dirty_mib",
                self.syncfs_below_dirty_mib.to_string(),
            ),
        ]
    }
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            keep_previous: 1,
            syncfs_below_dirty_mib: 4,
        }
    }
}
