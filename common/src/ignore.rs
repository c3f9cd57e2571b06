//! Puppet's ignore globs: `File.fnmatch?(pattern, basename)` with no flags.
//!
//! Both Puppet's file server and its agent apply `ignore` (`pluginsignore`)
//! to the *basename* of every entry at every depth, and never descend into an
//! ignored directory (docs/protocol.md §3.2). Ruby's flagless `fnmatch` differs
//! from a shell glob in ways that matter for purging:
//!
//! - `*`, `?` and `[...]` never match a leading `.`: `*` does not match
//!   `.git`, `.*` does;
//! - `{a,b}` is *not* alternation, the braces are literal;
//! - `**` is just `*` (a basename has no `/`);
//! - matching is case-sensitive, by character (`?` matches `é`), `[...]`
//!   classes and `\` escapes work;
//! - a malformed class (an unclosed `[`, or the empty `[]`) never matches,
//!   so neither does its pattern; `[!]` matches any one character; a
//!   reversed range `[z-a]` holds only its two ends; a trailing `\` is
//!   dropped.
//!
//! [`IgnoreSet`] parses each pattern with the grammar of Ruby's `dir.c`
//! (`fnmatch_helper`, `bracket`) into tokens that each match one character
//! or, for `*`, any run, and matches them itself; the fuzz target `ignore`
//! (fuzz/src/lib.rs) compares it with a line-by-line port of Ruby's
//! matcher and `fuzz/tests/ruby_fnmatch.rs` with Ruby itself. Master and
//! agent share this type, so what the master leaves out of a listing is
//! exactly what the agent leaves alone on disk.

/// A pattern Ruby refuses (it raises `ArgumentError` on a NUL byte); every
/// other string is a pattern, if perhaps one that never matches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ignore pattern {pattern:?}: {reason}")]
pub struct IgnoreError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One step of a pattern: each matches one character, except `Star`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// This character.
    Literal(char),
    /// `?`: any character.
    Any,
    /// `*` (or a run of them): any run of characters.
    Star,
    /// `[...]`: a character in (or, negated, not in) the inclusive ranges.
    Class {
        /// `[!...]` or `[^...]`.
        negated: bool,
        /// Inclusive ranges, single characters as `(c, c)`.
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// True if this one-character token matches `c`.
    fn matches_char(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::Any => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

/// A parsed pattern; `None` tokens for one that can never match.
#[derive(Debug, Clone)]
struct Pattern(Option<Vec<Token>>);

impl Pattern {
    /// Parses `pattern` as Ruby's `fnmatch_helper` reads it.
    fn parse(pattern: &str) -> Pattern {
        let p: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                '*' => {
                    while i < p.len() && p[i] == '*' {
                        i += 1;
                    }
                    tokens.push(Token::Star);
                    continue;
                }
                '?' => tokens.push(Token::Any),
                '[' => match parse_class(&p, i + 1) {
                    Some((token, next)) => {
                        tokens.push(token);
                        i = next;
                        continue;
                    }
                    None => return Pattern(None),
                },
                // A trailing backslash escapes the end: nothing.
                '\\' => {
                    if let Some(&c) = p.get(i + 1) {
                        tokens.push(Token::Literal(c));
                    }
                    i += 2;
                    continue;
                }
                c => tokens.push(Token::Literal(c)),
            }
            i += 1;
        }
        Pattern(Some(tokens))
    }

    /// True if the pattern matches all of `name`.
    fn matches(&self, name: &str) -> bool {
        let Some(tokens) = &self.0 else {
            return false;
        };
        // Only a literal `.` matches a leading `.`.
        if name.starts_with('.') && tokens.first() != Some(&Token::Literal('.')) {
            return false;
        }
        // Every token but `*` takes exactly one character, so on a mismatch
        // it is enough to let the last `*` take one more (as Ruby does).
        let (mut t, mut n) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while let Some(c) = name[n..].chars().next() {
            match tokens.get(t) {
                Some(Token::Star) => {
                    t += 1;
                    star = Some((t, n));
                    continue;
                }
                Some(token) if token.matches_char(c) => {
                    t += 1;
                    n += c.len_utf8();
                    continue;
                }
                _ => {}
            }
            let Some((after_star, from)) = star else {
                return false;
            };
            // `from` < `n` + 1 <= len: there is a character at `from`.
            let next = from + name[from..].chars().next().map_or(1, char::len_utf8);
            t = after_star;
            n = next;
            star = Some((after_star, next));
        }
        tokens[t..].iter().all(|token| *token == Token::Star)
    }
}

/// Reads a class after its `[` (at `i`) as Ruby's `bracket` does: the token
/// and the index after the closing `]`, or `None` for a malformed class
/// (unclosed, or `[]`), which Ruby never matches.
fn parse_class(p: &[char], mut i: usize) -> Option<(Token, usize)> {
    let at = |i: usize| p.get(i).copied();
    let mut negated = false;
    if matches!(at(i), Some('!' | '^')) {
        negated = true;
        i += 1;
    }
    let mut ranges = Vec::new();
    while at(i) != Some(']') {
        let mut t1 = i;
        if at(t1) == Some('\\') {
            t1 += 1;
        }
        let lo = at(t1)?;
        i = t1 + 1;
        at(i)?;
        if at(i) == Some('-') && at(i + 1) != Some(']') {
            let mut t2 = i + 1;
            if at(t2) == Some('\\') {
                t2 += 1;
            }
            let hi = at(t2)?;
            i = t2 + 1;
            if lo <= hi {
                ranges.push((lo, hi));
            } else {
                // Ruby compares with both ends first, then the range.
                ranges.extend([(lo, lo), (hi, hi)]);
            }
        } else {
            ranges.push((lo, lo));
        }
    }
    if ranges.is_empty() && !negated {
        return None;
    }
    Some((Token::Class { negated, ranges }, i + 1))
}

/// A compiled list of ignore patterns; see the module docs for the semantics.
#[derive(Debug, Clone, Default)]
pub struct IgnoreSet {
    patterns: Vec<String>,
    parsed: Vec<Pattern>,
}

impl IgnoreSet {
    /// A set that ignores nothing.
    pub fn empty() -> Self {
        IgnoreSet::default()
    }

    /// Compiles `patterns`; only a NUL byte is refused, as Ruby does.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, IgnoreError> {
        let mut parsed = Vec::with_capacity(patterns.len());
        for p in patterns {
            let p = p.as_ref();
            if p.contains('\0') {
                return Err(IgnoreError {
                    pattern: p.to_owned(),
                    reason: "NUL byte".into(),
                });
            }
            parsed.push(Pattern::parse(p));
        }
        Ok(IgnoreSet {
            patterns: patterns.iter().map(|p| p.as_ref().to_owned()).collect(),
            parsed,
        })
    }

    /// True if an entry with this basename is ignored (and, for a directory,
    /// not descended into).
    pub fn is_ignored(&self, basename: &str) -> bool {
        self.parsed.iter().any(|p| p.matches(basename))
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &[&str]) -> IgnoreSet {
        IgnoreSet::new(p).unwrap()
    }

    #[test]
    fn puppet_defaults() {
        let s = set(&crate::DEFAULT_IGNORE);
        for yes in [".git", ".svn", "CVS", ".hg"] {
            assert!(s.is_ignored(yes), "{yes}");
        }
        for no in ["git", ".gitignore", "cvs", "CVS2", "a.git"] {
            assert!(!s.is_ignored(no), "{no}");
        }
    }

    #[test]
    fn star_does_not_match_a_leading_dot() {
        let s = set(&["*"]);
        assert!(s.is_ignored("a"));
        assert!(s.is_ignored("a.rb"));
        assert!(!s.is_ignored(".git"));
        assert!(set(&[".*"]).is_ignored(".git"));
        assert!(!set(&["?git"]).is_ignored(".git"));
        assert!(!set(&["[.]git"]).is_ignored(".git"));
        assert!(set(&["*.swp"]).is_ignored("x.rb.swp"));
        assert!(!set(&["*.swp"]).is_ignored(".x.swp"));
        assert!(set(&[".*.swp"]).is_ignored(".x.swp"));
        assert!(set(&["\\.git"]).is_ignored(".git"));
    }

    #[test]
    fn braces_are_literal() {
        let s = set(&["{a,b}"]);
        assert!(!s.is_ignored("a"));
        assert!(!s.is_ignored("b"));
        assert!(s.is_ignored("{a,b}"));
        assert!(set(&["*.{rb}"]).is_ignored("x.{rb}"));
    }

    #[test]
    fn double_star_is_star_and_classes_work() {
        assert!(set(&["**.rb"]).is_ignored("x.rb"));
        assert!(set(&["a**"]).is_ignored("abc"));
        assert!(set(&["[ab]*"]).is_ignored("bcd"));
        assert!(!set(&["[!ab]*"]).is_ignored("bcd"));
        assert!(set(&["[!ab]*"]).is_ignored("cde"));
        assert!(set(&["\\*"]).is_ignored("*"));
        assert!(!set(&["\\*"]).is_ignored("a"));
    }

    /// Ruby 3.1's answers (`ruby -e 'p File.fnmatch?(p, s)'`), which the
    /// translation to globset got wrong until the ignore fuzz target compared
    /// it with a port of Ruby's matcher.
    #[test]
    fn edge_cases_as_ruby_answers_them() {
        // By character, not by byte.
        assert!(set(&["?"]).is_ignored("é"));
        assert!(set(&["é?"]).is_ignored("éé"));
        assert!(set(&["[à-ÿ]x"]).is_ignored("éx"));
        // Malformed classes never match.
        for (p, name) in [
            ("a[b", "a[b"),
            ("[", "["),
            ("*[", "x["),
            ("[]x]", "]"),
            ("[]x]", "x"),
        ] {
            assert!(!set(&[p]).is_ignored(name), "{p} on {name}");
        }
        // `[!]` is any character; a reversed range holds its two ends.
        assert!(set(&["[!]"]).is_ignored("x"));
        assert!(set(&["[z-a]"]).is_ignored("z") && set(&["[z-a]"]).is_ignored("a"));
        assert!(!set(&["[z-a]"]).is_ignored("m"));
        // Escapes inside classes; a trailing backslash is dropped.
        assert!(set(&["[\\]-a]"]).is_ignored("^"));
        assert!(set(&["a\\"]).is_ignored("a"));
        assert!(set(&["[a-]"]).is_ignored("-"));
        assert!(IgnoreSet::new(&["a\0"]).is_err());
    }

    #[test]
    fn case_sensitive_and_basename_only() {
        assert!(!set(&["cvs"]).is_ignored("CVS"));
        assert!(!set(&["a/b"]).is_ignored("b"));
        assert!(!IgnoreSet::empty().is_ignored("anything"));
    }
}
