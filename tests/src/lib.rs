//! e2e placeholder
