//! The ignore target's reference ([`pluginsync_fuzz::fnmatch`]) and the
//! matcher itself (`IgnoreSet`, common/src/ignore.rs) checked against the
//! real thing: Ruby's `File.fnmatch?` (docs/protocol.md §3.2), on the
//! ignore seeds and on a few thousand generated glob-heavy pairs. Needs
//! `ruby` on `PATH` (CI installs it with `puppet`); says so and passes
//! without it.

use std::io::Write;
use std::process::{Command, Stdio};

use pluginsync_common::ignore::IgnoreSet;

/// (pattern, basename) pairs: every pattern and name of the ignore seeds and corpus
/// crossed, and generated ones over a glob-heavy alphabet.
fn pairs() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["seeds/ignore", "corpus/ignore"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in rd {
            let Ok(text) = std::fs::read_to_string(entry.expect("entry").path()) else {
                continue;
            };
            let mut lines = text.split('\n');
            let patterns: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
            let names: Vec<&str> = lines.collect();
            for p in &patterns {
                for n in &names {
                    out.push((p.to_string(), n.to_string()));
                }
            }
        }
    }
    let alphabet: Vec<char> = "ab.*?[]!^-\\{},é".chars().collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for _ in 0..4000 {
        let p: String = (0..1 + next(7))
            .map(|_| alphabet[next(alphabet.len())])
            .collect();
        let n: String = (0..1 + next(5))
            .map(|_| alphabet[next(alphabet.len())])
            .collect();
        out.push((p, n));
    }
    out.retain(|(p, n)| !p.contains('\0') && !n.contains(['\0', '/']) && !n.is_empty());
    out
}

#[test]
fn ignore_matches_ruby_file_fnmatch() {
    let pairs = pairs();
    let script =
        "require 'json'; JSON.parse(STDIN.read).each { |p, n| puts(File.fnmatch?(p, n) ? 1 : 0) }";
    let child = Command::new("ruby")
        .args(["-e", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("ruby is not installed: File.fnmatch? comparison skipped");
        return;
    };
    let json = serde_json::to_vec(&pairs).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&json)
        .expect("write to ruby");
    let out = child.wait_with_output().expect("ruby");
    assert!(out.status.success(), "ruby failed");
    let answers: Vec<bool> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| l == "1")
        .collect();
    assert_eq!(answers.len(), pairs.len());
    println!("{} (pattern, name) pairs compared with ruby", pairs.len());
    let mut wrong = Vec::new();
    for ((p, n), ruby) in pairs.iter().zip(answers) {
        if pluginsync_fuzz::fnmatch::fnmatch(p, n) != ruby {
            wrong.push(format!("reference: File.fnmatch?({p:?}, {n:?}) is {ruby}"));
        }
        if let Ok(set) = IgnoreSet::new(&[p])
            && set.is_ignored(n) != ruby
        {
            wrong.push(format!("IgnoreSet: File.fnmatch?({p:?}, {n:?}) is {ruby}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} pairs differ: {wrong:#?}",
        wrong.len(),
        pairs.len()
    );
}
