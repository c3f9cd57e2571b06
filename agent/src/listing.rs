//! Turning a `file_metadatas` answer ([`validate`]), or a mount of a
//! generation's manifest ([`from_manifest`]), into a [`RemoteTree`] the
//! agent trusts.
//!
//! Everything from the wire is checked before it can name a path: every
//! `relative_path` must parse as a [`RelPath`] (relative, no `..`, no NUL);
//! `"."` must be present and a directory (a listing without it is an error,
//! never an empty tree to purge against); no path twice; every entry's
//! parent directory must be listed; files must carry a `{sha256}` checksum.
//! Entries matching the ignore globs (any segment) are dropped, so an
//! ignored name is never managed even if a server lists it.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use pluginsync_common::digest::Sha256;
use pluginsync_common::generation::{EntryKind, Manifest};
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{FileMetadata, FileType};
use pluginsync_common::protocol::Mount;
use pluginsync_common::relpath::RelPath;

/// The permission bits a listing's `mode` is reduced to (docs/protocol.md
/// §4.3, §4.5): read and execute stay as the master lists them, the owner
/// may write, and nothing becomes group- or world-writable, setuid, setgid
/// or sticky. A 0777 directory or a 0666 file on a master's code tree is
/// code root runs on every node: it arrives as 0755 or 0644.
pub const MODE_MASK: u32 = 0o755;

/// The name of the agent's staging directory inside each destination;
/// reserved, never synced or purged.
pub const STAGING_DIR: &str = ".pluginsync-staging";

/// What a remote entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteKind {
    /// A directory.
    Dir,
    /// A file with this content.
    File {
        /// Its sha256, parsed from the listing's `{sha256}` checksum.
        digest: Sha256,
    },
}

/// One remote entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEntry {
    /// File or directory.
    pub kind: RemoteKind,
    /// Permission bits from the listing, `mode & MODE_MASK`.
    pub mode: u32,
}

/// A validated listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteTree {
    /// Permission bits of `"."`.
    pub root_mode: u32,
    /// Everything below `"."`, sorted (parents before children).
    pub entries: BTreeMap<RelPath, RemoteEntry>,
}

/// A listing the agent refuses; the run stops before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    /// No `"."` entry.
    #[error("listing has no \".\" entry")]
    NoRoot,
    /// `"."` is not a directory.
    #[error("listing's \".\" entry is not a directory")]
    RootNotDir,
    /// A path that could escape the destination, or a reserved name.
    #[error("listing has a hostile path {path:?}: {reason}")]
    Hostile {
        /// The path as sent.
        path: String,
        /// Why it is refused.
        reason: String,
    },
    /// Anything else malformed.
    #[error("malformed listing: {0}")]
    Malformed(String),
}

/// What one entry is, as a source describes it, before the checks.
enum Described {
    /// A directory.
    Dir,
    /// A file with this content.
    File(Sha256),
    /// Something the agent does not manage (a special file, a link):
    /// skipped with a warning.
    Skip(&'static str),
}

/// Validates a listing against the rules in the module docs.
pub fn validate(
    listing: Vec<FileMetadata>,
    ignore: &IgnoreSet,
) -> Result<RemoteTree, ListingError> {
    let entries = listing.into_iter().map(|m| {
        let raw = m
            .relative_path
            .ok_or_else(|| ListingError::Malformed("an entry has no relative_path".into()))?;
        let rel = RelPath::parse(&raw).map_err(|e| ListingError::Hostile {
            path: raw.clone(),
            reason: e.to_string(),
        })?;
        let is_dir = m.kind == FileType::Directory;
        Ok((rel, is_dir, (m.kind, m.checksum, raw), m.mode))
    });
    checked(entries, ignore, |(kind, checksum, raw)| {
        Ok(match kind {
            FileType::Directory => Described::Dir,
            FileType::File | FileType::Link => {
                let value = checksum.map(|c| c.value).unwrap_or_default();
                // Parsed once, here: from now on the digest is a value.
                let digest = Sha256::from_checksum(&value).map_err(|_| {
                    ListingError::Malformed(format!(
                        "'{raw}' has no sha256 checksum (got {value:?})"
                    ))
                })?;
                Described::File(digest)
            }
            FileType::Other => Described::Skip("listing has a special file, skipped"),
        })
    })
}

/// The tree of `mount` in a generation's manifest (docs/protocol.md
/// §7.6), checked by the rules of a listing (module docs): the manifest
/// proved itself by its id, but what it names is still from the wire.
/// Ignore globs and [`MODE_MASK`] apply as to a listing; a link (the
/// manifest of a master that manages links) is skipped with a warning, as
/// the agent follows links.
pub fn from_manifest(
    manifest: &Manifest,
    mount: Mount,
    ignore: &IgnoreSet,
) -> Result<RemoteTree, ListingError> {
    let entries = manifest.mount(mount).map(|e| {
        let is_dir = e.kind == EntryKind::Directory;
        Ok((e.path.clone(), is_dir, &e.kind, e.mode))
    });
    checked(entries, ignore, |kind| {
        Ok(match kind {
            EntryKind::Directory => Described::Dir,
            EntryKind::File { sha256, .. } => Described::File(*sha256),
            EntryKind::Link { .. } => Described::Skip("manifest has a link, skipped"),
        })
    })
}

/// The checks of the module docs over entries `(path, is a directory,
/// what `describe` makes of it, mode)`; `describe` is asked only for
/// entries below `"."` that are not ignored.
fn checked<T>(
    items: impl Iterator<Item = Result<(RelPath, bool, T, u32), ListingError>>,
    ignore: &IgnoreSet,
    describe: impl Fn(T) -> Result<Described, ListingError>,
) -> Result<RemoteTree, ListingError> {
    let mut root_mode = None;
    let mut entries = BTreeMap::new();
    for item in items {
        let (rel, is_dir, what, mode) = item?;
        if rel.is_root() {
            if root_mode.is_some() {
                return Err(ListingError::Malformed("\".\" is listed twice".into()));
            }
            if !is_dir {
                return Err(ListingError::RootNotDir);
            }
            root_mode = Some(mode & MODE_MASK);
            continue;
        }
        if rel.segments().next() == Some(STAGING_DIR) {
            return Err(ListingError::Hostile {
                path: rel.to_string(),
                reason: format!("'{STAGING_DIR}' is reserved for the agent"),
            });
        }
        if rel.segments().any(|seg| ignore.is_ignored(seg)) {
            continue;
        }
        let kind = match describe(what)? {
            Described::Dir => RemoteKind::Dir,
            Described::File(digest) => RemoteKind::File { digest },
            Described::Skip(why) => {
                tracing::warn!(path = %rel, "{why}");
                continue;
            }
        };
        let mode = mode & MODE_MASK;
        match entries.entry(rel) {
            Entry::Vacant(v) => {
                v.insert(RemoteEntry { kind, mode });
            }
            Entry::Occupied(o) => {
                return Err(ListingError::Malformed(format!(
                    "'{}' is listed twice",
                    o.key()
                )));
            }
        }
    }
    let root_mode = root_mode.ok_or(ListingError::NoRoot)?;
    for rel in entries.keys() {
        if let Some(parent) = rel.parent().filter(|p| !p.is_root()) {
            match entries.get(&parent) {
                Some(RemoteEntry {
                    kind: RemoteKind::Dir,
                    ..
                }) => {}
                Some(_) => {
                    return Err(ListingError::Malformed(format!(
                        "'{rel}' is listed below the file '{parent}'"
                    )));
                }
                None => {
                    return Err(ListingError::Malformed(format!(
                        "'{rel}' is listed without its directory '{parent}'"
                    )));
                }
            }
        }
    }
    Ok(RemoteTree { root_mode, entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::metadata::{Checksum, Links, Principal};

    fn meta(rel: &str, kind: FileType, content: Option<&str>) -> FileMetadata {
        FileMetadata {
            path: "/srv/m/lib".into(),
            relative_path: Some(rel.into()),
            links: Links::Follow,
            owner: Principal::Id(0),
            group: Principal::Id(0),
            mode: 0o100755,
            checksum: content.map(|c| Checksum {
                kind: "sha256".into(),
                value: pluginsync_common::checksum::ChecksumType::Sha256
                    .digest_reader(c.as_bytes())
                    .unwrap(),
            }),
            kind,
            destination: None,
        }
    }

    fn ok_listing() -> Vec<FileMetadata> {
        vec![
            meta(".", FileType::Directory, None),
            meta("facter", FileType::Directory, None),
            meta("facter/x.rb", FileType::File, Some("x")),
        ]
    }

    fn ignore() -> IgnoreSet {
        IgnoreSet::new(&pluginsync_common::DEFAULT_IGNORE).unwrap()
    }

    #[test]
    fn accepts_a_good_listing_and_masks_modes() {
        let t = validate(ok_listing(), &ignore()).unwrap();
        assert_eq!(t.root_mode, 0o755);
        assert_eq!(t.entries.len(), 2);
        assert!(t.entries.values().all(|e| e.mode == 0o755));
    }

    #[test]
    fn group_and_world_write_never_come_from_a_listing() {
        let mut l = ok_listing();
        l[0].mode = 0o40777;
        l[1].mode = 0o42777;
        l[2].mode = 0o104666;
        let t = validate(l, &ignore()).unwrap();
        assert_eq!(t.root_mode, 0o755);
        let modes: Vec<u32> = t.entries.values().map(|e| e.mode).collect();
        assert_eq!(modes, [0o755, 0o644]);
    }

    #[test]
    fn refuses_hostile_and_malformed_listings() {
        let with = |extra: FileMetadata| {
            let mut l = ok_listing();
            l.push(extra);
            validate(l, &ignore())
        };
        assert!(matches!(
            with(meta("../x", FileType::File, Some("x"))),
            Err(ListingError::Hostile { .. })
        ));
        assert!(matches!(
            with(meta("/etc/x", FileType::File, Some("x"))),
            Err(ListingError::Hostile { .. })
        ));
        assert!(matches!(
            with(meta("facter/../../x", FileType::File, Some("x"))),
            Err(ListingError::Hostile { .. })
        ));
        assert!(matches!(
            with(meta("a\0b", FileType::File, Some("x"))),
            Err(ListingError::Hostile { .. })
        ));
        assert!(matches!(
            with(meta(STAGING_DIR, FileType::Directory, None)),
            Err(ListingError::Hostile { .. })
        ));
        assert!(matches!(
            with(meta("facter/x.rb", FileType::File, Some("y"))),
            Err(ListingError::Malformed(_))
        ));
        assert!(matches!(
            with(meta("nodir/x.rb", FileType::File, Some("y"))),
            Err(ListingError::Malformed(_))
        ));
        assert!(matches!(
            with(meta("facter/x.rb/y", FileType::File, Some("y"))),
            Err(ListingError::Malformed(_))
        ));
        assert!(matches!(
            with(meta("nosum.rb", FileType::File, None)),
            Err(ListingError::Malformed(_))
        ));
        assert_eq!(
            validate(ok_listing()[1..].to_vec(), &ignore()),
            Err(ListingError::NoRoot)
        );
        let mut l = ok_listing();
        l[0].kind = FileType::File;
        assert_eq!(validate(l, &ignore()), Err(ListingError::RootNotDir));
    }

    #[test]
    fn ignored_names_are_never_managed() {
        let mut l = ok_listing();
        l.push(meta(".git", FileType::Directory, None));
        l.push(meta(".git/config", FileType::File, Some("c")));
        l.push(meta("facter/CVS", FileType::File, Some("c")));
        let t = validate(l, &ignore()).unwrap();
        assert_eq!(t.entries.len(), 2);
    }
}
