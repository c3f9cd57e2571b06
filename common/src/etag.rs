//! [`ETag`]: one entity tag, as the master sends it in `ETag` and the agent
//! sends it back in `If-None-Match` (docs/protocol.md §6).
//!
//! The tag is kept byte for byte as it travels: the master builds it once
//! ([`ETag::of_listing`], [`ETag::of_digest`], [`ETag::gzip`]) and the agent
//! stores and sends back exactly what it received. Comparison is weak
//! (docs/protocol.md §6.2): [`ETag::core`] drops `W/`, the quotes and a
//! `-gzip` suffix, so the same listing revalidates whatever encoding it was
//! fetched with.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::digest::Sha256;

/// An entity tag, as sent on the wire (quotes included).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ETag(String);

impl ETag {
    /// A tag as received in a header, taken as it is.
    pub fn new(value: impl Into<String>) -> ETag {
        ETag(value.into())
    }

    /// The strong tag of a listing body (docs/protocol.md §6.1): `"` + the
    /// lowercase hex of the first 20 bytes of the body's sha256 + `"`. The
    /// master tags every listing with it and the agent checks a rebuilt
    /// listing against it.
    pub fn of_listing(body: &[u8]) -> ETag {
        ETag::of_digest(&Sha256::of(body).0[..20])
    }

    /// The strong tag naming `bytes` (a digest or a prefix of one): their
    /// lowercase hex, quoted.
    pub fn of_digest(bytes: &[u8]) -> ETag {
        ETag::from_core(&crate::hex::encode(bytes))
    }

    /// The strong tag whose [`ETag::core`] is `core`: `core`, quoted.
    pub fn from_core(core: &str) -> ETag {
        ETag(format!("\"{core}\""))
    }

    /// The tag of the gzipped form of the body this tag names:
    /// `"<core>-gzip"` (docs/protocol.md §6.2).
    pub fn gzip(&self) -> ETag {
        ETag(format!("{}-gzip\"", self.0.trim_end_matches('"')))
    }

    /// The tag as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part that names the content: without `W/`, the quotes and a
    /// `-gzip` suffix, so `"ab"`, `W/"ab"` and `"ab-gzip"` are all `ab`.
    pub fn core(&self) -> &str {
        core(&self.0)
    }

    /// Weak comparison: whether both tags name the same content.
    pub fn same_content(&self, other: &ETag) -> bool {
        self.core() == other.core()
    }

    /// Whether the `If-None-Match` values `header_values` name this tag
    /// (weak comparison; `*` matches any).
    pub fn matched_by<'a>(&self, header_values: impl IntoIterator<Item = &'a str>) -> bool {
        let want = self.core();
        if_none_match(header_values).any(|t| t == "*" || core(t) == want)
    }
}

/// The tags of `If-None-Match` header values, in order: each value split at
/// its commas, trimmed.
pub fn if_none_match<'a>(
    header_values: impl IntoIterator<Item = &'a str>,
) -> impl Iterator<Item = &'a str> {
    header_values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// [`ETag::core`] of a tag not (yet) held as an [`ETag`], such as one of
/// `If-None-Match`'s list.
pub fn core(tag: &str) -> &str {
    let t = tag.trim();
    let t = t.strip_prefix("W/").unwrap_or(t);
    let t = t.trim_matches('"');
    t.strip_suffix("-gzip").unwrap_or(t)
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ETag {
    fn from(value: &str) -> ETag {
        ETag::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_etags_and_their_cores() {
        let tag = ETag::of_listing(b"[]");
        assert_eq!(tag.as_str().len(), 42);
        assert!(tag.as_str().starts_with('"') && tag.as_str().ends_with('"'));
        let core = tag.core().to_owned();
        assert_eq!(core.len(), 40);
        for form in [
            tag.to_string(),
            format!("W/{tag}"),
            tag.gzip().to_string(),
            format!(" {tag} "),
        ] {
            assert_eq!(ETag::new(form.clone()).core(), core, "{form}");
        }
        assert_eq!(tag.gzip().as_str(), format!("\"{core}-gzip\""));
        assert_eq!(ETag::from_core(&core), tag);
    }

    #[test]
    fn if_none_match_compares_weakly() {
        let tag = ETag::of_listing(b"[]");
        let gz = tag.gzip();
        assert!(tag.matched_by([gz.as_str()]));
        assert!(gz.matched_by([format!("\"x\", W/{tag}").as_str()]));
        assert!(tag.matched_by(["*"]));
        assert!(!tag.matched_by(["\"x\"", "\"y\""]));
        assert!(!tag.matched_by([]));
    }
}
