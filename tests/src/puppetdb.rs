//! A throwaway PuppetDB 7 (Debian's `puppetdb` package) for the tests that
//! check what Puppet's own inventory learns from a node
//! (docs/puppet-fleet.md#the-pluginsync-fact-in-puppetdb): its own
//! configuration directory in a temp dir, its database a new one in the
//! test's [`crate::Postgres`] (with `pg_trgm`, which PuppetDB requires,
//! created as the superuser), HTTPS on a loopback port with the Puppet
//! Server's own certificate (the terminus Puppet Server stores facts with
//! speaks HTTPS only) and plain HTTP on another for the test's queries.
//! The JVM is killed on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Postgres, closed_port, skipped, which};

const JAR: &str = "/usr/share/puppetdb/puppetdb.jar";
const BOOTSTRAP: &str = "/etc/puppetdb/bootstrap.cfg";
const AUTH: &str = "/etc/puppetdb/conf.d/auth.conf";
const TERMINUS: &str = "/usr/lib/ruby/vendor_ruby/puppet/indirector/facts/puppetdb.rb";

/// A running PuppetDB (module docs).
pub struct PuppetDb {
    dir: tempfile::TempDir,
    child: Child,
    http: u16,
}

impl PuppetDb {
    /// Whether `test` can run a PuppetDB: Debian's `puppetdb` and
    /// `puppet-terminus-puppetdb` installed; otherwise a visible `SKIPPED`
    /// line — or, under `CI`, a failure (`.ci/run` installs both).
    pub fn required(test: &str) -> bool {
        let files = [JAR, BOOTSTRAP, AUTH, TERMINUS];
        if files.iter().all(|f| Path::new(f).is_file()) && which("java").is_some() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "puppetdb is not installed but CI is set: .ci/run must install puppetdb and puppet-terminus-puppetdb"
        );
        skipped(
            test,
            "PuppetDB not installed (apt-get install puppetdb puppet-terminus-puppetdb)",
        );
        false
    }

    /// Starts PuppetDB's JVM with HTTPS on `https` (the certificate and key
    /// of `certname` in Puppet's `ssldir`, clients verified against its
    /// `certs/ca.pem`) and its database a new one in `pg`; returns at once
    /// ([`Self::wait_running`] waits), so it starts beside Puppet Server.
    pub fn spawn(pg: &Postgres, ssldir: &Path, certname: &str, https: u16) -> PuppetDb {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = pg.database();
        pg.sql(&url, "CREATE EXTENSION IF NOT EXISTS pg_trgm");
        let name = url
            .rsplit_once('/')
            .and_then(|(_, n)| n.split('?').next())
            .expect("database name")
            .to_owned();
        let http = closed_port();
        let d = dir.path();
        std::fs::create_dir_all(d.join("conf.d")).expect("conf.d");
        std::fs::create_dir_all(d.join("var")).expect("vardir");
        let write = |rel: &str, text: String| std::fs::write(d.join(rel), text).expect(rel);
        write(
            "conf.d/config.ini",
            format!(
                "[global]\nvardir = {d}/var\nlogging-config = {d}/logback.xml\n\n\
                 [command-processing]\nthreads = 1\n\n\
                 [puppetdb]\ndisable-update-checking = true\n",
                d = d.display(),
            ),
        );
        // Trust authentication on loopback (the harness's server): any
        // password is accepted.
        write(
            "conf.d/database.ini",
            format!(
                "[database]\nsubname = //127.0.0.1:{}/{name}\nusername = postgres\npassword = unused\n",
                pg.port()
            ),
        );
        write(
            "conf.d/jetty.ini",
            format!(
                "[jetty]\nhost = 127.0.0.1\nport = {http}\nssl-host = 127.0.0.1\nssl-port = {https}\n\
                 ssl-key = {ssl}/private_keys/{certname}.pem\nssl-cert = {ssl}/certs/{certname}.pem\n\
                 ssl-ca-cert = {ssl}/certs/ca.pem\n",
                ssl = ssldir.display(),
            ),
        );
        std::fs::copy(AUTH, d.join("conf.d/auth.conf")).expect("auth.conf");
        write(
            "logback.xml",
            format!(
                "<configuration>\n  <appender name=\"F\" class=\"ch.qos.logback.core.FileAppender\">\n    \
                 <file>{}/puppetdb.log</file>\n    <encoder><pattern>%d %-5p [%c{{2}}] %m%n</pattern></encoder>\n  \
                 </appender>\n  <root level=\"info\"><appender-ref ref=\"F\"/></root>\n</configuration>\n",
                d.display()
            ),
        );
        let out = std::fs::File::create(d.join("stdout.log")).expect("log");
        // Debian's unit's command (a heap a little above
        // /etc/default/puppetdb's), niced: it starts beside Puppet Server,
        // whose start keeps the CPU it would have alone.
        let child = Command::new("nice")
            .args([
                "-n",
                "10",
                "java",
                "-Xmx256m",
                "-Djava.security.egd=/dev/urandom",
            ])
            .args(["-cp", JAR])
            .args(["clojure.main", "-m", "puppetlabs.puppetdb.core", "services"])
            .arg("--config")
            .arg(d.join("conf.d"))
            .args(["--bootstrap-config", BOOTSTRAP])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("spawn puppetdb");
        PuppetDb { dir, child, http }
    }

    /// Waits (at most `limit`) until PuppetDB says it is running: its
    /// database migrated, commands and queries taken.
    pub fn wait_running(&mut self, limit: Duration) {
        let start = Instant::now();
        loop {
            let status = self.get("/status/v1/services/puppetdb-status");
            if status["state"] == "running" {
                return;
            }
            if let Some(exit) = self.child.try_wait().expect("wait") {
                panic!(
                    "puppetdb exited ({exit}) while starting:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                start.elapsed() < limit,
                "puppetdb not running after {limit:?} (last status {status}):\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `GET path_and_query` on its plain-HTTP port, as JSON (`Null` when
    /// it does not answer with JSON within 30 s).
    fn get(&self, path_and_query: &str) -> serde_json::Value {
        pluginsync_common::tls::install_default_provider();
        let url = format!("http://127.0.0.1:{}{path_and_query}", self.http);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .ok()?;
            client.get(url).send().await.ok()?.json().await.ok()
        })
        .unwrap_or(serde_json::Value::Null)
    }

    /// The answer to a PQL query (`GET /pdb/query/v4?query=…`).
    pub fn query(&self, pql: &str) -> serde_json::Value {
        let mut url = url::Url::parse("http://127.0.0.1/pdb/query/v4").expect("url");
        url.query_pairs_mut().append_pair("query", pql);
        self.get(&format!(
            "/pdb/query/v4?{}",
            url.query().unwrap_or_default()
        ))
    }

    /// The last lines of what it logged.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["stdout.log", "puppetdb.log"] {
            let log = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            text.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
            text.push('\n');
        }
        text
    }
}

impl Drop for PuppetDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
