//! The master's Prometheus metrics (`master/src/metrics.rs`,
//! docs/operating.md#master-metrics) against the real binary: the counters move
//! as the traffic says (N requests made, N read), failed TLS handshakes are
//! counted by reason and logged, and Debian's `promtool check metrics` accepts
//! the exposition.

use std::time::Duration;

use pluginsync_tests::{
    ChildMaster, EnvTree, Pki, client, config_file, config_toml, dated_client_cert, identity,
    promtool_accepts, tls_config, tls_connect,
};

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_traffic_and_promtool_accepts_them() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    let content = b"Facter.add(:x) { setcode { 1 } }\n";
    tree.file("production", "m", "lib/facter/x.rb", content, 0o644);
    tree.file("production", "m", "facts.d/y.txt", b"y=1\n", 0o644);
    let (dir, cfg) = config_file(&config_toml(
        &tree.envpath(),
        &pki,
        "",
        "[metrics]\nlisten = \"127.0.0.1:0\"\n",
    ));
    let master = ChildMaster::spawn(&cfg, None);
    let mut metrics_url = None;
    for _ in 0..200 {
        metrics_url = master
            .log()
            .lines()
            .find_map(|l| Some(l.split("metrics on ").nth(1)?.trim().to_owned()));
        if metrics_url.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let metrics_url = metrics_url.expect("the master logs its metrics address");

    const LISTINGS: usize = 7;
    const CONTENTS: usize = 3;
    const ANONYMOUS: usize = 2;
    let node = client(&pki, Some("node1"));
    let listing = format!(
        "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
        master.url()
    );
    for _ in 0..LISTINGS {
        assert_eq!(node.get(&listing).send().await.unwrap().status(), 200);
    }
    let content_url = format!(
        "{}/puppet/v3/file_content/plugins/facter/x.rb?environment=production",
        master.url()
    );
    for _ in 0..CONTENTS {
        let r = node.get(&content_url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.bytes().await.unwrap().as_ref(), content);
    }
    let anon = client(&pki, None);
    for _ in 0..ANONYMOUS {
        assert_eq!(anon.get(&listing).send().await.unwrap().status(), 403);
    }
    // Handshakes the master refuses: a revoked certificate, and one from
    // another CA.
    let revoked = tls_config(&pki, Some(identity(&pki, "revoked")), &["http/1.1"]);
    let other = Pki::new();
    let foreign = tls_config(&pki, Some(identity(&other, "node1")), &["http/1.1"]);
    let dated = |name: &str, from: i64, until: i64| {
        use rustls_pki_types::pem::PemObject;
        let (cert, key) = dated_client_cert(&pki, name, from, until, dir.path());
        let chain = rustls_pki_types::CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
        tls_config(&pki, Some((chain, key)), &["http/1.1"])
    };
    let expired = dated("expired", -30, -1);
    let early = dated("early", 2, 30);
    for tls in [revoked, foreign, expired, early] {
        if let Ok(mut s) = tls_connect(master.addr, tls).await {
            // TLS 1.3: the client learns of the refusal on its first read.
            let _ = pluginsync_tests::h1_get(&mut s, "/status/v1/simple").await;
        }
    }

    let mut text = String::new();
    for _ in 0..100 {
        text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metric(
            &text,
            "pluginsync_master_tls_handshake_failures_total{reason=\"unknown_ca\"}",
        )
        .is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let count = |series: &str| metric(&text, series).unwrap_or_else(|| panic!("{series}:\n{text}"));
    assert_eq!(
        count("pluginsync_master_http_requests_total{endpoint=\"file_metadatas\",code=\"200\"}"),
        LISTINGS as f64
    );
    assert_eq!(
        count("pluginsync_master_http_requests_total{endpoint=\"file_content\",code=\"200\"}"),
        CONTENTS as f64
    );
    assert_eq!(
        count("pluginsync_master_http_requests_total{endpoint=\"file_metadatas\",code=\"403\"}"),
        ANONYMOUS as f64
    );
    assert_eq!(
        count("pluginsync_master_http_response_bytes_total{endpoint=\"file_content\"}"),
        (CONTENTS * content.len()) as f64
    );
    assert_eq!(
        count("pluginsync_master_http_request_duration_seconds_count{endpoint=\"file_metadatas\"}"),
        (LISTINGS + ANONYMOUS) as f64
    );
    assert_eq!(
        count("pluginsync_master_authorization_refusals_total"),
        ANONYMOUS as f64
    );
    assert_eq!(
        count("pluginsync_master_tls_handshake_failures_total{reason=\"certificate_revoked\"}"),
        1.0
    );
    assert_eq!(
        count("pluginsync_master_tls_handshake_failures_total{reason=\"unknown_ca\"}"),
        1.0
    );
    assert_eq!(
        count("pluginsync_master_tls_handshake_failures_total{reason=\"certificate_expired\"}"),
        1.0
    );
    assert_eq!(
        count(
            "pluginsync_master_tls_handshake_failures_total{reason=\"certificate_not_yet_valid\"}"
        ),
        1.0
    );
    assert_eq!(
        count("pluginsync_master_index_files{environment=\"production\",mount=\"plugins\"}"),
        1.0
    );
    assert!(count("pluginsync_master_index_builds_total{environment=\"production\"}") >= 1.0);
    assert!(count("pluginsync_master_server_certificate_expiry_timestamp_seconds") > 1.7e9);
    assert!(count("pluginsync_master_crl_next_update_timestamp_seconds") > 1.7e9);
    assert!(
        master.log().contains("TLS handshake failed"),
        "failed handshakes are logged: {}",
        master.log()
    );

    promtool_accepts(&text, "master_metrics");
}
