//! The target's memory: reads through process_vm_readv (and /proc/PID/mem where
//! that cannot go), every write through /proc/PID/mem.
//!
//! Writes never use process_vm_writev: that call finds the process' memory
//! anew each time, so after an `execve` it would write into the new program.
//! /proc/PID/mem, opened at attach, stays bound to the memory it was opened
//! on: once an execve has replaced that, writes fail (and say so, as
//! [`Error::Exec`]) instead of landing in the new image. The kernel writes
//! with FOLL_FORCE, so read-only text takes writes too, breaking copy-on-write
//! of private file mappings (the file on disk is untouched).

use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;

use nix::errno::Errno;
use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;

use super::Process;
use crate::error::{Error, Result};

impl Process {
    /// Fills `buf` from the target's memory at `addr`.
    pub fn read_memory(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        let remote = [RemoteIoVec { base: addr as usize, len }];
        let done =
            process_vm_readv(Pid::from_raw(self.pid), &mut [IoSliceMut::new(buf)], &remote).unwrap_or(0);
        if done < len {
            // Pages process_vm_readv cannot read (e.g. [vvar]-like or guard areas): /proc/PID/mem.
            self.pread(addr + done as u64, &mut buf[done..])
                .map_err(|errno| self.mem_error("read", addr, len, errno))?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `addr`.
    pub fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read_memory(addr, &mut v)?;
        Ok(v)
    }

    /// Reads a little-endian u64 at `addr`.
    pub fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0; 8];
        self.read_memory(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads a NUL-terminated string of at most `max` bytes at `addr`.
    pub fn read_cstr(&self, addr: u64, max: usize) -> Result<String> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < max {
            // Never cross a page boundary in one read: the string may end just before an unmapped page.
            let room = (4096 - (addr + out.len() as u64) % 4096) as usize;
            let n = room.min(chunk.len()).min(max - out.len());
            self.read_memory(addr + out.len() as u64, &mut chunk[..n])?;
            if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..end]);
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Writes `data` at `addr`, through /proc/PID/mem (see the module documentation).
    pub fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<()> {
        self.pwrite(addr, data).map_err(|errno| self.mem_error("write", addr, data.len(), errno))
    }

    /// Writes a little-endian u64 at `addr`.
    pub fn write_u64(&mut self, addr: u64, value: u64) -> Result<()> {
        self.write_memory(addr, &value.to_le_bytes())
    }

    fn pread(&self, mut addr: u64, mut buf: &mut [u8]) -> Result<(), Errno> {
        while !buf.is_empty() {
            match self.mem.read_at(buf, addr) {
                // The memory the file was opened on has no process any more.
                Ok(0) => return Err(Errno::ESRCH),
                Ok(n) => {
                    addr += n as u64;
                    buf = &mut buf[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
            }
        }
        Ok(())
    }

    fn pwrite(&self, mut addr: u64, mut data: &[u8]) -> Result<(), Errno> {
        while !data.is_empty() {
            match self.mem.write_at(data, addr) {
                Ok(0) => return Err(Errno::ESRCH),
                Ok(n) => {
                    addr += n as u64;
                    data = &data[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
            }
        }
        Ok(())
    }

    /// The error of a failed access: when the memory papirus opened is gone
    /// while the process lives, it exec'd.
    fn mem_error(&self, op: &'static str, addr: u64, len: usize, errno: Errno) -> Error {
        if errno == Errno::ESRCH {
            return if super::task_alive(self.pid, self.pid) {
                Error::Exec { pid: self.pid, during: "a memory access" }
            } else {
                Error::TargetExited { pid: self.pid, status: super::Exit::Unknown, during: "a memory access" }
            };
        }
        Error::Memory { op, pid: self.pid, addr, len, errno }
    }
}
