//! A code tree shaped like an r10k-deployed control repository (Puppet's
//! `control-repo` template; docs/deploys.md): [`ControlRepo::write`] lays out one
//! environment and a basemodulepath directory, and [`ControlRepo::expected`]
//! says what each mount must serve, written down by hand from the layout
//! below (not computed by any code of the master's), in
//! [`crate::tree_snapshot`]'s notation.
//!
//! ```text
//! <env>/environment.conf   modulepath = site-modules:modules:dist/*:missing:$basemodulepath
//! <env>/site-modules/profile   lib/facter/site_role.rb, facts.d/site_env.sh (0755, executable)
//! <env>/site-modules/role      lib/puppet/functions/role/name.rb
//! <env>/site-modules/stdlib    lib/facter/shadow.rb ("site wins")      shadows modules/stdlib
//! <env>/modules/stdlib         lib/facter/shadow.rb, lib/facter/stdlib_only.rb (hidden: whole module)
//! <env>/modules/apt            lib/facter/apt.rb, facts.d/apt.txt (0640)
//! <env>/dist/a_set/widget      lib/puppet/type/widget.rb               (a glob entry)
//! <env>/dist/b_set/gadget      facts.d/gadget.yaml (0644)
//! <env>/missing                (absent: skipped)
//! <base>/basemod               lib/facter/base.rb                       ($basemodulepath)
//! <base>/apt                   lib/facter/apt.rb, facts.d/base_apt.txt  (hidden by modules/apt)
//! <env>/modules/Bad-Name       lib/facter/bad.rb                        (not a module name)
//! ```
//!
//! No two modules of one directory provide the same path: Puppet orders
//! those by readdir (docs/protocol.md §3.1), and Puppet Server's JRuby does
//! not sort a glob's matches, so only shadowing across entries is
//! comparable with Puppet Server.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::sha256_hex;

/// `environment.conf` of the fixture: comments, Puppet's ignored keys, a
/// quoted value, and the modulepath.
pub const ENVIRONMENT_CONF: &str = "\
# Puppet's control-repo template, as r10k deploys it.
modulepath = site-modules:modules:dist/*:missing:$basemodulepath
manifest = manifests/site.pp
config_version = 'scripts/config_version.sh $environment'
";

/// (path under the environment or `@base/`, content, mode) of every file;
/// `served` says whether it wins its mount.
const FILES: &[(&str, &str, u32, bool)] = &[
    (
        "site-modules/profile/lib/facter/site_role.rb",
        "Facter.add(:site_role) { setcode { 'web' } }\n",
        0o644,
        true,
    ),
    (
        "site-modules/profile/facts.d/site_env.sh",
        "#!/bin/sh\necho site_env=control\n",
        0o755,
        true,
    ),
    (
        "site-modules/role/lib/puppet/functions/role/name.rb",
        "Puppet::Functions.create_function(:'role::name') { def name; 'web'; end }\n",
        0o644,
        true,
    ),
    (
        "site-modules/stdlib/lib/facter/shadow.rb",
        "# site-modules/stdlib wins\n",
        0o644,
        true,
    ),
    (
        "modules/stdlib/lib/facter/shadow.rb",
        "# modules/stdlib is shadowed\n",
        0o644,
        false,
    ),
    (
        "modules/stdlib/lib/facter/stdlib_only.rb",
        "# hidden with its whole module\n",
        0o644,
        false,
    ),
    (
        "modules/apt/lib/facter/apt.rb",
        "# modules/apt\n",
        0o644,
        true,
    ),
    ("modules/apt/facts.d/apt.txt", "apt=1\n", 0o640, true),
    (
        "dist/a_set/widget/lib/puppet/type/widget.rb",
        "# a_set's widget\n",
        0o644,
        true,
    ),
    (
        "dist/b_set/gadget/facts.d/gadget.yaml",
        "gadget: 1\n",
        0o644,
        true,
    ),
    (
        "modules/Bad-Name/lib/facter/bad.rb",
        "# not a module\n",
        0o644,
        false,
    ),
    (
        "@base/basemod/lib/facter/base.rb",
        "# from basemodulepath\n",
        0o644,
        true,
    ),
    (
        "@base/apt/lib/facter/apt.rb",
        "# base apt is shadowed\n",
        0o644,
        false,
    ),
    ("@base/apt/facts.d/base_apt.txt", "hidden=1\n", 0o644, false),
];

/// The control-repository fixture.
pub struct ControlRepo;

impl ControlRepo {
    /// Writes the environment into `env_dir` and its basemodulepath modules
    /// into `base` (both created). The master (or Puppet Server) must have
    /// `base` as its only basemodulepath entry.
    pub fn write(env_dir: &Path, base: &Path) {
        std::fs::create_dir_all(env_dir).expect("mkdir env");
        std::fs::create_dir_all(base).expect("mkdir base");
        std::fs::write(env_dir.join("environment.conf"), ENVIRONMENT_CONF).expect("conf");
        for (path, content, mode, _) in FILES {
            let p = match path.strip_prefix("@base/") {
                Some(rest) => base.join(rest),
                None => env_dir.join(path),
            };
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).expect("chmod");
        }
    }

    /// What the mount of `subdir` (`lib` or `facts.d`) must serve:
    /// `dir` / `file <sha256>` without modes, or with modes (`file <mode>
    /// <sha256>`, and no directories exist in facts.d) when `modes`.
    pub fn expected(subdir: &str, modes: bool) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (path, content, mode, served) in FILES {
            let path = path.strip_prefix("@base/").unwrap_or(path);
            let marker = format!("/{subdir}/");
            let Some(at) = path.find(&marker) else {
                continue;
            };
            if !served {
                continue;
            }
            let rel = &path[at + marker.len()..];
            let sha = sha256_hex(content.as_bytes());
            let value = if modes {
                format!("file {mode:o} {sha}")
            } else {
                format!("file {sha}")
            };
            out.insert(rel.to_owned(), value);
            let mut parent = Path::new(rel).parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                out.insert(p.to_string_lossy().into_owned(), "dir".to_owned());
                parent = p.parent();
            }
        }
        out
    }
}
