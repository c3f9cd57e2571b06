//! What the pluginsync master and agent must agree on.
//!
//! Everything here is pure logic and serde types, with no runtime and no HTTP
//! stack: the wire metadata of Puppet's v3 file-serving API ([`metadata`]),
//! checksums in Puppet's `{type}value` notation ([`checksum`]), the
//! relative-path newtype that refuses `..` and absolute paths ([`relpath`]),
//! environment names ([`envname`]), Puppet's basename-fnmatch ignore globs
//! ([`ignore`]), TOML config parsing ([`config`]), the path encoding of `file_content` URLs ([`urlpath`]) and
//! PEM loading for TLS ([`tls`]), the wire contract of endpoints, headers,
//! listing queries and batch frames ([`protocol`]), entity tags
//! ([`etag`]), the delta listing format ([`delta`]), the sha256 digest type
//! ([`digest`]), generations and their canonical manifests
//! ([`generation`]), offline bundles ([`bundle`]), rollout placement and node reports
//! ([`rollout`]), file signatures ([`filesig`]), atomic state-file writes
//! ([`fsutil`]), the binaries' one logging setup ([`logging`]) and signed
//! generations verified through TUF ([`trust`]: `tough`, async, no runtime of
//! its own).

pub mod bundle;
pub mod checksum;
pub mod config;
pub mod delta;
pub mod digest;
pub mod envname;
pub mod etag;
pub mod filesig;
pub mod fsutil;
pub mod generation;
pub mod hex;
pub mod ignore;
pub mod logging;
pub mod metadata;
pub mod mutex;
pub mod protocol;
pub mod relpath;
pub mod rollout;
pub mod text;
pub mod tls;
pub mod trust;
pub mod urlpath;

/// The Puppet version pluginsync speaks and announces in `X-Puppet-Version`.
///
/// Stock agents only use it for capability checks (the `locales` mount needs
/// 5.3.4 or later), so announcing the Puppet 7 line we are compatible with is
/// what a Puppet Server 7 would send.
pub const PUPPET_VERSION: &str = "7.23.0";

/// The default ignore globs of Puppet's `pluginsignore` setting.
pub const DEFAULT_IGNORE: [&str; 4] = [".svn", "CVS", ".git", ".hg"];
