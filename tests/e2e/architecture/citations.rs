//! Every document the repository cites exists, with the heading it cites:
//! `docs/<page>.md#<anchor>`, `README.md#<anchor>`, `ARCHITECTURE.md#…`
//! and `BENCHMARKS.md#…` in code comments, scripts and documents,
//! `docs/protocol.md §N.N` (a numbered heading of the protocol), and every
//! relative link of a Markdown document (`[text](page.md#anchor)`, resolved
//! from the document's folder), so README's documentation list and the
//! pages' tables of contents cannot point nowhere. Nothing cites a README
//! or ARCHITECTURE.md section by its title, nor the issue tracker, which is
//! not in the repository ([`stale`]). And the two doors stay short:
//! README.md a landing page, ARCHITECTURE.md one page ([`too_big`]).
//!
//! Anchors are GitHub's: the heading's text lowercased, everything but
//! letters, digits, `-`, `_` and spaces dropped, spaces made `-`; a
//! repeated heading gets `-1`, `-2`….

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pluginsync_tests::repo_root;

/// The documents cited by name from anywhere in the repository.
const NAMED: [&str; 3] = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"];

/// Folders whose files are scanned for citations, and the kinds of files.
const SCANNED: [&str; 10] = [
    "common",
    "master",
    "agent",
    "tests",
    "bench",
    "xtask",
    "fuzz",
    "scripts",
    "packaging",
    "etc",
];
const SKIPPED_DIRS: [&str; 5] = ["target", "corpus", "seeds", "vendor", ".git"];
const EXTENSIONS: [&str; 7] = ["rs", "md", "sh", "py", "toml", "cfg", "conf"];

/// GitHub's anchor for a heading's text.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown document outside its fenced code blocks.
fn prose_lines(md: &str) -> impl Iterator<Item = &str> {
    let mut fence = false;
    md.lines().filter(move |line| {
        let marker = line.trim_start().starts_with("```");
        if marker {
            fence = !fence;
        }
        !marker && !fence
    })
}

/// The headings of a Markdown document (outside fenced blocks): their
/// anchors, with GitHub's `-N` suffixes for repeats, and their texts.
pub fn headings(md: &str) -> Vec<(String, String)> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for line in prose_lines(md) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = line[hashes..].trim().to_owned();
        let base = anchor(&text);
        let n = seen.entry(base.clone()).or_insert(0);
        let a = if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        *n += 1;
        out.push((a, text));
    }
    out
}

/// One citation: the document (relative to the repository), the anchor
/// or `§` number cited, and where.
#[derive(Debug, PartialEq)]
pub struct Citation {
    pub file: PathBuf,
    pub anchor: Option<String>,
    pub section: Option<String>,
}

fn is_anchor_char(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

/// The `#anchor` at the start of `rest`, if any.
fn anchor_after(rest: &str) -> Option<String> {
    let a = rest.strip_prefix('#')?;
    let end = a.find(|c: char| !is_anchor_char(c)).unwrap_or(a.len());
    (end > 0).then(|| a[..end].to_owned())
}

/// The `§N.N` right after `rest`'s leading space, if any.
fn section_after(rest: &str) -> Option<String> {
    let s = rest.strip_prefix(" §")?;
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let n = s[..end].trim_end_matches('.');
    (!n.is_empty()).then(|| n.to_owned())
}

/// The citations by name in `text`: `docs/<page>.md[#anchor]`, the named
/// documents (`README.md[#anchor]`, not `packaging/README.md`), and
/// `docs/protocol.md §N`.
pub fn citations(text: &str) -> Vec<Citation> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".md") {
        let before = &text[..i];
        let rest = &text[i + 3..];
        if rest.starts_with(|c: char| c.is_alphanumeric()) {
            continue;
        }
        let start = before
            .rfind(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '/' | '.')))
            .map_or(0, |s| s + 1);
        let mut name = &before[start..];
        while let Some(n) = name.strip_prefix("../") {
            name = n;
        }
        let page = name.starts_with("docs/") && !name[5..].contains('/');
        let file = format!("{name}.md");
        if !page && !NAMED.contains(&file.as_str()) {
            continue;
        }
        out.push(Citation {
            file: PathBuf::from(file),
            anchor: anchor_after(rest),
            section: section_after(rest),
        });
    }
    out
}

/// The relative link targets of a Markdown document: `](target)`, without
/// URLs and in-page anchors of other forms than `#anchor`.
pub fn links(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(md) {
        for (i, _) in line.match_indices("](") {
            let t = &line[i + 2..];
            let end = t.find(')').unwrap_or(t.len());
            let target = t[..end].trim();
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                out.push(target.to_owned());
            }
        }
    }
    out
}

/// What is wrong with `cite` (a document under `root`), if anything.
pub fn check(root: &Path, cite: &Citation) -> Option<String> {
    let path = root.join(&cite.file);
    let Ok(md) = std::fs::read_to_string(&path) else {
        return Some(format!("{} does not exist", cite.file.display()));
    };
    let hs = headings(&md);
    if let Some(a) = &cite.anchor
        && !hs.iter().any(|(h, _)| h == a)
    {
        return Some(format!("{}#{a}: no such heading", cite.file.display()));
    }
    if let Some(n) = &cite.section {
        let numbered =
            |t: &str| t.split_whitespace().next().map(|w| w.trim_end_matches('.')) == Some(n);
        if !hs.iter().any(|(_, t)| numbered(t)) {
            return Some(format!("{} §{n}: no such section", cite.file.display()));
        }
    }
    None
}

/// The citations of one Markdown link `target` in the document `doc`
/// (relative to the repository): the file it names, relative to `doc`'s
/// folder, and its anchor (`#x` alone is `doc` itself).
pub fn link_citation(doc: &Path, target: &str) -> Citation {
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a.to_owned())),
        None => (target, None),
    };
    let dir = doc.parent().unwrap_or(Path::new(""));
    let mut path = if file.is_empty() {
        doc.to_owned()
    } else {
        dir.join(file)
    };
    // `docs/../README.md` → `README.md`
    let mut parts: Vec<_> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            c => parts.push(c),
        }
    }
    path = parts.iter().collect();
    let is_md = path.extension().is_some_and(|e| e == "md");
    Citation {
        file: path,
        anchor: anchor.filter(|_| is_md),
        section: None,
    }
}

/// Whether `cite` names something that exists: a Markdown document is
/// checked with [`check`], anything else must exist.
fn check_link(root: &Path, cite: &Citation) -> Option<String> {
    if cite.file.extension().is_some_and(|e| e == "md") {
        check(root, cite)
    } else {
        (!root.join(&cite.file).exists()).then(|| format!("{} does not exist", cite.file.display()))
    }
}

/// Files under `dir` whose citations count, relative to `root`.
fn scanned(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if p.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_ref()) {
                scanned(root, &p, out);
            }
        } else if p
            .extension()
            .is_some_and(|e| EXTENSIONS.iter().any(|x| e == *x))
        {
            out.push(p.strip_prefix(root).unwrap().to_owned());
        }
    }
}

/// Citations that cannot be followed: a README or ARCHITECTURE.md section
/// by its title (`README, "Signals"`) instead of `docs/<page>.md#anchor`,
/// and the issue tracker (`issue 15`, `…_issue_15`, `issue "Master"`), which
/// is not in the repository. Each as `line: text`.
pub fn stale(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let by_title = [
            "readme, \"",
            "readme \"",
            "architecture.md, ",
            "architecture.md \"",
            "issue \"",
        ]
        .iter()
        .any(|p| lower.contains(p));
        let tracker = lower.match_indices("issue").any(|(i, _)| {
            let rest = lower[i + 5..].trim_start_matches([' ', '_', '-']);
            rest.starts_with(|c: char| c.is_ascii_digit())
        });
        if by_title || tracker {
            out.push(format!("{}: {}", n + 1, line.trim()));
        }
    }
    out
}

/// Every file whose citations count, relative to the repository.
fn cited_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = NAMED.iter().map(PathBuf::from).collect();
    scanned(root, &root.join("docs"), &mut files);
    for dir in SCANNED {
        scanned(root, &root.join(dir), &mut files);
    }
    // This file's own tests cite what does not exist, on purpose.
    let me = Path::new("tests/e2e/architecture/citations.rs");
    files.retain(|f| f.as_path() != me);
    files
}

#[test]
fn nothing_cites_a_section_by_title_or_the_issue_tracker() {
    let root = repo_root();
    let mut found = Vec::new();
    for f in cited_files(&root) {
        let Ok(text) = std::fs::read_to_string(root.join(&f)) else {
            continue;
        };
        found.extend(
            stale(&text)
                .into_iter()
                .map(|l| format!("{}:{l}", f.display())),
        );
    }
    assert!(
        found.is_empty(),
        "cite docs/<page>.md#anchor or a test name instead: {found:#?}"
    );
}

#[test]
fn every_cited_document_and_heading_exists() {
    let root = repo_root();
    let mut broken = Vec::new();
    for f in &cited_files(&root) {
        let Ok(text) = std::fs::read_to_string(root.join(f)) else {
            continue;
        };
        for c in citations(&text) {
            if let Some(e) = check(&root, &c) {
                broken.push(format!("{}: {e}", f.display()));
            }
        }
        if f.extension().is_some_and(|e| e == "md") {
            for target in links(&text) {
                if let Some(e) = check_link(&root, &link_citation(f, &target)) {
                    broken.push(format!("{}: link ({target}): {e}", f.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "citations that point nowhere: {broken:#?}"
    );
}

#[test]
fn readme_has_a_documentation_list_and_the_two_commands_first() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|b| b.trim_start_matches("sh").trim())
        .collect();
    assert_eq!(
        blocks.get(..2),
        Some(
            &[
                "./scripts/demo.sh",
                "cargo build --workspace --bins && cargo test --workspace"
            ][..]
        ),
        "README's first two commands are the demo and the test suite"
    );
    assert!(
        headings(&readme).iter().any(|(a, _)| a == "documentation"),
        "README has a \"Documentation\" list"
    );
    let docs = links(&readme);
    for page in std::fs::read_dir(repo_root().join("docs")).unwrap() {
        let name = page.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            docs.iter().any(|l| l.starts_with(&format!("docs/{name}"))),
            "README links docs/{name}"
        );
    }
}

/// What is wrong with a door of the repository: `text` (named `name`) over
/// `max_bytes`, or a line of it over `max_line` characters.
fn too_big(name: &str, text: &str, max_bytes: usize, max_line: usize) -> Vec<String> {
    let mut out = Vec::new();
    if text.len() > max_bytes {
        out.push(format!(
            "{name}: {} bytes (at most {max_bytes})",
            text.len()
        ));
    }
    for (n, line) in text.lines().enumerate() {
        let chars = line.chars().count();
        if chars > max_line {
            out.push(format!(
                "{name}:{}: {chars} characters (at most {max_line})",
                n + 1
            ));
        }
    }
    out
}

#[test]
fn readme_and_architecture_md_stay_short() {
    let read = |name: &str| std::fs::read_to_string(repo_root().join(name)).unwrap();
    let mut over = too_big("README.md", &read("README.md"), 16_000, usize::MAX);
    over.extend(too_big(
        "ARCHITECTURE.md",
        &read("ARCHITECTURE.md"),
        // One page: the map's tables grow by one short row per module;
        // 12,288 bytes (12 KiB): the pipelines live in docs/internals.md,
        // the test modules in docs/development.md#tests; the next
        // module's row comes with a cut, not a raise.
        12_288,
        200,
    ));
    assert!(
        over.is_empty(),
        "README.md is a landing page and ARCHITECTURE.md one page; move depth to docs/: {over:#?}"
    );
}

#[test]
fn the_checker_finds_a_long_document_or_line() {
    let text = format!("short\n{}\n", "x".repeat(201));
    assert_eq!(
        too_big("A.md", &text, 100, 200),
        vec![
            "A.md: 208 bytes (at most 100)",
            "A.md:2: 201 characters (at most 200)"
        ]
    );
    assert!(too_big("A.md", "short\n", 100, 200).is_empty());
}

#[test]
fn the_checker_finds_a_missing_page_or_heading() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(
        dir.path().join("docs/tls.md"),
        "# TLS\n\n## Session resumption\n```\n# not a heading\n```\n### 5.3 Certificate files: the `ssldir` layout\n## Session resumption\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("README.md"),
        "# pluginsync\n## Documentation\n",
    )
    .unwrap();
    let text = "// docs/tls.md#session-resumption, docs/tls.md#session-resumption-1 and\n\
        // README.md#documentation; docs/tls.md §5.3. packaging/README.md#x is not ours.\n\
        // docs/tls.md#no-such-heading, docs/nope.md, README.md#gone, docs/tls.md §5.4\n";
    let found = citations(text);
    assert_eq!(found.len(), 8, "{found:?}");
    let errors: Vec<String> = found.iter().filter_map(|c| check(dir.path(), c)).collect();
    assert_eq!(
        errors,
        vec![
            "docs/tls.md#no-such-heading: no such heading",
            "docs/nope.md does not exist",
            "README.md#gone: no such heading",
            "docs/tls.md §5.4: no such section",
        ]
    );
    assert_eq!(
        anchor("5.3 Certificate files: the `ssldir` layout"),
        "53-certificate-files-the-ssldir-layout"
    );
    let md = "See [TLS](tls.md#session-resumption), [gone](tls.md#gone), [up](../README.md), [x](https://example.org).\n";
    let doc = Path::new("docs/master.md");
    let errors: Vec<String> = links(md)
        .iter()
        .filter_map(|t| check_link(dir.path(), &link_citation(doc, t)))
        .collect();
    assert_eq!(errors, vec!["docs/tls.md#gone: no such heading"]);
}

#[test]
fn the_checker_finds_a_citation_by_title_or_of_the_tracker() {
    let text = "// fine: docs/operating.md#signals, `issue_kind`, rustls issues #2287\n\
        // (README, \"Signals\")\n\
        // measured in issue 15, item 2\n\
        fn r10k_redeploys_issue_15() {}\n\
        // ARCHITECTURE.md, Agent, cache\n\
        // (issue \"Master\", must-show 2)\n";
    assert_eq!(
        stale(text),
        vec![
            "2: // (README, \"Signals\")",
            "3: // measured in issue 15, item 2",
            "4: fn r10k_redeploys_issue_15() {}",
            "5: // ARCHITECTURE.md, Agent, cache",
            "6: // (issue \"Master\", must-show 2)",
        ]
    );
}
