//! Which standard streams (descriptors 0, 1, 2) were closed when the
//! process started.
//!
//! Rust's runtime reopens a closed standard descriptor on /dev/null before
//! `main`, so a write to a closed stdout would vanish and a program started
//! from here would find the stream open. A function in `.init_array` runs
//! ahead of that and notes which were closed: a command-line tool refuses a
//! closed stdout, and can give a program it starts its streams as the user
//! left them ([`close_stand_ins_on_exec`]).
//!
//! # Safety
//!
//! The `.init_array` entry is a function of the type the loader calls there
//! (no arguments, no result), called once before `main`; it makes
//! `fcntl(F_GETFD)` calls, which take no pointers, and stores atomics. The
//! module lives in a file of its own so that only programs that ask about
//! their streams link the entry (a library loaded into a target does not).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether descriptor 0, 1, 2 was closed at start.
static CLOSED: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];

extern "C" fn note_closed() {
    for fd in 0..3 {
        // SAFETY: F_GETFD reads a descriptor's flags and touches no memory; it
        // fails (EBADF) when the descriptor is closed.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // ATOMICS: Relaxed; written before `main`, read after.
            CLOSED[fd as usize].store(true, Ordering::Relaxed);
        }
    }
}

// SAFETY: see the module docs.
#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_CLOSED: extern "C" fn() = note_closed;

/// Whether standard descriptor `fd` (0, 1 or 2) was closed when the process
/// started; `false` for any other number.
pub fn closed_at_start(fd: i32) -> bool {
    usize::try_from(fd).ok().and_then(|i| CLOSED.get(i)).is_some_and(|c| c.load(Ordering::Relaxed))
}

/// Makes the /dev/null that stands in for each stream closed at start
/// close-on-exec, so a program started from here finds it closed.
pub fn close_stand_ins_on_exec() {
    for fd in (0..3).filter(|&fd| closed_at_start(fd)) {
        // SAFETY: sets a flag on a descriptor this process holds; no memory is passed.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}
