//! Running code inside the target: one system call, or one function call, on a
//! stopped thread, with every register (and the vector state) restored
//! afterwards. The code restores its thread by itself if papirus dies
//! meanwhile (`restoring`); nothing here single-steps or leaves a trap.
//!
//! An interrupted system call of the target stays as it was: while our code runs,
//! `orig_rax = -1` keeps the kernel's restart logic away from it; restoring the
//! saved registers afterwards (its `orig_rax`, and `rax = -ERESTART…`) lets the
//! kernel restart it exactly as it would have.

use std::ops::Range;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, ProtFlags};

use super::{Process, Regs};
use crate::error::{Error, Result};
use papirus_substrate::maps;

/// Reach of a rel32 jump, less Frida's 16 KiB safety margin.
const REACH: u64 = (1 << 31) - 16 * 1024;
/// The kernel's -ERESTART_RESTARTBLOCK in rax of a thread stopped in a sleep.
const ERESTART_RESTARTBLOCK: i64 = -516;
/// Bound on MAP_FIXED_NOREPLACE attempts over free gaps.
const MAX_TRIES: usize = 32;

impl Process {
    /// Runs system call `nr` with up to six arguments on the worker thread; returns
    /// the raw result (a negative errno on failure). Any thread state will do,
    /// a sleep restarted through the kernel's restart block included: the call
    /// neither touches that block nor the thread's stack.
    pub fn syscall(&mut self, nr: i64, args: &[u64]) -> Result<i64> {
        let tid = self.worker;
        self.usable(tid)?;
        if args.len() > 6 {
            return Err(Error::InvalidArgument {
                what: format!("a system call takes at most 6 arguments, not {}", args.len()),
            });
        }
        let mut r = self.regs(tid)?;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        r.rax = nr as u64;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        self.run_syscall(tid, r).map(|v| v as i64)
    }

    /// Calls the function at `func` on the worker thread with up to six integer
    /// arguments and returns rax. The function runs on a private stack, 16-byte
    /// aligned at the call, and returns into papirus' stub (see `restoring`).
    /// Other threads stay stopped: a function that waits for one of them times
    /// out, which is why threads stopped in the loader, the allocator or fork
    /// are first let run out of them.
    ///
    /// When the worker is in a sleep that restarts through the kernel's restart
    /// block (`rax = -ERESTART_RESTARTBLOCK`: nanosleep, clock_nanosleep, futex
    /// and poll with a timeout), another held thread runs the call if one can:
    /// a function that itself sleeps would overwrite that block and the target's
    /// sleep would end early with EINTR.
    /// When every thread is in such a sleep, the call runs on a thread created
    /// for it (`pthread_create`, which leaves the block alone) while the process
    /// runs, when the target has threads.
    pub fn call(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        self.usable(self.worker)?;
        if args.len() > 6 {
            return Err(Error::InvalidArgument {
                what: format!("remote calls take at most 6 integer arguments, not {}", args.len()),
            });
        }
        self.quiesce(self.worker)?;
        if self.in_restart_block(self.worker)? {
            match self.threads().into_iter().find(|&t| {
                t != self.worker && self.usable(t).is_ok() && self.in_restart_block(t).is_ok_and(|b| !b)
            }) {
                Some(other) => self.worker = other,
                None => {
                    if let Some(fresh) = self.call_fresh(func, args)? {
                        return Ok(fresh);
                    }
                }
            }
        }
        self.call_here(func, args)
    }

    /// [`Process::call`] with every other thread held where it is: no thread
    /// is let out of the loader or the allocator first and none is created,
    /// so the process does not run between the caller's last look at its
    /// threads and the call. For functions that take no lock and do not
    /// sleep. A worker asleep through the restart block hands the call to
    /// another held thread when one can take it.
    pub fn call_held(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        self.usable(self.worker)?;
        if args.len() > 6 {
            return Err(Error::InvalidArgument {
                what: format!("remote calls take at most 6 integer arguments, not {}", args.len()),
            });
        }
        // Not one inside clone, fork or vfork on its parent's side.
        let creating = |r: &Regs| [56, 57, 58, 435].contains(&r.orig_rax) && r.rax != 0;
        if self.in_restart_block(self.worker)?
            && let Some(other) = self.threads().into_iter().find(|&t| {
                t != self.worker
                    && self.usable(t).is_ok()
                    && self.in_restart_block(t).is_ok_and(|b| !b)
                    && self.regs(t).is_ok_and(|r| !creating(&r))
            })
        {
            self.worker = other;
        }
        self.call_here(func, args)
    }

    /// [`Process::call`] on the worker itself, whatever its state.
    pub(super) fn call_here(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        let tid = self.worker;
        let mut r = self.regs(tid)?;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        r.rip = func;
        r.rax = 0; // no vector arguments, for variadic callees
        (r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        self.run_function(tid, r)
    }

    /// Whether `tid` stopped in a syscall that restarts through the restart block.
    pub(super) fn in_restart_block(&self, tid: i32) -> Result<bool> {
        let r = self.regs(tid)?;
        Ok((r.orig_rax as i64) >= 0 && r.rax as i64 == ERESTART_RESTARTBLOCK)
    }

    /// Remote `mmap`; returns the address. `flags` gets nothing added.
    pub fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        prot: ProtFlags,
        flags: MapFlags,
        fd: i32,
        offset: u64,
    ) -> Result<u64> {
        let args = [addr, len, prot.bits() as u64, flags.bits() as u64, fd as i64 as u64, offset];
        self.checked_syscall("mmap", libc::SYS_mmap, &args)
    }

    /// Remote anonymous private mapping of `len` bytes wherever the kernel likes.
    pub fn mmap_anywhere(&mut self, len: u64, prot: ProtFlags) -> Result<u64> {
        self.mmap(0, len, prot, MapFlags::MAP_PRIVATE | MapFlags::MAP_ANONYMOUS, -1, 0)
    }

    /// Remote anonymous private mapping of `len` bytes of which every byte is within
    /// ±2 GiB (less 16 KiB) of every byte of `code`, so rel32 jumps and RIP-relative
    /// operands reach both ways. Tries the free gaps nearest to `code` with
    /// MAP_FIXED_NOREPLACE, moving on when one is taken meanwhile.
    pub fn mmap_near(&mut self, code: Range<u64>, len: u64, prot: ProtFlags) -> Result<u64> {
        self.map_near(code, len, prot, MapFlags::MAP_ANONYMOUS, -1)
    }

    /// [`Process::mmap_near`] of a fresh memfd named `name`: private memory
    /// like an anonymous mapping's, which `/proc/PID/maps` shows as
    /// `/memfd:NAME (deleted)`, so a later look at the process knows it.
    pub fn mmap_named_near(
        &mut self,
        code: Range<u64>,
        len: u64,
        prot: ProtFlags,
        name: &str,
    ) -> Result<u64> {
        let len = len.div_ceil(page()) * page();
        let at = self.remote_string(name.as_bytes())?;
        let fd =
            self.checked_syscall("memfd_create", libc::SYS_memfd_create, &[at, libc::MFD_CLOEXEC as u64]);
        let unmapped = self.munmap(at, 4096);
        let fd = fd? as i32;
        unmapped?;
        let mapped = self
            .checked_syscall("ftruncate", libc::SYS_ftruncate, &[fd as u64, len])
            .and_then(|_| self.map_near(code, len, prot, MapFlags::empty(), fd));
        let closed = self.checked_syscall("close", libc::SYS_close, &[fd as u64]);
        let a = mapped?;
        closed?;
        Ok(a)
    }

    fn map_near(
        &mut self,
        code: Range<u64>,
        len: u64,
        prot: ProtFlags,
        kind: MapFlags,
        fd: i32,
    ) -> Result<u64> {
        let len = len.div_ceil(page()) * page();
        let flags = MapFlags::MAP_PRIVATE | kind | MapFlags::MAP_FIXED_NOREPLACE;
        let mut tried = 0;
        while tried < MAX_TRIES {
            let mappings = maps::read(self.pid)
                .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
            let candidates = near_candidates(&mappings, &code, len);
            let Some(&first) = candidates.first() else { break };
            tried += 1;
            match self.mmap(first, len, prot, flags, fd, 0) {
                Ok(got) if got == first => return Ok(got),
                // A kernel without MAP_FIXED_NOREPLACE takes it as a hint: refuse a far answer.
                Ok(got) => {
                    self.munmap(got, len)?;
                    break;
                }
                Err(Error::RemoteSyscall { errno: Errno::EEXIST, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoNearMemory { pid: self.pid, near: code.start, len })
    }

    /// Remote `mprotect`.
    pub fn mprotect(&mut self, addr: u64, len: u64, prot: ProtFlags) -> Result<()> {
        self.checked_syscall("mprotect", libc::SYS_mprotect, &[addr, len, prot.bits() as u64]).map(drop)
    }

    /// Remote `munmap`.
    pub fn munmap(&mut self, addr: u64, len: u64) -> Result<()> {
        self.checked_syscall("munmap", libc::SYS_munmap, &[addr, len]).map(drop)
    }

    /// After a timeout: stop the thread again so its registers can be restored.
    pub(super) fn stuck(&mut self, tid: i32) -> Error {
        let err =
            Error::Timeout { what: "finish remote code", tid, timeout_ms: self.timeout.as_millis() as u64 };
        let saved = self.timeout;
        self.timeout = Duration::from_secs(1);
        let _ = self.interrupt(tid).and_then(|()| self.wait_stopped([tid].into(), "stop after a timeout"));
        self.timeout = saved;
        err
    }
}

fn page() -> u64 {
    4096
}

/// Page-aligned start addresses for `len` bytes within reach of all of `code`,
/// one per free gap (the point nearest to `code`), nearest first.
fn near_candidates(mappings: &[maps::Mapping], code: &Range<u64>, len: u64) -> Vec<u64> {
    let lo = code.end.saturating_sub(REACH).max(page());
    let hi = code.start.saturating_add(REACH);
    let mut out: Vec<u64> = maps::gaps(mappings)
        .into_iter()
        .filter_map(|(s, e)| {
            let first = s.max(lo).div_ceil(page()) * page();
            let last = e.min(hi).checked_sub(len)? / page() * page();
            (first <= last).then(|| (code.start / page() * page()).clamp(first, last))
        })
        .collect();
    out.sort_by_key(|&a| a.abs_diff(code.start));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_stay_within_reach() {
        let text = 0x5555_5555_6000..0x5555_5556_0000;
        let maps = maps::parse(
            "555555554000-555555560000 r-xp 00000000 fe:01 1 /bin/x\n\
             555555560000-555555580000 rw-p 00000000 00:00 0 [heap]\n\
             7ffff7dd3000-7ffff7df9000 r-xp 00000000 fe:01 2 /lib/libc.so.6\n",
        )
        .unwrap();
        let c = near_candidates(&maps, &text, 1 << 20);
        assert!(!c.is_empty());
        for a in &c {
            assert!((a + (1 << 20)).abs_diff(text.start) < 1 << 31 && text.end.abs_diff(*a) < 1 << 31);
            assert!(a + (1 << 20) <= text.start + REACH && *a + REACH >= text.end);
            assert!(maps.iter().all(|m| a + (1 << 20) <= m.start || *a >= m.end), "{a:#x} overlaps");
        }
        // Nearest first: right after the heap.
        assert_eq!(c[0], 0x5555_5558_0000);
        // The libc window is 0x7fff… and out of reach of this text.
        assert!(c.iter().all(|a| *a < 0x7000_0000_0000));
    }
}
