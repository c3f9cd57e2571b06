//! Progress on a terminal while a run downloads (docs/agent.md#progress-on-a-terminal):
//! `pluginsync: downloading 1,234/20,000 files` rewritten in place on
//! stderr every [`TICK`], only when stderr is a terminal and the report is
//! text — never under cron, a pipe, a file or `--format json`, where it
//! would only be noise in a mail or a log. The line is cleared before the
//! report is printed.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the line is redrawn (and how soon it first appears).
pub const TICK: Duration = Duration::from_millis(100);

/// Files staged so far, shared by the downloads and the display.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    /// One more file staged and verified.
    pub fn file_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` more files to download.
    pub fn add_total(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    /// (done, total).
    pub fn get(&self) -> (u64, u64) {
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// `n` with thousands separators.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The progress line for (done, total).
pub fn line(done: u64, total: u64) -> String {
    format!(
        "pluginsync: downloading {}/{} files",
        thousands(done),
        thousands(total)
    )
}

/// The display: a thread redrawing the line until dropped.
pub struct Display {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Display {
    /// Starts drawing `progress` on stderr if `enabled` (a terminal and a
    /// text report: see [`wanted`]); otherwise does nothing.
    pub fn start(progress: Arc<Progress>, enabled: bool) -> Display {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = enabled.then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut drawn = false;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    let (done, total) = progress.get();
                    if total > 0 && !stop.load(Ordering::Relaxed) {
                        let _gone =
                            write!(std::io::stderr().lock(), "\r\x1b[2K{}", line(done, total));
                        drawn = true;
                    }
                }
                if drawn {
                    let _gone = write!(std::io::stderr().lock(), "\r\x1b[2K");
                }
            })
        });
        Display { stop, thread }
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// True when a progress display belongs on stderr: a terminal, and a text
/// report.
pub fn wanted(text_report: bool) -> bool {
    text_report && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(20_000), "20,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(
            line(1234, 20000),
            "pluginsync: downloading 1,234/20,000 files"
        );
        let p = Progress::default();
        p.add_total(3);
        p.file_done();
        assert_eq!(p.get(), (1, 3));
    }
}
