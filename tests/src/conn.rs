//! Connections held by hand, for the master's connection-limit tests: the
//! master binary as a child whose descriptors, memory and signals a test
//! reaches ([`ChildMaster`]); TLS connections that stay open
//! ([`tls_config`], [`tls_connect`]); HTTP/1.1 keep-alive requests on them
//! ([`h1_get`]); a minimal HTTP/2 client that never opens a flow-control
//! window ([`H2`]); and CRLs and certificates of the PKI's CA, signed
//! through `dev-certs`' own CA code ([`devcerts::Ca`]: [`write_root_crl`],
//! [`ChainedClient`], an intermediate CA).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pluginsync_master::devcerts;
use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::pki::Pki;
use crate::process::{bin_path, unprivileged};

/// The master binary as a child process, optionally under a lowered
/// descriptor limit, its log collected all along (so it never blocks on a
/// full pipe), killed on drop.
pub struct ChildMaster {
    child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl ChildMaster {
    /// Runs `pluginsync-master serve --config <config>` (through
    /// `sh -c 'ulimit -n N; exec …'` when `nofile` is given) and waits up
    /// to 60 s for its "listening on" and "ready" lines.
    pub fn spawn(config: &Path, nofile: Option<u64>) -> ChildMaster {
        let master = bin_path("pluginsync-master");
        let cmd = match nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(master);
                c
            }
            None => Command::new(master),
        };
        ChildMaster::run(cmd, config)
    }

    /// Like [`ChildMaster::spawn`], as a user file modes apply to
    /// ([`unprivileged`]): hand it the tree and the config first
    /// ([`crate::hand_over`]).
    pub fn spawn_unprivileged(config: &Path) -> ChildMaster {
        ChildMaster::run(unprivileged(&bin_path("pluginsync-master")), config)
    }

    fn run(mut cmd: Command, config: &Path) -> ChildMaster {
        cmd.args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn master");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut started = crate::master::StartLines::default();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = started.see(&line) {
                    let _ = tx.send(addr);
                }
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
            let _ = tx.send(None);
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
        let mut master = ChildMaster {
            child,
            addr: "0.0.0.0:0".parse().expect("addr"),
            log,
        };
        match addr {
            Some(a) => master.addr = a,
            None => panic!("master did not start:\n{}", master.log()),
        }
        master
    }

    /// Its `[metrics]` address, from its log (bounded wait).
    pub fn metrics_addr(&self) -> SocketAddr {
        for _ in 0..400 {
            if let Some(a) = self.log().lines().find_map(|l| {
                l.split("metrics on http://")
                    .nth(1)?
                    .trim()
                    .split('/')
                    .next()?
                    .parse()
                    .ok()
            }) {
                return a;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "the master never logged its metrics address:\n{}",
            self.log()
        );
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its resident memory (`VmRSS` of `/proc/<pid>/status`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib_of(self.pid())
    }

    /// Sends it SIGHUP (reload the TLS files).
    pub fn sighup(&self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::HUP,
        )
        .expect("send SIGHUP");
    }
}

/// The resident memory of process `pid` (`VmRSS` of `/proc/<pid>/status`),
/// in KiB; 0 once it is gone.
pub fn rss_kib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Drop for ChildMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client TLS config trusting only the test CA, presenting `chain` and
/// `key` when given, offering `alpn` (e.g. `["h2"]`, `["http/1.1"]`).
pub fn tls_config(
    pki: &Pki,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: &[&str],
) -> Arc<rustls::ClientConfig> {
    use pluginsync_common::tls as ptls;
    let roots = ptls::load_roots(&pki.ca()).expect("CA");
    let builder = rustls::ClientConfig::builder_with_provider(ptls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// `certname`'s certificate and key from the PKI, for [`tls_config`].
pub fn identity(
    pki: &Pki,
    certname: &str,
) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    use pluginsync_common::tls as ptls;
    (
        ptls::load_certs("cert", &pki.cert(certname)).expect("cert"),
        ptls::load_key(&pki.key(certname)).expect("key"),
    )
}

/// Opens a TCP connection and completes the TLS handshake (10 s at most).
pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let connect = async {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
    };
    tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .map_err(|_| std::io::Error::other("TLS handshake timed out"))?
}

/// Whether a client with `config` is refused: the handshake fails, or (TLS
/// 1.3 reports a refused client certificate only after the client's side
/// finished) the first request gets no answer.
pub async fn refused(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> bool {
    match tls_connect(addr, config).await {
        Err(_) => true,
        Ok(mut s) => h1_get(&mut s, "/status/v1/simple").await.is_err(),
    }
}

/// One HTTP/1.1 keep-alive `GET` on an open stream; the status and the body
/// (Content-Length or chunked). Errors when the connection is closed before
/// a whole response (30 s at most).
pub async fn h1_get<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &str,
) -> std::io::Result<(u16, Vec<u8>)> {
    let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Some(done) = parse_response(&buf)? {
                return Ok(done);
            }
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed before a whole response",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| std::io::Error::other("h1_get timed out"))?
}

/// A whole response in `buf`, if it holds one.
fn parse_response(buf: &[u8]) -> std::io::Result<Option<(u16, Vec<u8>)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let body = &buf[end + 4..];
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        return Ok((body.len() >= len).then(|| (status, body[..len].to_vec())));
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut out = Vec::new();
        let mut rest = body;
        loop {
            let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..eol])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
            if size == 0 {
                return Ok(Some((status, out)));
            }
            if rest.len() < eol + 2 + size + 2 {
                return Ok(None);
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
    }
    Ok(Some((status, body.to_vec())))
}

/// One HTTP/2 frame.
#[derive(Debug)]
pub struct H2Frame {
    /// Frame type (0 DATA, 1 HEADERS, 3 RST_STREAM, 4 SETTINGS, 7 GOAWAY…).
    pub kind: u8,
    /// Flags (0x1 END_STREAM or ACK, 0x4 END_HEADERS).
    pub flags: u8,
    /// Stream id.
    pub stream: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

/// A minimal HTTP/2 client over TLS: requests are sent, flow-control
/// windows are never opened (no WINDOW_UPDATE is ever sent), so the server
/// can send at most 65,535 bytes of DATA on the whole connection.
pub struct H2 {
    tls: TlsStream<TcpStream>,
}

impl H2 {
    /// Connects (`config` must offer ALPN `h2`), sends the preface and an
    /// empty SETTINGS, and acknowledges the server's SETTINGS.
    pub async fn connect(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<H2> {
        let tls = tls_connect(addr, config).await?;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(std::io::Error::other("the server did not choose h2"));
        }
        let mut h2 = H2 { tls };
        h2.tls
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await?;
        h2.send_frame(4, 0, 0, &[]).await?;
        for _ in 0..16 {
            let f = h2.read_frame().await?;
            if f.kind == 4 && f.flags & 1 == 0 {
                h2.send_frame(4, 1, 0, &[]).await?;
                return Ok(h2);
            }
        }
        Err(std::io::Error::other("no SETTINGS from the server"))
    }

    async fn send_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let len = payload.len() as u32;
        let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        frame.extend_from_slice(payload);
        self.tls.write_all(&frame).await?;
        self.tls.flush().await
    }

    /// Sends `GET <path>` on (odd) `stream` with `headers` (lower-case
    /// names), ending the stream.
    pub async fn get(
        &mut self,
        stream: u32,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let mut block = Vec::new();
        let fields = [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "localhost"),
            (":path", path),
        ];
        for (name, value) in fields.iter().chain(headers) {
            // Literal header field without indexing, new name, no Huffman.
            block.push(0);
            hpack_string(&mut block, name.as_bytes());
            hpack_string(&mut block, value.as_bytes());
        }
        self.send_frame(1, 0x1 | 0x4, stream, &block).await
    }

    /// Reads the next frame (30 s at most).
    pub async fn read_frame(&mut self) -> std::io::Result<H2Frame> {
        let read = async {
            let mut head = [0u8; 9];
            self.tls.read_exact(&mut head).await?;
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            self.tls.read_exact(&mut payload).await?;
            Ok(H2Frame {
                kind: head[3],
                flags: head[4],
                stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
                payload,
            })
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .map_err(|_| std::io::Error::other("no frame in 30 s"))?
    }

    /// Reads frames until `stream`'s response ends; its DATA bytes.
    pub async fn response(&mut self, stream: u32) -> std::io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let f = self.read_frame().await?;
            if f.stream != stream {
                continue;
            }
            match f.kind {
                0 => body.extend_from_slice(&f.payload),
                1 => {}
                3 => return Err(std::io::Error::other("stream reset")),
                _ => continue,
            }
            if f.flags & 1 != 0 {
                return Ok(body);
            }
        }
    }

    /// Reads (and drops) whatever the server sends until the connection
    /// ends; true if it ended within `limit`. Reading does not open any
    /// HTTP/2 window.
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        closed_within(&mut self.tls, limit).await
    }
}

/// Reads (and drops) from `s` until EOF or an error; true if that happened
/// within `limit`.
pub async fn closed_within<S: AsyncRead + Unpin>(s: &mut S, limit: Duration) -> bool {
    let drain = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, drain).await.is_ok()
}

/// An HPACK string literal (7-bit prefix length, no Huffman coding).
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    let mut len = s.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(s);
}

/// The PKI's CA (`dev-certs`' own, [`devcerts::Ca`]).
fn ca(pki: &Pki) -> devcerts::Ca {
    devcerts::Ca::open(&pki.ssldir).expect("the PKI's CA")
}

/// A CRL of `issuer` listing `serials`, as `dev-certs` writes one.
fn crl_pem(issuer: &Issuer<'_, KeyPair>, serials: &[Vec<u8>]) -> String {
    devcerts::crl_pem(issuer, serials, time::OffsetDateTime::now_utc(), 400).expect("CRL")
}

/// Rewrites the PKI's `crl.pem`: the CA's CRL listing `certnames`.
pub fn write_root_crl(pki: &Pki, certnames: &[&str]) {
    let serials: Vec<Vec<u8>> = certnames
        .iter()
        .map(|n| devcerts::serial_of(&pki.cert(n)).expect("serial"))
        .collect();
    std::fs::write(pki.crl(), crl_pem(ca(pki).issuer(), &serials)).expect("write CRL");
}

/// A client certificate issued by an intermediate CA that the PKI's CA
/// issued: the chain a client presents, and the CRLs to check it with.
pub struct ChainedClient {
    /// Leaf, then intermediate.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key (PKCS#8 DER).
    pub key: Vec<u8>,
    /// The intermediate CA's certificate, PEM (for a `ca.pem` that holds
    /// it beside the root, as Puppet's intermediate-CA setups do).
    pub intermediate_pem: String,
    intermediate_serial: Vec<u8>,
    intermediate: Issuer<'static, KeyPair>,
}

impl ChainedClient {
    /// A new intermediate CA under the PKI's CA and a client certificate
    /// `certname` issued by it.
    pub fn new(pki: &Pki, certname: &str) -> ChainedClient {
        let root = ca(pki);
        let int_key = KeyPair::generate().expect("key");
        let mut p = devcerts::ca_params("pluginsync test intermediate CA");
        p.use_authority_key_identifier_extension = true;
        let intermediate_serial = vec![0x2a, 0x17, 0x06];
        p.serial_number = Some(SerialNumber::from_slice(&intermediate_serial));
        let int_cert = p
            .signed_by(&int_key, root.issuer())
            .expect("sign intermediate");
        let intermediate = Issuer::new(p, int_key);

        let leaf_key = KeyPair::generate().expect("key");
        let mut l = CertificateParams::new(vec![certname.to_owned()]).expect("leaf params");
        l.distinguished_name.push(DnType::CommonName, certname);
        l.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        l.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        l.use_authority_key_identifier_extension = true;
        l.serial_number = Some(SerialNumber::from_slice(&[0x3b, 0x01]));
        let leaf = l.signed_by(&leaf_key, &intermediate).expect("sign leaf");
        ChainedClient {
            chain: vec![leaf.der().clone(), int_cert.der().clone()],
            key: leaf_key.serialize_der(),
            intermediate_pem: int_cert.pem(),
            intermediate_serial,
            intermediate,
        }
    }

    /// The chain and key, for [`tls_config`].
    pub fn identity(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            self.chain.clone(),
            PrivateKeyDer::Pkcs8(self.key.clone().into()),
        )
    }

    /// Writes a CRL bundle covering the whole chain: the CA's CRL (listing
    /// the intermediate CA when `revoke_intermediate`) and the
    /// intermediate's own, empty, CRL.
    pub fn write_crls(&self, pki: &Pki, path: &Path, revoke_intermediate: bool) {
        let root_revoked = if revoke_intermediate {
            vec![self.intermediate_serial.clone()]
        } else {
            Vec::new()
        };
        let bundle = format!(
            "{}{}",
            crl_pem(ca(pki).issuer(), &root_revoked),
            crl_pem(&self.intermediate, &[])
        );
        std::fs::write(path, bundle).expect("write CRL bundle");
    }
}

/// A client certificate for `certname` issued by the PKI's CA, valid from
/// `from_days` to `until_days` days from now (negative: in the past),
/// written as `<dir>/<certname>.pem` and `<dir>/<certname>.key`; returns
/// both paths. For expired and not-yet-valid certificates.
pub fn dated_client_cert(
    pki: &Pki,
    certname: &str,
    from_days: i64,
    until_days: i64,
    dir: &Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name.push(DnType::CommonName, certname);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    let at = |days: i64| now + time::Duration::days(days);
    p.not_before = at(from_days);
    p.not_after = at(until_days);
    issue(pki, &p, &key, certname, dir)
}

/// Signs `params` for `key` with the PKI's CA and writes
/// `<dir>/<name>.pem` and `<dir>/<name>.key`; returns both paths.
fn issue(
    pki: &Pki,
    params: &CertificateParams,
    key: &KeyPair,
    name: &str,
    dir: &Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let cert = params.signed_by(key, ca(pki).issuer()).expect("sign");
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).expect("write cert");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (c, k)
}

/// A server certificate for the DNS name `name` only (no `localhost`, no
/// loopback address, unlike `dev-certs`'), issued by the PKI's CA, valid
/// for 30 days, written as `<dir>/<name>.pem` and `<dir>/<name>.key`;
/// returns both paths. For a master whose certificate is for another name.
pub fn server_cert_for(
    pki: &Pki,
    name: &str,
    dir: &Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec![name.to_owned()]).expect("params");
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(30);
    issue(pki, &p, &key, name, dir)
}
