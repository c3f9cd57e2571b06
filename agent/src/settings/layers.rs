//! The layers of the settings, highest first: the command line, agent.toml, puppet.conf's
//! `[agent]`, its `[main]`, Puppet's defaults for puppet.conf's layout; each an [`AgentConfig`]
//! of optional values. [`Layers::pick`] is the one step that resolves a setting: the first layer
//! that sets it, and which one that was (docs/agent.md#on-a-puppet-node); [`Resolver`] keeps, as
//! each setting is resolved, its value and source for `pluginsync-agent config`.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::Format;
use crate::config::{AgentConfig, EnvironmentSource, TlsConfig};
use crate::loaders::LoadConfig;
use crate::puppetconf::Section;

use super::puppet::Puppet;
use super::{Effective, Source};

/// The layers, highest first, each with the source it stands for.
pub(super) struct Layers<'a>(pub(super) [(Source, &'a AgentConfig); 5]);

impl Layers<'_> {
    /// The first layer's value of a setting (`get`), with its source.
    pub(super) fn pick<T>(&self, get: impl Fn(&AgentConfig) -> Option<T>) -> Option<(T, Source)> {
        (self.0.iter()).find_map(|(source, layer)| get(layer).map(|v| (v, *source)))
    }

    /// [`Layers::pick`], else `default` (the built-in default).
    pub(super) fn or<T>(
        &self,
        get: impl Fn(&AgentConfig) -> Option<T>,
        default: impl FnOnce() -> T,
    ) -> (T, Source) {
        self.pick(get)
            .unwrap_or_else(|| (default(), Source::Default))
    }
}

/// The layers being resolved and what was resolved so far, in the order
/// `pluginsync-agent config` shows it.
pub(super) struct Resolver<'a> {
    /// The layers.
    pub(super) layers: Layers<'a>,
    /// What was resolved so far.
    pub(super) effective: Vec<Effective>,
}

/// A setting's value as `pluginsync-agent config` shows it.
pub(super) trait Shown {
    /// The value as text.
    fn shown(&self) -> String;
}

impl Shown for Duration {
    fn shown(&self) -> String {
        humantime_serde::re::humantime::format_duration(*self).to_string()
    }
}

impl Shown for EnvironmentSource {
    fn shown(&self) -> String {
        match self {
            EnvironmentSource::Config => "config",
            EnvironmentSource::Server => "server",
        }
        .into()
    }
}

macro_rules! shown_by_display {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
shown_by_display!(u32, usize, bool);

impl Resolver<'_> {
    /// The first layer's value of `name` (`get`), else `default`, shown.
    pub(super) fn get<T: Shown>(
        &mut self,
        name: &'static str,
        get: impl Fn(&AgentConfig) -> Option<T>,
        default: impl FnOnce() -> T,
    ) -> T {
        let (value, source) = self.layers.or(get, default);
        self.show(name, value.shown(), source);
        value
    }

    /// Shows `name = value  (source)`.
    pub(super) fn show(&mut self, name: &'static str, value: impl ToString, source: Source) {
        self.effective.push(Effective {
            name,
            value: value.to_string(),
            source,
        });
    }

    /// Shows a value only agent.toml sets: from it, or the default.
    pub(super) fn show_own(&mut self, name: &'static str, value: impl ToString, in_file: bool) {
        let source = match in_file {
            true => Source::AgentToml,
            false => Source::Default,
        };
        self.show(name, value, source);
    }

    /// `[switch]`, each of its values shown.
    pub(super) fn switch(&mut self) -> crate::config::switch::SwitchConfig {
        let (switch, source) = self.layers.or(|l| l.switch.clone(), Default::default);
        for (name, value) in switch.values() {
            self.show(name, value, source);
        }
        switch
    }

    /// `[trust]`, shown as `trust = off` when unset.
    pub(super) fn trust(&mut self, file: &AgentConfig) -> Option<crate::config::TrustConfig> {
        match &file.trust {
            Some(t) => t
                .values()
                .into_iter()
                .for_each(|(n, v)| self.show_own(n, v, true)),
            None => self.show_own("trust", "off", false),
        }
        file.trust.clone()
    }

    /// `[load]`, with `[facts]` (docs/loading.md#fact-health) shown as it
    /// resolves on this node.
    pub(super) fn facts(&mut self, file: &AgentConfig) -> LoadConfig {
        for (name, value) in file.load.facts.values() {
            self.show_own(name, value, file.facts.is_some());
        }
        file.load.clone()
    }

    /// `[facts] external_dir`, shown: agent.toml's, else `default`
    /// (Facter's directory of the node's Puppet layout); `None`: the
    /// `pluginsync` fact is not written.
    pub(super) fn fact_dir(
        &mut self,
        file: &AgentConfig,
        default: Option<PathBuf>,
    ) -> Option<PathBuf> {
        let facts = &file.load.facts;
        let dir = facts.external_dir(default);
        let shown = (dir.as_ref()).map(|d| d.display().to_string());
        let set = facts.external_dir.is_some();
        self.show_own("facts.external_dir", shown.unwrap_or_default(), set);
        dir
    }

    /// The lock a commit waits on, shown: agent.toml's, else puppet.conf's
    /// `agent_catalog_run_lockfile` as Puppet derives it (docs/agent.md).
    pub(super) fn puppet_lock(
        &mut self,
        lock: crate::lock::PuppetLock,
        file: &AgentConfig,
    ) -> crate::lock::PuppetLock {
        let shown = (lock.file.as_ref()).map(|p| p.display().to_string());
        let in_file = file.puppet_lock.file.is_some();
        self.show_own("puppet_lock.file", shown.unwrap_or_default(), in_file);
        lock
    }
}

/// The settings only the command line sets (`sync`'s flags).
#[derive(Debug, Clone, Default)]
pub struct RunFlags {
    /// `--noop`: print the plan, change nothing.
    pub noop: bool,
    /// `--format`; unset: text.
    pub format: Option<Format>,
    /// `--detailed-exitcodes` (or `--test`).
    pub detailed_exitcodes: bool,
    /// `--load`: run the loaders as `[load] enabled` does.
    pub load: bool,
    /// `--allow-mass-removal`: no removal guard.
    pub allow_mass_removal: bool,
    /// `--allow-expired-metadata` (with `--from-bundle`).
    pub allow_expired_metadata: bool,
}

/// The command line: its layer (`--environment`, `--server`, `--certname`)
/// and what only it sets.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    /// The layer.
    pub layer: AgentConfig,
    /// The flags.
    pub run: RunFlags,
}

/// The command line's layer: `--environment`, `--server` (a list, unset
/// when none is given), `--certname`, and what only it sets.
pub fn command_line(
    environment: Option<String>,
    servers: Vec<String>,
    certname: Option<String>,
    run: RunFlags,
) -> CommandLine {
    let layer = AgentConfig {
        environment,
        servers: (!servers.is_empty()).then_some(servers),
        tls: TlsConfig {
            certname,
            ..TlsConfig::default()
        },
        ..AgentConfig::default()
    };
    CommandLine { layer, run }
}

/// What puppet.conf says, as three layers: `[agent]`, `[main]` and
/// Puppet's defaults for its layout. Each value lands in the layer of the
/// section it came from (`[agent]` over `[main]`, references expanded, as
/// Puppet's agent reads them). The servers are kept as written (a
/// `server_list`, else `server`) and made URLs where they are resolved.
/// The destinations are Puppet's `libdir` and `pluginfactdest` (Puppet's
/// own, so Puppet and Facter read what is synced) only when `file` names
/// neither (docs/agent.md#on-a-puppet-node).
pub(super) fn puppet_layers(puppet: &Puppet, file: &AgentConfig) -> [AgentConfig; 3] {
    let mut layers: [AgentConfig; 3] = Default::default();
    let at = |section: Option<Section>| match section {
        Some(Section::Agent) => 0,
        Some(_) => 1,
        None => 2,
    };
    if let Some((section, list)) = puppet
        .value("server_list")
        .filter(|(_, l)| !l.trim().is_empty())
        .or_else(|| puppet.value("server"))
    {
        layers[at(Some(section))].servers = Some(vec![list]);
    }
    if let Some((section, e)) = puppet.value("environment") {
        layers[at(Some(section))].environment = Some(e);
    }
    if let Some((section, c)) = puppet.value("certname") {
        layers[at(Some(section))].tls.certname = Some(c);
    }
    match puppet.value("ssldir") {
        Some((section, d)) => layers[at(Some(section))].tls.ssldir = Some(d.into()),
        None => layers[2].tls.ssldir = Some(puppet.default("ssldir").unwrap_or_default().into()),
    }
    if file.libdir.is_none() && file.factsdir.is_none() {
        if let Some((section, d)) = puppet.dir("libdir", "lib") {
            layers[at(section)].libdir = Some(d);
        }
        if let Some((section, d)) = puppet.dir("pluginfactdest", "facts.d") {
            layers[at(section)].factsdir = Some(d);
        }
    }
    layers
}
