//! Which synced plugin a run's log line blames
//! (docs/puppet-fleet.md#stock-agents-reports): a line counts only when
//! it names a file of the generation the node was served, as
//! `<mount>/<path>` (`plugins/facter/broken.rb`).
//!
//! How a line names a file, as Puppet 7 and Facter 4 write them:
//! - an absolute path under Puppet's default libdir or pluginfactdest
//!   (`$vardir/lib`, `$vardir/facts.d`): `…/lib/<path>` is `plugins/<path>`,
//!   `…/facts.d/<path>` is `pluginfacts/<path>` (`Error loading fact
//!   /var/cache/puppet/lib/facter/broken.rb: …`, `Failed to handle
//!   …/facts.d/x.yaml as …`);
//! - `Could not autoload <name>`: `plugins/<name>.rb`;
//! - `… custom fact fact='<name>'`: `plugins/facter/<name>.rb`, Facter's
//!   own convention for where fact `<name>` lives.
//!
//! Counted at `err` and above; below, only Facter's one trace of a failing
//! external fact, its warning `Command <file> completed with the following
//! stderr message` naming a `pluginfacts` file (Facter 4 says nothing
//! else of a script exiting non-zero). What is kept is the plugin's name
//! and a fixed [`Reason`], never the message's text (it may carry secrets).

use pluginsync_common::generation::Manifest;
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use super::LogLine;

/// Why a plugin counts as failing: a fixed word, never the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An error naming the file (loading it, handling its output).
    Error,
    /// `Could not autoload`.
    Autoload,
    /// Facter could not resolve a custom fact it defines.
    Resolve,
    /// An external fact wrote to stderr (Facter's warning).
    Stderr,
}

impl Reason {
    /// Its word in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Error => "error",
            Reason::Autoload => "autoload",
            Reason::Resolve => "resolve",
            Reason::Stderr => "stderr",
        }
    }
}

/// Facter's warning for an external fact that wrote to stderr.
const STDERR_WARNING: &str = " completed with the following stderr message";

/// The plugin `line` blames in `manifest`, if any (module docs).
pub fn blamed(line: &LogLine, manifest: &Manifest) -> Option<(String, Reason)> {
    let stderr = line.level == "warning" && line.message.contains(STDERR_WARNING);
    if !line.is_error() && !stderr {
        return None;
    }
    let has = |mount: Mount, path: &str| {
        let rel = RelPath::parse(path).ok()?;
        let entry = manifest.get(mount, &rel)?;
        matches!(
            entry.kind,
            pluginsync_common::generation::EntryKind::File { .. }
        )
        .then(|| format!("{}/{}", mount.as_str(), rel.as_str()))
    };
    let message = line.message.as_str();
    for token in message.split(|c: char| c.is_whitespace() || "'\",;()[]".contains(c)) {
        let token = token.trim_end_matches([':', '.']);
        let token = token.split(':').next().unwrap_or_default();
        if !token.starts_with('/') {
            continue;
        }
        for (dir, mount) in [("/facts.d/", Mount::Pluginfacts), ("/lib/", Mount::Plugins)] {
            if stderr && mount == Mount::Plugins {
                continue;
            }
            for (at, _) in token.match_indices(dir) {
                if let Some(name) = has(mount, &token[at + dir.len()..]) {
                    let reason = if stderr {
                        Reason::Stderr
                    } else {
                        Reason::Error
                    };
                    return Some((name, reason));
                }
            }
        }
    }
    if stderr {
        return None;
    }
    if let Some(rest) = message.split("Could not autoload ").nth(1) {
        let name = rest.split([':', ' ', '\'', '"']).next().unwrap_or_default();
        if let Some(found) = has(Mount::Plugins, &format!("{name}.rb")) {
            return Some((found, Reason::Autoload));
        }
    }
    if let Some(rest) = message.split("custom fact fact='").nth(1) {
        let name = rest.split('\'').next().unwrap_or_default();
        if !name.is_empty() && !name.contains('/') {
            return has(Mount::Plugins, &format!("facter/{name}.rb"))
                .map(|found| (found, Reason::Resolve));
        }
    }
    None
}

/// The plugins `logs` blame in `manifest`, each once, in the order first
/// blamed.
pub fn failing(logs: &[LogLine], manifest: &Manifest) -> Vec<(String, Reason)> {
    let mut out: Vec<(String, Reason)> = Vec::new();
    for line in logs {
        if let Some((name, reason)) = blamed(line, manifest)
            && !out.iter().any(|(n, _)| *n == name)
        {
            out.push((name, reason));
        }
    }
    out
}
