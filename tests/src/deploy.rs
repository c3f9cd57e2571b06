//! Deploys for the master's deploy tests (docs/deploys.md): [`ControlRepo`], a
//! local git control repository whose Puppetfile names modules in local git
//! repositories, deployed by the real `r10k`; [`scripted_redeploy`], a
//! deploy that deletes and re-creates every module directory with pauses;
//! [`AgentLoop`], the agent binary syncing in a loop meanwhile; and
//! [`removals`], the files a run reported removed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::agent::{AgentHome, AgentRun};
use crate::process::{Finished, run_logged};

/// Runs `git args` in `dir` with a fixed identity; panics on failure.
pub fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "pluginsync tests")
        .env("GIT_AUTHOR_EMAIL", "tests@example.org")
        .env("GIT_COMMITTER_NAME", "pluginsync tests")
        .env("GIT_COMMITTER_EMAIL", "tests@example.org")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A control repository and its module repositories, all local: modules
/// `names`, each with tags `v1` (files `f0.rb`..) and `v2` (`f0.rb`
/// changed, `v2_only.rb` added, the last file removed), and a bare mirror
/// of each (`<name>-mirror.git`): switching a module's remote makes r10k
/// delete its directory and clone it again.
pub struct ControlRepo {
    dir: tempfile::TempDir,
    envpath: PathBuf,
    modules: Vec<String>,
}

/// How long r10k's `git clone` and `git fetch` take in
/// [`ControlRepo::deploy`] before they start.
pub const FETCH_LATENCY: Duration = Duration::from_millis(600);

/// One module's line in the Puppetfile.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRef<'a> {
    /// The module.
    pub name: &'a str,
    /// `v1` or `v2`.
    pub tag: &'a str,
    /// From the mirror rather than the original repository.
    pub mirror: bool,
}

impl ControlRepo {
    /// Module repositories with `files` files each under
    /// `lib/facter/<name>/`, and a control repository whose `production`
    /// branch is deployed into `envpath`.
    pub fn new(envpath: &Path, names: &[&str], files: usize) -> ControlRepo {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in names {
            let repo = dir.path().join("src").join(name);
            let facter = repo.join("lib/facter").join(name);
            std::fs::create_dir_all(&facter).expect("mkdir");
            git(&repo, &["init", "-q", "-b", "main"]);
            for i in 0..files {
                std::fs::write(
                    facter.join(format!("f{i}.rb")),
                    format!("# {name} v1 file {i}\n"),
                )
                .expect("write");
            }
            git(&repo, &["add", "-A"]);
            git(&repo, &["commit", "-qm", "v1"]);
            git(&repo, &["tag", "v1"]);
            std::fs::write(facter.join("f0.rb"), format!("# {name} v2 file 0\n")).expect("write");
            std::fs::write(facter.join("v2_only.rb"), "# only in v2\n").expect("write");
            std::fs::remove_file(facter.join(format!("f{}.rb", files - 1))).expect("rm");
            git(&repo, &["add", "-A"]);
            git(&repo, &["commit", "-qm", "v2"]);
            git(&repo, &["tag", "v2"]);
            git(
                dir.path(),
                &[
                    "clone",
                    "-q",
                    "--mirror",
                    &repo.display().to_string(),
                    &format!("src/{name}-mirror.git"),
                ],
            );
        }
        let control = dir.path().join("control");
        std::fs::create_dir_all(&control).expect("mkdir");
        git(&control, &["init", "-q", "-b", "production"]);
        std::fs::write(control.join("environment.conf"), "# deployed by r10k\n").expect("write");
        git(&control, &["add", "-A"]);
        git(&control, &["commit", "-qm", "control repository"]);
        std::fs::create_dir_all(dir.path().join("cache")).expect("mkdir");
        ControlRepo {
            dir,
            envpath: envpath.to_owned(),
            modules: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The modules, in order.
    pub fn modules(&self) -> &[String] {
        &self.modules
    }

    /// Commits a Puppetfile naming `refs` to the `production` branch.
    pub fn set(&self, refs: &[ModuleRef<'_>]) {
        let src = self.dir.path().join("src");
        let lines: Vec<String> = refs
            .iter()
            .map(|r| {
                let repo = if r.mirror {
                    src.join(format!("{}-mirror.git", r.name))
                } else {
                    src.join(r.name)
                };
                format!(
                    "mod '{}', :git => 'file://{}', :ref => '{}'\n",
                    r.name,
                    repo.display(),
                    r.tag
                )
            })
            .collect();
        let control = self.dir.path().join("control");
        std::fs::write(control.join("Puppetfile"), lines.concat()).expect("write");
        git(&control, &["add", "-A"]);
        git(&control, &["commit", "-qm", "Puppetfile", "--allow-empty"]);
    }

    /// Writes `r10k.yaml` (cache, the control repository as the only
    /// source deployed into the environmentpath, `postrun` if given).
    pub fn r10k_yaml(&self, postrun: &[String]) -> PathBuf {
        let mut yaml = format!(
            "cachedir: '{}'\nsources:\n  main:\n    remote: 'file://{}'\n    basedir: '{}'\n",
            self.dir.path().join("cache").display(),
            self.dir.path().join("control").display(),
            self.envpath.display()
        );
        if !postrun.is_empty() {
            let quoted: Vec<String> = postrun.iter().map(|a| format!("'{a}'")).collect();
            yaml.push_str(&format!("postrun: [{}]\n", quoted.join(", ")));
        }
        let path = self.dir.path().join("r10k.yaml");
        std::fs::write(&path, yaml).expect("write r10k.yaml");
        path
    }

    /// `r10k deploy environment production --modules` with the config
    /// from [`ControlRepo::r10k_yaml`]; panics unless it succeeds.
    ///
    /// r10k's `git clone` and `git fetch` go through a wrapper that waits
    /// [`FETCH_LATENCY`] first, as a fetch from a real git server does: a
    /// module whose remote changed is deleted, then fetched, so the tree
    /// lacks it for that long (with local repositories and no latency the
    /// gap is too short for any watcher to see).
    pub fn deploy(&self, r10k: &Path, config: &Path) -> Finished {
        let real_git = crate::process::which("git").expect("git on PATH");
        let wrappers = self.dir.path().join("bin");
        std::fs::create_dir_all(&wrappers).expect("mkdir");
        let wrapper = wrappers.join("git");
        let script = format!(
            "#!/bin/sh\ncase \"$*\" in *clone*|*fetch*) sleep {:.1} ;; esac\nexec '{}' \"$@\"\n",
            FETCH_LATENCY.as_secs_f64(),
            real_git.display()
        );
        std::fs::write(&wrapper, script).expect("write git wrapper");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![wrappers];
        dirs.extend(std::env::split_paths(&path));
        let mut cmd = Command::new(r10k);
        cmd.args([
            "deploy",
            "environment",
            "production",
            "--modules",
            "--config",
        ])
        .arg(config)
        .env("PATH", std::env::join_paths(dirs).expect("PATH"))
        .env("HOME", self.dir.path());
        let done = run_logged(cmd, self.dir.path(), Duration::from_secs(300));
        assert_eq!(done.code, 0, "r10k failed:\n{}", done.output);
        done
    }
}

/// A deploy by hand, as slow deploy tools do it: every module directory of
/// `modules_dir` deleted and re-created (same content), one after the
/// other, with `pause` between modules.
pub fn scripted_redeploy(modules_dir: &Path, pause: Duration) {
    let mut modules: Vec<PathBuf> = std::fs::read_dir(modules_dir)
        .expect("read modules")
        .flatten()
        .map(|e| e.path())
        .collect();
    modules.sort();
    let stash = tempfile::tempdir().expect("tempdir");
    for (i, m) in modules.iter().enumerate() {
        let kept = stash.path().join(i.to_string());
        copy_tree(m, &kept);
        std::fs::remove_dir_all(m).expect("remove module");
        std::thread::sleep(pause / 2);
        copy_tree(&kept, m);
        std::thread::sleep(pause);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let md = std::fs::symlink_metadata(&src).expect("lstat");
        if md.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).expect("copy");
            std::fs::set_permissions(
                &dst,
                std::fs::Permissions::from_mode(md.permissions().mode()),
            )
            .expect("chmod");
        }
    }
}

/// The agent binary running `sync --format json` back to back on its own
/// thread until [`AgentLoop::stop`].
pub struct AgentLoop {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<AgentRun>>,
}

impl AgentLoop {
    /// Starts syncing `home` in a loop.
    pub fn start(home: Arc<AgentHome>) -> AgentLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut runs = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                runs.push(home.sync(&["--format", "json"]));
            }
            runs
        });
        AgentLoop { stop, thread }
    }

    /// Lets the current run finish and returns every run.
    pub fn stop(self) -> Vec<AgentRun> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("agent loop")
    }
}

/// The `<mount>/<relative path>` of every change a `--format json` run
/// reported as `removed` (a run that printed nothing reported nothing; one
/// that printed something else is a test failure).
pub fn removals(run: &AgentRun) -> Vec<String> {
    if run.stdout.trim().is_empty() {
        return Vec::new();
    }
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("the agent's report is not JSON ({e}): {run:?}"));
    report["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["action"] == "removed")
        .filter_map(|c| c["path"].as_str().map(str::to_owned))
        .collect()
}
