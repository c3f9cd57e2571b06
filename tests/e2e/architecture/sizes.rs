//! No room too long: in `common/`, `master/` and `agent/`, no function over
//! [`MAX_FN_LINES`] lines and no source file over [`MAX_FILE_LINES`] lines
//! outside its `#[cfg(test)]` items (each item an attribute marks, by brace
//! matching: a `mod tests { … }`, a function, an impl; the code after it
//! counts again). A function runs from its `fn` line to the brace
//! that closes its body, braces in comments, strings and character
//! literals not counted. And errors are typed: no `Result<_, String>` in
//! those crates' code outside a binary's `main.rs`.

use pluginsync_tests::repo_root;

pub const MAX_FN_LINES: usize = 100;
pub const MAX_FILE_LINES: usize = 600;

/// The lines of `text` outside its `#[cfg(test)]` items, each with its
/// line number (from 1). An item runs from its `#[cfg(test)]` line through
/// the brace that closes its body (`mod tests { … }`, a function, an
/// impl), or through its `;` when it has no body (`use`, `mod x;`); code
/// after it counts again.
pub fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("#[cfg(test)]") {
            i = item_end(&lines, i) + 1;
        } else {
            out.push((i + 1, lines[i]));
            i += 1;
        }
    }
    out
}

/// The index of the last line of the item that starts at `lines[start]`:
/// where its braces close again, or its `;` when a `;` ends a line before
/// any brace opened.
fn item_end(lines: &[&str], start: usize) -> usize {
    let (mut depth, mut started) = (0i64, false);
    for (j, line) in lines.iter().enumerate().skip(start) {
        let s = braces_only(line);
        for ch in s.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    started = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if (started && depth <= 0) || (!started && s.trim_end().ends_with(';')) {
            return j;
        }
    }
    lines.len().saturating_sub(1)
}

/// The name of the function a line declares (`pub(crate) async fn name`),
/// if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = if let Some(scope) = r.strip_prefix('(') {
            scope.split_once(')')?.1.trim_start()
        } else if r.starts_with(char::is_whitespace) {
            r.trim_start()
        } else {
            return None;
        };
    }
    for q in ["const", "async", "unsafe"] {
        if let Some(r) = rest.strip_prefix(q)
            && r.starts_with(char::is_whitespace)
        {
            rest = r.trim_start();
        }
    }
    let r = rest.strip_prefix("fn")?;
    if !r.starts_with(char::is_whitespace) {
        return None;
    }
    let r = r.trim_start();
    let end = r
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(r.len());
    (end > 0).then(|| &r[..end])
}

/// `line` without its `//` comment, string literals emptied and character
/// literals blanked, so that only code braces remain.
fn braces_only(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A character literal ('{', '\''), not a lifetime ('a).
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    chars.nth(2);
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Functions longer than `max` lines in `code` (lines with their numbers,
/// as [`code_lines`] gives them): `(lines, first line, name)`.
fn long_functions(code: &[(usize, &str)], max: usize) -> Vec<(usize, usize, String)> {
    let text: Vec<&str> = code.iter().map(|(_, l)| *l).collect();
    let mut out = Vec::new();
    for (i, (number, line)) in code.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let n = item_end(&text, i) - i + 1;
        if n > max {
            out.push((n, *number, name.to_owned()));
        }
    }
    out
}

/// What is too long in one source file, as lines of the failure message.
fn too_long(rel: &str, text: &str) -> Vec<String> {
    let code = code_lines(text);
    let mut out = Vec::new();
    if code.len() > MAX_FILE_LINES {
        out.push(format!(
            "{rel}: {} lines outside #[cfg(test)] items (at most {MAX_FILE_LINES})",
            code.len()
        ));
    }
    for (n, line, name) in long_functions(&code, MAX_FN_LINES) {
        out.push(format!(
            "{rel}:{line} fn {name}: {n} lines (at most {MAX_FN_LINES})"
        ));
    }
    if !rel.ends_with("/main.rs") {
        for (number, line) in &code {
            if text_error(line) {
                out.push(format!(
                    "{rel}:{number}: a Result<_, String>: type the error"
                ));
            }
        }
    }
    out
}

/// Whether `line` spells a `Result` whose error is a `String`.
fn text_error(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let mut rest = code;
    while let Some(i) = rest.find("Result<") {
        rest = &rest[i + "Result<".len()..];
        let mut depth = 1;
        let mut top_comma = None;
        for (j, c) in rest.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        if let Some(k) = top_comma {
                            let err: &str = rest[k + 1..j].trim();
                            if err == "String" || err == "std::string::String" {
                                return true;
                            }
                        }
                        break;
                    }
                }
                ',' if depth == 1 => top_comma = Some(j),
                _ => {}
            }
        }
    }
    false
}

#[test]
fn no_function_over_100_lines_no_file_over_600_no_text_errors_in_the_product() {
    let root = repo_root();
    let mut over = Vec::new();
    for krate in ["common", "master", "agent"] {
        let src = root.join(krate).join("src");
        let mut files = Vec::new();
        super::sources(&src, &src, &mut files);
        for f in files {
            let rel = format!("{krate}/src/{}", f.display());
            over.extend(too_long(
                &rel,
                &std::fs::read_to_string(src.join(&f)).unwrap(),
            ));
        }
    }
    assert!(over.is_empty(), "too long: {over:#?}");
}

#[test]
fn the_checker_finds_a_text_error() {
    assert_eq!(
        too_long(
            "a.rs",
            "fn f() -> Result<Vec<(u8, u8)>, String> {\n    Ok(vec![])\n}\n"
        ),
        vec!["a.rs:1: a Result<_, String>: type the error"]
    );
    assert!(
        too_long(
            "a.rs",
            "fn f() -> Result<String, E> {}\n// Result<(), String>\n"
        )
        .is_empty()
    );
    assert!(too_long("x/main.rs", "fn f() -> Result<(), String> {}\n").is_empty());
}

#[test]
fn the_checker_finds_a_long_function_and_a_long_file() {
    let mut long_fn = String::from(
        "/// Doc.\npub(crate) async fn big(x: u8) -> u8 {\n    let s = \"}}\"; // }\n",
    );
    for _ in 0..99 {
        long_fn.push_str("    let c = '{';\n");
    }
    long_fn.push_str("    x\n}\nfn small() {}\n#[cfg(test)]\nmod tests {\n");
    for _ in 0..700 {
        long_fn.push_str("    // test code is not counted\n");
    }
    long_fn.push_str("}\n");
    assert_eq!(
        too_long("a.rs", &long_fn),
        vec!["a.rs:2 fn big: 103 lines (at most 100)"]
    );
    let short: String = "fn f() {\n}\n".repeat(10);
    assert!(too_long("b.rs", &short).is_empty());
    let long_file: String = "fn f() {\n}\n".repeat(301);
    assert_eq!(
        too_long("c.rs", &long_file),
        vec!["c.rs: 602 lines outside #[cfg(test)] items (at most 600)"]
    );
    assert_eq!(declared_fn("    pub fn x()"), Some("x"));
    assert_eq!(declared_fn("    const unsafe fn y<T>()"), Some("y"));
    assert_eq!(declared_fn("    public fn z()"), None);
    assert_eq!(declared_fn("let fnord = 1;"), None);
}

#[test]
fn the_checker_skips_only_test_items_and_counts_the_code_after_them() {
    let mut text = String::from(
        "#[cfg(test)]\nuse std::fmt;\nfn a() {}\n#[cfg(test)]\n#[allow(dead_code)]\nfn helper() {\n",
    );
    for _ in 0..200 {
        text.push_str("    let b = \"}\";\n");
    }
    text.push_str("}\n#[cfg(test)]\nmod tests {\n    fn t() {\n    }\n}\nfn after() {\n");
    for _ in 0..100 {
        text.push_str("    let x = 1;\n");
    }
    text.push_str("}\n");
    let code = code_lines(&text);
    assert_eq!(code[0], (3, "fn a() {}"));
    assert_eq!(code[1], (213, "fn after() {"));
    assert_eq!(code.len(), 1 + 102);
    assert_eq!(
        too_long("a.rs", &text),
        vec!["a.rs:213 fn after: 102 lines (at most 100)"]
    );
    let mut long_file = String::from("#[cfg(test)]\nmod tests {\n}\n");
    long_file.push_str(&"fn f() {\n}\n".repeat(301));
    assert_eq!(
        too_long("c.rs", &long_file),
        vec!["c.rs: 602 lines outside #[cfg(test)] items (at most 600)"]
    );
}
