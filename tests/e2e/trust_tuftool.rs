//! The operator's workflow of docs/trust.md#quick-start with the real
//! `tuftool`, through the scripts the docs name: `scripts/trust-quickstart.sh`
//! (a root with threshold 2 of 3 root keys, targets, snapshot and timestamp
//! keys, signed by two root keys, the repository made by `tuftool create`),
//! the real r10k deploying `production`, `scripts/sign-generation.sh`
//! signing it into two masters' `[trust] metadata`; agents with
//! `[trust] root` verifying through each master take a deploy that was
//! signed and refuse one that was not (exit 65, nothing changed); then
//! the targets key is rotated as docs/trust.md#rotation says: the old key
//! signs nothing more, the nodes follow root 2 and take what the new key
//! signed. `SKIPPED` without `tuftool` or `r10k` (a failure under CI,
//! which installs both).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pluginsync_common::generation::{Assignment, assignment_url};
use pluginsync_tests::{
    AgentHome, AgentRun, EnvTree, Finished, ModuleRef, Pki, R10kControlRepo, TestMaster, bin_path,
    client, config_toml, parse_config, repo_root, require, run_logged, skipped, tree_snapshot,
    wait_for, which,
};

const TEST: &str = "tuftool_signs_what_r10k_deployed_and_agents_take_only_that";

/// What `[trust]` refusals exit with (`agent/src/exit.rs`).
const UNTRUSTED: i32 = 65;

/// `tuftool` on PATH, or `None` after a visible `SKIPPED` line; under CI
/// (`CI` set) a missing one is a failure: `.ci/run` installs it.
fn tuftool() -> Option<PathBuf> {
    let found = which("tuftool");
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "tuftool is not installed but CI is set: .ci/run must `cargo install --locked tuftool`"
        );
        skipped(
            TEST,
            "`tuftool` not installed (cargo install --locked tuftool)",
        );
    }
    found
}

/// Runs `scripts/<name> args` as an operator would, with the workspace's
/// `pluginsync-master`; panics unless it exits 0.
fn script(name: &str, args: &[&str], dir: &Path) -> Finished {
    let mut cmd = Command::new(repo_root().join("scripts").join(name));
    cmd.args(args)
        .env("PLUGINSYNC_MASTER", bin_path("pluginsync-master"));
    let done = run_logged(cmd, dir, Duration::from_secs(300));
    assert_eq!(done.code, 0, "{name} {args:?}:\n{}", done.output);
    done
}

/// The pipeline's keys and directories, as the quick start lays them out
/// (`scripts/trust-quickstart.sh DIR`): `DIR/keys/*.pem`, `DIR/repo`.
struct Pipeline {
    tuf: PathBuf,
    config: PathBuf,
    served: PathBuf,
    targets_key: PathBuf,
}

impl Pipeline {
    /// `sign-generation.sh` with the pipeline's keys, publishing to the
    /// masters' directory, then `last` (`production`, `--refresh`,
    /// `--rebuild`); exit status 0 unless `fails`.
    fn run(&self, last: &str, fails: bool) -> Finished {
        let key = |k: &str| self.tuf.join("keys").join(format!("{k}.pem"));
        let mut cmd = Command::new(repo_root().join("scripts/sign-generation.sh"));
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--repo")
            .arg(self.tuf.join("repo"))
            .arg("--targets-key")
            .arg(&self.targets_key)
            .arg("--snapshot-key")
            .arg(key("snapshot"))
            .arg("--timestamp-key")
            .arg(key("timestamp"))
            .arg("--publish")
            .arg(&self.served)
            .arg(last)
            .env("PLUGINSYNC_MASTER", bin_path("pluginsync-master"));
        let done = run_logged(cmd, &self.tuf, Duration::from_secs(300));
        assert_eq!(
            done.code != 0,
            fails,
            "sign-generation.sh {last}:\n{}",
            done.output
        );
        done
    }

    /// Signs `production` as deployed now; the generation id signed.
    fn sign(&self) -> String {
        let done = self.run("production", false);
        let line = done
            .output
            .lines()
            .find_map(|l| l.strip_prefix("signed production generation "))
            .unwrap_or_else(|| panic!("no 'signed' line:\n{}", done.output));
        line.split_whitespace().next().expect("an id").to_owned()
    }

    /// docs/trust.md#rotation for the targets key: root 2 lists a new
    /// key instead, signed by two root keys, and `--rebuild` signs the
    /// kept manifests with it. The old key, kept aside.
    fn rotate_targets_key(&mut self) -> PathBuf {
        let meta = self.tuf.join("repo/metadata");
        let root = self.tuf.join("root-2.json");
        std::fs::copy(meta.join("1.root.json"), &root).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&root).unwrap()).unwrap();
        let old_id = json["signed"]["roles"]["targets"]["keyids"][0]
            .as_str()
            .expect("a targets key")
            .to_owned();
        let new_key = self.tuf.join("keys/targets-2.pem");
        let (r, k) = (root.to_str().unwrap(), new_key.to_str().unwrap());
        let root1 = self.tuf.join("keys/root1.pem");
        let root3 = self.tuf.join("keys/root3.pem");
        let steps: [&[&str]; 6] = [
            &["root", "bump-version", r],
            &["root", "expire", r, "in 52 weeks"],
            &["root", "remove-key", r, &old_id],
            &["root", "gen-rsa-key", r, k, "--role", "targets"],
            &[
                "root",
                "sign",
                r,
                "-k",
                root1.to_str().unwrap(),
                "--ignore-threshold",
            ],
            &["root", "sign", r, "-k", root3.to_str().unwrap()],
        ];
        for args in steps {
            let mut cmd = Command::new("tuftool");
            cmd.args(args);
            let done = run_logged(cmd, &self.tuf, Duration::from_secs(120));
            assert_eq!(done.code, 0, "tuftool {args:?}:\n{}", done.output);
        }
        std::fs::copy(&root, meta.join("2.root.json")).unwrap();
        let old = std::mem::replace(&mut self.targets_key, new_key);
        self.run("--rebuild", false);
        old
    }
}

/// Waits until `m` serves a generation of `production` that `ok` accepts;
/// returns its id.
async fn served_by(m: &TestMaster, pki: &Pki, ok: impl Fn(&str) -> bool) -> String {
    let (c, url) = (
        client(pki, Some("node1")),
        assignment_url(&m.url(), "production"),
    );
    let ok = &ok;
    wait_for(Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            let a: Assignment = serde_json::from_slice(&r.bytes().await.ok()?).ok()?;
            let id = a.generation.to_hex();
            ok(&id).then_some(id)
        }
    })
    .await
    .expect("the master serves the deploy")
}

/// Every module of `repo` at `tag`, but `beta` at `beta_tag`.
fn refs<'a>(repo: &'a R10kControlRepo, tag: &'a str, beta_tag: &'a str) -> Vec<ModuleRef<'a>> {
    repo.modules()
        .iter()
        .map(|name| ModuleRef {
            name,
            tag: if name == "beta" { beta_tag } else { tag },
            mirror: false,
        })
        .collect()
}

/// `f0.rb` of `module` on the node.
fn module_f0(home: &AgentHome, module: &str) -> String {
    let snap = tree_snapshot(&home.libdir());
    let name = format!("{module}/f0.rb");
    let rel = snap
        .keys()
        .find(|k| k.ends_with(&name))
        .unwrap_or_else(|| panic!("no {name} on the node: {snap:?}"));
    std::fs::read_to_string(home.libdir().join(rel)).expect("read f0.rb")
}

/// A run refused by `[trust]`: exit 65, one line naming the unsigned
/// generation and saying nothing changed.
fn assert_unsigned(run: &AgentRun, id: &str) {
    assert_eq!(run.code, UNTRUSTED, "{run:?}");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("nothing was changed"))
        .collect();
    assert_eq!(lines.len(), 1, "{run:?}");
    assert!(
        lines[0].contains(&format!("generation {id} of 'production' is not signed")),
        "{run:?}"
    );
}

/// docs/trust.md#quick-start end to end: see the module docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuftool_signs_what_r10k_deployed_and_agents_take_only_that() {
    let Some(_tuftool) = tuftool() else {
        return;
    };
    let Some(r10k) = require("r10k", "r10k", TEST) else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let tuf = dir.path().join("tuf");
    script("trust-quickstart.sh", &[tuf.to_str().unwrap()], dir.path());
    let root = tuf.join("root.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&root).unwrap()).unwrap();
    let roles = &json["signed"]["roles"];
    assert_eq!(roles["root"]["threshold"], 2, "{json}");
    assert_eq!(roles["root"]["keyids"].as_array().unwrap().len(), 3);
    assert_eq!(json["signatures"].as_array().unwrap().len(), 2, "{json}");

    // r10k deploys production; the pipeline signs it into the directory
    // both masters serve.
    let repo = R10kControlRepo::new(&tree.envpath(), &["alpha", "beta"], 4);
    let r10k_yaml = repo.r10k_yaml(&[]);
    repo.set(&refs(&repo, "v1", "v1"));
    repo.deploy(&r10k, &r10k_yaml);
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let trust = format!("[trust]\nmetadata = {served:?}\n");
    let text = config_toml(&tree.envpath(), &pki, "", &trust);
    let mut pipeline = Pipeline {
        config: dir.path().join("master.toml"),
        targets_key: tuf.join("keys/targets.pem"),
        tuf,
        served,
    };
    std::fs::write(&pipeline.config, &text).unwrap();
    let v1 = pipeline.sign();
    let masters = [text.as_str(), text.as_str()].map(|t| TestMaster::start(parse_config(t)));
    let trust = format!("[trust]\nroot = {root:?}\n");
    let homes = masters
        .each_ref()
        .map(|m| AgentHome::new(&pki, &[m.url()], &trust));
    for (m, home) in masters.iter().zip(&homes) {
        assert_eq!(served_by(m, &pki, |id| id == v1).await, v1);
        assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
        assert!(module_f0(home, "alpha").contains("alpha v1"));
    }
    // The timer's re-signing: new metadata, the same targets, a no-op.
    pipeline.run("--refresh", false);
    for home in &homes {
        let run = home.sync(&["--detailed-exitcodes"]);
        assert_eq!(run.code, 0, "{run:?}");
    }

    // A deploy the pipeline signed: both nodes take it.
    repo.set(&refs(&repo, "v2", "v2"));
    repo.deploy(&r10k, &r10k_yaml);
    let v2 = pipeline.sign();
    for (m, home) in masters.iter().zip(&homes) {
        assert_eq!(served_by(m, &pki, |id| id == v2).await, v2);
        assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
        assert!(module_f0(home, "alpha").contains("alpha v2"));
    }

    // A deploy nobody signed (the signing step skipped): the masters
    // serve it, both nodes refuse it and keep v2.
    repo.set(&refs(&repo, "v2", "v1"));
    repo.deploy(&r10k, &r10k_yaml);
    let mut unsigned = String::new();
    for (m, home) in masters.iter().zip(&homes) {
        unsigned = served_by(m, &pki, |id| id != v1 && id != v2).await;
        let before = tree_snapshot(&home.libdir());
        assert_unsigned(&home.sync(&[]), &unsigned);
        assert_eq!(tree_snapshot(&home.libdir()), before);
    }

    // The targets key rotated (docs/trust.md#rotation): the old key can
    // no longer sign (one line, nothing published); the new one signs
    // the deploy, and the nodes follow root 2 and take it.
    let old = pipeline.rotate_targets_key();
    let new = std::mem::replace(&mut pipeline.targets_key, old);
    let before = tree_snapshot(&pipeline.served);
    let refused = pipeline.run("production", true);
    assert_eq!(refused.output.lines().count(), 1, "{}", refused.output);
    assert_eq!(tree_snapshot(&pipeline.served), before);
    pipeline.targets_key = new;
    assert_eq!(pipeline.sign(), unsigned);
    for home in &homes {
        assert_eq!(home.sync(&["--detailed-exitcodes"]).code, 2);
        assert!(module_f0(home, "beta").contains("beta v1"));
        let kept = std::fs::read(home.vardir().join("trust/root.json")).unwrap();
        let kept: serde_json::Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(
            kept["signed"]["version"], 2,
            "the node follows the root chain"
        );
    }
}
