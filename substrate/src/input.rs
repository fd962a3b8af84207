//! Opening files that a target process or another user can name.
//!
//! papirus runs as root against other users' processes. A path from
//! `/proc/PID/maps`, a report named on the command line or a library found
//! through `ld.so.conf` may be a FIFO (an open or read blocks for ever), a
//! device (`/dev/zero` reads for ever), a sparse file of many GiB behind a
//! 4 KiB mapping, or a symlink someone planted. Every such file is read here,
//! the same way:
//!
//! 1. opened with `O_PATH`, which neither blocks nor runs a device's open;
//! 2. `fstat`ed: it must be a regular file no larger than the caller's bound
//!    and, for a module of a process, have the device and inode of the mapping;
//! 3. reopened for reading through `/proc/self/fd/N` (the same inode) with
//!    `O_NONBLOCK`, and checked again;
//! 4. read up to the bound, never further.
//!
//! A module of a process is read through `/proc/PID/map_files/START-END`, the
//! file the target really mapped, even when deleted or in another mount
//! namespace. Where that is not allowed (it needs CAP_SYS_ADMIN or
//! CAP_CHECKPOINT_RESTORE) the mapped path is resolved inside the target's
//! own root (`/proc/PID/root`, `openat2` with `RESOLVE_IN_ROOT`, no magic
//! links), and the inode check refuses whatever is not the mapped file.
//! The tool's own view of a target's path is used only for a process that
//! has ended (a profiler reads its mappings after the fact), and then too
//! only for the file with the mapping's device and inode.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::maps::Mapping;

/// Largest module (executable or shared object) read, in bytes: far above
/// any real library (libc is 2 MiB, libpython 30 MiB), far below what a
/// sparse file can claim.
pub const MODULE_LIMIT: u64 = crate::elf::MAX_FILE_BYTES;

/// Largest probe report read, in bytes (a default report is under 1 MiB).
pub const REPORT_LIMIT: u64 = 256 << 20;

/// Largest configuration file read (`ld.so.conf` and its includes).
pub const CONFIG_LIMIT: u64 = 1 << 20;

/// A file papirus refuses to read, or could not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Opening, checking or reading failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A FIFO, device, directory or socket.
    #[error("{} is a {kind}, not a regular file: refused (papirus reads only regular files, at most {limit} bytes)", .path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
        /// The size bound that applied.
        limit: u64,
    },
    /// A regular file over the bound.
    #[error("{} is {size} bytes, over the {limit}-byte bound papirus reads: refused", .path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// The file found is not the one the process mapped.
    #[error(
        "{} is not the file process {pid} mapped at {start:#x} (found device {found_dev}, inode {found_ino}; \
         the mapping has device {dev}, inode {ino}): refused rather than read the wrong file",
        .path.display()
    )]
    NotMapped {
        /// The file opened.
        path: PathBuf,
        /// The process.
        pid: i32,
        /// Start of the mapping.
        start: u64,
        /// The mapping's device, `major:minor` as in maps.
        dev: String,
        /// The mapping's inode.
        ino: u64,
        /// The opened file's device.
        found_dev: String,
        /// The opened file's inode.
        found_ino: u64,
    },
    /// A mapping whose file cannot be reached from here.
    #[error(
        "cannot read the file process {pid} mapped at {start:#x} ({name}): {why}; \
         /proc/PID/map_files needs root (CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE)"
    )]
    Unreachable {
        /// The process.
        pid: i32,
        /// Start of the mapping.
        start: u64,
        /// The name in maps.
        name: String,
        /// What failed.
        why: String,
    },
}

/// Reads the regular file `path` names (the user named it: symlinks are
/// followed), at most `limit` bytes.
pub fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    Ok(read_file_if(path, b"", limit)?.unwrap_or_default())
}

/// Reads the regular file `path` names, at most `limit` bytes, when it
/// begins with `magic`; `None` (after reading only `magic.len()` bytes) when
/// it does not, so one large bound serves one kind of file only.
pub fn read_file_if(path: &Path, magic: &[u8], limit: u64) -> Result<Option<Vec<u8>>, InputError> {
    let io = |source| InputError::Io { path: path.to_path_buf(), source };
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    read_checked(handle, path, limit, magic, |_| Ok(()))
}

/// Reads the ELF file process `pid` maps at `m`, at most `limit` bytes:
/// through `/proc/PID/map_files`, else through the target's root; either way
/// only when its device and inode are the mapping's. `None` when the file
/// does not start with the ELF magic (a data file, a JIT cache): only those
/// 4 bytes are read then.
pub fn read_module(pid: i32, m: &Mapping, limit: u64) -> Result<Option<Vec<u8>>, InputError> {
    let via_map_files = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let same_inode = |md: &std::fs::Metadata, path: &Path| {
        let found = (rustix::fs::major(md.dev()), rustix::fs::minor(md.dev()));
        if found == m.dev && md.ino() == m.inode {
            return Ok(());
        }
        Err(InputError::NotMapped {
            path: path.to_path_buf(),
            pid,
            start: m.start,
            dev: format!("{:02x}:{:02x}", m.dev.0, m.dev.1),
            ino: m.inode,
            found_dev: format!("{:02x}:{:02x}", found.0, found.1),
            found_ino: md.ino(),
        })
    };
    let first = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(&via_map_files);
    // Errors name the file as the target maps it, and where it was read.
    let shown = PathBuf::from(format!("{} (pid {pid}, {})", m.name, via_map_files.display()));
    match first {
        Ok(handle) => read_checked(handle, &shown, limit, ELF_MAGIC, |md| same_inode(md, &shown)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            let (handle, shown) = open_in_root(pid, m, &e)?;
            read_checked(handle, &shown, limit, ELF_MAGIC, |md| same_inode(md, &shown))
        }
        // The mapping or the whole process is gone (a profiler reads a
        // mapping after the fact): the same file, found by its path.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => {
            let (handle, shown) = match open_in_root(pid, m, &e) {
                Ok(found) => found,
                Err(in_root) => open_gone(m).map_err(|_| in_root)?,
            };
            read_checked(handle, &shown, limit, ELF_MAGIC, |md| same_inode(md, &shown))
        }
        Err(source) => Err(InputError::Io { path: via_map_files, source }),
    }
}

/// Opens (`O_PATH`) the path of a mapping whose process has ended, as this
/// process sees it; the caller's device/inode check refuses any file but
/// the one that was mapped.
fn open_gone(m: &Mapping) -> std::io::Result<(File, PathBuf)> {
    let path = m.file().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    let handle =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(&path)?;
    Ok((handle, path))
}

/// Opens (`O_PATH`) the mapped path resolved inside the target's root.
fn open_in_root(
    pid: i32,
    m: &Mapping,
    map_files_err: &std::io::Error,
) -> Result<(File, PathBuf), InputError> {
    let unreachable =
        |why: String| InputError::Unreachable { pid, start: m.start, name: m.name.clone(), why };
    if m.name.ends_with(" (deleted)") || !m.name.starts_with('/') {
        return Err(unreachable(format!("map_files: {map_files_err}; the file is no longer on disk")));
    }
    let root_path = PathBuf::from(format!("/proc/{pid}/root"));
    let root =
        rustix::fs::open(&root_path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| InputError::Io { path: root_path.clone(), source: e.into() })?;
    let shown = root_path.join(m.name.trim_start_matches('/'));
    let fd = rustix::fs::openat2(
        &root,
        m.name.as_str(),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| InputError::Io { path: shown.clone(), source: e.into() })?;
    Ok((File::from(fd), shown))
}

const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Checks the `O_PATH` handle (`check` adds the caller's test), reopens it
/// for reading, checks the reopened file is the same, reads it bounded;
/// `None` when it does not start with `magic`.
fn read_checked(
    handle: File,
    path: &Path,
    limit: u64,
    magic: &[u8],
    check: impl Fn(&std::fs::Metadata) -> Result<(), InputError>,
) -> Result<Option<Vec<u8>>, InputError> {
    let io = |source| InputError::Io { path: path.to_path_buf(), source };
    let md = handle.metadata().map_err(io)?;
    let ft = md.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "FIFO"
        } else if ft.is_dir() {
            "directory"
        } else if ft.is_char_device() {
            "character device"
        } else if ft.is_block_device() {
            "block device"
        } else if ft.is_socket() {
            "socket"
        } else {
            "special file"
        };
        return Err(InputError::NotRegular { path: path.to_path_buf(), kind, limit });
    }
    if md.len() > limit {
        return Err(InputError::TooLarge { path: path.to_path_buf(), size: md.len(), limit });
    }
    check(&md)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(io)?;
    let again = file.metadata().map_err(io)?;
    if (again.dev(), again.ino()) != (md.dev(), md.ino()) || !again.file_type().is_file() {
        return Err(io(std::io::Error::other("the file changed while it was being opened")));
    }
    let mut data = Vec::with_capacity(md.len() as usize);
    (&mut file).take(magic.len() as u64).read_to_end(&mut data).map_err(io)?;
    if data != magic {
        return Ok(None);
    }
    // One byte past the bound tells a file that grew since fstat.
    (&mut file).take(limit + 1 - data.len() as u64).read_to_end(&mut data).map_err(io)?;
    if data.len() as u64 > limit {
        return Err(InputError::TooLarge { path: path.to_path_buf(), size: data.len() as u64, limit });
    }
    Ok(Some(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_special_and_large_files() {
        let err = read_file(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(matches!(err, InputError::NotRegular { kind: "character device", .. }), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = read_file(dir.path(), 1 << 20).unwrap_err();
        assert!(matches!(err, InputError::NotRegular { kind: "directory", .. }), "{err}");
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, Mode::RWXU, 0).unwrap();
        let err = read_file(&fifo, 1 << 20).unwrap_err();
        assert!(matches!(err, InputError::NotRegular { kind: "FIFO", .. }), "{err}");
        let big = dir.path().join("big");
        File::create(&big).unwrap().set_len(3 << 30).unwrap();
        let err = read_file(&big, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("1048576-byte bound"), "{err}");
        std::fs::write(&big, b"hello").unwrap();
        assert_eq!(read_file(&big, 5).unwrap(), b"hello");
        assert!(matches!(read_file(&big, 4), Err(InputError::TooLarge { size: 5, .. })));
    }

    #[test]
    fn reads_own_modules_and_checks_inodes() {
        let pid = std::process::id() as i32;
        let maps = crate::maps::read(pid).unwrap();
        let exe = maps.iter().find(|m| m.perms.exec && m.file().is_some()).unwrap();
        let data = read_module(pid, exe, MODULE_LIMIT).unwrap().expect("an ELF file");
        assert_eq!(&data[..4], ELF_MAGIC);
        let mut wrong = exe.clone();
        wrong.inode += 1;
        let err = read_module(pid, &wrong, MODULE_LIMIT).unwrap_err();
        assert!(matches!(err, InputError::NotMapped { .. }), "{err}");
    }

    #[test]
    fn a_mapping_of_an_ended_process_is_read_by_path_with_its_inode_checked() {
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let pid = child.id() as i32;
        let exe = loop {
            let maps = crate::maps::read(pid).unwrap();
            // Until the exec is done, the mappings are the forking test's.
            if let Some(m) = maps.iter().find(|m| m.perms.exec && m.name.ends_with("/sleep")) {
                break m.clone();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        let data = read_module(pid, &exe, MODULE_LIMIT).unwrap().expect("an ELF file");
        assert_eq!(&data[..4], ELF_MAGIC);
        let mut wrong = exe.clone();
        wrong.inode += 1;
        let err = read_module(pid, &wrong, MODULE_LIMIT).unwrap_err();
        assert!(matches!(err, InputError::NotMapped { .. }), "{err}");
    }
}
