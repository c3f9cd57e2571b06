//! Layer-7 balancers in front of a Puppet fleet
//! (docs/puppet-fleet.md#running-in-a-puppet-fleet): HAProxy with
//! `packaging/haproxy-puppet.cfg` and nginx with `packaging/nginx-puppet.conf`,
//! and nginx as a cache in front of the masters with
//! `packaging/nginx-pluginsync-cache.conf`
//! (docs/cache.md), each run from the
//! repository's file as written, as a child process killed on drop; and the pluginsync masters behind them, [`ProxyBackend`]: the master
//! binary with a `[proxy]` listener (docs/protocol.md §5.5) and its JSON access
//! log kept in a file.
//!
//! A test gets the balancer programs with [`crate::require`] first, so a
//! missing one is a visible `SKIPPED` line (a failure under CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin_path, repo_root};

/// What sits behind a balancer and the TLS files it ends TLS with.
pub struct Backends {
    /// Certificate the balancer presents (issued by the Puppet CA for
    /// `localhost`).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The Puppet CA bundle client certificates must chain to.
    pub ca: PathBuf,
    /// The Puppet CRL bundle.
    pub crl: PathBuf,
    /// Puppet Server's plain-HTTP address (`127.0.0.1:port`).
    pub puppetserver: String,
    /// The pluginsync masters' `[proxy]` addresses (exactly two for
    /// HAProxy's file).
    pub pluginsync: Vec<String>,
}

/// A balancer child process; stopped on drop. Its own files (logs, the
/// generated includes) live in a tempdir.
pub struct Balancer {
    child: Child,
    /// The port agents connect to on 127.0.0.1 (TLS, certificate for
    /// `localhost`).
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Balancer {
    /// HAProxy in the foreground (`-db`) with `packaging/haproxy-puppet.cfg`
    /// unmodified: every address and path given in the environment
    /// variables the file names.
    pub fn haproxy(haproxy: &Path, backends: &Backends) -> Balancer {
        Balancer::haproxy_with(
            haproxy,
            backends,
            &repo_root().join("packaging/haproxy-puppet.cfg"),
        )
    }

    /// [`Balancer::haproxy`] with another configuration file `config`
    /// taking the same environment variables (a variant of the shipped one).
    pub fn haproxy_with(haproxy: &Path, backends: &Backends, config: &Path) -> Balancer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        // HAProxy wants the certificate and its key in one PEM.
        let combined = dir.path().join("balancer.pem");
        let mut pem = std::fs::read(&backends.cert).expect("balancer cert");
        pem.extend(std::fs::read(&backends.key).expect("balancer key"));
        std::fs::write(&combined, pem).expect("write combined PEM");
        assert_eq!(backends.pluginsync.len(), 2, "the file names two masters");
        let log = std::fs::File::create(dir.path().join("haproxy.log")).expect("log");
        let child = Command::new(haproxy)
            .args(["-db", "-f"])
            .arg(config)
            .env("PUPPET_BIND", format!("127.0.0.1:{port}"))
            .env("PUPPET_CERT", &combined)
            .env("PUPPET_CA", &backends.ca)
            .env("PUPPET_CRL", &backends.crl)
            .env("PUPPETSERVER", &backends.puppetserver)
            .env("PLUGINSYNC_PROXY1", &backends.pluginsync[0])
            .env("PLUGINSYNC_PROXY2", &backends.pluginsync[1])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("start haproxy");
        Balancer::ready(child, port, dir, "haproxy.log")
    }

    /// nginx in the foreground (`daemon off`), non-root: a main
    /// `nginx.conf` in a tempdir with its pid, logs and temp paths there,
    /// whose `http` block includes `packaging/nginx-puppet.conf` unmodified;
    /// the three `puppet-fleet/*.conf` files that file includes (addresses
    /// and TLS files, as its comments describe) are written next to it.
    pub fn nginx(nginx: &Path, backends: &Backends) -> Balancer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        let d = dir.path();
        std::fs::create_dir_all(d.join("puppet-fleet")).expect("mkdir");
        let write = |name: &str, text: String| {
            std::fs::write(d.join(name), text).expect("write nginx include");
        };
        write(
            "puppet-fleet/tls.conf",
            format!(
                "listen 127.0.0.1:{port} ssl;\nssl_certificate {};\nssl_certificate_key {};\n\
                 ssl_client_certificate {};\nssl_crl {};\n",
                backends.cert.display(),
                backends.key.display(),
                backends.ca.display(),
                backends.crl.display()
            ),
        );
        write(
            "puppet-fleet/puppetserver.conf",
            format!(
                "server {} max_fails=2 fail_timeout=10s;\n",
                backends.puppetserver
            ),
        );
        write(
            "puppet-fleet/pluginsync.conf",
            backends
                .pluginsync
                .iter()
                .map(|a| format!("server {a} max_fails=1 fail_timeout=5s;\n"))
                .collect(),
        );
        Balancer::nginx_with(nginx, dir, port, "packaging/nginx-puppet.conf")
    }

    /// nginx with `packaging/nginx-pluginsync-cache.conf` unmodified, a
    /// cache in front of the pluginsync masters' `[proxy]` listeners
    /// `masters` (docs/cache.md): the four
    /// `pluginsync-cache/*.conf` files the file includes are written next
    /// to the main `nginx.conf` with loopback values, the cache in
    /// [`Balancer::cache_dir`], its JSON log in [`Balancer::cache_log`],
    /// plain HTTP to the masters. `tls` is the certificate and key nginx
    /// presents and the CA and CRL client certificates must verify against.
    pub fn nginx_cache(nginx: &Path, tls: [&Path; 4], masters: &[String]) -> Balancer {
        Balancer::nginx_cache_with(nginx, tls, masters, "set $pluginsync_hop http;\n".into())
    }

    /// [`Balancer::nginx_cache`] reaching `masters` over TLS, as a remote
    /// site does (docs/cache.md#the-hop-to-the-masters): `hop` is the
    /// certificate and key nginx presents to them; it verifies theirs
    /// (`localhost`) against the CA of `tls`.
    pub fn nginx_cache_over_tls(
        nginx: &Path,
        tls: [&Path; 4],
        masters: &[String],
        [hop_cert, hop_key]: [&Path; 2],
    ) -> Balancer {
        let hop = format!(
            "set $pluginsync_hop https;\nproxy_ssl_certificate {};\n\
             proxy_ssl_certificate_key {};\nproxy_ssl_trusted_certificate {};\n\
             proxy_ssl_verify on;\nproxy_ssl_name localhost;\nproxy_ssl_session_reuse on;\n",
            hop_cert.display(),
            hop_key.display(),
            tls[2].display()
        );
        Balancer::nginx_cache_with(nginx, tls, masters, hop)
    }

    /// nginx with `packaging/nginx-pluginsync-hop.conf` unmodified: TLS on
    /// a master host in front of its `[proxy]` listener `master`, admitting
    /// only the certificates of `caches` (docs/cache.md#the-hop-to-the-masters);
    /// the three `pluginsync-hop/*.conf` files it includes are written next
    /// to the main `nginx.conf`. `tls` as for [`Balancer::nginx_cache`].
    pub fn nginx_hop(
        nginx: &Path,
        [cert, key, ca, crl]: [&Path; 4],
        caches: &[&str],
        master: &str,
    ) -> Balancer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        let d = dir.path();
        std::fs::create_dir_all(d.join("pluginsync-hop")).expect("mkdir");
        let write = |name: &str, text: String| {
            std::fs::write(d.join("pluginsync-hop").join(name), text).expect("write nginx include");
        };
        write(
            "site.conf",
            format!(
                "listen 127.0.0.1:{port} ssl;\nssl_certificate {};\nssl_certificate_key {};\n\
                 ssl_client_certificate {};\nssl_crl {};\n",
                cert.display(),
                key.display(),
                ca.display(),
                crl.display()
            ),
        );
        write(
            "caches.conf",
            caches.iter().map(|c| format!("\"CN={c}\" 1;\n")).collect(),
        );
        write("master.conf", format!("server {master};\n"));
        Balancer::nginx_with(nginx, dir, port, "packaging/nginx-pluginsync-hop.conf")
    }

    fn nginx_cache_with(
        nginx: &Path,
        [cert, key, ca, crl]: [&Path; 4],
        masters: &[String],
        hop: String,
    ) -> Balancer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        let d = dir.path();
        std::fs::create_dir_all(d.join("pluginsync-cache")).expect("mkdir");
        let write = |name: &str, text: String| {
            std::fs::write(d.join("pluginsync-cache").join(name), text)
                .expect("write nginx include");
        };
        write(
            "store.conf",
            format!(
                "proxy_cache_path {} levels=1:2 keys_zone=pluginsync:4m max_size=256m \
                 inactive=1d use_temp_path=off;\n",
                d.join("cache").display()
            ),
        );
        write(
            "site.conf",
            format!(
                "listen 127.0.0.1:{port} ssl;\nssl_certificate {};\nssl_certificate_key {};\n\
                 ssl_client_certificate {};\nssl_crl {};\naccess_log {} pluginsync_cache;\n",
                cert.display(),
                key.display(),
                ca.display(),
                crl.display(),
                d.join("cache.log").display()
            ),
        );
        write(
            "masters.conf",
            masters
                .iter()
                .map(|a| format!("server {a} max_fails=1 fail_timeout=5s;\n"))
                .collect(),
        );
        write("hop.conf", hop);
        Balancer::nginx_with(nginx, dir, port, "packaging/nginx-pluginsync-cache.conf")
    }

    /// nginx in the foreground with a main `nginx.conf` in `dir` (its pid,
    /// logs and temp paths there) whose `http` block includes the
    /// repository's `conf` unmodified.
    fn nginx_with(nginx: &Path, dir: tempfile::TempDir, port: u16, conf: &str) -> Balancer {
        let d = dir.path();
        let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|t| format!("    {t}_temp_path {};\n", d.join(t).display()))
            .collect();
        std::fs::write(
            d.join("nginx.conf"),
            format!(
                "worker_processes 1;\nevents {{ worker_connections 512; }}\nhttp {{\n    \
                 access_log {};\n{temp}    include {};\n}}\n",
                d.join("access.log").display(),
                repo_root().join(conf).display()
            ),
        )
        .expect("write nginx.conf");
        let log = std::fs::File::create(d.join("nginx.out")).expect("log");
        let child = Command::new(nginx)
            .arg("-p")
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-e")
            .arg(d.join("error.log"))
            .arg("-g")
            .arg(format!(
                "daemon off; master_process on; pid {};",
                d.join("nginx.pid").display()
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("start nginx");
        Balancer::ready(child, port, dir, "error.log")
    }

    /// Waits (bounded) until the front port accepts; panics with the
    /// balancer's log if it exits first.
    fn ready(mut child: Child, port: u16, dir: tempfile::TempDir, log: &str) -> Balancer {
        let end = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let text = || std::fs::read_to_string(dir.path().join(log)).unwrap_or_default();
            if let Some(status) = child.try_wait().expect("wait") {
                panic!("balancer exited ({status}) while starting:\n{}", text());
            }
            assert!(
                Instant::now() < end,
                "balancer not listening on 127.0.0.1:{port} after 30 s:\n{}",
                text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Balancer { child, port, dir }
    }

    /// Waits (at most 60 s) until a request for Puppet Server through the
    /// balancer (`GET /status/v1/simple`, its default backend) is answered
    /// `200`, the balancer's certificate verified against the CA of the
    /// Puppet ssldir `ssl`. A balancer started before Puppet Server's JVM
    /// (the `reporturl` setups) has marked that backend down and only sees
    /// it up at its next health check: a run before then is refused `503`
    /// at the balancer. Panics with the balancer's log when it never
    /// answers.
    pub fn wait_puppetserver(&self, ssl: &Path) {
        let (client, rt) = crate::ssldir_client(ssl, None);
        let url = format!("https://localhost:{}/status/v1/simple", self.port);
        let started = Instant::now();
        let end = started + Duration::from_secs(60);
        let mut last = String::from("first try");
        while Instant::now() < end {
            match rt.block_on(async { client.get(&url).send().await.map(|r| r.status()) }) {
                Ok(reqwest::StatusCode::OK) => {
                    eprintln!(
                        "balancer on {} routes to Puppet Server after {:?} ({last})",
                        self.port,
                        started.elapsed()
                    );
                    return;
                }
                Ok(status) => last = status.to_string(),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let log = ["haproxy.log", "error.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.path().join(f)).ok())
            .collect::<String>();
        panic!("Puppet Server not reachable through the balancer after 60 s ({last}):\n{log}");
    }

    /// Its directory (logs; nginx's generated files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// [`Balancer::nginx_cache`]'s cache directory (`proxy_cache_path`).
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// [`Balancer::nginx_cache`]'s log so far: one JSON object per request
    /// (`log_format pluginsync_cache`: `client`, `uri`, `status`, `bytes`,
    /// `cache`, `upstream`).
    pub fn cache_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("cache.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect()
    }
}

impl Drop for Balancer {
    /// SIGTERM first: nginx's master then stops its workers (a SIGKILLed
    /// master leaves them orphaned, still listening); SIGKILL after 10 s.
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `pluginsync-master serve` child with a `[proxy]` listener on
/// 127.0.0.1 trusting loopback and `[log] access = "json"`, its stderr in
/// a file; killed on drop.
pub struct ProxyBackend {
    child: Child,
    /// The `[proxy]` listener's address (`127.0.0.1:port`).
    pub proxy: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ProxyBackend {
    /// A master serving `envpath` (with `basemodulepath`), its mTLS
    /// listener on an ephemeral port with `cert`/`key` and the CA and CRL
    /// of `ca`/`crl` (which also verify `X-Client-Cert`); waits (at most
    /// 60 s) for its `proxy listening on` line.
    pub fn spawn(envpath: &Path, basemodulepath: &Path, tls: [&Path; 4]) -> ProxyBackend {
        ProxyBackend::spawn_with(envpath, basemodulepath, tls, "")
    }

    /// [`ProxyBackend::spawn`] with `extra` TOML tables at the end of its
    /// config (`[[authorization]]` rules, …).
    pub fn spawn_with(
        envpath: &Path,
        basemodulepath: &Path,
        [cert, key, ca, crl]: [&Path; 4],
        extra: &str,
    ) -> ProxyBackend {
        // The proxy's port is found closed, then bound by the master: a
        // test starting meanwhile can take it. Another port then, a few
        // times at most.
        ProxyBackend::spawn_on(envpath, basemodulepath, [cert, key, ca, crl], 0, extra)
    }

    /// [`ProxyBackend::spawn_with`] with its mTLS listener on `tls_port`
    /// (0: an ephemeral port), for a port named before the master starts
    /// (a client's config).
    pub fn spawn_on(
        envpath: &Path,
        basemodulepath: &Path,
        [cert, key, ca, crl]: [&Path; 4],
        tls_port: u16,
        extra: &str,
    ) -> ProxyBackend {
        let mut taken = String::new();
        for _ in 0..5 {
            let tls = [cert, key, ca, crl];
            match Self::spawn_once(envpath, basemodulepath, tls, tls_port, extra) {
                Ok(backend) => return backend,
                Err(text) if text.contains("Address already in use") => taken = text,
                Err(text) => panic!("pluginsync-master exited {text}"),
            }
        }
        panic!("pluginsync-master's proxy port was taken 5 times; the last: {taken}")
    }

    /// One start of [`ProxyBackend::spawn_with`]: the backend, or the
    /// master's log when it exited.
    fn spawn_once(
        envpath: &Path,
        basemodulepath: &Path,
        [cert, key, ca, crl]: [&Path; 4],
        tls_port: u16,
        extra: &str,
    ) -> Result<ProxyBackend, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::closed_port();
        let config = dir.path().join("master.toml");
        std::fs::write(
            &config,
            format!(
                "listen = [\"127.0.0.1:{tls_port}\"]\nenvironmentpath = [{envpath:?}]\n\
                 basemodulepath = [{basemodulepath:?}]\n\
                 [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\ncrl = {crl:?}\n\
                 [http]\nshutdown_grace = \"0s\"\n\
                 [proxy]\nlisten = [\"127.0.0.1:{port}\"]\ntrusted = [\"127.0.0.0/8\"]\n\
                 [log]\naccess = \"json\"\n{extra}"
            ),
        )
        .expect("write master.toml");
        let log = dir.path().join("master.log");
        let file = std::fs::File::create(&log).expect("log");
        let mut child = Command::new(bin_path("pluginsync-master"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn pluginsync-master");
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("proxy listening on ") {
                break;
            }
            if let Some(status) = child.try_wait().expect("wait") {
                return Err(format!("({status}):\n{text}"));
            }
            assert!(Instant::now() < end, "master did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(ProxyBackend {
            child,
            proxy: format!("127.0.0.1:{port}"),
            log,
            _dir: dir,
        })
    }

    /// A plain HTTP GET of `target` on its `[proxy]` listener as a
    /// balancer sends it for `certname` (verified, DN header only): the
    /// body of a 200, else `None`.
    pub fn get_as(&self, certname: &str, target: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.proxy).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: puppet\r\nConnection: close\r\n\
             X-Client-Verify: SUCCESS\r\nX-Client-DN: CN={certname}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    }

    /// Its mTLS listener as a URL for agents (`https://localhost:port`),
    /// from its `listening on` log line.
    pub fn tls_url(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let addr = text
            .lines()
            .filter(|l| !l.contains("proxy listening on "))
            .find_map(|l| l.split("listening on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the master's listening on line");
        let port = addr.rsplit(':').next().expect("a port");
        format!("https://localhost:{port}")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its access log so far: one JSON object per request.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("target").is_some())
            .collect()
    }
}

impl Drop for ProxyBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (at most 60 s) until every master serves `text` at `rel` of
/// production's `mount` to `certname` (they watch the tree and re-index).
pub fn wait_served(masters: &[ProxyBackend], certname: &str, mount: &str, rel: &str, text: &str) {
    let target = format!("/puppet/v3/file_content/{mount}/{rel}?environment=production");
    let end = Instant::now() + Duration::from_secs(60);
    for m in masters {
        while m.get_as(certname, &target).as_deref() != Some(text) {
            assert!(
                Instant::now() < end,
                "{} never served the new {rel}",
                m.proxy
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
