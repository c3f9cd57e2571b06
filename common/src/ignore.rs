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
//! - matching is case-sensitive, `[...]` classes and `\` escapes work.
//!
//! [`IgnoreSet`] compiles the patterns with globset after rewriting them to
//! those semantics (braces become the classes `[{]`/`[}]`, runs of `*` fold
//! to one) and enforces the leading-dot rule itself, since globset has no
//! such option. Master and agent share this type, so what the master leaves
//! out of a listing is exactly what the agent leaves alone on disk.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// A pattern that globset refused (an unclosed class, say).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ignore pattern '{pattern}': {reason}")]
pub struct IgnoreError {
    /// The pattern as given.
    pub pattern: String,
    /// globset's explanation.
    pub reason: String,
}

/// A compiled list of ignore patterns; see the module docs for the semantics.
#[derive(Debug, Clone)]
pub struct IgnoreSet {
    patterns: Vec<String>,
    /// Every pattern: consulted for names that do not start with `.`.
    all: GlobSet,
    /// Only the patterns that start with a literal `.`: for dot names.
    dot: GlobSet,
}

impl Default for IgnoreSet {
    fn default() -> Self {
        Self::empty()
    }
}

impl IgnoreSet {
    /// A set that ignores nothing.
    pub fn empty() -> Self {
        IgnoreSet {
            patterns: Vec::new(),
            all: GlobSet::empty(),
            dot: GlobSet::empty(),
        }
    }

    /// Compiles `patterns`.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, IgnoreError> {
        let mut all = GlobSetBuilder::new();
        let mut dot = GlobSetBuilder::new();
        for p in patterns {
            let p = p.as_ref();
            let glob = GlobBuilder::new(&translate(p))
                .literal_separator(true)
                .backslash_escape(true)
                .case_insensitive(false)
                .build()
                .map_err(|e| IgnoreError {
                    pattern: p.to_owned(),
                    reason: e.kind().to_string(),
                })?;
            if p.starts_with('.') || p.starts_with("\\.") {
                dot.add(glob.clone());
            }
            all.add(glob);
        }
        let build = |b: GlobSetBuilder| {
            b.build().map_err(|e| IgnoreError {
                pattern: patterns
                    .iter()
                    .map(AsRef::as_ref)
                    .collect::<Vec<_>>()
                    .join(" "),
                reason: e.to_string(),
            })
        };
        Ok(IgnoreSet {
            patterns: patterns.iter().map(|p| p.as_ref().to_owned()).collect(),
            all: build(all)?,
            dot: build(dot)?,
        })
    }

    /// True if an entry with this basename is ignored (and, for a directory,
    /// not descended into).
    pub fn is_ignored(&self, basename: &str) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        if basename.starts_with('.') {
            self.dot.is_match(basename)
        } else {
            self.all.is_match(basename)
        }
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

/// Rewrites a Ruby fnmatch pattern into a globset pattern with the same
/// meaning on a basename.
fn translate(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push('\\');
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                out.push('*');
            }
            '{' => out.push_str("[{]"),
            '}' => out.push_str("[}]"),
            '[' => {
                // Copy a class through verbatim; `]` right after `[`, `[!` or
                // `[^` is a member, not the end.
                let mut class = String::from("[");
                if let Some(&n) = chars.peek()
                    && (n == '!' || n == '^')
                {
                    class.push(chars.next().unwrap_or(n));
                }
                if chars.peek() == Some(&']') {
                    class.push(chars.next().unwrap_or(']'));
                }
                let mut closed = false;
                for n in chars.by_ref() {
                    class.push(n);
                    if n == ']' {
                        closed = true;
                        break;
                    }
                }
                if closed {
                    out.push_str(&class);
                } else {
                    // Ruby treats an unclosed `[` as a literal character.
                    out.push_str("\\[");
                    out.push_str(&translate(&class[1..]));
                }
            }
            _ => out.push(c),
        }
    }
    out
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
        assert!(set(&["[]x]"]).is_ignored("]"));
        assert!(set(&["a[b"]).is_ignored("a[b"));
        assert!(set(&["\\*"]).is_ignored("*"));
        assert!(!set(&["\\*"]).is_ignored("a"));
    }

    #[test]
    fn case_sensitive_and_basename_only() {
        assert!(!set(&["cvs"]).is_ignored("CVS"));
        assert!(!set(&["a/b"]).is_ignored("b"));
        assert!(!IgnoreSet::empty().is_ignored("anything"));
    }
}
