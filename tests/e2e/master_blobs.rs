//! Content-addressed blobs (docs/protocol.md §7): advertised on listings, served
//! by sha256 with an immutable cache policy, only to authenticated clients
//! and only from environments they may read.

use pluginsync_common::protocol;
use pluginsync_tests::{EnvTree, Pki, TestMaster, client, config_toml, parse_config, sha256_hex};

use crate::common::{entry, listing, pluginsync_query};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_serve_listed_content_by_checksum() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let big: Vec<u8> = (0..400_000u32).map(|i| (i % 251) as u8).collect();
    tree.file("production", "alpha", "lib/facter/a.rb", "alpha\n", 0o644);
    tree.file("production", "alpha", "lib/big.bin", &big, 0o644);
    tree.file("production", "alpha", "facts.d/f.txt", "f=1\n", 0o644);
    tree.file(
        "restricted",
        "alpha",
        "lib/only_here.rb",
        "restricted content\n",
        0o644,
    );
    let rules = "[[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\"]\n\
                 [[authorization]]\ncertname = \"*\"\nenvironments = [\"*\"]\n";
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let c = client(&pki, Some("node1"));
    let (status, headers, entries) = listing(
        &c,
        &master.url(),
        "plugins",
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    assert_eq!(status, 200);
    let prefix = headers[protocol::HEADER_BLOBS].to_str().unwrap().to_owned();
    assert_eq!(prefix, protocol::BLOB_PREFIX);

    let get = |url: String, c: reqwest::Client| async move {
        let r = c.get(url).send().await.unwrap();
        (
            r.status().as_u16(),
            r.headers().clone(),
            r.bytes().await.unwrap().to_vec(),
        )
    };
    for (rel, bytes) in [
        ("facter/a.rb", b"alpha\n".to_vec()),
        ("big.bin", big.clone()),
    ] {
        let value = entry(&entries, rel)
            .unwrap()
            .checksum
            .clone()
            .unwrap()
            .value;
        let hex = value.strip_prefix("{sha256}").unwrap();
        let (s, h, body) = get(format!("{}{prefix}{hex}", master.url()), c.clone()).await;
        assert_eq!(s, 200, "{rel}");
        assert_eq!(body, bytes, "{rel}");
        // `[[authorization]]` rules are configured: no shared cache may keep
        // it (docs/protocol.md §7.4).
        assert_eq!(h["cache-control"], "private, max-age=31536000, immutable");
        assert_eq!(h["etag"].to_str().unwrap(), format!("\"{hex}\""));
        let r = c
            .get(format!("{}{prefix}{hex}", master.url()))
            .header("If-None-Match", format!("\"{hex}\""))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 304);
    }
    // pluginfacts content is reachable the same way.
    let f = sha256_hex(b"f=1\n");
    assert_eq!(
        get(format!("{}{prefix}{f}", master.url()), c.clone())
            .await
            .0,
        200
    );

    // Unknown, malformed, anonymous, and not-allowed-for-this-client.
    let unknown = sha256_hex(b"nothing has this content");
    assert_eq!(
        get(format!("{}{prefix}{unknown}", master.url()), c.clone())
            .await
            .0,
        404
    );
    assert_eq!(
        get(format!("{}{prefix}ABC", master.url()), c.clone())
            .await
            .0,
        400
    );
    let upper = sha256_hex(b"alpha\n").to_uppercase();
    assert_eq!(
        get(format!("{}{prefix}{upper}", master.url()), c.clone())
            .await
            .0,
        400
    );
    let a = sha256_hex(b"alpha\n");
    assert_eq!(
        get(format!("{}{prefix}{a}", master.url()), client(&pki, None))
            .await
            .0,
        403
    );
    let restricted = sha256_hex(b"restricted content\n");
    assert_eq!(
        get(format!("{}{prefix}{restricted}", master.url()), c.clone())
            .await
            .0,
        404,
        "node1 may not read 'restricted'"
    );
    assert_eq!(
        get(
            format!("{}{prefix}{restricted}", master.url()),
            client(&pki, Some("node2"))
        )
        .await
        .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_stream_frames_in_order_and_mark_the_missing() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let big: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
    tree.file("production", "alpha", "lib/a.rb", "alpha\n", 0o644);
    tree.file("production", "alpha", "lib/big.bin", &big, 0o644);
    tree.file("restricted", "alpha", "lib/r.rb", "restricted\n", 0o644);
    let rules = "[[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\"]\n";
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let c = client(&pki, Some("node1"));
    let (a, b) = (sha256_hex(b"alpha\n"), sha256_hex(&big));
    let (unknown, restricted) = (sha256_hex(b"nope"), sha256_hex(b"restricted\n"));
    let url = format!(
        "{}{}?sha256={b}&sha256={unknown}&sha256={a}&sha256={restricted}",
        master.url(),
        protocol::BATCH_PATH
    );
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], protocol::BLOBS_MEDIA_TYPE);
    let body = r.bytes().await.unwrap().to_vec();
    let mut want = format!("{b} {}\n", big.len()).into_bytes();
    want.extend_from_slice(&big);
    want.extend_from_slice(format!("{unknown} -\n{a} 6\nalpha\n{restricted} -\n").as_bytes());
    assert!(
        body == want,
        "frames differ ({} bytes vs {})",
        body.len(),
        want.len()
    );

    let status = |u: String, c: reqwest::Client| async move {
        c.get(u).send().await.unwrap().status().as_u16()
    };
    assert_eq!(
        status(
            format!("{}{}", master.url(), protocol::BATCH_PATH),
            c.clone()
        )
        .await,
        400
    );
    assert_eq!(
        status(
            format!("{}{}?sha256=XYZ", master.url(), protocol::BATCH_PATH),
            c.clone()
        )
        .await,
        400
    );
    let too_many: Vec<String> = (0..129).map(|_| format!("sha256={a}")).collect();
    assert_eq!(
        status(
            format!(
                "{}{}?{}",
                master.url(),
                protocol::BATCH_PATH,
                too_many.join("&")
            ),
            c.clone()
        )
        .await,
        400
    );
    assert_eq!(status(url, client(&pki, None)).await, 403);
}

/// A blob is read from the generation store's copy (docs/deploys.md#generations),
/// not from the environment's tree: a file changed in the tree since it was
/// indexed is still answered, whole and as indexed, singly and in a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_come_from_the_generation_store_not_the_tree() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    tree.file("production", "alpha", "lib/a.rb", "alpha\n", 0o644);
    tree.file("production", "alpha", "lib/big.bin", &big, 0o644);
    // Frozen: nothing re-indexes the tree once it changes.
    let frozen = "[index]\nwatch = false\nrescan_interval = \"0s\"\n";
    let master = TestMaster::start(parse_config(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        frozen,
    )));
    let c = client(&pki, Some("node1"));
    let (a, b) = (sha256_hex(b"alpha\n"), sha256_hex(&big));
    // Both listed, so both indexed and stored.
    let (status, _, entries) = listing(
        &c,
        &master.url(),
        "plugins",
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(entry(&entries, "a.rb").is_some() && entry(&entries, "big.bin").is_some());
    tree.file(
        "production",
        "alpha",
        "lib/a.rb",
        "changed in the tree\n",
        0o644,
    );
    tree.file("production", "alpha", "lib/big.bin", b"shrunk", 0o644);

    let url = format!(
        "{}{}?sha256={a}&sha256={b}",
        master.url(),
        protocol::BATCH_PATH
    );
    let body = c.get(&url).send().await.unwrap().bytes().await.unwrap();
    let mut want = format!("{a} 6\nalpha\n{b} {}\n", big.len()).into_bytes();
    want.extend_from_slice(&big);
    assert!(
        body.as_ref() == want.as_slice(),
        "the batch is not the stored content"
    );
    for (hex, bytes) in [(&a, b"alpha\n".to_vec()), (&b, big.clone())] {
        let url = format!("{}{}{hex}", master.url(), protocol::BLOB_PREFIX);
        let r = c.get(url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.bytes().await.unwrap().as_ref() == bytes.as_slice());
    }
}
