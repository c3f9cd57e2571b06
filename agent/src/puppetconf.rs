//! Puppet's `puppet.conf`, read as Puppet's agent reads it (docs/agent.md#on-a-puppet-node;
//! docs/protocol.md §5.3 for the ssldir layout): pure, no I/O.
//!
//! The format is Puppet's ini-ish one: `[main]`, `[agent]`, `[server]` (its
//! older name `[master]`) and `[user]` sections, `key = value` lines, `#`
//! (and `;`) comment lines. Settings before the first section header are
//! `[main]`'s, as Puppet takes them. The agent looks a key up in `[agent]`
//! first, then `[main]` (Puppet's precedence for its `agent` run mode), and
//! expands `$name` / `${name}` references to other settings (`$confdir`,
//! `$vardir`, `$ssldir`, ...) the same way, falling back to the defaults the
//! caller gives. Nothing here fails: what cannot be understood is a
//! [`Warning`] naming its line, and the line is skipped.

use std::collections::BTreeMap;
use std::fmt;

/// A section of puppet.conf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    /// `[main]`: every run mode.
    Main,
    /// `[agent]`: `puppet agent`, and this agent.
    Agent,
    /// `[server]` or `[master]`: Puppet Server only.
    Server,
    /// `[user]`: `puppet apply` and the other commands.
    User,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Main => "main",
            Section::Agent => "agent",
            Section::Server => "server",
            Section::User => "user",
        })
    }
}

/// A line that was not understood, skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// A parsed puppet.conf: per section, its settings (a later line wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PuppetConf {
    sections: BTreeMap<Section, BTreeMap<String, String>>,
}

/// Parses `text`; never fails (see the module docs).
pub fn parse(text: &str) -> (PuppetConf, Vec<Warning>) {
    let mut conf = PuppetConf::default();
    let mut warnings = Vec::new();
    // `None`: inside a section this agent does not know (its lines are
    // skipped silently after the one warning on its header).
    let mut current = Some(Section::Main);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let warn = |message: String| Warning {
            line: i + 1,
            message,
        };
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                warnings.push(warn(format!("'{line}' is not a section header")));
                current = None;
                continue;
            };
            current = match name.trim() {
                "main" => Some(Section::Main),
                "agent" => Some(Section::Agent),
                "server" | "master" => Some(Section::Server),
                "user" => Some(Section::User),
                other => {
                    warnings.push(warn(format!("unknown section [{other}], skipped")));
                    None
                }
            };
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            warnings.push(warn(format!("'{line}' is not 'key = value'")));
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            warnings.push(warn(format!("'{key}' is not a setting name")));
            continue;
        }
        if let Some(section) = current {
            conf.sections
                .entry(section)
                .or_default()
                .insert(key.to_owned(), value.trim().to_owned());
        }
    }
    (conf, warnings)
}

/// How deep `$name` references may nest (a loop ends here).
const MAX_DEPTH: usize = 8;

/// How long an expanded value may grow: references that fan out (`a =
/// $b$b$b…`, `b = $c$c$c…`) would otherwise grow it exponentially within
/// `MAX_DEPTH` (8 levels of 8 references made a 32 MB `servers` value).
/// Past this, the rest of the value is kept as written.
pub const MAX_EXPANDED: usize = 4096;

/// What one `$reference` lookup costs from the expansion budget: at most
/// `MAX_EXPANDED / REFERENCE_COST` lookups per value.
const REFERENCE_COST: usize = 16;

impl PuppetConf {
    /// The raw value of `key` in `section`, if set there.
    pub fn raw(&self, section: Section, key: &str) -> Option<&str> {
        self.sections.get(&section)?.get(key).map(String::as_str)
    }

    /// `key` as the agent sees it: from `[agent]`, else `[main]`, with its
    /// `$name` references expanded (at most [`MAX_EXPANDED`] bytes); the section it
    /// came from too.
    pub fn agent_value(
        &self,
        key: &str,
        defaults: &dyn Fn(&str) -> Option<String>,
    ) -> Option<(Section, String)> {
        let (section, raw) = self.agent_raw(key)?;
        let budget = std::cell::Cell::new(MAX_EXPANDED);
        Some((section, self.expand_within(raw, defaults, 0, &budget)))
    }

    /// Puppet's agent run lock file: `agent_catalog_run_lockfile`, by
    /// default `$statedir/agent_catalog_run.lock`, `statedir` by default
    /// `$vardir/state`; `defaults` gives `vardir` for the layout
    /// (docs/agent.md#a-puppet-run-in-progress).
    pub fn run_lockfile(&self, defaults: &dyn Fn(&str) -> Option<String>) -> String {
        let with_statedir = |name: &str| match name {
            "statedir" => Some(format!(
                "{}/state",
                self.agent_value("vardir", defaults)
                    .map(|(_, v)| v)
                    .or_else(|| defaults("vardir"))?
            )),
            other => defaults(other),
        };
        let raw = self
            .agent_raw("agent_catalog_run_lockfile")
            .map_or("$statedir/agent_catalog_run.lock", |(_, v)| v);
        let budget = std::cell::Cell::new(MAX_EXPANDED);
        self.expand_within(raw, &with_statedir, 0, &budget)
    }

    fn agent_raw(&self, key: &str) -> Option<(Section, &str)> {
        [Section::Agent, Section::Main]
            .into_iter()
            .find_map(|s| self.raw(s, key).map(|v| (s, v)))
    }

    /// Replaces each `$name` and `${name}` in `value` by that setting as
    /// the agent sees it, or by `defaults(name)` when puppet.conf does not
    /// set it; an unknown name is left as written. Expansion spends
    /// `budget` bytes, shared by every nested reference: once spent,
    /// references stay as written.
    fn expand_within(
        &self,
        value: &str,
        defaults: &dyn Fn(&str) -> Option<String>,
        depth: usize,
        budget: &std::cell::Cell<usize>,
    ) -> String {
        let mut out = String::with_capacity(value.len().min(MAX_EXPANDED));
        let mut rest = value;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
                match braced.find('}') {
                    Some(end) => (&braced[..end], &braced[end + 1..]),
                    None => ("", after),
                }
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            // Each reference looked up costs from the budget too, so the
            // work stays bounded even when expansions are thrown away.
            let found = if name.is_empty() || depth >= MAX_DEPTH || budget.get() < REFERENCE_COST {
                None
            } else {
                budget.set(budget.get() - REFERENCE_COST);
                match self.agent_raw(name) {
                    Some((_, raw)) => Some(self.expand_within(raw, defaults, depth + 1, budget)),
                    None => defaults(name),
                }
            };
            match found.filter(|v| v.len() <= budget.get()) {
                Some(v) => {
                    budget.set(budget.get() - v.len());
                    out.push_str(&v);
                    rest = tail;
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// `server_list`'s or `server`'s entries as `https://host:port`; an entry
/// without a port gets `port` (Puppet's `serverport`, default 8140). A
/// bracketed IPv6 address keeps its brackets.
pub fn server_urls(list: &str, port: u16) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let has_port = match entry.rfind(']') {
                Some(close) => entry[close..].contains(':'),
                None => entry.matches(':').count() == 1,
            };
            if has_port {
                format!("https://{entry}")
            } else {
                format!("https://{entry}:{port}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_that_fan_out_stay_bounded() {
        let mut text = String::from("[main]\n");
        for (name, next) in ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            text.push_str(&format!("{name} = {}\n", format!("${next}").repeat(8)));
        }
        text.push_str("i = xxxxxxxxxxxxxxxx\n");
        let (conf, _) = parse(&text);
        let (_, value) = conf.agent_value("a", &|_| None).unwrap();
        assert!(
            value.len() <= 2 * MAX_EXPANDED + 64,
            "{} bytes",
            value.len()
        );
    }

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn agent_wins_over_main_and_other_sections_are_not_read() {
        let (c, w) = parse(
            "# a comment\nserver = top\n[main]\nenvironment = prod\ncertname = Main.Example\n\
             [agent]\n  environment = test  \n[server]\nenvironment = srv\n[master]\ncertname = m\n",
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            c.agent_value("environment", &none),
            Some((Section::Agent, "test".into()))
        );
        assert_eq!(
            c.agent_value("certname", &none),
            Some((Section::Main, "Main.Example".into()))
        );
        assert_eq!(
            c.agent_value("server", &none),
            Some((Section::Main, "top".into()))
        );
        assert_eq!(c.raw(Section::Server, "certname"), Some("m"));
        assert_eq!(c.agent_value("ssldir", &none), None);
    }

    #[test]
    fn bad_lines_are_warnings_naming_the_line_and_are_skipped() {
        let (c, w) = parse(
            "[main]\nnot a setting\n[agent\n[weird]\nserver = x\n[agent]\nbad key = 1\nserver = ok\n",
        );
        let lines: Vec<usize> = w.iter().map(|w| w.line).collect();
        assert_eq!(lines, [2, 3, 4, 7], "{w:?}");
        assert!(w[2].to_string().contains("[weird]"));
        assert_eq!(
            c.agent_value("server", &none),
            Some((Section::Agent, "ok".into()))
        );
    }

    #[test]
    fn references_expand_through_settings_then_defaults() {
        let (c, _) = parse(
            "[main]\nvardir = /var/lib/puppet\nssldir = $vardir/ssl\n[agent]\nx = ${ssldir}/certs:$confdir:$nope:$\n",
        );
        let defaults = |n: &str| (n == "confdir").then(|| "/etc/puppet".to_owned());
        assert_eq!(
            c.agent_value("ssldir", &defaults).unwrap().1,
            "/var/lib/puppet/ssl"
        );
        assert_eq!(
            c.agent_value("x", &defaults).unwrap().1,
            "/var/lib/puppet/ssl/certs:/etc/puppet:$nope:$"
        );
        // A loop stops at the depth bound instead of recursing forever.
        let (c, _) = parse("a = $b\nb = $a\n");
        assert!(c.agent_value("a", &none).unwrap().1.contains('$'));
    }

    #[test]
    fn the_run_lockfile_follows_statedir_and_vardir() {
        let vardir = |n: &str| (n == "vardir").then(|| "/opt/cache".to_owned());
        let lock = |text: &str| parse(text).0.run_lockfile(&vardir);
        assert_eq!(lock(""), "/opt/cache/state/agent_catalog_run.lock");
        assert_eq!(
            lock("[main]\nvardir = /var/lib/puppet\n"),
            "/var/lib/puppet/state/agent_catalog_run.lock"
        );
        assert_eq!(
            lock("[agent]\nstatedir = /s\n"),
            "/s/agent_catalog_run.lock"
        );
        assert_eq!(
            lock("[main]\nagent_catalog_run_lockfile = $statedir/x.lock\n"),
            "/opt/cache/state/x.lock"
        );
    }

    #[test]
    fn server_lists_become_urls() {
        assert_eq!(
            server_urls("a.example, b.example:8141,[::1]:9000,[::1], ", 8140),
            [
                "https://a.example:8140",
                "https://b.example:8141",
                "https://[::1]:9000",
                "https://[::1]:8140"
            ]
        );
    }
}
