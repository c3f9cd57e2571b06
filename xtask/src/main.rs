//! `pluginsync-xtask`: what the Debian packages ship that is generated from
//! the code rather than written by hand — the man pages (with EXIT STATUS
//! from each binary's `exit.rs` table) and the bash, zsh and fish
//! completions, all from the binaries' clap definitions (`cli.rs`).
//!
//! `scripts/build-debs.sh` runs `pluginsync-xtask generate <dir>` before
//! `cargo deb`; the layout it writes is what `[package.metadata.deb]`
//! assets in `master/Cargo.toml` and `agent/Cargo.toml` name (see
//! `packaging/README.md`).

mod man;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

/// One binary the packages ship: its clap command and its man page data.
pub struct Binary {
    /// The program name (`pluginsync-agent`).
    pub name: &'static str,
    /// The man section: 8 for a daemon in /usr/sbin, 1 for a user command.
    pub section: &'static str,
    /// The clap definition.
    pub command: clap::Command,
    /// The binary's `EXIT_STATUS_HELP` table from its `exit.rs`.
    pub exit_status_help: &'static str,
    /// The FILES section: path and what it is.
    pub files: Vec<(String, &'static str)>,
    /// Pages named in SEE ALSO (`name(section)`).
    pub see_also: &'static [&'static str],
}

/// The two binaries, from their crates' `cli.rs`, `exit.rs` and `config.rs`.
pub fn binaries() -> Vec<Binary> {
    vec![
        Binary {
            name: "pluginsync-master",
            section: "8",
            command: pluginsync_master::cli::Cli::command(),
            exit_status_help: pluginsync_master::exit::EXIT_STATUS_HELP,
            files: vec![
                (
                    pluginsync_master::config::DEFAULT_CONFIG.to_owned(),
                    "The configuration (every key listed with its default); `pluginsync-master check` validates it.",
                ),
                (
                    "/etc/pluginsync/ssl/".to_owned(),
                    "The master's certificate, key, CA bundle and CRL in the shipped configuration (readable by the pluginsync user).",
                ),
                (
                    "/etc/puppet/code/environments/".to_owned(),
                    "The environments served in the shipped configuration (Debian's Puppet codedir).",
                ),
                (
                    "/usr/lib/systemd/system/pluginsync-master.service".to_owned(),
                    "The service unit (runs as the pluginsync user; SIGHUP reloads the TLS files).",
                ),
            ],
            see_also: &["pluginsync-agent(1)", "systemctl(1)"],
        },
        Binary {
            name: "pluginsync-agent",
            section: "1",
            command: pluginsync_agent::cli::Cli::command(),
            exit_status_help: pluginsync_agent::exit::EXIT_STATUS_HELP,
            files: vec![
                (
                    pluginsync_agent::config::DEFAULT_CONFIG.to_owned(),
                    "The configuration (every key listed with its default).",
                ),
                (
                    "/var/lib/pluginsync/".to_owned(),
                    "The default vardir: the run lock (agent.lock), the last report (last_run_report.json), the listing cache (cache/) and the plugin registry (plugins.json).",
                ),
                (
                    "/var/lib/pluginsync/lib/".to_owned(),
                    "The default libdir, where the plugins mount is synced to.",
                ),
                (
                    "/var/lib/puppet/ssl/".to_owned(),
                    "Debian's Puppet ssldir, used by the shipped configuration for the node's certificate, key, CA and CRL.",
                ),
                (
                    "/usr/lib/systemd/system/pluginsync-agent.timer".to_owned(),
                    "The timer that runs pluginsync-agent.service (one sync) every 30 minutes and soon after boot.",
                ),
            ],
            see_also: &["pluginsync-master(8)", "systemd.timer(5)"],
        },
    ]
}

/// Writes `<out>/man/<page>.<section>` for each binary and each of its
/// subcommands, and `<out>/completions/{bash,zsh,fish}/…`.
pub fn generate(out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man_dir = out.join("man");
    fs::create_dir_all(&man_dir).with_context(|| format!("cannot create {}", man_dir.display()))?;
    for bin in binaries() {
        for (file, page) in man::pages(&bin)? {
            let path = man_dir.join(file);
            fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
        for (shell, dir, file) in [
            (Shell::Bash, "bash", bin.name.to_owned()),
            (Shell::Zsh, "zsh", format!("_{}", bin.name)),
            (Shell::Fish, "fish", format!("{}.fish", bin.name)),
        ] {
            let dir = out.join("completions").join(dir);
            fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let mut script = Vec::new();
            let mut cmd = bin.command.clone();
            clap_complete::generate(shell, &mut cmd, bin.name, &mut script);
            let path = dir.join(file);
            fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [verb, out] if verb == "generate" => generate(Path::new(out)).map(|written| {
            for path in written {
                println!("{}", path.display());
            }
        }),
        _ => Err(anyhow::anyhow!(
            "usage: pluginsync-xtask generate <dir>  (writes man/ and completions/ under <dir>)"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_every_page_and_completion() {
        let dir = tempfile::tempdir().unwrap();
        let written = generate(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        for expected in [
            "man/pluginsync-master.8",
            "man/pluginsync-master-serve.8",
            "man/pluginsync-master-check.8",
            "man/pluginsync-master-dev-certs.8",
            "man/pluginsync-agent.1",
            "man/pluginsync-agent-sync.1",
            "man/pluginsync-agent-report.1",
            "man/pluginsync-agent-rollback.1",
            "completions/bash/pluginsync-agent",
            "completions/zsh/_pluginsync-master",
            "completions/fish/pluginsync-agent.fish",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not in {names:?}"
            );
        }
        let bash =
            fs::read_to_string(dir.path().join("completions/bash/pluginsync-agent")).unwrap();
        assert!(bash.contains("--detailed-exitcodes"), "{bash}");
    }
}
