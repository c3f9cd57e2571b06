//! Walking one served root (a module's `lib/` or `facts.d/`) into nodes.
//!
//! The walk is breadth-first with entries sorted by name, and records two
//! views of every entry, one per `links` mode: `follow` (`stat`: a symlink
//! shows as its target, a symlinked directory is descended) and `manage`
//! (`lstat`: a symlink shows as `type: "link"` with its `destination`).
//!
//! What is never served, each skipped with one warning instead of failing
//! the whole listing as Puppet does (docs/protocol.md §3.3): a dangling symlink, a
//! symlink whose target leaves the module root (its `manage` view stays, with
//! a `null` checksum, so nothing outside is ever opened), a symlink loop, a
//! name that is not UTF-8 or holds a backslash, fifos, sockets and devices.
//!
//! What cannot be read (a directory that cannot be listed, an entry that
//! cannot be stat'ed, a file that cannot be opened or that vanished since
//! the walk) is reported ([`ReadError`]), not skipped: the store then keeps
//! the previous index (docs/master.md#unreadable-files).
//!
//! Hashing is a separate pass ([`hash_nodes`]) so `pluginsync-master check`
//! can walk without reading every byte ([`Hashing::Skip`]), and so a rebuild
//! can reuse the digests of files whose stat did not change ([`Digests`]).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pluginsync_common::digest::Sha256;
use pluginsync_common::metadata::FileType;
use pluginsync_common::relpath::RelPath;

pub use pluginsync_common::filesig::FileSig;

/// A path of a served tree the master could not read
/// (docs/master.md#unreadable-files).
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {error}", path.display())]
pub struct ReadError {
    /// The path.
    pub path: PathBuf,
    /// What the system said (part of the message, not a cause printed
    /// again after it).
    pub error: std::io::Error,
}

impl ReadError {
    /// `error` reading `path`.
    pub fn new(path: impl Into<PathBuf>, error: std::io::Error) -> ReadError {
        let path = path.into();
        ReadError { path, error }
    }
}

/// One view (`follow` or `manage`) of an entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct View {
    /// File, directory or link.
    pub kind: FileType,
    /// `st_mode & 07777`.
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
    /// mtime, seconds.
    pub mtime: i64,
    /// ctime, seconds.
    pub ctime: i64,
    /// The link's target, verbatim, for `kind == Link`.
    pub destination: Option<String>,
}

/// One entry of a served root.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Node {
    /// Path relative to the root; `"."` for the root itself.
    pub rel: RelPath,
    /// Index of the parent node; the root is its own parent.
    pub parent: u32,
    /// True below a followed symlinked directory: such entries exist only
    /// under `links=follow`.
    pub via_link: bool,
    /// True if the entry itself is a symlink.
    pub is_link: bool,
    /// The `links=follow` view; `None` if the entry is not served that way.
    pub follow: Option<View>,
    /// The `links=manage` view; `None` if the entry is not served that way.
    pub manage: Option<View>,
    /// The real path to open for content, only where it is not
    /// `<canonical root>/<rel>`: the canonical target of a followed link, or
    /// an entry below a followed directory link. Always inside the module
    /// root. Read it with [`Node::real_path`]. (Not storing the common case
    /// saves a path per entry: ~6 MB for 50,000 files.) Never stored.
    #[serde(skip)]
    real: Option<Box<Path>>,
    /// Stat signature of `real` (files only), for digest reuse.
    pub sig: Option<FileSig>,
    /// SHA-256 of the content of `real`, for files and links to files that
    /// stay inside the root; filled by [`hash_nodes`].
    pub sha256: Option<Sha256>,
}

impl Node {
    /// The view for a `links` mode.
    pub fn view(&self, links: pluginsync_common::metadata::Links) -> Option<&View> {
        match links {
            pluginsync_common::metadata::Links::Follow => self.follow.as_ref(),
            pluginsync_common::metadata::Links::Manage => self.manage.as_ref(),
        }
    }

    /// The real path to open for content, given the canonical root the
    /// node was walked from ([`walk_root`]'s first result).
    pub fn real_path<'a>(&'a self, canon_root: &'a Path) -> Cow<'a, Path> {
        match &self.real {
            Some(p) => Cow::Borrowed(p),
            None if self.rel.is_root() => Cow::Borrowed(canon_root),
            None => Cow::Owned(canon_root.join(self.rel.as_str())),
        }
    }

    /// True if the content of `real` is served (a file, or a link to one).
    pub fn has_content(&self) -> bool {
        self.sig.is_some()
    }
}

fn view_of(md: &Metadata, destination: Option<String>) -> Option<View> {
    let ft = md.file_type();
    let kind = if ft.is_symlink() {
        FileType::Link
    } else if ft.is_dir() {
        FileType::Directory
    } else if ft.is_file() {
        FileType::File
    } else {
        return None;
    };
    Some(View {
        kind,
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        mtime: md.mtime(),
        ctime: md.ctime(),
        destination,
    })
}

/// The content signature of a file's metadata.
pub fn sig_of(md: &Metadata) -> FileSig {
    FileSig::of(md)
}

/// Walks the root at `root` (which must be a directory). `label` names the
/// module in log lines; what cannot be read below the root goes to
/// `errors` (the root itself is the `Err`).
pub fn walk_root(
    root: &Path,
    label: &str,
    errors: &mut Vec<ReadError>,
) -> std::io::Result<(PathBuf, Vec<Node>)> {
    let canon_root = root.canonicalize()?;
    let md = std::fs::metadata(&canon_root)?;
    let mut root_node = Node::new(RelPath::root(), 0, false, false);
    root_node.follow = view_of(&md, None);
    root_node.manage = root_node.follow.clone();
    let mut nodes = vec![root_node];
    let mut queue: VecDeque<u32> = VecDeque::from([0]);
    while let Some(dir_idx) = queue.pop_front() {
        let dir = WalkedDir::of(&nodes, dir_idx, &canon_root);
        let Some(names) = dir.names(errors) else {
            continue;
        };
        for os_name in names {
            let Some(Entry {
                mut node,
                real,
                descend,
            }) = dir.entry(&nodes, &os_name, &canon_root, label, errors)
            else {
                continue;
            };
            if nodes.len() >= MAX_NODES {
                tracing::warn!(
                    module = label,
                    limit = MAX_NODES,
                    "too many entries (symlinked directories?), the rest is not served"
                );
                nodes.shrink_to_fit();
                return Ok((canon_root, nodes));
            }
            if real != canon_root.join(node.rel.as_str()) {
                node.real = Some(real.into_boxed_path());
            }
            nodes.push(node);
            if descend {
                queue.push_back((nodes.len() - 1) as u32);
            }
        }
    }
    // The index keeps these for its lifetime: drop the growth slack.
    nodes.shrink_to_fit();
    Ok((canon_root, nodes))
}

impl Node {
    /// A node with no view, content or real path yet.
    fn new(rel: RelPath, parent: u32, via_link: bool, is_link: bool) -> Node {
        Node {
            rel,
            parent,
            via_link,
            is_link,
            follow: None,
            manage: None,
            real: None,
            sig: None,
            sha256: None,
        }
    }
}

/// The directory whose entries the walk is reading.
struct WalkedDir {
    /// Its node's index.
    idx: u32,
    /// Where it really is (its entries are read there).
    real: PathBuf,
    /// Its path relative to the root.
    rel: RelPath,
    /// Its entries exist only under `links=follow`: it is, or is below, a
    /// followed directory link (the link itself is still a `link` under
    /// manage).
    children_via_link: bool,
}

/// One entry of a directory, as the walk keeps it.
struct Entry {
    /// The node, without its real path.
    node: Node,
    /// Where its content is.
    real: PathBuf,
    /// True for a directory (or a followed link to one) to walk into.
    descend: bool,
}

/// Where a symlink that may be followed leads.
struct Followed {
    /// The target's `follow` view (`None`: a special file, not served).
    view: Option<View>,
    /// The target's canonical path, inside the module root.
    real: PathBuf,
    /// The target's signature, if it is a file.
    sig: Option<FileSig>,
    /// True if the target is a directory to walk into.
    descend: bool,
}

impl WalkedDir {
    fn of(nodes: &[Node], idx: u32, canon_root: &Path) -> WalkedDir {
        let dir = &nodes[idx as usize];
        WalkedDir {
            idx,
            real: dir.real_path(canon_root).into_owned(),
            rel: dir.rel.clone(),
            children_via_link: dir.via_link || dir.is_link,
        }
    }

    /// The names in the directory, sorted; `None` (in `errors`) if it
    /// cannot be read.
    fn names(&self, errors: &mut Vec<ReadError>) -> Option<Vec<std::ffi::OsString>> {
        let read: std::io::Result<Vec<std::ffi::OsString>> = std::fs::read_dir(&self.real)
            .and_then(|rd| rd.map(|e| e.map(|e| e.file_name())).collect());
        match read {
            Ok(mut names) => {
                names.sort();
                Some(names)
            }
            Err(e) => {
                errors.push(ReadError::new(&self.real, e));
                None
            }
        }
    }

    /// The entry `os_name` of this directory, or `None` (with a warning,
    /// or in `errors` if it cannot be read) when it is not served at all.
    fn entry(
        &self,
        nodes: &[Node],
        os_name: &std::ffi::OsStr,
        canon_root: &Path,
        label: &str,
        errors: &mut Vec<ReadError>,
    ) -> Option<Entry> {
        let path = self.real.join(os_name);
        let Some(name) = os_name.to_str() else {
            tracing::warn!(module = label, path = %path.display(), "file name is not UTF-8, not served");
            return None;
        };
        let rel = match self.rel.join(name) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(module = label, path = %path.display(), error = %e, "file name cannot be served");
                return None;
            }
        };
        let lmd = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                // Listed, then gone or unreadable: not a smaller tree.
                errors.push(ReadError::new(path, e));
                return None;
            }
        };
        let is_link = lmd.file_type().is_symlink();
        let mut node = Node::new(rel, self.idx, self.children_via_link, is_link);
        let mut real = path.clone();
        let mut descend = false;
        if is_link {
            let destination = std::fs::read_link(&path)
                .ok()
                .map(|d| d.to_string_lossy().into_owned());
            node.manage = view_of(&lmd, destination);
            if let Some(followed) = self.follow(nodes, &path, canon_root, label, errors) {
                node.follow = followed.view;
                node.sig = followed.sig;
                real = followed.real;
                descend = followed.descend;
            }
        } else {
            node.follow = view_of(&lmd, None);
            if node.follow.is_none() {
                tracing::warn!(module = label, path = %path.display(), "fifo, socket or device, not served");
                return None;
            }
            node.manage = node.follow.clone();
            if lmd.is_file() {
                node.sig = Some(sig_of(&lmd));
            }
            descend = lmd.is_dir();
        }
        if node.via_link {
            node.manage = None;
        }
        Some(Entry {
            node,
            real,
            descend,
        })
    }

    /// Where the symlink at `path` (an entry of this directory) leads, if
    /// it may be followed: not dangling, inside the module root, not a
    /// loop back to this directory or one above it; `None` with a warning
    /// otherwise (it is then served only under `links=manage`), or in
    /// `errors` when its target cannot be read.
    fn follow(
        &self,
        nodes: &[Node],
        path: &Path,
        canon_root: &Path,
        label: &str,
        errors: &mut Vec<ReadError>,
    ) -> Option<Followed> {
        let target = match path.canonicalize() {
            Err(e) if !dangling(&e) => {
                errors.push(ReadError::new(path, e));
                return None;
            }
            Err(_) => {
                tracing::warn!(module = label, path = %path.display(), "dangling symlink, served only under links=manage");
                return None;
            }
            Ok(target) if !target.starts_with(canon_root) => {
                tracing::warn!(module = label, path = %path.display(), target = %target.display(), "symlink leaves the module root, never followed");
                return None;
            }
            Ok(target) => target,
        };
        match std::fs::metadata(&target) {
            Ok(tmd)
                if tmd.is_dir()
                    && (self.real.starts_with(&target)
                        || on_chain(nodes, self.idx, &target, canon_root)) =>
            {
                tracing::warn!(module = label, path = %path.display(), "symlink loop, not followed");
                None
            }
            Ok(tmd) => {
                let view = view_of(&tmd, None);
                if view.is_none() {
                    tracing::warn!(module = label, path = %path.display(), "symlink to a special file, not served");
                }
                Some(Followed {
                    view,
                    real: target,
                    sig: tmd.is_file().then(|| sig_of(&tmd)),
                    descend: tmd.is_dir(),
                })
            }
            Err(e) => {
                errors.push(ReadError::new(target, e));
                None
            }
        }
    }
}

/// True if `e`, resolving a symlink, says it leads nowhere (a missing
/// target, a loop of links): a dangling link, served only under
/// `links=manage`; anything else is a read error.
fn dangling(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
        || e.kind() == std::io::ErrorKind::NotADirectory
        || e.raw_os_error() == Some(libc::ELOOP)
}

/// Entries walked per root at most: a guard against symlinked directories
/// multiplying a tree.
pub const MAX_NODES: usize = 2_000_000;

/// True if `target` is the real directory of `idx` or of one of its
/// ancestors: following it would walk the same directory again, forever.
fn on_chain(nodes: &[Node], mut idx: u32, target: &Path, canon_root: &Path) -> bool {
    loop {
        let n = &nodes[idx as usize];
        if n.real_path(canon_root) == target {
            return true;
        }
        if idx == 0 {
            return false;
        }
        idx = n.parent;
    }
}

/// The digests of a previous build, for reuse: real path → (signature,
/// sha256). A file whose signature is unchanged is not read again.
pub type Digests = HashMap<PathBuf, (FileSig, Sha256)>;

/// The digests of an index dropped for being idle
/// (docs/master.md#many-environments): signature → sha256, with no path (72
/// bytes a file, not
/// a path each). A signature holds the device and inode, so a hit is the
/// very file that was hashed, unchanged, wherever it is walked from now.
pub type KeptDigests = HashMap<FileSig, Sha256>;

/// The digests of `nodes`, to keep when their index is dropped.
pub fn kept_digests<'a>(nodes: impl Iterator<Item = &'a Node>) -> KeptDigests {
    let mut kept: KeptDigests = nodes.filter_map(|n| Some((n.sig?, n.sha256?))).collect();
    kept.shrink_to_fit();
    kept
}

/// Whether a build reads file contents after walking.
#[derive(Debug, Clone, Copy)]
pub enum Hashing<'a> {
    /// Walk only, read no content: no node gets a `sha256`
    /// (`pluginsync-master check`, which reports what would be served).
    Skip,
    /// Hash every file with content ([`hash_nodes`]), reusing unchanged
    /// digests; each file actually read bumps `files_hashed`.
    Hash {
        /// Counts the files read (digest reuse does not count).
        files_hashed: &'a AtomicU64,
        /// Digests kept from an index dropped for being idle, reused like
        /// those of the previous index.
        kept: Option<&'a KeptDigests>,
    },
}

/// Fills `sha256` for every node with content, reusing digests from
/// `previous` (by path) or `kept` (by signature) when the signature is
/// unchanged. Each file actually read
/// bumps `hashed`. A file is read only through [`open_regular`] (no
/// symlink anywhere in its real path, never a fifo or device), and its
/// signature becomes that of the descriptor actually read, so the digest
/// and the identity `open_indexed` checks later describe the same inode.
/// A file that cannot be read that way (unreadable, vanished since the
/// walk, or no longer a regular file) is dropped from both views and
/// reported in `errors`.
pub fn hash_nodes(
    nodes: &mut [Node],
    canon_root: &Path,
    previous: &Digests,
    kept: Option<&KeptDigests>,
    hashed: &AtomicU64,
    errors: &mut Vec<ReadError>,
) {
    for node in nodes.iter_mut() {
        let Some(sig) = node.sig else { continue };
        let real = node.real_path(canon_root).into_owned();
        if let Some((old_sig, digest)) = previous.get(&real)
            && *old_sig == sig
        {
            node.sha256 = Some(*digest);
            continue;
        }
        if let Some(digest) = kept.and_then(|k| k.get(&sig)) {
            node.sha256 = Some(*digest);
            continue;
        }
        match hash_file(&real) {
            Ok((digest, read_sig)) => {
                hashed.fetch_add(1, Ordering::Relaxed);
                node.sha256 = Some(digest);
                node.sig = Some(read_sig);
            }
            Err(e) => {
                errors.push(ReadError::new(real, e));
                node.follow = None;
                node.manage = None;
                node.sig = None;
            }
        }
    }
}

/// True while `openat2(2)` is usable; cleared for good the first time the
/// kernel (or a seccomp filter) refuses the syscall itself.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// Opens a path the index recorded, for reading, the one way the master
/// ever reads a served file (index build, other checksum types, content,
/// blobs): docs/protocol.md §1.4, docs/internals.md#handlers.
///
/// - No symlink is followed, in any component: a recorded real path is
///   canonical (a followed link inside the module root is stored as its
///   target, [`Node::real_path`]), so a symlink met now was swapped in
///   since the walk. `openat2(RESOLVE_NO_SYMLINKS)` refuses it in one
///   syscall; where the kernel lacks `openat2`, `O_NOFOLLOW` still refuses
///   a final symlink (and serving checks the inode, [`open_indexed`]).
/// - `O_NONBLOCK | O_NOCTTY`: opening a fifo or a terminal never blocks or
///   adopts it.
/// - The opened descriptor is `fstat`ed and anything but a regular file is
///   refused (error kind `Other`), before a byte is read.
///
/// Returns the file and the metadata of the descriptor.
pub fn open_regular(path: &Path) -> std::io::Result<(std::fs::File, Metadata)> {
    let file = open_no_follow(path)?;
    let md = file.metadata()?;
    if !md.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((file, md))
}

fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    if OPENAT2.load(Ordering::Relaxed) {
        match rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            flags,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => return Ok(std::fs::File::from(fd)),
            Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                OPENAT2.store(false, Ordering::Relaxed);
            }
            Err(e) => return Err(e.into()),
        }
    }
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Opens an indexed file for serving or for a checksum: through
/// [`open_regular`], and only if it is still the inode with the stat the
/// index recorded (so its bytes match the advertised checksum); anything
/// else is an error (kind `Other` when it is another file now).
pub fn open_indexed(path: &Path, sig: FileSig) -> std::io::Result<(std::fs::File, Metadata)> {
    let (file, md) = open_regular(path)?;
    if sig_of(&md) != sig {
        return Err(std::io::Error::other("changed since it was indexed"));
    }
    Ok((file, md))
}

/// SHA-256 of a regular file opened with [`open_regular`], streamed, and
/// the signature of the descriptor that was read.
pub fn hash_file(path: &Path) -> std::io::Result<(Sha256, FileSig)> {
    let (file, md) = open_regular(path)?;
    Ok((
        pluginsync_common::checksum::sha256_reader(file)?,
        sig_of(&md),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pluginsync_common::metadata::Links;

    #[test]
    fn mutually_linked_directories_terminate() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("lib");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::fs::write(root.join("a/x.rb"), "x").unwrap();
        std::os::unix::fs::symlink("../b", root.join("a/to_b")).unwrap();
        std::os::unix::fs::symlink("../a", root.join("b/to_a")).unwrap();
        std::os::unix::fs::symlink("..", root.join("a/up")).unwrap();
        let (_, nodes) = walk_root(&root, "m", &mut Vec::new()).unwrap();
        let rels: Vec<&str> = nodes.iter().map(|n| n.rel.as_str()).collect();
        assert!(rels.len() < 20, "{rels:?}");
        // Followed once: a/to_b/to_a would be `a` again, so it is not followed.
        assert!(rels.contains(&"a/to_b"));
        let again = nodes
            .iter()
            .find(|n| n.rel.as_str() == "a/to_b/to_a")
            .unwrap();
        assert!(again.follow.is_none());
        assert!(
            nodes
                .iter()
                .find(|n| n.rel.as_str() == "a/up")
                .unwrap()
                .view(Links::Follow)
                .is_none()
        );
        // Under manage, links are links and nothing below them exists.
        assert!(
            nodes
                .iter()
                .filter(|n| n.via_link)
                .all(|n| n.manage.is_none())
        );
    }

    #[test]
    fn real_paths_are_stored_only_for_links_and_below_them() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("lib");
        std::fs::create_dir_all(root.join("impl")).unwrap();
        std::fs::write(root.join("impl/x.rb"), "x").unwrap();
        std::os::unix::fs::symlink("impl", root.join("alias")).unwrap();
        std::os::unix::fs::symlink("impl/x.rb", root.join("x_link.rb")).unwrap();
        let (canon, nodes) = walk_root(&root, "m", &mut Vec::new()).unwrap();
        let get = |rel: &str| nodes.iter().find(|n| n.rel.as_str() == rel).unwrap();
        assert_eq!(get(".").real_path(&canon), canon.as_path());
        assert!(
            get("impl/x.rb").real.is_none(),
            "the common case stores nothing"
        );
        assert_eq!(get("impl/x.rb").real_path(&canon), canon.join("impl/x.rb"));
        assert_eq!(get("x_link.rb").real_path(&canon), canon.join("impl/x.rb"));
        assert_eq!(get("alias").real_path(&canon), canon.join("impl"));
        assert_eq!(get("alias/x.rb").real_path(&canon), canon.join("impl/x.rb"));
    }

    /// A root with `a.rb` and `b.rb`, walked and hashed once: (the root,
    /// its canonical path, the nodes, the files-hashed counter).
    fn two_files_hashed() -> (tempfile::TempDir, PathBuf, Vec<Node>, AtomicU64) {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("a.rb"), "a").unwrap();
        std::fs::write(t.path().join("b.rb"), "b").unwrap();
        let counter = AtomicU64::new(0);
        let (canon, mut first) = walk_root(t.path(), "m", &mut Vec::new()).unwrap();
        hash_nodes(
            &mut first,
            &canon,
            &HashMap::new(),
            None,
            &counter,
            &mut Vec::new(),
        );
        (t, canon, first, counter)
    }

    #[test]
    fn unchanged_files_are_not_hashed_again() {
        let (t, canon, first, counter) = two_files_hashed();
        assert_eq!(counter.load(Ordering::Relaxed), 2);
        let previous: HashMap<_, _> = first
            .iter()
            .filter_map(|n| Some((n.real_path(&canon).into_owned(), (n.sig?, n.sha256?))))
            .collect();
        std::fs::write(t.path().join("b.rb"), "bb").unwrap();
        let (_, mut second) = walk_root(t.path(), "m", &mut Vec::new()).unwrap();
        hash_nodes(
            &mut second,
            &canon,
            &previous,
            None,
            &counter,
            &mut Vec::new(),
        );
        assert_eq!(
            counter.load(Ordering::Relaxed),
            3,
            "only b.rb was read again"
        );
    }

    #[test]
    fn kept_digests_are_reused_by_signature_and_only_for_the_same_file() {
        let (t, canon, first, counter) = two_files_hashed();
        let kept = kept_digests(first.iter());
        assert_eq!(kept.len(), 2);
        drop(first);
        // A copy elsewhere has the same bytes but another inode: read.
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(t.path().join("a.rb"), copy.path().join("a.rb")).unwrap();
        let with_kept = |nodes: &mut Vec<Node>, canon: &Path| {
            hash_nodes(
                nodes,
                canon,
                &HashMap::new(),
                Some(&kept),
                &counter,
                &mut Vec::new(),
            )
        };
        let (ccanon, mut other) = walk_root(copy.path(), "m", &mut Vec::new()).unwrap();
        with_kept(&mut other, &ccanon);
        assert_eq!(counter.load(Ordering::Relaxed), 3, "another inode is read");
        // The dropped index's own tree, one file rewritten: only it is read.
        std::fs::write(t.path().join("b.rb"), "bb").unwrap();
        let (_, mut again) = walk_root(t.path(), "m", &mut Vec::new()).unwrap();
        with_kept(&mut again, &canon);
        assert_eq!(counter.load(Ordering::Relaxed), 4, "only b.rb was read");
        let b = again.iter().find(|n| n.rel.as_str() == "b.rb").unwrap();
        assert_eq!(b.sha256, Some(Sha256::of(b"bb")));
    }

    /// Walks a root with `a.rb`, then lets `swap` replace it before hashing
    /// (on a thread, bounded: a blocked read is a failure, not a hang);
    /// returns the node of `a.rb` and the paths reported unreadable.
    fn hash_after_swap(swap: impl FnOnce(&Path) + Send + 'static) -> (Node, Vec<PathBuf>) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("lib");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.rb"), "alpha\n").unwrap();
        std::fs::write(t.path().join("secret"), "secret\n").unwrap();
        let (canon, mut nodes) = walk_root(&root, "m", &mut Vec::new()).unwrap();
        swap(&canon.join("a.rb"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            let counter = AtomicU64::new(0);
            hash_nodes(
                &mut nodes,
                &canon,
                &HashMap::new(),
                None,
                &counter,
                &mut errors,
            );
            let _ = tx.send((nodes, errors));
            drop(t);
        });
        let (nodes, errors) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("hashing returned (not blocked on a fifo)");
        let node = nodes.into_iter().find(|n| n.rel.as_str() == "a.rb");
        (node.unwrap(), errors.into_iter().map(|e| e.path).collect())
    }

    #[test]
    fn a_file_gone_between_the_walk_and_the_hash_is_an_error_not_a_smaller_tree() {
        let (node, errors) = hash_after_swap(|p| std::fs::remove_file(p).unwrap());
        assert!(node.sig.is_none(), "not served");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].ends_with("lib/a.rb"), "{errors:?}");
    }

    #[test]
    fn an_unlisted_directory_or_an_unstatable_entry_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("lib");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.rb"), "a\n").unwrap();
        // A dangling link is policy (served under manage only), not an error.
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("dangling")).unwrap();
        let mut errors = Vec::new();
        walk_root(&root, "m", &mut errors).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        // A directory that cannot be listed: replaced by a file between
        // the listing of its parent and its own (as the walk meets it).
        let canon = root.canonicalize().unwrap();
        let dir = WalkedDir {
            idx: 0,
            real: canon.join("sub/a.rb"),
            rel: RelPath::root(),
            children_via_link: false,
        };
        assert!(dir.names(&mut errors).is_none());
        let gone = WalkedDir::of(&[Node::new(RelPath::root(), 0, false, false)], 0, &canon);
        let entry = gone.entry(
            &[],
            std::ffi::OsStr::new("vanished"),
            &canon,
            "m",
            &mut errors,
        );
        assert!(entry.is_none());
        let paths: Vec<_> = errors.iter().map(|e| e.path.clone()).collect();
        assert_eq!(paths, [canon.join("sub/a.rb"), canon.join("vanished")]);
    }

    #[test]
    fn hashing_never_follows_a_symlink_swapped_in_after_the_walk() {
        let (node, errors) = hash_after_swap(|p| {
            std::fs::remove_file(p).unwrap();
            std::os::unix::fs::symlink(p.parent().unwrap().join("../secret"), p).unwrap();
        });
        assert_eq!(node.sha256, None, "the secret's digest must not be indexed");
        assert_eq!(errors.len(), 1, "reported, not skipped: {errors:?}");
        assert!(node.follow.is_none() && node.sig.is_none(), "not served");
    }

    #[test]
    fn hashing_never_blocks_on_a_fifo_swapped_in_after_the_walk() {
        let (node, _) = hash_after_swap(|p| {
            std::fs::remove_file(p).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                p,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
        });
        assert_eq!(node.sha256, None);
        assert!(node.follow.is_none() && node.sig.is_none(), "not served");
    }

    #[test]
    fn hashing_adopts_the_signature_of_the_file_it_read() {
        let (node, _) = hash_after_swap(|p| {
            let tmp = p.with_extension("new");
            std::fs::write(&tmp, "replaced, longer\n").unwrap();
            std::fs::rename(&tmp, p).unwrap();
        });
        assert_eq!(node.sha256, Some(Sha256::of(b"replaced, longer\n")));
        assert_eq!(
            node.sig.map(|s| s.size),
            Some(17),
            "digest and signature agree"
        );
    }

    #[test]
    fn open_regular_refuses_directories_and_any_symlink_in_the_path() {
        let t = tempfile::tempdir().unwrap();
        let canon = t.path().canonicalize().unwrap();
        std::fs::create_dir(canon.join("real")).unwrap();
        std::fs::write(canon.join("real/f"), "f").unwrap();
        std::os::unix::fs::symlink("real", canon.join("alias")).unwrap();
        assert!(open_regular(&canon.join("real/f")).is_ok());
        assert!(open_regular(&canon.join("real")).is_err(), "a directory");
        // Only where the kernel has openat2 (elsewhere the identity check
        // of open_indexed is what refuses another file).
        assert!(
            open_regular(&canon.join("alias/f")).is_err() || !OPENAT2.load(Ordering::Relaxed),
            "a symlinked parent"
        );
    }
}
