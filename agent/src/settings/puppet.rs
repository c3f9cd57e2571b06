//! The puppet.conf layer of the settings: the file this node's Puppet reads (named by
//! `puppet_conf`, else the first of [`config::DEFAULT_PUPPET_CONFS`] that exists), what it says
//! for the agent (`[agent]` over `[main]`), and Puppet's defaults for its layout
//! (docs/agent.md#on-a-puppet-node), down to the default certname, this host's FQDN.

use std::path::{Path, PathBuf};

use crate::config::{self, ConfigError};
use crate::puppetconf::{self, PuppetConf, Section};

/// puppet.conf, if any, with Puppet's defaults for its layout ([`Puppet::default`]).
pub(super) struct Puppet {
    /// The file read and what it says.
    pub(super) conf: Option<(PathBuf, PuppetConf)>,
    /// `$confdir`: puppet.conf's directory.
    confdir: String,
    /// Debian's layout.
    debian: bool,
}

impl Puppet {
    /// Reads puppet.conf ([`read_puppet_conf`]).
    pub(super) fn read(named: Option<&Path>) -> Result<Puppet, ConfigError> {
        let conf = read_puppet_conf(named)?;
        let (confdir, debian) = match &conf {
            Some((path, _)) => (
                path.parent().unwrap_or(Path::new("/")).to_owned(),
                path == Path::new("/etc/puppet/puppet.conf"),
            ),
            None => (PathBuf::from("/etc/puppetlabs/puppet"), false),
        };
        Ok(Puppet {
            conf,
            confdir: confdir.display().to_string(),
            debian,
        })
    }

    /// Puppet's default of `name` for this layout, if it has one the
    /// agent uses: `/etc/puppet/puppet.conf` is Debian's, any other is
    /// laid out as Puppet's AIO packages.
    pub(super) fn default(&self, name: &str) -> Option<String> {
        match name {
            "confdir" => Some(self.confdir.clone()),
            // Debian's puppet 7 (`puppet config print vardir`); its ssldir
            // stays under /var/lib/puppet.
            "vardir" if self.debian => Some("/var/cache/puppet".into()),
            "vardir" => Some("/opt/puppetlabs/puppet/cache".into()),
            "ssldir" if self.debian => Some("/var/lib/puppet/ssl".into()),
            "ssldir" => Some(format!("{}/ssl", self.confdir)),
            _ => None,
        }
    }

    /// Facter's own external facts directory where this node's Puppet is
    /// the system's (docs/agent.md#the-pluginsync-fact): Debian's
    /// `/etc/facter/facts.d`, the AIO packages' `/etc/puppetlabs/facter/facts.d`;
    /// none for a puppet.conf elsewhere or none at all.
    pub(super) fn facter_dir(&self) -> Option<PathBuf> {
        let (path, _) = self.conf.as_ref()?;
        let [aio, debian] = config::DEFAULT_PUPPET_CONFS.map(Path::new);
        let dir = match path.as_path() {
            p if p == debian => "/etc/facter/facts.d",
            p if p == aio => "/etc/puppetlabs/facter/facts.d",
            _ => return None,
        };
        Some(dir.into())
    }

    /// `key` as the agent sees it (`[agent]` over `[main]`, references
    /// expanded) and the section it came from.
    pub(super) fn value(&self, key: &str) -> Option<(Section, String)> {
        let (_, conf) = self.conf.as_ref()?;
        conf.agent_value(key, &|name| self.default(name))
    }

    /// Puppet's own directory `key` (`libdir`, `pluginfactdest`) as its
    /// agent resolves it, when there is a puppet.conf: the value of `key`,
    /// else `$vardir/<leaf>` (Puppet's defaults), with the section that set
    /// it (of `key`, else of `vardir`; `None`: Puppet's default `vardir`).
    pub(super) fn dir(&self, key: &str, leaf: &str) -> Option<(Option<Section>, PathBuf)> {
        self.conf.as_ref()?;
        if let Some((section, d)) = self.value(key) {
            return Some((Some(section), d.into()));
        }
        let (section, vardir) = match self.value("vardir") {
            Some((section, v)) => (Some(section), v),
            None => (None, self.default("vardir")?),
        };
        Some((section, Path::new(&vardir).join(leaf)))
    }

    /// Puppet's run lock file, when there is a puppet.conf.
    pub(super) fn lockfile(&self) -> Option<PathBuf> {
        let (_, conf) = self.conf.as_ref()?;
        Some(conf.run_lockfile(&|n| self.default(n)).into())
    }

    /// `serverport`, else the older `masterport`, else 8140 (Puppet's).
    pub(super) fn port(&self) -> Result<u16, ConfigError> {
        let Some((_, text)) = self
            .value("serverport")
            .or_else(|| self.value("masterport"))
        else {
            return Ok(8140);
        };
        text.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "puppet.conf '{}': serverport '{text}' is not a port",
                    self.conf
                        .as_ref()
                        .map(|(p, _)| p.display().to_string())
                        .unwrap_or_default()
                ))
            })
    }
}

/// Reads puppet.conf: `Some("")` is none; a named file must be readable;
/// unnamed, the first of [`config::DEFAULT_PUPPET_CONFS`] that exists.
fn read_puppet_conf(named: Option<&Path>) -> Result<Option<(PathBuf, PuppetConf)>, ConfigError> {
    let path = match named {
        Some(p) if p.as_os_str().is_empty() => return Ok(None),
        Some(p) => p.to_owned(),
        None => match config::DEFAULT_PUPPET_CONFS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
        {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ConfigError::Invalid(format!("cannot read puppet.conf '{}': {e}", path.display()))
    })?;
    let (conf, warnings) = puppetconf::parse(&text);
    for w in warnings {
        tracing::warn!(puppet_conf = %path.display(), "{w}, skipped");
    }
    Ok(Some((path, conf)))
}

/// This host's fully qualified name, lowercased: Puppet's default
/// certname (Facter's `networking.fqdn`). The kernel's hostname when it is
/// already qualified (`/proc/sys/kernel/hostname`); else what `hostname -f` answers (the resolver's
/// canonical name, as Facter asks for it) when it extends the hostname;
/// else the hostname with the `domain` (or first `search`) entry of
/// `/etc/resolv.conf` (Facter's fallback); else the bare hostname.
pub fn fqdn() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim().to_ascii_lowercase();
    if host.contains('.') {
        return host;
    }
    if let Ok(out) = std::process::Command::new("hostname")
        .arg("-f")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        let name = String::from_utf8_lossy(&out.stdout)
            .trim()
            .to_ascii_lowercase();
        if out.status.success() && name.starts_with(&format!("{host}.")) {
            return name;
        }
    }
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let domain = resolv.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        match words.next() {
            Some("domain" | "search") => words.next().map(str::to_owned),
            _ => None,
        }
    });
    match domain {
        Some(d) if !host.is_empty() => {
            format!("{host}.{}", d.trim_end_matches('.').to_ascii_lowercase())
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facters_directory_follows_the_system_puppet_layout() {
        let at = |path: Option<&str>| Puppet {
            conf: path.map(|p| (PathBuf::from(p), puppetconf::parse("").0)),
            confdir: String::new(),
            debian: false,
        };
        let dir = |path| at(path).facter_dir();
        assert_eq!(
            dir(Some("/etc/puppet/puppet.conf")),
            Some("/etc/facter/facts.d".into())
        );
        assert_eq!(
            dir(Some("/etc/puppetlabs/puppet/puppet.conf")),
            Some("/etc/puppetlabs/facter/facts.d".into())
        );
        // A puppet.conf elsewhere (a test's, a second Puppet) or none:
        // not the system's Facter, nothing written by default.
        assert_eq!(dir(Some("/srv/node/puppet.conf")), None);
        assert_eq!(dir(None), None);
    }
}
