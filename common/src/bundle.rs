//! Offline bundles: one generation as a reproducible tar archive
//! (docs/protocol.md §7.7), written by `pluginsync-master bundle` and read
//! by `pluginsync-agent sync --from-bundle`.
//!
//! The archive holds, in this order and nothing else:
//!
//! ```text
//! pluginsync-bundle.json    {"format":1,"environment":…,"generation":…,"published":…}
//! manifest                  the generation's canonical manifest (generation.rs)
//! trust/<file>              format 2 only: each TUF metadata file the header's
//!                           "trust" names, in its order (docs/trust.md#signed-bundles)
//! blobs/<64 hex>            each distinct file content once, by ascending digest
//! pluginsync-bundle.sha256  the sha256 of the header member, in hex
//! ```
//!
//! Every member is a plain ustar file with mode 0644, owner 0:0, mtime 0 and
//! no user or group names, so the same generation always gives the same
//! bytes. Reading checks everything before the caller may use anything: the
//! manifest must hash to the generation the header names, each blob to its
//! name, the blobs must be exactly the manifest's digests, in order, each
//! once; a flipped byte anywhere is refused (tar's own header checksums
//! catch the headers), but in a metadata member's content: TUF metadata
//! proves itself by its signatures, which a node under `[trust]` verifies
//! (docs/trust.md#signed-bundles); a node without `[trust]` ignores it.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::digest::Sha256;
use crate::generation::{GenerationId, Manifest, ManifestError};

/// The bundle format this code writes and reads without signed metadata.
pub const BUNDLE_FORMAT: u32 = 1;
/// The format of a bundle that carries the TUF metadata signing its
/// generation (the header's `trust`); readers of format 1 refuse it.
pub const SIGNED_BUNDLE_FORMAT: u32 = 2;
/// The prefix of every metadata member of a signed bundle.
pub const TRUST_DIR: &str = "trust/";
/// The largest metadata file a reader accepts (as the masters serve).
pub const MAX_TRUST_FILE: u64 = 32 << 20;
/// The first member: the header.
pub const HEADER_NAME: &str = "pluginsync-bundle.json";
/// The second member: the manifest.
pub const MANIFEST_NAME: &str = "manifest";
/// The last member: the header's sha256, so nothing of the header can
/// change unnoticed (the manifest and blobs prove themselves).
pub const SEAL_NAME: &str = "pluginsync-bundle.sha256";
/// The prefix of every blob member.
pub const BLOB_DIR: &str = "blobs/";
/// The largest manifest a reader accepts (64 MiB).
pub const MAX_MANIFEST: u64 = 64 << 20;
/// The largest header a reader accepts.
const MAX_HEADER: u64 = 64 << 10;

/// What the first member says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleHeader {
    /// [`BUNDLE_FORMAT`].
    pub format: u32,
    /// The environment the generation was made for.
    pub environment: String,
    /// The generation.
    pub generation: GenerationId,
    /// When the master published it (RFC 3339, UTC).
    pub published: String,
    /// Format 2: the TUF metadata files carried (`timestamp.json`,
    /// `N.root.json`, `N.snapshot.json`, `N.targets.json`), in the order
    /// of their `trust/<file>` members.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trust: Vec<String>,
}

impl BundleHeader {
    /// The format a header carrying `trust` files has.
    pub fn format_for(trust: &[String]) -> u32 {
        if trust.is_empty() {
            BUNDLE_FORMAT
        } else {
            SIGNED_BUNDLE_FORMAT
        }
    }
}

/// Whether `name` is a TUF metadata file name a bundle may carry:
/// `timestamp.json` or `N.root.json`, `N.snapshot.json`, `N.targets.json`.
pub fn is_metadata_name(name: &str) -> bool {
    if name == "timestamp.json" {
        return true;
    }
    let Some((version, role)) = name.split_once('.') else {
        return false;
    };
    !version.is_empty()
        && version.len() <= 20
        && version.bytes().all(|b| b.is_ascii_digit())
        && matches!(role, "root.json" | "snapshot.json" | "targets.json")
}

/// A bundle refused (reading) or not written (writing).
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Reading or writing the archive failed, or tar found it corrupt.
    #[error("bundle: {0}")]
    Io(#[from] io::Error),
    /// A member out of place, of the wrong kind or size, or unexpected.
    #[error("bundle: {0}")]
    Layout(String),
    /// The header is not what this version reads.
    #[error("bundle header: {0}")]
    Header(String),
    /// The manifest is refused (wrong digest, malformed).
    #[error("bundle {0}")]
    Manifest(#[from] ManifestError),
    /// A blob's content does not hash to its name.
    #[error("bundle blob {name} has sha256 {actual}: corrupt")]
    BlobDigest {
        /// The digest it is named by.
        name: Sha256,
        /// What its bytes hash to.
        actual: Sha256,
    },
    /// Blobs the manifest lists that are not in the archive.
    #[error("bundle lacks {missing} of the manifest's {total} blobs (first: {first})")]
    Missing {
        /// How many.
        missing: usize,
        /// Of how many distinct digests.
        total: usize,
        /// The first one missing.
        first: Sha256,
    },
}

/// The header's format and `trust` agree, name only metadata files, each
/// once, and `count` contents are given for them.
fn check_trust(header: &BundleHeader, count: usize) -> Result<(), BundleError> {
    if header.format != BundleHeader::format_for(&header.trust) {
        return Err(BundleError::Header(format!(
            "format {} with {} metadata files (format {BUNDLE_FORMAT} carries none, {SIGNED_BUNDLE_FORMAT} some)",
            header.format,
            header.trust.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(bad) = (header.trust.iter()).find(|n| !is_metadata_name(n) || !seen.insert(*n)) {
        return Err(BundleError::Header(format!(
            "'{}' is not a TUF metadata file name, or is named twice",
            bad.escape_debug()
        )));
    }
    if count != header.trust.len() {
        return Err(BundleError::Layout(format!(
            "{count} metadata files for the {} named",
            header.trust.len()
        )));
    }
    Ok(())
}

fn member_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// Writes a bundle member by member; see the module docs for the layout.
pub struct BundleWriter<W: Write> {
    tar: tar::Builder<W>,
    digests: Vec<Sha256>,
    next: usize,
    seal: String,
}

impl<W: Write> BundleWriter<W> {
    /// Writes the header and the manifest; `manifest` must hash to
    /// `header.generation`.
    pub fn new(
        out: W,
        header: &BundleHeader,
        manifest: &[u8],
    ) -> Result<BundleWriter<W>, BundleError> {
        BundleWriter::signed(out, header, manifest, &[])
    }

    /// [`BundleWriter::new`], then the metadata files `header.trust`
    /// names, `trust[i]` the content of the i-th (format 2).
    pub fn signed(
        out: W,
        header: &BundleHeader,
        manifest: &[u8],
        trust: &[Vec<u8>],
    ) -> Result<BundleWriter<W>, BundleError> {
        let parsed = Manifest::parse(manifest, &header.generation)?;
        check_trust(header, trust.len())?;
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Deterministic);
        let json = serde_json::to_vec(header).map_err(|e| BundleError::Header(e.to_string()))?;
        let mut h = member_header(json.len() as u64);
        tar.append_data(&mut h, HEADER_NAME, &json[..])?;
        let mut h = member_header(manifest.len() as u64);
        tar.append_data(&mut h, MANIFEST_NAME, manifest)?;
        for (name, content) in header.trust.iter().zip(trust) {
            let mut h = member_header(content.len() as u64);
            tar.append_data(&mut h, format!("{TRUST_DIR}{name}"), &content[..])?;
        }
        Ok(BundleWriter {
            tar,
            digests: parsed.digests(),
            next: 0,
            seal: format!("{}\n", Sha256::of(&json)),
        })
    }

    /// The digests still to add, in the order [`Self::add_blob`] must take
    /// them.
    pub fn remaining(&self) -> &[Sha256] {
        &self.digests[self.next..]
    }

    /// Adds the next blob (`remaining()[0]`): `size` bytes read from
    /// `content`, which must hash to `digest`.
    pub fn add_blob(
        &mut self,
        digest: &Sha256,
        size: u64,
        content: impl Read,
    ) -> Result<(), BundleError> {
        if self.digests.get(self.next) != Some(digest) {
            return Err(BundleError::Layout(format!(
                "blob {digest} added out of order or not in the manifest"
            )));
        }
        let mut hashing = HashingReader::new(content);
        let mut h = member_header(size);
        self.tar
            .append_data(&mut h, format!("{BLOB_DIR}{digest}"), &mut hashing)?;
        let actual = hashing.finish();
        if actual != *digest {
            return Err(BundleError::BlobDigest {
                name: *digest,
                actual,
            });
        }
        self.next += 1;
        Ok(())
    }

    /// Checks every blob was added, writes the seal, ends the archive,
    /// returns the writer.
    pub fn finish(mut self) -> Result<W, BundleError> {
        if let Some(first) = self.remaining().first() {
            return Err(BundleError::Missing {
                missing: self.remaining().len(),
                total: self.digests.len(),
                first: *first,
            });
        }
        let mut h = member_header(self.seal.len() as u64);
        self.tar
            .append_data(&mut h, SEAL_NAME, self.seal.as_bytes())?;
        Ok(self.tar.into_inner()?)
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        use sha2::Digest;
        HashingReader {
            inner,
            hasher: sha2::Sha256::new(),
        }
    }

    fn finish(self) -> Sha256 {
        use sha2::Digest;
        Sha256(self.hasher.finalize().into())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A bundle read and checked whole.
#[derive(Debug)]
pub struct ReadBundle {
    /// Its header.
    pub header: BundleHeader,
    /// The manifest (it hashed to `header.generation`).
    pub manifest: Manifest,
    /// The manifest's canonical bytes.
    pub manifest_bytes: Vec<u8>,
    /// The TUF metadata carried (format 2): each file's name and bytes.
    pub trust: Vec<(String, Vec<u8>)>,
}

/// Reads a bundle, handing each blob, verified, to `blob` (digest and
/// content) in archive order; blobs larger than `max_blob` are refused.
/// Returns only once the whole archive is checked, so a caller that stages
/// the blobs may use them only after `Ok`.
///
/// Beyond every digest, the input must be byte for byte the bundle this
/// module writes for what it holds (the reader writes it again into a hash
/// as it goes), so a flipped byte is refused even where tar would not look:
/// padding, unused header fields, the end blocks.
///
/// An error names what is wrong, never what the input holds: a file that
/// is not a bundle (say a symlink to a secret) is refused by its first
/// block, and tar's and JSON's messages, which quote fields, are not
/// passed on.
pub fn read_bundle<R: Read>(
    mut input: R,
    max_blob: u64,
    blob: impl FnMut(&Sha256, &[u8]) -> io::Result<()>,
) -> Result<ReadBundle, BundleError> {
    let mut first = [0u8; 512];
    input.read_exact(&mut first).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => not_a_bundle(),
        _ => BundleError::Io(e),
    })?;
    if !starts_a_bundle(&first) {
        return Err(not_a_bundle());
    }
    let input = io::Cursor::new(first).chain(input);
    let mut archive = tar::Archive::new(HashingReader::new(input));
    let (read, again) = read_members(&mut archive, max_blob, blob).map_err(|e| match e {
        // An error of tar's own (no OS error behind it) quotes the field
        // it could not parse: say only that the archive is corrupt.
        BundleError::Io(e) if e.raw_os_error().is_none() => {
            BundleError::Layout("a tar header is malformed: corrupt".into())
        }
        e => e,
    })?;
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink())?;
    // Whatever followed the seal is compared below, as part of the bytes.
    let expected = again.finish()?.0;
    if rest.finish() != Sha256(sha2::Digest::finalize(expected).into()) {
        return Err(BundleError::Layout(format!(
            "not byte for byte the bundle of generation {} (a byte outside its members differs)",
            read.header.generation
        )));
    }
    Ok(read)
}

/// The refusal of an input whose first block is not a bundle's.
fn not_a_bundle() -> BundleError {
    BundleError::Layout(format!(
        "not a pluginsync bundle (its first block is not a ustar header of {HEADER_NAME})"
    ))
}

/// Whether `block` is the ustar header of the bundle's first member, as
/// [`BundleWriter`] writes it: the member's name, then the magic.
fn starts_a_bundle(block: &[u8; 512]) -> bool {
    let name = HEADER_NAME.as_bytes();
    block.starts_with(name) && block[name.len()] == 0 && &block[257..263] == b"ustar\0"
}

/// What [`read_bundle`] writes again, to compare.
struct HashWriter(sha2::Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        sha2::Digest::update(&mut self.0, buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn read_members<R: Read>(
    archive: &mut tar::Archive<R>,
    max_blob: u64,
    mut blob: impl FnMut(&Sha256, &[u8]) -> io::Result<()>,
) -> Result<(ReadBundle, BundleWriter<HashWriter>), BundleError> {
    let mut entries = archive.entries()?;
    let mut member = |name: &str, max: u64| -> Result<Vec<u8>, BundleError> {
        let entry = entries
            .next()
            .ok_or_else(|| BundleError::Layout(format!("ends before {name}")))??;
        read_member(entry, Some(name), max).map(|(_, b)| b)
    };
    let header_bytes = member(HEADER_NAME, MAX_HEADER)?;
    let header: BundleHeader = serde_json::from_slice(&header_bytes).map_err(|e| {
        // serde's message may quote a value: only where it failed.
        BundleError::Header(format!(
            "not the header's JSON ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    if header.format != BUNDLE_FORMAT && header.format != SIGNED_BUNDLE_FORMAT {
        return Err(BundleError::Header(format!(
            "format {} (this version reads {BUNDLE_FORMAT} and {SIGNED_BUNDLE_FORMAT})",
            header.format
        )));
    }
    check_trust(&header, header.trust.len())?;
    let manifest_bytes = member(MANIFEST_NAME, MAX_MANIFEST)?;
    let manifest = Manifest::parse(&manifest_bytes, &header.generation)?;
    let mut trust = Vec::with_capacity(header.trust.len());
    for name in &header.trust {
        trust.push(member(&format!("{TRUST_DIR}{name}"), MAX_TRUST_FILE)?);
    }
    let hash = HashWriter(sha2::Digest::new());
    let mut again = BundleWriter::signed(hash, &header, &manifest_bytes, &trust)?;
    for entry in entries {
        let (name, content) = read_member(entry?, None, max_blob)?;
        if name == SEAL_NAME {
            if content != again.seal.as_bytes() {
                return Err(BundleError::Layout(
                    "the header does not match its seal: corrupt".into(),
                ));
            }
            break;
        }
        let name = name
            .strip_prefix(BLOB_DIR)
            .and_then(|h| Sha256::from_hex(h).ok())
            .ok_or_else(|| BundleError::Layout(format!("unexpected member {name:?}")))?;
        if again.remaining().first() != Some(&name) {
            return Err(BundleError::Layout(format!(
                "blob {name} out of order, repeated or not in the manifest"
            )));
        }
        again.add_blob(&name, content.len() as u64, &content[..])?;
        blob(&name, &content)?;
    }
    if let Some(first) = again.remaining().first() {
        return Err(BundleError::Missing {
            missing: again.remaining().len(),
            total: again.digests.len(),
            first: *first,
        });
    }
    let trust = header.trust.iter().cloned().zip(trust).collect();
    let read = ReadBundle {
        header,
        manifest,
        manifest_bytes,
        trust,
    };
    Ok((read, again))
}

fn read_member<R: Read>(
    mut entry: tar::Entry<'_, R>,
    expect: Option<&str>,
    max: u64,
) -> Result<(String, Vec<u8>), BundleError> {
    let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    if expect.is_some_and(|e| e != name) {
        return Err(BundleError::Layout(format!(
            "member {name:?} where {} belongs",
            expect.unwrap_or_default()
        )));
    }
    if entry.header().entry_type() != tar::EntryType::Regular {
        return Err(BundleError::Layout(format!(
            "member {name:?} is not a file"
        )));
    }
    let size = entry.size();
    if size > max {
        return Err(BundleError::Layout(format!(
            "member {name:?} is {size} bytes (at most {max})"
        )));
    }
    let mut content = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut content)?;
    if content.len() as u64 != size {
        return Err(BundleError::Layout(format!("member {name:?} is truncated")));
    }
    Ok((name, content))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::{EntryKind, ManifestEntry};
    use crate::protocol::Mount;
    use crate::relpath::RelPath;

    fn entry(mount: Mount, path: &str, content: Option<&[u8]>) -> ManifestEntry {
        ManifestEntry {
            mount,
            path: RelPath::parse(path).unwrap(),
            mode: 0o644,
            kind: match content {
                None => EntryKind::Directory,
                Some(c) => EntryKind::File {
                    sha256: Sha256::of(c),
                    size: c.len() as u64,
                },
            },
        }
    }

    const CONTENTS: [&[u8]; 3] = [b"one", b"two", b"three"];

    fn bundle() -> (Vec<u8>, GenerationId) {
        signed_bundle(&[])
    }

    /// A bundle carrying `trust` (name, bytes) metadata files.
    fn signed_bundle(trust: &[(&str, &[u8])]) -> (Vec<u8>, GenerationId) {
        let m = Manifest::new(vec![
            entry(Mount::Plugins, ".", None),
            entry(Mount::Pluginfacts, ".", None),
            entry(Mount::Plugins, "a.rb", Some(CONTENTS[0])),
            entry(Mount::Plugins, "b.rb", Some(CONTENTS[1])),
            entry(Mount::Plugins, "same.rb", Some(CONTENTS[1])),
            entry(Mount::Pluginfacts, "c.sh", Some(CONTENTS[2])),
        ])
        .unwrap();
        let (bytes, id) = m.encode();
        let names: Vec<String> = trust.iter().map(|(n, _)| (*n).to_owned()).collect();
        let header = BundleHeader {
            format: BundleHeader::format_for(&names),
            environment: "production".into(),
            generation: id,
            published: "2026-11-26T00:00:00Z".into(),
            trust: names,
        };
        let contents: Vec<Vec<u8>> = trust.iter().map(|(_, c)| c.to_vec()).collect();
        let mut w = BundleWriter::signed(Vec::new(), &header, &bytes, &contents).unwrap();
        while let Some(d) = w.remaining().first().copied() {
            let c = CONTENTS.iter().find(|c| Sha256::of(c) == d).unwrap();
            w.add_blob(&d, c.len() as u64, *c).unwrap();
        }
        (w.finish().unwrap(), id)
    }

    #[test]
    fn same_generation_same_bytes_and_read_back_whole() {
        let (a, id) = bundle();
        let (b, _) = bundle();
        assert_eq!(a, b);
        let mut got = Vec::new();
        let read = read_bundle(&a[..], 1 << 20, |d, c| {
            got.push((*d, c.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(read.header.generation, id);
        assert_eq!(got.len(), 3, "the shared content is in the bundle once");
        assert!(got.iter().all(|(d, c)| Sha256::of(c) == *d));
    }

    #[test]
    fn signed_bundles_carry_their_metadata_and_old_ones_still_read() {
        let (plain, _) = bundle();
        assert!(
            read_bundle(&plain[..], 1 << 20, |_, _| Ok(()))
                .unwrap()
                .trust
                .is_empty()
        );
        let files: [(&str, &[u8]); 2] = [("1.root.json", b"{}"), ("timestamp.json", b"{\"t\":1}")];
        let (a, _) = signed_bundle(&files);
        let read = read_bundle(&a[..], 1 << 20, |_, _| Ok(())).unwrap();
        assert_eq!(read.header.format, SIGNED_BUNDLE_FORMAT);
        let got: Vec<(&str, &[u8])> = (read.trust.iter())
            .map(|(n, c)| (n.as_str(), c.as_slice()))
            .collect();
        assert_eq!(got, files);
        // Their bytes prove themselves by their signatures (docs/trust.md):
        // the bundle's own checks cover the names and the layout.
        for bad in ["../1.root.json", "root.json", "1.keys.json"] {
            let header = BundleHeader {
                trust: vec![bad.to_owned()],
                ..read.header.clone()
            };
            let w = BundleWriter::signed(Vec::new(), &header, &read.manifest_bytes, &[vec![]]);
            assert!(matches!(w, Err(BundleError::Header(_))), "{bad}");
        }
    }

    #[test]
    fn any_flipped_byte_anywhere_is_refused() {
        let (a, _) = bundle();
        for i in 0..a.len() {
            let mut b = a.clone();
            b[i] ^= 0x01;
            let mut handed = 0;
            let r = read_bundle(&b[..], 1 << 20, |_, _| {
                handed += 1;
                Ok(())
            });
            assert!(r.is_err(), "a flip at byte {i} of {} was accepted", a.len());
        }
        let pos = a.windows(5).position(|w| w == b"three").unwrap();
        let mut b = a.clone();
        b[pos] ^= 1;
        let err = read_bundle(&b[..], 1 << 20, |_, _| Ok(())).unwrap_err();
        assert!(matches!(err, BundleError::BlobDigest { .. }), "{err}");
        let err = read_bundle(&a[..a.len() / 2], 1 << 20, |_, _| Ok(())).unwrap_err();
        assert!(!err.to_string().is_empty());
        let mut longer = a;
        longer.extend_from_slice(&[0; 512]);
        assert!(read_bundle(&longer[..], 1 << 20, |_, _| Ok(())).is_err());
    }

    #[test]
    fn writer_refuses_wrong_content_and_missing_blobs() {
        let (a, _) = bundle();
        let read = read_bundle(&a[..], 1 << 20, |_, _| Ok(())).unwrap();
        let mut w = BundleWriter::new(Vec::new(), &read.header, &read.manifest_bytes).unwrap();
        let d = w.remaining()[0];
        assert!(matches!(
            w.add_blob(&d, 3, &b"bad"[..]),
            Err(BundleError::BlobDigest { .. })
        ));
        let w = BundleWriter::new(Vec::new(), &read.header, &read.manifest_bytes).unwrap();
        assert!(matches!(
            w.finish(),
            Err(BundleError::Missing { missing: 3, .. })
        ));
    }
}
