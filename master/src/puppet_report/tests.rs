//! The parser on a report captured from Debian's Puppet 7 (Puppet Server's
//! stored copy of what its `http` processor posts, from the e2e test
//! `puppet_reports`), on Ruby-tagged logs, and on bombs; the matching of
//! log lines to a generation's plugins.

use std::time::{Duration, Instant};

use pluginsync_common::digest::Sha256;
use pluginsync_common::generation::{EntryKind, Manifest, ManifestEntry};
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

use super::plugins::{Reason, failing};
use super::*;

/// A report of node `stock1` whose pluginsync took a generation with a
/// fact that does not load (`broken.rb`), one raising in `setcode`
/// (`raises.rb`), one raising in a file not named after it
/// (`misnamed.rb`) and a facts.d script writing to stderr and exiting 3.
const CAPTURED: &str = include_str!("../../tests/fixtures/puppet-run-report.yaml");

fn manifest(files: &[(Mount, &str)]) -> Manifest {
    let mut entries: Vec<ManifestEntry> = Mount::ALL
        .iter()
        .map(|&mount| ManifestEntry {
            mount,
            path: RelPath::root(),
            mode: 0o755,
            kind: EntryKind::Directory,
        })
        .collect();
    for &(mount, path) in files {
        let mut dirs: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
        dirs.retain(|d| {
            !entries
                .iter()
                .any(|e| e.mount == mount && e.path.as_str() == *d)
        });
        for d in dirs {
            entries.push(ManifestEntry {
                mount,
                path: RelPath::parse(d).unwrap(),
                mode: 0o755,
                kind: EntryKind::Directory,
            });
        }
        entries.push(ManifestEntry {
            mount,
            path: RelPath::parse(path).unwrap(),
            mode: 0o644,
            kind: EntryKind::File {
                sha256: Sha256::of(path.as_bytes()),
                size: 1,
            },
        });
    }
    Manifest::new(entries).unwrap()
}

/// The generation the captured node was served.
fn served() -> Manifest {
    manifest(&[
        (Mount::Plugins, "facter/good.rb"),
        (Mount::Plugins, "facter/broken.rb"),
        (Mount::Plugins, "facter/raises.rb"),
        (Mount::Plugins, "facter/misnamed.rb"),
        (Mount::Pluginfacts, "good.txt"),
        (Mount::Pluginfacts, "bad.sh"),
    ])
}

#[test]
fn a_captured_report_reads_and_blames_the_plugins_of_its_generation() {
    let r = parse(CAPTURED).unwrap();
    assert_eq!(r.host, "stock1");
    assert_eq!(r.environment, "production");
    assert!(!r.transaction_uuid.is_empty() && !r.time.is_empty());
    assert!(["changed", "unchanged", "failed"].contains(&r.status.as_str()));
    assert!(r.logs.iter().any(|l| l.is_error()), "{r:?}");
    let names: Vec<(String, Reason)> = failing(&r.logs, &served());
    let mut only: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    only.sort();
    assert_eq!(
        only,
        [
            "pluginfacts/bad.sh",
            "plugins/facter/broken.rb",
            "plugins/facter/raises.rb"
        ]
    );
    assert!(names.contains(&("plugins/facter/raises.rb".into(), Reason::Resolve)));
    assert!(names.contains(&("plugins/facter/broken.rb".into(), Reason::Error)));
    assert!(names.contains(&("pluginfacts/bad.sh".into(), Reason::Stderr)));
    // A generation without those files: the same errors blame nothing.
    let other = manifest(&[(Mount::Plugins, "facter/good.rb")]);
    assert_eq!(failing(&r.logs, &other), Vec::new());
}

#[test]
fn ruby_tags_anchors_and_other_documents_are_read_as_plain_values() {
    let yaml = "--- !ruby/object:Puppet::Transaction::Report\n\
        metrics: {a: [1, 2, {b: c}]}\n\
        host: &h node1\n\
        ? [complex, key]\n\
        : ignored\n\
        logs:\n\
        - !ruby/object:Puppet::Util::Log\n  \
          level: !ruby/sym err\n  \
          message: 'Could not autoload puppet/type/foo: no such file'\n  \
          source: *h\n\
        - !ruby/object:Puppet::Util::Log\n  \
          level: !ruby/sym err\n  \
          message: 'Could not autoload puppet/type/elsewhere: x'\n\
        - level: warning\n  \
          message: Error loading fact /var/cache/puppet/lib/facter/w.rb\n\
        - level: err\n  \
          message: Error loading fact /usr/lib/ruby/vendor_ruby/facter/x.rb\n\
        - *h\n\
        environment: production\n\
        --- {host: other}\n";
    let r = parse(yaml).unwrap();
    assert_eq!(r.host, "node1");
    assert_eq!(r.environment, "production");
    assert_eq!(r.logs.len(), 4, "{r:?}");
    assert_eq!(r.logs[0].level, "err");
    assert_eq!(r.logs[0].source, "node1");
    let m = manifest(&[
        (Mount::Plugins, "puppet/type/foo.rb"),
        (Mount::Plugins, "facter/w.rb"),
        (Mount::Plugins, "facter/x.rb"),
    ]);
    // Only the err-level line naming a file of the generation counts: not
    // the warning, not a path outside a libdir, not another type.
    let blamed = failing(&r.logs, &m);
    assert_eq!(
        blamed,
        vec![("plugins/puppet/type/foo.rb".to_owned(), Reason::Autoload)]
    );
}

#[test]
fn a_body_that_is_not_a_report_is_refused_in_one_line() {
    for (body, want) in [
        ("- a\n- b\n", "not a Puppet run report"),
        ("{logs: []}", "no host"),
        ("host: [unclosed", "not YAML"),
        ("", "not a Puppet run report"),
    ] {
        let e = parse(body).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{body:?}: {e}");
    }
    let e = parse("host: x\nmessage: \"secret-9 unterminated\n").unwrap_err();
    assert!(!e.to_string().contains("secret-9"), "{e}");
}

/// Bombs are refused (nesting) or cost nothing (aliases never expanded),
/// quickly: the walk stops at the first level past [`MAX_DEPTH`], so
/// neither it nor the parser under it holds more than that many levels.
#[test]
fn yaml_bombs_are_refused_or_harmless_in_bounded_time() {
    let started = Instant::now();
    let deep_flow = format!("host: x\nlogs: {}", "[".repeat(8 << 20));
    assert_eq!(parse(&deep_flow), Err(ReportError::TooDeep));
    let deep_block: String = (0..200)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    assert_eq!(parse(&deep_block), Err(ReportError::TooDeep));
    let deep_logs = format!("host: x\nlogs:\n- message: {}", "[".repeat(100));
    assert_eq!(parse(&deep_logs), Err(ReportError::TooDeep));
    // Billion laughs: each level nine aliases of the last.
    let mut lol = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        lol.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    lol.push_str("host: x\nlogs: [*a9, *a9, *a9]\n");
    let r = parse(&lol).unwrap();
    assert!(r.logs.is_empty(), "{r:?}");
    // Many logs: at most MAX_LOGS kept, each message bounded.
    let mut many = String::from("host: x\nlogs:\n");
    for _ in 0..MAX_LOGS + 10 {
        many.push_str("- {level: err, message: m}\n");
    }
    assert_eq!(parse(&many).unwrap().logs.len(), MAX_LOGS);
    let long = format!(
        "host: x\nlogs:\n- {{level: err, message: {}}}\n",
        "m".repeat(MAX_MESSAGE * 4)
    );
    let r = parse(&long).unwrap();
    assert_eq!(r.logs[0].message.chars().count(), MAX_MESSAGE);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn reports_config_defaults_to_nobody_and_checks_its_keys() {
    let d = ReportsConfig::default();
    assert!(d.puppetserver_certnames.is_empty());
    assert_eq!(d.max_body(), 16 << 20);
    d.validate().unwrap();
    let bad = ReportsConfig {
        puppetserver_certnames: vec!["a/b".into()],
        ..ReportsConfig::default()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("a/b"));
    let zero = ReportsConfig {
        max_body_mib: 0,
        ..ReportsConfig::default()
    };
    assert!(zero.validate().is_err());
}
