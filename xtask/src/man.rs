//! Man pages from a binary's clap definition (`clap_mangen`), with the
//! sections clap knows nothing about: EXIT STATUS, parsed from the
//! binary's `EXIT_STATUS_HELP` table in its `exit.rs` (the one place the
//! numbers are written), FILES and SEE ALSO.

use anyhow::bail;
use clap_mangen::Man;
use roff::{Roff, bold, italic, roman};

use crate::Binary;

/// The exit statuses of an `EXIT_STATUS_HELP` table: its first line is a
/// heading, then one `  <code>   <meaning>` line per status.
pub fn exit_statuses(help: &str) -> anyhow::Result<Vec<(u8, String)>> {
    let mut out: Vec<(u8, String)> = Vec::new();
    for raw in help.lines().skip(1) {
        let line = raw.trim();
        // A row is `  <code>  <meaning>`; a line indented past the code
        // column continues the meaning above it.
        let indent = raw.len() - raw.trim_start().len();
        if indent > 2
            && !line.starts_with(|c: char| c.is_ascii_digit())
            && let Some((_, meaning)) = out.last_mut()
        {
            meaning.push(' ');
            meaning.push_str(line);
            continue;
        }
        let Some((code, meaning)) = line.split_once(char::is_whitespace) else {
            bail!("exit status line without a meaning: {line:?}");
        };
        let Ok(code) = code.parse::<u8>() else {
            bail!("exit status line not starting with a code: {line:?}");
        };
        out.push((code, meaning.trim().to_owned()));
    }
    if out.is_empty() {
        bail!("empty exit status table");
    }
    Ok(out)
}

/// Every page of one binary: `(file name, roff text)` for the binary and
/// for each visible subcommand (`pluginsync-agent-sync.1`).
pub fn pages(bin: &Binary) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    // EXIT_STATUS_HELP is also the after-help text: here it gets its own
    // section, so it is not repeated as clap_mangen's EXTRA section.
    let mut cmd = bin
        .command
        .clone()
        .after_help(None::<&str>)
        .disable_help_subcommand(true);
    cmd.build();
    let statuses = exit_statuses(bin.exit_status_help)?;
    let mut out = Vec::new();
    let mut todo = vec![cmd];
    while let Some(cmd) = todo.pop() {
        todo.extend(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .cloned()
                .collect::<Vec<_>>()
                .into_iter()
                .rev(),
        );
        let man = Man::new(cmd.clone())
            .section(bin.section)
            .manual("pluginsync")
            .source(format!("pluginsync {}", env!("CARGO_PKG_VERSION")));
        let file = man.get_filename();
        out.push((file, render(&man, &cmd, bin, &statuses)?));
    }
    Ok(out)
}

/// One page: clap_mangen's sections, then EXIT STATUS, FILES, SEE ALSO,
/// then the version.
fn render(
    man: &Man,
    cmd: &clap::Command,
    bin: &Binary,
    statuses: &[(u8, String)],
) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut buf)?;
    }
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in statuses {
        roff.control("TP", [] as [&str; 0]);
        roff.text([bold(code.to_string())]);
        roff.text([roman(meaning.as_str())]);
    }
    roff.control("SH", ["FILES"]);
    for (path, what) in &bin.files {
        roff.control("TP", [] as [&str; 0]);
        roff.text([italic(path.as_str())]);
        roff.text([roman(*what)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    let mut refs: Vec<String> = Vec::new();
    if cmd.get_name() != bin.name {
        refs.push(format!("{}({})", bin.name, bin.section));
    }
    refs.extend(bin.see_also.iter().map(|s| (*s).to_owned()));
    refs.push("the README in /usr/share/doc/".to_owned() + bin.name);
    roff.text([roman(refs.join(", "))]);
    roff.to_writer(&mut buf)?;
    // Subcommands carry no version of their own (clap_mangen would panic).
    if cmd.get_version().is_some() {
        man.render_version_section(&mut buf)?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_come_from_the_exit_rs_tables() {
        let agent = exit_statuses(pluginsync_agent::exit::EXIT_STATUS_HELP).unwrap();
        let codes: Vec<u8> = agent.iter().map(|(c, _)| *c).collect();
        use pluginsync_agent::exit::ExitStatus as A;
        for s in [
            A::Success,
            A::Failure,
            A::Changes,
            A::Failures,
            A::ChangesAndFailures,
            A::Usage,
            A::Config,
            A::Busy,
            A::Interrupted,
            A::Terminated,
        ] {
            assert!(codes.contains(&s.code()), "{s:?} missing from {codes:?}");
        }
        let master = exit_statuses(pluginsync_master::exit::EXIT_STATUS_HELP).unwrap();
        let codes: Vec<u8> = master.iter().map(|(c, _)| *c).collect();
        use pluginsync_master::exit::ExitStatus as M;
        for s in [M::Success, M::Failure, M::Usage, M::Config] {
            assert!(codes.contains(&s.code()), "{s:?} missing from {codes:?}");
        }
    }

    #[test]
    fn a_meaning_may_continue_on_indented_lines() {
        let t = exit_statuses("Exit status:\n  0   fine\n  130 stopped (before:\n      nothing changed)\n  143 as 130")
            .unwrap();
        assert_eq!(
            t,
            vec![
                (0, "fine".to_owned()),
                (130, "stopped (before: nothing changed)".to_owned()),
                (143, "as 130".to_owned())
            ]
        );
    }

    #[test]
    fn a_malformed_table_is_refused() {
        assert!(exit_statuses("Exit status:\n  x  nothing").is_err());
        assert!(exit_statuses("Exit status:").is_err());
    }

    #[test]
    fn the_page_has_exit_status_and_files() {
        let bin = crate::binaries().remove(1);
        let pages = pages(&bin).unwrap();
        let (name, text) = &pages[0];
        assert_eq!(name, "pluginsync-agent.1");
        let text = String::from_utf8(text.clone()).unwrap();
        for needle in [
            "EXIT STATUS",
            "FILES",
            "/etc/pluginsync/agent.toml",
            "\\fB78\\fR",
        ] {
            assert!(text.contains(needle), "{needle} not in\n{text}");
        }
        assert!(!text.contains("EXTRA"), "{text}");
    }
}
