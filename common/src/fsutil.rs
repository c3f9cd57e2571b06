//! Writing a small state file so that readers see the old or the new
//! version whole, never a mix: [`write_atomic`] also makes the new version
//! survive a crash once it returns (the report, the plugin registry);
//! [`replace_atomic`] does not wait for the disk, for state that is only a
//! hint (the agent's cache: a lost or stale cache costs a slower run, never
//! a wrong one, and two fsyncs per file would cost every changed run more
//! than the cache saves — measured in BENCHMARKS.md).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The name prefix of the temporary files [`write_atomic`] and
/// [`replace_atomic`] create beside their target.
pub const TMP_PREFIX: &str = ".pluginsync-tmp-";

/// Removes the temporary files a killed writer left in `dir` (not below
/// it); returns how many. Call it only while no writer can be running
/// (the agent holds its run lock).
pub fn remove_leftovers(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(TMP_PREFIX))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in the
/// same directory (so the rename cannot cross filesystems), `fsync`, mode
/// `mode`, `rename` over `path`, then `fsync` of the directory so the
/// rename itself is on disk.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write(path, bytes, mode, true)
}

/// Writes `bytes` to `path` atomically (a temporary file in the same
/// directory renamed over `path`) without waiting for the disk: after a
/// crash `path` holds the old version, the new one, or — rarely, on
/// filesystems that delay allocation — an empty file. Only for state its
/// reader validates and may discard.
pub fn replace_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write(path, bytes, mode, false)
}

fn write(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    if durable {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"old", 0o644).unwrap();
        write_atomic(&p, b"new contents", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new contents");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn replace_is_atomic_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache.json");
        replace_atomic(&p, b"one", 0o600).unwrap();
        replace_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn leftovers_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".pluginsync-tmp-abc"), b"half").unwrap();
        std::fs::write(dir.path().join("keep.json"), b"{}").unwrap();
        assert_eq!(remove_leftovers(dir.path()), 1);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("keep.json")]);
        assert_eq!(remove_leftovers(&dir.path().join("missing")), 0);
    }

    #[test]
    fn fails_cleanly_in_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_atomic(&dir.path().join("no/such/file"), b"x", 0o644).is_err());
    }
}
