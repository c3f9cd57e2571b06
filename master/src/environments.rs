//! Environments and their modules, as Puppet's directory environments have
//! them (docs/protocol.md §3.4, §3.1).
//!
//! An environment is `<environmentpath entry>/<name>/` whose name matches
//! `^\w+$`; the first entry that has it wins. Its modulepath is the
//! `modulepath` of its `environment.conf` ([`crate::envconf`]: relative
//! entries under the environment directory, `$basemodulepath` expanded,
//! globs expanded in sorted order, missing directories skipped), or without
//! that file `<env>/modules` followed by `basemodulepath`. A module is a
//! directory in a modulepath entry whose name matches `^[a-z][a-z0-9_]*$`; a
//! name seen in an earlier entry shadows later ones. Puppet orders modules
//! of one directory by readdir order, which differs between hosts; we sort
//! by name so every replica resolves collisions the same way ("first wins").
//!
//! **The code tree** (docs/master.md#code-trees-as-r10k-and-code-manager-deploy-them):
//! a module directory, `lib/` or
//! `facts.d/` is served only if its real path is under the environment
//! directory's real path or a `basemodulepath` entry's real path (so a
//! Code Manager / r10k layout with `production -> releases/N` works), or
//! matches `index.allow_external_roots`. `environment.conf` cannot widen
//! the code tree: whoever can push a branch writes that file. A root
//! outside is skipped with one warning per build ([`Modulepath::contains`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pluginsync_common::envname::EnvName;

use pluginsync_common::config::ConfigError;

use crate::envconf;

/// Where the environments and their modules are, as the config gives them
/// (`environmentpath`, `basemodulepath`, `index.allow_external_roots`):
/// `config.rs` makes it (`MasterConfig::layout`),
/// this module never reads the config file's types.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Directories holding environments (`<dir>/<name>/modules/...`).
    pub environmentpath: Vec<PathBuf>,
    /// Module directories appended to every environment's modulepath.
    pub basemodulepath: Vec<PathBuf>,
    /// `index.allow_external_roots`: absolute path globs of roots served
    /// outside the code tree.
    pub allow_external_roots: Vec<String>,
}

/// `index.allow_external_roots` `patterns`, compiled: `*` and `?` stay
/// within one path component; every pattern must be absolute.
pub fn external_roots(patterns: &[String]) -> Result<globset::GlobSet, ConfigError> {
    let mut set = globset::GlobSetBuilder::new();
    for pattern in patterns {
        if !pattern.starts_with('/') {
            return Err(ConfigError::Invalid(format!(
                "index.allow_external_roots: '{pattern}' is not an absolute path"
            )));
        }
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| ConfigError::Invalid(format!("index.allow_external_roots: {e}")))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| ConfigError::Invalid(format!("index.allow_external_roots: {e}")))
}

/// A module on the modulepath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// The module name (the directory name).
    pub name: String,
    /// The module directory.
    pub dir: PathBuf,
    /// Index of its directory in [`Modulepath::entries`].
    pub entry: usize,
}

/// One directory of an effective modulepath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The directory (absolute; a glob's match, or the entry as written).
    pub dir: PathBuf,
    /// Whether it is an existing directory (missing ones are skipped).
    pub exists: bool,
}

/// An environment's effective modulepath, and the code tree its module
/// roots must stay in.
#[derive(Debug, Clone)]
pub struct Modulepath {
    /// The environment directory, as found.
    pub env_dir: PathBuf,
    /// `<env>/environment.conf` when it exists (and was read).
    pub conf: Option<PathBuf>,
    /// The directories, in order (globs expanded).
    pub entries: Vec<Entry>,
    /// Problems with `environment.conf` or the entries, one line each,
    /// naming the file and line where there is one.
    pub warnings: Vec<String>,
    /// Real paths of the environment directory and the basemodulepath.
    code_tree: Vec<PathBuf>,
    /// `index.allow_external_roots`, compiled.
    allowed: globset::GlobSet,
}

/// A module directory or root that is not served because its real path is
/// outside the code tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outside {
    /// The module name.
    pub module: String,
    /// The path as found on the modulepath.
    pub path: PathBuf,
    /// Where it really is.
    pub real: PathBuf,
}

impl std::fmt::Display for Outside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "module {}: {} is really {}, outside the code tree (the environment directory and \
             basemodulepath), not served (index.allow_external_roots allows it)",
            self.module,
            self.path.display(),
            self.real.display()
        )
    }
}

/// What [`scan`] found on a modulepath.
#[derive(Debug, Default)]
pub struct Scan {
    /// The served modules, in resolution order.
    pub modules: Vec<Module>,
    /// Modules hidden by one of the same name in an earlier entry: (entry
    /// index, name).
    pub shadowed: Vec<(usize, String)>,
    /// Module directories outside the code tree (not served; they still
    /// shadow later modules of the same name, as Puppet would have served
    /// them).
    pub outside: Vec<Outside>,
    /// Modulepath directories that exist but cannot be listed, and why: an
    /// error, not an empty directory (docs/master.md#unreadable-files).
    pub unreadable: Vec<(PathBuf, std::io::Error)>,
}

/// The directory of environment `name`, if one exists.
pub fn find_environment(config: &Layout, name: &EnvName) -> Option<PathBuf> {
    config
        .environmentpath
        .iter()
        .map(|dir| dir.join(name.as_str()))
        .find(|candidate| candidate.is_dir())
}

/// Every environment on the environmentpath, sorted by name, first entry
/// winning for duplicate names.
pub fn list_environments(config: &Layout) -> Vec<(EnvName, PathBuf)> {
    let mut found: Vec<(EnvName, PathBuf)> = Vec::new();
    for root in &config.environmentpath {
        let Ok(entries) = std::fs::read_dir(root) else {
            tracing::warn!(dir = %root.display(), "cannot read environmentpath entry");
            continue;
        };
        for entry in entries.flatten() {
            let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<EnvName>().ok())
            else {
                continue;
            };
            if entry.path().is_dir() && !found.iter().any(|(n, _)| n == &name) {
                found.push((name, entry.path()));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The effective modulepath of the environment at `env_dir` (its name is
/// the directory's name), with its warnings (`environment.conf`, entries)
/// logged when they differ from the last ones logged for it: a rebuild
/// that finds the same problems (a refresh, a change elsewhere, an idle
/// environment built again) does not repeat them; a new or changed one is
/// logged, and a fixed one forgotten.
pub fn modulepath(config: &Layout, env_dir: &Path) -> Modulepath {
    static WARNED: std::sync::Mutex<BTreeMap<PathBuf, Vec<String>>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mp = resolve(config, env_dir);
    let now: Vec<String> = mp.warnings.iter().map(|w| w.to_string()).collect();
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if now.is_empty() {
        warned.remove(env_dir);
    } else if warned.get(env_dir) != Some(&now) {
        for w in &now {
            tracing::warn!(environment = %env_dir.display(), "{w}");
        }
        warned.insert(env_dir.to_owned(), now);
    }
    mp
}

/// [`modulepath`] without logging (for `check`, which prints).
pub fn resolve(config: &Layout, env_dir: &Path) -> Modulepath {
    let env_name = env_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let conf_path = env_dir.join("environment.conf");
    let mut warnings = Vec::new();
    let mut conf = None;
    let patterns = match std::fs::read(&conf_path) {
        Ok(bytes) => {
            conf = Some(conf_path.clone());
            let text = String::from_utf8_lossy(&bytes);
            let (parsed, problems) = envconf::parse(&text);
            warnings.extend(
                problems
                    .iter()
                    .map(|w| format!("{}:{}: {}", conf_path.display(), w.line, w.message)),
            );
            match parsed.modulepath {
                Some((value, line)) => {
                    let (entries, problems) = envconf::modulepath_entries(
                        &value,
                        env_dir,
                        &env_name,
                        &config.basemodulepath,
                    );
                    warnings.extend(
                        problems
                            .iter()
                            .map(|p| format!("{}:{line}: {p}", conf_path.display())),
                    );
                    entries
                }
                None => default_modulepath(config, env_dir),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => default_modulepath(config, env_dir),
        Err(e) => {
            warnings.push(format!(
                "{}: cannot read ({e}); using the default modulepath",
                conf_path.display()
            ));
            default_modulepath(config, env_dir)
        }
    };
    let mut entries = Vec::new();
    for p in patterns {
        if envconf::is_glob(&p) {
            entries.extend(
                expand_glob(&p)
                    .into_iter()
                    .map(|dir| Entry { exists: true, dir }),
            );
        } else {
            entries.push(Entry {
                exists: p.is_dir(),
                dir: p,
            });
        }
    }
    let code_tree = std::iter::once(env_dir)
        .chain(config.basemodulepath.iter().map(PathBuf::as_path))
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    let allowed = external_roots(&config.allow_external_roots).unwrap_or_else(|e| {
        warnings.push(format!("{e}; no external root is allowed"));
        globset::GlobSet::empty()
    });
    Modulepath {
        env_dir: env_dir.to_owned(),
        conf,
        entries,
        warnings,
        code_tree,
        allowed,
    }
}

/// Puppet's modulepath without `environment.conf`.
fn default_modulepath(config: &Layout, env_dir: &Path) -> Vec<PathBuf> {
    std::iter::once(env_dir.join("modules"))
        .chain(config.basemodulepath.iter().cloned())
        .collect()
}

/// The existing directories matching an absolute glob, sorted (Ruby's
/// `Dir.glob`, whose `*` and `?` skip names starting with `.`), component
/// by component; at most 10,000.
fn expand_glob(pattern: &Path) -> Vec<PathBuf> {
    const MAX: usize = 10_000;
    let mut current = vec![PathBuf::from("/")];
    for comp in pattern.components().skip(1) {
        let comp = comp.as_os_str().to_string_lossy();
        if !envconf::is_glob(Path::new(&*comp)) {
            current = current.into_iter().map(|d| d.join(&*comp)).collect();
            continue;
        }
        let Ok(glob) = globset::GlobBuilder::new(&comp)
            .literal_separator(true)
            .build()
        else {
            return Vec::new();
        };
        let matcher = glob.compile_matcher();
        let mut next = Vec::new();
        for dir in &current {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut names: Vec<String> = rd
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| (!n.starts_with('.') || comp.starts_with('.')) && matcher.is_match(n))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| dir.join(n)));
            if next.len() > MAX {
                break;
            }
        }
        current = next;
        current.truncate(MAX);
    }
    current.retain(|p| p.is_dir());
    current
}

impl Modulepath {
    /// The existing directories, in order.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.entries
            .iter()
            .filter(|e| e.exists)
            .map(|e| e.dir.as_path())
    }

    /// Whether a real (canonical) path may be served: under the code tree,
    /// or it or an ancestor matches `index.allow_external_roots`.
    pub fn contains(&self, real: &Path) -> bool {
        self.code_tree.iter().any(|root| real.starts_with(root))
            || real.ancestors().any(|a| self.allowed.is_match(a))
    }

    /// `path`'s real path if it is outside the code tree (and not allowed);
    /// `None` when it may be served or cannot be resolved.
    pub fn outside(&self, path: &Path) -> Option<PathBuf> {
        let real = path.canonicalize().ok()?;
        (!self.contains(&real)).then_some(real)
    }

    /// The effective modulepath, `:`-joined as Puppet prints it (existing
    /// directories only).
    pub fn joined(&self) -> String {
        self.dirs()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// True for a valid Puppet module name.
pub fn is_module_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The served modules of a modulepath, in resolution order: modulepath
/// order, then name; a name already seen is shadowed. Module directories
/// outside the code tree are left out with one warning each. Also the
/// modulepath directories that cannot be listed ([`Scan::unreadable`]).
pub fn modules(modulepath: &Modulepath) -> (Vec<Module>, Vec<(PathBuf, std::io::Error)>) {
    let scan = scan(modulepath);
    for o in &scan.outside {
        tracing::warn!("{o}");
    }
    (scan.modules, scan.unreadable)
}

/// Every module of every existing modulepath directory: served, shadowed,
/// or outside the code tree.
pub fn scan(modulepath: &Modulepath) -> Scan {
    let mut out = Scan::default();
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (entry, e) in modulepath.entries.iter().enumerate() {
        if !e.exists {
            // Missing is fine; there but not searchable is not.
            if let Err(err) = std::fs::metadata(&e.dir)
                && !matches!(
                    err.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                )
            {
                out.unreadable.push((e.dir.clone(), err));
            }
            continue;
        }
        let rd = match std::fs::read_dir(&e.dir) {
            Ok(rd) => rd,
            Err(err) => {
                out.unreadable.push((e.dir.clone(), err));
                continue;
            }
        };
        let mut here: Vec<(String, PathBuf)> = rd
            .flatten()
            .filter_map(|d| {
                let name = d.file_name().to_str()?.to_owned();
                if !is_module_name(&name) {
                    tracing::debug!(dir = %d.path().display(), "not a module name, skipped");
                    return None;
                }
                d.path().is_dir().then(|| (name, d.path()))
            })
            .collect();
        here.sort();
        for (name, dir) in here {
            if !seen.insert(name.clone()) {
                out.shadowed.push((entry, name));
                continue;
            }
            if let Some(real) = modulepath.outside(&dir) {
                out.outside.push(Outside {
                    module: name,
                    path: dir,
                    real,
                });
                continue;
            }
            out.modules.push(Module { name, dir, entry });
        }
    }
    out
}

/// What `Store::warm` indexes, in order: the names listed in
/// `index.warm` that exist, then, if the list holds `"*"`, every other
/// environment by name. The first part is what readiness waits for.
pub fn warm_targets(warm: &[String], on_disk: &[EnvName]) -> (Vec<EnvName>, Vec<EnvName>) {
    let mut named: Vec<EnvName> = Vec::new();
    for w in warm.iter().filter(|w| *w != "*") {
        if let Some(n) = on_disk.iter().find(|n| n.as_str() == w)
            && !named.contains(n)
        {
            named.push(n.clone());
        }
    }
    let rest = if warm.iter().any(|w| w == "*") {
        on_disk
            .iter()
            .filter(|n| !named.contains(n))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    (named, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A modulepath of `dirs` whose code tree is `root`.
    fn test_modulepath(root: &Path, dirs: &[PathBuf]) -> Modulepath {
        Modulepath {
            env_dir: root.to_owned(),
            conf: None,
            entries: dirs
                .iter()
                .map(|d| Entry {
                    dir: d.clone(),
                    exists: d.is_dir(),
                })
                .collect(),
            warnings: Vec::new(),
            code_tree: vec![root.canonicalize().unwrap()],
            allowed: globset::GlobSet::empty(),
        }
    }

    fn config(base: &[PathBuf], allow: &[&str]) -> Layout {
        Layout {
            environmentpath: vec![PathBuf::from("/nonexistent")],
            basemodulepath: base.to_vec(),
            allow_external_roots: allow.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn environment_conf_gives_the_effective_modulepath() {
        let t = tempfile::tempdir().unwrap();
        let env = t.path().join("envs/production");
        let base = t.path().join("base");
        for d in [
            "envs/production/site-modules/role",
            "envs/production/modules/stdlib",
            "envs/production/modules/role",
            "envs/production/dist/b_set/x",
            "envs/production/dist/a_set/y",
            "envs/production/dist/.hidden/z",
            "base/stdlib",
            "base/basemod",
        ] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        std::fs::write(
            env.join("environment.conf"),
            "# control repo\nmodulepath = site-modules:modules:dist/*:missing:$basemodulepath\n\
             manifest = manifests\nfrobnicate = yes\n",
        )
        .unwrap();
        let c = config(std::slice::from_ref(&base), &[]);
        let mp = resolve(&c, &env);
        let dirs: Vec<_> = mp
            .entries
            .iter()
            .map(|e| (e.dir.clone(), e.exists))
            .collect();
        assert_eq!(
            dirs,
            vec![
                (env.join("site-modules"), true),
                (env.join("modules"), true),
                (env.join("dist/a_set"), true),
                (env.join("dist/b_set"), true),
                (env.join("missing"), false),
                (base.clone(), true),
            ]
        );
        assert_eq!(mp.warnings.len(), 1, "{:?}", mp.warnings);
        assert!(
            mp.warnings[0].ends_with("environment.conf:4: unknown setting 'frobnicate', ignored"),
            "{:?}",
            mp.warnings
        );
        let scan = scan(&mp);
        let served: Vec<_> = scan
            .modules
            .iter()
            .map(|m| (m.name.as_str(), m.entry))
            .collect();
        assert_eq!(
            served,
            vec![
                ("role", 0),
                ("stdlib", 1),
                ("y", 2),
                ("x", 3),
                ("basemod", 5)
            ]
        );
        assert_eq!(
            scan.shadowed,
            vec![(1, "role".to_owned()), (5, "stdlib".to_owned())]
        );
        // Without the file: <env>/modules + basemodulepath.
        std::fs::remove_file(env.join("environment.conf")).unwrap();
        let mp = resolve(&c, &env);
        assert_eq!(
            mp.dirs().collect::<Vec<_>>(),
            vec![env.join("modules"), base]
        );
        assert!(mp.conf.is_none() && mp.warnings.is_empty());
    }

    #[test]
    fn module_roots_stay_in_the_code_tree_unless_allowed() {
        let t = tempfile::tempdir().unwrap();
        let releases = t.path().join("releases/7");
        std::fs::create_dir_all(releases.join("modules/inside")).unwrap();
        std::fs::create_dir_all(t.path().join("envs")).unwrap();
        std::fs::create_dir_all(t.path().join("secret/keys")).unwrap();
        // production -> releases/7, as Code Manager lays it out.
        let env = t.path().join("envs/production");
        std::os::unix::fs::symlink(&releases, &env).unwrap();
        std::os::unix::fs::symlink(t.path().join("secret/keys"), releases.join("modules/keys"))
            .unwrap();
        let scan_with = |allow: &[&str]| scan(&resolve(&config(&[], allow), &env));
        let s = scan_with(&[]);
        assert_eq!(
            s.modules
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>(),
            vec!["inside"]
        );
        assert_eq!(s.outside.len(), 1);
        assert_eq!(s.outside[0].module, "keys");
        assert_eq!(
            s.outside[0].real,
            t.path().join("secret/keys").canonicalize().unwrap()
        );
        let secret = t.path().join("secret").canonicalize().unwrap();
        let s = scan_with(&[secret.to_str().unwrap()]);
        assert_eq!(s.modules.len(), 2, "{s:?}");
        let s = scan_with(&[&format!("{}/*", secret.display())]);
        assert_eq!(s.modules.len(), 2, "{s:?}");
        let s = scan_with(&["/nowhere/*"]);
        assert_eq!(s.modules.len(), 1, "{s:?}");
    }

    #[test]
    fn module_names() {
        for ok in ["a", "stdlib", "my_mod2"] {
            assert!(is_module_name(ok), "{ok}");
        }
        for bad in ["", "Foo", "bad-name", "2x", "_x", "a.b"] {
            assert!(!is_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn order_and_shadowing() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for d in ["a/zeta", "a/alpha", "a/Bad-Name", "b/alpha", "b/beta"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        std::fs::write(a.join("file_not_dir"), "").unwrap();
        let (m, unreadable) = modules(&test_modulepath(
            t.path(),
            &[a.clone(), b.clone(), t.path().join("missing")],
        ));
        assert!(unreadable.is_empty(), "a missing entry is not an error");
        let names: Vec<_> = m
            .iter()
            .map(|m| (m.name.as_str(), m.dir.parent().unwrap().to_owned()))
            .collect();
        assert_eq!(names, vec![("alpha", a.clone()), ("zeta", a), ("beta", b)]);
    }

    fn env_names(v: &[&str]) -> Vec<EnvName> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn warm_targets_put_the_named_first_and_star_takes_the_rest() {
        let disk = env_names(&["dev", "production", "staging", "test"]);
        let warm = |w: &[&str]| {
            let w: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            warm_targets(&w, &disk)
        };
        assert_eq!(
            warm(&["production", "*"]),
            (
                env_names(&["production"]),
                env_names(&["dev", "staging", "test"])
            )
        );
        assert_eq!(
            warm(&["staging", "missing", "production", "staging"]),
            (env_names(&["staging", "production"]), vec![]),
            "a name not on disk is skipped, a repeated one warmed once"
        );
        assert_eq!(warm(&[]), (vec![], vec![]));
        assert_eq!(warm(&["*"]), (vec![], disk.clone()));
    }
}
