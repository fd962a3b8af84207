//! Files the tools write: reports and other outputs, written atomically.
//!
//! The papirus tools often run as root, so an output is never opened through a
//! name someone else may have planted: the bytes go to a fresh file created
//! with `O_EXCL` in the destination directory, which is then renamed over
//! the destination. A symlink at the destination is replaced, never
//! followed; a failed write, or a tool killed while writing, leaves the
//! previous file as it was.
//!
//! Outputs are not `fsync`ed: on a busy machine an `fsync` waits for the
//! journal commit of everyone's dirty data (measured here at 0.5–12 ms for
//! a 2 KiB report under load, seconds for large traces), which the user
//! would wait for at every run. Across a power loss, ext4 (its default
//! `auto_da_alloc`) and btrfs still give the old or the new file, as they
//! flush a file renamed over another; elsewhere the new file may be empty.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why an output cannot be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {reason}")]
pub struct OutputError {
    /// The destination.
    pub path: PathBuf,
    /// What went wrong, with what to do.
    pub reason: String,
}

fn err(path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError { path: path.to_path_buf(), reason: reason.into() }
}

/// The directory a destination lives in (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks, before any work is done, that `path` can be written atomically:
/// its directory exists and takes a new file, and the destination, if it
/// exists, is not a directory.
pub fn check_writable(path: &Path) -> Result<(), OutputError> {
    if path.as_os_str().is_empty() {
        return Err(err(path, "the output path is empty"));
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(err(path, "it is a directory: name a file"));
    }
    let dir = parent_of(path);
    // An unnamed file (O_TMPFILE): nothing to clean up, and the OS error alone in the message.
    tempfile::tempfile_in(dir)
        .map(drop)
        .map_err(|e| err(path, format!("its directory {} does not take new files: {e}", dir.display())))
}

/// Writes `bytes` to `path` atomically (a fresh file beside it, renamed over it).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// Like [`write_atomic`], with the content produced by `fill` (a streaming writer).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
) -> Result<(), OutputError> {
    let dir = parent_of(path);
    // Created as a plain file would be (0666 less the umask), not tempfile's 0600.
    let tmp = tempfile::Builder::new()
        .prefix(".papirus-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| err(path, format!("cannot create a file in {}: {e}", dir.display())))?;
    let mut w = std::io::BufWriter::new(tmp.as_file());
    fill(&mut w).and_then(|()| w.flush()).map_err(|e| err(path, e.to_string()))?;
    drop(w);
    tmp.persist(path).map_err(|e| err(path, e.error.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_a_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let out = dir.path().join("report.json");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        write_atomic(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert!(!std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_failed_write_keeps_the_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("report.json");
        std::fs::write(&out, b"old").unwrap();
        let e = write_atomic_with(&out, |_| Err(std::io::Error::other("disk full"))).unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn unusable_destinations_are_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_writable(&dir.path().join("r.json")).is_ok());
        assert!(check_writable(dir.path()).is_err());
        assert!(check_writable(&dir.path().join("missing/r.json")).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
