//! The master's data path under hostile requests and hostile trees (issue
//! 17): odd listing parameters cannot evict the standard listings
//! (docs/protocol.md §6.1), checksums of any type are read only from the
//! indexed inode, never through a symlink or from a fifo swapped in
//! (§1.4, §1.7 step 12), batches send each distinct blob once and stay
//! within a byte bound (§7.2), and blobs are `private` whenever
//! `[[authorization]]` rules restrict who reads what (§7.4).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStderr, ExitStatus};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{self, FrameDecoder, FrameEvent};
use pluginsync_master::handlers::blobs::BATCH_MAX_BYTES;
use pluginsync_tests::{
    EnvTree, MasterProcess, Pki, TestMaster, client, config_file, config_toml, parse_config,
    sha256_hex, wait_ready,
};

use crate::common::{listing, pluginsync_query};

/// `[index]` for tests that change files under a running master: no
/// watcher, no rescan, so the index keeps describing the old files.
const FROZEN_INDEX: &str = "[index]\nwatch = false\nrescan_interval = \"0s\"\n";

/// GETs `url` accepting anything; status, headers, body.
async fn get(c: &reqwest::Client, url: &str) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let r = c
        .get(url)
        .header("Accept", "*/*")
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.bytes().await.expect("body").to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_listing_parameters_never_evict_the_standard_listing() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.generate("production", 3, 5, 17);
    // A cache of 4: the 4 standard listings alone would fill it.
    let master = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[index]\ncached_responses = 4\n",
    )));
    let c = client(&pki, Some("node1"));
    let stats = &master.store.stats;
    let standard = pluginsync_query("use", "follow", "production");
    let (status, headers, first) = listing(&c, &master.url(), "plugins", &standard).await;
    assert_eq!(status, 200);
    let etag = headers["etag"].clone();
    // One odd parameter set used over and over: the LRU keeps it.
    let recurring = "recurse=true&ignore=recurring&environment=production";
    for i in 0..20u32 {
        let odd = format!(
            "recurse=true&recurselimit={}&ignore=odd{i}&links=manage&environment=production",
            i + 1
        );
        for q in [odd.as_str(), recurring, standard.as_str()] {
            let (status, headers, _) = listing(&c, &master.url(), "plugins", q).await;
            assert_eq!(status, 200, "{q}");
            if q == standard {
                assert_eq!(headers["etag"], etag);
            }
        }
    }
    let (status, _, last) = listing(&c, &master.url(), "plugins", &standard).await;
    assert_eq!((status, last.len()), (200, first.len()));
    // Serialised on the request path: the 20 odd sets and the recurring one
    // once; never the standard listing (pinned by the index build).
    assert_eq!(stats.listings_serialised.load(SeqCst), 21);
    // From the cache: the standard listing 22 times, the recurring set 19.
    assert_eq!(stats.listing_cache_hits.load(SeqCst), 22 + 19);
}

/// Every digest type read from disk, and its value for `bytes`.
fn other_digests(bytes: &[u8]) -> Vec<(ChecksumType, String)> {
    use ChecksumType::*;
    [
        Md5, Md5Lite, Sha1, Sha1Lite, Sha224, Sha384, Sha512, Sha256Lite,
    ]
    .into_iter()
    .map(|t| (t, t.digest_reader(bytes).expect("digest")))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksums_of_a_file_swapped_for_a_symlink_never_read_its_target() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let swapped = tree.file("production", "m", "lib/facter/a.rb", "alpha\n", 0o644);
    tree.file("production", "m", "lib/facter/b.rb", "beta\n", 0o644);
    let secret = tree.outside().join("secret.key");
    std::fs::write(&secret, "-----BEGIN PRIVATE KEY-----\nsecret\n").unwrap();
    let master = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        FROZEN_INDEX,
    )));
    let c = client(&pki, Some("node1"));
    // Indexed as a file, now a symlink to a file outside every module.
    std::fs::remove_file(&swapped).unwrap();
    std::os::unix::fs::symlink(&secret, &swapped).unwrap();
    let leaks = other_digests(&std::fs::read(&secret).unwrap());
    let base = format!("{}/puppet/v3", master.url());
    for (ty, leak) in &leaks {
        for url in [
            format!(
                "{base}/file_metadatas/plugins?recurse=true&links=follow&checksum_type={ty}&environment=production"
            ),
            format!(
                "{base}/file_metadatas/plugins?recurse=true&links=manage&checksum_type={ty}&environment=production"
            ),
            format!(
                "{base}/file_metadata/plugins/facter/a.rb?links=follow&checksum_type={ty}&environment=production"
            ),
        ] {
            let (status, headers, body) = get(&c, &url).await;
            let text = String::from_utf8_lossy(&body);
            let hex = leak.split('}').nth(1).unwrap();
            assert!(
                !text.contains(hex),
                "{ty} of the secret leaked: {url}\n{text}"
            );
            assert_eq!(status, 503, "{url}: {text}");
            assert_eq!(headers["retry-after"], "1", "{url}");
        }
        // The unchanged file still gets its checksum of that type.
        let (status, _, body) = get(
            &c,
            &format!(
                "{base}/file_metadata/plugins/facter/b.rb?checksum_type={ty}&environment=production"
            ),
        )
        .await;
        assert_eq!(status, 200);
        let want = ty.digest_reader(&b"beta\n"[..]).unwrap();
        assert!(
            String::from_utf8_lossy(&body).contains(&want),
            "{ty}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

/// Starts the master binary; returns it and its address (its log is read
/// to the "listening on" line, then by a thread to its end).
fn spawn(config: &Path) -> (Child, SocketAddr) {
    let mut child = MasterProcess::command(config)
        .spawn()
        .expect("spawn master");
    let mut log: BufReader<ChildStderr> = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    for _ in 0..100 {
        line.clear();
        if log.read_line(&mut line).expect("read the master's log") == 0 {
            break;
        }
        if let Some(addr) = line.split("listening on ").nth(1) {
            let addr = addr.trim().parse().expect("address");
            std::thread::spawn(move || log.lines().map_while(Result::ok).for_each(drop));
            return (child, addr);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("master did not start; last line: {line}");
}

/// Waits up to `limit` for `child` to exit; kills it after.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksums_of_a_file_swapped_for_a_fifo_answer_and_sigterm_still_stops() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let swapped = tree.file("production", "m", "lib/facter/a.rb", "alpha\n", 0o644);
    let (_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", FROZEN_INDEX));
    let (mut master, addr) = spawn(&cfg);
    // Swapped once the file is indexed (the master listens first, then
    // indexes `production`), so the index holds the regular file.
    let c = client(&pki, Some("node1"));
    wait_ready(&c, &format!("https://localhost:{}", addr.port())).await;
    std::fs::remove_file(&swapped).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &swapped,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    let base = format!("https://localhost:{}/puppet/v3", addr.port());
    for url in [
        format!(
            "{base}/file_metadatas/plugins?recurse=true&checksum_type=md5&environment=production"
        ),
        format!(
            "{base}/file_metadata/plugins/facter/a.rb?checksum_type=sha1&environment=production"
        ),
        format!("{base}/file_content/plugins/facter/a.rb?environment=production"),
    ] {
        // Bounded: a reader blocked on the fifo would never answer.
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            c.get(&url).header("Accept", "*/*").send(),
        )
        .await;
        let status = match answer {
            Ok(Ok(r)) => r.status().as_u16(),
            Ok(Err(e)) => panic!("{url}: {e}"),
            Err(_) => {
                let _ = master.kill();
                let _ = master.wait();
                panic!("{url}: no answer, a thread is blocked on the fifo");
            }
        };
        assert_eq!(status, 503, "{url}");
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&master),
        rustix::process::Signal::TERM,
    )
    .expect("send SIGTERM");
    let status = wait_exit(&mut master, Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "the master did not stop on SIGTERM: {status:?}"
    );
}

/// The frames of a batch answer, decoded as the agent does: per digest,
/// `Some(bytes)` or `None` for a missing frame, in the order received.
fn frames(body: &[u8]) -> Vec<(Sha256, Option<Vec<u8>>)> {
    let mut decoder = FrameDecoder::new();
    decoder.feed(body);
    let mut out = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    while let Some(event) = decoder.next_event().expect("well-formed frames") {
        match event {
            FrameEvent::Missing(d) => out.push((d, None)),
            FrameEvent::Begin { .. } => current = Some(Vec::new()),
            FrameEvent::Data(b) => current.as_mut().expect("in a frame").extend_from_slice(b),
            FrameEvent::End(d) => out.push((d, current.take())),
        }
    }
    decoder.finish().expect("no partial frame");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_send_each_distinct_blob_once_within_a_byte_bound() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let one: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 241) as u8).collect();
    tree.file("production", "m", "lib/one.bin", &one, 0o644);
    // Three blobs of 6 MiB (18 MiB together, over the bound) and a small one.
    let big = 6usize << 20;
    assert!(3 * big as u64 > BATCH_MAX_BYTES && 2 * big as u64 <= BATCH_MAX_BYTES);
    let bigs: Vec<Vec<u8>> = (0..3u8)
        .map(|k| (0..big).map(|i| (i % 251) as u8 ^ k).collect())
        .collect();
    for (k, b) in bigs.iter().enumerate() {
        tree.file("production", "m", &format!("lib/big{k}.bin"), b, 0o644);
    }
    tree.file("production", "m", "lib/small.rb", "small\n", 0o644);
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let c = client(&pki, Some("node1"));
    let batch = |digests: Vec<String>| {
        let query: Vec<String> = digests.iter().map(|d| format!("sha256={d}")).collect();
        format!(
            "{}{}?{}",
            master.url(),
            protocol::BATCH_PATH,
            query.join("&")
        )
    };

    // 128 times the same digest: one frame, one blob's bytes.
    let sent = master.store.stats.contents_sent.load(SeqCst);
    let (status, _, body) = get(&c, &batch(vec![sha256_hex(&one); protocol::MAX_BATCH])).await;
    assert_eq!(status, 200);
    assert!(
        body.len() < one.len() + protocol::MAX_FRAME_HEADER,
        "{} bytes for one blob of {}",
        body.len(),
        one.len()
    );
    let got = frames(&body);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.as_deref(), Some(&one[..]));
    assert_eq!(master.store.stats.contents_sent.load(SeqCst), sent + 1);

    // Over the bound: the blob that would pass it is a missing frame, the
    // small one after it still fits.
    let mut want: Vec<String> = bigs.iter().map(|b| sha256_hex(b)).collect();
    want.push(sha256_hex(b"small\n"));
    let (status, _, body) = get(&c, &batch(want.clone())).await;
    assert_eq!(status, 200);
    let got = frames(&body);
    let carried: usize = got
        .iter()
        .filter_map(|(_, b)| b.as_ref())
        .map(Vec::len)
        .sum();
    assert!(
        carried as u64 <= BATCH_MAX_BYTES,
        "{carried} bytes of blobs"
    );
    assert!(body.len() < BATCH_MAX_BYTES as usize + big + 4 * protocol::MAX_FRAME_HEADER);
    let summary: Vec<(String, Option<usize>)> = got
        .iter()
        .map(|(d, b)| (d.to_string(), b.as_ref().map(Vec::len)))
        .collect();
    assert_eq!(
        summary,
        vec![
            (want[0].clone(), Some(big)),
            (want[1].clone(), Some(big)),
            (want[2].clone(), None),
            (want[3].clone(), Some(6)),
        ]
    );
    for (d, b) in &got {
        if let Some(b) = b {
            assert_eq!(&sha256_hex(b), &d.to_string(), "bytes match their digest");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_private_under_authorization_rules_and_public_without() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/a.rb", "alpha\n", 0o644);
    let url = |m: &TestMaster| {
        format!(
            "{}{}{}",
            m.url(),
            protocol::BLOB_PREFIX,
            sha256_hex(b"alpha\n")
        )
    };
    let c = client(&pki, Some("node1"));
    let open = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let (status, headers, _) = get(&c, &url(&open)).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["cache-control"],
        "public, max-age=31536000, immutable"
    );
    drop(open);
    let rules = "[[authorization]]\ncertname = \"*\"\nenvironments = [\"*\"]\n";
    let ruled = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let (status, headers, _) = get(&c, &url(&ruled)).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["cache-control"],
        "private, max-age=31536000, immutable"
    );
}
