//! Signed generations (docs/trust.md): what the master does for the
//! deploy pipeline that signs them. The master never signs; it prints the
//! manifest the pipeline signs ([`manifest`]).

pub mod manifest;
