//! The C ABI of the runtime: the flush entry point the tool calls before
//! detaching, and the constructor that reads the session file.
//!
//! # Safety
//!
//! The constructor sits in `.init_array` and only registers an `atexit`
//! handler; `papirus_probe_flush` takes no arguments.
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
    if !path.exists() {
        return;
    }
    match crate::setup_from(&path) {
        // SAFETY: registers a plain function that lives as long as the library.
        Ok(_) => unsafe {
            atexit(flush_at_exit);
        },
        Err(e) => eprintln!("papirus-probe-runtime: {e}"),
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;
