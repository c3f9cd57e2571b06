//! `[load]` and `[[loader]]` of agent.toml, and the loader table compiled
//! from them once, when the file is loaded
//! (docs/loading.md#loading-changed-plugins-and-plugin-layouts): each
//! loader's `match` glob built into a matcher, its roots checked, and `[load.constraints]` parsed. Which loader a changed file
//! goes to ([`LoaderTable::find`]) and which version of a plugin is active
//! ([`LoaderTable::constraint`]) are answered here; running the loaders is
//! `load.rs`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use globset::{GlobBuilder, GlobMatcher};
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;
use serde::Deserialize;

use crate::plugins::{Constraint, ConstraintError};

/// `[load]`: nothing is executed unless `enabled` (or `--load`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadConfig {
    /// Run loaders at all (kustomize's stance: an explicit opt-in before
    /// any plugin code runs).
    pub enabled: bool,
    /// Load failures set the 4 bit of `--detailed-exitcodes`.
    pub failures_are_errors: bool,
    /// A run whose loads fail makes the previous generation live again
    /// (docs/agent.md#generations-and-rollback).
    pub rollback_on_failure: bool,
    /// Run once per sync when at least one file loaded, e.g.
    /// `["systemctl", "reload", "myservice"]`.
    pub after_load: Vec<String>,
    /// Deadline of `after_load` (its process group is killed then).
    #[serde(with = "humantime_serde")]
    pub after_load_timeout: Duration,
    /// Name prefix of describe plugins: `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
    pub plugin_prefix: String,
    /// Version constraints per plugin name, e.g. `hello = ">=1.0, <2"`.
    pub constraints: BTreeMap<String, String>,
    /// `[facts]`, a table of its own (`AgentConfig::parse` puts it here):
    /// checked whether or not `enabled`.
    #[serde(skip)]
    pub facts: crate::facts::FactsConfig,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            enabled: false,
            failures_are_errors: false,
            rollback_on_failure: false,
            after_load: Vec::new(),
            after_load_timeout: Duration::from_secs(10),
            plugin_prefix: "pluginsync-plugin".into(),
            constraints: Default::default(),
            facts: Default::default(),
        }
    }
}

/// How a loader loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoaderKind {
    /// Run `command` with the file's path.
    Command,
    /// Packer-style: check the name, the `_SHA256SUM` sidecar and the
    /// `describe` handshake, then register the plugin.
    Describe,
}

/// One `[[loader]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderConfig {
    /// A name for reports; defaults to the `match` glob.
    #[serde(default)]
    pub name: Option<String>,
    /// Glob on the changed file's path relative to the libdir
    /// (`*` stays within a directory, `**` crosses them).
    #[serde(rename = "match")]
    pub pattern: String,
    /// `command` or `describe`.
    pub kind: LoaderKind,
    /// The destination whose files this loader matches: `plugins` (the
    /// libdir, the default) or `pluginfacts` (the factsdir).
    #[serde(default = "default_loader_mount")]
    pub mount: Mount,
    /// For `command`: argv, with `{path}` (absolute), `{relpath}` and
    /// `{environment}` replaced.
    #[serde(default)]
    pub command: Vec<String>,
    /// Deadline of one launch; the child and its process group are killed.
    #[serde(default = "default_loader_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Launches tried before the load counts as failed; unset: 5 for
    /// `layout = "celerity"` (Celerity's launch attempt limit), else 1
    /// ([`LoaderConfig::attempts`]).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// For `describe`: run the `describe` handshake; unset: on for every
    /// layout but `kustomize`, whose exec plugins only take their
    /// configuration file ([`LoaderConfig::handshake`]).
    #[serde(default)]
    pub handshake: Option<bool>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// For `describe`: the plugin system whose file layout gives each
    /// plugin's identity and version (docs/loading.md#plugin-layouts).
    #[serde(default)]
    pub layout: Layout,
    /// For `describe`: directories relative to the libdir, searched in
    /// order; a file outside them is not loaded, and an identity held by an
    /// earlier root shadows the same identity in a later one. Empty: the
    /// whole libdir, one root.
    #[serde(default)]
    pub roots: Vec<String>,
    /// For `layout = "terraform"`: the directory (relative to the libdir)
    /// of the host program; an unversioned `terraform-provider-<name>`
    /// there is a local build, preferred over installed releases.
    #[serde(default)]
    pub host_dir: Option<String>,
    /// The operator accepts that this loader's `command` puts `{path}` or
    /// `{relpath}` inside a shell script, where a module file named
    /// `$(…)` runs as root: without it such a loader is refused when the
    /// configuration is read
    /// (docs/loading.md#never-put-path-in-a-shell-script).
    #[serde(default)]
    pub allow_shell_relpath: bool,
}

/// How `describe` plugins are laid out and named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `<prefix>-<name>_v<version>_x<api>_<os>_<arch>`.
    #[default]
    Packer,
    /// `terraform-provider-<name>_v<X.Y.Z>[_x<api>]` releases, in an
    /// optional `<os>_<arch>` directory, and unversioned local builds in
    /// `host_dir`.
    Terraform,
    /// Celerity's Deploy Engine:
    /// `{providers,transformers}/[<host>/]<namespace>/<name>/<version>/plugin`.
    Celerity,
    /// kustomize's exec plugins: `<apiVersion>/<lowercase kind>/<Kind>`.
    Kustomize,
}

/// Shells whose `-c` takes a script: a placeholder inside that script is
/// interpolated into shell code.
const SHELLS: [&str; 6] = ["sh", "bash", "dash", "zsh", "ksh", "ash"];

/// The placeholders that carry a file name from the master.
const NAME_PLACEHOLDERS: [&str; 2] = ["{path}", "{relpath}"];

impl LoaderConfig {
    /// The name reports give this loader: `name`, or the `match` glob.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.pattern)
    }

    /// The placeholder (`{path}` or `{relpath}`) this `command` puts inside
    /// the script of a `sh -c` (or `bash -c`, …), if any: the file name is
    /// then shell code, and a module file named `$(…)` runs as root
    /// (docs/loading.md#never-put-path-in-a-shell-script). As its own
    /// argument after the script (`["sh", "-c", "ruby -c \"$1\"", "sh",
    /// "{path}"]`) it is only data, and is not reported.
    pub fn shell_interpolation(&self) -> Option<&'static str> {
        let argv = &self.command;
        for (i, arg) in argv.iter().enumerate() {
            if !SHELLS.contains(&arg.rsplit('/').next().unwrap_or(arg)) {
                continue;
            }
            let mut script_next = false;
            for a in &argv[i + 1..] {
                if script_next {
                    return NAME_PLACEHOLDERS.into_iter().find(|p| a.contains(p));
                }
                match a.strip_prefix('-') {
                    Some(opts) if !opts.starts_with('-') => script_next = opts.contains('c'),
                    Some(_) => {}
                    None => break,
                }
            }
        }
        None
    }

    /// Launch attempts per load: `attempts`, or the layout's default (5
    /// for Celerity, whose Deploy Engine relaunches a plugin that did not
    /// register up to 4 times; 1 otherwise).
    pub fn attempts(&self) -> u32 {
        self.attempts.unwrap_or(match self.layout {
            Layout::Celerity if self.kind == LoaderKind::Describe => 5,
            _ => 1,
        })
    }

    /// Whether a `describe` load runs the handshake: `handshake`, or on
    /// for every layout but kustomize.
    pub fn handshake(&self) -> bool {
        self.handshake.unwrap_or(self.layout != Layout::Kustomize)
    }
}

fn default_loader_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_loader_mount() -> Mount {
    Mount::Plugins
}

/// Why `[[loader]]` or `[load.constraints]` cannot work; each names the
/// loader (by its 1-based position) or the constraint's key.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// A `match` glob that does not compile.
    #[error("[[loader]] {index} match '{pattern}': {reason}")]
    Match {
        /// 1-based position of the loader.
        index: usize,
        /// The glob as written.
        pattern: String,
        /// globset's reason.
        reason: globset::ErrorKind,
    },
    /// A root or `host_dir` that is not a relative path inside the
    /// destination.
    #[error("[[loader]] {index}: root '{root}' must be a relative path inside the destination")]
    Root {
        /// 1-based position of the loader.
        index: usize,
        /// The root as written.
        root: String,
    },
    /// `kind = "command"` without a command.
    #[error("[[loader]] {0} (kind = \"command\") needs a command")]
    NoCommand(usize),
    /// `attempts = 0`.
    #[error("[[loader]] {0}: attempts must be at least 1")]
    NoAttempts(usize),
    /// A file name put inside a shell script without
    /// `allow_shell_relpath = true`.
    #[error(
        "[[loader]] {index} '{label}' puts {placeholder} inside a shell script, where a module file named $(…) would run as root; pass it as an argument after the script (command = [\"sh\", \"-c\", \"ruby -c \\\"$1\\\"\", \"sh\", \"{placeholder}\"], docs/loading.md#never-put-path-in-a-shell-script) or set allow_shell_relpath = true on the loader to accept it"
    )]
    ShellInterpolation {
        /// 1-based position of the loader.
        index: usize,
        /// Its name in reports, escaped for the terminal.
        label: String,
        /// `{path}` or `{relpath}`.
        placeholder: &'static str,
    },
    /// A constraint that does not parse.
    #[error("[load.constraints] {name} = '{value}': {source}")]
    Constraint {
        /// The plugin name (the key).
        name: String,
        /// The constraint as written.
        value: String,
        /// Why it does not parse.
        source: ConstraintError,
    },
}

/// One `[[loader]]` with its `match` glob compiled.
#[derive(Debug, Clone)]
struct Loader {
    matcher: GlobMatcher,
    config: LoaderConfig,
}

/// The `[[loader]]` table and `[load.constraints]`, compiled (`*` stays
/// within a directory, `**` crosses them).
#[derive(Debug, Clone, Default)]
pub struct LoaderTable {
    loaders: Vec<Loader>,
    constraints: BTreeMap<String, Constraint>,
}

impl LoaderTable {
    /// Compiles `loaders` and `constraints`; the first that cannot work
    /// is the error, in the file's order.
    pub fn compile(
        loaders: &[LoaderConfig],
        constraints: &BTreeMap<String, String>,
    ) -> Result<LoaderTable, LoaderError> {
        let loaders = loaders
            .iter()
            .enumerate()
            .map(|(i, l)| compile_loader(i + 1, l))
            .collect::<Result<_, _>>()?;
        let constraints = constraints
            .iter()
            .map(|(name, value)| match Constraint::parse(value) {
                Ok(c) => Ok((name.clone(), c)),
                Err(source) => Err(LoaderError::Constraint {
                    name: name.clone(),
                    value: value.clone(),
                    source,
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(LoaderTable {
            loaders,
            constraints,
        })
    }

    /// True if no loader is configured.
    pub fn is_empty(&self) -> bool {
        self.loaders.is_empty()
    }

    /// True if a file of `mount` goes to the loaders: always for
    /// `plugins`; for `pluginfacts` when a loader has `mount =
    /// "pluginfacts"`.
    pub fn serves(&self, mount: Mount) -> bool {
        mount == Mount::Plugins || self.loaders.iter().any(|l| l.config.mount == mount)
    }

    /// The first loader of `mount` whose glob matches `rel`.
    pub fn find(&self, mount: Mount, rel: &RelPath) -> Option<&LoaderConfig> {
        self.loaders
            .iter()
            .find(|l| l.config.mount == mount && l.matcher.is_match(rel.as_str()))
            .map(|l| &l.config)
    }

    /// The loaders that interpolate a file name into a shell script
    /// ([`LoaderConfig::shell_interpolation`]): each one's label and the
    /// placeholder.
    pub fn shell_interpolations(&self) -> Vec<(&str, &'static str)> {
        self.loaders
            .iter()
            .filter_map(|l| Some((l.config.label(), l.config.shell_interpolation()?)))
            .collect()
    }

    /// The constraint of a plugin name, if configured.
    pub fn constraint(&self, name: &str) -> Option<&Constraint> {
        self.constraints.get(name)
    }
}

/// The `index`-th `[[loader]]`, checked and compiled.
fn compile_loader(index: usize, l: &LoaderConfig) -> Result<Loader, LoaderError> {
    let glob = GlobBuilder::new(&l.pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| LoaderError::Match {
            index,
            pattern: l.pattern.clone(),
            reason: e.kind().clone(),
        })?;
    for r in l.roots.iter().chain(&l.host_dir) {
        if RelPath::parse(r.trim_end_matches('/')).is_err() {
            return Err(LoaderError::Root {
                index,
                root: r.clone(),
            });
        }
    }
    if l.kind == LoaderKind::Command && l.command.is_empty() {
        return Err(LoaderError::NoCommand(index));
    }
    if l.attempts == Some(0) {
        return Err(LoaderError::NoAttempts(index));
    }
    if let Some(placeholder) = l.shell_interpolation()
        && !l.allow_shell_relpath
    {
        return Err(LoaderError::ShellInterpolation {
            index,
            label: pluginsync_common::text::escape(l.label()).into_owned(),
            placeholder,
        });
    }
    Ok(Loader {
        matcher: glob.compile_matcher(),
        config: l.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(toml: &str) -> Result<LoaderTable, LoaderError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default, rename = "loader")]
            loaders: Vec<LoaderConfig>,
            #[serde(default)]
            load: LoadConfig,
        }
        let f: File = toml::from_str(toml).unwrap();
        LoaderTable::compile(&f.loaders, &f.load.constraints)
    }

    #[test]
    fn a_bad_constraint_is_an_error_naming_its_key() {
        let e = table("[load.constraints]\nhello = \">= 1.0\"\nworld = \"=> 1\"\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "[load.constraints] world = '=> 1': unknown operator '=>'"
        );
        let t = table("[load.constraints]\nhello = \">= 1.0, < 2\"\n").unwrap();
        assert!(t.constraint("hello").is_some() && t.constraint("world").is_none());
    }

    #[test]
    fn the_first_matching_loader_of_the_mount_wins() {
        let t = table(
            "[[loader]]\nmatch = \"facter/*.rb\"\nkind = \"command\"\ncommand = [\"a\"]\n\
             [[loader]]\nname = \"any\"\nmatch = \"**\"\nkind = \"command\"\ncommand = [\"b\"]\n",
        )
        .unwrap();
        let rel = |s: &str| RelPath::parse(s).unwrap();
        let name = |m, s: &str| t.find(m, &rel(s)).map(|l| l.name.clone());
        assert_eq!(name(Mount::Plugins, "facter/x.rb"), Some(None));
        assert_eq!(
            name(Mount::Plugins, "facter/sub/x.rb"),
            Some(Some("any".into()))
        );
        assert_eq!(name(Mount::Pluginfacts, "facter/x.rb"), None);
        assert!(!t.serves(Mount::Pluginfacts));
        let e = table("[[loader]]\nmatch = \"[\"\nkind = \"describe\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("[[loader]] 1 match '['"), "{e}");
    }

    #[test]
    fn a_file_name_inside_a_shell_script_is_refused_unless_accepted() {
        let e = table(
            "[[loader]]\nmatch = \"a/*\"\nkind = \"command\"\n\
             command = [\"ruby\", \"-c\", \"{path}\"]\n\
             [[loader]]\nname = \"inline\"\nmatch = \"a/*\"\nkind = \"command\"\n\
             command = [\"sh\", \"-c\", \"ruby -c {relpath}\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("[[loader]] 2 'inline' puts {relpath} inside a shell script")
                && e.contains(r#"["sh", "-c", "ruby -c \"$1\"", "sh", "{relpath}"]"#)
                && e.contains("allow_shell_relpath = true"),
            "{e}"
        );
    }

    #[test]
    fn a_file_name_inside_a_shell_script_is_reported() {
        let t = table(
            "[[loader]]\nname = \"inline\"\nmatch = \"a/*\"\nkind = \"command\"\n\
             allow_shell_relpath = true\n\
             command = [\"/bin/sh\", \"-c\", \"ruby -c {path}\"]\n\
             [[loader]]\nname = \"bash\"\nmatch = \"b/*\"\nkind = \"command\"\n\
             allow_shell_relpath = true\n\
             command = [\"env\", \"bash\", \"--noprofile\", \"-ec\", \"x '{relpath}'\"]\n\
             [[loader]]\nname = \"argument\"\nmatch = \"c/*\"\nkind = \"command\"\n\
             command = [\"sh\", \"-c\", \"ruby -c \\\"$1\\\"\", \"sh\", \"{path}\"]\n\
             [[loader]]\nmatch = \"d/*\"\nkind = \"command\"\n\
             command = [\"ruby\", \"-c\", \"{path}\"]\n",
        )
        .unwrap();
        assert_eq!(
            t.shell_interpolations(),
            vec![("inline", "{path}"), ("bash", "{relpath}")]
        );
    }
}
