//! The pluginsync master: per-environment plugin trees served over Puppet's
//! v3 file-serving API with mutual TLS.
//!
//! Flow: [`config`] → [`environments`] → [`index`] (built by [`walk`], kept
//! in [`store`], refreshed by [`watch`]) → [`routes`] → [`handlers`], which
//! only read the index, each after the one authorization step of [`auth`],
//! with the [`state`] they share. [`server`] ties listeners, TLS ([`tls`])
//! and signals together, with the `[proxy]` listener's header identity in
//! [`proxy`]; [`generations`] keeps what each publication made, [`fleet`] what
//! the nodes report ([`puppet_report`]: stock agents' run reports),
//! [`statestore`] both across restarts;
//! [`check`], [`devcerts`], [`csr`], [`reindex`], [`rollout_client`], [`bundle`] and [`trust`] back the
//! other subcommands.

pub mod access;
pub mod api_error;
pub mod auth;
pub mod bundle;
pub mod ca_chain;
pub mod check;
pub mod cli;
pub mod config;
pub mod csr;
pub mod devcerts;
pub mod envconf;
pub mod environments;
pub mod exit;
pub mod fleet;
pub mod generations;
pub mod handlers;
pub mod index;
pub mod inventory_client;
pub mod metrics;
pub mod placement;
pub mod proxy;
pub mod puppet_report;
pub mod reindex;
pub mod request;
pub mod rollout;
pub mod rollout_client;
pub mod routes;
pub mod sample;
pub mod server;
pub mod state;
pub mod statestore;
pub mod store;
pub mod tls;
pub mod trust;
pub mod walk;
pub mod watch;
