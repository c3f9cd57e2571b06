//! ARCHITECTURE.md stays true: every module of `common`, `master` and
//! `agent` is named in its crate's section, and every module of
//! `tests/src` and `tests/e2e` in docs/development.md's "Tests"; every arrow its diagrams draw (`a.rs ─► b.rs`: `a` imports `b`)
//! is an import in the code, every import between two modules of a crate is
//! drawn, no modules of one crate import each other, directly or through
//! others (strongly connected components of the import graph), and the
//! master's domain never imports its configuration. The documents
//! the code and the docs cite exist, with the headings cited
//! ([`citations`]); no function or file is too long ([`sizes`]).
//!
//! Imports are read from the source as text: `crate::x`, `super::x`,
//! `self::x` and, in a binary's `main.rs`, `pluginsync_<crate>::x` paths,
//! outside `#[cfg(test)]` items and comments.

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

/// The code of a file without comments and without its `#[cfg(test)]`
/// items.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for (_, line) in sizes::code_lines(text) {
        if line.trim_start().starts_with("//") {
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

/// The import graph as cycles are judged: a folder module reaches its own
/// files (it declares them), and a file's reference back up to the folder
/// that holds it (`super::`, re-exports) is structure, not an import.
fn dependencies(g: &Graph) -> Graph {
    let mut out = Graph::new();
    for (m, deps) in g {
        let entry = out.entry(m.clone()).or_default();
        entry.extend(
            deps.iter()
                .filter(|d| !m.starts_with(&format!("{d}::")))
                .cloned(),
        );
        if let Some((parent, _)) = m.rsplit_once("::") {
            out.entry(parent.to_owned()).or_default().insert(m.clone());
        } else if !m.is_empty() {
            out.entry(String::new()).or_default().insert(m.clone());
        }
    }
    out
}

/// The strongly connected components of `g` with more than one module:
/// each is a set of modules every one of which imports, through the
/// others, every other (Tarjan's algorithm, iterative).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let names: Vec<&String> = g
        .keys()
        .chain(g.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let at: BTreeMap<&String, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let next: Vec<Vec<usize>> = names
        .iter()
        .map(|n| g.get(*n).into_iter().flatten().map(|d| at[d]).collect())
        .collect();
    let (mut index, mut low) = (vec![usize::MAX; names.len()], vec![0; names.len()]);
    let (mut on_stack, mut stack, mut count) = (vec![false; names.len()], Vec::new(), 0);
    let mut out = Vec::new();
    for root in 0..names.len() {
        if index[root] != usize::MAX {
            continue;
        }
        // The depth-first path: each module with the next of its imports
        // to visit.
        let mut path = vec![(root, 0)];
        while let Some(&(v, k)) = path.last() {
            if k == 0 && index[v] == usize::MAX {
                (index[v], low[v], on_stack[v]) = (count, count, true);
                count += 1;
                stack.push(v);
            }
            if let Some(&w) = next[v].get(k) {
                if let Some(top) = path.last_mut() {
                    top.1 += 1;
                }
                if index[w] == usize::MAX {
                    path.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            path.pop();
            if let Some(&(u, _)) = path.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(names[w].clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    out.push(component);
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut found = Vec::new();
    for (krate, lib) in CRATES {
        for cycle in cycles(&dependencies(&graph(krate, lib))) {
            found.push(format!("{krate}: {}", cycle.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other, directly or through others (each line one cycle): {found:#?}"
    );
}

/// The master's domain: the modules that decide what is served.
const DOMAIN: [&str; 5] = ["generations", "rollout", "store", "index", "placement"];

/// The modules of the master's domain ([`DOMAIN`]) in `g` that import
/// `config`, as `module ─► config.rs`.
fn domain_reading_config(g: &Graph) -> Vec<String> {
    g.iter()
        .filter(|(m, _)| DOMAIN.iter().any(|d| inside(m, d)))
        .filter(|(_, deps)| deps.iter().any(|d| inside(d, "config")))
        .map(|(m, _)| format!("{} ─► config.rs", file_of(g, m)))
        .collect()
}

#[test]
fn the_masters_domain_never_imports_its_configuration() {
    let found = domain_reading_config(&graph("master", "pluginsync_master"));
    assert!(
        found.is_empty(),
        "domain modules importing config.rs (parse the configuration into the domain's own types): {found:?}"
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

/// The test modules (`agent_sync`, `architecture/sizes`, `pki`) that
/// `section` names neither as `` `name` `` nor as `` `name.rs` ``.
fn unnamed_e2e(names: &[String], section: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| !section.contains(&format!("`{n}`")) && !section.contains(&format!("`{n}.rs`")))
        .cloned()
        .collect()
}

/// The modules of the test crate under `dir` (`tests/e2e`, `tests/src`),
/// as paths without `.rs` (`master_rollout/stock`), its root (`main.rs`,
/// `lib.rs`) left out.
fn test_modules(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(dir, dir, &mut files);
    let mut names: Vec<String> = files
        .iter()
        .map(|f| f.with_extension("").to_string_lossy().into_owned())
        .filter(|n| n != "main" && n != "lib")
        .collect();
    names.sort();
    names
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
fn development_md_names_every_test_module() {
    let doc = std::fs::read_to_string(repo_root().join("docs/development.md")).unwrap();
    let mut missing = Vec::new();
    for dir in ["tests/e2e", "tests/src"] {
        let names = test_modules(&repo_root().join(dir));
        missing.extend(
            unnamed_e2e(&names, section(&doc, "Tests"))
                .into_iter()
                .map(|n| format!("{dir}/{n}.rs")),
        );
    }
    assert!(
        missing.is_empty(),
        "test modules docs/development.md's \"Tests\" does not name: {missing:?}"
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
    let names = vec![
        "client".to_owned(),
        "master_rollout/stock".to_owned(),
        "architecture/sizes".to_owned(),
    ];
    let doc = "## Tests\n`puppet_client.rs`, `master_rollout/stock.rs`, `sizes.rs`\n";
    assert_eq!(
        unnamed_e2e(&names, section(doc, "Tests")),
        vec!["client", "architecture/sizes"]
    );
}

#[test]
fn the_checker_reads_imports_as_written() {
    let code = code_of(
        "use crate::{a, b::C};\nuse crate::c::d;\n// use crate::e;\nfn f() { crate::g::h(); super::i(); }\n#[cfg(test)]\nuse crate::j;\n#[cfg(test)]\nmod tests {\n    use crate::l;\n}\nuse crate::k;\n",
    );
    assert_eq!(
        paths_after(&code, "crate::"),
        vec!["a", "b::C", "c::d", "g::h", "k"]
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

#[test]
fn the_checker_finds_a_cycle_of_three_modules() {
    let g = graph_of(&[
        ("", &[]),
        ("config", &["rollout"]),
        ("rollout", &["generations"]),
        ("generations", &["config"]),
        ("main", &["config"]),
        ("index", &["walk"]),
        ("index::listing", &["index", "walk"]),
        ("walk", &[]),
        ("a", &["b"]),
        ("b", &["a"]),
    ]);
    assert_eq!(
        cycles(&dependencies(&g)),
        vec![
            vec!["a".to_owned(), "b".to_owned()],
            vec![
                "config".to_owned(),
                "generations".to_owned(),
                "rollout".to_owned()
            ],
        ]
    );
    // A folder's file importing something that imports the folder back.
    let g = graph_of(&[
        ("rollout", &[]),
        ("rollout::api", &["state"]),
        ("state", &["rollout"]),
    ]);
    assert_eq!(
        cycles(&dependencies(&g)),
        vec![vec![
            "rollout".to_owned(),
            "rollout::api".to_owned(),
            "state".to_owned()
        ]]
    );
    let g = graph_of(&[
        ("store::idle", &["config"]),
        ("store", &["store::idle"]),
        ("handlers", &["config", "store"]),
        ("config", &[]),
    ]);
    assert_eq!(
        domain_reading_config(&g),
        vec!["store/idle.rs ─► config.rs"]
    );
}
