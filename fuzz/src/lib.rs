//! The bodies of pluginsync's fuzz targets, written once: the cargo-fuzz
//! targets in `fuzz/libfuzzer/` call them with libFuzzer's inputs, and the
//! replay test (`fuzz/tests/replay.rs`, run by `cargo test --workspace`)
//! calls them with every committed input (`fuzz/seeds/<target>/`,
//! `fuzz/corpus/<target>/`, `fuzz/artifacts/<target>/`).
//! See `fuzz/README.md` for how to run the fuzzer.
//!
//! Each body asserts properties of the code it drives, not only that it
//! does not panic; a failed assertion is a crash to libFuzzer and a failed
//! test to the replay. The inputs are the bytes a peer or an operator
//! controls: a listing body (docs/protocol.md §2), the path and query of a
//! request (§1.5, §1.2), a batch answer (§7.2), a config file, a relative
//! path, ignore globs (§3.2).

pub mod fnmatch;
pub mod frames;

use std::collections::BTreeMap;
use std::path::{Component, Path};

use pluginsync_agent::client::Client;
use pluginsync_agent::config::AgentConfig;
use pluginsync_agent::listing::{self, MODE_MASK, RemoteKind, STAGING_DIR};
use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::{FileType, Links};
use pluginsync_common::protocol::{
    FrameDecoder, FrameEvent, ListingQuery, MAX_FRAME_HEADER, Mount,
};
use pluginsync_common::relpath::RelPath;
use pluginsync_common::urlpath::{decode_path, encode_path};
use pluginsync_master::config::MasterConfig;
use pluginsync_master::request::{self, PathError, Query};

/// A fuzz target: its name (the directory of its corpus) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("relpath", relpath),
    ("ignore", ignore),
    ("request_path", request_path),
    ("query", query),
    ("frames", frames),
    ("listing", listing),
    ("agent_config", agent_config),
    ("master_config", master_config),
    ("environment_conf", environment_conf),
    ("puppet_conf", puppet_conf),
];

/// `RelPath::parse` (common/src/relpath.rs) accepts exactly the paths its
/// module docs describe, and what it accepts round-trips through its
/// display and stays under any root it is joined to.
pub fn relpath(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let expected = s == "."
        || (!s.is_empty()
            && !s.contains('\0')
            && !s.contains('\\')
            && s.split('/').all(|seg| !matches!(seg, "" | "." | "..")));
    let Ok(p) = RelPath::parse(s) else {
        assert!(!expected, "{s:?} refused but is a valid relative path");
        return;
    };
    assert!(expected, "{s:?} accepted but is not a valid relative path");
    let shown = p.to_string();
    assert_eq!(shown, s);
    assert_eq!(
        RelPath::parse(&shown).as_ref(),
        Ok(&p),
        "display round trip"
    );
    let root = Path::new("/fuzz-root");
    let joined = p.to_path(root);
    let below = joined
        .strip_prefix(root)
        .expect("joined path leaves the root");
    assert!(
        below
            .components()
            .all(|c| matches!(c, Component::Normal(_))),
        "{s:?} joins to {joined:?}"
    );
    assert_eq!(below.components().count(), p.depth());
    // Rebuilding from the segments gives the same path; each parent is a
    // prefix of it; the chain of parents ends at the root.
    let mut rebuilt = RelPath::root();
    for seg in p.segments() {
        assert!(!matches!(seg, "" | "." | ".."), "segment {seg:?} of {s:?}");
        rebuilt = rebuilt.join(seg).expect("a segment joins");
    }
    assert_eq!(rebuilt, p);
    let mut up = Some(p.clone());
    let mut steps = 0;
    while let Some(q) = up {
        assert!(p.starts_with(&q), "{p:?} not below its ancestor {q:?}");
        up = q.parent();
        steps += 1;
    }
    assert_eq!(steps, p.depth() + 1);
    assert_eq!(p.file_name().is_none(), p.is_root());
}

/// `IgnoreSet` (common/src/ignore.rs) matches exactly as Ruby's flagless
/// `File.fnmatch?` does ([`fnmatch::fnmatch`]), pattern by pattern and as a
/// set. Input: patterns separated by tabs on the first line, one basename
/// per following line.
pub fn ignore(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let patterns: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split('\t')
        .filter(|p| !p.contains('\0'))
        .collect();
    // Basenames: what a directory entry can be called.
    let mut names: Vec<&str> = lines
        .filter(|n| !n.is_empty() && *n != "." && *n != ".." && !n.contains(['/', '\0']))
        .collect();
    names.extend([".git", "a", ".", "x.rb"].iter().filter(|n| **n != "."));
    let mut compiled = Vec::new();
    for p in &patterns {
        match IgnoreSet::new(&[p]) {
            Ok(set) => {
                for n in &names {
                    assert_eq!(
                        set.is_ignored(n),
                        fnmatch::fnmatch(p, n),
                        "pattern {p:?} on name {n:?}: IgnoreSet differs from File.fnmatch?"
                    );
                }
                compiled.push(*p);
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'), "{e}");
            }
        }
    }
    if let Ok(set) = IgnoreSet::new(&compiled) {
        for n in &names {
            let any = compiled.iter().any(|p| fnmatch::fnmatch(p, n));
            assert_eq!(set.is_ignored(n), any, "set {compiled:?} on name {n:?}");
        }
    } else {
        panic!("patterns that compile alone do not compile together: {compiled:?}");
    }
}

/// `mount_path` (master/src/request.rs) decodes what follows
/// `/puppet/v3/<endpoint>/` into a mount and a valid `RelPath`, refuses
/// every `.`/`..` segment however it is encoded, and decodes what the
/// agent encodes (common/src/urlpath.rs) back to the same path.
pub fn request_path(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = decode_path(raw);
    match request::mount_path(raw) {
        Ok(mp) => {
            let decoded = decoded.expect("an accepted path decodes");
            assert_eq!(RelPath::parse(mp.path.as_str()).as_ref(), Ok(&mp.path));
            let segments: Vec<&str> = decoded.split('/').filter(|s| !s.is_empty()).collect();
            assert_eq!(segments.first().copied(), Some(mp.mount.as_str()));
            assert!(!segments.iter().any(|s| *s == "." || *s == ".."));
            let rest = segments[1..].join("/");
            assert_eq!(mp.path.as_str(), if rest.is_empty() { "." } else { &rest });
        }
        Err(PathError::Invalid(msg)) => {
            assert!(!msg.is_empty());
            // Something was wrong with the decoded path.
            if let Ok(d) = &decoded {
                assert!(
                    d.contains(['\0', '\\']) || d.split('/').any(|s| s == "." || s == "..") || {
                        let segs: Vec<&str> = d.split('/').filter(|s| !s.is_empty()).collect();
                        segs.len() > 1 && RelPath::parse(&segs[1..].join("/")).is_err()
                    },
                    "{raw:?} ({d:?}) refused as invalid: {msg}"
                );
            }
        }
        Err(PathError::UnknownMount(m)) => {
            assert!(m.parse::<Mount>().is_err(), "{m:?} is a mount");
        }
    }
    // The agent's encoding of any valid path is decoded back to it.
    if let Ok(rel) = RelPath::parse(raw)
        && !rel.is_root()
    {
        for mount in Mount::ALL {
            let url_path = format!("{mount}/{}", encode_path(rel.as_str()));
            let mp = request::mount_path(&url_path)
                .unwrap_or_else(|e| panic!("{url_path:?} (from {raw:?}) refused: {e:?}"));
            assert_eq!((mp.mount, &mp.path), (mount, &rel), "{url_path:?}");
        }
    }
}

/// The master's query parsing (master/src/request.rs) of a raw query
/// string never fails or panics, its search parameters are consistent with
/// the pairs; and the query the agent builds (`ListingQuery` in
/// common/src/protocol.rs) from any environment, `source_permissions` and
/// ignore list is read back by the master as exactly those values. Input:
/// the raw query; its lines are also the environment, the
/// `source_permissions` and the ignore patterns.
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let q = Query::parse(Some(text));
    if let Ok((params, _max_files)) = request::search_params(&q) {
        assert_eq!(params.ignore, q.all("ignore"));
        if params.recurselimit.is_some() {
            assert!(q.get("recurse").is_some() || q.get("recurselimit").is_some());
        }
    } else {
        let e = request::search_params(&q).expect_err("deterministic");
        assert!(!e.text.is_empty());
    }
    let mut lines = text.split('\n');
    let environment = lines.next().unwrap_or_default();
    let source_permissions = lines.next().unwrap_or_default();
    let ignore: Vec<String> = lines.map(str::to_owned).collect();
    let built = ListingQuery {
        environment,
        source_permissions,
        ignore: &ignore,
    }
    .to_query();
    let back = Query::parse(Some(&built));
    assert_eq!(back.get("environment"), Some(environment), "{built}");
    assert_eq!(back.get("source_permissions"), Some(source_permissions));
    assert_eq!(back.all("ignore"), ignore, "{built}");
    let parsed = request::search_params(&back);
    let use_permissions = match source_permissions {
        "use" | "use_when_creating" => true,
        "ignore" => false,
        _ => {
            assert!(parsed.is_err(), "source_permissions {source_permissions:?}");
            return;
        }
    };
    let (params, max_files) = parsed.expect("a stock agent's query");
    assert!(params.recurse && params.recurselimit.is_none() && max_files.is_none());
    assert_eq!(params.links, Links::Follow);
    assert_eq!(params.checksum_type, ChecksumType::Sha256);
    assert_eq!(params.use_permissions, use_permissions);
    assert_eq!(params.ignore, ignore);
}

/// `FrameDecoder` (common/src/protocol.rs) says what [`frames::parse`]
/// says of the whole stream, whatever the chunking, and never holds back
/// more than [`MAX_FRAME_HEADER`] unconsumed bytes. Input: a byte choosing
/// the chunk sizes, then the stream.
pub fn frames(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let want = frames::parse(stream);
    let whole = decode_in_chunks(stream, &want.header_lens, |_| stream.len().max(1));
    assert_eq!(whole, (want.frames.clone(), want.end.clone()), "one chunk");
    let mut state = u32::from(seed) | 1;
    let chunked = decode_in_chunks(stream, &want.header_lens, |_| {
        // xorshift: sizes from 1 to 2 headers' worth, all over the place.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state as usize % (2 * MAX_FRAME_HEADER)) + 1
    });
    assert_eq!(chunked, (want.frames, want.end), "chunk seed {seed}");
}

/// Feeds `stream` in chunks of `size(i)` bytes, collecting frames and
/// checking after each drain that no more than a header's worth of fed
/// bytes is unconsumed (none while inside a blob).
fn decode_in_chunks(
    stream: &[u8],
    header_lens: &[usize],
    mut size: impl FnMut(usize) -> usize,
) -> (
    Vec<frames::Frame>,
    Result<(), pluginsync_common::protocol::FrameError>,
) {
    let mut d = FrameDecoder::new();
    let mut out: Vec<frames::Frame> = Vec::new();
    let (mut fed, mut consumed, mut headers, mut inside) = (0usize, 0usize, 0usize, false);
    let mut i = 0;
    while fed < stream.len() {
        let n = size(i).min(stream.len() - fed);
        i += 1;
        d.feed(&stream[fed..fed + n]);
        fed += n;
        loop {
            let ev = match d.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => return (out, Err(e)),
            };
            match ev {
                FrameEvent::Missing(digest) => {
                    consumed += header_lens[headers];
                    headers += 1;
                    out.push(frames::Frame::Missing(digest));
                }
                FrameEvent::Begin { digest, len } => {
                    consumed += header_lens[headers];
                    headers += 1;
                    inside = true;
                    out.push(frames::Frame::Blob {
                        digest,
                        len,
                        data: Vec::new(),
                        complete: false,
                    });
                }
                FrameEvent::Data(bytes) => {
                    consumed += bytes.len();
                    match out.last_mut() {
                        Some(frames::Frame::Blob {
                            data,
                            complete: false,
                            len,
                            ..
                        }) => {
                            data.extend_from_slice(bytes);
                            assert!(data.len() as u64 <= *len, "more data than the header said");
                        }
                        other => panic!("data outside a blob (after {other:?})"),
                    }
                }
                FrameEvent::End(digest) => {
                    inside = false;
                    match out.last_mut() {
                        Some(frames::Frame::Blob {
                            digest: d,
                            complete,
                            data,
                            len,
                        }) if *d == digest && !*complete && data.len() as u64 == *len => {
                            *complete = true
                        }
                        other => panic!("end of {digest} does not close {other:?}"),
                    }
                }
            }
        }
        let pending = fed - consumed;
        assert!(pending <= MAX_FRAME_HEADER, "{pending} bytes held back");
        assert!(
            !inside || pending == 0,
            "{pending} bytes held back inside a blob"
        );
    }
    (out, d.finish())
}

/// A `file_metadatas` body through the agent's parser (`Client::parse_listing`,
/// agent/src/client.rs) and validator (agent/src/listing.rs): an accepted
/// listing has its `"."` directory, only confined, unique paths whose
/// parents are listed directories, no reserved or ignored name, sha256 hex
/// for every file, no mode bit outside `MODE_MASK`; and nothing the
/// validator should keep is dropped.
pub fn listing(data: &[u8]) {
    let Ok(metas) = Client::parse_listing("https://fuzz.invalid:8140", data) else {
        return;
    };
    let ignore = IgnoreSet::new(&pluginsync_common::DEFAULT_IGNORE).expect("defaults compile");
    let tree = match listing::validate(metas.clone(), &ignore) {
        Ok(tree) => tree,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert_eq!(tree.root_mode & !MODE_MASK, 0);
    let roots = metas
        .iter()
        .filter(|m| m.relative_path.as_deref() == Some("."))
        .collect::<Vec<_>>();
    assert!(
        roots.len() == 1 && roots[0].kind == FileType::Directory,
        "accepted without exactly one \".\" directory"
    );
    // What the validator should have kept, by path.
    let mut kept: BTreeMap<RelPath, RemoteKind> = BTreeMap::new();
    for m in &metas {
        let raw = m
            .relative_path
            .as_deref()
            .expect("accepted entries have a path");
        let rel = RelPath::parse(raw).expect("accepted entries have valid paths");
        if rel.is_root()
            || m.kind == FileType::Other
            || rel.segments().any(|s| ignore.is_ignored(s))
        {
            continue;
        }
        let kind = match m.kind {
            FileType::Directory => RemoteKind::Dir,
            _ => RemoteKind::File {
                digest: m
                    .checksum
                    .as_ref()
                    .and_then(|c| pluginsync_common::digest::Sha256::from_checksum(&c.value).ok())
                    .expect("accepted files have a sha256"),
            },
        };
        assert!(kept.insert(rel, kind).is_none(), "{raw:?} accepted twice");
    }
    assert_eq!(
        tree.entries.keys().collect::<Vec<_>>(),
        kept.keys().collect::<Vec<_>>(),
        "the validator dropped or invented entries"
    );
    for (rel, entry) in &tree.entries {
        assert!(!rel.is_root());
        assert_eq!(RelPath::parse(rel.as_str()).as_ref(), Ok(rel));
        assert_ne!(rel.segments().next(), Some(STAGING_DIR), "reserved {rel:?}");
        assert!(
            !rel.segments().any(|s| ignore.is_ignored(s)),
            "ignored {rel:?}"
        );
        assert_eq!(entry.mode & !MODE_MASK, 0, "{rel:?} mode {:o}", entry.mode);
        assert_eq!(Some(&entry.kind), kept.get(rel));
        if let RemoteKind::File { digest } = &entry.kind {
            let sha256 = digest.to_hex();
            assert!(
                sha256.len() == 64
                    && sha256
                        .bytes()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{rel:?} sha256 {sha256:?}"
            );
        }
        if let Some(parent) = rel.parent().filter(|p| !p.is_root()) {
            assert_eq!(
                tree.entries.get(&parent).map(|e| &e.kind),
                Some(&RemoteKind::Dir),
                "{rel:?} without its directory"
            );
        }
    }
}

/// The agent's config (agent/src/config.rs through common/src/config.rs):
/// TOML either fails with a one-line message naming the file, or parses
/// into a config whose check is deterministic and, when it fails, one line
/// without control characters.
pub fn agent_config(data: &[u8]) {
    config_body::<AgentConfig>(data, "/etc/pluginsync/agent.toml");
}

/// The master's config (master/src/config.rs through common/src/config.rs),
/// as [`agent_config`].
pub fn master_config(data: &[u8]) {
    config_body::<MasterConfig>(data, "/etc/pluginsync/master.toml");
}

fn config_body<T: pluginsync_common::config::ConfigFile>(data: &[u8], file: &str) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(file);
    // One line, and nothing a terminal would act on: the master prints it
    // as is.
    let printable = |msg: &str| {
        !msg.is_empty()
            && !msg.chars().any(|c| {
                c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            })
    };
    let config: T = match pluginsync_common::config::parse(text, path) {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            assert!(printable(&msg), "unprintable error: {msg:?}");
            assert!(msg.contains(file), "error does not name the file: {msg}");
            return;
        }
    };
    let first = config.check().map_err(|e| e.to_string());
    let second = config.check().map_err(|e| e.to_string());
    assert_eq!(first, second, "check is not deterministic");
    if let Err(msg) = first {
        assert!(printable(&msg), "unprintable error: {msg:?}");
    }
}

/// Puppet's `environment.conf` (master/src/envconf.rs): never fails; every
/// warning names a line of the file; the `modulepath` value is one line;
/// its entries, expanded for an environment directory, are absolute paths.
pub fn environment_conf(data: &[u8]) {
    use pluginsync_master::envconf;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.lines().count().max(1);
    let (conf, warnings) = envconf::parse(text);
    for w in &warnings {
        assert!(
            (1..=lines).contains(&w.line),
            "warning on line {} of {lines}",
            w.line
        );
    }
    if let Some((value, line)) = &conf.modulepath {
        assert!((1..=lines).contains(line));
        assert!(!value.contains('\n'), "{value:?}");
        let (entries, _) = envconf::modulepath_entries(
            value,
            Path::new("/code/environments/production"),
            "production",
            &[std::path::PathBuf::from("/code/modules")],
        );
        for e in entries {
            assert!(e.is_absolute(), "{e:?} from {value:?}");
        }
    }
}

/// Puppet's `puppet.conf` as the agent reads it (agent/src/puppetconf.rs):
/// never fails; every warning names a line; the settings the agent takes
/// expand in bounded size however their references fan out or loop; the
/// server list gives `https://` URLs only.
pub fn puppet_conf(data: &[u8]) {
    use pluginsync_agent::puppetconf;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.lines().count().max(1);
    let (conf, warnings) = puppetconf::parse(text);
    for w in &warnings {
        assert!(
            (1..=lines).contains(&w.line),
            "warning on line {} of {lines}",
            w.line
        );
    }
    let defaults = |name: &str| (name == "confdir").then(|| "/etc/puppet".to_owned());
    for key in [
        "server",
        "server_list",
        "serverport",
        "environment",
        "certname",
        "ssldir",
    ] {
        if let Some((_, value)) = conf.agent_value(key, &defaults) {
            assert!(
                value.len() <= text.len() + puppetconf::MAX_EXPANDED + 16,
                "{key} expanded to {} bytes",
                value.len()
            );
            if key == "server_list" || key == "server" {
                for url in puppetconf::server_urls(&value, 8140) {
                    assert!(url.starts_with("https://"), "{url}");
                }
            }
        }
    }
}
