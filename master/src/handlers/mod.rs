//! The HTTP handlers, one module per kind of endpoint
//! (docs/internals.md#handlers). They only read the index: no walking, no
//! hashing of sha256 on
//! the request path (other checksum types are computed once, on demand,
//! then cached by the index).
//!
//! - [`files`]: Puppet's `file_metadatas`, `file_metadata` and
//!   `file_content`, and the code that sends an indexed file.
//! - [`blobs`]: pluginsync's content by sha256, single and batched.
//! - [`content`]: how a file's bytes are sent, and may be cached.
//! - [`generations`]: the per-node answer and generation manifests.
//! - [`mod@node_report`]: a node's report, sent right after its commit.
//! - [`mod@status`]: the health check.
//! - [`admin`]: Puppet Server's admin API (`environment-cache`), for deploy
//!   tools; [`inventory`]: the fleet's inventory, paged.
//! - [`reports`]: stock agents' Puppet run reports, from Puppet Server.
//!
//! Every file and blob endpoint passes the same authorization step,
//! [`crate::auth::Gate`], before it looks at an environment.

pub mod admin;
pub mod blobs;
pub mod content;
pub mod files;
pub mod generations;
pub mod inventory;
pub mod node_report;
pub mod reports;
pub mod rollout;
pub mod status;

pub use admin::environment_cache;
pub use blobs::{blob, blobs_batch};
pub use files::{file_content, file_metadata, file_metadatas};
pub use generations::{assignment, manifest};
pub use inventory::inventory;
pub use node_report::node_report;
pub use status::status;
