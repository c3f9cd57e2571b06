//! Real code trees
//! (docs/master.md#code-trees-as-r10k-and-code-manager-deploy-them):
//! `environment.conf` and a control repository as r10k deploys it, module roots
//! kept inside the code tree, and quiet logs when module directories go away.
//!
//! - The control-repository fixture (`pluginsync_tests::ControlRepo`) is
//!   served as the first-wins union over its effective modulepath
//!   (site-modules, modules, a glob, a missing entry, `$basemodulepath`),
//!   compared with the fixture's hand-written expectation; `check` prints
//!   the modulepath entry by entry; editing `environment.conf` re-indexes;
//!   a bad line is one warning naming the file and line, logged once.
//! - A module directory or `lib/` symlinked outside the code tree is not
//!   listed, its content is 404, the master warns and `check` reports it;
//!   with `index.allow_external_roots` matching its real path it is served.
//!   The environment itself is a symlink (`production -> releases/1`).
//! - Deleting module directories logs no `unable to remove watch
//!   descriptor` line at the default level; at `-vvv` (libraries at debug) it does, so
//!   the test can see one.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pluginsync_tests::{
    ControlRepo, EnvTree, MasterProcess, Pki, TestMaster, bin_path, client, config_toml,
    parse_config, wait_for,
};

use crate::common::{listing, pluginsync_query};

/// A listing in the fixture's notation: rel → `dir` / `file <sha256>`
/// (`file <mode> <sha256>` with `modes`), `"."` left out.
async fn served(
    c: &reqwest::Client,
    url: &str,
    mount: &str,
    modes: bool,
) -> BTreeMap<String, String> {
    let (status, _, entries) = listing(
        c,
        url,
        mount,
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    assert_eq!(status, 200, "{mount} listing");
    entries
        .into_iter()
        .filter(|e| e.relative_path.as_deref() != Some("."))
        .map(|e| {
            let rel = e.relative_path.clone().unwrap();
            let value = match e.checksum.as_ref().filter(|c| c.kind == "sha256") {
                Some(ck) => {
                    let sha = ck.value.trim_start_matches("{sha256}").to_owned();
                    if modes {
                        format!("file {:o} {sha}", e.mode)
                    } else {
                        format!("file {sha}")
                    }
                }
                None => "dir".to_owned(),
            };
            (rel, value)
        })
        .collect()
}

/// `pluginsync-master check --config <config>`: (exit code, stdout).
fn check(config: &Path) -> (i32, String) {
    let out = Command::new(bin_path("pluginsync-master"))
        .args(["check", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
        .expect("run check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_repo_is_served_over_its_effective_modulepath() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let env = tree.envpath().join("production");
    let base = tree.outside().join("base");
    ControlRepo::write(&env, &base);
    let toml = config_toml(
        &tree.envpath(),
        &pki,
        &format!("basemodulepath = [{base:?}]"),
        "",
    );
    let master = TestMaster::start(parse_config(&toml));
    let c = client(&pki, Some("node1"));
    let url = master.url();
    assert_eq!(
        served(&c, &url, "plugins", false).await,
        ControlRepo::expected("lib", false),
        "plugins is not the first-wins union over the effective modulepath"
    );
    assert_eq!(
        served(&c, &url, "pluginfacts", true).await,
        ControlRepo::expected("facts.d", true),
        "pluginfacts differs (content or modes)"
    );
    let body = c
        .get(format!(
            "{url}/puppet/v3/file_content/plugins/facter/shadow.rb?environment=production"
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        body, "# site-modules/stdlib wins\n",
        "content from the winner"
    );

    // `check` prints the effective modulepath, entry by entry.
    let config = tree.outside().join("master.toml");
    std::fs::write(&config, &toml).unwrap();
    let (code, out) = check(&config);
    assert_eq!(code, 0, "{out}");
    let e = env.display();
    for line in [
        format!("  environment.conf: {e}/environment.conf"),
        format!(
            "  modulepath: {e}/site-modules:{e}/modules:{e}/dist/a_set:{e}/dist/b_set:{}",
            base.display()
        ),
        format!("    {e}/site-modules: profile role stdlib"),
        format!("    {e}/modules: apt (shadowed by an earlier entry: stdlib)"),
        format!("    {e}/dist/a_set: widget"),
        format!("    {e}/dist/b_set: gadget"),
        format!("    {e}/missing: missing, skipped"),
        format!(
            "    {}: basemod (shadowed by an earlier entry: apt)",
            base.display()
        ),
        "OK".to_owned(),
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "check does not print {line:?}:\n{out}"
        );
    }

    // Editing environment.conf re-indexes the environment: without
    // site-modules, modules/stdlib serves shadow.rb; a bad line is one
    // warning naming the file and the line.
    std::fs::write(
        env.join("environment.conf"),
        "modulepath = modules:$basemodulepath\nmodulepth = typo\n",
    )
    .unwrap();
    let reindexed = wait_for(Duration::from_secs(10), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let body = c
                .get(format!(
                    "{url}/puppet/v3/file_content/plugins/facter/shadow.rb?environment=production"
                ))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (body == "# modules/stdlib is shadowed\n").then_some(())
        }
    })
    .await;
    assert!(
        reindexed.is_some(),
        "editing environment.conf did not re-index"
    );
    let listed = served(&c, &url, "plugins", false).await;
    assert!(listed.contains_key("facter/stdlib_only.rb"), "{listed:?}");
    assert!(!listed.contains_key("facter/site_role.rb"), "{listed:?}");
    let (code, out) = check(&config);
    assert_eq!(code, 0, "{out}");
    let warning =
        format!("  warning: {e}/environment.conf:2: unknown setting 'modulepth', ignored");
    assert!(out.lines().any(|l| l == warning), "{warning:?} in:\n{out}");
    assert!(out.ends_with("OK, with 1 warnings\n"), "{out}");

    // The serving master logs it once for its one build, not per request
    // (its whole log, read after it is killed).
    drop(master);
    let (mut child, log, reader) = spawn_logging(&config, &[]);
    let url = listening(&log).await;
    let c2 = client(&pki, Some("node1"));
    for _ in 0..3 {
        served(&c2, &url, "plugins", false).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("log reader");
    let log = log.lock().unwrap().clone();
    let logged = log
        .lines()
        .filter(|l| l.contains("environment.conf:2: unknown setting 'modulepth'"))
        .count();
    assert_eq!(logged, 1, "{log}");
}

/// Waits (at most 60 s) for a master's "listening on" line; its URL.
async fn listening(log: &Arc<Mutex<String>>) -> String {
    let port = wait_for(Duration::from_secs(60), || {
        let log = log.clone();
        async move {
            let l = log.lock().unwrap();
            l.split("listening on ")
                .nth(1)
                .and_then(|s| s.lines().next())
                .and_then(|a| a.trim().rsplit(':').next()?.parse::<u16>().ok())
        }
    })
    .await;
    let port = port.unwrap_or_else(|| panic!("master did not start:\n{}", log.lock().unwrap()));
    format!("https://localhost:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_roots_outside_the_code_tree_are_not_served_unless_allowed() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    // Code Manager's layout: the environment is a symlink to a release.
    let release = tree.outside().join("releases/1");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(&release, tree.envpath().join("production")).unwrap();
    tree.file("production", "good", "lib/facter/ok.rb", "# ok\n", 0o644);
    // A module directory and a lib/ that point outside the code tree.
    let secret = tree.outside().join("secret");
    std::fs::create_dir_all(secret.join("keys/lib/facter")).unwrap();
    std::fs::write(secret.join("keys/lib/facter/key.rb"), "PRIVATE KEY\n").unwrap();
    std::fs::create_dir_all(secret.join("private_keys")).unwrap();
    std::fs::write(secret.join("private_keys/localhost.pem"), "PRIVATE KEY\n").unwrap();
    std::fs::create_dir_all(tree.envpath().join("production/modules")).unwrap();
    std::os::unix::fs::symlink(secret.join("keys"), tree.module("production", "keys")).unwrap();
    tree.file("production", "apt", "facts.d/apt.txt", "apt=1\n", 0o644);
    tree.symlink("production", "apt", "lib", secret.join("private_keys"));

    let real_secret = secret.canonicalize().unwrap();
    for allow in [None, Some(format!("{}/*", real_secret.display()))] {
        let tables = allow
            .as_ref()
            .map(|a| format!("[index]\nallow_external_roots = [{a:?}]\n"))
            .unwrap_or_default();
        let toml = config_toml(&tree.envpath(), &pki, "", &tables);
        let master = TestMaster::start(parse_config(&toml));
        let c = client(&pki, Some("node1"));
        let url = master.url();
        let listed = served(&c, &url, "plugins", false).await;
        let facts = served(&c, &url, "pluginfacts", false).await;
        assert!(listed.contains_key("facter/ok.rb"), "{listed:?}");
        assert!(facts.contains_key("apt.txt"), "{facts:?}");
        let mut statuses = Vec::new();
        for rel in ["facter/key.rb", "localhost.pem"] {
            let resp = c
                .get(format!(
                    "{url}/puppet/v3/file_content/plugins/{rel}?environment=production"
                ))
                .send()
                .await
                .unwrap();
            statuses.push(resp.status().as_u16());
            let body = resp.text().await.unwrap();
            if allow.is_none() {
                assert!(!body.contains("PRIVATE KEY"), "{rel} leaked");
            }
        }
        let config = tree.outside().join("master.toml");
        std::fs::write(&config, &toml).unwrap();
        let (code, out) = check(&config);
        assert_eq!(code, 0, "{out}");
        match allow {
            None => {
                assert!(!listed.contains_key("facter/key.rb"), "{listed:?}");
                assert!(!listed.contains_key("localhost.pem"), "{listed:?}");
                assert_eq!(statuses, vec![404, 404]);
                for expected in [
                    format!(
                        "  warning: module keys: {} is really {}, outside the code tree",
                        tree.module("production", "keys").display(),
                        real_secret.join("keys").display()
                    ),
                    format!(
                        "  warning: module apt: {} is really {}, outside the code tree",
                        tree.module("production", "apt").join("lib").display(),
                        real_secret.join("private_keys").display()
                    ),
                ] {
                    assert!(
                        out.lines().any(|l| l.starts_with(&expected)),
                        "check does not report {expected:?}:\n{out}"
                    );
                }
                assert!(out.ends_with("OK, with 2 warnings\n"), "{out}");
            }
            Some(_) => {
                assert!(listed.contains_key("facter/key.rb"), "{listed:?}");
                assert!(listed.contains_key("localhost.pem"), "{listed:?}");
                assert_eq!(statuses, vec![200, 200]);
                assert!(out.ends_with("\nOK\n"), "{out}");
            }
        }
    }
}

/// Starts the master binary with `args` and no `RUST_LOG`; keeps its whole
/// stderr in the returned buffer.
fn spawn_logging(
    config: &Path,
    args: &[&str],
) -> (
    std::process::Child,
    Arc<Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let mut cmd = MasterProcess::command(config);
    cmd.env_remove("RUST_LOG").args(args);
    let mut child = cmd.spawn().expect("spawn master");
    let stderr = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    (child, log, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_module_directories_logs_no_watch_descriptor_lines_by_default() {
    let pki = Pki::new();
    let mut seen = Vec::new();
    for args in [&[][..], &["-vvv"][..]] {
        let tree = EnvTree::new();
        tree.generate("production", 8, 30, 3);
        let config = tree.outside().join("master.toml");
        std::fs::write(&config, config_toml(&tree.envpath(), &pki, "", "")).unwrap();
        let (mut child, log, reader) = spawn_logging(&config, args);
        let url = listening(&log).await;
        for m in 0..8 {
            std::fs::remove_dir_all(tree.module("production", &format!("mod{m:02}"))).unwrap();
        }
        let c = client(&pki, Some("node1"));
        let gone = wait_for(Duration::from_secs(10), || {
            let (c, url) = (c.clone(), url.clone());
            async move {
                let (_, _, entries) = listing(
                    &c,
                    &url,
                    "plugins",
                    &pluginsync_query("use", "follow", "production"),
                )
                .await;
                (entries.len() == 1).then_some(())
            }
        })
        .await;
        assert!(gone.is_some(), "the deletion was not indexed");
        let _ = child.kill();
        let _ = child.wait();
        reader.join().expect("log reader");
        let log = log.lock().unwrap().clone();
        seen.push(log.matches("unable to remove watch descriptor").count());
    }
    eprintln!(
        "'unable to remove watch descriptor' lines after deleting 8 modules: default {}, -vvv {}",
        seen[0], seen[1]
    );
    assert_eq!(seen[0], 0, "watch-descriptor lines at the default level");
    assert!(
        seen[1] > 0,
        "-vvv shows none, so the check above proves nothing"
    );
}
