//! The pluginsync agent.
//!
//! `CLI (cli) → settings (settings) → catalog (catalog: one file resource
//! per destination) → listing (client, listing) + local scan (scan) → plan
//! (plan, pure) → stage + verify (stage) → commit (commit) → report
//! (report) → load changed files (load, plugins)`, driven by [`sync::run`]. Each step is a module that can be
//! tested alone.

pub mod cache;
pub mod catalog;
pub mod cli;
pub mod client;
pub mod commit;
pub mod config;
pub mod exit;
pub mod listing;
pub mod load;
pub mod lock;
pub mod output;
pub mod plan;
pub mod plugins;
pub mod report;
pub mod scan;
pub mod settings;
pub mod stage;
pub mod sync;
