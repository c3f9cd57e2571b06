//! The master's TLS sessions (docs/tls.md#session-resumption) against the
//! real binary:
//!
//! 1. a client that connects again with the same client config resumes its
//!    session (rustls' handshake kind on both sides, and the master's
//!    `pluginsync_master_tls_handshakes_total{kind="resumed"}`), with the
//!    client identity of its full handshake (a listing answers 200, not
//!    403); after a SIGHUP (new TLS config) or a restart the stored session
//!    is refused and a full handshake follows: the sessions live in the
//!    master's memory only;
//! 2. an agent whose connection is cut mid-run reconnects within the run
//!    with a resumed session (its second connection to the same master);
//!    a ticket is used once, so of the connections it opens at once after
//!    the cut, as many resume as it holds tickets and the rest are full;
//! 3. a master whose P-256 key was made by `pluginsync-master csr` and
//!    signed by a real Puppet Server 7 CA serves a stock `puppet plugin
//!    download` and `pluginsync-agent sync` holding that CA's RSA node
//!    certificates (skipped with a SKIPPED line where `puppet` or
//!    `puppetserver` is missing, never under CI).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pluginsync_tests::puppet::{PuppetAgent, PuppetServer, gen_tree};
use pluginsync_tests::{
    AgentHome, ChildMaster, CutProxy, EnvTree, Lcg, Pki, bin_path, config_toml, h1_get, identity,
    require, tls_config, tls_connect, tree_snapshot,
};
use rustls::HandshakeKind;

/// `pluginsync_master_tls_handshakes_total{kind="<kind>"}` now (0 when the
/// series is not there yet).
fn handshakes(metrics: SocketAddr, kind: &str) -> u64 {
    let mut s = std::net::TcpStream::connect(metrics).expect("metrics port");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("metrics request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics answer");
    let series = format!("pluginsync_master_tls_handshakes_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
        .unwrap_or(0)
}

/// The regular files under `dir` and their SHA-256, without modes.
fn contents(dir: &Path) -> Vec<(String, String)> {
    tree_snapshot(dir)
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.strip_prefix("file ")?.split(' ').nth(1)?.to_owned())))
        .collect()
}

fn master_config(dir: &Path, tree: &EnvTree, pki: &Pki) -> std::path::PathBuf {
    let cfg = dir.join("master.toml");
    std::fs::write(
        &cfg,
        config_toml(
            &tree.envpath(),
            pki,
            "",
            "[metrics]\nlisten = \"127.0.0.1:0\"\n",
        ),
    )
    .unwrap();
    cfg
}

/// Connects with `client`, asks for the plugins listing (so the client also
/// reads the session tickets that follow the handshake); the handshake kind
/// and the status.
async fn connect_and_list(
    addr: SocketAddr,
    client: &std::sync::Arc<rustls::ClientConfig>,
) -> (Option<HandshakeKind>, u16) {
    let mut s = tls_connect(addr, client.clone()).await.expect("handshake");
    let kind = s.get_ref().1.handshake_kind();
    let (status, _) = h1_get(
        &mut s,
        "/puppet/v3/file_metadatas/plugins?recurse=true&environment=production",
    )
    .await
    .expect("listing");
    (kind, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_resumes_and_a_reload_or_a_restart_forgets_every_ticket() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "m", "lib/facter/x.rb", b"x\n", 0o644);
    let dir = tempfile::tempdir().unwrap();
    let cfg = master_config(dir.path(), &tree, &pki);
    let master = ChildMaster::spawn(&cfg, None);
    let metrics = master.metrics_addr();
    // One client config: its session cache is what a process keeps.
    let client = tls_config(&pki, Some(identity(&pki, "node1")), &["http/1.1"]);

    let first = connect_and_list(master.addr, &client).await;
    assert_eq!(first, (Some(HandshakeKind::Full), 200));
    let second = connect_and_list(master.addr, &client).await;
    assert_eq!(
        second,
        (Some(HandshakeKind::Resumed), 200),
        "the second connection resumes, as node1 (a listing, not a 403)"
    );
    assert_eq!(
        (handshakes(metrics, "full"), handshakes(metrics, "resumed")),
        (1, 1)
    );

    // SIGHUP builds a new TLS config with new ticket keys: what the client
    // holds is refused, the handshake is full.
    master.sighup();
    let mut reloaded = false;
    for _ in 0..400 {
        if master
            .log()
            .contains("SIGHUP: TLS certificate, key, CA and CRL reloaded")
        {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(reloaded, "no reload line:\n{}", master.log());
    let after_reload = connect_and_list(master.addr, &client).await;
    assert_eq!(after_reload, (Some(HandshakeKind::Full), 200));
    let again = connect_and_list(master.addr, &client).await;
    assert_eq!(again, (Some(HandshakeKind::Resumed), 200));

    // A restart: the client holds tickets of the old process (the same
    // server name, the same certificate); the new one cannot open them.
    drop(master);
    let master = ChildMaster::spawn(&cfg, None);
    let metrics = master.metrics_addr();
    let after_restart = connect_and_list(master.addr, &client).await;
    assert_eq!(after_restart, (Some(HandshakeKind::Full), 200));
    assert_eq!(
        (handshakes(metrics, "full"), handshakes(metrics, "resumed")),
        (1, 0),
        "the restarted master resumed a session of its previous process"
    );
    // Not for lack of resumption: its own tickets work.
    let own = connect_and_list(master.addr, &client).await;
    assert_eq!(own, (Some(HandshakeKind::Resumed), 200));
}

/// 16 files of 64 KiB of noise: downloads dominate the run's bytes.
fn content_tree() -> EnvTree {
    let t = EnvTree::new();
    let mut rng = Lcg::new(14);
    for i in 0..16 {
        let body: Vec<u8> = (0..64 * 1024).map(|_| rng.next_u32() as u8).collect();
        t.file(
            "production",
            "big",
            &format!("lib/facter/blob{i:02}.rb"),
            body,
            0o644,
        );
    }
    t
}

#[test]
fn an_agent_reconnecting_within_its_run_resumes_its_session() {
    let (tree, pki) = (content_tree(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let master = ChildMaster::spawn(&master_config(dir.path(), &tree, &pki), None);
    let metrics = master.metrics_addr();
    let mut proxy = CutProxy::start(master.addr);
    let home = AgentHome::new(&pki, &[proxy.url()], "");
    // Cut the run's connection once ~256 KiB of the ~1 MiB of content went
    // through (the listings are a few KiB): the agent must connect again,
    // to the same master, within the same run.
    proxy.hold_at(256 * 1024);
    let run = std::thread::scope(|s| {
        let run = s.spawn(|| home.sync(&[]));
        let held = proxy.wait_held(Duration::from_secs(60));
        proxy.down();
        proxy.up(master.addr);
        assert!(held, "the agent never reached byte 256 KiB");
        run.join().expect("agent thread")
    });
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        contents(&home.libdir()),
        contents(&tree.envpath().join("production/modules/big/lib")),
        "the run finished the sync"
    );
    assert!(proxy.connections() >= 2, "the run connected once only");
    let (full, resumed) = (handshakes(metrics, "full"), handshakes(metrics, "resumed"));
    assert!(
        resumed >= 1,
        "no connection of the run resumed ({full} full handshakes)"
    );
}

/// `pluginsync-master csr` for `name` into `ssldir`.
fn master_csr(ssldir: &Path, name: &str) {
    let out = Command::new(bin_path("pluginsync-master"))
        .args([
            "csr",
            "--certname",
            name,
            "--dns-alt-names",
            "localhost,127.0.0.1",
            "--out",
        ])
        .arg(ssldir)
        .output()
        .expect("run pluginsync-master csr");
    assert!(out.status.success(), "csr: {out:?}");
}

/// Has `server`'s CA sign the CSR `ssldir/certificate_requests/<name>.pem`:
/// submitted through its CA API (as a Puppet agent submits its own), signed
/// with `puppetserver ca sign`, fetched into `ssldir/certs/<name>.pem`.
async fn puppet_ca_signs(server: &PuppetServer, ssldir: &Path, name: &str) {
    pluginsync_common::tls::install_default_provider();
    let ca = reqwest::Certificate::from_pem(
        &std::fs::read(server.ssldir().join("certs/ca.pem")).unwrap(),
    )
    .unwrap();
    let http = reqwest::Client::builder()
        .tls_certs_only([ca])
        .build()
        .unwrap();
    let csr = std::fs::read(ssldir.join(format!("certificate_requests/{name}.pem"))).unwrap();
    let put = http
        .put(format!(
            "{}/puppet-ca/v1/certificate_request/{name}",
            server.url()
        ))
        .header("Content-Type", "text/plain")
        .body(csr)
        .send()
        .await
        .unwrap();
    let status = put.status();
    assert!(
        status.is_success(),
        "the Puppet CA refused the P-256 CSR: {status} {}",
        put.text().await.unwrap_or_default()
    );
    let conf = server.ssldir().parent().unwrap().join("conf/puppet.conf");
    let sign = Command::new("puppetserver")
        .args(["ca", "sign", "--certname", name, "--config"])
        .arg(&conf)
        .output()
        .expect("puppetserver ca sign");
    assert!(sign.status.success(), "puppetserver ca sign: {sign:?}");
    let cert = http
        .get(format!("{}/puppet-ca/v1/certificate/{name}", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(cert.status(), 200);
    std::fs::create_dir_all(ssldir.join("certs")).unwrap();
    std::fs::write(
        ssldir.join(format!("certs/{name}.pem")),
        cert.bytes().await.unwrap(),
    )
    .unwrap();
}

const PUPPET_CA_TEST: &str = "master_tls::puppet_ca";

#[test]
fn a_p256_master_key_signed_by_the_puppet_ca_serves_stock_and_pluginsync_agents() {
    let Some(puppet) = require("puppet", "puppet", PUPPET_CA_TEST) else {
        return;
    };
    if !PuppetServer::required(PUPPET_CA_TEST) {
        return;
    }
    let server = PuppetServer::start(|envpath| {
        gen_tree(&envpath.join("production"), 4, 40, 2, 1);
    });
    server.generate("node1", None);
    let work = tempfile::tempdir().unwrap();
    let mssl = work.path().join("master-ssl");
    master_csr(&mssl, "pluginsync-master");
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(puppet_ca_signs(&server, &mssl, "pluginsync-master"));

    // The certificate the Puppet CA issued holds the P-256 key
    // (id-ecPublicKey, 1.2.840.10045.2.1, appears in no RSA certificate),
    // and the node's certificate is the CA's RSA (rsaEncryption,
    // 1.2.840.113549.1.1.1; the signature OIDs end in other bytes).
    let has_oid = |pem: &Path, oid: &[u8]| {
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_file(pem).unwrap();
        der.windows(oid.len()).any(|w| w == oid)
    };
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const RSA_ENCRYPTION: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    let cert = mssl.join("certs/pluginsync-master.pem");
    assert!(has_oid(&cert, EC_PUBLIC_KEY), "the master's key is EC");
    assert!(
        has_oid(&server.ssldir().join("certs/node1.pem"), RSA_ENCRYPTION),
        "the node's key is RSA"
    );

    let cfg = work.path().join("master.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = [\"127.0.0.1:0\"]\nenvironmentpath = [{env:?}]\n\
             [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\ncrl = {crl:?}\n\
             [http]\nshutdown_grace = \"0s\"\n",
            env = server.envpath(),
            key = mssl.join("private_keys/pluginsync-master.pem"),
            ca = server.ssldir().join("certs/ca.pem"),
            crl = server.ssldir().join("crl.pem"),
        ),
    )
    .unwrap();
    let master = ChildMaster::spawn(&cfg, None);

    let home = AgentHome::with_ssldir(
        &server.ssldir(),
        "node1",
        &[master.url()],
        "environment = \"production\"",
    );
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let stock = PuppetAgent::new(
        &puppet,
        &work.path().join("stock"),
        &server.ssldir(),
        "node1",
        master.addr.port(),
    );
    let download = stock.plugin_download("production");
    assert_eq!(
        download.code, 0,
        "puppet plugin download from the P-256 master failed:\n{}",
        download.output
    );
    let libdir = contents(&home.libdir());
    assert!(libdir.len() > 20, "{libdir:?}");
    // Contents only: Puppet applies the source's modes in lib/ otherwise.
    assert_eq!(libdir, contents(&stock.libdir()));
}
