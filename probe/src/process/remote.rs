//! Running code inside the target: one system call, or one function call, on a
//! stopped thread, with every register (and the XSAVE area) restored afterwards.
//!
//! An interrupted system call of the target stays as it was: while our code runs,
//! `orig_rax = -1` keeps the kernel's restart logic away from it; restoring the
//! saved registers afterwards (its `orig_rax`, and `rax = -ERESTART…`) lets the
//! kernel restart it exactly as it would have.
//!
//! The code normally runs self-restoring (`restoring`): if papirus dies, the
//! thread puts itself back. On a thread asleep through the restart block, whose
//! block `rt_sigreturn` would reset, system calls run by a single step over a
//! `syscall` instruction of the target and functions return to address 0 (the
//! fault hands the thread back); functions go to another thread when one can
//! take them.

use std::ops::Range;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, ProtFlags};
use nix::sys::ptrace;
use nix::unistd::Pid;

use super::wait::{self, Event};
use super::{Process, Regs, sys};
use crate::error::{Error, Result};
use papirus_substrate::maps;

/// rflags bits: trap (single-step) and direction.
const TF: u64 = 1 << 8;
const DF: u64 = 1 << 10;
/// The x86-64 System V red zone below rsp.
const RED_ZONE: u64 = 128;
/// The return address of remote calls: page 0 is never mapped (vm.mmap_min_addr),
/// so `ret` faults there and hands the thread back to us with rax intact.
const RETURN_TRAP: u64 = 0;
/// Reach of a rel32 jump, less Frida's 16 KiB safety margin.
const REACH: u64 = (1 << 31) - 16 * 1024;
/// The kernel's -ERESTART_RESTARTBLOCK in rax of a thread stopped in a sleep.
const ERESTART_RESTARTBLOCK: i64 = -516;
/// Bound on MAP_FIXED_NOREPLACE attempts over free gaps.
const MAX_TRIES: usize = 32;

/// How the remote code hands control back.
#[derive(Clone, Copy)]
enum Until {
    /// Single-step one instruction ending at this address.
    Step(u64),
    /// Continue until the fault at [`RETURN_TRAP`].
    Return,
}

impl Process {
    /// Runs system call `nr` with up to six arguments on the worker thread; returns
    /// the raw result (a negative errno on failure). It runs self-restoring
    /// (see `restoring`), except on a thread asleep through the restart block.
    pub fn syscall(&mut self, nr: i64, args: &[u64]) -> Result<i64> {
        let tid = self.worker;
        self.usable(tid)?;
        if args.len() > 6 {
            return Err(Error::InvalidArgument {
                what: format!("a system call takes at most 6 arguments, not {}", args.len()),
            });
        }
        if self.in_restart_block(tid)? {
            return self.stepped_syscall(nr, args);
        }
        let stub = self.stub()?;
        let mut r = self.regs(tid)?;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        r.rax = nr as u64;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        self.run_restoring(tid, r, stub + super::restoring::STUB_SYSCALL).map(|v| v as i64)
    }

    /// [`Process::syscall`] by a single step over a `syscall` instruction of
    /// the target: no stub needed, the restart block untouched.
    pub(super) fn stepped_syscall(&mut self, nr: i64, args: &[u64]) -> Result<i64> {
        let tid = self.worker;
        self.usable(tid)?;
        let insn = self.syscall_instruction()?;
        let saved = self.regs(tid)?;
        let xsaved = self.xstate(tid)?;
        let mut r = saved;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        r.rax = nr as u64;
        r.orig_rax = u64::MAX;
        r.rip = insn;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        r.eflags &= !TF;
        let out = self.run(tid, &r, Until::Step(insn + 2), insn);
        self.restore(tid, &saved, &xsaved, out).map(|r| r.rax as i64)
    }

    /// Calls the function at `func` on the worker thread with up to six integer
    /// arguments and returns rax. The frame: rsp below the red zone (and below
    /// the thread's saved state), 16-byte aligned at the call; the function
    /// returns into the self-restoring stub (see the module documentation).
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

    /// [`Process::call`] on the worker itself.
    pub(super) fn call_here(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        let tid = self.worker;
        if !self.in_restart_block(tid)? {
            let mut r = self.regs(tid)?;
            let mut a = [0u64; 6];
            a[..args.len()].copy_from_slice(args);
            r.rax = 0; // no vector arguments, for variadic callees
            (r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
            return self.run_restoring(tid, r, func);
        }
        let saved = self.regs(tid)?;
        let xsaved = self.xstate(tid)?;
        let mut r = saved;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        // Aligned to 16, then the pushed return address: rsp ≡ 8 (mod 16) at entry, as after a call.
        let sp = ((saved.rsp - RED_ZONE) & !0xf) - 8;
        self.write_u64(sp, RETURN_TRAP)?;
        r.rsp = sp;
        r.rip = func;
        r.rax = 0; // no vector arguments, for variadic callees
        r.orig_rax = u64::MAX;
        (r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        r.eflags &= !(TF | DF);
        let out = self.run(tid, &r, Until::Return, func);
        self.restore(tid, &saved, &xsaved, out).map(|r| r.rax)
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
        self.checked("mmap", libc::SYS_mmap, &args)
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
        let len = len.div_ceil(page()) * page();
        let flags = MapFlags::MAP_PRIVATE | MapFlags::MAP_ANONYMOUS | MapFlags::MAP_FIXED_NOREPLACE;
        let mut tried = 0;
        while tried < MAX_TRIES {
            let mappings = maps::read(self.pid)
                .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
            let candidates = near_candidates(&mappings, &code, len);
            let Some(&first) = candidates.first() else { break };
            tried += 1;
            match self.mmap(first, len, prot, flags, -1, 0) {
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
        self.checked("mprotect", libc::SYS_mprotect, &[addr, len, prot.bits() as u64]).map(drop)
    }

    /// Remote `munmap`.
    pub fn munmap(&mut self, addr: u64, len: u64) -> Result<()> {
        self.checked("munmap", libc::SYS_munmap, &[addr, len]).map(drop)
    }

    fn checked(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64> {
        let r = self.syscall(nr, args)?;
        if (-4095..0).contains(&r) {
            Err(Error::RemoteSyscall { name, pid: self.pid, errno: Errno::from_raw(-r as i32) })
        } else {
            Ok(r as u64)
        }
    }

    /// The address of a `syscall` instruction (0f 05) in the target's code: the
    /// vDSO first, then libc, then any executable mapping. Found once, no write needed.
    fn syscall_instruction(&mut self) -> Result<u64> {
        if let Some(a) = self.syscall_insn {
            return Ok(a);
        }
        let mappings = maps::read(self.pid)
            .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
        let rank = |m: &maps::Mapping| match m.name.as_str() {
            "[vdso]" => 0,
            n if n.contains("/libc.so") || n.contains("/libc-") => 1,
            _ => 2,
        };
        let mut exec: Vec<&maps::Mapping> =
            mappings.iter().filter(|m| m.perms.exec && m.name != "[vsyscall]").collect();
        exec.sort_by_key(|m| rank(m));
        for m in exec {
            let Ok(bytes) = self.read_vec(m.start, (m.end - m.start) as usize) else { continue };
            if let Some(i) = bytes.windows(2).position(|w| w == [0x0f, 0x05]) {
                let a = m.start + i as u64;
                self.syscall_insn = Some(a);
                return Ok(a);
            }
        }
        Err(Error::NotFound {
            what: "a syscall instruction".into(),
            pid: self.pid,
            detail: "no executable mapping contains 0f 05".into(),
        })
    }

    /// Sets `regs` on `tid`, lets it run until `until`, and returns its registers then.
    fn run(&mut self, tid: i32, regs: &Regs, until: Until, func: u64) -> Result<Regs> {
        self.set_regs(tid, regs)?;
        // Resumed below without its signal: a held one is re-queued at release.
        self.thread(tid).in_delivery = false;
        let deadline = Instant::now() + self.timeout;
        let req = match until {
            Until::Step(_) => libc::PTRACE_SINGLESTEP,
            Until::Return => libc::PTRACE_CONT,
        };
        loop {
            sys::ptrace(req, tid, 0, 0).map_err(|errno| Error::Ptrace {
                op: super::req_name(req),
                tid,
                errno,
            })?;
            let ev = match wait::event(tid, deadline)? {
                Some(ev) => ev,
                None => return Err(self.stuck(tid)),
            };
            if let Event::Signal(sig) = ev {
                let r = self.regs(tid)?;
                match until {
                    Until::Step(end) if sig == libc::SIGTRAP && r.rip == end => return Ok(r),
                    Until::Return if sig == libc::SIGSEGV && r.rip == RETURN_TRAP => return Ok(r),
                    _ => {}
                }
            }
            // Anything else left (a leftover interrupt, a group-stop): carry on.
            self.remote_stop(tid, ev, func)?;
        }
    }

    /// Deals with a stop of remote code `func` on `tid` as every remote run
    /// does: a new thread is waited for; a fault (SIGSEGV, SIGBUS, SIGILL,
    /// SIGFPE, SIGTRAP) is the code's error; another signal is held for the
    /// target; the process ending or replacing its image ends the run. What
    /// is left (a system-call stop, an interrupt or group stop) is returned.
    pub(super) fn remote_stop(&mut self, tid: i32, ev: Event, func: u64) -> Result<Option<Event>> {
        match ev {
            Event::Stopped | Event::Syscall => return Ok(Some(ev)),
            Event::Clone(new) => {
                self.threads.entry(new).or_default();
                self.wait_stopped([new].into(), "stop")?;
            }
            Event::Signal(sig)
                if matches!(
                    sig,
                    libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP
                ) =>
            {
                let rip = self.regs(tid)?.rip;
                let addr = ptrace::getsiginfo(Pid::from_raw(tid)).map_or(0, |si| sys::fault_addr(&si));
                return Err(Error::RemoteFault { func, tid, signal: sig, rip, addr });
            }
            // Someone else's signal: hold it for the target, run on.
            Event::Signal(sig) => self.thread(tid).pending.push(sig),
            Event::Exiting(status) => {
                self.thread(tid).exit = Some(status);
                return Err(self.exited("remote execution", status));
            }
            Event::Gone(status) => {
                self.threads.remove(&tid);
                return Err(self.exited("remote execution", status));
            }
            Event::Exec => return Err(self.exec_error("remote execution")),
        }
        Ok(None)
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

    /// Restores the saved registers, keeping the first error, and brings the
    /// thread from the stop our code ended in (a SIGTRAP or SIGSEGV of ours,
    /// with the trap flag of a single step still armed in the kernel) back to a
    /// plain interrupt stop: if papirus dies from here on, the kernel resumes the
    /// thread exactly where the target left it, with no signal injected.
    fn restore(&mut self, tid: i32, regs: &Regs, x: &super::XState, out: Result<Regs>) -> Result<Regs> {
        if !self.threads.contains_key(&tid) {
            return out;
        }
        let r1 = self.set_regs(tid, regs);
        let r2 = self.set_xstate(tid, x);
        let r3 = if out.is_ok() { self.settle(tid) } else { Ok(()) };
        let out = out?;
        r1?;
        r2?;
        r3?;
        Ok(out)
    }

    /// Moves `tid` from the signal-delivery stop of our own trap to an interrupt
    /// stop, the signal discarded (PTRACE_CONT also clears single-stepping).
    /// Every signal is blocked for that short resume, so none is dequeued (and
    /// held by us) on the way: the target's signals stay queued in the kernel.
    pub(super) fn settle(&mut self, tid: i32) -> Result<()> {
        let ptrace_err = |op, errno| Error::Ptrace { op, tid, errno };
        let mask = sys::get_sigmask(tid).map_err(|e| ptrace_err("PTRACE_GETSIGMASK", e))?;
        sys::set_sigmask(tid, u64::MAX).map_err(|e| ptrace_err("PTRACE_SETSIGMASK", e))?;
        let stopped = self
            .cont_and_interrupt(tid)
            .and_then(|()| self.wait_stopped([tid].into(), "stop after remote code"));
        let restored = sys::set_sigmask(tid, mask).map_err(|e| ptrace_err("PTRACE_SETSIGMASK", e));
        stopped.and(restored)
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
