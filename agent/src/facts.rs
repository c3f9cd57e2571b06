//! Fact health (docs/loading.md#fact-health): after a commit that changed
//! facts, each changed fact file is resolved by Facter the way Puppet will
//! resolve it, on the new generation, and a file that errs, hangs or says
//! nothing Facter can parse is a load failure of that file in the report.
//!
//! Executable external facts are first run directly (below). Then one
//! Facter run over every other changed file and every script that passed,
//! together (a view holding them all: one process for the common case of
//! a clean change, and all loaded at once as Puppet loads them); only if
//! it fails, hangs or cannot be read, one run per file, each with its
//! own deadline and its own view: a directory holding only that file,
//! given as `--custom-dir` (a `lib/facter/*.rb`) or `--external-dir` (a
//! facts dir file), the other flag an empty directory, so the system's
//! facts and puppet.conf play no part and a hang or an error is that
//! file's alone. At most [`parallel`] processes run at once (each Facter
//! is a Ruby process: an initial sync of a control repository changes
//! hundreds of fact files, and hundreds of processes at once would starve
//! the node and pass every deadline), so a hanging file costs its
//! deadline in each phase it is in, and a clean change one Facter start.
//! Each run queries the facts a custom fact file adds
//! (`Facter.add(:name)`) and a name no fact has: the file is loaded and
//! those facts resolved, and Facter's core facts never are (resolving them
//! all takes seconds and logs errors of its own). `RUBYLIB` is the libdir,
//! as Puppet's `$LOAD_PATH` has it, so a fact's `require` finds the
//! generation's helpers.
//!
//! Facter says nothing of an executable external fact's exit status, so
//! such a file is first run directly (same deadline, its own process
//! group): a non-zero exit or a hang is its failure, and Facter is not
//! run on it. Every child goes
//! through `launch.rs`: its process group is killed at the deadline and
//! its output is bounded.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use futures_util::StreamExt;

use crate::launch::{LaunchError, run_isolated, run_output};

pub mod config;
pub use config::{ExternalDir, FactsConfig};

/// The loader name fact entries carry in the report.
pub const LOADER: &str = "facter";

/// One fact file's check, as the report's `loads` gets it (loader
/// [`LOADER`]; `sync/loads.rs` makes the entry, so this module needs
/// nothing of the loaders').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactCheck {
    /// `plugins/facter/x.rb` or `pluginfacts/x.sh`.
    pub path: String,
    /// Why it failed (one line); `None`: resolved.
    pub error: Option<String>,
    /// Its load time: the check's wall time.
    pub duration_ms: u64,
}

/// A fact name no fact has: asked so that Facter loads every fact file
/// of the view even when the file adds no fact this module can name.
const PROBE: &str = "pluginsync_fact_check";

/// The most fact names one Facter run over every changed file asks (its
/// command line stays far below the kernel's bound); more are checked
/// file by file.
const MAX_NAMES_TOGETHER: usize = 2048;

/// A changed fact file, and how Facter is given it.
struct FactFile {
    /// `plugins/facter/x.rb` or `pluginfacts/x.sh`.
    path: String,
    /// The live file.
    abs: PathBuf,
    /// A custom fact (`--custom-dir`), else an external one.
    custom: bool,
}

/// The fact files among `written`: `facter/*.rb` of the plugins (Facter
/// loads a custom-dir's top level) and the top level of the facts dir.
fn fact_files(
    libdir: &Path,
    factsdir: Option<&Path>,
    written: &[(Mount, RelPath)],
) -> Vec<FactFile> {
    written
        .iter()
        .filter_map(|(mount, rel)| {
            let r = rel.as_str();
            let (custom, root) = match mount {
                Mount::Plugins => {
                    let name = r.strip_prefix("facter/")?;
                    if !name.ends_with(".rb") || name.contains('/') {
                        return None;
                    }
                    (true, libdir)
                }
                Mount::Pluginfacts if r.contains('/') => return None,
                Mount::Pluginfacts => (false, factsdir?),
            };
            Some(FactFile {
                path: format!("{mount}/{r}"),
                abs: rel.to_path(root),
                custom,
            })
        })
        .collect()
}

/// Checks the fact files among `written` (under the live `libdir` and
/// `factsdir`) with Facter, in views under `vardir` (module docs): one
/// [`FactCheck`] per fact file. Nothing when facts are not checked
/// ([`FactsConfig::facter`]) or none changed.
pub async fn check(
    config: &FactsConfig,
    libdir: &Path,
    factsdir: Option<&Path>,
    vardir: &Path,
    written: &[(Mount, RelPath)],
) -> Vec<FactCheck> {
    let files = fact_files(libdir, factsdir, written);
    if files.is_empty() {
        return Vec::new();
    }
    let Some(facter) = config.facter() else {
        return Vec::new();
    };
    let work = vardir.join("fact-check");
    if let Err(e) = fresh_dir(&work) {
        tracing::warn!(dir = %work.display(), error = %e, "cannot make the fact check's directories; facts are not checked");
        return Vec::new();
    }
    let empty = work.join("empty");
    let run = Run {
        facter: &facter,
        libdir,
        empty: &empty,
        work: &work,
        timeout: config.timeout,
    };
    let entries = run.all(&files).await;
    let _gone_is_fine = std::fs::remove_dir_all(&work);
    entries
}

/// How many fact checks run at once: the node's cores, at least 2 and at
/// most 8 (module docs).
fn parallel() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// `work` made anew (what an earlier run left goes first), with
/// `work/empty/` in it.
fn fresh_dir(work: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    new_dir(&work.join("empty"))
}

/// A directory only this user reads (and its parents).
fn new_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
}

/// A view: `dir` holding a link to each of `files` under its own name.
fn view<'a>(dir: &Path, files: impl IntoIterator<Item = &'a FactFile>) -> std::io::Result<()> {
    new_dir(dir)?;
    for file in files {
        let name = file.abs.file_name().unwrap_or_default();
        std::os::unix::fs::symlink(&file.abs, dir.join(name))?;
    }
    Ok(())
}

/// Why a fact file failed: the line its entry reports.
#[derive(Debug, thiserror::Error)]
enum FactError {
    /// An executable external fact run on its own failed or hung.
    #[error("{path}: {source}")]
    Script {
        /// The file.
        path: String,
        /// How it failed.
        source: LaunchError,
    },
    /// Facter did not finish within the file's deadline.
    #[error("Facter did not resolve it within {} (killed with its process group)", humantime_serde::re::humantime::format_duration(*.0))]
    TimedOut(Duration),
    /// Facter could not be run.
    #[error("Facter: {0}")]
    Launch(LaunchError),
    /// The file's view could not be made.
    #[error("cannot make its view for Facter: {0}")]
    View(std::io::Error),
    /// An `ERROR` line of Facter's (its message).
    #[error("Facter: {0}")]
    Error(String),
    /// Facter's non-zero exit (`None`: killed by a signal).
    #[error("Facter exited with {}", match .0 { Some(c) => format!("status {c}"), None => "a signal".to_owned() })]
    Exit(Option<i32>),
    /// A fact file Facter could not parse (its debug line's message).
    #[error("unparsable output: Facter: {0}")]
    Unparsable(String),
    /// Facter's answer is not a JSON object.
    #[error("unparsable output: Facter's answer is not a JSON object")]
    NotJson,
}

/// What every file's check shares.
struct Run<'a> {
    facter: &'a Path,
    libdir: &'a Path,
    empty: &'a Path,
    /// Where the views are made.
    work: &'a Path,
    timeout: Duration,
}

impl Run<'_> {
    /// Every file's entry: each executable external fact run on its own,
    /// then one Facter run over every file whose script passed, and only
    /// if that fails, one Facter run per such file (module docs); at most
    /// [`parallel`] processes at once.
    async fn all(&self, files: &[FactFile]) -> Vec<FactCheck> {
        let started = Instant::now();
        let scripts: Vec<(Option<Result<(), FactError>>, Duration)> =
            futures_util::stream::iter(files.iter().map(|f| async move {
                let t = Instant::now();
                let ran = match !f.custom && executable(&f.abs) {
                    true => Some(self.script(f).await),
                    false => None,
                };
                (ran, t.elapsed())
            }))
            .buffered(parallel())
            .collect()
            .await;
        let rest: Vec<usize> = (0..files.len())
            .filter(|i| !matches!(scripts[*i].0, Some(Err(_))))
            .collect();
        let together = self.together(files, &rest).await;
        let together_took = started.elapsed();
        let mut facter: Vec<Option<(Result<(), FactError>, Duration)>> =
            (0..files.len()).map(|_| None).collect();
        if together {
            for i in &rest {
                facter[*i] = Some((Ok(()), together_took));
            }
        } else {
            let each = rest.iter().map(|i| async move {
                let t = Instant::now();
                (*i, self.alone(*i, &files[*i]).await, t.elapsed())
            });
            let done: Vec<_> = futures_util::stream::iter(each)
                .buffer_unordered(parallel())
                .collect()
                .await;
            for (i, result, took) in done {
                facter[i] = Some((result, scripts[i].1 + took));
            }
        }
        (files.iter().zip(scripts).zip(facter))
            .map(|((file, (script, script_took)), facter)| {
                let (result, took) = match (script, facter) {
                    (Some(Err(e)), _) => (Err(e), script_took),
                    (_, Some(done)) => done,
                    (_, None) => (Ok(()), script_took),
                };
                entry(file, result, took)
            })
            .collect()
    }

    /// Whether one Facter run over the files `which` of `files` (views
    /// `<work>/custom` and `<work>/external`) finds nothing wrong within
    /// the deadline.
    async fn together(&self, files: &[FactFile], which: &[usize]) -> bool {
        if which.is_empty() {
            return true;
        }
        let (custom, external) = (self.work.join("custom"), self.work.join("external"));
        let chosen = || which.iter().map(|i| &files[*i]);
        let made = view(&custom, chosen().filter(|f| f.custom))
            .and_then(|()| view(&external, chosen().filter(|f| !f.custom)));
        if let Err(e) = made {
            tracing::debug!(error = %e, "no view of the changed facts together; checking each");
            return false;
        }
        let mut names: Vec<String> = (chosen().filter(|f| f.custom))
            .flat_map(|f| fact_names(&std::fs::read(&f.abs).unwrap_or_default()))
            .collect();
        names.sort();
        names.dedup();
        if names.len() > MAX_NAMES_TOGETHER {
            return false;
        }
        match self.facter((&custom, &external), names, self.timeout).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(files = which.len(), error = %e, "the changed facts together failed; checking each");
                false
            }
        }
    }

    /// Facter on `file` alone: a view `<work>/<i>` holding only it.
    async fn alone(&self, i: usize, file: &FactFile) -> Result<(), FactError> {
        let dir = self.work.join(i.to_string());
        view(&dir, [file]).map_err(FactError::View)?;
        let (dirs, names) = match file.custom {
            true => (
                (dir.as_path(), self.empty),
                fact_names(&std::fs::read(&file.abs).unwrap_or_default()),
            ),
            false => ((self.empty, dir.as_path()), Vec::new()),
        };
        self.facter(dirs, names, self.timeout).await
    }

    /// An executable external fact run directly, within the deadline.
    async fn script(&self, file: &FactFile) -> Result<(), FactError> {
        run_isolated(
            &[file.abs.display().to_string()],
            &BTreeMap::new(),
            file.abs.parent(),
            self.timeout,
        )
        .await
        .map(drop)
        .map_err(|source| FactError::Script {
            path: file.abs.display().to_string(),
            source,
        })
    }

    /// Facter on the views `(custom, external)` asked for `names` (and
    /// [`PROBE`]), within `timeout`: an error line, a non-zero exit,
    /// output Facter could not parse or that is not JSON, or the deadline,
    /// is a failure.
    async fn facter(
        &self,
        (custom, external): (&Path, &Path),
        names: Vec<String>,
        timeout: Duration,
    ) -> Result<(), FactError> {
        let mut argv: Vec<String> = [
            self.facter.as_os_str(),
            "--json".as_ref(),
            "--no-color".as_ref(),
            "--no-cache".as_ref(),
            "--debug".as_ref(),
            "--custom-dir".as_ref(),
            custom.as_os_str(),
            "--external-dir".as_ref(),
            external.as_os_str(),
            PROBE.as_ref(),
        ]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
        argv.extend(names);
        let env = BTreeMap::from([("RUBYLIB".to_owned(), self.libdir.display().to_string())]);
        let (status, out) = match run_output(&argv, &env, None, timeout).await {
            Ok(done) => done,
            Err(LaunchError::TimedOut(_)) => return Err(FactError::TimedOut(self.timeout)),
            Err(e) => return Err(FactError::Launch(e)),
        };
        judge(status.code(), &out.stdout, &out.stderr)
    }
}

/// `file`'s entry: its check's `result`, which `took` so long.
fn entry(file: &FactFile, result: Result<(), FactError>, took: Duration) -> FactCheck {
    match &result {
        Ok(()) => tracing::info!(file = %file.path, loader = LOADER, "fact resolved"),
        Err(e) => tracing::debug!(file = %file.path, loader = LOADER, error = %e, "fact failed"),
    }
    FactCheck {
        path: file.path.clone(),
        error: result.err().map(|e| {
            pluginsync_common::text::escape(&e.to_string())
                .chars()
                .take(400)
                .collect()
        }),
        duration_ms: took.as_millis() as u64,
    }
}

/// Whether `path` is a file Facter runs: executable, and not of the
/// extensions it parses instead (`.txt`, `.json`, `.yaml`).
fn executable(path: &Path) -> bool {
    let parsed = ["txt", "json", "yaml"]
        .iter()
        .any(|e| path.extension().is_some_and(|x| x == *e));
    !parsed
        && std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Facter's verdict on one file from its exit status `code` and output:
/// the first `ERROR` line, a non-zero exit, a fact file it could not
/// parse (its debug line), or output that is not a JSON object.
fn judge(code: Option<i32>, stdout: &[u8], stderr: &[u8]) -> Result<(), FactError> {
    let stderr = String::from_utf8_lossy(stderr);
    // `[<time> ] ERROR Facter - <message>`: the message.
    let message = |l: &str, level: &str| {
        let m = l.split_once(level).map_or(l, |(_, m)| m);
        m.split_once(" - ").map_or(m, |(_, m)| m).trim().to_owned()
    };
    if let Some(line) = stderr.lines().find(|l| l.contains(" ERROR ")) {
        return Err(FactError::Error(message(line, " ERROR ")));
    }
    if code != Some(0) {
        return Err(FactError::Exit(code));
    }
    if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("was parsed but no key=>value data was returned"))
    {
        return Err(FactError::Unparsable(message(line, " DEBUG ")));
    }
    match serde_json::from_slice::<serde_json::Value>(stdout) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => Err(FactError::NotJson),
    }
}

/// The facts a custom fact file adds, as `Facter.add(:name)`,
/// `Facter.add('name')` or `Facter.add "name"` name them (at most 64).
fn fact_names(text: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(text);
    let mut names: Vec<String> = text
        .split("Facter.add")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start().trim_start_matches('(').trim_start();
            let rest = rest
                .strip_prefix(':')
                .or_else(|| rest.strip_prefix(['\'', '"']))?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect();
    names.sort();
    names.dedup();
    names.truncate(64);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fact_names_are_read_as_facter_add_names_them() {
        let text = b"Facter.add(:one) { setcode { 1 } }\nFacter.add('two') do\nend\n\
                     Facter.add \"three\" do end\nFacter.add(x)\nFacter.add( :one )";
        assert_eq!(fact_names(text), ["one", "three", "two"]);
    }

    #[test]
    fn facter_errors_exits_and_unparsable_output_are_failures() {
        let ok = br#"{"a": 1}"#;
        let judged =
            |code, out: &[u8], err: &[u8]| judge(code, out, err).map_err(|e| e.to_string());
        assert_eq!(judged(Some(0), ok, b"[t ] DEBUG Facter - fine\n"), Ok(()));
        assert_eq!(
            judged(
                Some(1),
                ok,
                b"[t ] ERROR Facter - Error while resolving custom fact fact='x': boom\n"
            ),
            Err("Facter: Error while resolving custom fact fact='x': boom".to_owned())
        );
        assert_eq!(
            judged(Some(3), ok, b""),
            Err("Facter exited with status 3".to_owned())
        );
        assert!(
            judged(Some(0), ok, b"[t ] DEBUG LegacyFacter::Util::DirectoryLoader - Fact file /v/g.sh was parsed but no key=>value data was returned\n")
                .is_err_and(|e| e.starts_with("unparsable output"))
        );
        assert!(judged(Some(0), b"garbage", b"").is_err());
    }

    #[test]
    fn fact_files_are_the_custom_dir_and_the_facts_dir_top_levels() {
        let rel = |s: &str| RelPath::parse(s).unwrap();
        let written = [
            (Mount::Plugins, rel("facter/a.rb")),
            (Mount::Plugins, rel("facter/util/helper.rb")),
            (Mount::Plugins, rel("puppet/functions/f.rb")),
            (Mount::Pluginfacts, rel("b.sh")),
            (Mount::Pluginfacts, rel("sub/c.txt")),
        ];
        let files = fact_files(Path::new("/l"), Some(Path::new("/f")), &written);
        let got: Vec<(&str, &Path, bool)> = files
            .iter()
            .map(|f| (f.path.as_str(), f.abs.as_path(), f.custom))
            .collect();
        assert_eq!(
            got,
            [
                ("plugins/facter/a.rb", Path::new("/l/facter/a.rb"), true),
                ("pluginfacts/b.sh", Path::new("/f/b.sh"), false),
            ]
        );
        assert!(fact_files(Path::new("/l"), None, &written[3..]).is_empty());
    }
}
