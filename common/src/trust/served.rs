//! What a master says, on the per-node answer, of the signed metadata it
//! serves (docs/trust.md#requests-per-run, docs/protocol.md §7.6): the
//! `ETag` of its `timestamp.json`, the newest `N.root.json`, and the
//! snapshot and targets versions that timestamp leads to. A node whose
//! kept timestamp has that `ETag` asks no metadata at all; one whose has
//! not asks the timestamp, snapshot and targets together, beside the
//! manifest, instead of one after the other.
//!
//! These are hints, never trusted: every file is still verified by tough
//! from the node's root. A master that lies in them can do no more than
//! one answering the timestamp's revalidation `304` (keep a node on the
//! metadata it has, until that expires) or withholding a new root, which
//! any master can.

/// The timestamp's `ETag` (as its own answer sends it).
pub const HEADER_TIMESTAMP: &str = "x-pluginsync-trust-timestamp";
/// The snapshot version the timestamp names.
pub const HEADER_SNAPSHOT: &str = "x-pluginsync-trust-snapshot";
/// The targets version that snapshot names.
pub const HEADER_TARGETS: &str = "x-pluginsync-trust-targets";

/// The signed metadata a master serves, as it says (unverified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The `ETag` of its `timestamp.json`.
    pub timestamp: String,
    /// The newest `N.root.json` it serves.
    pub root: u64,
    /// The snapshot version its timestamp names, when it says.
    pub snapshot: Option<u64>,
    /// The targets version that snapshot names, when it says.
    pub targets: Option<u64>,
}

impl Served {
    /// The headers that say it, by name (the root's is
    /// [`super::HEADER_ROOT_VERSION`], as on the timestamp's answer).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (HEADER_TIMESTAMP, self.timestamp.clone()),
            (super::HEADER_ROOT_VERSION, self.root.to_string()),
        ];
        out.extend(self.snapshot.map(|v| (HEADER_SNAPSHOT, v.to_string())));
        out.extend(self.targets.map(|v| (HEADER_TARGETS, v.to_string())));
        out
    }

    /// What `header` (a header's value by name) says; `None` without the
    /// timestamp's `ETag` or the root version (an older master, a master
    /// without `[trust] metadata`, a proxy that drops them): the node then
    /// revalidates the timestamp as before.
    pub fn from_headers(header: impl Fn(&str) -> Option<String>) -> Option<Served> {
        let version = |name| header(name)?.trim().parse::<u64>().ok();
        let timestamp = header(HEADER_TIMESTAMP).filter(|t| !t.is_empty())?;
        Some(Served {
            timestamp,
            root: version(super::HEADER_ROOT_VERSION)?,
            snapshot: version(HEADER_SNAPSHOT),
            targets: version(HEADER_TARGETS),
        })
    }
}

/// The version `metadata` (a timestamp's or a snapshot's bytes, not
/// verified) names for `file` (`snapshot.json`, `targets.json`): its
/// `signed.meta.<file>.version`.
pub fn named_version(metadata: &[u8], file: &str) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Doc {
        signed: Signed,
    }
    #[derive(serde::Deserialize)]
    struct Signed {
        meta: std::collections::HashMap<String, Meta>,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        version: u64,
    }
    let doc: Doc = serde_json::from_slice(metadata).ok()?;
    doc.signed.meta.get(file).map(|m| m.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_say_what_they_parse_back_to() {
        let s = Served {
            timestamp: "\"abc\"".into(),
            root: 2,
            snapshot: Some(7),
            targets: Some(5),
        };
        let h = s.headers();
        let get = |name: &str| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(Served::from_headers(get), Some(s.clone()));
        // Without the root version or the timestamp's ETag: nothing said.
        let partial =
            |skip: &'static str| move |name: &str| (name != skip).then(|| get(name)).flatten();
        assert_eq!(Served::from_headers(partial(HEADER_TIMESTAMP)), None);
        assert_eq!(
            Served::from_headers(partial(super::super::HEADER_ROOT_VERSION)),
            None
        );
        let without = Served::from_headers(partial(HEADER_TARGETS)).unwrap();
        assert_eq!((without.snapshot, without.targets), (Some(7), None));
    }

    #[test]
    fn a_version_is_read_from_the_meta_it_names() {
        let ts = br#"{"signed":{"_type":"timestamp","meta":{"snapshot.json":{"length":1,"version":12}}},"signatures":[]}"#;
        assert_eq!(named_version(ts, "snapshot.json"), Some(12));
        assert_eq!(named_version(ts, "targets.json"), None);
        assert_eq!(named_version(b"not json", "snapshot.json"), None);
    }
}
