//! Running a function when the process exits normally.
//!
//! Rust runs no destructors for statics, so a library that must write its
//! results at exit (papirus-highlevel's region report) registers a plain
//! function with `atexit(3)`. It runs when `main` returns or
//! `std::process::exit` is called, after the main thread's thread-locals
//! are gone; not on a signal, `abort`, or `_exit`.
//!
//! # Safety
//!
//! `atexit(3)` only stores the function pointer; the pointer is a safe
//! `extern "C" fn()` of the program, valid for the life of the process.
#![allow(unsafe_code)]

use crate::sys::Errno;

/// Registers `f` to run at normal process exit (`atexit(3)`). Handlers run
/// in reverse order of registration. `f` must not unwind: a panic escaping
/// an `extern "C"` function aborts the process.
pub fn at_exit(f: extern "C" fn()) -> Result<(), Errno> {
    // SAFETY: atexit stores a pointer to a function with the required
    // signature that lives as long as the program.
    let ret = unsafe { libc::atexit(f) };
    if ret == 0 { Ok(()) } else { Err(Errno(libc::ENOMEM)) }
}
