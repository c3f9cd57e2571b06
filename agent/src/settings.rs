//! Settings: the command line over agent.toml over puppet.conf over the defaults
//! (docs/agent.md#on-a-puppet-node), resolved once; everything after this takes `&Settings`, and
//! [`Settings::effective`] says where each value came from (`pluginsync-agent config`).
//!
//! puppet.conf is read by `settings/puppet.rs` with `puppetconf.rs` (`[agent]` over `[main]`):
//! `server_list`, else `server` + `serverport` (or the older `masterport`); `certname`;
//! `environment`; `ssldir`.
//! Puppet's defaults depend on the layout: `/etc/puppet/puppet.conf` is Debian's (`ssldir =
//! /var/lib/puppet/ssl`), any other is laid out as Puppet's AIO packages (`ssldir =
//! $confdir/ssl`, `$confdir` being puppet.conf's directory). The default certname is this host's
//! FQDN ([`fqdn`]).
//!
//! The file was checked and compiled once, when it was loaded ([`crate::config::AgentFile`]): its
//! values arrive here in working form and are not checked again. What the command line and
//! puppet.conf bring, the masters and the environment, is checked here by the same rules
//! ([`crate::config::servers`], [`crate::config::environment`]); the TLS files of an ssldir are
//! resolved here.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use serde::Serialize;

use crate::cli::Format;
use pluginsync_common::ignore::IgnoreSet;

use crate::config::{
    self, AgentFile, ConfigError, EnvironmentSource, SourcePermissions, TlsFiles, TlsSource,
};
use crate::loaders::{LoadConfig, LoaderTable};
use crate::puppetconf::{self, Section};

mod puppet;
use puppet::Puppet;
pub use puppet::fqdn;

/// Where an effective setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line option.
    CommandLine,
    /// agent.toml.
    AgentToml,
    /// puppet.conf, this section.
    PuppetConf(Section),
    /// The built-in default (Puppet's, for Puppet's settings).
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::CommandLine => f.write_str("command line"),
            Source::AgentToml => f.write_str("agent.toml"),
            Source::PuppetConf(s) => write!(f, "puppet.conf [{s}]"),
            Source::Default => f.write_str("default"),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why settings could not be resolved: one line, and whether a
/// command-line value is at fault (a usage error, 64) or a file (agent.toml
/// or puppet.conf: a config error, 78).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ResolveError {
    /// A command-line value is at fault.
    pub from_command_line: bool,
    /// What is wrong.
    pub error: ConfigError,
}

impl From<ConfigError> for ResolveError {
    fn from(error: ConfigError) -> Self {
        ResolveError {
            from_command_line: false,
            error,
        }
    }
}

/// `result`, blamed on the command line when `source` is it.
fn blame<T>(result: Result<T, ConfigError>, source: Source) -> Result<T, ResolveError> {
    result.map_err(|error| ResolveError {
        from_command_line: source == Source::CommandLine,
        error,
    })
}

/// One effective setting, as `pluginsync-agent config` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Effective {
    /// The setting's name (agent.toml's).
    pub name: &'static str,
    /// Its value, as text.
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

/// What a run needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Masters in failover order.
    pub servers: Vec<String>,
    /// The environment.
    pub environment: EnvName,
    /// `plugins` destination.
    pub libdir: PathBuf,
    /// `pluginfacts` destination, if any.
    pub factsdir: Option<PathBuf>,
    /// State directory.
    pub vardir: PathBuf,
    /// Ignore globs, compiled.
    pub ignore: IgnoreSet,
    /// Whole-run deadline.
    pub timeout: Duration,
    /// Attempts per server.
    pub retries: u32,
    /// Concurrent downloads.
    pub parallel_downloads: usize,
    /// The removal guard's limit (`max_removal_percent`); `None` with `--allow-mass-removal`.
    pub max_removal_percent: Option<u8>,
    /// TLS files.
    pub tls: TlsFiles,
    /// `plugins` modes.
    pub plugins_permissions: SourcePermissions,
    /// `pluginfacts` modes.
    pub pluginfacts_permissions: SourcePermissions,
    /// Print the plan, change nothing.
    pub noop: bool,
    /// Report format.
    pub format: Format,
    /// Puppet-style detailed exit codes.
    pub detailed_exitcodes: bool,
    /// Run loaders after the commit (`[load] enabled` or `--load`).
    pub load_enabled: bool,
    /// `[load]`.
    pub load: LoadConfig,
    /// `[[loader]]` and `[load.constraints]`, compiled.
    pub loaders: LoaderTable,
    /// `[metrics] textfile`.
    pub metrics_textfile: Option<PathBuf>,
    /// This node's certname (the node endpoint's `<certname>`).
    pub certname: String,
    /// Where the environment comes from.
    pub environment_source: EnvironmentSource,
    /// Where the configured environment was set (a command-line
    /// `--environment` is never replaced by the server's, as in Puppet).
    pub environment_origin: Source,
    /// Puppet's run lock, waited for before a commit (`lock.rs`).
    pub puppet_lock: crate::lock::PuppetLock,
    /// `[switch]`: `keep_previous`, `syncfs_below_dirty_mib`.
    pub switch: crate::config::switch::SwitchConfig,
    /// Every setting with its source, for `pluginsync-agent config`.
    pub effective: Vec<Effective>,
    /// `generations` (docs/protocol.md §4.11).
    pub generations: bool,
}

/// Command-line overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--environment`.
    pub environment: Option<String>,
    /// `--server` (replaces the config's list when non-empty): URLs, or Puppet-style `HOST[:PORT]`.
    pub servers: Vec<String>,
    /// `--certname` (overrides `[tls] certname` and puppet.conf's).
    pub certname: Option<String>,
    /// `--noop`.
    pub noop: bool,
    /// `--format`.
    pub format: Option<Format>,
    /// `--detailed-exitcodes`.
    pub detailed_exitcodes: bool,
    /// `--load`.
    pub load: bool,
    /// `--allow-mass-removal`.
    pub allow_mass_removal: bool,
}

impl Settings {
    /// Resolves `file` (loaded, so checked and compiled) with `cli` on top
    /// and the puppet.conf it names (or finds) below, and checks what the
    /// command line and puppet.conf bring. A puppet.conf named explicitly
    /// must be readable; its lines that cannot be understood are warnings.
    pub fn resolve(file: AgentFile, cli: Overrides) -> Result<Settings, ResolveError> {
        let puppet = Puppet::read(file.puppet_conf.as_deref())?;
        let mut effective = Vec::new();
        let servers = servers(&file, &cli, &puppet, &mut effective)?;
        let (environment, environment_origin) = environment(&file, &cli, &puppet, &mut effective)?;
        effective.push(Effective {
            name: "environment_source",
            value: match file.environment_source {
                EnvironmentSource::Config => "config",
                EnvironmentSource::Server => "server",
            }
            .into(),
            source: toml_source(&file, "environment_source"),
        });
        let certname = certname(&file, &cli, &puppet, &mut effective);
        // A certname that cannot name a file is `--certname`'s fault when
        // it came from there (64).
        let tls = tls(&file, &certname, &puppet, &mut effective).map_err(|mut e| {
            e.from_command_line |= cli.certname.is_some();
            e
        })?;
        effective.push(Effective {
            name: "puppet_conf",
            value: puppet
                .conf
                .as_ref()
                .map(|(p, _)| p.display().to_string())
                .unwrap_or_default(),
            source: toml_source(&file, "puppet_conf"),
        });
        file_values(&file, &mut effective);
        Ok(Settings {
            servers,
            environment,
            libdir: file.libdir,
            factsdir: file.factsdir,
            vardir: file.vardir,
            ignore: file.ignore,
            timeout: file.timeout,
            retries: file.retries,
            parallel_downloads: file.parallel_downloads,
            max_removal_percent: (!cli.allow_mass_removal).then_some(file.max_removal_percent),
            tls,
            plugins_permissions: file.plugins_permissions,
            pluginfacts_permissions: file.pluginfacts_permissions,
            noop: cli.noop,
            format: cli.format.unwrap_or(Format::Text),
            detailed_exitcodes: cli.detailed_exitcodes,
            load_enabled: file.load.enabled || cli.load,
            load: file.load,
            loaders: file.loaders,
            metrics_textfile: file.metrics_textfile,
            certname,
            environment_source: file.environment_source,
            environment_origin,
            puppet_lock: file.puppet_lock.resolve(puppet.lockfile()),
            switch: file.switch,
            effective,
            generations: file.generations,
        })
    }
}

/// agent.toml when it sets `key` (or `key`'s table), else the default.
fn toml_source(file: &AgentFile, key: &str) -> Source {
    if file.keys.contains(key.split('.').next().unwrap_or(key)) {
        Source::AgentToml
    } else {
        Source::Default
    }
}

/// The masters: `--server`, else `servers`, else puppet.conf's
/// `server_list`, else its `server` + `serverport`, else Puppet's default.
/// The file's were checked when it was loaded; the others are checked
/// here by the same rules.
fn servers(
    file: &AgentFile,
    cli: &Overrides,
    puppet: &Puppet,
    effective: &mut Vec<Effective>,
) -> Result<Vec<String>, ResolveError> {
    let (servers, source) = if !cli.servers.is_empty() {
        let source = Source::CommandLine;
        (
            blame(config::servers(&command_line_urls(cli, puppet)?), source)?,
            source,
        )
    } else if let Some(s) = &file.servers {
        (s.clone(), Source::AgentToml)
    } else if let Some((section, list)) = puppet
        .value("server_list")
        .filter(|(_, l)| !l.trim().is_empty())
        .or_else(|| puppet.value("server"))
    {
        let source = Source::PuppetConf(section);
        let urls = puppetconf::server_urls(&list, puppet.port()?);
        (blame(config::servers(&urls), source)?, source)
    } else {
        (vec![config::DEFAULT_SERVER.to_owned()], Source::Default)
    };
    effective.push(Effective {
        name: "servers",
        value: servers.join(", "),
        source,
    });
    Ok(servers)
}

/// `--server` values as URLs: one without a scheme is Puppet's `--server`
/// (`HOST`, `HOST:PORT`, or a comma-separated list of them), on
/// puppet.conf's `serverport` (8140 by default) when it names no port
/// (docs/agent.md#puppet-style-flags); URLs are kept as given.
fn command_line_urls(cli: &Overrides, puppet: &Puppet) -> Result<Vec<String>, ResolveError> {
    let mut urls = Vec::new();
    for s in &cli.servers {
        if s.contains("://") {
            urls.push(s.clone());
        } else {
            urls.extend(puppetconf::server_urls(s, puppet.port()?));
        }
    }
    Ok(urls)
}

/// The environment and where it was set: `--environment`, else
/// `environment`, else puppet.conf's, else Puppet's default.
fn environment(
    file: &AgentFile,
    cli: &Overrides,
    puppet: &Puppet,
    effective: &mut Vec<Effective>,
) -> Result<(EnvName, Source), ResolveError> {
    let (environment, source) = if let Some(e) = &cli.environment {
        let source = Source::CommandLine;
        (blame(config::environment(e), source)?, source)
    } else if let Some(e) = &file.environment {
        (e.clone(), Source::AgentToml)
    } else if let Some((section, e)) = puppet.value("environment") {
        let source = Source::PuppetConf(section);
        (blame(config::environment(&e), source)?, source)
    } else {
        let source = Source::Default;
        (
            blame(config::environment(config::DEFAULT_ENVIRONMENT), source)?,
            source,
        )
    };
    effective.push(Effective {
        name: "environment",
        value: environment.to_string(),
        source,
    });
    Ok((environment, source))
}

/// This node's certname: `--certname`, else `[tls] certname`, else
/// puppet.conf's, else this host's FQDN.
fn certname(
    file: &AgentFile,
    cli: &Overrides,
    puppet: &Puppet,
    effective: &mut Vec<Effective>,
) -> String {
    let named = match &file.tls {
        TlsSource::SslDir { certname, .. } => certname.clone(),
        TlsSource::Files(_) => None,
    };
    let (certname, source) = if let Some(c) = &cli.certname {
        (c.clone(), Source::CommandLine)
    } else if let Some(c) = named {
        (c, Source::AgentToml)
    } else if let Some((section, c)) = puppet.value("certname") {
        (c, Source::PuppetConf(section))
    } else {
        (fqdn(), Source::Default)
    };
    effective.push(Effective {
        name: "certname",
        value: certname.clone(),
        source,
    });
    certname
}

/// The TLS files: `[tls]`'s when it names them, else the ssldir's
/// (`[tls] ssldir`, else puppet.conf's, else Puppet's default) for
/// `certname`.
fn tls(
    file: &AgentFile,
    certname: &str,
    puppet: &Puppet,
    effective: &mut Vec<Effective>,
) -> Result<TlsFiles, ResolveError> {
    let (ssldir, cert_expiry_warning) = match &file.tls {
        TlsSource::Files(files) => {
            for (name, value) in [
                ("tls.ca", Some(&files.ca)),
                ("tls.cert", Some(&files.cert)),
                ("tls.key", Some(&files.key)),
                ("tls.crl", files.crl.as_ref()),
            ] {
                if let Some(v) = value {
                    effective.push(Effective {
                        name,
                        value: v.display().to_string(),
                        source: Source::AgentToml,
                    });
                }
            }
            return Ok(files.clone());
        }
        TlsSource::SslDir {
            ssldir,
            cert_expiry_warning,
            ..
        } => (ssldir, *cert_expiry_warning),
    };
    if certname.is_empty() || certname.contains('/') || certname.starts_with('.') {
        return Err(ConfigError::Invalid(format!(
            "certname '{certname}' cannot name a certificate file"
        ))
        .into());
    }
    let (ssldir, source) = if let Some(d) = ssldir {
        (d.clone(), Source::AgentToml)
    } else if let Some((section, d)) = puppet.value("ssldir") {
        (PathBuf::from(d), Source::PuppetConf(section))
    } else {
        (
            PathBuf::from(puppet.default("ssldir").unwrap_or_default()),
            Source::Default,
        )
    };
    effective.push(Effective {
        name: "ssldir",
        value: ssldir.display().to_string(),
        source,
    });
    Ok(config::ssldir_files(&ssldir, certname, cert_expiry_warning))
}

/// The values only agent.toml sets, as `pluginsync-agent config` shows them.
fn file_values(file: &AgentFile, effective: &mut Vec<Effective>) {
    let path = |p: &Path| p.display().to_string();
    let factsdir = file.factsdir.as_deref().map(path).unwrap_or_default();
    let timeout = humantime_serde::re::humantime::format_duration(file.timeout);
    let own = [
        ("libdir", path(&file.libdir)),
        ("factsdir", factsdir),
        ("vardir", path(&file.vardir)),
        ("ignore", file.ignore.patterns().join(", ")),
        ("timeout", timeout.to_string()),
        ("retries", file.retries.to_string()),
        ("parallel_downloads", file.parallel_downloads.to_string()),
        ("generations", file.generations.to_string()),
    ];
    for (name, value) in own.into_iter().chain(file.switch.values()) {
        effective.push(Effective {
            name,
            value,
            source: toml_source(file, name),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    fn resolve(dir: &Path, toml: &str, cli: Overrides) -> Result<Settings, ResolveError> {
        let file = AgentConfig::parse(toml, &dir.join("agent.toml"))?.compile()?;
        Settings::resolve(file, cli)
    }

    fn source_of(s: &Settings, name: &str) -> (String, Source) {
        let e = s.effective.iter().find(|e| e.name == name).unwrap();
        (e.value.clone(), e.source)
    }

    #[test]
    fn puppet_conf_fills_what_agent_toml_leaves_unset() {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("puppet.conf");
        std::fs::write(
            &conf,
            "[main]\nserver = Puppet.Example\nmasterport = 8141\nenvironment = main_env\n[agent]\ncertname = node1.example\n",
        )
        .unwrap();
        let toml = format!("puppet_conf = {conf:?}\n");
        let s = resolve(d.path(), &toml, Overrides::default()).unwrap();
        assert_eq!(s.servers, ["https://Puppet.Example:8141"]);
        assert_eq!(
            source_of(&s, "servers").1,
            Source::PuppetConf(Section::Main)
        );
        assert_eq!(s.environment.to_string(), "main_env");
        assert_eq!(s.certname, "node1.example");
        assert_eq!(
            source_of(&s, "certname").1,
            Source::PuppetConf(Section::Agent)
        );
        // No ssldir anywhere: Puppet's default for a non-Debian path,
        // `$confdir/ssl`.
        let ssl = d.path().join("ssl");
        assert_eq!(
            source_of(&s, "ssldir"),
            (ssl.display().to_string(), Source::Default)
        );
        assert_eq!(s.tls.cert, ssl.join("certs/node1.example.pem"));
        assert_eq!(s.tls.key, ssl.join("private_keys/node1.example.pem"));
        assert_eq!(s.environment_source, EnvironmentSource::Config);

        // agent.toml over puppet.conf, the command line over both.
        let toml = format!(
            "puppet_conf = {conf:?}\nenvironment = \"toml_env\"\n[tls]\nssldir = \"/x/ssl\"\n"
        );
        let s = resolve(
            d.path(),
            &toml,
            Overrides {
                servers: vec!["https://cli:1".into()],
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(
            source_of(&s, "servers"),
            ("https://cli:1".into(), Source::CommandLine)
        );
        assert_eq!(
            source_of(&s, "environment"),
            ("toml_env".into(), Source::AgentToml)
        );
        assert_eq!(s.tls.ca, PathBuf::from("/x/ssl/certs/ca.pem"));
        assert_eq!(s.tls.cert, PathBuf::from("/x/ssl/certs/node1.example.pem"));
    }

    #[test]
    fn without_puppet_conf_the_defaults_apply() {
        let d = tempfile::tempdir().unwrap();
        let s = resolve(d.path(), "puppet_conf = \"\"\n", Overrides::default()).unwrap();
        assert_eq!(
            source_of(&s, "servers"),
            (config::DEFAULT_SERVER.into(), Source::Default)
        );
        assert_eq!(source_of(&s, "environment").1, Source::Default);
        assert_eq!(source_of(&s, "certname"), (fqdn(), Source::Default));
        assert_eq!(
            s.tls.ca,
            PathBuf::from("/etc/puppetlabs/puppet/ssl/certs/ca.pem")
        );
        let e = resolve(
            d.path(),
            &format!("puppet_conf = {:?}\n", d.path().join("missing.conf")),
            Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cannot read puppet.conf") && e.contains("missing.conf"),
            "{e}"
        );
    }
}
