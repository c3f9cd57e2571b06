//! Exit statuses of both binaries on bad command lines and bad configs
//! (`agent/src/exit.rs`, `master/src/exit.rs`): a usage error exits 64 and
//! never 0, 2, 4 or 6 (which `--detailed-exitcodes` and the agent unit's
//! `SuccessExitStatus=2` read as a good run); a config error exits 78 in
//! both binaries; `--help` documents the codes.

use std::path::Path;
use std::process::{Command, Stdio};

use pluginsync_tests::bin_path;

/// Runs `bin` with `args`; returns its exit code and stderr.
fn run(bin: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin_path(bin))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

const USAGE_ERRORS: &[(&str, &[&str])] = &[
    ("pluginsync-agent", &["sync", "--enviroment", "production"]),
    ("pluginsync-agent", &["synk"]),
    ("pluginsync-agent", &[]),
    ("pluginsync-agent", &["sync", "--format", "yaml"]),
    ("pluginsync-master", &["serve", "--confg", "/x"]),
    ("pluginsync-master", &["serv"]),
    ("pluginsync-master", &[]),
    ("pluginsync-master", &["dev-certs"]),
];

#[test]
fn a_usage_error_exits_64_never_a_success_code() {
    for (bin, args) in USAGE_ERRORS {
        let (code, err) = run(bin, args);
        assert_eq!(code, 64, "{bin} {args:?}: {err}");
        assert!(![0, 2, 4, 6].contains(&code));
        assert!(
            err.contains("error") || err.contains("Usage"),
            "{bin} {args:?} says what is wrong: {err}"
        );
    }
}

#[test]
fn help_and_version_exit_0_and_help_documents_the_codes() {
    for bin in ["pluginsync-agent", "pluginsync-master"] {
        let (code, out) = run(bin, &["--help"]);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("64") && out.contains("78") && out.contains("Exit status"),
            "{bin} --help documents its exit codes: {out}"
        );
        assert_eq!(run(bin, &["--version"]).0, 0);
    }
}

/// A config file that parses as TOML but names an unknown key.
fn bad_config(dir: &Path) -> String {
    let p = dir.join("bad.toml");
    std::fs::write(&p, "no_such_key = 1\n").unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn a_config_error_exits_78_in_both_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let bad = bad_config(dir.path());
    let missing = dir.path().join("missing.toml");
    let missing = missing.to_str().unwrap();
    let cases: &[(&str, Vec<&str>)] = &[
        ("pluginsync-agent", vec!["sync", "--config", &bad]),
        ("pluginsync-agent", vec!["sync", "--config", missing]),
        ("pluginsync-agent", vec!["report", "--config", &bad]),
        ("pluginsync-agent", vec!["plugins", "--config", &bad]),
        ("pluginsync-master", vec!["serve", "--config", &bad]),
        ("pluginsync-master", vec!["check", "--config", &bad]),
        ("pluginsync-master", vec!["serve", "--config", missing]),
    ];
    for (bin, args) in cases {
        let (code, err) = run(bin, args);
        assert_eq!(code, 78, "{bin} {args:?}: {err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains("config"),
            "one line naming the config: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

/// Each `--format` says what its own subcommand prints: before, `plugins`
/// and `config` showed `sync`'s report text ("one line per change").
#[test]
fn each_format_flag_describes_its_own_output() {
    let help = |sub: &str| {
        let (code, out) = run("pluginsync-agent", &[sub, "--help"]);
        assert_eq!(code, 0, "{out}");
        let format = out.split("--format").nth(1).expect("--format").to_owned();
        format.split("\n  -").next().unwrap_or_default().to_owned()
    };
    for sub in ["sync", "report"] {
        assert!(
            help(sub).contains("One line per change"),
            "{sub}: {}",
            help(sub)
        );
    }
    let plugins = help("plugins");
    assert!(!plugins.contains("per change"), "{plugins}");
    assert!(plugins.contains("One line per plugin"), "{plugins}");
    let config = help("config");
    assert!(!config.contains("per change"), "{config}");
    assert!(config.contains("One line per setting"), "{config}");
}

/// `rollback --environment` says what it does: a rollback brings back one
/// generation, whose own environment the report and the loaders name;
/// the flag names the report's only when nothing is rolled back.
#[test]
fn rollback_environment_help_says_the_generation_names_its_environment() {
    let (code, out) = run("pluginsync-agent", &["rollback", "--help"]);
    assert_eq!(code, 0, "{out}");
    let flag = out.split("--environment").nth(1).expect("--environment");
    let flag = flag.split("\n  -").next().unwrap_or_default();
    let flag = flag.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flag.contains("only when nothing is rolled back")
            && flag.contains("that generation's own environment"),
        "{flag}"
    );
}
