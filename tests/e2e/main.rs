//! End-to-end tests: a real master over real TLS on 127.0.0.1, real trees on
//! disk, real child processes (the binaries and, where installed, Puppet).

mod agent_load;
mod agent_sync;
mod common;
mod haproxy_lb;
mod master_blobs;
mod master_etag;
mod master_listing;
mod master_process;
mod master_security;
mod master_watch;
mod puppet_compat;
mod puppet_server;
