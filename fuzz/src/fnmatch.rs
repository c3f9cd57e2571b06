//! A reference for [`pluginsync_common::ignore`]: Ruby's flagless
//! `File.fnmatch?(pattern, name)`, ported line by line from
//! `fnmatch_helper` and `bracket` in Ruby's `dir.c` (the matcher Puppet's
//! `ignore` uses, docs/protocol.md §3.2), with none of the flags set: a
//! leading `.` is only matched by a literal `.`, `\` escapes, no
//! `FNM_PATHNAME`, no case folding, no braces.
//!
//! It works on chars, as Ruby does on UTF-8 strings (its `Inc` steps one
//! character, its ranges compare code points). It is deliberately a
//! different algorithm from the module under test (which rewrites the
//! pattern for globset), so that the two can be compared; the ignore
//! target asserts they agree on every pattern and name.

/// The char at `i`, or NUL past the end (C's terminator).
fn at(v: &[char], i: usize) -> char {
    v.get(i).copied().unwrap_or('\0')
}

/// Ruby's `UNESCAPE(p)`: skips one backslash.
fn unescape(p: &[char], i: usize) -> usize {
    if at(p, i) == '\\' { i + 1 } else { i }
}

/// True if Ruby's `File.fnmatch?(pattern, name)` (no flags) is true.
/// Ruby refuses a pattern or name with a NUL (`ArgumentError`); callers
/// leave those out.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = name.chars().collect();
    let (mut pi, mut si) = (0usize, 0usize);
    // Leading period: only a literal (possibly escaped) `.` matches it.
    if at(&s, 0) == '.' && at(&p, unescape(&p, 0)) != '.' {
        return false;
    }
    let mut backtrack: Option<(usize, usize)> = None;
    loop {
        match at(&p, pi) {
            '*' => {
                while at(&p, pi) == '*' {
                    pi += 1;
                }
                if unescape(&p, pi) >= p.len() {
                    return true;
                }
                if si >= s.len() {
                    return false;
                }
                backtrack = Some((pi, si));
                continue;
            }
            '?' => {
                if si >= s.len() {
                    return false;
                }
                pi += 1;
                si += 1;
                continue;
            }
            '[' => {
                if si >= s.len() {
                    return false;
                }
                if let Some(t) = bracket(&p, pi + 1, s[si]) {
                    pi = t;
                    si += 1;
                    continue;
                }
            }
            _ => {
                let q = unescape(&p, pi);
                if si >= s.len() {
                    return q >= p.len();
                }
                if q < p.len() && p[q] == s[si] {
                    pi = q + 1;
                    si += 1;
                    continue;
                }
            }
        }
        // failed: try the next position of the last `*`.
        match backtrack {
            Some((bp, bs)) => {
                pi = bp;
                si = bs + 1;
                backtrack = Some((bp, bs + 1));
            }
            None => return false,
        }
    }
}

/// Ruby's `bracket`: `i` is just after `[`; the index after the closing
/// `]` if `c` is in the class, `None` if it is not or the class is
/// malformed (unclosed, or `[]`).
fn bracket(p: &[char], mut i: usize, c: char) -> Option<usize> {
    let end = p.len();
    if i >= end {
        return None;
    }
    let (mut ok, mut not) = (false, false);
    if p[i] == '!' || p[i] == '^' {
        not = true;
        i += 1;
    }
    while at(p, i) != ']' {
        let mut t1 = i;
        if at(p, t1) == '\\' {
            t1 += 1;
        }
        if t1 >= end {
            return None;
        }
        i = t1 + 1;
        if i >= end {
            return None;
        }
        if p[i] == '-' && at(p, i + 1) != ']' {
            let mut t2 = i + 1;
            if at(p, t2) == '\\' {
                t2 += 1;
            }
            if t2 >= end {
                return None;
            }
            i = t2 + 1;
            if ok {
                continue;
            }
            if p[t1] == c || p[t2] == c {
                ok = true;
                continue;
            }
            if c < p[t1] || c > p[t2] {
                continue;
            }
        } else {
            if ok {
                continue;
            }
            if p[t1] == c {
                ok = true;
            }
            continue;
        }
        ok = true;
    }
    if ok == not { None } else { Some(i + 1) }
}

#[cfg(test)]
mod tests {
    use super::fnmatch;

    /// Answers checked against `ruby -e 'p File.fnmatch?(p, s)'` (Ruby 3.1).
    #[test]
    fn agrees_with_ruby_on_known_cases() {
        for (p, s, want) in [
            ("a[b", "a[b", false),
            ("[]x]", "]", false),
            ("[!]", "a", true),
            ("a\\", "a", true),
            ("[a-]", "-", true),
            ("*", ".", false),
            ("[", "[", false),
            ("é?", "éx", true),
            ("[z-a]", "z", true),
            ("[z-a]", "m", false),
            (".*", ".git", true),
            ("\\.git", ".git", true),
            ("*.swp", ".x.swp", false),
            ("{a,b}", "{a,b}", true),
            ("**.rb", "x.rb", true),
        ] {
            assert_eq!(fnmatch(p, s), want, "File.fnmatch?({p:?}, {s:?})");
        }
    }
}
