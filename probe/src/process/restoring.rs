//! Remote code that restores its thread by itself.
//!
//! Before remote code runs, the thread's own state (registers, vector state,
//! signal mask) is written as a signal frame at the top of a private stack
//! (the code runs on that stack, never on the target's), and the code ends in
//! a stub that executes `rt_sigreturn` on that frame:
//!
//! ```text
//! stub+0:  syscall                 ; entry of a remote system call
//! stub+2:  mov %rax,-8(%rsp)       ; entry of a remote function's return: keep its result
//! stub+7:  mov $15,%eax
//! stub+12: syscall                 ; rt_sigreturn: back to the thread's own state
//! ```
//!
//! papirus follows the thread through its system-call stops (`PTRACE_SYSCALL`)
//! and reads the result at the `rt_sigreturn` entry. If papirus dies at any
//! moment, no trap, fault or signal of ours is left for the thread to hit: it
//! finishes the remote code and restores itself. While it runs, every signal is
//! blocked (the frame's mask restores the thread's own), so the target's
//! handlers never run on our context.
//!
//! `rt_sigreturn` resets the thread's restart block and cannot restart a
//! syscall by itself, so the frame holds a syscall the thread was in
//! (`-ERESTARTSYS`, `-ERESTARTNOINTR`, `-ERESTARTNOHAND`) already rewound to
//! its restart, as the kernel would do on resume; papirus then sets the exact
//! registers back. A thread in a sleep restarted through the restart block
//! (`-ERESTART_RESTARTBLOCK`) would lose its deadline: it never runs code this
//! way (see [`Process::call`]).
//!
//! The stub page and the stack are mapped by the first remote operation and
//! unmapped when the process is released; those system calls run by a single
//! step.

use std::time::Instant;

use super::wait::{self, Event};
use super::{Process, Regs, sys};
use crate::error::{Error, Result};

const STUB: [u8; 14] = [0x0f, 0x05, 0x48, 0x89, 0x44, 0x24, 0xf8, 0xb8, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// Entry for a system call, return address for a function, end of the stub.
pub(super) const STUB_SYSCALL: u64 = 0;
pub(super) const STUB_RETURN: u64 = 2;
const STUB_END: u64 = 14;

/// The stub page and, above it, the stack remote code runs on: the target's
/// own stacks are never written (a thread may be on a small sigaltstack or a
/// coroutine stack with no room below its rsp).
const REGION: u64 = 4096 + 256 * 1024;

/// `rt_sigreturn`.
const SYS_RT_SIGRETURN: u64 = 15;
/// `struct ucontext` (kernel layout): flags, link, stack, mcontext, sigmask.
const UC_SIZE: u64 = 304;
const UC_STACK_FLAGS: usize = 24;
const UC_MCONTEXT: usize = 40;
const UC_SIGMASK: usize = 296;
/// uc_flags: the frame has an XSAVE area, and saves ss which is restored as is.
const UC_FLAGS: u64 = 0x1 | 0x2 | 0x4;
/// An invalid `ss_flags`: `rt_sigreturn` then leaves the thread's alternate
/// signal stack as it is (the kernel ignores every error of that step but EFAULT).
const SS_LEAVE_AS_IS: u32 = 3;
/// Offsets in the XSAVE area: the software bytes the kernel checks in a signal frame.
const SW_BYTES: usize = 464;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// The 64-bit user code segment.
const USER_CS: u64 = 0x33;
/// Restart codes the frame rewinds (the kernel's -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND).
const REWOUND: [i64; 3] = [-512, -513, -514];

/// A signal frame built from a thread's state.
struct Frame {
    /// Address of the return-address slot (`rsp` at a function's entry).
    at: u64,
    bytes: Vec<u8>,
}

/// The frame for `saved` (general registers), `xstate` (as PTRACE_GETREGSET
/// gives it) and `mask`, placed below `top`.
fn frame(saved: &Regs, xstate: &[u8], mask: u64, top: u64) -> Option<Frame> {
    let len = xstate.len() as u64;
    if xstate.len() < SW_BYTES + 48 {
        return None;
    }
    let fp = (top.checked_sub(len + 4)?) & !63;
    // The ucontext 16-aligned right after the slot: the slot is ≡ 8 (mod 16), as after a call.
    let uc = (fp.checked_sub(UC_SIZE)?) & !15;
    let at = uc - 8;
    let mut b = vec![0u8; (fp + len + 4 - at) as usize];
    let put = |b: &mut Vec<u8>, off: u64, v: u64| {
        b[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes())
    };
    let mut r = *saved;
    if (r.orig_rax as i64) >= 0 && REWOUND.contains(&(r.rax as i64)) {
        r.rax = r.orig_rax;
        r.rip = r.rip.wrapping_sub(2);
    }
    let u = uc - at;
    put(&mut b, u, UC_FLAGS);
    b[(u as usize + UC_STACK_FLAGS)..(u as usize + UC_STACK_FLAGS + 4)]
        .copy_from_slice(&SS_LEAVE_AS_IS.to_le_bytes());
    let m = u + UC_MCONTEXT as u64;
    for (i, v) in [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx, r.rax,
        r.rcx, r.rsp, r.rip, r.eflags,
    ]
    .into_iter()
    .enumerate()
    {
        put(&mut b, m + 8 * i as u64, v);
    }
    // cs, gs, fs, ss as four 16-bit words.
    put(&mut b, m + 144, USER_CS | (r.ss & 0xffff) << 48);
    put(&mut b, m + 184, fp);
    put(&mut b, u + UC_SIGMASK as u64, mask);
    let f = (fp - at) as usize;
    b[f..f + xstate.len()].copy_from_slice(xstate);
    // The software bytes: in the ptrace layout the first word holds XCR0.
    let xcr0 = u64::from_le_bytes(xstate[SW_BYTES..SW_BYTES + 8].try_into().ok()?);
    let sw = f + SW_BYTES;
    b[sw..sw + 48].fill(0);
    b[sw..sw + 4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    b[sw + 4..sw + 8].copy_from_slice(&(len as u32 + 4).to_le_bytes());
    b[sw + 8..sw + 16].copy_from_slice(&xcr0.to_le_bytes());
    b[sw + 16..sw + 20].copy_from_slice(&(len as u32).to_le_bytes());
    b[f + xstate.len()..f + xstate.len() + 4].copy_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    Some(Frame { at, bytes: b })
}

impl Process {
    /// The stub page and the private stack above it, mapped at the first use.
    pub(super) fn stub(&mut self) -> Result<u64> {
        if let Some(s) = self.stub {
            return Ok(s);
        }
        let checked = |name, r: i64, pid| {
            if (-4095..0).contains(&r) {
                Err(Error::RemoteSyscall { name, pid, errno: nix::errno::Errno::from_raw(-r as i32) })
            } else {
                Ok(r as u64)
            }
        };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let page = self.stepped_syscall(libc::SYS_mmap, &[0, REGION, rw, flags as u64, u64::MAX, 0])?;
        let page = checked("mmap", page, self.pid)?;
        let rx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let protected = self
            .write_memory(page, &STUB)
            .and_then(|()| self.stepped_syscall(libc::SYS_mprotect, &[page, 4096, rx]))
            .and_then(|r| checked("mprotect", r, self.pid));
        if let Err(e) = protected {
            let _ = self.stepped_syscall(libc::SYS_munmap, &[page, REGION]);
            return Err(e);
        }
        self.stub = Some(page);
        Ok(page)
    }

    /// Unmaps the stub page (best effort, when a thread can still run code).
    pub(super) fn drop_stub(&mut self) {
        if let Some(page) = self.stub.take()
            && self.usable(self.worker).is_ok()
        {
            let _ = self.stepped_syscall(libc::SYS_munmap, &[page, REGION]);
        }
    }

    /// Runs `regs` (rip at `entry`, arguments set) on `tid` with its own state in
    /// a signal frame and `ret` as the code's return address (for a function);
    /// returns rax at the end of the remote code. `tid` ends in an interrupt stop
    /// with its exact registers.
    pub(super) fn run_restoring(&mut self, tid: i32, mut regs: Regs, entry: u64) -> Result<u64> {
        let stub = self.stub()?;
        let saved = self.regs(tid)?;
        let xsaved = self.xstate(tid)?;
        let mask =
            sys::get_sigmask(tid).map_err(|errno| Error::Ptrace { op: "PTRACE_GETSIGMASK", tid, errno })?;
        let f =
            frame(&saved, xsaved.as_bytes(), mask, stub + REGION).ok_or_else(|| Error::InvalidArgument {
                what: format!(
                    "thread {tid}: an XSAVE area of {} bytes is too small",
                    xsaved.as_bytes().len()
                ),
            })?;
        self.write_memory(f.at, &f.bytes)?;
        let syscall = entry == stub + STUB_SYSCALL;
        if syscall {
            regs.rsp = f.at + 8;
        } else {
            self.write_u64(f.at, stub + STUB_RETURN)?;
            regs.rsp = f.at;
        }
        regs.rip = entry;
        regs.orig_rax = u64::MAX;
        regs.eflags &= !((1 << 8) | (1 << 10));
        sys::set_sigmask(tid, u64::MAX).map_err(|errno| Error::Ptrace {
            op: "PTRACE_SETSIGMASK",
            tid,
            errno,
        })?;
        self.set_regs(tid, &regs)?;
        self.thread(tid).in_delivery = false;
        let out = self.follow(tid, stub + STUB_END, f.at);
        // Exact registers, vector state and mask again: the frame held the
        // syscall rewound, papirus restores it as the kernel left it.
        if self.threads.contains_key(&tid) {
            let r1 = self.set_regs(tid, &saved);
            let r2 = self.set_xstate(tid, &xsaved);
            let r3 = sys::set_sigmask(tid, mask).map_err(|errno| Error::Ptrace {
                op: "PTRACE_SETSIGMASK",
                tid,
                errno,
            });
            let r4 = if out.is_ok() { self.settle(tid) } else { Ok(()) };
            let v = out?;
            r1?;
            r2?;
            r3?;
            r4?;
            return Ok(v);
        }
        out
    }

    /// Follows `tid` through its system calls until `rt_sigreturn` at `end` has
    /// run; returns the result the stub left at `slot`.
    fn follow(&mut self, tid: i32, end: u64, slot: u64) -> Result<u64> {
        let deadline = Instant::now() + self.timeout;
        let mut result = None;
        loop {
            sys::ptrace(libc::PTRACE_SYSCALL, tid, 0, 0).map_err(|errno| Error::Ptrace {
                op: "PTRACE_SYSCALL",
                tid,
                errno,
            })?;
            let Some(ev) = wait::event(tid, deadline)? else {
                return Err(self.stuck(tid));
            };
            // Every other signal is blocked: a fault is the remote code's; SIGSTOP,
            // which cannot be blocked, is held for the target.
            if self.remote_stop(tid, ev, end)? == Some(Event::Syscall) {
                if let Some(v) = result {
                    // The exit stop of rt_sigreturn: the thread is itself again.
                    return Ok(v);
                }
                let r = self.regs(tid)?;
                if r.orig_rax == SYS_RT_SIGRETURN && r.rip == end {
                    result = Some(self.read_u64(slot)?);
                }
            }
        }
    }
}
