//! The agent against masters and trees that try to hurt the node (issue
//! 17, findings A-1…): modes that would make root's code writable by
//! others, names and messages made of terminal control characters, blob
//! locations pointing at other hosts, answers too large to buffer. Every
//! run is the real `pluginsync-agent` binary against a real master or a
//! scripted [`FakeMaster`]. Also the agent's own faults: a cache torn by a
//! kill between its writes.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pluginsync_common::etag::ETag;
use pluginsync_common::protocol;
use pluginsync_tests::{
    AgentHome, EnvTree, FakeMaster, Listener, Pki, TestMaster, config_toml, gzip_lines, gzip_zeros,
    http_response, listing_json, parse_config, response_with, tree_snapshot,
};

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A-1: a 0777 directory and a 0666 fact on the master's tree arrive as
/// 0755 and 0644 (docs/protocol.md §4.5); executables stay executable; a
/// local world-writable file is fixed on the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_and_world_writable_modes_never_reach_the_node() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.dir("production", "alpha", "lib/open", 0o777);
    tree.file("production", "alpha", "lib/open/x.rb", "x\n", 0o666);
    tree.file(
        "production",
        "alpha",
        "lib/open/run.sh",
        "#!/bin/sh\n",
        0o777,
    );
    tree.dir("production", "alpha", "facts.d", 0o777);
    tree.file("production", "alpha", "facts.d/f.txt", "a=1\n", 0o666);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let (lib, facts) = (home.libdir(), home.factsdir());
    assert_eq!(mode(&lib.join("open")), 0o755);
    assert_eq!(mode(&lib.join("open/x.rb")), 0o644);
    assert_eq!(mode(&lib.join("open/run.sh")), 0o755);
    assert_eq!(mode(&facts.join("f.txt")), 0o644);
    // A local file made world-writable is put back by the next run.
    std::fs::set_permissions(
        lib.join("open/x.rb"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(mode(&lib.join("open/x.rb")), 0o644);
}

/// No control character of a run's output reaches the terminal: every
/// line of stdout and stderr is printable, one line per thing.
fn assert_printable(text: &str) {
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "control characters printed: {text:?}"
    );
}

/// A-4: a file name with ESC and a newline is printed escaped on one line
/// (no forged summary line, no cleared terminal); a master's error
/// message with control characters likewise, on one stderr line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_messages_are_printed_escaped() {
    let pki = Pki::new();
    let name = "a\u{1b}[2J\npluginsync: 0 created, 9 updated.rb";
    let body = listing_json(&[(name, Some(b"x"), 0o644)]);
    let fake = FakeMaster::start(
        &pki,
        Arc::new(move |t: &str| {
            if t.contains("/file_metadatas/") {
                http_response("200 OK", "application/json", body.as_bytes())
            } else {
                http_response("200 OK", "application/octet-stream", b"x")
            }
        }),
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(home.libdir().join(name).exists());
    assert_printable(&run.stdout);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "one change per mount and the summary: {lines:?}"
    );
    assert_eq!(
        lines[1],
        "created  plugins/a\\x1b[2J\\npluginsync: 0 created, 9 updated.rb"
    );
    // The report keeps the name as it is.
    let report = home.run(&["report", "--format", "json"]);
    assert!(report.stdout.contains("\\u001b[2J\\n"), "{}", report.stdout);

    let message = serde_json::json!({
        "message": "Forbidden: no\u{1b}]0;owned\u{7}\nerror: forged\r\u{9b}2J",
        "issue_kind": "RUNTIME_ERROR",
    })
    .to_string();
    let denying = FakeMaster::start(
        &pki,
        Arc::new(move |_t: &str| {
            http_response("403 Forbidden", "application/json", message.as_bytes())
        }),
    );
    let before = tree_snapshot(&home.libdir());
    let run = home.sync(&["--server", &denying.url()]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_printable(&run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{:?}", run.stderr);
    assert!(
        run.stderr
            .contains("Forbidden: no\\x1b]0;owned\\x07\\nerror: forged\\r\\x9b2J"),
        "{}",
        run.stderr
    );
    assert_eq!(tree_snapshot(&home.libdir()), before);
}

/// A master offering two files; `headers` go on its listing answers.
fn offering_master(
    pki: &Pki,
    headers: Vec<(&'static str, String)>,
) -> (FakeMaster, Arc<AtomicUsize>) {
    let body = listing_json(&[("a.rb", Some(b"a"), 0o644), ("b.rb", Some(b"b"), 0o644)]);
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    let fake = FakeMaster::start(
        pki,
        Arc::new(move |t: &str| {
            seen.fetch_add(1, Ordering::SeqCst);
            if t.contains("/file_metadatas/") {
                let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                response_with("200 OK", &h, body.as_bytes())
            } else if t.contains("/file_content/") {
                let content: &[u8] = if t.contains("a.rb") { b"a" } else { b"b" };
                http_response("200 OK", "application/octet-stream", content)
            } else {
                http_response("404 Not Found", "text/plain", b"no")
            }
        }),
    );
    (fake, requests)
}

/// A-5: blob and batch locations that are not paths on the master itself
/// are ignored (content comes from `file_content`), and no request goes to
/// the host they name; a redirect is an error, never followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_locations_and_redirects_never_lead_to_another_host() {
    let pki = Pki::new();
    let elsewhere = Listener::start();
    let port = elsewhere.port;
    let (fake, _) = offering_master(
        &pki,
        vec![
            ("Content-Type", "application/json".into()),
            ("X-Pluginsync-Blob-Batch", format!("@127.0.0.1:{port}/x")),
            ("X-Pluginsync-Blobs", format!("//127.0.0.1:{port}/b/")),
        ],
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(std::fs::read(home.libdir().join("a.rb")).unwrap(), b"a");
    assert_eq!(std::fs::read(home.libdir().join("b.rb")).unwrap(), b"b");
    assert_eq!(
        elsewhere.accepted_before_now(),
        0,
        "the agent connected to another port"
    );

    // A redirect to another (trusted, same CA) server is not followed.
    let (other, other_requests) =
        offering_master(&pki, vec![("Content-Type", "application/json".into())]);
    let target = format!("{}/puppet/v3/file_metadatas/plugins", other.url());
    let redirecting = FakeMaster::start(
        &pki,
        Arc::new(move |_t: &str| response_with("302 Found", &[("Location", &target)], b"")),
    );
    let before = tree_snapshot(&home.libdir());
    let run = home.sync(&["--server", &redirecting.url()]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{:?}", run.stderr);
    assert!(
        run.stderr.contains("302") && run.stderr.contains("not followed"),
        "{}",
        run.stderr
    );
    assert_eq!(
        other_requests.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    assert_eq!(tree_snapshot(&home.libdir()), before);
}

/// A-3: a gzip bomb for a listing and a huge error body are each one error
/// line, the destination untouched, and the agent's memory bounded (it
/// runs with a 768 MiB data limit; the bomb inflates to 1 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_and_a_huge_error_body_are_refused_with_one_line() {
    let pki = Pki::new();
    let bomb = Arc::new(gzip_zeros(1 << 30));
    let bombing = {
        let bomb = bomb.clone();
        FakeMaster::start(
            &pki,
            Arc::new(move |_t: &str| {
                response_with(
                    "200 OK",
                    &[
                        ("Content-Type", "application/json"),
                        ("Content-Encoding", "gzip"),
                    ],
                    &bomb,
                )
            }),
        )
    };
    let error_bomb = FakeMaster::start(
        &pki,
        Arc::new(move |_t: &str| {
            response_with(
                "403 Forbidden",
                &[("Content-Type", "text/plain"), ("Content-Encoding", "gzip")],
                &bomb,
            )
        }),
    );
    let home = AgentHome::new(&pki, &["https://localhost:1".into()], "");
    std::fs::create_dir_all(home.libdir()).unwrap();
    std::fs::write(home.libdir().join("keep.rb"), "kept").unwrap();
    let before = tree_snapshot(&home.libdir());
    for (fake, expect) in [(&bombing, "larger than 256 MiB"), (&error_bomb, "403")] {
        let run = home.sync_with_data_limit(&["--server", &fake.url()], 768 << 20);
        assert_eq!(run.code, 1, "{expect}: {run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{expect}: {:?}", run.stderr);
        assert!(
            run.stderr.starts_with("error: ") && run.stderr.contains(expect),
            "{expect}: {}",
            run.stderr
        );
        assert_eq!(tree_snapshot(&home.libdir()), before, "{expect}");
    }
}

/// Waits until the master's plugins listing has `content`'s sha256, so the
/// next run sees the tree as it is now (the watcher re-indexes within ~2 s).
async fn master_serves(master: &TestMaster, pki: &Pki, content: &str) {
    let c = pluginsync_tests::client(pki, Some("node1"));
    let url = format!(
        "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
        master.url()
    );
    let want = pluginsync_tests::sha256_hex(content.as_bytes());
    let served = pluginsync_tests::wait_for(std::time::Duration::from_secs(10), || {
        let (c, url, want) = (c.clone(), url.clone(), want.clone());
        async move {
            let body = c.get(url).send().await.ok()?.text().await.ok()?;
            body.contains(&want).then_some(())
        }
    })
    .await;
    assert!(served.is_some(), "the master did not re-index {content:?}");
}

/// Faults: a run killed between the cache writes leaves the new listing
/// beside the old record (and its old `ETag`); the master then rolls back
/// to that old tree and answers 304 to the old `ETag`. The next run must
/// not plan against the newer cached listing: it converges on the
/// rolled-back tree (agent/src/cache.rs, `listing_sha256`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_cache_and_a_master_rollback_still_converge() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/role.rb", "v1\n", 0o644);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let role = home.libdir().join("facter/role.rb");
    let record = home.vardir().join("cache/plugins.json");

    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(std::fs::read_to_string(&role).unwrap(), "v1\n");
    let old_record = std::fs::read(&record).unwrap();

    tree.file("production", "alpha", "lib/facter/role.rb", "v2\n", 0o644);
    master_serves(&master, &pki, "v2\n").await;
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!(std::fs::read_to_string(&role).unwrap(), "v2\n");

    // The torn cache: the v2 listing is cached, the record is v1's.
    std::fs::write(&record, &old_record).unwrap();
    tree.file("production", "alpha", "lib/facter/role.rb", "v1\n", 0o644);
    master_serves(&master, &pki, "v1\n").await;

    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        std::fs::read_to_string(&role).unwrap(),
        "v1\n",
        "the run converged on the rolled-back tree: {run:?}"
    );
    assert_eq!(
        home.sync(&["--detailed-exitcodes"]).code,
        0,
        "and stays there"
    );
}

/// Faults: the temporary files a killed run left in the vardir and its
/// cache directory are removed by the next run (under its lock); nothing
/// else there is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_temporary_files_are_removed_by_the_next_run() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/role.rb", "v1\n", 0o644);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    let (vardir, cache) = (home.vardir(), home.vardir().join("cache"));
    for dir in [&vardir, &cache] {
        std::fs::write(dir.join(".pluginsync-tmp-AbC123"), b"half a file").unwrap();
    }
    let leftovers = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".pluginsync-tmp-")
            })
            .count()
    };
    assert_eq!(home.sync(&["--noop"]).code, 0);
    assert_eq!(
        leftovers(&vardir),
        1,
        "--noop takes no lock and removes nothing"
    );
    assert_eq!(home.sync(&[]).code, 0);
    assert_eq!((leftovers(&vardir), leftovers(&cache)), (0, 0));
    assert!(vardir.join("last_run_report.json").is_file());
    assert!(cache.join("plugins.json").is_file());
}

/// A hostile master's delta that copies one base entry again and again (a
/// 1.5 MB delta that would make a 250 MB listing) is refused before the
/// listing is built (docs/protocol.md §7.5.4): the agent runs with a
/// 160 MiB data limit, says why in one line, takes the whole listing once,
/// and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_that_expands_past_its_base_is_refused_in_bounded_memory() {
    use std::sync::Mutex;
    let pki = Pki::new();
    let dir = |rel: &str, path: &str| {
        format!(
            r#"{{"path":"{path}","relative_path":"{rel}","links":"follow","owner":0,"group":0,"mode":493,"checksum":{{"type":"ctime","value":"{{ctime}}0"}},"type":"directory","destination":null}}"#
        )
    };
    // "d" weighs ~1000 bytes: its `path` is long.
    let base = format!(
        "[{},{}]",
        dir(".", "/m"),
        dir("d", &format!("/m/{}", "p".repeat(850)))
    );
    let base: &'static str = base.leak();
    let copies = 249_999usize;
    let tag = "\"".to_owned() + &"0".repeat(40) + "\"";
    let mut delta = format!(
        "pluginsync-listing-delta 1\nbase {}\netag {tag}\nentries {}\nc 0 1\n",
        ETag::of_listing(base.as_bytes()),
        copies + 1
    );
    for _ in 0..copies {
        delta.push_str("c 1 1\n");
    }
    delta.push_str("end\n");
    let delta: &'static str = delta.leak();
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let fake = FakeMaster::start_with_head(
        &pki,
        Arc::new(move |target: &str, head: &str| {
            let lower = head.to_ascii_lowercase();
            let answer = |status: &str, ctype: &str, body: &str, tag: &str| {
                response_with(
                    status,
                    &[("Content-Type", ctype), ("ETag", tag)],
                    body.as_bytes(),
                )
            };
            if target.contains("/file_metadatas/plugins") {
                seen.lock().unwrap().push(lower.clone());
                if lower.contains("x-pluginsync-delta: 1") {
                    return answer("226 IM Used", protocol::DELTA_MEDIA_TYPE, delta, &tag);
                }
                let base_tag = ETag::of_listing(base.as_bytes()).to_string();
                return answer("200 OK", "application/json", base, &base_tag);
            }
            if target.contains("/file_metadatas/pluginfacts") {
                let root = format!("[{}]", dir(".", "/m"));
                let root_tag = ETag::of_listing(root.as_bytes()).to_string();
                return answer("200 OK", "application/json", &root, &root_tag);
            }
            http_response("404 Not Found", "text/plain", b"no")
        }),
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let first = home.sync(&[]);
    assert_eq!(first.code, 0, "{first:?}");
    let before = tree_snapshot(&home.libdir());
    heads.lock().unwrap().clear();

    let run = home.sync_with_data_limit(&["--server", &fake.url(), "-v"], 160 << 20);
    assert_eq!(run.code, 0, "the delta is refused, not the run: {run:?}");
    let said: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("delta listing not used"))
        .collect();
    assert_eq!(said.len(), 1, "{}", run.stderr);
    assert!(
        said[0].contains("copies base entry 1 more than once; refused"),
        "{}",
        said[0]
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(
        heads.len(),
        2,
        "the delta, then one full listing: {heads:?}"
    );
    assert!(!heads[1].contains("if-none-match"), "{}", heads[1]);
    assert_eq!(tree_snapshot(&home.libdir()), before);
}

/// A vardir another user can write could make the agent load that user's
/// code as root (docs/agent.md#the-vardir): open modes on what the agent
/// owns are fixed with a warning and the run goes on; a state file owned
/// by another user refuses the run with one line, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vardir_another_user_can_write_is_fixed_or_refused() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "alpha", "lib/facter/role.rb", "v1\n", 0o644);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    assert_eq!(home.sync(&[]).code, 0);
    let (vardir, registry) = (home.vardir(), home.vardir().join("plugins.json"));
    std::fs::write(&registry, "{}").unwrap();
    for (p, m) in [(&vardir, 0o777), (&registry, 0o666)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(mode(&vardir), 0o755);
    assert_eq!(mode(&registry), 0o644);
    assert_eq!(
        run.stderr.matches("writable by other users").count(),
        2,
        "{}",
        run.stderr
    );

    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("SKIPPED: giving a file to another user needs root");
        return;
    }
    std::os::unix::fs::lchown(&registry, Some(4_242_424), None).unwrap();
    tree.file("production", "alpha", "lib/facter/role.rb", "v2\n", 0o644);
    let before = tree_snapshot(&home.libdir());
    let run = home.sync(&[]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.starts_with("error: ")
            && run.stderr.contains("plugins.json' belongs to uid 4242424"),
        "{}",
        run.stderr
    );
    assert_eq!(tree_snapshot(&home.libdir()), before);
}

/// A-9, the adversarial script that found it: a hostile master's ~250 KiB
/// gzipped delta listing of 255 MiB of one-entry lines (`a {}`, then
/// `c 0 0`) announcing two entries is refused at the line past what it
/// announced (docs/protocol.md §7.5.2), under a 1 GiB address-space limit
/// and with a peak resident set under 512 MB: one line says why, the
/// whole listing is taken instead, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_of_a_quarter_gigabyte_of_lines_is_refused_in_bounded_memory() {
    // The peak is read by /usr/bin/time (Debian's `time`, which .ci/run installs).
    if pluginsync_tests::require(
        "time",
        "time",
        "a_delta_of_a_quarter_gigabyte_of_lines_is_refused_in_bounded_memory",
    )
    .is_none()
    {
        return;
    }
    use std::sync::Mutex;
    let pki = Pki::new();
    let base: &'static str = listing_json(&[("d", None, 0o755)]).leak();
    let base_tag = ETag::of_listing(base.as_bytes()).to_string();
    let root: &'static str = listing_json(&[]).leak();
    let root_tag = ETag::of_listing(root.as_bytes()).to_string();
    let head = format!(
        "pluginsync-listing-delta 1\nbase {base_tag}\netag \"{}\"\nentries 2\n",
        "0".repeat(40)
    );
    let n = (255usize << 20) / 5;
    let bombs: Vec<(&str, Vec<u8>)> = vec![
        ("a {}\n", gzip_lines(&head, "a {}\n", n, "end\n")),
        ("c 0 0\n", gzip_lines(&head, "c 0 0\n", n * 5 / 6, "end\n")),
    ];
    let bomb: Arc<Mutex<Vec<u8>>> = Arc::default();
    let serve = bomb.clone();
    let fake = FakeMaster::start_with_head(
        &pki,
        Arc::new(move |target: &str, head: &str| {
            let delta = head.to_ascii_lowercase().contains("x-pluginsync-delta: 1");
            let (body, tag) = match target {
                t if t.contains("/file_metadatas/plugins") => (base, base_tag.as_str()),
                t if t.contains("/file_metadatas/pluginfacts") => (root, root_tag.as_str()),
                _ => return http_response("404 Not Found", "text/plain", b"no"),
            };
            if delta && target.contains("/file_metadatas/plugins") {
                let gz = serve.lock().unwrap().clone();
                let ctype = protocol::DELTA_MEDIA_TYPE;
                let headers = [("Content-Type", ctype), ("Content-Encoding", "gzip")];
                return response_with("226 IM Used", &headers, &gz);
            }
            let headers = [("Content-Type", "application/json"), ("ETag", tag)];
            response_with("200 OK", &headers, body.as_bytes())
        }),
    );
    let home = AgentHome::new(&pki, &[fake.url()], "");
    let first = home.sync(&[]);
    assert_eq!(first.code, 0, "{first:?}");
    let before = tree_snapshot(&home.libdir());
    for (line, gz) in bombs {
        assert!(gz.len() < 1 << 20, "{line:?}: {} bytes gzipped", gz.len());
        *bomb.lock().unwrap() = gz;
        let m = home.sync_measured(&["--server", &fake.url(), "-v"], 1 << 30);
        assert_eq!(m.run.code, 0, "{line:?}: refused, not aborted: {:?}", m.run);
        assert!(m.peak < 512 << 20, "{line:?}: peak {} MB", m.peak >> 20);
        let said: Vec<&str> = (m.run.stderr.lines())
            .filter(|l| l.contains("delta listing not used"))
            .collect();
        assert_eq!(said.len(), 1, "{line:?}: {}", m.run.stderr);
        assert_eq!(tree_snapshot(&home.libdir()), before, "{line:?}");
    }
}
