//! ARCHITECTURE.md stays true: every module of `common`, `master` and
//! `agent` is named in its crate's section, and so is every e2e module in
//! "Tests"; every arrow its diagrams draw (`a.rs ─► b.rs`: `a` imports `b`)
//! is an import in the code, every import between two modules of a crate is
//! drawn, and no two modules of one crate import each other. The documents
//! the code and the docs cite exist, with the headings cited
//! ([`citations`]); no function or file is too long ([`sizes`]).
//!
//! Imports are read from the source as text: `crate::x`, `super::x`,
//! `self::x` and, in a binary's `main.rs`, `pluginsync_<crate>::x` paths,
//! outside `#[cfg(test)]` sections and comments.

mod citations;
mod sizes;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use pluginsync_tests::repo_root;

/// One crate's modules (`sync`, `index::listing`, `main`) and, for each,
/// the modules it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The crates whose modules the document must describe, with the name
/// their binary uses for the library.
const CRATES: [(&str, &str); 3] = [
    ("common", "pluginsync_common"),
    ("master", "pluginsync_master"),
    ("agent", "pluginsync_agent"),
];

/// The module path of a source file relative to `src/`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts.join("::")
}

/// Every `.rs` file under `dir`, relative to it.
fn sources(dir: &Path, base: &Path, out: &mut Vec<std::path::PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p.strip_prefix(base).unwrap().to_owned());
        }
    }
}

/// The code of a file without comments and without its test section.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The paths that follow each occurrence of `prefix` (`crate::`): for
/// `crate::{a, b::c}` both `a` and `b::c`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim();
                if !item.is_empty() {
                    out.push(path_head(item));
                }
            }
        } else {
            out.push(path_head(rest));
        }
    }
    out
}

/// The leading `a::b::c` of `s`, without a trailing `{…}` or item.
fn path_head(s: &str) -> String {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end].trim_end_matches(':').to_owned()
}

/// The longest known module that `path` (relative to the crate root)
/// starts with.
fn resolve(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// The import graph of one crate.
fn graph(krate: &str, lib_name: &str) -> Graph {
    let src = repo_root().join(krate).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut g = Graph::new();
    for f in &files {
        let me = module_of(f);
        let code = code_of(&std::fs::read_to_string(src.join(f)).unwrap());
        let parent = me.rsplit_once("::").map(|(p, _)| p.to_owned());
        let mut deps = BTreeSet::new();
        let mut add = |path: String| {
            if let Some(m) = resolve(&path, &modules)
                && m != me
                && !m.is_empty()
            {
                deps.insert(m);
            }
        };
        for p in paths_after(&code, "crate::") {
            add(p);
        }
        if me == "main" {
            for p in paths_after(&code, &format!("{lib_name}::")) {
                add(p);
            }
        }
        for p in paths_after(&code, "super::") {
            add(match &parent {
                Some(parent) => format!("{parent}::{p}"),
                None => p,
            });
        }
        for p in paths_after(&code, "self::") {
            add(if me.is_empty() {
                p
            } else {
                format!("{me}::{p}")
            });
        }
        g.insert(me, deps);
    }
    g
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut cycles = Vec::new();
    for (krate, lib) in CRATES {
        let g = graph(krate, lib);
        for (a, deps) in &g {
            for b in deps {
                // A folder module and its own files may refer to each other
                // (re-exports and `super::`): that is structure, not a cycle.
                let related = a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
                if a < b && !related && g.get(b).is_some_and(|d| d.contains(a)) {
                    cycles.push(format!("{krate}: {a} <-> {b}"));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "modules importing each other: {cycles:?}"
    );
}

/// The `(from, to)` arrows of ARCHITECTURE.md's diagrams: in a fenced block,
/// `a.rs ─► b.rs` and `a.rs ─► b.rs, c.rs` (one arrow to each), chained.
fn arrows(doc: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut fence = false;
    let mut section = String::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.trim().to_owned();
        }
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence || !line.contains('►') {
            continue;
        }
        let hops: Vec<Vec<String>> = line
            .split('►')
            .map(|hop| {
                hop.split([',', ' ', '─', '(', ')'])
                    .filter(|t| t.ends_with(".rs") || t.ends_with('/'))
                    .map(|t| t.trim_end_matches(".rs").trim_end_matches('/').to_owned())
                    .collect()
            })
            .collect();
        for w in hops.windows(2) {
            // The source is the last module before the arrow; every module
            // after it (up to the next arrow) is a target.
            if let Some(from) = w[0].last() {
                for to in &w[1] {
                    out.push((section.clone(), from.clone(), to.clone()));
                }
            }
        }
    }
    out
}

/// The text of the `## <heading>` section of `doc`, up to the next `## `.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .match_indices("## ")
        .find(|(i, _)| {
            (*i == 0 || doc[..*i].ends_with('\n'))
                && doc[i + 3..].lines().next().map(str::trim) == Some(heading)
        })
        .map_or(doc.len(), |(i, _)| i);
    let body = &doc[start..];
    let end = body[3.min(body.len())..]
        .find("\n## ")
        .map_or(body.len(), |e| e + 4);
    &body[..end]
}

/// The section of ARCHITECTURE.md that describes `krate`.
fn heading_of(krate: &str) -> &'static str {
    match krate {
        "common" => "Common",
        "master" => "Master",
        _ => "Agent",
    }
}

/// `m` is the module `folder` or one of the modules inside it.
fn inside(m: &str, folder: &str) -> bool {
    m == folder || m.starts_with(&format!("{folder}::"))
}

/// The modules of `g` that `section` does not name (as `x.rs`, or `x/` for
/// a folder module), as paths under `src/`.
fn unnamed(g: &Graph, section: &str) -> Vec<String> {
    g.keys()
        .filter(|m| !m.is_empty())
        .map(|m| m.replace("::", "/"))
        .filter(|f| !section.contains(&format!("{f}.rs")) && !section.contains(&format!("{f}/")))
        .collect()
}

/// The arrows among `drawn` (`(from, to)` as written, `handlers` for
/// `handlers/`) that are not imports in `g`: a folder imports what any of
/// its files imports.
fn not_imports(g: &Graph, drawn: &[(String, String)]) -> Vec<String> {
    drawn
        .iter()
        .filter(|(from, to)| {
            let (from_m, to_m) = (from.replace('/', "::"), to.replace('/', "::"));
            !g.iter()
                .filter(|(m, _)| inside(m, &from_m))
                .flat_map(|(_, d)| d)
                .any(|x| inside(x, &to_m) && !inside(x, &from_m))
        })
        .map(|(from, to)| format!("{from}.rs ─► {to}.rs"))
        .collect()
}

/// The imports of `g` that no arrow among `drawn` draws. An arrow from a
/// folder (`handlers/`) draws the imports of its files, an arrow to one
/// draws imports of any of its files; the files of one folder module
/// (`index/mount.rs`, `index/mod.rs`) may import each other undrawn.
fn undrawn(g: &Graph, drawn: &[(String, String)]) -> Vec<String> {
    let drawn: Vec<(String, String)> = drawn
        .iter()
        .map(|(f, t)| (f.replace('/', "::"), t.replace('/', "::")))
        .collect();
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for (a, deps) in g.iter().filter(|(a, _)| !a.is_empty()) {
        for b in deps {
            if top(a) == top(b) {
                continue;
            }
            if !drawn.iter().any(|(f, t)| inside(a, f) && inside(b, t)) {
                out.push(format!("{} ─► {}", file_of(g, a), file_of(g, b)));
            }
        }
    }
    out
}

/// How a diagram names module `m`: `index/` for a folder, else `a/b.rs`.
fn file_of(g: &Graph, m: &str) -> String {
    let prefix = format!("{m}::");
    if g.keys().any(|k| k.starts_with(&prefix)) {
        format!("{m}/")
    } else {
        format!("{}.rs", m.replace("::", "/"))
    }
}

/// The e2e modules (`tests/e2e/<name>.rs`, not `main.rs`) that `section`
/// names neither as `` `name` `` nor as `name.rs`.
fn unnamed_e2e(names: &[String], section: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| !section.contains(&format!("`{n}`")) && !section.contains(&format!("{n}.rs")))
        .cloned()
        .collect()
}

fn architecture_md() -> String {
    std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap()
}

/// The arrows drawn in the section of `krate`, as `(from, to)`.
fn drawn_in(doc: &str, krate: &str) -> Vec<(String, String)> {
    arrows(doc)
        .into_iter()
        .filter(|(s, _, _)| s == heading_of(krate))
        .map(|(_, f, t)| (f, t))
        .collect()
}

#[test]
fn architecture_md_names_every_module_and_its_arrows_are_imports() {
    let doc = architecture_md();
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for (krate, lib) in CRATES {
        let g = graph(krate, lib);
        let text = section(&doc, heading_of(krate));
        missing.extend(
            unnamed(&g, text)
                .into_iter()
                .map(|f| format!("{krate}/src/{f}")),
        );
        let drawn = drawn_in(&doc, krate);
        wrong.extend(
            not_imports(&g, &drawn)
                .into_iter()
                .map(|a| format!("{krate}: {a}")),
        );
    }
    assert!(
        missing.is_empty(),
        "modules ARCHITECTURE.md does not name in their crate's section: {missing:?}"
    );
    assert!(
        wrong.is_empty(),
        "arrows in ARCHITECTURE.md that are not imports: {wrong:?}"
    );
}

#[test]
fn every_import_between_modules_of_a_crate_is_drawn() {
    let doc = architecture_md();
    let mut missing = Vec::new();
    for (krate, lib) in CRATES {
        let g = graph(krate, lib);
        let drawn = drawn_in(&doc, krate);
        missing.extend(
            undrawn(&g, &drawn)
                .into_iter()
                .map(|a| format!("{krate}: {a}")),
        );
    }
    assert!(
        missing.is_empty(),
        "imports ARCHITECTURE.md does not draw (add the arrow to its crate's diagram): {missing:?}"
    );
}

#[test]
fn architecture_md_names_every_e2e_module() {
    let dir = repo_root().join("tests/e2e");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|n| n != "main")
        .collect();
    names.sort();
    let doc = architecture_md();
    let missing = unnamed_e2e(&names, section(&doc, "Tests"));
    assert!(
        missing.is_empty(),
        "e2e modules ARCHITECTURE.md's \"Tests\" does not name: {missing:?}"
    );
}

/// A graph from `(module, [imports])` pairs, for the checkers' own tests.
fn graph_of(edges: &[(&str, &[&str])]) -> Graph {
    edges
        .iter()
        .map(|(m, d)| ((*m).to_owned(), d.iter().map(|s| (*s).to_owned()).collect()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn the_checker_finds_an_undrawn_import() {
    let g = graph_of(&[
        ("main", &["sync"]),
        ("sync", &["client", "index::listing"]),
        ("index::listing", &["index", "walk"]),
        ("index", &["index::listing"]),
        ("client", &[]),
        ("walk", &[]),
    ]);
    let drawn = pairs(&[("main", "sync"), ("sync", "client"), ("index", "walk")]);
    assert_eq!(undrawn(&g, &drawn), vec!["sync.rs ─► index/listing.rs"]);
    let drawn = pairs(&[
        ("main", "sync"),
        ("sync", "client"),
        ("sync", "index"),
        ("index", "walk"),
    ]);
    assert!(undrawn(&g, &drawn).is_empty());
    assert_eq!(
        not_imports(&g, &pairs(&[("client", "walk"), ("index", "walk")])),
        vec!["client.rs ─► walk.rs"]
    );
}

#[test]
fn the_checker_finds_an_unnamed_module() {
    let g = graph_of(&[
        ("", &[]),
        ("sync", &[]),
        ("index::mount", &[]),
        ("index", &[]),
    ]);
    let doc = "## Agent\n`sync.rs`, `index/` (`index/mount.rs`)\n## Master\n`mount.rs`\n";
    assert!(unnamed(&g, section(doc, "Agent")).is_empty());
    assert_eq!(
        unnamed(&g, section(doc, "Master")),
        vec!["index", "index/mount", "sync"]
    );
    let names = vec!["agent_sync".to_owned(), "logs".to_owned()];
    let doc = "## Tests\n`agent_sync` …\n## Other\n`logs`\n";
    assert_eq!(unnamed_e2e(&names, section(doc, "Tests")), vec!["logs"]);
}

#[test]
fn the_checker_reads_imports_as_written() {
    let code = code_of(
        "use crate::{a, b::C};\nuse crate::c::d;\n// use crate::e;\nfn f() { crate::g::h(); super::i(); }\n#[cfg(test)]\nuse crate::j;\n",
    );
    assert_eq!(
        paths_after(&code, "crate::"),
        vec!["a", "b::C", "c::d", "g::h"]
    );
    assert_eq!(paths_after(&code, "super::"), vec!["i"]);
    let found = arrows("## Agent\n```\nmain.rs ─► sync.rs ─► client.rs, scan.rs\n```\n");
    let pairs: Vec<_> = found
        .iter()
        .map(|(_, a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![("main", "sync"), ("sync", "client"), ("sync", "scan")]
    );
}
