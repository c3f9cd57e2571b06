//! Content, errors and security against a real master: exact bytes, Puppet's
//! error answers, traversal attempts, symlink escapes, missing and revoked
//! client certificates, authorization.

use pluginsync_common::urlpath::encode_path;
use pluginsync_tests::{
    ChainedClient, EnvTree, Pki, TestMaster, client, config_toml, dated_client_cert, h1_get,
    identity, parse_config, raw_get, refused, tls_config, tls_connect,
};

const SECRET: &str = "TOP-SECRET-OUTSIDE-THE-MODULE";

fn tree() -> EnvTree {
    let t = EnvTree::new();
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    t.file("production", "alpha", "lib/facter/bin.dat", &binary, 0o644);
    t.file(
        "production",
        "alpha",
        "lib/facter/with space ünï+x;y.rb",
        "odd name\n",
        0o644,
    );
    t.file(
        "production",
        "alpha",
        "lib/big.bin",
        vec![7u8; 600_000],
        0o644,
    );
    let outside = t.outside();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    t.symlink(
        "production",
        "alpha",
        "lib/facter/escape.rb",
        outside.join("secret.txt"),
    );
    t.symlink(
        "production",
        "alpha",
        "lib/facter/escape_rel.rb",
        "../../../../../outside/secret.txt",
    );
    t.symlink("production", "alpha", "lib/escape_dir", &outside);
    // Another module's lib: outside alpha's root even though inside the env.
    t.file("production", "beta", "lib/beta_only.rb", "beta\n", 0o644);
    t.symlink(
        "production",
        "alpha",
        "lib/into_beta.rb",
        "../../beta/lib/beta_only.rb",
    );
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_exact_and_errors_are_puppets() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let c = client(&pki, Some("node1"));
    let get = |path: String| {
        let c = c.clone();
        async move {
            let r = c
                .get(path)
                .header("Accept", "application/octet-stream")
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.headers().clone(),
                r.bytes().await.unwrap().to_vec(),
            )
        }
    };
    let base = format!("{}/puppet/v3/file_content/plugins", master.url());
    for rel in ["facter/bin.dat", "facter/with space ünï+x;y.rb", "big.bin"] {
        let (s, h, body) = get(format!(
            "{base}/{}?environment=production",
            encode_path(rel)
        ))
        .await;
        assert_eq!(s, 200, "{rel}");
        assert_eq!(h["content-type"], "application/octet-stream");
        let on_disk =
            std::fs::read(tree.module("production", "alpha").join("lib").join(rel)).unwrap();
        assert_eq!(body, on_disk, "{rel}");
    }
    // Unknown environment: 404 with Puppet's exact JSON body.
    let (s, h, body) = get(format!("{base}/big.bin?environment=nosuchenv")).await;
    assert_eq!(s, 404);
    assert_eq!(h["content-type"], "application/json; charset=utf-8");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"message":"Not Found: Could not find environment 'nosuchenv'","issue_kind":"RUNTIME_ERROR"}"#
    );
    // Bad and missing environment: 400.
    let (s, _, body) = get(format!("{base}/big.bin?environment=bad-name")).await;
    assert_eq!(s, 400);
    assert!(String::from_utf8_lossy(&body).contains("must be purely alphanumeric, not 'bad-name'"));
    assert_eq!(get(format!("{base}/big.bin")).await.0, 400);
    assert_eq!(
        get(format!("{base}/big.bin?environment=..%2F..%2Fetc"))
            .await
            .0,
        400
    );
    // Missing file, unknown mount, directory.
    assert_eq!(
        get(format!("{base}/nosuch.rb?environment=production"))
            .await
            .0,
        404
    );
    assert_eq!(
        get(format!(
            "{}/puppet/v3/file_content/modules/x?environment=production",
            master.url()
        ))
        .await
        .0,
        404
    );
    assert_eq!(
        get(format!("{base}/facter?environment=production")).await.0,
        404
    );
    // Content negotiation: JSON is not acceptable for content.
    let r = c
        .get(format!("{base}/big.bin?environment=production"))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 406);
    // Methods and bodies.
    let r = c
        .post(format!("{base}/big.bin?environment=production"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let r = c
        .get(format!("{base}/big.bin?environment=production"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    // Endpoints this master does not serve are 404, bodies or not (a stock
    // `puppet agent -t` POSTs its catalog request after pluginsync).
    let r = c
        .post(format!(
            "{}/puppet/v3/catalog/node1?environment=production",
            master.url()
        ))
        .body("facts")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.text().await.unwrap().contains("HANDLER_NOT_FOUND"));
    // Health check needs no certificate.
    let anon = client(&pki, None);
    let r = anon
        .get(format!("{}/status/v1/simple", master.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (200, "running".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_and_symlink_escapes_never_leak_a_byte() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let attempts = [
        (
            "/puppet/v3/file_content/plugins/../../../../../etc/passwd?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/facter/../../beta/lib/beta_only.rb?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/%2e%2e/%2e%2e/%2e%2e/outside/secret.txt?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/facter%2F..%2F..%2F..%2Foutside%2Fsecret.txt?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/./facter/bin.dat?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/facter%5C..%5Cx?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins/x%00y?environment=production",
            Some(400),
        ),
        (
            "/puppet/v3/file_content/plugins//etc/passwd?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/%2Fetc%2Fpasswd?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/facter/escape.rb?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/facter/escape_rel.rb?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/escape_dir/secret.txt?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/into_beta.rb?environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_metadata/plugins/facter/escape.rb?links=follow&environment=production",
            Some(404),
        ),
        (
            "/puppet/v3/file_content/plugins/big.bin?environment=../../../etc",
            Some(400),
        ),
        (
            "/puppet/v3/file_metadatas/plugins/../../x?recurse=true&environment=production",
            Some(400),
        ),
    ];
    for (target, want) in attempts {
        let r = raw_get(master.addr, &pki, Some("node1"), target)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            !body.contains(SECRET) && !body.contains("root:x:0"),
            "{target} leaked: {body}"
        );
        assert!((400..500).contains(&r.status), "{target}: {}", r.status);
        if let Some(w) = want {
            assert_eq!(r.status, w, "{target}: {body}");
        }
    }
    // The listing never offers an escaping link's content under follow, and
    // under manage shows it as a link without a checksum.
    let r = raw_get(
        master.addr,
        &pki,
        Some("node1"),
        "/puppet/v3/file_metadatas/plugins?recurse=true&links=follow&environment=production",
    )
    .await
    .unwrap();
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 200);
    for name in ["escape.rb", "escape_rel.rb", "escape_dir", "into_beta.rb"] {
        assert!(!body.contains(name), "{name} listed under follow");
    }
    let r = raw_get(
        master.addr,
        &pki,
        Some("node1"),
        "/puppet/v3/file_metadatas/plugins?recurse=true&links=manage&environment=production",
    )
    .await
    .unwrap();
    let entries: Vec<pluginsync_common::metadata::FileMetadata> =
        serde_json::from_slice(&r.body).unwrap();
    let esc = entries
        .iter()
        .find(|e| e.relative_path.as_deref() == Some("facter/escape.rb"))
        .unwrap();
    assert!(esc.checksum.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_checked() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let url = format!(
        "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
        master.url()
    );
    // No certificate: 403 with Puppet's body, on every file endpoint.
    let anon = client(&pki, None);
    let r = anon.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("\"issue_kind\":\"FAILED_AUTHORIZATION\"")
    );
    let r = anon
        .get(format!(
            "{}/puppet/v3/file_content/plugins/big.bin?environment=production",
            master.url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // A revoked certificate does not get past the handshake.
    let revoked = client(&pki, Some("revoked"));
    let err = revoked
        .get(&url)
        .send()
        .await
        .expect_err("revoked certificate refused");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    let raw = raw_get(master.addr, &pki, Some("revoked"), "/status/v1/simple").await;
    assert!(raw.is_err(), "revoked handshake must fail: {raw:?}");
    // A valid one works.
    assert_eq!(
        client(&pki, Some("node1"))
            .get(&url)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_rules_limit_environments() {
    let (tree, pki) = (tree(), Pki::new());
    tree.file("staging", "alpha", "lib/x.rb", "x\n", 0o644);
    let rules = "[[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\"]\n\
                 [[authorization]]\ncertname = \"node*\"\nenvironments = [\"stag*\"]\n";
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", rules)));
    let status = |who: &'static str, env: &'static str| {
        let c = client(&pki, Some(who));
        let url = format!(
            "{}/puppet/v3/file_metadatas/plugins?recurse=true&environment={env}",
            master.url()
        );
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("node1", "production").await, 200);
    assert_eq!(
        status("node1", "staging").await,
        403,
        "first matching rule decides"
    );
    assert_eq!(status("node2", "staging").await, 200);
    assert_eq!(status("node2", "production").await, 403);
    assert_eq!(
        status("node2", "nosuchenv").await,
        403,
        "existence is not revealed to the unauthorized"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_auth_required_refuses_anonymous_handshakes() {
    let (tree, pki) = (tree(), Pki::new());
    let cfg = config_toml(&tree.envpath(), &pki, "", "")
        .replace("[tls]\n", "[tls]\nclient_auth = \"required\"\n");
    let master = TestMaster::start(parse_config(&cfg));
    assert!(
        raw_get(master.addr, &pki, None, "/status/v1/simple")
            .await
            .is_err()
    );
    assert_eq!(
        raw_get(master.addr, &pki, Some("node2"), "/status/v1/simple")
            .await
            .unwrap()
            .status,
        200
    );
}

/// A certificate whose CN is not a valid Puppet certname (here: a newline
/// that would forge a log line) is no identity: its handshake succeeds (the
/// chain is valid) but every file endpoint answers 403, while the same
/// chain with a valid CN reads (docs/protocol.md §5.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cn_that_is_not_a_certname_is_no_identity() {
    let (tree, pki) = (tree(), Pki::new());
    let path = "/puppet/v3/file_metadatas/plugins?recurse=true&environment=production";
    let forged = ChainedClient::new(&pki, "node1\nINFO refused by [[authorization]]");
    let valid = ChainedClient::new(&pki, "node1");
    // Both intermediates have the same serial and key usage; one CRL bundle
    // per master run covers the chain being tested.
    for (chained, want) in [(&valid, 200), (&forged, 403)] {
        chained.write_crls(&pki, &pki.crl(), false);
        let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
        let tls = tls_config(&pki, Some(chained.identity()), &["http/1.1"]);
        let mut s = tls_connect(master.addr, tls).await.expect("handshake");
        let (status, _) = h1_get(&mut s, path).await.expect("an answer");
        assert_eq!(status, want);
    }
}

/// Puppet's intermediate-CA setups put the intermediate in `ca.pem` beside
/// the root, and the node presents its leaf alone. An intermediate the
/// root's CRL revokes takes its nodes with it even then: every CA of the
/// chain is checked against its issuer's CRL, not only the leaf
/// (docs/tls.md#revocation-and-intermediate-cas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_a_revoked_intermediate_in_ca_pem_is_refused() {
    let (tree, pki) = (tree(), Pki::new());
    let chained = ChainedClient::new(&pki, "chained1");
    let mut bundle = std::fs::read_to_string(pki.ca()).unwrap();
    bundle.push_str(&chained.intermediate_pem);
    std::fs::write(pki.ca(), bundle).unwrap();
    let config = config_toml(&tree.envpath(), &pki, "", "");
    let (chain, key) = chained.identity();
    let leaf_only = tls_config(&pki, Some((chain[..1].to_vec(), key)), &["http/1.1"]);
    let node1 = tls_config(&pki, Some(identity(&pki, "node1")), &["http/1.1"]);
    let path = "/puppet/v3/file_metadatas/plugins?recurse=true&environment=production";

    chained.write_crls(&pki, &pki.crl(), false);
    {
        let master = TestMaster::start(parse_config(&config));
        let mut s = tls_connect(master.addr, leaf_only.clone())
            .await
            .expect("handshake");
        let (status, _) = h1_get(&mut s, path).await.expect("an answer");
        assert_eq!(status, 200, "the leaf alone chains through ca.pem");
    }

    chained.write_crls(&pki, &pki.crl(), true);
    let master = TestMaster::start(parse_config(&config));
    assert!(
        refused(master.addr, leaf_only).await,
        "a node under a revoked intermediate in ca.pem must be refused"
    );
    assert!(!refused(master.addr, node1).await, "the root's own nodes");
}

/// The admin API knows the master's own certificate by its key, not by
/// its name: another certificate the CA issued under the master's
/// certname (here `localhost`) is refused like any name not in
/// `[admin] certnames` (docs/protocol.md §1.10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_knows_the_masters_certificate_by_its_key() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = dated_client_cert(&pki, "localhost", -1, 30, dir.path());
    let as_client = |cert: &std::path::Path, key: &std::path::Path| {
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        let ca = std::fs::read(pki.ca()).unwrap();
        reqwest::Client::builder()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).unwrap())
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap()
    };
    let url = format!(
        "{}/puppet-admin-api/v1/environment-cache?environment=production",
        master.url()
    );
    let status = |c: reqwest::Client| {
        let url = url.clone();
        async move { c.delete(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        status(as_client(&cert, &key)).await,
        403,
        "same name, another key"
    );
    let own = as_client(&pki.cert("localhost"), &pki.key("localhost"));
    assert_eq!(status(own).await, 204, "the master's own certificate");
}
