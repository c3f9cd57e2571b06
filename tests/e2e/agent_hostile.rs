//! The agent against masters and trees that try to hurt the node (issue
//! 17, findings A-1…): modes that would make root's code writable by
//! others, names and messages made of terminal control characters, blob
//! locations pointing at other hosts, answers too large to buffer. Every
//! run is the real `pluginsync-agent` binary against a real master or a
//! scripted [`FakeMaster`].

use std::os::unix::fs::PermissionsExt;

use pluginsync_tests::{AgentHome, EnvTree, Pki, TestMaster, config_toml, parse_config};

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// a 0777 directory and a 0666 fact on the master's tree arrive as
/// 0755 and 0644 (docs/protocol.md §4.5); executables stay executable; a
/// local world-writable file is fixed on the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_and_world_writable_modes_never_reach_the_node() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.dir("production", "alpha", "lib/open", 0o777);
    tree.file("production", "alpha", "lib/open/x.rb", "x\n", 0o666);
    tree.file(
        "production",
        "alpha",
        "lib/open/run.sh",
        "#!/bin/sh\n",
        0o777,
    );
    tree.dir("production", "alpha", "facts.d", 0o777);
    tree.file("production", "alpha", "facts.d/f.txt", "a=1\n", 0o666);
    let master = start(&tree, &pki);
    let home = AgentHome::new(&pki, &[master.url()], "");
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    let (lib, facts) = (home.libdir(), home.factsdir());
    assert_eq!(mode(&lib.join("open")), 0o755);
    assert_eq!(mode(&lib.join("open/x.rb")), 0o644);
    assert_eq!(mode(&lib.join("open/run.sh")), 0o755);
    assert_eq!(mode(&facts.join("f.txt")), 0o644);
    // A local file made world-writable is put back by the next run.
    std::fs::set_permissions(
        lib.join("open/x.rb"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let run = home.sync(&[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(mode(&lib.join("open/x.rb")), 0o644);
}
