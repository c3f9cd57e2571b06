//! Listing semantics against a real master: checksums, order, intermediate
//! directories, first-wins collisions, ignore edge cases, links and modes.

use std::path::Path;

use pluginsync_common::metadata::{FileType, Links};
use pluginsync_tests::{EnvTree, Pki, TestMaster, client, config_toml, parse_config, sha256_hex};

use crate::common::{entry, listing, paths, pluginsync_query};

/// A generated environment with several modules plus planted cases.
fn planted_tree() -> EnvTree {
    let t = EnvTree::new();
    t.generate("production", 4, 15, 1);
    t.file(
        "production",
        "mod00",
        "lib/facter/common.rb",
        "# from mod00\n",
        0o644,
    );
    t.file(
        "production",
        "mod02",
        "lib/facter/common.rb",
        "# from mod02\n",
        0o644,
    );
    t.file(
        "production",
        "mod00",
        "lib/conflict",
        "a file in mod00\n",
        0o644,
    );
    t.file(
        "production",
        "mod01",
        "lib/conflict/child.rb",
        "under a dir in mod01\n",
        0o644,
    );
    t.file("production", "mod00", "lib/.hidden.rb", "hidden\n", 0o644);
    t.file("production", "mod00", "lib/{a,b}.rb", "braces\n", 0o644);
    t.file("production", "mod00", "lib/a.rb", "a\n", 0o644);
    t.file(
        "production",
        "mod00",
        "lib/ignored_dir/deep/x.rb",
        "x\n",
        0o644,
    );
    t.file("production", "mod00", "lib/.git/config", "[core]\n", 0o644);
    t.file(
        "production",
        "mod00",
        "lib/bin/tool.sh",
        "#!/bin/sh\necho hi\n",
        0o755,
    );
    t.file("production", "mod00", "lib/secret.rb", "s\n", 0o600);
    t.dir("production", "mod00", "lib/private", 0o750);
    t.file("production", "mod00", "lib/private/p.rb", "p\n", 0o640);
    t.file(
        "production",
        "mod01",
        "lib/facter/real.rb",
        "real content\n",
        0o644,
    );
    t.symlink("production", "mod01", "lib/facter/linked.rb", "real.rb");
    t.file("production", "mod01", "lib/shared/impl.rb", "impl\n", 0o644);
    t.symlink("production", "mod01", "lib/shared_alias", "shared");
    t.symlink("production", "mod01", "lib/facter/dangling.rb", "nope.rb");
    // Not a valid module name: never served.
    t.file(
        "production",
        "Bad-Name",
        "lib/facter/bad.rb",
        "bad\n",
        0o644,
    );
    t
}

fn start(tree: &EnvTree, pki: &Pki) -> TestMaster {
    TestMaster::start(parse_config(&config_toml(&tree.envpath(), pki, "", "")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_is_puppet_shaped_and_checksums_are_real() {
    let (tree, pki) = (planted_tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let (status, headers, entries) = listing(
        &c,
        &master.url(),
        "plugins",
        &pluginsync_query("ignore", "follow", "production"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json; charset=utf-8");
    assert_eq!(headers["x-puppet-version"], "7.23.0");

    // "." comes first and is the first module's lib directory.
    assert_eq!(entries[0].relative_path.as_deref(), Some("."));
    assert_eq!(entries[0].kind, FileType::Directory);
    assert!(
        entries[0].path.ends_with("/mod00/lib"),
        "{}",
        entries[0].path
    );

    // Every file's checksum is the sha256 of the bytes on disk.
    let files: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == FileType::File)
        .collect();
    assert!(files.len() > 60, "{} files", files.len());
    for e in &files {
        let rel = e.relative_path.as_deref().unwrap();
        let bytes = std::fs::read(Path::new(&e.path).join(rel)).unwrap();
        let ck = e.checksum.as_ref().unwrap();
        assert_eq!(ck.kind, "sha256");
        assert_eq!(
            ck.value,
            format!("{{sha256}}{}", sha256_hex(&bytes)),
            "{rel}"
        );
        assert_eq!(e.links, Links::Follow);
    }
    // Directory checksums are the ctime type Puppet agents expect.
    for e in entries.iter().filter(|e| e.kind == FileType::Directory) {
        assert_eq!(e.checksum.as_ref().unwrap().kind, "ctime");
        assert!(e.checksum.as_ref().unwrap().value.starts_with("{ctime}"));
    }

    // Every intermediate directory is listed as a directory, no duplicates.
    let all = paths(&entries);
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "duplicate relative paths");
    for p in &all {
        let mut parent = Path::new(p).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            let d = entry(&entries, dir.to_str().unwrap())
                .unwrap_or_else(|| panic!("{} not listed (parent of {p})", dir.display()));
            assert_eq!(d.kind, FileType::Directory, "{}", dir.display());
            parent = dir.parent();
        }
    }

    // Collision: modules sort by name, the first wins.
    let common = entry(&entries, "facter/common.rb").unwrap();
    assert!(common.path.ends_with("/mod00/lib"));
    // A path served as a file by an earlier module hides a later module's
    // directory of the same name and everything below it.
    assert_eq!(entry(&entries, "conflict").unwrap().kind, FileType::File);
    assert!(entry(&entries, "conflict/child.rb").is_none());

    // Default ignores: .git is neither listed nor descended into.
    assert!(entry(&entries, ".git").is_none() && entry(&entries, ".git/config").is_none());
    assert!(entry(&entries, ".hidden.rb").is_some());
    // Invalid module names are not modules.
    assert!(!entries.iter().any(|e| e.path.contains("Bad-Name")));

    // source_permissions=ignore: 0644 for everything, the master's own ids.
    let euid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    for e in &entries {
        assert_eq!(e.mode, 0o644, "{:?}", e.relative_path);
        assert_eq!(
            e.owner,
            pluginsync_common::metadata::Principal::Id(euid.into())
        );
    }

    // Dangling links are skipped under follow, not a 500 for everyone.
    assert!(entry(&entries, "facter/dangling.rb").is_none());

    // recurse=false answers only ".".
    let (s, _, only_root) = listing(&c, &master.url(), "plugins", "recurse=false&links=manage&checksum_type=sha256&source_permissions=ignore&environment=production").await;
    assert_eq!(s, 200);
    assert_eq!(paths(&only_root), vec!["."]);
    // recurselimit=1 stops at the first level.
    let (_, _, shallow) = listing(
        &c,
        &master.url(),
        "plugins",
        "recurse=true&recurselimit=1&environment=production",
    )
    .await;
    assert!(
        paths(&shallow).iter().all(|p| !p.contains('/')),
        "{:?}",
        paths(&shallow)
    );
    assert!(entry(&shallow, "facter").is_some());

    // Other checksum types are computed on demand.
    let (_, _, md5) = listing(
        &c,
        &master.url(),
        "plugins",
        "recurse=true&checksum_type=md5&environment=production",
    )
    .await;
    let v = &entry(&md5, "facter/common.rb")
        .unwrap()
        .checksum
        .as_ref()
        .unwrap()
        .value;
    assert!(v.starts_with("{md5}") && v.len() == 5 + 32, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_follows_puppet_fnmatch_edge_cases() {
    let (tree, pki) = (planted_tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let q = |ignore: &str| format!("recurse=true&links=follow&{ignore}&environment=production");

    // `*` does not match a leading dot: only dot names (and ".") survive.
    let (_, _, star) = listing(&c, &master.url(), "plugins", &q("ignore=%2A")).await;
    assert_eq!(paths(&star), vec![".", ".git", ".hidden.rb"]);
    // `.*` does match them.
    let (_, _, dot) = listing(&c, &master.url(), "plugins", &q("ignore=.%2A")).await;
    assert!(entry(&dot, ".hidden.rb").is_none() && entry(&dot, ".git").is_none());
    assert!(entry(&dot, "a.rb").is_some());
    // Braces are literal: only the file named `{a,b}.rb` goes.
    let (_, _, braces) = listing(&c, &master.url(), "plugins", &q("ignore=%7Ba%2Cb%7D.rb")).await;
    assert!(entry(&braces, "{a,b}.rb").is_none());
    assert!(entry(&braces, "a.rb").is_some());
    // An ignored directory is not descended into.
    let (_, _, dir) = listing(&c, &master.url(), "plugins", &q("ignore=ignored_dir")).await;
    assert!(!paths(&dir).iter().any(|p| p.starts_with("ignored_dir")));
    // Repeated ignore keys combine; matching is case-sensitive.
    let (_, _, two) = listing(
        &c,
        &master.url(),
        "plugins",
        &q("ignore=bin&ignore=SECRET.rb"),
    )
    .await;
    assert!(entry(&two, "bin").is_none() && entry(&two, "bin/tool.sh").is_none());
    assert!(entry(&two, "secret.rb").is_some());
    // Ignores apply at every depth, by basename.
    let (_, _, deep) = listing(&c, &master.url(), "plugins", &q("ignore=deep")).await;
    assert!(entry(&deep, "ignored_dir").is_some() && entry(&deep, "ignored_dir/deep").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_follow_and_manage_differ_as_puppets_do() {
    let (tree, pki) = (planted_tree(), Pki::new());
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let real_sum = format!("{{sha256}}{}", sha256_hex(b"real content\n"));

    let (_, _, follow) = listing(
        &c,
        &master.url(),
        "plugins",
        "recurse=true&links=follow&environment=production",
    )
    .await;
    let linked = entry(&follow, "facter/linked.rb").unwrap();
    assert_eq!(
        (linked.kind, linked.destination.as_deref()),
        (FileType::File, None)
    );
    assert_eq!(linked.checksum.as_ref().unwrap().value, real_sum);
    assert_eq!(
        entry(&follow, "shared_alias").unwrap().kind,
        FileType::Directory
    );
    assert_eq!(
        entry(&follow, "shared_alias/impl.rb").unwrap().kind,
        FileType::File
    );

    let (_, _, manage) = listing(
        &c,
        &master.url(),
        "plugins",
        "recurse=true&links=manage&source_permissions=use&environment=production",
    )
    .await;
    let linked = entry(&manage, "facter/linked.rb").unwrap();
    assert_eq!(
        (linked.kind, linked.destination.as_deref()),
        (FileType::Link, Some("real.rb"))
    );
    assert_eq!(
        linked.checksum.as_ref().unwrap().value,
        real_sum,
        "a link's checksum is its target's"
    );
    assert_eq!(linked.mode, 0o777);
    assert_eq!(linked.links, Links::Manage);
    let alias = entry(&manage, "shared_alias").unwrap();
    assert_eq!(
        (alias.kind, alias.destination.as_deref()),
        (FileType::Link, Some("shared"))
    );
    assert!(
        entry(&manage, "shared_alias/impl.rb").is_none(),
        "manage does not descend links"
    );
    let dangling = entry(&manage, "facter/dangling.rb").unwrap();
    assert_eq!(dangling.kind, FileType::Link);
    assert!(
        dangling.checksum.is_none(),
        "Puppet sends null when the target cannot be read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_permissions_use_carries_real_modes() {
    let (tree, pki) = (planted_tree(), Pki::new());
    tree.dir("production", "mod00", "facts.d", 0o755);
    tree.file(
        "production",
        "mod00",
        "facts.d/exec_fact.sh",
        "#!/bin/sh\necho a=b\n",
        0o755,
    );
    tree.file(
        "production",
        "mod00",
        "facts.d/static.yaml",
        "a: b\n",
        0o640,
    );
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let (_, _, entries) = listing(
        &c,
        &master.url(),
        "plugins",
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    let mode = |rel: &str| entry(&entries, rel).unwrap_or_else(|| panic!("{rel}")).mode;
    assert_eq!(mode("bin/tool.sh"), 0o755);
    assert_eq!(mode("secret.rb"), 0o600);
    assert_eq!(mode("private"), 0o750);
    assert_eq!(mode("private/p.rb"), 0o640);
    let uid = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(tree.module("production", "mod00").join("lib/secret.rb")).unwrap(),
    );
    assert_eq!(
        entry(&entries, "secret.rb").unwrap().owner,
        pluginsync_common::metadata::Principal::Id(uid.into())
    );

    let (_, _, facts) = listing(
        &c,
        &master.url(),
        "pluginfacts",
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    assert_eq!(entry(&facts, "exec_fact.sh").unwrap().mode, 0o755);
    assert_eq!(entry(&facts, "static.yaml").unwrap().mode, 0o640);
    assert_eq!(entry(&facts, ".").unwrap().mode, 0o755);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_without_the_mount_answers_only_the_root() {
    let (tree, pki) = (EnvTree::new(), Pki::new());
    tree.file("production", "nofacts", "lib/facter/x.rb", "x\n", 0o644);
    let master = start(&tree, &pki);
    let c = client(&pki, Some("node1"));
    let (status, _, entries) = listing(
        &c,
        &master.url(),
        "pluginfacts",
        &pluginsync_query("use", "follow", "production"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(paths(&entries), vec!["."]);
    assert!(
        entries[0].path.ends_with("/production/modules"),
        "{}",
        entries[0].path
    );
}
