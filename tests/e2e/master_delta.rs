//! Delta listings (docs/protocol.md §7.5) against real
//! masters over real TLS: a delta answer rebuilds exactly the full listing
//! (same bytes, same ETag) with the agent's own code; an unknown base, a
//! request without our header (what a stock agent sends) and a
//! non-standard query get the full listing; two masters on the same tree
//! answer deltas for a base either produced; the agent binary syncs a
//! change through a delta and converges; a master that answers a
//! corrupted delta costs the agent one full listing, never a wrong tree;
//! a stock `puppet plugin download` never receives a delta.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pluginsync_common::etag::ETag;
use pluginsync_common::protocol;
use pluginsync_tests::puppet::PuppetAgent;
use pluginsync_tests::{
    AgentHome, EnvTree, FakeMaster, Pki, TestMaster, client, config_toml, merged_mount,
    parse_config, require, sha256_hex, tree_snapshot, wait_for,
};

/// The agent's listing query (`source_permissions=use`, Puppet's ignores).
fn q() -> String {
    let ignore = pluginsync_common::DEFAULT_IGNORE.map(str::to_owned);
    protocol::ListingQuery {
        environment: "production",
        source_permissions: "use",
        ignore: &ignore,
    }
    .to_query()
}

/// One answer: status, headers, body as sent (not inflated).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// GETs the plugins listing for `query` with the given extra headers.
async fn get(c: &reqwest::Client, base: &str, query: &str, headers: &[(&str, &str)]) -> Answer {
    let mut r = c
        .get(format!("{base}/puppet/v3/file_metadatas/plugins?{query}"))
        .header("Accept", protocol::ACCEPT_LISTING);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = r.send().await.expect("request");
    Answer {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.bytes().await.expect("body").to_vec(),
    }
}

/// The full listing now: body and ETag.
async fn full(c: &reqwest::Client, base: &str) -> (Vec<u8>, String) {
    let a = get(c, base, &q(), &[]).await;
    assert_eq!(a.status, 200);
    let tag = a.header("etag").expect("ETag").to_owned();
    (a.body, tag)
}

/// What a change must show in the listing once the master has indexed
/// all of it: texts the listing must hold and texts it must not.
struct Expect {
    want: Vec<String>,
    gone: Vec<String>,
}

/// Waits until `base` serves a listing showing all of `change` (a
/// re-index may catch a change half-written; the test goes on only from
/// the complete one).
async fn changed(c: &reqwest::Client, base: &str, change: &Expect) -> (Vec<u8>, String) {
    wait_for(Duration::from_secs(30), || {
        let (c, base) = (c.clone(), base.to_owned());
        async move {
            let (body, tag) = full(&c, &base).await;
            let text = String::from_utf8_lossy(&body);
            (change.want.iter().all(|w| text.contains(w.as_str()))
                && !change.gone.iter().any(|g| text.contains(g.as_str())))
            .then_some((body, tag))
        }
    })
    .await
    .expect("the master re-indexed the whole change")
}

/// `path` relative to its module's `lib/`, as listed.
fn rel(path: &std::path::Path) -> String {
    let p = path.to_str().unwrap();
    p.split_once("/lib/").unwrap().1.to_owned()
}

/// Rewrites `path` with `content`; what the listing shows for it then.
fn rewrite(path: &std::path::Path, content: &str) -> String {
    std::fs::write(path, content).unwrap();
    sha256_hex(content.as_bytes())
}

/// A generated tree of 300 lib files; returns them.
fn tree() -> (EnvTree, Vec<std::path::PathBuf>) {
    let t = EnvTree::new();
    let files = t.generate("production", 10, 30, 7);
    (t, files)
}

/// A 1 % change: two files rewritten, one added, one removed.
fn change(tree: &EnvTree, files: &[std::path::PathBuf]) -> Expect {
    let want = vec![
        rewrite(&files[10], "# changed ten\n"),
        rewrite(&files[200], "# changed two hundred\n"),
        "\"facter/added_by_delta_test.rb\"".to_owned(),
    ];
    std::fs::remove_file(&files[150]).unwrap();
    tree.file(
        "production",
        "mod03",
        "lib/facter/added_by_delta_test.rb",
        "# new\n",
        0o644,
    );
    Expect {
        want,
        gone: vec![format!("\"{}\"", rel(&files[150]))],
    }
}

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

/// The ETag of a listing body, as its header carries it.
fn listing_etag(body: &[u8]) -> String {
    ETag::of_listing(body).to_string()
}

const DELTA: (&str, &str) = (protocol::HEADER_DELTA, protocol::DELTA_VERSION);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_rebuilds_exactly_the_full_listing() {
    let ((tree, files), pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let (old, old_tag) = full(&c, &master.url()).await;
    let change = change(&tree, &files);
    let (new, new_tag) = changed(&c, &master.url(), &change).await;
    assert_eq!(new_tag, listing_etag(&new), "the ETag is the body's hash");
    let stats = &master.store.stats;
    let before = stats.listings_delta.load(Ordering::Relaxed);

    let a = get(
        &c,
        &master.url(),
        &q(),
        &[("If-None-Match", &old_tag), DELTA],
    )
    .await;
    assert_eq!(a.status, protocol::DELTA_STATUS, "a delta for a known base");
    assert_eq!(a.header("content-type"), Some(protocol::DELTA_MEDIA_TYPE));
    assert_eq!(
        a.header("etag"),
        Some(new_tag.as_str()),
        "the full listing's tag"
    );
    assert_eq!(a.header("cache-control"), Some("no-store"));
    assert!(
        a.header("vary").unwrap().contains("X-Pluginsync-Delta"),
        "a shared cache must tell a delta from a listing"
    );
    assert!(a.header(protocol::HEADER_BLOBS).is_some());
    let rebuilt =
        pluginsync_agent::delta::rebuild(&old, &a.body, a.header("etag").map(ETag::new).as_ref())
            .unwrap();
    assert_eq!(rebuilt, new, "the same bytes as the full listing");
    assert_eq!(listing_etag(&rebuilt), new_tag, "and so the same ETag");
    assert!(
        a.body.len() * 10 < new.len(),
        "a 1 % change is a small delta: {} vs {} bytes",
        a.body.len(),
        new.len()
    );
    assert_eq!(stats.listings_delta.load(Ordering::Relaxed), before + 1);

    // gzip changes the encoding only.
    let gz = get(
        &c,
        &master.url(),
        &q(),
        &[
            ("If-None-Match", &old_tag),
            DELTA,
            ("Accept-Encoding", "gzip"),
        ],
    )
    .await;
    assert_eq!(gz.status, protocol::DELTA_STATUS);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(&gz.body[..])
        .read_to_end(&mut inflated)
        .unwrap();
    assert_eq!(inflated, a.body);
    assert_eq!(
        pluginsync_agent::delta::rebuild(
            &old,
            &inflated,
            gz.header("etag").map(ETag::new).as_ref()
        )
        .unwrap(),
        new,
        "the -gzip form of the ETag names the same listing"
    );

    // What is not a delta request, or names no remembered base: the full
    // listing, as today.
    let unknown = format!("\"{}\"", "0".repeat(40));
    let other_query = q().replace("checksum_type=sha256", "checksum_type=md5");
    for (why, query, headers) in [
        (
            "unknown base",
            q(),
            vec![("If-None-Match", unknown.as_str()), DELTA],
        ),
        (
            "no delta header (a stock agent)",
            q(),
            vec![("If-None-Match", old_tag.as_str())],
        ),
        ("delta header without If-None-Match", q(), vec![DELTA]),
        (
            "another delta version",
            q(),
            vec![
                ("If-None-Match", old_tag.as_str()),
                (protocol::HEADER_DELTA, "2"),
            ],
        ),
        (
            "a query no history is kept for",
            other_query,
            vec![("If-None-Match", old_tag.as_str()), DELTA],
        ),
    ] {
        let a = get(&c, &master.url(), &query, &headers).await;
        assert_eq!(a.status, 200, "{why}");
        assert!(
            a.header("content-type")
                .unwrap()
                .starts_with("application/json"),
            "{why}"
        );
        serde_json::from_slice::<serde_json::Value>(&a.body).expect("a JSON listing");
        if !why.contains("query") {
            assert_eq!(a.body, new, "{why}");
        }
    }
    // The current tag: 304, as before.
    let a = get(
        &c,
        &master.url(),
        &q(),
        &[("If-None-Match", &new_tag), DELTA],
    )
    .await;
    assert_eq!(a.status, 304);
    assert_eq!(
        stats.listings_delta.load(Ordering::Relaxed),
        before + 2,
        "only the two delta answers counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_masters_answer_deltas_for_a_base_either_produced() {
    let ((tree, files), pki) = (tree(), Pki::new());
    let (a, b) = (start(&tree, &pki), start(&tree, &pki));
    let c = client(&pki, Some("node1"));
    // Each node fetched its listing from one replica only.
    let (from_a, tag_a) = full(&c, &a.url()).await;
    let change = change(&tree, &files);
    let (new_a, new_tag) = changed(&c, &a.url(), &change).await;
    let (new_b, new_tag_b) = changed(&c, &b.url(), &change).await;
    assert_eq!(
        (&new_a, &new_tag),
        (&new_b, &new_tag_b),
        "the replicas agree"
    );
    for (name, replica) in [("a", &a), ("b", &b)] {
        let d = get(
            &c,
            &replica.url(),
            &q(),
            &[("If-None-Match", &tag_a), DELTA],
        )
        .await;
        assert_eq!(d.status, protocol::DELTA_STATUS, "replica {name}");
        let rebuilt = pluginsync_agent::delta::rebuild(
            &from_a,
            &d.body,
            d.header("etag").map(ETag::new).as_ref(),
        )
        .unwrap();
        assert_eq!(rebuilt, new_a, "replica {name}");
    }
    // And the other way round: a base fetched from b, a delta from a,
    // after a second change.
    let second = Expect {
        want: vec![rewrite(&files[20], "# a second change\n")],
        gone: Vec::new(),
    };
    let (newer, newer_tag) = changed(&c, &a.url(), &second).await;
    assert_eq!(changed(&c, &b.url(), &second).await.1, newer_tag);
    let d = get(&c, &a.url(), &q(), &[("If-None-Match", &new_tag), DELTA]).await;
    assert_eq!(d.status, protocol::DELTA_STATUS);
    assert_eq!(
        pluginsync_agent::delta::rebuild(&new_b, &d.body, d.header("etag").map(ETag::new).as_ref())
            .unwrap(),
        newer
    );
    assert!(a.store.stats.listings_delta.load(Ordering::Relaxed) >= 2);
    assert!(b.store.stats.listings_delta.load(Ordering::Relaxed) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_syncs_a_change_through_a_delta_and_converges() {
    let ((tree, files), pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    // Delta listings are for Puppet's listings (docs/protocol.md §7.5).
    let home = AgentHome::new(&pki, &[master.url()], "generations = false");
    let env_dir = tree.envpath().join("production");
    let first = home.sync(&[]);
    assert_eq!(first.code, 0, "{first:?}");
    let stats = &master.store.stats;
    assert_eq!(
        stats.listings_delta.load(Ordering::Relaxed),
        0,
        "nothing to apply a delta to"
    );
    let change = change(&tree, &files);
    let (new, _) = changed(&c, &master.url(), &change).await;

    let sent = stats.listings_sent.load(Ordering::Relaxed);
    let second = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(second.code, 2, "{second:?}");
    assert_eq!(second.stderr, "", "{second:?}");
    assert_eq!(
        stats.listings_delta.load(Ordering::Relaxed),
        1,
        "the plugins listing came as a delta (pluginfacts did not change)"
    );
    assert_eq!(
        stats.listings_sent.load(Ordering::Relaxed),
        sent,
        "no full listing was sent"
    );
    assert_eq!(tree_snapshot(&home.libdir()), merged_mount(&env_dir, "lib"));
    assert_eq!(
        tree_snapshot(&home.factsdir()),
        merged_mount(&env_dir, "facts.d")
    );
    // The rebuilt listing is cached as if it had come whole.
    assert_eq!(
        std::fs::read(home.vardir().join("cache/plugins.listing.json")).unwrap(),
        new
    );
    // And revalidates: the next run is two 304s.
    let not_modified = stats.listings_not_modified.load(Ordering::Relaxed);
    let third = home.sync(&["--detailed-exitcodes"]);
    assert_eq!(third.code, 0, "{third:?}");
    assert_eq!(
        stats.listings_not_modified.load(Ordering::Relaxed),
        not_modified + 2
    );
    assert_eq!(stats.listings_delta.load(Ordering::Relaxed), 1);
}

/// One listing entry, as the master writes it.
fn entry(rel: &str, file: Option<&str>) -> String {
    match file {
        None => format!(
            r#"{{"path":"/m/lib","relative_path":"{rel}","links":"follow","owner":0,"group":0,"mode":493,"checksum":{{"type":"ctime","value":"{{ctime}}0"}},"type":"directory","destination":null}}"#
        ),
        Some(content) => format!(
            r#"{{"path":"/m/lib","relative_path":"{rel}","links":"follow","owner":0,"group":0,"mode":420,"checksum":{{"type":"sha256","value":"{{sha256}}{}"}},"type":"file","destination":null}}"#,
            sha256_hex(content.as_bytes())
        ),
    }
}

/// Bad deltas a master could send: (what is wrong, the body from the
/// base's tag and the new listing's tag).
type BadDelta = (&'static str, fn(&str, &str) -> String);

const BAD_DELTAS: [BadDelta; 3] = [
    ("other bytes than its ETag names", |base, tag| {
        // Parses and names the right tags, but b.rb's checksum is wrong.
        format!(
            "pluginsync-listing-delta 1\nbase {base}\netag {tag}\nentries 3\nc 0 1\na {}\na {}\nend\n",
            entry("a.rb", Some("two\n")),
            entry("b.rb", Some("not bee\n")),
        )
    }),
    ("a base the agent does not hold", |_, tag| {
        format!(
            "pluginsync-listing-delta 1\nbase \"{}\"\netag {tag}\nentries 1\nc 0 1\nend\n",
            "0".repeat(40)
        )
    }),
    ("not a delta at all", |_, _| {
        "<html>proxy error</html>".to_owned()
    }),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_delta_costs_one_full_listing_and_the_run_succeeds() {
    for (what, bad) in BAD_DELTAS {
        falls_back_from(what, bad);
    }
}

/// Two runs against a fake master: the first gets listing v1, the second
/// the bad delta `bad` from v1 to v2, then (its one refetch) v2 whole.
fn falls_back_from(what: &str, bad: fn(&str, &str) -> String) {
    let pki = Pki::new();
    let v1 = format!("[{},{}]", entry(".", None), entry("a.rb", Some("one\n")));
    let v2 = format!(
        "[{},{},{}]",
        entry(".", None),
        entry("a.rb", Some("two\n")),
        entry("b.rb", Some("bee\n"))
    );
    let (v1, v2): (&'static str, &'static str) = (v1.leak(), v2.leak());
    // The listing the fake serves: v1 until the first run is done.
    let version = Arc::new(AtomicUsize::new(1));
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    let (ver, seen) = (version.clone(), heads.clone());
    let fake = FakeMaster::start_with_head(
        &pki,
        Arc::new(move |target: &str, head: &str| {
            let json = |status: &str, ctype: &str, body: &[u8], tag: &str| {
                let mut r = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nETag: {tag}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(body);
                r
            };
            if target.contains("/file_metadatas/plugins") {
                seen.lock().unwrap().push(head.to_ascii_lowercase());
                let listing = if ver.load(Ordering::SeqCst) == 1 {
                    v1
                } else {
                    v2
                };
                let tag = listing_etag(listing.as_bytes());
                let lower = head.to_ascii_lowercase();
                if lower.contains("x-pluginsync-delta: 1") && lower.contains("if-none-match") {
                    let delta = bad(&listing_etag(v1.as_bytes()), &tag);
                    return json(
                        "226 IM Used",
                        protocol::DELTA_MEDIA_TYPE,
                        delta.as_bytes(),
                        &tag,
                    );
                }
                return json("200 OK", "application/json", listing.as_bytes(), &tag);
            }
            if target.contains("/file_metadatas/pluginfacts") {
                let root = format!("[{}]", entry(".", None));
                return json(
                    "200 OK",
                    "application/json",
                    root.as_bytes(),
                    &listing_etag(root.as_bytes()),
                );
            }
            let content: &[u8] = if target.contains("a.rb") {
                if ver.load(Ordering::SeqCst) == 1 {
                    b"one\n"
                } else {
                    b"two\n"
                }
            } else if target.contains("b.rb") {
                b"bee\n"
            } else {
                return pluginsync_tests::http_response("404 Not Found", "text/plain", b"no");
            };
            pluginsync_tests::http_response("200 OK", "application/octet-stream", content)
        }),
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let first = home.sync(&[]);
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(std::fs::read(home.libdir().join("a.rb")).unwrap(), b"one\n");
    version.store(2, Ordering::SeqCst);
    heads.lock().unwrap().clear();

    let second = home.sync(&["--detailed-exitcodes", "-v"]);
    assert_eq!(second.code, 2, "{what}: {second:?}");
    assert_eq!(std::fs::read(home.libdir().join("a.rb")).unwrap(), b"two\n");
    assert_eq!(std::fs::read(home.libdir().join("b.rb")).unwrap(), b"bee\n");
    let said: Vec<&str> = second
        .stderr
        .lines()
        .filter(|l| l.contains("delta listing not used"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "{what}: one line says why: {}",
        second.stderr
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(
        heads.len(),
        2,
        "{what}: the delta, then one full listing: {heads:?}"
    );
    assert!(heads[0].contains("if-none-match") && heads[0].contains("x-pluginsync-delta: 1"));
    assert!(
        !heads[1].contains("if-none-match") && !heads[1].contains("x-pluginsync-delta"),
        "{what}: the refetch is unconditional: {}",
        heads[1]
    );
    assert_eq!(
        std::fs::read(home.vardir().join("cache/plugins.listing.json")).unwrap(),
        v2.as_bytes(),
        "{what}: the full listing is what is cached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_puppet_plugin_download_never_receives_a_delta() {
    let Some(puppet) = require("puppet", "puppet", "master_delta") else {
        return;
    };
    let ((tree, files), pki) = (tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let work = tempfile::tempdir().unwrap();
    let env_dir = tree.envpath().join("production");
    let agent = Arc::new(PuppetAgent::new(
        &puppet,
        work.path(),
        &pki.ssldir,
        "node1",
        master.addr.port(),
    ));
    let run = || {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            let r = agent.plugin_download("production");
            (r.code, r.output)
        })
    };
    let (code, out) = run().await.unwrap();
    assert_eq!(code, 0, "{out}");
    let change = change(&tree, &files);
    changed(&c, &master.url(), &change).await;
    let sent = master.store.stats.listings_sent.load(Ordering::Relaxed);
    let (code, out) = run().await.unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(master.store.stats.listings_delta.load(Ordering::Relaxed), 0);
    assert!(master.store.stats.listings_sent.load(Ordering::Relaxed) >= sent + 2);
    let lib: std::collections::BTreeSet<String> =
        tree_snapshot(&agent.libdir()).into_keys().collect();
    let want: std::collections::BTreeSet<String> =
        merged_mount(&env_dir, "lib").into_keys().collect();
    assert!(
        want.is_subset(&lib),
        "every served path synced: missing {:?}",
        want.difference(&lib).collect::<Vec<_>>()
    );
    assert!(lib.contains("facter/added_by_delta_test.rb"));
    assert_eq!(
        std::fs::read(agent.libdir().join(rel(&files[10]))).unwrap(),
        b"# changed ten\n"
    );
}
