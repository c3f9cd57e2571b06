//! The end-to-end test harness: real certificates, real trees on disk, a
//! real master over real TLS on 127.0.0.1, and real child processes.
//!
//! One module per thing it provides; every item is re-exported here, so a
//! test imports from the crate root (`use pluginsync_tests::{Pki, …}`).
//!
//! - `pki`: [`Pki`], a throwaway CA made by the master's own `dev-certs`
//!   code, with agents [`AGENTS`] (`node1`, `node2` and a revoked `revoked`),
//!   or a fleet's certnames ([`Pki::with_agents`]).
//! - `tree`: [`EnvTree`], an environmentpath in a tempdir, built file by
//!   file; [`tree_snapshot`] and [`merged_mount`] to compare trees;
//!   [`sha256_hex`].
//! - `master`: [`config_toml`], [`config_file`] and [`parse_config`]; [`TestMaster`], the
//!   master in-process (its own thread and runtime) on port 0, with its
//!   index counters reachable, stopped on drop; [`MasterProcess`], the
//!   `pluginsync-master` binary as a child process, its port read from its
//!   log, killed on drop.
//! - `client`: [`client()`] and [`raw_get`], an mTLS reqwest client and a raw
//!   HTTP/1.1 request over TLS for paths a URL library would normalise
//!   (`..`); [`wait_for`] to poll until an answer changes.
//! - `agent`: [`AgentHome`], the `pluginsync-agent` binary with its config
//!   and directories in a tempdir; [`AgentRun`], what one run did.
//! - `fake`: [`FakeMaster`], a scripted TLS server for answers a real
//!   master never gives ([`Responder`], [`http_response`]); [`closed_port`].
//! - `faults`: for the agent's commit under faults: [`RunningAgent`] (a
//!   run whose stderr is read as it comes, and signalled), [`Racer`]
//!   (directories swapped for symlinks during commits), [`on_small_tmpfs`]
//!   (a libdir that runs out of inodes).
//! - `hostile`: for hostile-master tests of the agent: [`response_with`]
//!   (extra headers), [`Listener`] (counts connections to a port),
//!   [`listing_json`], [`gzip_zeros`].
//! - `process`: [`bin_path`] and [`repo_root`]; real peers on PATH or a
//!   skip ([`which`], [`require`], [`skipped`]); [`run_logged`] runs a
//!   command under a time limit ([`Finished`]).
//! - `conn`: connections held by hand for the connection-limit tests:
//!   [`ChildMaster`] (the binary with its descriptor limit, RSS and SIGHUP
//!   reachable), [`tls_connect`], [`h1_get`] on a keep-alive connection,
//!   [`H2`] (HTTP/2 that never opens a window), [`write_root_crl`] and
//!   [`ChainedClient`] (an intermediate CA).
//! - `intercept`: [`Interceptor`], a TLS relay in front of a master that
//!   lets a test act between requests ([`Hook`]: a deploy before one
//!   passes, an answer tampered with, [`flip_first_body_byte`]).
//! - `replicas`: masters that die and come back: [`CutProxy`] (a TCP proxy
//!   that holds bytes at an exact count, throttles, goes down and comes
//!   back on its port), [`kill9`], [`Lcg`] (a seeded random sequence).
//! - `deploy`: deploys (docs/deploys.md): [`ControlRepo`] (local git
//!   repositories deployed by the real `r10k`), [`scripted_redeploy`]
//!   (module directories deleted and re-created with pauses),
//!   [`AgentLoop`] (the agent syncing back to back meanwhile),
//!   [`removals`] (what a run reported removed).
//! - [`puppet`]: stock Puppet agents and a throwaway Puppet Server.
//! - [`balancer`]: HAProxy and nginx from `packaging/` in front of Puppet
//!   Server and pluginsync masters' `[proxy]` listeners; nginx's cache in
//!   front of the masters, and the TLS hop from it to a master.
//! - `postgres`: [`Postgres`], Debian's PostgreSQL on a loopback port
//!   with its own data directory, as `nobody`; stopped and started again
//!   by a test; one database per test.
//! - `tuf`: [`TufSigner`], a TUF repository signed with `tough`'s editor
//!   (root 2 of 3, targets, snapshot, timestamp keys made per test).
//! - `puppetdb`: [`puppetdb::PuppetDb`], Debian's PuppetDB with its own
//!   configuration, its database in a test's [`Postgres`]; Puppet
//!   Server's fact store.
//! - `controlrepo`: [`ControlRepo`], a code tree shaped like an
//!   r10k-deployed control repository (`environment.conf`, site-modules,
//!   a glob, `$basemodulepath`) and what each mount must serve from it.

mod agent;
pub mod balancer;
mod client;
mod conn;
mod controlrepo;
mod deploy;
mod fake;
mod faults;
mod hostile;
mod intercept;
mod master;
mod pki;
mod postgres;
mod process;
pub mod puppet;
pub mod puppetdb;
mod replicas;
mod tree;
mod tuf;

pub use agent::{AgentHome, AgentRun};
pub use client::{RawResponse, client, raw_get, ssldir_client, wait_for, wait_ready};
pub use conn::{
    ChainedClient, ChildMaster, H2, H2Frame, closed_within, dated_client_cert, h1_get, identity,
    refused, rss_kib_of, server_cert_for, tls_config, tls_connect, write_root_crl,
};
pub use controlrepo::{ControlRepo, ENVIRONMENT_CONF};
pub use deploy::{
    AgentLoop, ControlRepo as R10kControlRepo, FETCH_LATENCY, ModuleRef, git, removals,
    scripted_redeploy,
};
pub use fake::{FakeMaster, Responder, closed_port, http_response};
pub use faults::{Racer, RunningAgent, on_small_tmpfs};
pub use hostile::{Listener, MeasuredRun, gzip_lines, gzip_zeros, listing_json, response_with};
pub use intercept::{Hook, Interceptor, flip_first_body_byte};
pub use master::{MasterProcess, TestMaster, config_file, config_toml, parse_config};
pub use pki::{AGENTS, Pki};
pub use postgres::Postgres;
pub use process::{
    Finished, bin_path, hand_over, promtool_accepts, repo_root, require, run_logged,
    running_as_root, skipped, unprivileged, which,
};
pub use replicas::{CutProxy, Lcg, kill9};
pub use tree::{EnvTree, merged_mount, sha256_hex, tree_snapshot, without_modes};
pub use tuf::{Signing, TufSigner};
