//! Deploys (docs/deploys.md): a flipped
//! environment link is watched at its new target; redeploys by the real
//! `r10k` and by a slow script never make an agent remove a file that
//! exists before and after the deploy; `index.publish = "explicit"` serves
//! an edit only after the admin call (allowed certnames only), `reindex`
//! or r10k's `postrun`.
//!
//! Nothing here asserts on timing: every wait is bounded and ends as soon
//! as the master serves what the disk holds; the periodic rescan is off, so
//! only the watcher (or the explicit call) can make it serve anything new.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pluginsync_tests::{
    AgentHome, AgentLoop, ChildMaster, EnvTree, ModuleRef, Pki, R10kControlRepo, TestMaster,
    bin_path, client, config_toml, merged_mount, parse_config, removals, require,
    scripted_redeploy, sha256_hex, tree_snapshot, wait_for,
};

use crate::common::listing;

const Q: &str = "recurse=true&links=follow&checksum_type=sha256&environment=production";

/// Long enough for any bounded wait here on a loaded machine; a wait ends
/// as soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(60);

/// What the master serves in `production`'s plugins: relative path →
/// sha256 hex of every file.
async fn served(c: &reqwest::Client, url: &str) -> BTreeMap<String, String> {
    let (status, _, entries) = listing(c, url, "plugins", Q).await;
    assert_eq!(status, 200);
    files(entries)
}

/// A listing's files: relative path → sha256 hex.
fn files(entries: Vec<pluginsync_common::metadata::FileMetadata>) -> BTreeMap<String, String> {
    entries
        .into_iter()
        .filter(|e| e.kind == pluginsync_common::metadata::FileType::File)
        .filter_map(|e| {
            let sum = e.checksum?.value;
            Some((
                e.relative_path?,
                sum.trim_start_matches("{sha256}").to_owned(),
            ))
        })
        .collect()
}

/// What the disk holds for the same listing (the test's own walk).
fn on_disk(env_dir: &Path) -> BTreeMap<String, String> {
    merged_mount(env_dir, "lib")
        .into_iter()
        .filter_map(|(rel, what)| {
            let sha = what.strip_prefix("file ")?.rsplit(' ').next()?.to_owned();
            Some((rel, sha))
        })
        .collect()
}

/// Waits (bounded) until the master serves what `env_dir` holds.
async fn wait_served(c: &reqwest::Client, url: &str, env_dir: &Path) {
    let want = on_disk(env_dir);
    let got = wait_for(PATIENCE, || {
        let (c, url, want) = (c.clone(), url.to_owned(), want.clone());
        async move { (served(&c, &url).await == want).then_some(()) }
    })
    .await;
    assert!(
        got.is_some(),
        "the master never served the tree on disk:\nserved {:?}\ndisk {want:?}",
        served(c, url).await
    );
}

fn master(tree_envpath: &Path, pki: &Pki, index: &str, tables: &str) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(
        tree_envpath,
        pki,
        "",
        &format!("[index]\nrescan_interval = \"0s\"\n{index}\n{tables}"),
    )))
}

/// After `production -> releases/1` is flipped to
/// `releases/2`, an edit inside `releases/2` is served, and the old
/// target's watches are gone (writes there reach the watcher no more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_environment_link_is_watched_at_its_new_target() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let releases = tree.outside().join("releases");
    let fact = |n: &str| releases.join(n).join("modules/app/lib/facter/app.rb");
    for n in ["1", "2"] {
        std::fs::create_dir_all(fact(n).parent().unwrap()).unwrap();
        std::fs::write(fact(n), format!("# release {n}\n")).unwrap();
    }
    let link = tree.envpath().join("production");
    std::os::unix::fs::symlink(releases.join("1"), &link).unwrap();
    let m = master(&tree.envpath(), &pki, "", "");
    let (c, url) = (client(&pki, Some("node1")), m.url());
    wait_served(&c, &url, &link).await;

    // The flip, atomically, as Code Manager does it.
    let tmp = tree.envpath().join(".production.new");
    std::os::unix::fs::symlink(releases.join("2"), &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    wait_served(&c, &url, &link).await;

    // An edit inside the new target is served.
    std::fs::write(fact("2"), "# release 2, edited in place\n").unwrap();
    wait_served(&c, &url, &link).await;
    assert_eq!(
        served(&c, &url).await["facter/app.rb"],
        sha256_hex(b"# release 2, edited in place\n")
    );
    assert_eq!(m.store.stats.watched_environments.load(Ordering::SeqCst), 1);

    // The old target is not watched: 50 new files there make no event
    // (each would make several); the sentinel edit after them makes a few,
    // and once it is served every earlier event has been counted.
    let events = &m.store.stats.watch_events;
    let before = events.load(Ordering::SeqCst);
    let old = releases.join("1/modules/app/lib/facter");
    for i in 0..50 {
        std::fs::write(old.join(format!("stray{i}.rb")), "# not served\n").unwrap();
    }
    std::fs::write(fact("2"), "# sentinel\n").unwrap();
    wait_served(&c, &url, &link).await;
    let seen = events.load(Ordering::SeqCst) - before;
    assert!(
        seen < 50,
        "{seen} watch events for 50 files in the old target and one edit in the new"
    );
}

/// A deploy that replaces the environment's directory by another under
/// the same path (`mv production old; mv new production`): an edit inside
/// the new directory is served, within the test's patience, not only at
/// the next rescan (off here): its watches are the new directory's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_directory_replaced_under_its_name_is_watched_anew() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let env = tree.envpath().join("production");
    let fact = |root: &Path| root.join("modules/app/lib/facter/app.rb");
    let write = |root: &Path, text: &str| {
        std::fs::create_dir_all(fact(root).parent().unwrap()).unwrap();
        std::fs::write(fact(root), text).unwrap();
    };
    write(&env, "# first\n");
    let m = master(&tree.envpath(), &pki, "", "");
    let (c, url) = (client(&pki, Some("node1")), m.url());
    wait_served(&c, &url, &env).await;

    let (new, old) = (tree.outside().join("new"), tree.outside().join("old"));
    write(&new, "# second\n");
    std::fs::rename(&env, &old).unwrap();
    std::fs::rename(&new, &env).unwrap();
    std::fs::remove_dir_all(&old).unwrap();
    wait_served(&c, &url, &env).await;

    std::fs::write(fact(&env), "# second, edited in place\n").unwrap();
    wait_served(&c, &url, &env).await;
    assert_eq!(
        served(&c, &url).await["facter/app.rb"],
        sha256_hex(b"# second, edited in place\n")
    );
    assert_eq!(m.store.stats.watched_environments.load(Ordering::SeqCst), 1);
}

/// A master for the redeploy tests: watch mode at the default `settle`.
fn agent(pki: &Pki, m: &TestMaster) -> Arc<AgentHome> {
    Arc::new(AgentHome::new(pki, &[m.url()], ""))
}

/// The real r10k redeploys `production` in place (a
/// version bumped, then back; a module's remote switched, so r10k deletes
/// and re-clones it) while an agent syncs back to back: no run removes a
/// file that exists before and after a deploy, and the final tree equals
/// the mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r10k_redeploys_never_make_an_agent_remove_a_file_that_stays() {
    const TEST: &str = "r10k_redeploys_never_make_an_agent_remove_a_file_that_stays";
    let Some(r10k) = require("r10k", "r10k", TEST) else {
        return;
    };
    require("git", "git", TEST).expect("git");
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let repo = R10kControlRepo::new(&tree.envpath(), &["alpha", "beta", "gamma", "delta"], 12);
    let refs = |tag: &'static str, mirror: bool| -> Vec<ModuleRef<'_>> {
        repo.modules()
            .iter()
            .map(|name| ModuleRef {
                name,
                tag,
                mirror: mirror && name == "beta",
            })
            .collect()
    };
    let config = repo.r10k_yaml(&[]);
    repo.set(&refs("v1", false));
    repo.deploy(&r10k, &config);
    let env = tree.envpath().join("production");
    let m = master(&tree.envpath(), &pki, "", "");
    let (c, url) = (client(&pki, Some("node1")), m.url());
    let home = agent(&pki, &m);
    assert_eq!(home.sync(&[]).code, 0);

    let mut legit = 0;
    for (tag, mirror) in [("v2", true), ("v1", false), ("v2", false), ("v1", true)] {
        let before = on_disk(&env);
        repo.set(&refs(tag, mirror));
        let runs = AgentLoop::start(home.clone());
        repo.deploy(&r10k, &config);
        let after = on_disk(&env);
        wait_served(&c, &url, &env).await;
        let runs = runs.stop();
        for run in &runs {
            for removed in removals(run) {
                let rel = removed.strip_prefix("plugins/").unwrap_or(&removed);
                // A removed directory takes every file below it.
                let below = format!("{rel}/");
                let stays = before
                    .keys()
                    .filter(|k| *k == rel || k.starts_with(&below))
                    .find(|k| after.contains_key(*k));
                assert!(
                    stays.is_none(),
                    "deploy to {tag}: a run removed {removed}, which holds {stays:?}, a file that exists before and after:\n{run:?}"
                );
                legit += 1;
            }
        }
    }
    // The v2 → v1 deploys remove v2_only.rb for real: the report parser
    // sees removals, so the check above can fail.
    assert!(legit > 0, "no run reported any removal");
    assert!(m.store.stats.deploys_held.load(Ordering::SeqCst) >= 1);
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env, "lib"));
}

/// A slower deploy by script, every module directory
/// deleted and re-created with pauses (shorter than `settle`) between
/// modules; an agent syncing back to back meanwhile removes nothing, and
/// the watcher held the environment back at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_redeploy_with_pauses_makes_no_agent_remove_anything() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 6, 15, 11);
    let env = tree.envpath().join("production");
    let m = master(&tree.envpath(), &pki, "", "");
    let (c, url) = (client(&pki, Some("node1")), m.url());
    let home = agent(&pki, &m);
    assert_eq!(home.sync(&[]).code, 0);
    let runs = AgentLoop::start(home.clone());
    let modules = env.join("modules");
    tokio::task::spawn_blocking(move || scripted_redeploy(&modules, Duration::from_secs(1)))
        .await
        .unwrap();
    wait_served(&c, &url, &env).await;
    let runs = runs.stop();
    assert!(runs.len() > 1, "the agent ran {} times", runs.len());
    for run in &runs {
        assert_eq!(removals(run), Vec::<String>::new(), "{run:?}");
    }
    assert!(m.store.stats.deploys_held.load(Ordering::SeqCst) >= 1);
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env, "lib"));
}

/// With `index.publish = "explicit"` an edit is not
/// served (a watching master on the same tree serves it) until the admin
/// call of an allowed certname; another certname gets 403 and changes
/// nothing; `pluginsync-master reindex` publishes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_publish_waits_for_the_admin_call() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let file = tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let env = tree.envpath().join("production");
    let text = config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\npublish = \"explicit\"\n[admin]\ncertnames = [\"node2\"]\n",
    );
    let explicit = TestMaster::start(parse_config(&text));
    let watching = master(&tree.envpath(), &pki, "", "");
    let c = client(&pki, Some("node1"));
    let (eurl, wurl) = (explicit.url(), watching.url());
    let builds = explicit.store.stats.index_builds.load(Ordering::SeqCst);

    std::fs::write(&file, "# two\n").unwrap();
    wait_served(&c, &wurl, &env).await;
    assert_eq!(
        served(&c, &eurl).await["facter/app.rb"],
        sha256_hex(b"# one\n")
    );

    let admin = |certname: &str, query: &str| {
        let url = format!("{eurl}/puppet-admin-api/v1/environment-cache{query}");
        let c = client(&pki, Some(certname));
        async move { c.delete(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(admin("node1", "?environment=production").await, 403);
    assert_eq!(
        served(&c, &eurl).await["facter/app.rb"],
        sha256_hex(b"# one\n")
    );
    assert_eq!(
        explicit.store.stats.index_builds.load(Ordering::SeqCst),
        builds,
        "nothing but the admin call may re-index"
    );
    assert_eq!(admin("node2", "?environment=no-such!").await, 400);
    // 204 once the new index is served: no wait needed after it.
    assert_eq!(admin("node2", "?environment=production").await, 204);
    assert_eq!(
        served(&c, &eurl).await["facter/app.rb"],
        sha256_hex(b"# two\n")
    );

    // `reindex` as r10k's postrun would run it: the master's own
    // certificate, every environment.
    std::fs::write(&file, "# three\n").unwrap();
    let cfg = tree.outside().join("master.toml");
    std::fs::write(&cfg, &text).unwrap();
    let out = std::process::Command::new(bin_path("pluginsync-master"))
        .args(["reindex", "--config"])
        .arg(&cfg)
        .args(["--server", &eurl])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "re-indexed every environment\n"
    );
    assert_eq!(
        served(&c, &eurl).await["facter/app.rb"],
        sha256_hex(b"# three\n")
    );
}

/// An explicit master behind r10k with `postrun` set to
/// `pluginsync-master reindex production`: the deploy is served when r10k
/// returns, and not before it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r10k_postrun_publishes_an_explicit_master() {
    const TEST: &str = "r10k_postrun_publishes_an_explicit_master";
    let Some(r10k) = require("r10k", "r10k", TEST) else {
        return;
    };
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let repo = R10kControlRepo::new(&tree.envpath(), &["alpha", "beta"], 4);
    let refs = |tag: &'static str| -> Vec<ModuleRef<'_>> {
        repo.modules()
            .iter()
            .map(|name| ModuleRef {
                name,
                tag,
                mirror: false,
            })
            .collect()
    };
    repo.set(&refs("v1"));
    repo.deploy(&r10k, &repo.r10k_yaml(&[]));
    let env = tree.envpath().join("production");
    let text = config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\npublish = \"explicit\"\n",
    );
    let m = TestMaster::start(parse_config(&text));
    let (c, url) = (client(&pki, Some("node1")), m.url());
    let v1 = on_disk(&env);
    assert_eq!(served(&c, &url).await, v1);

    // Without the hook the deploy is not served.
    repo.set(&refs("v2"));
    repo.deploy(&r10k, &repo.r10k_yaml(&[]));
    assert_ne!(on_disk(&env), v1);
    assert_eq!(served(&c, &url).await, v1);

    // With it, it is, as soon as r10k returns.
    let cfg = tree.outside().join("master.toml");
    std::fs::write(&cfg, &text).unwrap();
    let postrun: Vec<String> = [
        bin_path("pluginsync-master").display().to_string(),
        "reindex".into(),
        "--config".into(),
        cfg.display().to_string(),
        "--server".into(),
        url.clone(),
        "production".into(),
    ]
    .into();
    repo.set(&refs("v1"));
    let out = repo.deploy(&r10k, &repo.r10k_yaml(&postrun));
    assert_eq!(served(&c, &url).await, on_disk(&env), "{}", out.output);
    assert_eq!(served(&c, &url).await, v1);
}

/// Under `index.publish = "explicit"`, SIGHUP re-indexes
/// every environment of the master binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_publishes_an_explicit_master() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let file = tree.file("production", "app", "lib/facter/app.rb", "# one\n", 0o644);
    let cfg = tree.outside().join("master.toml");
    std::fs::write(
        &cfg,
        config_toml(
            &tree.envpath(),
            &pki,
            "",
            "[index]\npublish = \"explicit\"\n",
        ),
    )
    .unwrap();
    let m = ChildMaster::spawn(&cfg, None);
    let (c, url) = (client(&pki, Some("node1")), m.url());
    assert_eq!(
        served(&c, &url).await["facter/app.rb"],
        sha256_hex(b"# one\n")
    );
    std::fs::write(&file, "# two\n").unwrap();
    m.sighup();
    let two = sha256_hex(b"# two\n");
    let seen = wait_for(PATIENCE, || {
        let (c, url, two) = (c.clone(), url.clone(), two.clone());
        async move { (served(&c, &url).await["facter/app.rb"] == two).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "SIGHUP did not publish the edit");
}

/// Many environments during a deploy: an environment with no index yet (not in
/// `index.warm`, never asked for) that is being deployed is not read
/// half-written on its first request: while the watcher holds the deploy
/// the master answers 503 with `Retry-After` (no agent purges on that),
/// and once it settles it serves the whole tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unindexed_environment_is_not_read_while_it_is_being_deployed() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 2, 5, 3);
    tree.generate("other", 6, 15, 11);
    let env = tree.envpath().join("other");
    let m = master(&tree.envpath(), &pki, "warm = [\"production\"]", "");
    assert!(
        !m.store.indexed().iter().any(|n| n.as_str() == "other"),
        "'other' was indexed before anyone asked for it"
    );
    let (c, url) = (client(&pki, Some("node1")), m.url());
    let q = Q.replace("environment=production", "environment=other");
    let modules = env.join("modules");
    let deploy =
        tokio::task::spawn_blocking(move || scripted_redeploy(&modules, Duration::from_secs(1)));
    let held = wait_for(PATIENCE, || {
        let n = m.store.stats.deploys_held.load(Ordering::SeqCst);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert!(held.is_some(), "the watcher never held the deploy");
    let (status, headers, _) = listing(&c, &url, "plugins", &q).await;
    assert_eq!(status, 503, "a held, unindexed environment was read");
    assert!(headers.contains_key("retry-after"));
    deploy.await.unwrap();
    let want = on_disk(&env);
    let got = wait_for(PATIENCE, || {
        let (c, url, q) = (c.clone(), url.clone(), q.clone());
        async move {
            let (status, _, entries) = listing(&c, &url, "plugins", &q).await;
            (status == 200).then_some(entries)
        }
    })
    .await
    .expect("never served after the deploy settled");
    assert_eq!(files(got), want);
}
