//! `pluginsync-master check`: validate the config and every environment
//! without serving, and say what would be served. A server certificate that
//! agents would refuse (expired, not yet valid, not issued by `[tls] ca`)
//! fails the check; one that expires within `[tls] cert_expiry_warning`
//! is a warning.
//!
//! Prints, per environment, where its modulepath comes from
//! (`environment.conf` or the default), the effective modulepath and the
//! modules found in each entry (shadowed ones marked, missing entries
//! said), every warning about `environment.conf`, every module root not
//! served because it is outside the code tree, its modules, the
//! files per mount and every path that two modules both provide (with the
//! winner), so an operator sees a shadowed fact before an agent does. Walks
//! the trees but does not hash them, so it is quick on large environments.
//! The last line is `OK`, or `OK, with N warnings` when there are any.

use std::io::Write;
use std::path::Path;

use crate::config::MasterConfig;
use crate::environments;
use crate::index::{EnvIndex, Mount};
use crate::walk::Hashing;

/// Why the check failed: the server's TLS cannot work, or the summary
/// could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The TLS files do not make a server config.
    #[error(transparent)]
    Tls(#[from] crate::tls::ServerTlsError),
    /// Agents would refuse the server certificate.
    #[error(transparent)]
    Certificate(#[from] crate::tls::CertificateRefused),
    /// Writing the summary failed.
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

/// Runs the check, writing the summary to `out`.
pub fn run(config: &MasterConfig, out: &mut impl Write) -> Result<(), CheckError> {
    pluginsync_common::tls::install_default_provider();
    crate::tls::server_config(&config.tls)?;
    let soon = crate::tls::server_certificate_check(
        &config.tls,
        std::time::SystemTime::now(),
        config.tls.cert_expiry_warning,
    )?;
    let mut warnings = 0usize;
    for w in config
        .warnings()
        .into_iter()
        .chain(soon.map(|w| w.to_string()))
    {
        writeln!(out, "warning: {w}")?;
        warnings += 1;
    }
    let envs = environments::list_environments(config);
    if envs.is_empty() {
        writeln!(out, "warning: no environment found on the environmentpath")?;
    }
    for (name, dir) in envs {
        let idx = EnvIndex::build(config, name.clone(), dir.clone(), None, Hashing::Skip);
        let modules: Vec<&str> = idx.modules.iter().map(|m| m.name.as_str()).collect();
        writeln!(out, "environment {name} ({})", dir.display())?;
        warnings += modulepath(config, &dir, out)?;
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
                "  {}: {} from {}",
                mount.as_str(),
                count(files, "file", "files") + ", " + &count(dirs, "directory", "directories"),
                count(m.roots.len(), "module", "modules"),
            )?;
            for o in &m.outside {
                writeln!(out, "  warning: {o}")?;
                warnings += 1;
            }
            for c in &m.collisions {
                writeln!(
                    out,
                    "    collision {}: served from {}, hidden in {}",
                    c.path, c.winner, c.loser
                )?;
            }
        }
    }
    if warnings == 0 {
        writeln!(out, "OK")?;
    } else {
        writeln!(out, "OK, with {warnings} warnings")?;
    }
    Ok(())
}

/// The effective modulepath of the environment at `dir`, entry by entry
/// with the modules found there, then its warnings; returns how many
/// warnings it printed.
fn modulepath(config: &MasterConfig, dir: &Path, out: &mut impl Write) -> std::io::Result<usize> {
    let mp = environments::resolve(config, dir);
    let scan = environments::scan(&mp);
    match &mp.conf {
        Some(conf) => writeln!(out, "  environment.conf: {}", conf.display())?,
        None => writeln!(
            out,
            "  environment.conf: none (modulepath <env>/modules, then basemodulepath)"
        )?,
    }
    writeln!(out, "  modulepath: {}", mp.joined())?;
    for (i, entry) in mp.entries.iter().enumerate() {
        if !entry.exists {
            writeln!(out, "    {}: missing, skipped", entry.dir.display())?;
            continue;
        }
        let served: Vec<&str> = scan
            .modules
            .iter()
            .filter(|m| m.entry == i)
            .map(|m| m.name.as_str())
            .collect();
        let shadowed: Vec<&str> = scan
            .shadowed
            .iter()
            .filter(|(e, _)| *e == i)
            .map(|(_, n)| n.as_str())
            .collect();
        let mut line = format!("    {}: {}", entry.dir.display(), served.join(" "));
        if !shadowed.is_empty() {
            line.push_str(&format!(
                " (shadowed by an earlier entry: {})",
                shadowed.join(" ")
            ));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    for w in &mp.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    for o in &scan.outside {
        writeln!(out, "  warning: {o}")?;
    }
    Ok(mp.warnings.len() + scan.outside.len())
}

/// `n` and the noun as a person reads them: `1 file`, `2 files`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
