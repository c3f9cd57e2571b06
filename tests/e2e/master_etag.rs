//! ETags across replicas (docs/protocol.md §6.1): two master
//! processes on the same tree give the same ETag, `If-None-Match` gives a
//! 304 from either, a changed tree gives a new ETag; gzip when asked.

use std::io::Read;
use std::time::Duration;

use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, config_file, config_toml, wait_for};

/// The agent's own listing query, with Puppet's default ignores.
fn q() -> String {
    let ignore = pluginsync_common::DEFAULT_IGNORE.map(str::to_owned);
    pluginsync_common::protocol::ListingQuery {
        environment: "production",
        source_permissions: "use",
        ignore: &ignore,
    }
    .to_query()
}

async fn get(
    c: &reqwest::Client,
    base: &str,
    inm: Option<&str>,
    gzip: bool,
) -> (u16, Option<String>, Vec<u8>, Option<String>) {
    let mut r = c
        .get(format!("{base}/puppet/v3/file_metadatas/plugins?{}", q()))
        .header("Accept", "application/json");
    if let Some(tag) = inm {
        r = r.header("If-None-Match", tag);
    }
    if gzip {
        r = r.header("Accept-Encoding", "gzip;q=1.0,deflate;q=0.6,identity;q=0.3");
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let etag = resp
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_owned());
    let enc = resp
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, etag, resp.bytes().await.unwrap().to_vec(), enc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_etags_and_revalidate_each_others() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let files = tree.generate("production", 6, 25, 9);
    let (_dir, cfg) = config_file(&config_toml(&tree.envpath(), &pki, "", ""));
    let (a, b) = (MasterProcess::spawn(&cfg), MasterProcess::spawn(&cfg));
    assert_ne!(a.addr, b.addr);
    let c = client(&pki, Some("node1"));

    let (sa, ea, body_a, _) = get(&c, &a.url(), None, false).await;
    let (sb, eb, body_b, _) = get(&c, &b.url(), None, false).await;
    assert_eq!((sa, sb), (200, 200));
    assert_eq!(body_a, body_b, "same tree, same body");
    let etag = ea.clone().unwrap();
    assert_eq!(ea, eb, "same tree, same ETag on both replicas");

    // A 304 from either replica, for the other's ETag.
    let (s, e, body, _) = get(&c, &b.url(), Some(&etag), false).await;
    assert_eq!((s, e.as_deref(), body.len()), (304, Some(etag.as_str()), 0));
    assert_eq!(
        get(&c, &a.url(), Some("\"something-else\""), false).await.0,
        200
    );

    // gzip when asked: a distinct representation tag, same content, and the
    // plain ETag still revalidates it.
    let (s, gz_tag, gz, enc) = get(&c, &a.url(), None, true).await;
    assert_eq!((s, enc.as_deref()), (200, Some("gzip")));
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, body_a);
    assert_ne!(gz_tag.as_deref(), Some(etag.as_str()));
    assert_eq!(get(&c, &a.url(), Some(&etag), true).await.0, 304);

    // A change gives a new ETag, and both replicas converge on it.
    std::fs::write(&files[3], "# changed\n").unwrap();
    let converged = wait_for(Duration::from_secs(5), || {
        let (c, ua, ub, old) = (c.clone(), a.url(), b.url(), etag.clone());
        async move {
            let ta = get(&c, &ua, None, false).await.1?;
            let tb = get(&c, &ub, None, false).await.1?;
            (ta != old && ta == tb).then_some(ta)
        }
    })
    .await;
    let new_tag = converged.expect("both replicas serve a new, identical ETag");
    assert_eq!(
        get(&c, &a.url(), Some(&etag), false).await.0,
        200,
        "the old ETag no longer matches"
    );
    assert_eq!(get(&c, &b.url(), Some(&new_tag), false).await.0, 304);
}
