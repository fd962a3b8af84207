//! Raw system calls of process control that nix does not wrap in a way we can use:
//! wait statuses with real-time signals, ptrace requests carrying any signal
//! number, the XSAVE register set, and the child half of fork + execve.
//!
//! # Safety
//!
//! Every block calls one libc function with pointers to live, correctly sized
//! local buffers; the kernel writes at most the length we pass. The child half
//! of [`fork_exec`] runs after `fork` in a copy of a possibly multi-threaded
//! process, so it calls only async-signal-safe functions on memory prepared
//! before the fork, and never returns.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::RawFd;

use nix::errno::Errno;

/// `NT_X86_XSTATE`: the XSAVE area register set.
const NT_X86_XSTATE: libc::c_int = 0x202;

/// The largest XSAVE area we accept (AMX-capable CPUs need about 11 KiB).
const XSTATE_MAX: usize = 16 * 1024;

/// One raw ptrace request; `data` carries a signal number for CONT, DETACH, SYSCALL.
pub(super) fn ptrace(req: libc::c_uint, tid: i32, addr: u64, data: u64) -> Result<libc::c_long, Errno> {
    Errno::clear();
    // SAFETY: the requests used through this helper (CONT, DETACH, SYSCALL,
    // INTERRUPT) take no pointers; addr and data are plain integers.
    let r = unsafe { libc::ptrace(req, tid, addr as *mut libc::c_void, data as *mut libc::c_void) };
    if r == -1 { Err(Errno::last()) } else { Ok(r) }
}

/// `waitpid(tid, &status, flags)`: `Ok(None)` when nothing is to report (WNOHANG).
pub(super) fn waitpid(tid: i32, flags: libc::c_int) -> Result<Option<libc::c_int>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: status is a live local int.
    let r = unsafe { libc::waitpid(tid, &mut status, flags) };
    match r {
        -1 => Err(Errno::last()),
        0 => Ok(None),
        _ => Ok(Some(status)),
    }
}

/// The thread's XSAVE area (PTRACE_GETREGSET NT_X86_XSTATE), at the kernel's size.
pub(super) fn get_xstate(tid: i32) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; XSTATE_MAX];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: iov describes buf, which outlives the call; the kernel writes at most
    // iov_len bytes and shrinks iov_len to what it wrote.
    let r = unsafe {
        libc::ptrace(libc::PTRACE_GETREGSET, tid, NT_X86_XSTATE as usize as *mut libc::c_void, &mut iov)
    };
    if r == -1 {
        return Err(Errno::last());
    }
    buf.truncate(iov.iov_len);
    Ok(buf)
}

/// Sets the thread's XSAVE area; `area` must be the size `get_xstate` returned.
pub(super) fn set_xstate(tid: i32, area: &[u8]) -> Result<(), Errno> {
    let mut copy = area.to_vec();
    let mut iov = libc::iovec { iov_base: copy.as_mut_ptr().cast(), iov_len: copy.len() };
    // SAFETY: iov describes copy, which outlives the call; the kernel only reads it.
    let r = unsafe {
        libc::ptrace(libc::PTRACE_SETREGSET, tid, NT_X86_XSTATE as usize as *mut libc::c_void, &mut iov)
    };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// A stopped thread's blocked-signal mask (PTRACE_GETSIGMASK), the kernel's 64-bit set.
pub(super) fn get_sigmask(tid: i32) -> Result<u64, Errno> {
    let mut mask = 0u64;
    // SAFETY: data points to a live u64 and addr gives its size, as the request requires.
    let r = unsafe {
        libc::ptrace(libc::PTRACE_GETSIGMASK, tid, 8usize as *mut libc::c_void, &mut mask as *mut u64)
    };
    if r == -1 { Err(Errno::last()) } else { Ok(mask) }
}

/// Sets a stopped thread's blocked-signal mask (PTRACE_SETSIGMASK); the kernel
/// never blocks SIGKILL or SIGSTOP whatever the set says.
pub(super) fn set_sigmask(tid: i32, mask: u64) -> Result<(), Errno> {
    // SAFETY: data points to a live u64 and addr gives its size; the kernel only reads it.
    let r = unsafe {
        libc::ptrace(libc::PTRACE_SETSIGMASK, tid, 8usize as *mut libc::c_void, &mask as *const u64)
    };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// `tgkill(pid, tid, sig)`: re-queues a signal we held back while the thread was stopped.
pub(super) fn tgkill(pid: i32, tid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: a plain system call with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// The fault address of a SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGTRAP siginfo.
pub(super) fn fault_addr(si: &libc::siginfo_t) -> u64 {
    // SAFETY: si is a fully initialised siginfo from PTRACE_GETSIGINFO; for fault
    // signals the kernel fills the si_addr member of the union.
    unsafe { si.si_addr() as u64 }
}

/// What the child does between fork and execve; everything is prepared before the fork.
pub(super) struct ChildPlan<'a> {
    /// The program path.
    pub path: &'a CString,
    /// NULL-terminated argv.
    pub argv: &'a [*const libc::c_char],
    /// NULL-terminated envp.
    pub envp: &'a [*const libc::c_char],
    /// (fd to install, target 0/1/2) pairs.
    pub stdio: &'a [(RawFd, RawFd)],
    /// Descriptors the child closes at once (the parent's pipe ends).
    pub close: &'a [RawFd],
    /// The child blocks reading one byte here until the parent has seized it.
    pub go: RawFd,
    /// Close-on-exec pipe where the child writes execve's errno on failure.
    pub err: RawFd,
}

/// Forks; the child waits on `plan.go`, then execs `plan.path`. Returns the child's pid.
pub(super) fn fork_exec(plan: &ChildPlan<'_>) -> Result<i32, Errno> {
    // SAFETY: fork has no memory-safety preconditions of its own; the child path
    // below only calls async-signal-safe functions (dup2, sigprocmask, signal,
    // read, execve, write, _exit) on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(Errno::last()),
        0 => {
            // SAFETY: child after fork, see above; _exit never returns.
            unsafe { child(plan) }
        }
        pid => Ok(pid),
    }
}

/// # Safety
/// Only in the child right after `fork`.
unsafe fn child(plan: &ChildPlan<'_>) -> ! {
    // SAFETY: async-signal-safe calls on valid pointers prepared before fork.
    unsafe {
        for &fd in plan.close {
            libc::close(fd);
        }
        for &(fd, target) in plan.stdio {
            if libc::dup2(fd, target) == -1 {
                report(plan.err);
            }
        }
        // A clean start: no blocked signals, SIGPIPE back to default (the Rust runtime ignores it).
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut byte = 0u8;
        while libc::read(plan.go, (&mut byte as *mut u8).cast(), 1) == -1
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        report(plan.err)
    }
}

/// # Safety
/// Only in the child: writes errno to the error pipe and exits.
unsafe fn report(err: RawFd) -> ! {
    // SAFETY: errno location is valid for the current thread; write and _exit are async-signal-safe.
    unsafe {
        let e: i32 = *libc::__errno_location();
        libc::write(err, (&e as *const i32).cast(), 4);
        libc::_exit(127)
    }
}
