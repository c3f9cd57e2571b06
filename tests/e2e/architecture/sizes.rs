//! No room too long: in `common/`, `master/` and `agent/`, no function over
//! [`MAX_FN_LINES`] lines and no source file over [`MAX_FILE_LINES`] lines
//! outside its `#[cfg(test)]` section (everything from the first
//! `#[cfg(test)]` line on). A function runs from its `fn` line to the brace
//! that closes its body, braces in comments, strings and character
//! literals not counted. And errors are typed: no `Result<_, String>` in
//! those crates' code outside a binary's `main.rs`.

use pluginsync_tests::repo_root;

pub const MAX_FN_LINES: usize = 100;
pub const MAX_FILE_LINES: usize = 600;

/// The lines of `text` before its first `#[cfg(test)]` line.
fn code_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .collect()
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

/// Functions longer than `max` lines in `code`: `(lines, first line, name)`.
fn long_functions(code: &[&str], max: usize) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, line) in code.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let (mut depth, mut started) = (0i64, false);
        let mut j = i;
        while j < code.len() {
            let s = braces_only(code[j]);
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
                break;
            }
            j += 1;
        }
        let n = j.min(code.len() - 1) - i + 1;
        if n > max {
            out.push((n, i + 1, name.to_owned()));
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
            "{rel}: {} lines outside #[cfg(test)] (at most {MAX_FILE_LINES})",
            code.len()
        ));
    }
    for (n, line, name) in long_functions(&code, MAX_FN_LINES) {
        out.push(format!(
            "{rel}:{line} fn {name}: {n} lines (at most {MAX_FN_LINES})"
        ));
    }
    if !rel.ends_with("/main.rs") {
        for (i, line) in code.iter().enumerate() {
            if text_error(line) {
                out.push(format!(
                    "{rel}:{}: a Result<_, String>: type the error",
                    i + 1
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
        vec!["c.rs: 602 lines outside #[cfg(test)] (at most 600)"]
    );
    assert_eq!(declared_fn("    pub fn x()"), Some("x"));
    assert_eq!(declared_fn("    const unsafe fn y<T>()"), Some("y"));
    assert_eq!(declared_fn("    public fn z()"), None);
    assert_eq!(declared_fn("let fnord = 1;"), None);
}
