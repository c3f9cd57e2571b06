//! Helpers for hostile-master tests of the agent: [`response_with`], a raw
//! answer with extra headers; [`Listener`], a port that counts who
//! connects to it; [`listing_json`], a listing body from entries; and
//! [`gzip_zeros`], a gzip bomb; `AgentHome::sync_with_data_limit`, a run
//! with bounded memory.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A raw HTTP/1.1 response with `Connection: close`, a `Content-Length`
/// and the extra `headers`.
pub fn response_with(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut r = head.into_bytes();
    r.extend_from_slice(body);
    r
}

/// A listener on 127.0.0.1 that accepts and counts connections (and closes
/// them), until dropped.
pub struct Listener {
    /// Its port.
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    /// The peer address of every accepted connection, in accept order.
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Listener {
    /// Starts listening.
    pub fn start() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (a, s, p) = (accepted.clone(), stop.clone(), peers.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((_, peer)) => {
                        p.lock().expect("peers").push(peer);
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        });
        Listener {
            port,
            accepted,
            peers,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections made before this call, without waiting a fixed time for
    /// the accepting thread: connects once itself and waits (10 s at most)
    /// until that connection is accepted; the kernel's accept queue is in
    /// order, so everything connected earlier has been counted by then.
    pub fn accepted_before_now(&self) -> usize {
        let sentinel = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        let me = sentinel.local_addr().expect("addr");
        let start = std::time::Instant::now();
        loop {
            if let Some(i) = self
                .peers
                .lock()
                .expect("peers")
                .iter()
                .position(|p| *p == me)
            {
                return i;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "the listener never accepted its own connection"
            );
            std::thread::yield_now();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A listing body: `"."` (0755) and `entries` as (relative path, content
/// or `None` for a directory, mode).
pub fn listing_json(entries: &[(&str, Option<&[u8]>, u32)]) -> String {
    let one = |rel: &str, content: Option<&[u8]>, mode: u32| {
        let (kind, sum) = match content {
            Some(c) => (
                "file",
                format!(
                    r#"{{"type":"sha256","value":"{{sha256}}{}"}}"#,
                    crate::sha256_hex(c)
                ),
            ),
            None => (
                "directory",
                r#"{"type":"ctime","value":"{ctime}x"}"#.to_owned(),
            ),
        };
        format!(
            r#"{{"path":"/m","relative_path":{},"links":"follow","owner":0,"group":0,"mode":{mode},"checksum":{sum},"type":"{kind}","destination":null}}"#,
            serde_json::to_string(rel).expect("json string")
        )
    };
    let mut all = vec![one(".", None, 0o755)];
    all.extend(entries.iter().map(|(r, c, m)| one(r, *c, *m)));
    format!("[{}]", all.join(","))
}

/// `n` zero bytes, gzipped (about `n / 1000` bytes).
pub fn gzip_zeros(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let block = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len());
        gz.write_all(&block[..k]).expect("gzip");
        left -= k;
    }
    gz.finish().expect("gzip")
}

/// `lines` copies of `line` after `head`, gzipped as they are made (never
/// held whole): a small body that inflates to `head` + `lines * line`.
pub fn gzip_lines(head: &str, line: &str, lines: usize, tail: &str) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(head.as_bytes()).expect("gzip");
    let block = line.repeat(4096);
    for _ in 0..lines / 4096 {
        gz.write_all(block.as_bytes()).expect("gzip");
    }
    gz.write_all(line.repeat(lines % 4096).as_bytes())
        .expect("gzip");
    gz.write_all(tail.as_bytes()).expect("gzip");
    gz.finish().expect("gzip")
}

impl crate::AgentHome {
    /// Runs `sync <flags>` with the agent's data segment (heap and
    /// anonymous mappings, `RLIMIT_DATA`) limited to `bytes`: an agent that
    /// buffers more fails to allocate and dies instead of finishing.
    pub fn sync_with_data_limit(&self, flags: &[&str], bytes: u64) -> crate::AgentRun {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -d {}; exec \"$0\" \"$@\"", bytes / 1024))
            .arg(crate::bin_path("pluginsync-agent"))
            .arg("sync")
            .args(flags)
            .arg("--config")
            .arg(self.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the agent");
        crate::AgentRun {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A run under an address-space limit, and how much memory it took.
#[derive(Debug)]
pub struct MeasuredRun {
    /// The run: its exit status (134 when an allocation failed and it
    /// aborted), stdout, stderr.
    pub run: crate::AgentRun,
    /// Its peak resident set in bytes (`getrusage`'s `ru_maxrss` of the
    /// agent, as GNU time reports it).
    pub peak: u64,
}

impl crate::AgentHome {
    /// Runs `sync <flags>` under an address-space limit of `bytes`
    /// (`prlimit --as`, `RLIMIT_AS`) and reads its peak resident set
    /// (`/usr/bin/time -f %M`, the agent's own `ru_maxrss` from `wait4`).
    pub fn sync_measured(&self, flags: &[&str], bytes: u64) -> MeasuredRun {
        let report = tempfile::NamedTempFile::new().expect("temp file");
        let out = std::process::Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(report.path())
            .arg("prlimit")
            .arg(format!("--as={bytes}"))
            .arg(crate::bin_path("pluginsync-agent"))
            .arg("sync")
            .args(flags)
            .arg("--config")
            .arg(self.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the agent under /usr/bin/time and prlimit");
        let said = std::fs::read_to_string(report.path()).expect("time's report");
        // The last line is the figure; a line before it may say the
        // command was killed by a signal.
        let kib: u64 = said
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no peak in {said:?}"));
        MeasuredRun {
            run: crate::AgentRun {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
            peak: kib * 1024,
        }
    }
}
