//! A master with 100 environments (docs/master.md#many-environments), the real
//! binary as a child process, its index counters read from its Prometheus
//! metrics: it answers its health check as ready before every environment is
//! indexed; the first request for an unindexed environment gets the right
//! listing, and concurrent first requests share one build; a change re-reads
//! only the changed file; an index dropped for being idle comes back with the
//! same ETag without reading a file again.

use std::collections::BTreeMap;
use std::time::Duration;

use pluginsync_common::metadata::{FileMetadata, FileType};
use pluginsync_tests::{
    EnvTree, MasterProcess, Pki, client, config_file, config_toml, merged_mount, sha256_hex,
    wait_for,
};

use crate::common::{listing, pluginsync_query};

const ENVS: usize = 100;

fn env(i: usize) -> String {
    format!("env{i:03}")
}

/// The value of one series, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// How many environments have been built at least once.
fn environments_built(text: &str) -> usize {
    text.lines()
        .filter(|l| l.starts_with("pluginsync_master_index_builds_total{environment="))
        .count()
}

fn builds_of(text: &str, env: &str) -> f64 {
    metric(
        text,
        &format!("pluginsync_master_index_builds_total{{environment=\"{env}\"}}"),
    )
}

/// A listing in [`merged_mount`]'s notation.
fn as_tree(entries: &[FileMetadata]) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter_map(|e| {
            let rel = e.relative_path.clone()?;
            if rel == "." {
                return None;
            }
            let mode = e.mode & 0o777;
            let value = match e.kind {
                FileType::Directory => format!("dir {mode:o}"),
                _ => format!(
                    "file {mode:o} {}",
                    e.checksum.as_ref()?.value.strip_prefix("{sha256}")?
                ),
            };
            Some((rel, value))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_environments_are_indexed_on_demand_shared_and_dropped_when_idle() {
    let (tree, pki) = (EnvTree::in_memory(), Pki::new());
    for i in 0..ENVS {
        // The same modules everywhere (as r10k's branches are), and one
        // file of each environment's own.
        tree.generate(&env(i), 2, 3, 7);
        tree.file(
            &env(i),
            "own",
            &format!("lib/facter/{}.rb", env(i)),
            format!("# {}\n", env(i)),
            0o644,
        );
    }
    let (_dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\nwarm = [\"env000\"]\nidle_drop = \"2s\"\ndebounce = \"50ms\"\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n",
    ));
    let master = MasterProcess::spawn(&cfg);
    let metrics_url = master
        .log
        .lines()
        .find_map(|l| Some(l.split("metrics on ").nth(1)?.trim().to_owned()))
        .expect("the master logs its metrics address before listening");
    let scrape = || {
        let url = metrics_url.clone();
        async move { reqwest::get(&url).await.unwrap().text().await.unwrap() }
    };
    let c = client(&pki, Some("node1"));
    let url = master.url();

    // Ready once what index.warm names is indexed, not everything.
    let ready = wait_for(Duration::from_secs(60), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c.get(format!("{url}/status/v1/simple")).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
    assert!(ready.is_some(), "the health check never answered ready");
    let text = scrape().await;
    assert!(builds_of(&text, "env000") >= 1.0, "{text}");
    assert_eq!(
        environments_built(&text),
        1,
        "ready before the other {} environments were indexed",
        ENVS - 1
    );

    // The first request for an unindexed environment: the right listing.
    let q = pluginsync_query("use", "follow", &env(50));
    let (status, _, entries) = listing(&c, &url, "plugins", &q).await;
    assert_eq!(status, 200);
    let env50 = tree.envpath().join(env(50));
    assert_eq!(as_tree(&entries), merged_mount(&env50, "lib"));
    assert!(as_tree(&entries).contains_key("facter/env050.rb"));

    // The watcher is set up in the background, then refreshes what was
    // indexed meanwhile: once a change in env000 is served, that is done
    // and no build but the ones asked for below happens.
    tree.file(&env(0), "own", "lib/facter/probe.rb", "# probe\n", 0o644);
    let q0 = pluginsync_query("use", "follow", &env(0));
    let probed = wait_for(Duration::from_secs(20), || {
        let (c, url, q) = (c.clone(), url.clone(), q0.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", &q).await;
            now.iter()
                .any(|e| e.relative_path.as_deref() == Some("facter/probe.rb"))
                .then_some(())
        }
    })
    .await;
    assert!(probed.is_some(), "a change in env000 was never served");

    // Concurrent first requests for one environment: one build.
    let q77 = pluginsync_query("use", "follow", &env(77));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (c, url, q) = (c.clone(), url.clone(), q77.clone());
        tasks.spawn(async move {
            let (status, headers, _) = listing(&c, &url, "plugins", &q).await;
            assert_eq!(status, 200);
            headers["etag"].to_str().unwrap().to_owned()
        });
    }
    let answers = tasks.join_all().await;
    assert!(answers.iter().all(|e| *e == answers[0]), "{answers:?}");
    let text = scrape().await;
    assert_eq!(builds_of(&text, &env(77)), 1.0, "one build for 8 requests");
    assert_eq!(environments_built(&text), 3, "env000, env050, env077 only");

    // A change in an indexed environment re-reads only the changed file.
    let hashed = metric(&scrape().await, "pluginsync_master_files_hashed_total");
    let changed = env50.join("modules/own/lib/facter/env050.rb");
    std::fs::write(&changed, "# env050, changed\n").unwrap();
    let want = format!("{{sha256}}{}", sha256_hex(b"# env050, changed\n"));
    let seen = wait_for(Duration::from_secs(20), || {
        let (c, url, q, want) = (c.clone(), url.clone(), q.clone(), want.clone());
        async move {
            let (_, _, now) = listing(&c, &url, "plugins", &q).await;
            let e = now
                .iter()
                .find(|e| e.relative_path.as_deref() == Some("facter/env050.rb"))?;
            (e.checksum.as_ref()?.value == want).then_some(())
        }
    })
    .await;
    assert!(seen.is_some(), "the change was never served");
    assert_eq!(
        metric(&scrape().await, "pluginsync_master_files_hashed_total"),
        hashed + 1.0,
        "only the changed file was read again"
    );

    // Idle (index.idle_drop = 2s): dropped, then rebuilt on the next
    // request with the same ETag and without reading a file again. Each
    // try waits past the idle time first (a request resets it).
    let etag77 = answers[0].clone();
    let hashed = metric(&scrape().await, "pluginsync_master_files_hashed_total");
    let mut rebuilt = false;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (status, headers, _) = listing(&c, &url, "plugins", &q77).await;
        assert_eq!(status, 200);
        assert_eq!(headers["etag"].to_str().unwrap(), etag77);
        if builds_of(&scrape().await, &env(77)) >= 2.0 {
            rebuilt = true;
            break;
        }
    }
    assert!(rebuilt, "env077 was never dropped for being idle");
    assert_eq!(
        metric(&scrape().await, "pluginsync_master_files_hashed_total"),
        hashed,
        "the rebuild after an idle drop reused the kept digests"
    );
}
