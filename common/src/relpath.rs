//! [`RelPath`]: a relative path that is safe to join under a root.
//!
//! Every path that comes from the wire (a `relative_path` in a listing, the
//! path after a mount in a request) goes through [`RelPath::parse`] before it
//! touches a file system. The invariant: a `RelPath` is either the root `"."`
//! or a `/`-separated list of non-empty segments, none of which is `.` or
//! `..`, and none of which holds a NUL or a backslash. Joining it under a
//! directory therefore can never name anything outside that directory
//! (symlinks aside: those are the caller's business, see the agent's commit
//! step and the master's index).

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelPathError {
    /// The path was empty.
    #[error("empty path")]
    Empty,
    /// The path started with `/`.
    #[error("absolute path '{0}'")]
    Absolute(String),
    /// A segment was `..`.
    #[error("path '{0}' has a '..' segment")]
    ParentSegment(String),
    /// A segment was `.` (only the whole path may be `.`).
    #[error("path '{0}' has a '.' segment")]
    DotSegment(String),
    /// Two slashes in a row, or a trailing slash.
    #[error("path '{0}' has an empty segment")]
    EmptySegment(String),
    /// A NUL byte.
    #[error("path {0:?} has a NUL byte")]
    Nul(String),
    /// A backslash, which Windows would read as a separator.
    #[error("path '{0}' has a backslash")]
    Backslash(String),
}

/// A validated relative path, `"."` for the root. See the module docs.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

impl RelPath {
    /// The root of a tree, `"."`.
    pub fn root() -> Self {
        RelPath(".".to_owned())
    }

    /// Validates `s` as a relative path (see the module docs for the rules).
    pub fn parse(s: &str) -> Result<Self, RelPathError> {
        if s.is_empty() {
            return Err(RelPathError::Empty);
        }
        if s == "." {
            return Ok(Self::root());
        }
        if s.contains('\0') {
            return Err(RelPathError::Nul(s.to_owned()));
        }
        if s.contains('\\') {
            return Err(RelPathError::Backslash(s.to_owned()));
        }
        if s.starts_with('/') {
            return Err(RelPathError::Absolute(s.to_owned()));
        }
        for seg in s.split('/') {
            match seg {
                "" => return Err(RelPathError::EmptySegment(s.to_owned())),
                "." => return Err(RelPathError::DotSegment(s.to_owned())),
                ".." => return Err(RelPathError::ParentSegment(s.to_owned())),
                _ => {}
            }
        }
        Ok(RelPath(s.to_owned()))
    }

    /// True for the root `"."`.
    pub fn is_root(&self) -> bool {
        self.0 == "."
    }

    /// The path as a string, `"."` for the root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments, none for the root.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        let s = if self.is_root() { "" } else { self.0.as_str() };
        s.split('/').filter(|seg| !seg.is_empty())
    }

    /// The last segment, `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.is_root() {
            None
        } else {
            self.0.rsplit('/').next()
        }
    }

    /// The parent, `None` for the root; the parent of `a` is the root.
    pub fn parent(&self) -> Option<RelPath> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(i) => RelPath(self.0[..i].to_owned()),
            None => Self::root(),
        })
    }

    /// Number of segments: 0 for the root, 1 for `a`, 2 for `a/b`.
    pub fn depth(&self) -> usize {
        self.segments().count()
    }

    /// Appends one validated segment.
    pub fn join(&self, segment: &str) -> Result<RelPath, RelPathError> {
        let joined = if self.is_root() {
            segment.to_owned()
        } else {
            format!("{}/{}", self.0, segment)
        };
        if segment.contains('/') {
            return Err(RelPathError::EmptySegment(joined));
        }
        // `self` is valid already: only the new segment needs a look (a
        // scan joins one per directory entry); a refused one is named by
        // the whole path, as `parse` names it.
        let plain = !matches!(segment, "" | "." | "..") && !segment.contains(['\\', '\0']);
        if plain {
            return Ok(RelPath(joined));
        }
        RelPath::parse(&joined)
    }

    /// `base` joined with this path; `base` itself for the root.
    pub fn to_path(&self, base: &Path) -> PathBuf {
        let mut p = base.to_path_buf();
        for seg in self.segments() {
            p.push(seg);
        }
        p
    }

    /// True if `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &RelPath) -> bool {
        other.is_root()
            || self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes().get(other.0.len()) == Some(&b'/'))
    }
}

/// Written as its string; read back through [`RelPath::parse`], so a
/// stored path is checked as one from the wire.
impl serde::Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for RelPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        RelPath::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelPath({:?})", self.0)
    }
}

impl AsRef<str> for RelPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_plain_paths() {
        for ok in [
            ".",
            "a",
            "a/b.rb",
            "facter/with space.rb",
            "ünï.rb",
            "a+b",
            "x;y",
            "..a",
            "a..",
        ] {
            assert_eq!(RelPath::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_escapes() {
        assert_eq!(RelPath::parse(""), Err(RelPathError::Empty));
        assert!(matches!(
            RelPath::parse("/etc/x"),
            Err(RelPathError::Absolute(_))
        ));
        assert!(matches!(
            RelPath::parse("../x"),
            Err(RelPathError::ParentSegment(_))
        ));
        assert!(matches!(
            RelPath::parse("a/../../x"),
            Err(RelPathError::ParentSegment(_))
        ));
        assert!(matches!(
            RelPath::parse("a/.."),
            Err(RelPathError::ParentSegment(_))
        ));
        assert!(matches!(
            RelPath::parse("./a"),
            Err(RelPathError::DotSegment(_))
        ));
        assert!(matches!(
            RelPath::parse("a//b"),
            Err(RelPathError::EmptySegment(_))
        ));
        assert!(matches!(
            RelPath::parse("a/"),
            Err(RelPathError::EmptySegment(_))
        ));
        assert!(matches!(RelPath::parse("a\0b"), Err(RelPathError::Nul(_))));
        assert!(matches!(
            RelPath::parse("a\\..\\b"),
            Err(RelPathError::Backslash(_))
        ));
    }

    #[test]
    fn navigation() {
        let p = RelPath::parse("a/b/c.rb").unwrap();
        assert_eq!(p.file_name(), Some("c.rb"));
        assert_eq!(p.parent().unwrap().as_str(), "a/b");
        assert_eq!(RelPath::parse("a").unwrap().parent(), Some(RelPath::root()));
        assert_eq!(RelPath::root().parent(), None);
        assert_eq!(p.depth(), 3);
        assert_eq!(RelPath::root().depth(), 0);
        assert!(p.starts_with(&RelPath::parse("a/b").unwrap()));
        assert!(
            !RelPath::parse("a/bc")
                .unwrap()
                .starts_with(&RelPath::parse("a/b").unwrap())
        );
        assert_eq!(RelPath::root().join("x").unwrap().as_str(), "x");
        assert!(RelPath::root().join("..").is_err());
        assert!(RelPath::root().join("a/b").is_err());
        assert_eq!(p.to_path(Path::new("/lib")), PathBuf::from("/lib/a/b/c.rb"));
    }

    proptest! {
        /// Whatever string comes from the wire, an accepted path joined under a
        /// root stays under that root, lexically.
        #[test]
        fn accepted_paths_stay_inside(s in "[a./\\\\\0b]{0,12}") {
            if let Ok(p) = RelPath::parse(&s) {
                let joined = p.to_path(Path::new("/root"));
                prop_assert!(joined.starts_with("/root"));
                for c in joined.strip_prefix("/root").unwrap().components() {
                    prop_assert!(matches!(c, std::path::Component::Normal(_)));
                }
            }
        }
    }
}
