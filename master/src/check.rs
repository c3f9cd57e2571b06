//! `pluginsync-master check`: validate the config and every environment
//! without serving, and say what would be served. A server certificate that
//! agents would refuse (expired, not yet valid, not issued by `[tls] ca`)
//! fails the check; one that expires within `[tls] cert_expiry_warning`
//! is a warning.
//!
//! Prints, per environment, where its modulepath comes from
//! (`environment.conf` or the default), the effective modulepath and the
//! modules found in each entry (shadowed ones marked, missing entries
//! said), every warning about `environment.conf`, every module root not
//! served because it is outside the code tree, its modules, the
//! files per mount and every path that two modules both provide (with the
//! winner), so an operator sees a shadowed fact before an agent does. Walks
//! the trees but does not hash them, so it is quick on large environments.
//! Then the generations the store keeps for it (`[generations] dir`),
//! newest first: id, publication time, files, bytes, and under
//! `[trust] root` whether each is signed (until when), unsigned or expired
//! (docs/trust.md#what-the-masters-serve).
//! The last line is `OK`, or `OK, with N warnings` when there are any.
//!
//! A path of a served tree the master cannot read (a module root, `lib/`,
//! `facts.d/`, a directory or a file: each file is opened, not read) is an
//! `error:` line naming it, and fails the check: the master would keep
//! serving the environment's previous index, or none
//! (docs/master.md#unreadable-files).

use std::io::Write;
use std::path::Path;

use pluginsync_common::envname::EnvName;

use crate::config::MasterConfig;
use crate::environments;
use crate::generations::Generations;
use crate::index::{EnvIndex, Mount};
use crate::trust::signed::Signatures;
use crate::walk::{Hashing, ReadError};

/// Why the check failed: the server's TLS cannot work, or the summary
/// could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The TLS files do not make a server config.
    #[error(transparent)]
    Tls(#[from] crate::tls::ServerTlsError),
    /// Agents would refuse the server certificate.
    #[error(transparent)]
    Certificate(#[from] crate::tls::CertificateRefused),
    /// Writing the summary failed.
    #[error(transparent)]
    Output(#[from] std::io::Error),
    /// The generation store (`[generations] dir`) cannot be created or
    /// written by this user: `serve` would exit before publishing.
    #[error("generation store {}: {source}: `serve` as this user would exit", dir.display())]
    Store {
        /// The configured directory.
        dir: std::path::PathBuf,
        /// What creating or writing in it said.
        source: std::io::Error,
    },
    /// `check --store` without a store to check.
    #[error("no [generations] dir: the store is temporary, nothing to check")]
    NoStore,
    /// `check --store` found files whose bytes are not what their names say.
    #[error("{count} corrupt file(s) in the generation store, first {}: {why}", first.display())]
    Corrupt {
        /// How many.
        count: usize,
        /// The first one.
        first: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The state store cannot be opened or is newer than this binary.
    #[error(transparent)]
    State(#[from] crate::statestore::StoreError),
    /// Parts of the served trees cannot be read.
    #[error(
        "{count} path(s) of the environments cannot be read by this user, first {}: the master would not publish their environments' indexes",
        first.display()
    )]
    Unreadable {
        /// How many.
        count: usize,
        /// The first one.
        first: std::path::PathBuf,
    },
}

/// Opens the state store (its schema migrated to this binary's) and says
/// where it is and its schema version. The embedded file is left for
/// `serve` to create (a `check` run as root must not create a file the
/// master's user cannot open), and without `[generations] dir` there is
/// none to check.
fn state_store(config: &MasterConfig, out: &mut impl Write) -> Result<usize, CheckError> {
    use crate::statestore::{Backend, EMBEDDED_FILE, StateStore};
    let dir = config.generations.dir.as_deref();
    if dir.is_none() && config.state.url.is_none() {
        writeln!(
            out,
            "state store: embedded, in the temporary generation store"
        )?;
        return Ok(0);
    }
    let dir = dir.unwrap_or(Path::new("/"));
    // Checked by `MasterConfig::validate` already.
    let settings = config.state_settings(dir).map_err(std::io::Error::other)?;
    if matches!(settings.backend, Backend::Embedded(_)) && !dir.join(EMBEDDED_FILE).exists() {
        let place = settings.place();
        writeln!(
            out,
            "state store {place}: not created yet (serve creates it)"
        )?;
        return Ok(0);
    }
    let store = match StateStore::open(&settings) {
        Ok(store) => store,
        // A shared database that does not answer: running replicas keep
        // serving, degraded (docs/operating.md#the-state-store).
        Err(e @ crate::statestore::StoreError::Database { .. })
            if matches!(settings.backend, Backend::Postgres(_)) =>
        {
            writeln!(out, "warning: degraded: {e}")?;
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    let (version, _) = store.schema()?;
    writeln!(
        out,
        "state store {}: schema version {version} (current)",
        store.place()
    )?;
    Ok(0)
}

/// Runs the check, writing the summary to `out`.
pub fn run(config: &MasterConfig, out: &mut impl Write) -> Result<(), CheckError> {
    pluginsync_common::tls::install_default_provider();
    crate::tls::server_config(&config.tls)?;
    let soon = crate::tls::server_certificate_check(
        &config.tls,
        std::time::SystemTime::now(),
        config.tls.cert_expiry_warning,
    )?;
    let mut warnings = 0usize;
    let mut unreadable: Vec<ReadError> = Vec::new();
    for w in config
        .warnings()
        .into_iter()
        .chain(soon.map(|w| w.to_string()))
        .chain(config.generations.dir.iter().flat_map(|d| store_modes(d)))
    {
        writeln!(out, "warning: {w}")?;
        warnings += 1;
    }
    if let Some(dir) = &config.generations.dir
        && let Err(source) = store_writable(dir)
    {
        writeln!(out, "FAILED: the generation store cannot be written")?;
        return Err(CheckError::Store {
            dir: dir.clone(),
            source,
        });
    }
    let store = Generations::new(&config.generations);
    if config.generations.dir.is_some()
        && let Err(e) = store.open(false)
    {
        writeln!(out, "warning: {e}")?;
        warnings += 1;
    }
    match state_store(config, out) {
        Ok(n) => warnings += n,
        Err(e) => {
            writeln!(out, "FAILED: the state store cannot be used")?;
            return Err(e);
        }
    }
    let signatures = Signatures::new(config.trust.signed_settings());
    warnings += trust(config, &signatures, out)?;
    let layout = config.layout();
    let envs = environments::list_environments(&layout);
    if envs.is_empty() {
        writeln!(out, "warning: no environment found on the environmentpath")?;
    }
    for (name, dir) in envs {
        let mut idx = EnvIndex::build(
            &layout,
            &config.index,
            name.clone(),
            dir.clone(),
            None,
            Hashing::Skip,
        );
        idx.unreadable.extend(unopenable(&idx));
        let modules: Vec<&str> = idx.modules.iter().map(|m| m.name.as_str()).collect();
        writeln!(out, "environment {name} ({})", dir.display())?;
        warnings += modulepath(config, &dir, out)?;
        writeln!(out, "  modules ({}): {}", modules.len(), modules.join(" "))?;
        warnings += mounts(&idx, out)?;
        generations(&store, &signatures, &name, out)?;
        for e in &idx.unreadable {
            writeln!(out, "  error: {e}")?;
        }
        unreadable.append(&mut idx.unreadable);
    }
    if let Some(first) = unreadable.first() {
        writeln!(
            out,
            "FAILED: {} unreadable",
            count(unreadable.len(), "path", "paths")
        )?;
        return Err(CheckError::Unreadable {
            count: unreadable.len(),
            first: first.path.clone(),
        });
    }
    if warnings == 0 {
        writeln!(out, "OK")?;
    } else {
        writeln!(out, "OK, with {warnings} warnings")?;
    }
    Ok(())
}

/// What each mount of `idx` serves, its roots outside the code tree (one
/// warning each: how many) and its collisions.
fn mounts(idx: &EnvIndex, out: &mut impl Write) -> std::io::Result<usize> {
    let mut warnings = 0;
    for mount in Mount::ALL {
        let m = idx.mount(mount);
        let files = m
            .lookup
            .iter()
            .filter(|&&loc| m.node(loc).sig.is_some())
            .count();
        let dirs = m.lookup.len() - files;
        writeln!(
            out,
            "  {}: {} from {}",
            mount.as_str(),
            count(files, "file", "files") + ", " + &count(dirs, "directory", "directories"),
            count(m.roots.len(), "module", "modules"),
        )?;
        for o in &m.outside {
            writeln!(out, "  warning: {o}")?;
            warnings += 1;
        }
        for c in &m.collisions {
            writeln!(
                out,
                "    collision {}: served from {}, hidden in {}",
                c.path, c.winner, c.loser
            )?;
        }
    }
    Ok(warnings)
}

/// `check --store`: every blob and manifest of the store hashed again
/// (docs/deploys.md#scrubbing-the-store); one line per corrupt file, and
/// the error names the first.
pub fn store(config: &MasterConfig, out: &mut impl Write) -> Result<(), CheckError> {
    let Some(dir) = &config.generations.dir else {
        return Err(CheckError::NoStore);
    };
    let store = Generations::new(&config.generations);
    if let Err(e) = store.open(false) {
        writeln!(out, "warning: {e}")?;
    }
    let s = store.scrub();
    writeln!(
        out,
        "generation store {}: {} blobs, {} manifests hashed",
        dir.display(),
        s.blobs,
        s.manifests
    )?;
    for (path, why) in &s.corrupt {
        writeln!(out, "corrupt: {}: {why}", path.display())?;
    }
    let count = s.corrupt.len();
    match s.corrupt.into_iter().next() {
        Some((first, why)) => {
            writeln!(out, "FAILED")?;
            Err(CheckError::Corrupt { count, first, why })
        }
        None => {
            writeln!(out, "OK")?;
            Ok(())
        }
    }
}

/// What of the store `dir` (its directories, its records and the rollout
/// state) another user may read or the group may write: the store holds
/// environments `[[authorization]]` may restrict, and is the master
/// user's, 0750 and 0640 (docs/deploys.md#generations). `serve` tightens
/// the directories; this says so before.
fn store_modes(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = vec![dir.to_owned()];
    for sub in ["blobs", "manifests", "environments", "indexes"] {
        paths.push(dir.join(sub));
    }
    paths.push(dir.join("rollout.json"));
    if let Ok(records) = std::fs::read_dir(dir.join("environments")) {
        paths.extend(records.flatten().map(|e| e.path()));
    }
    let mut out = Vec::new();
    for p in paths {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let mode = m.permissions().mode() & 0o7777;
        if mode & 0o027 != 0 {
            let want = if m.is_dir() { "0750" } else { "0640" };
            out.push(format!(
                "generation store {} is mode {mode:04o}: other users may read it or its group write it; make it {want} or tighter",
                p.display()
            ));
        }
    }
    out
}

/// Whether this user can write in the store `dir`, or create it: a
/// temporary file is made (and removed) in `dir`, or in its nearest existing
/// ancestor when `dir` does not exist yet (`serve` creates it).
fn store_writable(dir: &Path) -> std::io::Result<()> {
    let at = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("."));
    if !at.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", at.display()),
        ));
    }
    tempfile::Builder::new()
        .prefix(".pluginsync-check-")
        .tempfile_in(at)
        .map(drop)
        .map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot write in {}: {e}", at.display()))
        })
}

/// The effective modulepath of the environment at `dir`, entry by entry
/// with the modules found there, then its warnings; returns how many
/// warnings it printed.
fn modulepath(config: &MasterConfig, dir: &Path, out: &mut impl Write) -> std::io::Result<usize> {
    let mp = environments::resolve(&config.layout(), dir);
    let scan = environments::scan(&mp);
    match &mp.conf {
        Some(conf) => writeln!(out, "  environment.conf: {}", conf.display())?,
        None => writeln!(
            out,
            "  environment.conf: none (modulepath <env>/modules, then basemodulepath)"
        )?,
    }
    writeln!(out, "  modulepath: {}", mp.joined())?;
    for (i, entry) in mp.entries.iter().enumerate() {
        if !entry.exists {
            writeln!(out, "    {}: missing, skipped", entry.dir.display())?;
            continue;
        }
        let served: Vec<&str> = scan
            .modules
            .iter()
            .filter(|m| m.entry == i)
            .map(|m| m.name.as_str())
            .collect();
        let shadowed: Vec<&str> = scan
            .shadowed
            .iter()
            .filter(|(e, _)| *e == i)
            .map(|(_, n)| n.as_str())
            .collect();
        let mut line = format!("    {}: {}", entry.dir.display(), served.join(" "));
        if !shadowed.is_empty() {
            line.push_str(&format!(
                " (shadowed by an earlier entry: {})",
                shadowed.join(" ")
            ));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    for w in &mp.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    for o in &scan.outside {
        writeln!(out, "  warning: {o}")?;
    }
    Ok(mp.warnings.len() + scan.outside.len())
}

/// Under `[trust] root`, the signed metadata read and verified
/// (docs/trust.md#what-the-masters-serve): one line, and a warning when it
/// does not verify (nothing new would be published). The warnings written.
fn trust(
    config: &MasterConfig,
    signatures: &Signatures,
    out: &mut impl Write,
) -> std::io::Result<usize> {
    let (Some(root), Some(metadata)) = (&config.trust.root, &config.trust.metadata) else {
        return Ok(0);
    };
    signatures.refresh();
    writeln!(
        out,
        "signed generations: root {}, metadata {}",
        root.display(),
        metadata.display()
    )?;
    match signatures.error() {
        Some(e) => writeln!(out, "warning: the signed metadata does not verify: {e}").map(|()| 1),
        None => Ok(0),
    }
}

/// The generations the store keeps for `env`, newest first: id (short),
/// publication time, files, bytes (docs/deploys.md#generations), and under
/// `[trust] root` whether each is signed, unsigned or expired.
fn generations(
    store: &Generations,
    signatures: &Signatures,
    env: &EnvName,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let kept = store.kept(env);
    if kept.is_empty() {
        return writeln!(out, "  generations: none kept");
    }
    writeln!(out, "  generations ({} kept, newest first):", kept.len())?;
    for (i, k) in kept.iter().enumerate() {
        writeln!(
            out,
            "    {}  {}  {}, {} bytes{}{}",
            k.id.short(),
            k.published,
            count(k.files as usize, "file", "files"),
            k.bytes,
            match signatures.is_on() {
                true => format!("  {}", signatures.state(env, &k.id, None).describe()),
                false => String::new(),
            },
            if i == 0 { "  (current)" } else { "" }
        )?;
    }
    Ok(())
}

/// The served files of `idx` that cannot be opened for reading (the walk
/// of `check` reads no content, [`Hashing::Skip`]).
fn unopenable(idx: &EnvIndex) -> Vec<ReadError> {
    idx.mounts
        .iter()
        .flat_map(|m| m.roots.iter())
        .flat_map(|r| r.nodes.iter().map(move |n| (r, n)))
        .filter(|(_, n)| n.has_content())
        .filter_map(|(r, n)| {
            let path = n.real_path(&r.canon);
            let e = crate::walk::open_regular(&path).err()?;
            Some(ReadError::new(path.into_owned(), e))
        })
        .collect()
}

/// `n` and the noun as a person reads them: `1 file`, `2 files`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
