//! Certificate failures in words (`agent/src/certs.rs`,
//! docs/tls.md#certificate-checks): the agent names the cause of a failed
//! handshake in one line — its own certificate expired or not yet valid
//! (checked before connecting), the master does not trust its CA, the master's
//! certificate is not from `[tls] ca` — and warns before its certificate
//! expires.

use std::path::Path;

use pluginsync_tests::{EnvTree, Pki, TestMaster, config_toml, dated_client_cert, parse_config};

fn tree() -> EnvTree {
    let tree = EnvTree::new();
    tree.file("production", "m", "lib/facter/a.rb", b"a = 1\n", 0o644);
    tree
}

/// Runs `pluginsync-agent sync` against `url` with these TLS files; returns
/// (exit code, stderr).
fn sync(dir: &Path, url: &str, ca: &Path, cert: &Path, key: &Path) -> (i32, String) {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "servers = [{url:?}]\npuppet_conf = \"\"\nlibdir = \"lib\"\nvardir = \"var\"\ntimeout = \"20s\"\nretries = 1\n\
             [tls]\nca = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(pluginsync_tests::bin_path("pluginsync-agent"))
        .args(["sync", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The test master's config with this server certificate and key.
fn with_server_files(tree: &EnvTree, pki: &Pki, cert: &Path, key: &Path) -> String {
    config_toml(&tree.envpath(), pki, "", "")
        .replace(
            &format!("{:?}", pki.cert("localhost")),
            &format!("{cert:?}"),
        )
        .replace(&format!("{:?}", pki.key("localhost")), &format!("{key:?}"))
}

#[test]
fn each_certificate_failure_is_one_line_naming_its_cause() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let url = master.url();
    let other = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let expired = dated_client_cert(&pki, "expired", -30, -1, &certs);
    let early = dated_client_cert(&pki, "early", 2, 30, &certs);
    let cases: [(&str, &Path, &Path, &Path, &str); 4] = [
        ("expired", &pki.ca(), &expired.0, &expired.1, "expired on"),
        (
            "not yet valid",
            &pki.ca(),
            &early.0,
            &early.1,
            "is not valid until",
        ),
        (
            "another CA's node certificate",
            &pki.ca(),
            &other.cert("node1"),
            &other.key("node1"),
            "the master does not trust this node's certificate",
        ),
        (
            "a master from another CA",
            &other.ca(),
            &other.cert("node1"),
            &other.key("node1"),
            "the master's certificate is not issued by the CA of [tls] ca",
        ),
    ];
    for (what, ca, cert, key, want) in cases {
        let home = tempfile::tempdir().unwrap();
        let (code, err) = sync(home.path(), &url, ca, cert, key);
        assert_ne!(code, 0, "{what}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line: {err}");
        assert!(lines[0].contains(want), "{what}: {err}");
        assert!(
            !home.path().join("lib/facter").exists(),
            "{what}: nothing was synced"
        );
    }
}

#[test]
fn a_certificate_expiring_soon_is_warned_about_and_still_works() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let dir = tempfile::tempdir().unwrap();
    let soon = dated_client_cert(&pki, "node1", -1, 10, dir.path());
    let home = tempfile::tempdir().unwrap();
    let (code, err) = sync(home.path(), &master.url(), &pki.ca(), &soon.0, &soon.1);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("expires on") && err.contains("days)"), "{err}");
    assert!(home.path().join("lib/facter/a.rb").is_file());
}

/// `pluginsync-master check` fails (78) on an expired server certificate:
/// every agent would refuse it.
#[test]
fn check_fails_on_an_expired_server_certificate() {
    let (tree, pki) = (tree(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = dated_client_cert(&pki, "localhost", -30, -1, dir.path());
    let text = with_server_files(&tree, &pki, &cert, &key);
    let config = dir.path().join("master.toml");
    std::fs::write(&config, text).unwrap();
    let out = std::process::Command::new(pluginsync_tests::bin_path("pluginsync-master"))
        .args(["check", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("expired on"), "{err}");
}

/// The health check of a master whose served certificate every agent
/// refuses: 503 with the reason, so a balancer sends agents elsewhere.
/// Before, it answered `running` (200) with an expired certificate.
#[test]
fn the_health_check_is_unhealthy_while_the_server_certificate_is_out_of_date() {
    let (tree, pki) = (tree(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (name, from, until, reason) in [
        (
            "expired",
            -30,
            -1,
            "expired: the server certificate expired on ",
        ),
        (
            "early",
            2,
            30,
            "not yet valid: the server certificate is valid from ",
        ),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let (cert, key) = dated_client_cert(&pki, "localhost", from, until, &sub);
        let text = with_server_files(&tree, &pki, &cert, &key);
        let master = TestMaster::start(parse_config(&text));
        // A balancer's check that does not verify the certificate.
        let (code, body) = rt.block_on(async {
            let r = reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .timeout(std::time::Duration::from_secs(15))
                .build()
                .unwrap()
                .get(format!("{}/status/v1/simple", master.url()))
                .send()
                .await
                .expect("health check");
            (r.status().as_u16(), r.text().await.unwrap())
        });
        assert_eq!(code, 503, "{name}: {body}");
        assert!(
            body.starts_with(reason) && body.ends_with(" UTC; agents refuse it"),
            "{name}: {body}"
        );
    }
}

/// A master whose certificate is for another name: the line names both
/// names as an operator typed them, never rustls' `DnsName("…")` or
/// `IpAddress(…)` (docs/troubleshooting.md#a-certificate-is-refused-or-expires).
#[test]
fn a_master_certificate_for_another_name_names_both_names_plainly() {
    let (tree, pki) = (tree(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pluginsync_tests::server_cert_for(&pki, "puppet", dir.path());
    let text = with_server_files(&tree, &pki, &cert, &key);
    let master = TestMaster::start(parse_config(&text));
    let port = master.addr.port();
    for (url, asked) in [
        (format!("https://localhost:{port}"), "localhost"),
        (format!("https://127.0.0.1:{port}"), "127.0.0.1"),
    ] {
        let home = tempfile::tempdir().unwrap();
        let (code, err) = sync(
            home.path(),
            &url,
            &pki.ca(),
            &pki.cert("node1"),
            &pki.key("node1"),
        );
        assert_ne!(code, 0, "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains(&format!(
                "the master's certificate is not for {asked} (it names puppet)"
            )),
            "{err}"
        );
        assert!(
            !err.contains("DnsName(") && !err.contains("IpAddress("),
            "{err}"
        );
    }
}

/// A private key that is not the certificate's: the line names both files
/// and says so, in the agent and in the master (`serve` and `check`);
/// before, rustls' `keys may not be consistent: KeyMismatch`.
#[test]
fn a_key_that_does_not_match_its_certificate_names_both_files() {
    let (tree, pki) = (tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = tempfile::tempdir().unwrap();
    let (cert, key) = (pki.cert("node1"), pki.key("node2"));
    let (code, err) = sync(home.path(), &master.url(), &pki.ca(), &cert, &key);
    assert_ne!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let want = format!(
        "private key '{}' does not match certificate '{}'",
        key.display(),
        cert.display()
    );
    assert!(err.contains(&want), "agent: {err}");
    assert!(!err.contains("KeyMismatch"), "agent: {err}");

    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (pki.cert("localhost"), pki.key("node1"));
    let config = dir.path().join("master.toml");
    std::fs::write(&config, with_server_files(&tree, &pki, &cert, &key)).unwrap();
    let want = format!(
        "private key '{}' does not match certificate '{}'",
        key.display(),
        cert.display()
    );
    for command in ["check", "serve"] {
        let out = std::process::Command::new(pluginsync_tests::bin_path("pluginsync-master"))
            .args([command, "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{command}: {err}");
        assert!(err.contains(&want), "{command}: {err}");
        assert!(!err.contains("KeyMismatch"), "{command}: {err}");
    }
}

/// The master's line about a node whose certificate expired gives the
/// date, not rustls' seconds since 1970 (docs/tls.md#certificate-checks).
#[test]
fn the_masters_handshake_line_dates_an_expired_node_certificate() {
    let (tree, pki) = (tree(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.toml");
    std::fs::write(&config, config_toml(&tree.envpath(), &pki, "", "")).unwrap();
    let master = pluginsync_tests::ChildMaster::spawn(&config, None);
    let (cert, key) = dated_client_cert(&pki, "expired", -30, -1, dir.path());
    // A client that presents it anyway (the agent checks its own first).
    pluginsync_common::tls::install_default_provider();
    let mut pem = std::fs::read(&cert).unwrap();
    pem.extend(std::fs::read(&key).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let client = reqwest::Client::builder()
        .tls_certs_only(
            reqwest::Certificate::from_pem_bundle(&std::fs::read(pki.ca()).unwrap()).unwrap(),
        )
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .timeout(std::time::Duration::from_secs(15))
        .build()
        .unwrap();
    let url = format!("{}/status/v1/simple", master.url());
    assert!(rt.block_on(client.get(url).send()).is_err(), "refused");
    let mut line = None;
    for _ in 0..200 {
        line = master
            .log()
            .lines()
            .find(|l| l.contains("TLS handshake failed"))
            .map(str::to_owned);
        if line.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let line = line.unwrap_or_else(|| panic!("no handshake line: {}", master.log()));
    let expired_on = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    assert!(
        line.contains(&format!("expired on {}", expired_on.date())) && line.contains(" UTC"),
        "{line}"
    );
    assert!(!line.contains("(UNIX)"), "{line}");
}
