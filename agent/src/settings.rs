//! Settings: the command line over agent.toml over puppet.conf over the defaults
//! (docs/agent.md#on-a-puppet-node), each a layer of optional values ([`AgentConfig`],
//! `settings/layers.rs`), resolved once; everything after this takes `&Settings`, and
//! [`Settings::effective`] says where each value came from (`pluginsync-agent config`).
//!
//! puppet.conf is read by `settings/puppet.rs` with `puppetconf.rs` (`[agent]` over `[main]`):
//! `server_list`, else `server` + `serverport` (or the older `masterport`); `certname`;
//! `environment`; `ssldir`; and, when agent.toml names no destination, Puppet's own `libdir`
//! and `pluginfactdest` (`$vardir/lib`, `$vardir/facts.d` unless set).
//! Puppet's defaults depend on the layout: `/etc/puppet/puppet.conf` is Debian's (`vardir =
//! /var/cache/puppet`, `ssldir = /var/lib/puppet/ssl`), any other is laid out as Puppet's AIO
//! packages (`vardir = /opt/puppetlabs/puppet/cache`, `ssldir = $confdir/ssl`, `$confdir` being
//! puppet.conf's directory). The default certname is this host's FQDN ([`fqdn`]).
//!
//! The file was checked when it was loaded ([`AgentConfig::load`]). What the command line and
//! puppet.conf bring, the masters and the environment, is checked here by the same rules
//! ([`crate::config::servers`], [`crate::config::environment`]), a fault blamed on its layer; the
//! TLS files of an ssldir are resolved here.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use serde::Serialize;

use crate::cli::Format;
use pluginsync_common::ignore::IgnoreSet;

use crate::config::{
    self, AgentConfig, ConfigError, EnvironmentSource, SourcePermissions, TlsFiles, TlsSource,
};
use crate::loaders::{LoadConfig, LoaderTable};
use crate::puppetconf::{self, Section};

mod layers;
mod puppet;
pub use layers::{CommandLine, RunFlags, command_line};
use layers::{Layers, Resolver};
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
    /// Where the `pluginsync` fact is written (`[facts] external_dir`
    /// resolved, docs/agent.md#the-pluginsync-fact); `None`: nowhere.
    pub fact_dir: Option<PathBuf>,
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
    /// `[trust]`: every generation verified before staging
    /// (docs/agent.md#signed-generations); `None`: off.
    pub trust: Option<crate::config::TrustConfig>,
}

impl Settings {
    /// Resolves `file` (loaded, so checked) with the command line's layer
    /// (`cli`, [`command_line`]) on top and the puppet.conf it names (or
    /// finds) below, and checks what the command line and puppet.conf
    /// bring. A puppet.conf named explicitly must be readable; its lines
    /// that cannot be understood are warnings. Each value is resolved in
    /// the order `pluginsync-agent config` shows it.
    pub fn resolve(file: AgentConfig, cli: CommandLine) -> Result<Settings, ResolveError> {
        let puppet = Puppet::read(file.puppet_conf.as_deref())?;
        let [agent, main, puppet_defaults] = layers::puppet_layers(&puppet, &file);
        let mut r = Resolver {
            layers: Layers([
                (Source::CommandLine, &cli.layer),
                (Source::AgentToml, &file),
                (Source::PuppetConf(Section::Agent), &agent),
                (Source::PuppetConf(Section::Main), &main),
                (Source::Default, &puppet_defaults),
            ]),
            effective: Vec::new(),
        };
        let servers = servers(&mut r, &puppet)?;
        let (environment, environment_origin) = environment(&mut r)?;
        let environment_source = r.get(
            "environment_source",
            |l| l.environment_source,
            || EnvironmentSource::Config,
        );
        let (certname, source) = r.layers.or(|l| l.tls.certname.clone(), fqdn);
        r.show("certname", &certname, source);
        // A certname that cannot name a file is `--certname`'s fault when
        // it came from there (64).
        let tls = tls(&mut r, &file, &certname).map_err(|mut e| {
            e.from_command_line |= source == Source::CommandLine;
            e
        })?;
        let conf = (puppet.conf.as_ref()).map(|(p, _)| p.display().to_string());
        r.show_own(
            "puppet_conf",
            conf.unwrap_or_default(),
            file.puppet_conf.is_some(),
        );
        let (libdir, factsdir, vardir) = destinations(&mut r)?;
        let ignore = file.ignore_set()?;
        r.show_own(
            "ignore",
            ignore.patterns().join(", "),
            file.ignore.is_some(),
        );
        let run = &cli.run;
        let puppet_lock = file.puppet_lock.resolve(puppet.lockfile());
        Ok(Settings {
            servers,
            environment,
            libdir,
            factsdir,
            vardir,
            ignore,
            timeout: r.get("timeout", |l| l.timeout, || config::DEFAULT_TIMEOUT),
            retries: r.get("retries", |l| l.retries, || config::DEFAULT_RETRIES),
            parallel_downloads: r.get(
                "parallel_downloads",
                |l| l.parallel_downloads,
                || config::DEFAULT_PARALLEL_DOWNLOADS,
            ),
            generations: r.get("generations", |l| l.generations, || true),
            switch: r.switch(),
            trust: (r.trust(&file)).map(|t| crate::config::TrustConfig {
                allow_expired_metadata: run.allow_expired_metadata,
                ..t
            }),
            max_removal_percent: (!run.allow_mass_removal).then_some(
                (file.max_removal_percent).unwrap_or(config::DEFAULT_MAX_REMOVAL_PERCENT),
            ),
            tls,
            plugins_permissions: file.plugins.source_permissions,
            pluginfacts_permissions: file.pluginfacts.source_permissions,
            noop: run.noop,
            format: run.format.unwrap_or(Format::Text),
            detailed_exitcodes: run.detailed_exitcodes,
            load_enabled: file.load.enabled || run.load,
            load: r.facts(&file),
            fact_dir: r.fact_dir(&file, puppet.facter_dir()),
            loaders: file.loader_table()?,
            metrics_textfile: file.metrics.textfile.clone(),
            certname,
            environment_source,
            environment_origin,
            puppet_lock: r.puppet_lock(puppet_lock, &file),
            effective: r.effective,
        })
    }
}

/// The masters: `--server`, else `servers`, else puppet.conf's
/// `server_list`, else its `server` + `serverport`, else Puppet's default.
/// The file's were checked when it was loaded; the others are checked
/// here by the same rules.
fn servers(r: &mut Resolver, puppet: &Puppet) -> Result<Vec<String>, ResolveError> {
    let (servers, source) = match r.layers.pick(|l| l.servers.clone()) {
        Some((s, Source::AgentToml)) => (s, Source::AgentToml),
        Some((s, source @ Source::CommandLine)) => {
            let urls = command_line_urls(&s, puppet)?;
            (blame(config::servers(&urls), source)?, source)
        }
        Some((list, source)) => {
            let urls = puppetconf::server_urls(&list.join(","), puppet.port()?);
            (blame(config::servers(&urls), source)?, source)
        }
        None => (vec![config::DEFAULT_SERVER.to_owned()], Source::Default),
    };
    r.show("servers", servers.join(", "), source);
    Ok(servers)
}

/// `--server` values as URLs: one without a scheme is Puppet's `--server`
/// (`HOST`, `HOST:PORT`, or a comma-separated list of them), on
/// puppet.conf's `serverport` (8140 by default) when it names no port
/// (docs/agent.md#puppet-style-flags); URLs are kept as given.
fn command_line_urls(servers: &[String], puppet: &Puppet) -> Result<Vec<String>, ResolveError> {
    let mut urls = Vec::new();
    for s in servers {
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
fn environment(r: &mut Resolver) -> Result<(EnvName, Source), ResolveError> {
    let (name, source) = r.layers.or(
        |l| l.environment.clone(),
        || config::DEFAULT_ENVIRONMENT.to_owned(),
    );
    let environment = blame(config::environment(&name), source)?;
    r.show("environment", &environment, source);
    Ok((environment, source))
}

/// The TLS files: `[tls]`'s when it names them, else the ssldir's
/// (`[tls] ssldir`, else puppet.conf's, else Puppet's default) for
/// `certname`.
fn tls(r: &mut Resolver, file: &AgentConfig, certname: &str) -> Result<TlsFiles, ResolveError> {
    let cert_expiry_warning = match file.tls.source()? {
        TlsSource::Files(files) => {
            for (name, value) in [
                ("tls.ca", Some(&files.ca)),
                ("tls.cert", Some(&files.cert)),
                ("tls.key", Some(&files.key)),
                ("tls.crl", files.crl.as_ref()),
            ] {
                if let Some(v) = value {
                    r.show(name, v.display(), Source::AgentToml);
                }
            }
            return Ok(files);
        }
        TlsSource::SslDir {
            cert_expiry_warning,
            ..
        } => cert_expiry_warning,
    };
    if certname.is_empty() || certname.contains('/') || certname.starts_with('.') {
        return Err(ConfigError::Invalid(format!(
            "certname '{certname}' cannot name a certificate file"
        ))
        .into());
    }
    let (ssldir, source) = r.layers.or(|l| l.tls.ssldir.clone(), PathBuf::new);
    r.show("ssldir", ssldir.display(), source);
    Ok(config::ssldir_files(&ssldir, certname, cert_expiry_warning))
}

/// The destinations and the state directory: `libdir`, `factsdir`
/// (`None`: no pluginfacts pass) and `vardir`, each from the first layer
/// that sets it, else its default; the two destinations apart.
fn destinations(r: &mut Resolver) -> Result<(PathBuf, Option<PathBuf>, PathBuf), ResolveError> {
    let (libdir, libdir_source) =
        (r.layers).or(|l| l.libdir.clone(), || config::DEFAULT_LIBDIR.into());
    let (vardir, vardir_source) =
        (r.layers).or(|l| l.vardir.clone(), || config::DEFAULT_VARDIR.into());
    let factsdir = r.layers.pick(|l| l.factsdir.clone());
    let defaulted = factsdir.is_none();
    let (factsdir, factsdir_source) = match factsdir {
        Some((f, source)) if f.as_os_str().is_empty() => (None, source),
        Some((f, source)) => (Some(f), source),
        None => (Some(config::default_factsdir(&vardir)), Source::Default),
    };
    if let Some(f) = &factsdir {
        blame(config::apart(&libdir, f, defaulted), factsdir_source)?;
    }
    let path = |p: &Path| p.display().to_string();
    r.show("libdir", path(&libdir), libdir_source);
    let facts_text = factsdir.as_deref().map(path).unwrap_or_default();
    r.show("factsdir", facts_text, factsdir_source);
    r.show("vardir", path(&vardir), vardir_source);
    Ok((libdir, factsdir, vardir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    fn resolve(dir: &Path, toml: &str, cli: CommandLine) -> Result<Settings, ResolveError> {
        let file = AgentConfig::parse(toml, &dir.join("agent.toml"))?;
        file.validate()?;
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
        let s = resolve(d.path(), &toml, CommandLine::default()).unwrap();
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
            command_line(None, vec!["https://cli:1".into()], None, Default::default()),
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

    /// With puppet.conf and no destination in agent.toml, Puppet's
    /// `libdir` and `pluginfactdest` as its agent resolves them (named,
    /// else under `$vardir`, each from its section; `[agent]` over
    /// `[main]`); agent.toml naming either destination takes both.
    #[test]
    fn puppet_confs_destinations_unless_agent_toml_names_one() {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("puppet.conf");
        let dirs = |puppet: &str, toml: &str| {
            std::fs::write(&conf, puppet).unwrap();
            let toml = format!("puppet_conf = {conf:?}\nvardir = \"/own\"\n{toml}");
            let s = resolve(d.path(), &toml, CommandLine::default()).unwrap();
            (source_of(&s, "libdir"), source_of(&s, "factsdir"))
        };
        let main = Source::PuppetConf(Section::Main);
        let agent = Source::PuppetConf(Section::Agent);
        assert_eq!(
            dirs("[main]\nvardir = /pv\n[agent]\nvardir = /av\n", ""),
            (("/av/lib".into(), agent), ("/av/facts.d".into(), agent))
        );
        assert_eq!(
            dirs(
                "[main]\nvardir = /pv\nlibdir = $vardir/l\n[agent]\npluginfactdest = /f\n",
                ""
            ),
            (("/pv/l".into(), main), ("/f".into(), agent))
        );
        // puppet.conf naming neither: Puppet's default vardir for a
        // non-Debian layout.
        assert_eq!(
            dirs("[main]\n", "").0,
            ("/opt/puppetlabs/puppet/cache/lib".into(), Source::Default)
        );
        let own = Source::AgentToml;
        assert_eq!(
            dirs("[main]\nlibdir = /l\n", "libdir = \"/mine\"\n"),
            (
                ("/mine".into(), own),
                ("/own/facts.d".into(), Source::Default)
            )
        );
        assert_eq!(
            dirs("[main]\nlibdir = /l\n", "factsdir = \"\"\n"),
            (
                (config::DEFAULT_LIBDIR.into(), Source::Default),
                (String::new(), own)
            )
        );
        // Puppet's two nested are refused, blamed on puppet.conf (78).
        std::fs::write(&conf, "[main]\nlibdir = /x\npluginfactdest = /x/f\n").unwrap();
        let toml = format!("puppet_conf = {conf:?}\n");
        let e = resolve(d.path(), &toml, CommandLine::default()).unwrap_err();
        assert!(
            !e.from_command_line && e.to_string().contains("contain each other"),
            "{e}"
        );
    }

    #[test]
    fn without_puppet_conf_the_defaults_apply() {
        let d = tempfile::tempdir().unwrap();
        let s = resolve(d.path(), "puppet_conf = \"\"\n", CommandLine::default()).unwrap();
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
            CommandLine::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cannot read puppet.conf") && e.contains("missing.conf"),
            "{e}"
        );
    }

    /// External facts are synced by default, into `<vardir>/facts.d`, as
    /// Puppet syncs them into `$vardir/facts.d`; `factsdir = ""` turns the
    /// pass off.
    #[test]
    fn factsdir_defaults_to_the_vardirs_facts_d_and_empty_turns_it_off() {
        let factsdir = |toml: &str| {
            let toml = format!("puppet_conf = \"\"\n{toml}");
            resolve(Path::new("/etc/pluginsync"), &toml, CommandLine::default()).map(|s| s.factsdir)
        };
        assert_eq!(
            factsdir("vardir = \"/srv/ps\"\n").unwrap(),
            Some(PathBuf::from("/srv/ps/facts.d"))
        );
        assert_eq!(
            factsdir("").unwrap(),
            Some(PathBuf::from("/var/lib/pluginsync/facts.d"))
        );
        assert_eq!(factsdir("factsdir = \"\"\n").unwrap(), None);
        assert_eq!(
            factsdir("factsdir = \"f\"\n").unwrap(),
            Some(PathBuf::from("/etc/pluginsync/f"))
        );
        // A default that falls inside the libdir says how to set it.
        let e = factsdir("vardir = \"/srv/ps\"\nlibdir = \"/srv\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("contain each other") && e.contains("factsdir = \"\""),
            "{e}"
        );
    }
}
