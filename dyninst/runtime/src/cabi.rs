//! The C ABI of the runtime: the set-up and flush entry points the tool calls
//! inside the target, and the constructor that reads a session file named by
//! the environment.
//!
//! # Safety
//!
//! The constructor sits in `.init_array` and only registers an `atexit`
//! handler; `papirus_probe_flush` takes no arguments; `papirus_probe_setup`
//! reads the NUL-terminated path the tool wrote into the target.
#![allow(unsafe_code)]

use std::path::PathBuf;

/// Writes the report now (the tool calls it before detaching). Returns 0, or
/// -1 when the report cannot be written (the reason goes to stderr).
#[unsafe(no_mangle)]
pub extern "C" fn papirus_probe_flush() -> i32 {
    match crate::flush() {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("papirus-probe-runtime: {e}");
            -1
        }
    }
}

/// Sets the runtime up from the session file at `path` (a NUL-terminated
/// string) and registers the report for exit. Returns 0, or -1 with the
/// reason on stderr. The tool calls it inside the target.
///
/// # Safety
///
/// `path` must point to a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_setup(path: *const std::ffi::c_char) -> i32 {
    // SAFETY: the caller passes a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    let path = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()));
    setup_and_register(&path)
}

fn setup_and_register(path: &std::path::Path) -> i32 {
    match crate::setup_from(path) {
        Ok(_) => {
            // SAFETY: registers a plain function that lives as long as the library.
            unsafe { atexit(flush_at_exit) };
            0
        }
        Err(e) => {
            eprintln!("papirus-probe-runtime: {e}");
            -1
        }
    }
}

extern "C" fn flush_at_exit() {
    papirus_probe_flush();
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

extern "C" fn constructor() {
    let path = match std::env::var_os("PAPIRUS_PROBE_SESSION") {
        Some(p) => PathBuf::from(p),
        None => crate::injected_session_path(std::process::id()),
    };
    if path.exists() {
        setup_and_register(&path);
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;
