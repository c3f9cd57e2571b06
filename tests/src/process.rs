//! Child processes and the programs they run: the workspace binaries
//! ([`bin_path`]) and the repository ([`repo_root`]), real peers on PATH or
//! a skip ([`which`], [`require`], [`skipped`]), and a command run to its
//! end under a time limit with its output logged ([`run_logged`],
//! [`Finished`]), and a user file modes apply to ([`unprivileged`],
//! [`hand_over`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary (`target/<profile>/<name>`), next to the
/// test executable's `deps/` directory. Build it first: the README's test
/// command runs `cargo build --workspace --bins` before `cargo test`.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} not built: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

/// True when the tests run as root, for whom a file's mode stops nothing.
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A command running `program` as `nobody` (through `setpriv`, no
/// capabilities) when the tests run as root, who reads any file whatever
/// its mode: a test of an unreadable file needs a user the mode applies
/// to. `program` itself otherwise.
pub fn unprivileged(program: &Path) -> Command {
    if !running_as_root() {
        return Command::new(program);
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(program);
    cmd
}

/// Gives the trees at `dirs` (recursively, links not followed) to
/// `nobody` when the tests run as root, so an [`unprivileged`] process
/// reads them as their owner; nothing otherwise (they are the tests' user's
/// already).
pub fn hand_over(dirs: &[&Path]) {
    const NOBODY: u32 = 65534;
    fn give(path: &Path) {
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
        let md = std::fs::symlink_metadata(path).expect("stat");
        if md.is_dir() {
            for e in std::fs::read_dir(path).expect("read_dir") {
                give(&e.expect("entry").path());
            }
        }
    }
    if running_as_root() {
        for d in dirs {
            give(d);
        }
    }
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `name` on PATH (or in /usr/sbin, /sbin).
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        // Debian's daemons (haproxy) live in sbin, not on a user's PATH.
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `tool` (from Debian's `package`) on PATH, or `None` after printing
/// `SKIPPED <test>: …`: a test that needs a real peer calls this first.
/// Under CI (`CI` set) `.ci/run` installs the packages, and a missing one
/// is a failure, not a skip.
pub fn require(tool: &str, package: &str, test: &str) -> Option<PathBuf> {
    let found = which(tool);
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is not installed but CI is set: .ci/run must install Debian's {package} package"
        );
        skipped(
            test,
            &format!("`{tool}` not installed (apt-get install {package})"),
        );
    }
    found
}

/// Prints `SKIPPED <test>: <why>` where `cargo test` shows it: straight
/// to stderr, since libtest captures a passing test's `eprintln!` and the
/// skip would be silent.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// What a child process did.
#[derive(Debug)]
pub struct Finished {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output and error, interleaved.
    pub output: String,
}

/// Runs `cmd` with stdout and stderr into one log file under `dir`; kills
/// it after `limit`.
pub fn run_logged(mut cmd: Command, dir: &Path, limit: Duration) -> Finished {
    let log = dir.join(format!(
        "run-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{:?} did not finish in {limit:?}:\n{}",
                cmd.get_program(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Finished {
        code,
        output: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

/// Asserts that Debian's `promtool check metrics` accepts `text` (a
/// Prometheus exposition); prints `SKIPPED <test>` when promtool is not
/// installed (a failure under CI: `.ci/run` installs `prometheus`).
pub fn promtool_accepts(text: &str, test: &str) {
    let Some(promtool) = require("promtool", "prometheus", test) else {
        return;
    };
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = check.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
