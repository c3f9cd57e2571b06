//! Progress on a terminal (`agent/src/progress.rs`): a first sync of 20,000
//! files run under a pseudo-terminal (util-linux `script`) shows its
//! downloads before the run ends; the same run with stdout and stderr to
//! files writes no progress at all.

use std::process::{Command, Stdio};

use pluginsync_tests::{AgentHome, EnvTree, Pki, TestMaster, bin_path, config_toml, parse_config};

const FILES: usize = 20_000;

fn big_tree() -> EnvTree {
    let tree = EnvTree::in_memory();
    for i in 0..FILES {
        tree.file(
            "production",
            "m",
            &format!("lib/d{}/f{i}.rb", i % 100),
            format!("# {i}\n").as_bytes(),
            0o644,
        );
    }
    tree
}

#[test]
fn progress_shows_on_a_terminal_and_never_in_files() {
    let Some(script) = pluginsync_tests::which("script") else {
        pluginsync_tests::skipped("agent_progress", "`script` (util-linux) not installed");
        return;
    };
    let (tree, pki) = (big_tree(), Pki::new());
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));

    // Under a pseudo-terminal: `script` runs the agent with its stdio on a
    // pty and copies what it wrote to our pipe.
    let tty = AgentHome::in_memory(&pki, &[master.url()], "");
    let command = format!(
        "{} sync --config {}",
        bin_path("pluginsync-agent").display(),
        tty.path().join("agent.toml").display()
    );
    let out = Command::new(script)
        .args(["-qfec", &command, "/dev/null"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let progress = text.find("pluginsync: downloading ").unwrap_or_else(|| {
        panic!(
            "no progress on a terminal:\n{}",
            &text[..text.len().min(2000)]
        )
    });
    let end = text.rfind(" created, ").expect("the summary line");
    assert!(progress < end, "progress came before the end of the run");
    assert!(
        text.contains(&format!("/{} files", "20,000")),
        "the total is shown"
    );

    // To files (cron, a pipe, a log): nothing but the report.
    let files = AgentHome::in_memory(&pki, &[master.url()], "");
    let run = files.sync(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        !run.stderr.contains("downloading") && !run.stdout.contains("downloading"),
        "no progress off a terminal: {}",
        run.stderr
    );
    assert!(!run.stderr.contains('\r'));
    assert_eq!(
        std::fs::read_dir(files.libdir()).unwrap().count(),
        100,
        "the sync itself happened"
    );
}
