//! Raw system calls of process control that nix does not wrap in a way we can use:
//! wait statuses with real-time signals, ptrace requests carrying any signal
//! number, the XSAVE register set, a PTRACE_SEIZE that gives up, and the
//! child half of fork + execve.
//!
//! # Safety
//!
//! Every block calls one libc function with pointers to live, correctly sized
//! local buffers; the kernel writes at most the length we pass. The signal
//! handler of [`seize_bounded`] touches only the interrupted context the
//! kernel hands it and a constant-initialised thread-local flag. The child half
//! of [`fork_exec`] runs after `fork` in a copy of a possibly multi-threaded
//! process, so it calls only async-signal-safe functions on memory prepared
//! before the fork, and never returns.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::time::Duration;

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

thread_local! {
    /// This thread is inside [`seize_bounded`]'s PTRACE_SEIZE.
    static SEIZING: Cell<bool> = const { Cell::new(false) };
}

/// The signal that cuts a PTRACE_SEIZE short: papirus uses it for nothing
/// else, and installs its handler only while the process left it alone.
fn abort_signal() -> libc::c_int {
    libc::SIGRTMAX()
}

/// Ends a PTRACE_SEIZE that waits: the kernel has rewound the call for its
/// restart (-ERESTARTNOINTR: rip on its `syscall`, rax its number), so the
/// context returns EINTR past it instead.
extern "C" fn on_abort(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if !SEIZING.with(Cell::get) {
        return;
    }
    // SAFETY: the kernel passes the interrupted thread's ucontext; rip points
    // at code of this thread, readable; only the saved registers change.
    unsafe {
        let g = &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs;
        let (rax, rip) = (libc::REG_RAX as usize, libc::REG_RIP as usize);
        if g[rax] == libc::SYS_ptrace && *(g[rip] as *const [u8; 2]) == [0x0f, 0x05] {
            g[rax] = -(libc::EINTR as i64);
            g[rip] += 2;
        }
    }
}

/// Whether [`on_abort`] is the abort signal's handler (installed at the first use).
fn abort_handler() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction with a zeroed, then filled, struct; the old
        // disposition is only read; the handler is async-signal-safe.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(abort_signal(), std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return false;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_abort as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(abort_signal(), &sa, std::ptr::null_mut()) == 0
        }
    })
}

/// PTRACE_SEIZE of `tid`, given up with EINTR when it waits longer than
/// `limit`. The kernel makes a seize wait while the process is inside
/// execve, and the execve waits for its tracer to let go of the threads it
/// kills: a seize that waited for ever there would never return.
pub(super) fn seize_bounded(tid: i32, options: libc::c_int, limit: Duration) -> Result<(), Errno> {
    let seize = || {
        // SAFETY: PTRACE_SEIZE takes no pointers; data carries the options.
        let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, options as usize) };
        if r == -1 { Err(Errno::last()) } else { Ok(()) }
    };
    if !abort_handler() {
        return seize();
    }
    // SAFETY: timer_create with a zeroed sigevent naming this thread; the
    // timer is deleted before returning.
    let timer = unsafe {
        let mut ev: libc::sigevent = std::mem::zeroed();
        ev.sigev_notify = libc::SIGEV_THREAD_ID;
        ev.sigev_signo = abort_signal();
        ev.sigev_notify_thread_id = libc::gettid();
        let mut t: libc::timer_t = std::ptr::null_mut();
        (libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut t) == 0).then_some(t)
    };
    let Some(timer) = timer else { return seize() };
    let every =
        libc::timespec { tv_sec: limit.as_secs() as libc::time_t, tv_nsec: limit.subsec_nanos().into() };
    let spec = libc::itimerspec { it_interval: every, it_value: every };
    SEIZING.with(|s| s.set(true));
    // SAFETY: arms the timer created above with a live spec.
    unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) };
    let r = seize();
    SEIZING.with(|s| s.set(false));
    // SAFETY: deletes the timer created above (a signal it already queued finds SEIZING false).
    unsafe { libc::timer_delete(timer) };
    r
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
