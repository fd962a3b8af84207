//! Where patches go: the memory of a process, seen through reads, code
//! writes and near mappings.
//!
//! # Safety
//!
//! [`LocalSpace::map_code_near`] maps fresh anonymous memory with
//! `MAP_FIXED_NOREPLACE`, so it can never replace an existing mapping. Code is
//! read and written through `/proc/self/mem`, which checks every address.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::PatchError;
use papirus_substrate::maps;

/// The memory of the process being patched.
pub trait AddressSpace {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), PatchError>;
    /// Writes code at `addr`, whatever the page protection (text or an arena).
    fn write_code(&mut self, addr: u64, bytes: &[u8]) -> Result<(), PatchError>;
    /// Maps `len` bytes of executable memory (writable by [`write_code`](Self::write_code))
    /// within a rel32's reach of `near`; returns its address.
    fn map_code_near(&mut self, near: u64, len: u64) -> Result<u64, PatchError>;
}

/// The calling process: in-process patching for tests, benches and
/// self-instrumentation. Writes go through `/proc/self/mem`, so text stays
/// read-only and arenas are never writable through ordinary stores.
///
/// Other threads are not stopped: a thread executing the displaced
/// instructions while they are replaced may crash, so patch functions no
/// other thread is running (the `papirus-probe` tool patches other processes
/// with every thread stopped).
#[derive(Debug)]
pub struct LocalSpace {
    mem: File,
}

impl LocalSpace {
    /// Opens `/proc/self/mem`.
    pub fn new() -> Result<Self, PatchError> {
        let mem = File::options()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .map_err(|source| PatchError::Open { what: "/proc/self/mem", source })?;
        Ok(LocalSpace { mem })
    }
}

impl AddressSpace for LocalSpace {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), PatchError> {
        self.mem.read_exact_at(buf, addr).map_err(|source| PatchError::Read { addr, source })
    }

    fn write_code(&mut self, addr: u64, bytes: &[u8]) -> Result<(), PatchError> {
        self.mem.write_all_at(bytes, addr).map_err(|source| PatchError::Write { addr, source })
    }

    fn map_code_near(&mut self, near: u64, len: u64) -> Result<u64, PatchError> {
        let maps = maps::read(std::process::id() as i32)
            .map_err(|source| PatchError::Open { what: "/proc/self/maps", source })?;
        let hint = maps::free_near(&maps, near, len).ok_or(PatchError::NoRoom { near })?;
        // SAFETY: an anonymous private mapping at a free address; MAP_FIXED_NOREPLACE
        // makes the kernel fail rather than replace anything mapped there meanwhile.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(PatchError::Map { near, source: std::io::Error::last_os_error() });
        }
        Ok(p as u64)
    }
}
