//! Signed generations (docs/trust.md): what the master does for the
//! deploy pipeline that signs them. The master never signs: it prints the
//! manifest the pipeline signs ([`manifest`]) and serves the metadata the
//! pipeline signed ([`metadata`]), publishes only what it signed
//! ([`signed`]), from `[trust]` in master.toml
//! (`config::TrustConfig`); the timestamp's answer is kept in memory
//! while unchanged ([`timestamp`]).

pub mod manifest;
pub mod metadata;
pub mod signed;
pub mod timestamp;
