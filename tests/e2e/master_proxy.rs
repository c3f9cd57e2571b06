//! The `[proxy]` listener's trust model (docs/protocol.md §5.5), against the
//! real `pluginsync-master` binary: identity headers are taken only from
//! `[proxy] trusted` addresses and only on the proxy listener;
//! `X-Client-Verify` must be `SUCCESS`; the DN's one CN (both OpenSSL's and RFC
//! 2253's forms) or a certificate header that verifies against the CA and CRL
//! is the identity, and `[[authorization]]` applies to it; the mTLS listener
//! ignores the headers entirely.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pluginsync_tests::{EnvTree, MasterProcess, Pki, client, config_toml, write_root_crl};

const PROD: &str = "Facter.add(:prod) { setcode { 'production' } }\n";
const PATH: &str = "/puppet/v3/file_content/plugins/prod.rb";
const PROD_URL: &str = "/puppet/v3/file_content/plugins/prod.rb?environment=production";
const DMZ_URL: &str = "/puppet/v3/file_content/plugins/dmz.rb?environment=dmz";

/// A master process with a `[proxy]` listener; its log is kept.
struct ProxiedMaster {
    child: Child,
    /// The mTLS listener.
    tls: SocketAddr,
    /// The proxy listener.
    proxy: SocketAddr,
    log: Arc<Mutex<String>>,
    _tree: EnvTree,
    _dir: tempfile::TempDir,
}

impl Drop for ProxiedMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `production` (`prod.rb`) and `dmz` (`dmz.rb`); `node1` may read
/// `production`, `node2` only `dmz`; the access log on; `proxy` is the
/// `[proxy]` table's body after `listen`.
fn start(pki: &Pki, proxy: &str) -> ProxiedMaster {
    let tree = EnvTree::new();
    tree.file("production", "m", "lib/prod.rb", PROD, 0o644);
    tree.file("dmz", "m", "lib/dmz.rb", "dmz\n", 0o644);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("master.toml");
    let tables = format!(
        "[log]\naccess = \"text\"\n[proxy]\nlisten = [\"127.0.0.1:0\"]\n{proxy}\n\
         [[authorization]]\ncertname = \"node1\"\nenvironments = [\"production\"]\n\
         [[authorization]]\ncertname = \"node2\"\nenvironments = [\"dmz\"]\n"
    );
    std::fs::write(&config, config_toml(&tree.envpath(), pki, "", &tables)).expect("config");
    let mut child = MasterProcess::command(&config)
        .spawn()
        .expect("spawn master");
    let stderr = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let kept = log.clone();
    std::thread::spawn(move || {
        let (mut tls, mut proxy) = (None, None);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push_str(&format!("{line}\n"));
            let addr = |l: &str| l.trim().parse::<SocketAddr>().ok();
            if let Some(a) = line.split("proxy listening on ").nth(1) {
                proxy = addr(a);
            } else if let Some(a) = line.split("listening on ").nth(1) {
                tls = addr(a);
            }
            if let (Some(t), Some(p)) = (tls, proxy) {
                let _ = tx.send(Some((t, p)));
                tls = None;
            }
        }
        let _ = tx.send(None);
    });
    let started = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
    let Some((tls, proxy)) = started else {
        let _ = child.kill();
        panic!("master did not start:\n{}", log.lock().unwrap());
    };
    ProxiedMaster {
        child,
        tls,
        proxy,
        log,
        _tree: tree,
        _dir: dir,
    }
}

/// The default `[proxy]` table trusting loopback (v4 and v6).
const LOOPBACK: &str = "trusted = [\"127.0.0.0/8\", \"::1/128\"]";

/// A plain HTTP/1.1 GET of `target` on `addr` with `headers`, as a
/// balancer sends it: status and body.
fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: puppet\r\nConnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Headers of a balancer that verified the client: `SUCCESS` and `dn`.
fn verified(dn: &str) -> [(&'static str, &str); 2] {
    [("X-Client-Verify", "SUCCESS"), ("X-Client-DN", dn)]
}

/// The PEM of `pem_path` URL-encoded as nginx's `$ssl_client_escaped_cert`.
fn escaped_cert(pem_path: &std::path::Path) -> String {
    let pem = std::fs::read(pem_path).expect("cert");
    pem.iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The 403 body for `PATH`, as without a client certificate.
fn forbidden(answer: (u16, String)) {
    assert_eq!(answer.0, 403, "{}", answer.1);
    assert!(
        answer
            .1
            .contains(&format!("Forbidden request: {PATH} (method GET)")),
        "{}",
        answer.1
    );
}

#[test]
fn verified_dn_headers_are_an_identity_and_authorization_applies() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    // Both DN forms: HAProxy's one-line and nginx's RFC 2253.
    for dn in [
        "/CN=node1/O=Example",
        "CN=node1,O=Example",
        "O=Example,CN=node1",
    ] {
        assert_eq!(
            get(m.proxy, PROD_URL, &verified(dn)),
            (200, PROD.into()),
            "{dn}"
        );
    }
    // [[authorization]] on the header identity: node2 reads dmz only.
    assert_eq!(get(m.proxy, DMZ_URL, &verified("/CN=node2")).0, 200);
    forbidden(get(m.proxy, PROD_URL, &verified("/CN=node2")));
    forbidden(get(m.proxy, PROD_URL, &verified("CN=node2,O=Example")));
    // The access log names the header identity.
    let logged = (0..600).any(|_| {
        let found = m
            .log
            .lock()
            .unwrap()
            .contains(" node1 production file_content 200 ");
        if !found {
            std::thread::sleep(Duration::from_millis(100));
        }
        found
    });
    assert!(logged, "{}", m.log.lock().unwrap());
}

#[test]
fn unverified_ambiguous_or_forged_dn_headers_are_refused() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    // The same 403 as a request without any identity.
    let none = get(m.proxy, PROD_URL, &[]);
    forbidden(none.clone());
    for verify in ["NONE", "FAILED:unable to verify", "success", ""] {
        let answer = get(
            m.proxy,
            PROD_URL,
            &[("X-Client-Verify", verify), ("X-Client-DN", "/CN=node1")],
        );
        assert_eq!(answer, none, "X-Client-Verify: {verify:?}");
    }
    assert_eq!(
        get(m.proxy, PROD_URL, &[("X-Client-DN", "/CN=node1")]),
        none
    );
    for dn in [
        "/CN=node1/CN=admin",
        "CN=node2,CN=node1",
        "CN=node1+CN=node2",
        // A newline (RFC 2253 hex escape) would forge log lines.
        "CN=node1\\0AINFO forged",
        "/CN=node1\tx",
        "/O=Example",
        "node1",
        "",
    ] {
        forbidden(get(m.proxy, PROD_URL, &verified(dn)));
    }
}

/// A client may send an identity header of its own that a proxy passes on
/// beside the one it sets: a request carrying any of the three twice is
/// refused as one without identity, whichever copy comes first.
#[test]
fn a_repeated_identity_header_is_refused() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    let none = get(m.proxy, PROD_URL, &[]);
    let node1 = escaped_cert(&pki.cert("node1"));
    let verify = ("X-Client-Verify", "SUCCESS");
    for headers in [
        vec![
            verify,
            ("X-Client-DN", "/CN=node1"),
            ("X-Client-DN", "/CN=node2"),
        ],
        vec![
            verify,
            ("x-client-dn", "/CN=node1"),
            ("X-Client-DN", "/CN=node1"),
        ],
        vec![verify, verify, ("X-Client-DN", "/CN=node1")],
        vec![
            verify,
            ("X-Client-Cert", node1.as_str()),
            ("X-Client-Cert", node1.as_str()),
        ],
    ] {
        assert_eq!(get(m.proxy, PROD_URL, &headers), none, "{headers:?}");
    }
    // Once each: node1.
    assert_eq!(
        get(m.proxy, PROD_URL, &verified("/CN=node1")),
        (200, PROD.into())
    );
}

#[test]
fn a_certificate_header_must_chain_to_the_ca_and_then_decides() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    let with_cert = |cert: &str, dn: &str| {
        get(
            m.proxy,
            PROD_URL,
            &[
                ("X-Client-Verify", "SUCCESS"),
                ("X-Client-DN", dn),
                ("X-Client-Cert", cert),
            ],
        )
    };
    // The test PKI's node1 certificate: its CN is the identity, whatever
    // the DN header says.
    let node1 = escaped_cert(&pki.cert("node1"));
    assert_eq!(with_cert(&node1, "/CN=node2"), (200, PROD.into()));
    // node2's certificate with node1's DN: node2, refused production.
    forbidden(with_cert(&escaped_cert(&pki.cert("node2")), "/CN=node1"));
    // A forged certificate for node1, self-signed: 403 despite the DN.
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["node1".into()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "node1");
    let forged = dir.path().join("forged.pem");
    std::fs::write(&forged, params.self_signed(&key).unwrap().pem()).unwrap();
    forbidden(with_cert(&escaped_cert(&forged), "/CN=node1"));
    // Revoked (in the CRL) is refused too, and so is garbage.
    let revoked = escaped_cert(&pki.cert("revoked"));
    forbidden(with_cert(&revoked, "/CN=node1"));
    forbidden(with_cert("not%20a%20certificate", "/CN=node1"));
    // The CA's own certificate is not a client certificate.
    forbidden(with_cert(&escaped_cert(&pki.ca()), "/CN=node1"));
}

#[test]
fn sighup_reloads_the_crl_that_certificate_headers_are_checked_against() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    let node1 = escaped_cert(&pki.cert("node1"));
    let headers = [
        ("X-Client-Verify", "SUCCESS"),
        ("X-Client-Cert", node1.as_str()),
    ];
    assert_eq!(get(m.proxy, PROD_URL, &headers), (200, PROD.into()));
    write_root_crl(&pki, &["revoked", "node1"]);
    // SIGHUP without a `kill` binary (a minimal root has none).
    let pid = rustix::process::Pid::from_raw(m.child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).expect("SIGHUP");
    let reloaded = (0..600).any(|_| {
        let done = m.log.lock().unwrap().contains("CRL reloaded");
        if !done {
            std::thread::sleep(Duration::from_millis(100));
        }
        done
    });
    assert!(reloaded, "{}", m.log.lock().unwrap());
    forbidden(get(m.proxy, PROD_URL, &headers));
}

#[test]
fn headers_from_outside_trusted_are_not_accepted() {
    let pki = Pki::new();
    // Loopback is not in 10.0.0.0/8.
    let m = start(&pki, "trusted = [\"10.0.0.0/8\"]");
    let node1 = escaped_cert(&pki.cert("node1"));
    for headers in [
        &verified("/CN=node1")[..],
        &[
            ("X-Client-Verify", "SUCCESS"),
            ("X-Client-Cert", node1.as_str()),
        ][..],
    ] {
        forbidden(get(m.proxy, PROD_URL, headers));
    }
    // Not even the health check answers there.
    assert_eq!(get(m.proxy, "/status/v1/simple", &[]).0, 403);
    // The refusal is logged by the master's own thread: wait (bounded) for
    // the log reader to have it.
    let logged = (0..200).any(|_| {
        let seen = m
            .log
            .lock()
            .unwrap()
            .contains("refused a request from outside [proxy] trusted");
        if !seen {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        seen
    });
    assert!(logged, "{}", m.log.lock().unwrap());
}

#[test]
fn header_names_are_configurable() {
    let pki = Pki::new();
    let m = start(
        &pki,
        &format!(
            "{LOOPBACK}\nverify_header = \"X-SSL-Verify\"\ndn_header = \"X-SSL-Subject\"\n\
             cert_header = \"X-SSL-Cert\""
        ),
    );
    let renamed = [("X-SSL-Verify", "SUCCESS"), ("X-SSL-Subject", "/CN=node1")];
    assert_eq!(get(m.proxy, PROD_URL, &renamed), (200, PROD.into()));
    // The default names mean nothing now.
    forbidden(get(m.proxy, PROD_URL, &verified("/CN=node1")));
    let node1 = escaped_cert(&pki.cert("node1"));
    let cert = [("X-SSL-Verify", "SUCCESS"), ("X-SSL-Cert", node1.as_str())];
    assert_eq!(get(m.proxy, PROD_URL, &cert), (200, PROD.into()));
}

#[test]
fn proxy_connections_count_in_the_connection_registry() {
    let pki = Pki::new();
    let m = start(
        &pki,
        &format!("{LOOPBACK}\n[metrics]\nlisten = \"127.0.0.1:0\""),
    );
    let metrics: SocketAddr = m
        .log
        .lock()
        .unwrap()
        .lines()
        .find_map(|l| {
            l.split("metrics on http://")
                .nth(1)?
                .trim()
                .strip_suffix("/metrics")?
                .parse()
                .ok()
        })
        .expect("the master logs its metrics address");
    // Three keep-alive connections, each after one answered request.
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(m.proxy).expect("connect");
            s.write_all(
                format!("GET {PROD_URL} HTTP/1.1\r\nHost: puppet\r\nX-Client-Verify: SUCCESS\r\nX-Client-DN: /CN=node1\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
            let mut head = [0u8; 12];
            s.read_exact(&mut head).unwrap();
            assert_eq!(&head, b"HTTP/1.1 200");
            s
        })
        .collect();
    let (status, text) = get(metrics, "/metrics", &[]);
    assert_eq!(status, 200);
    assert!(
        text.lines()
            .any(|l| l == "pluginsync_master_open_connections 3"),
        "{text}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mtls_listener_ignores_identity_headers() {
    let pki = Pki::new();
    let m = start(&pki, LOOPBACK);
    let node1 = escaped_cert(&pki.cert("node1"));
    let url = format!("https://localhost:{}{PROD_URL}", m.tls.port());
    let send = |c: reqwest::Client| {
        c.get(&url)
            .header("X-Client-Verify", "SUCCESS")
            .header("X-Client-DN", "/CN=node1")
            .header("X-Client-Cert", &node1)
            .send()
    };
    // No client certificate: the headers do not stand in for one.
    let r = send(client(&pki, None)).await.expect("request");
    assert_eq!(r.status().as_u16(), 403);
    // node2's certificate: node2 it is, refused production.
    let r = send(client(&pki, Some("node2"))).await.expect("request");
    assert_eq!(r.status().as_u16(), 403);
    // node1's certificate reads it (the listener works).
    let r = send(client(&pki, Some("node1"))).await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), PROD);
}
