//! `pluginsync-master check`: validate the config and every environment
//! without serving, and say what would be served. A server certificate that
//! agents would refuse (expired, not yet valid, not issued by `[tls] ca`)
//! fails the check; one that expires within `[tls] cert_expiry_warning`
//! is a warning.
//!
//! Prints, per environment, its modules, the files per mount and every path
//! that two modules both provide (with the winner), so an operator sees a
//! shadowed fact before an agent does. Walks the trees but does not hash
//! them, so it is quick on large environments.

use std::io::Write;

use crate::config::MasterConfig;
use crate::environments;
use crate::index::{EnvIndex, Mount};
use crate::walk::Hashing;

/// Runs the check, writing the summary to `out`.
pub fn run(config: &MasterConfig, out: &mut impl Write) -> anyhow::Result<()> {
    pluginsync_common::tls::install_default_provider();
    crate::tls::server_config(&config.tls)?;
    let soon = crate::tls::server_certificate_check(
        &config.tls,
        std::time::SystemTime::now(),
        config.tls.cert_expiry_warning,
    )
    .map_err(anyhow::Error::msg)?;
    for w in config.warnings().into_iter().chain(soon) {
        writeln!(out, "warning: {w}")?;
    }
    let envs = environments::list_environments(config);
    if envs.is_empty() {
        writeln!(out, "warning: no environment found on the environmentpath")?;
    }
    for (name, dir) in envs {
        let idx = EnvIndex::build(config, name.clone(), dir.clone(), None, Hashing::Skip);
        let modules: Vec<&str> = idx.modules.iter().map(|m| m.name.as_str()).collect();
        writeln!(out, "environment {name} ({})", dir.display())?;
        writeln!(out, "  modules ({}): {}", modules.len(), modules.join(" "))?;
        for mount in Mount::ALL {
            let m = idx.mount(mount);
            let files = m
                .lookup
                .iter()
                .filter(|&&loc| m.node(loc).sig.is_some())
                .count();
            let dirs = m.lookup.len() - files;
            writeln!(
                out,
                "  {}: {files} files, {dirs} directories from {} modules",
                mount.as_str(),
                m.roots.len()
            )?;
            for c in &m.collisions {
                writeln!(
                    out,
                    "    collision {}: served from {}, hidden in {}",
                    c.path, c.winner, c.loser
                )?;
            }
        }
    }
    writeln!(out, "OK")?;
    Ok(())
}
