//! Bounded waits for ptrace stops, and their classification.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

use super::{Exit, sys};
use crate::error::{Error, Result};

/// What a thread reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// PTRACE_EVENT_STOP: our interrupt, a group-stop, or the first stop of an auto-attached thread.
    Stopped,
    /// A signal-delivery stop: the signal is held until we resume the thread.
    Signal(i32),
    /// A system-call entry or exit stop (after PTRACE_SYSCALL).
    Syscall,
    /// The thread created this new thread (auto-attached, it reports its own stop).
    Clone(i32),
    /// The thread stopped on its way out.
    Exiting(Exit),
    /// The process completed an execve.
    Exec,
    /// The thread (or, for the leader, the process) ended and has been reaped.
    Gone(Exit),
}

/// Polls `waitpid(tid)` with `flags | WNOHANG` until it reports or `deadline` passes,
/// sleeping between polls from 5 µs up to 200 µs. No `sched_yield`: on a loaded
/// machine a yielding tracer waits behind every runnable task and a stop that
/// takes 7 ms to report with a blocking wait took 40 ms to notice.
pub(super) fn poll(tid: i32, flags: libc::c_int, deadline: Instant) -> Result<Option<i32>> {
    let mut pause = Duration::from_micros(5);
    loop {
        match sys::waitpid(tid, flags | libc::WNOHANG) {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => return Err(Error::Ptrace { op: "waitpid", tid, errno: Errno::ECHILD }),
            Err(errno) => return Err(Error::Ptrace { op: "waitpid", tid, errno }),
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(200));
    }
}

/// Waits for the next event of one traced thread; `None` on timeout.
pub(super) fn event(tid: i32, deadline: Instant) -> Result<Option<Event>> {
    let status = match poll(tid, libc::__WALL, deadline) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        // Not (or no longer) waitable: the thread is gone and was reaped elsewhere.
        Err(Error::Ptrace { errno: Errno::ECHILD, .. }) => return Ok(Some(Event::Gone(Exit::Unknown))),
        Err(e) => return Err(e),
    };
    Ok(Some(classify(tid, status)))
}

pub(super) fn classify(tid: i32, status: i32) -> Event {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Event::Gone(Exit::from_wait_status(status));
    }
    if !libc::WIFSTOPPED(status) {
        return Event::Stopped;
    }
    let sig = libc::WSTOPSIG(status);
    let msg = || ptrace::getevent(Pid::from_raw(tid)).unwrap_or(0);
    match status >> 16 {
        0 if sig == libc::SIGTRAP | 0x80 => Event::Syscall,
        0 => Event::Signal(sig),
        libc::PTRACE_EVENT_CLONE => Event::Clone(msg() as i32),
        libc::PTRACE_EVENT_EXIT => Event::Exiting(Exit::from_wait_status(msg() as i32)),
        libc::PTRACE_EVENT_EXEC => Event::Exec,
        _ => Event::Stopped,
    }
}
