//! Generations: an environment's two mounts at one moment, named by the
//! digest of their canonical manifest (docs/protocol.md §7.6).
//!
//! A [`Manifest`] lists every entry of `plugins` and `pluginfacts`: type,
//! mode, and for a file its sha256 and size, for a link its target. Its
//! canonical form ([`Manifest::to_bytes`]) is one line per entry, sorted by
//! mount (`plugins` first) then path bytes, so the same tree gives the same
//! bytes on every replica, and the [`GenerationId`] is the sha256 of those
//! bytes: a manifest proves itself ([`Manifest::parse`] refuses bytes whose
//! digest is not the id asked for), and every file it lists is proved by its
//! own sha256, whoever delivered it (a master, an HTTP cache, a bundle).
//!
//! ```text
//! pluginsync-manifest 1
//! plugins\tdirectory\t755\t-\t-\t.\t-
//! plugins\tfile\t644\t<64 hex>\t1234\tfacter/a.rb\t-
//! pluginfacts\tlink\t777\t-\t-\tx.sh\ty.sh
//! ```
//!
//! Paths and link targets are escaped ([`escape_field`]): `%`, every
//! control byte and space become `%XX`, so a field never holds a tab or a
//! newline. A [`ManifestDelta`] carries a generation as the difference from
//! another one the agent already holds; applying it and hashing the result
//! must give the new id, so a delta is checked exactly as a whole manifest.
//!
//! The per-node answer ([`Assignment`]) names the generation a node should
//! have; it is JSON, small, revalidated each run.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::{BadDigest, Sha256};
use crate::protocol::{self, Mount};
use crate::relpath::RelPath;
use crate::urlpath::encode_query_value;

mod escape;

use escape::push_escaped;
pub use escape::{escape_field, unescape_field};

/// The first line of a canonical manifest.
pub const MANIFEST_MAGIC: &str = "pluginsync-manifest 1";
/// The first line of a manifest delta.
pub const DELTA_MAGIC: &str = "pluginsync-manifest-delta 1";

/// A generation's name: the sha256 of its canonical manifest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GenerationId(pub Sha256);

impl GenerationId {
    /// The id of these canonical manifest bytes.
    pub fn of(manifest_bytes: &[u8]) -> GenerationId {
        GenerationId(Sha256::of(manifest_bytes))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }

    /// The first 12 hex digits, for log lines and tables.
    pub fn short(&self) -> String {
        self.0.to_hex()[..12].to_owned()
    }
}

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GenerationId({})", self.short())
    }
}

impl FromStr for GenerationId {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<GenerationId, BadDigest> {
        Sha256::from_hex(s).map(GenerationId)
    }
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A directory.
    Directory,
    /// A regular file.
    File {
        /// Its content's sha256.
        sha256: Sha256,
        /// Its size in bytes.
        size: u64,
    },
    /// A symbolic link (served only where links are managed).
    Link {
        /// The link's target, as read.
        target: String,
    },
}

/// One entry of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestEntry {
    /// The mount it belongs to.
    pub mount: Mount,
    /// Its path below the mount, `"."` for the mount's root.
    pub path: RelPath,
    /// Permission bits as served (`mode & 0o7777`).
    pub mode: u32,
    /// Directory, file or link.
    pub kind: EntryKind,
}

impl ManifestEntry {
    /// The canonical sort key: mount (`plugins` first), then path bytes.
    pub fn key(&self) -> (Mount, &RelPath) {
        (self.mount, &self.path)
    }

    fn write_line(&self, out: &mut String) {
        use std::fmt::Write;
        let (kind, sha, size, target) = match &self.kind {
            EntryKind::Directory => ("directory", None, None, None),
            EntryKind::File { sha256, size } => ("file", Some(sha256), Some(*size), None),
            EntryKind::Link { target } => ("link", None, None, Some(target.as_str())),
        };
        // Written into `out` directly: a manifest is thousands of lines,
        // encoded on every change (no string per field).
        let _ = write!(out, "{}\t{kind}\t{:o}\t", self.mount.as_str(), self.mode);
        match sha {
            Some(d) => crate::hex::push(out, &d.0),
            None => out.push('-'),
        }
        out.push('\t');
        match size {
            Some(n) => {
                let _ = write!(out, "{n}");
            }
            None => out.push('-'),
        }
        out.push('\t');
        push_escaped(out, self.path.as_str());
        out.push('\t');
        match target {
            Some(t) => push_escaped(out, t),
            None => out.push('-'),
        }
        out.push('\n');
    }

    fn parse_line(line: &str) -> Result<ManifestEntry, ManifestError> {
        let bad = |why: &str| ManifestError::Malformed(format!("{why}: {line:?}"));
        let mut f = line.split('\t');
        let mut field = || f.next().ok_or_else(|| bad("not 7 tab-separated fields"));
        let [mount, kind, mode, sha, size, path, target] = [
            field()?,
            field()?,
            field()?,
            field()?,
            field()?,
            field()?,
            field()?,
        ];
        if f.next().is_some() {
            return Err(bad("not 7 tab-separated fields"));
        }
        let mount: Mount = mount.parse().map_err(|_| bad("unknown mount"))?;
        let mode = u32::from_str_radix(mode, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| bad("bad mode"))?;
        let path = match path.contains('%') {
            true => RelPath::parse(&unescape_field(path).ok_or_else(|| bad("bad path escape"))?),
            // Nothing escaped: unescaping would only refuse what the
            // path rules refuse too (spaces, control characters).
            false if path.bytes().all(|b| b != b' ' && b != 0x7f && b >= 0x20) => {
                RelPath::parse(path)
            }
            false => return Err(bad("bad path escape")),
        }
        .map_err(|e| bad(&e.to_string()))?;
        let kind = match (kind, sha, size, target) {
            ("directory", "-", "-", "-") => EntryKind::Directory,
            ("file", sha, size, "-") => EntryKind::File {
                sha256: Sha256::from_hex(sha).map_err(|_| bad("bad sha256"))?,
                size: size.parse().map_err(|_| bad("bad size"))?,
            },
            ("link", "-", "-", target) => EntryKind::Link {
                target: unescape_field(target).ok_or_else(|| bad("bad link target"))?,
            },
            _ => return Err(bad("fields do not fit the type")),
        };
        Ok(ManifestEntry {
            mount,
            path,
            mode,
            kind,
        })
    }
}

/// A manifest or delta refused: the run stops before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The bytes do not hash to the generation asked for.
    #[error("manifest does not match generation {expected}: its sha256 is {actual}")]
    Digest {
        /// The generation asked for.
        expected: GenerationId,
        /// What the bytes hash to.
        actual: GenerationId,
    },
    /// A delta names another base than the manifest it is applied to.
    #[error("delta is from generation {delta_base}, not from {held}")]
    WrongBase {
        /// The base the delta names.
        delta_base: GenerationId,
        /// The generation it was applied to.
        held: GenerationId,
    },
    /// Entries out of canonical order or twice.
    #[error("manifest entries out of order or repeated at {0}")]
    Order(String),
    /// A mount without its `"."` directory.
    #[error("manifest has no \".\" directory for the {0} mount")]
    NoRoot(Mount),
    /// Anything else malformed.
    #[error("malformed manifest: {0}")]
    Malformed(String),
}

/// A generation's entries, in canonical order. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// Builds a manifest from entries in any order; refuses a path twice
    /// in one mount, or a mount without its `"."` directory.
    pub fn new(mut entries: Vec<ManifestEntry>) -> Result<Manifest, ManifestError> {
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
        let m = Manifest { entries };
        m.check()?;
        Ok(m)
    }

    fn check(&self) -> Result<(), ManifestError> {
        for w in self.entries.windows(2) {
            if w[0].key() >= w[1].key() {
                return Err(ManifestError::Order(format!(
                    "{} {}",
                    w[1].mount, w[1].path
                )));
            }
        }
        for mount in Mount::ALL {
            let root = self.get(mount, &RelPath::root());
            if !matches!(root.map(|e| &e.kind), Some(EntryKind::Directory)) {
                return Err(ManifestError::NoRoot(mount));
            }
        }
        Ok(())
    }

    /// Every entry, in canonical order.
    pub fn entries(&self) -> &[ManifestEntry] {
        &self.entries
    }

    /// The entries of one mount, in canonical order.
    pub fn mount(&self, mount: Mount) -> impl Iterator<Item = &ManifestEntry> {
        let start = self.entries.partition_point(|e| e.mount < mount);
        self.entries[start..]
            .iter()
            .take_while(move |e| e.mount == mount)
    }

    /// The entry at `path` in `mount`.
    pub fn get(&self, mount: Mount, path: &RelPath) -> Option<&ManifestEntry> {
        self.entries
            .binary_search_by(|e| e.key().cmp(&(mount, path)))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Files (regular) in the manifest, and their bytes in all.
    pub fn totals(&self) -> (u64, u64) {
        self.entries.iter().fold((0, 0), |(n, b), e| match e.kind {
            EntryKind::File { size, .. } => (n + 1, b + size),
            _ => (n, b),
        })
    }

    /// Every distinct file digest, sorted.
    pub fn digests(&self) -> Vec<Sha256> {
        let mut d: Vec<Sha256> = self
            .entries
            .iter()
            .filter_map(|e| match e.kind {
                EntryKind::File { sha256, .. } => Some(sha256),
                _ => None,
            })
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The canonical bytes (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = String::with_capacity(24 + self.entries.len() * 110);
        out.push_str(MANIFEST_MAGIC);
        out.push('\n');
        for e in &self.entries {
            e.write_line(&mut out);
        }
        out.into_bytes()
    }

    /// The canonical bytes and the id they hash to.
    pub fn encode(&self) -> (Vec<u8>, GenerationId) {
        let bytes = self.to_bytes();
        let id = GenerationId::of(&bytes);
        (bytes, id)
    }

    /// Parses canonical bytes that must hash to `expected`: the digest is
    /// checked first, then the lines, their order and the roots.
    pub fn parse(bytes: &[u8], expected: &GenerationId) -> Result<Manifest, ManifestError> {
        let actual = GenerationId::of(bytes);
        if actual != *expected {
            return Err(ManifestError::Digest {
                expected: *expected,
                actual,
            });
        }
        Self::parse_unverified(bytes)
    }

    /// Parses canonical bytes without a digest to compare with (a bundle's
    /// or a cache's copy whose id the caller checks itself).
    pub fn parse_unverified(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| ManifestError::Malformed("not UTF-8".into()))?;
        let body = text
            .strip_prefix(MANIFEST_MAGIC)
            .and_then(|t| t.strip_prefix('\n'))
            .ok_or_else(|| {
                ManifestError::Malformed(format!("does not start with {MANIFEST_MAGIC:?}"))
            })?;
        if !body.is_empty() && !body.ends_with('\n') {
            return Err(ManifestError::Malformed("last line unterminated".into()));
        }
        let entries = body
            .lines()
            .map(ManifestEntry::parse_line)
            .collect::<Result<Vec<_>, _>>()?;
        let m = Manifest { entries };
        m.check()?;
        Ok(m)
    }

    /// The delta that turns `self` (generation `base`) into `new`
    /// (generation `target`).
    pub fn diff(&self, base: GenerationId, new: &Manifest, target: GenerationId) -> ManifestDelta {
        let old: BTreeMap<_, _> = self.entries.iter().map(|e| (e.key(), e)).collect();
        let upserts: Vec<ManifestEntry> = new
            .entries
            .iter()
            .filter(|e| old.get(&e.key()) != Some(e))
            .cloned()
            .collect();
        let removes = self
            .entries
            .iter()
            .filter(|e| new.get(e.mount, &e.path).is_none())
            .map(|e| (e.mount, e.path.clone()))
            .collect();
        ManifestDelta {
            base,
            target,
            upserts,
            removes,
        }
    }
}

/// A generation as the difference from another (docs/protocol.md §7.6):
/// entries added or changed, entries removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestDelta {
    /// The generation it applies to.
    pub base: GenerationId,
    /// The generation it makes.
    pub target: GenerationId,
    /// Entries new or different in `target`, canonical order.
    pub upserts: Vec<ManifestEntry>,
    /// Entries of `base` gone from `target`, canonical order.
    pub removes: Vec<(Mount, RelPath)>,
}

impl ManifestDelta {
    /// The delta's bytes: the magic line, `base <hex>`, `target <hex>`,
    /// then `+<entry line>` and `-<mount>\t<escaped path>` lines.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "{DELTA_MAGIC}\nbase {}\ntarget {}\n",
            self.base, self.target
        );
        for e in &self.upserts {
            out.push('+');
            e.write_line(&mut out);
        }
        for (mount, path) in &self.removes {
            out.push_str(&format!("-{mount}\t{}\n", escape_field(path.as_str())));
        }
        out.into_bytes()
    }

    /// Parses a delta's bytes (not yet checked against any manifest).
    pub fn parse(bytes: &[u8]) -> Result<ManifestDelta, ManifestError> {
        Self::parse_within(bytes, usize::MAX, usize::MAX)
    }

    /// [`ManifestDelta::parse`] for a delta from an untrusted side: at most
    /// `held` removals (each removes an entry of the manifest held, which
    /// has `held` entries) and at most `max_upserts` entries added or
    /// changed, refused at the first line past either, so what is held
    /// while parsing is bounded by the limits, never by the body's line
    /// count (docs/protocol.md §7.6).
    pub fn parse_within(
        bytes: &[u8],
        held: usize,
        max_upserts: usize,
    ) -> Result<ManifestDelta, ManifestError> {
        let bad = |why: String| ManifestError::Malformed(format!("delta: {why}"));
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
        let mut lines = text.lines();
        if lines.next() != Some(DELTA_MAGIC) {
            return Err(bad(format!("does not start with {DELTA_MAGIC:?}")));
        }
        let mut id = |key: &str| -> Result<GenerationId, ManifestError> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(' '))
                .and_then(|h| h.parse().ok())
                .ok_or_else(|| bad(format!("no {key} line")))
        };
        let (base, target) = (id("base")?, id("target")?);
        let (mut upserts, mut removes) = (Vec::new(), Vec::new());
        for line in lines {
            if let Some(e) = line.strip_prefix('+') {
                upserts.push(ManifestEntry::parse_line(e)?);
            } else if let Some(r) = line.strip_prefix('-') {
                let (mount, path) = r.split_once('\t').ok_or_else(|| bad(format!("{line:?}")))?;
                let mount = mount.parse().map_err(|_| bad(format!("{line:?}")))?;
                let path = unescape_field(path)
                    .and_then(|p| RelPath::parse(&p).ok())
                    .ok_or_else(|| bad(format!("{line:?}")))?;
                removes.push((mount, path));
            } else {
                return Err(bad(format!("unexpected line {line:?}")));
            }
            if upserts.len() > max_upserts {
                return Err(bad(format!(
                    "more than {max_upserts} entries added or changed; refused"
                )));
            }
            if removes.len() > held {
                return Err(bad(format!(
                    "more removals than the {held} entries held; refused"
                )));
            }
        }
        Ok(ManifestDelta {
            base,
            target,
            upserts,
            removes,
        })
    }

    /// Applies the delta to `held` (generation `held_id`) and checks that
    /// the result hashes to the delta's target; returns the new manifest
    /// and its canonical bytes.
    pub fn apply(
        &self,
        held: &Manifest,
        held_id: GenerationId,
    ) -> Result<(Manifest, Vec<u8>), ManifestError> {
        if self.base != held_id {
            return Err(ManifestError::WrongBase {
                delta_base: self.base,
                held: held_id,
            });
        }
        // Both sides are in canonical order: one merge, no map. A delta
        // out of order gives a manifest out of order or another digest,
        // refused below either way.
        let mut entries = Vec::with_capacity(held.entries.len() + self.upserts.len());
        let mut ups = self.upserts.iter().peekable();
        let mut rms = self.removes.iter().peekable();
        for e in &held.entries {
            let k = e.key();
            while let Some(u) = ups.next_if(|u| u.key() < k) {
                entries.push(u.clone());
            }
            while rms.next_if(|(m, p)| (*m, p) < k).is_some() {}
            let removed = rms.next_if(|(m, p)| (*m, p) == k).is_some();
            match ups.next_if(|u| u.key() == k) {
                Some(u) => entries.push(u.clone()),
                None if !removed => entries.push(e.clone()),
                None => {}
            }
        }
        entries.extend(ups.cloned());
        let m = Manifest { entries };
        m.check()?;
        let (bytes, actual) = m.encode();
        if actual != self.target {
            return Err(ManifestError::Digest {
                expected: self.target,
                actual,
            });
        }
        Ok((m, bytes))
    }
}

/// The per-node answer (docs/protocol.md §7.6): which generation of its
/// environment this node should have now. JSON; never cached by a shared
/// cache (`Cache-Control: private, no-cache`), revalidated each run with
/// its `ETag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The environment.
    pub environment: String,
    /// The generation the node should have.
    pub generation: GenerationId,
    /// When the master published it (RFC 3339, UTC).
    pub published: String,
    /// Regular files in it.
    pub files: u64,
    /// Their bytes in all.
    pub bytes: u64,
}

/// The URL of the per-node answer for `environment` on `server`.
pub fn assignment_url(server: &str, environment: &str) -> String {
    format!(
        "{}{}?environment={}",
        server.trim_end_matches('/'),
        protocol::ASSIGNMENT_PATH,
        encode_query_value(environment)
    )
}

/// The URL a node posts its report to for `environment`
/// (`protocol::REPORT_PATH`).
pub fn report_url(server: &str, environment: &str) -> String {
    format!(
        "{}{}?environment={}",
        server.trim_end_matches('/'),
        protocol::REPORT_PATH,
        encode_query_value(environment)
    )
}

/// The URL of generation `id`'s manifest in `environment`, as a delta from
/// `since` where the agent holds that one.
pub fn manifest_url(
    server: &str,
    environment: &str,
    id: &GenerationId,
    since: Option<&GenerationId>,
) -> String {
    let mut url = format!(
        "{}{}{id}?environment={}",
        server.trim_end_matches('/'),
        protocol::GENERATIONS_PREFIX,
        encode_query_value(environment)
    );
    if let Some(since) = since {
        url.push_str(&format!("&{}={since}", protocol::SINCE_QUERY_KEY));
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mount: Mount, path: &str, kind: EntryKind) -> ManifestEntry {
        ManifestEntry {
            mount,
            path: RelPath::parse(path).unwrap(),
            mode: if kind == EntryKind::Directory {
                0o755
            } else {
                0o644
            },
            kind,
        }
    }

    fn file(mount: Mount, path: &str, content: &[u8]) -> ManifestEntry {
        let kind = EntryKind::File {
            sha256: Sha256::of(content),
            size: content.len() as u64,
        };
        entry(mount, path, kind)
    }

    fn sample() -> Manifest {
        Manifest::new(vec![
            file(Mount::Pluginfacts, "f.sh", b"echo a=1"),
            entry(Mount::Plugins, ".", EntryKind::Directory),
            entry(Mount::Pluginfacts, ".", EntryKind::Directory),
            entry(Mount::Plugins, "facter", EntryKind::Directory),
            file(Mount::Plugins, "facter/a b%\t.rb", b"x"),
            entry(
                Mount::Plugins,
                "l",
                EntryKind::Link {
                    target: "facter/\nx".into(),
                },
            ),
        ])
        .unwrap()
    }

    #[test]
    fn canonical_bytes_round_trip_and_prove_their_id() {
        let m = sample();
        let (bytes, id) = m.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("pluginsync-manifest 1\nplugins\tdirectory\t755\t-\t-\t.\t-\n"));
        assert!(text.contains("\tfacter/a%20b%25%09.rb\t-\n"), "{text}");
        assert!(text.contains("\tfacter/%0Ax\n"), "{text}");
        assert_eq!(Manifest::parse(&bytes, &id).unwrap(), m);
        let mut flipped = bytes;
        flipped[40] ^= 1;
        assert!(matches!(
            Manifest::parse(&flipped, &id),
            Err(ManifestError::Digest { .. })
        ));
        // The same entries in another order give the same id.
        let mut rev = m.entries().to_vec();
        rev.reverse();
        assert_eq!(Manifest::new(rev).unwrap().encode().1, id);
    }

    #[test]
    fn refuses_repeats_missing_roots_and_bad_lines() {
        let mut e = sample().entries().to_vec();
        e.push(e[1].clone());
        assert!(matches!(Manifest::new(e), Err(ManifestError::Order(_))));
        let e: Vec<_> = sample()
            .entries()
            .iter()
            .filter(|e| !(e.mount == Mount::Pluginfacts && e.path.is_root()))
            .cloned()
            .collect();
        assert_eq!(
            Manifest::new(e),
            Err(ManifestError::NoRoot(Mount::Pluginfacts))
        );
        for bad in [
            "pluginsync-manifest 1\nplugins\tdirectory\t755\t-\t-\t.\n",
            "pluginsync-manifest 1\nplugins\tdirectory\t755\t-\t-\t../x\t-\n",
            "pluginsync-manifest 1\nplugins\tfile\t644\tzz\t1\ta\t-\n",
            "pluginsync-manifest 1\nplugins\tdirectory\t755\t-\t-\t.\t-",
            "pluginsync-manifest 2\n",
        ] {
            assert!(
                Manifest::parse_unverified(bad.as_bytes()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_delta_rebuilds_the_new_manifest_exactly_or_is_refused() {
        let old = sample();
        let (_, old_id) = old.encode();
        let mut e: Vec<_> = old
            .entries()
            .iter()
            .filter(|e| e.path.as_str() != "l")
            .cloned()
            .collect();
        e.push(file(Mount::Plugins, "facter/new.rb", b"new"));
        e[0].mode = 0o700;
        let new = Manifest::new(e).unwrap();
        let (new_bytes, new_id) = new.encode();
        let delta = old.diff(old_id, &new, new_id);
        assert_eq!(delta.removes.len(), 1);
        assert_eq!(delta.upserts.len(), 2);
        let parsed = ManifestDelta::parse(&delta.to_bytes()).unwrap();
        assert_eq!(parsed, delta);
        // An untrusted delta is bounded as it is parsed: no more removals
        // than the entries held, no more upserts than the caller allows.
        let bytes = delta.to_bytes();
        assert_eq!(ManifestDelta::parse_within(&bytes, 1, 2).unwrap(), delta);
        let refused = |held, max| match ManifestDelta::parse_within(&bytes, held, max) {
            Err(ManifestError::Malformed(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(refused(0, 2).contains("more removals than the 0 entries held"));
        assert!(refused(1, 1).contains("more than 1 entries added or changed"));
        let (applied, bytes) = parsed.apply(&old, old_id).unwrap();
        assert_eq!((applied, bytes), (new.clone(), new_bytes));
        // Applied to the wrong base, or tampered with: refused.
        assert!(matches!(
            parsed.apply(&new, new_id),
            Err(ManifestError::WrongBase { .. })
        ));
        let mut tampered = parsed;
        tampered.upserts[0].mode = 0o777;
        assert!(matches!(
            tampered.apply(&old, old_id),
            Err(ManifestError::Digest { .. })
        ));
    }

    /// The merge in `apply` against many shapes of change: entries added
    /// before the first and after the last, removed at both ends, a
    /// directory turned into a file, both mounts; and a delta out of
    /// order is refused, never applied.
    #[test]
    fn a_delta_merges_every_shape_of_change_and_out_of_order_is_refused() {
        let base: Vec<ManifestEntry> = (0..40)
            .map(|i| file(Mount::Plugins, &format!("m{i:02}.rb"), &[i]))
            .chain((0..5).map(|i| file(Mount::Pluginfacts, &format!("f{i}.sh"), &[i])))
            .chain([
                entry(Mount::Plugins, ".", EntryKind::Directory),
                entry(Mount::Pluginfacts, ".", EntryKind::Directory),
                entry(Mount::Plugins, "d", EntryKind::Directory),
            ])
            .collect();
        let old = Manifest::new(base.clone()).unwrap();
        let (_, old_id) = old.encode();
        for variant in 0..6u8 {
            let mut e = base.clone();
            match variant {
                0 => e.retain(|e| e.path.as_str() != "m00.rb" && e.path.as_str() != "m39.rb"),
                1 => e.push(file(Mount::Plugins, "a.rb", b"first")),
                2 => e.push(file(Mount::Plugins, "z.rb", b"last")),
                3 => {
                    e.retain(|e| e.path.as_str() != "d");
                    e.push(file(Mount::Plugins, "d", b"was a directory"));
                }
                4 => e.retain(|e| e.mount == Mount::Plugins || e.path.is_root()),
                _ => {
                    for x in e.iter_mut().filter(|e| e.path.as_str().ends_with('5')) {
                        x.mode = 0o600;
                    }
                    e.push(file(Mount::Pluginfacts, "g.sh", b"new"));
                }
            }
            let new = Manifest::new(e).unwrap();
            let (new_bytes, new_id) = new.encode();
            let delta = old.diff(old_id, &new, new_id);
            let (applied, bytes) = delta.apply(&old, old_id).unwrap();
            assert_eq!((applied, bytes), (new, new_bytes), "variant {variant}");
            if delta.upserts.len() + delta.removes.len() > 1 {
                let mut shuffled = delta.clone();
                shuffled.upserts.reverse();
                shuffled.removes.reverse();
                if shuffled != delta {
                    assert!(shuffled.apply(&old, old_id).is_err(), "variant {variant}");
                }
            }
        }
    }

    #[test]
    fn escapes_are_exact_inverses() {
        for s in ["a b", "%", "x\ty\nz", "ünï", "\u{7f}", "plain/path.rb"] {
            assert_eq!(unescape_field(&escape_field(s)).as_deref(), Some(s));
        }
        for bad in ["%zz", "%4", "a b", "%41"] {
            assert_eq!(unescape_field(bad), None, "{bad}");
        }
    }
}
