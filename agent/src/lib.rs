//! The pluginsync agent.
//!
//! `CLI (cli) → settings (config, settings) → catalog (catalog: one file
//! resource per destination) → listing (servers: which master; client: HTTP;
//! listing: validation)
//! and local scan (scan, with the hints of cache) → plan (plan, pure) →
//! stage and verify (stage: every file write) → commit (commit) → report
//! (report) → load changed files (load, launch, layouts, plugins)`, driven by
//! [`sync::run`], whose module has one function per arrow. Each step is a
//! module that can be tested alone, and no two modules import each other.

pub mod cache;
pub mod catalog;
pub mod certs;
pub mod cli;
pub mod client;
pub mod commit;
pub mod config;
pub mod delta;
pub mod describe;
pub mod exit;
pub mod facts;
pub mod launch;
pub mod layouts;
pub mod listing;
pub mod load;
pub mod loaders;
pub mod lock;
pub mod metrics;
pub mod output;
pub mod plan;
pub mod plugins;
pub mod progress;
pub mod puppetconf;
pub mod report;
pub mod scan;
pub mod servers;
pub mod settings;
pub mod signals;
pub mod stage;
pub mod sync;
pub mod trust;
pub mod vardir;
