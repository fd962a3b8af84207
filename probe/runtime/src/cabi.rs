//! The C ABI of the runtime: the entry points the tool calls inside the
//! stopped target (set-up, teardown), and those a process that loads the
//! library to patch its own functions calls (papirus' calibration). Nothing
//! runs when the library is loaded.
//!
//! # Safety
//!
//! `papirus_probe_setup` reads `len` bytes at `blob`, memory the tool wrote
//! into the target, and `papirus_probe_set_counters` `len` bytes at `blob`;
//! neither writes there.
#![allow(unsafe_code)]

use papirus_probe_abi::{SESSION_MAX_BYTES, Session, SetupCode};

/// Starts a session from the [`Session`] blob at `blob` (`len` bytes).
/// Returns the results segment's memfd (≥ 0) or a negative
/// [`SetupCode`] (`-(ACTIVE_BASE + pid)` when tool `pid` holds a session).
///
/// # Safety
///
/// `blob` must point to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_setup(blob: *const u8, len: usize) -> i64 {
    if blob.is_null() || len > SESSION_MAX_BYTES {
        return SetupCode::BadSession as i64;
    }
    // SAFETY: the caller passes `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(blob, len) };
    // A panic must not unwind into the tool's remote call frame.
    std::panic::catch_unwind(|| match Session::from_bytes(bytes) {
        Ok(s) => match crate::setup(&s) {
            Ok(fd) => i64::from(fd),
            Err(code) => code,
        },
        Err(code) => code as i64,
    })
    .unwrap_or(SetupCode::BadSession as i64)
}

/// Ends the session and unmaps the results segment (see [`crate::teardown`]). Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn papirus_probe_teardown() -> i64 {
    crate::teardown()
}

/// In-process use (papirus' calibration loads the library and patches its
/// own functions): sets this process up with `capacity` function ids and
/// probe `probe` (0 empty, 1 wallclock, 2 counters). Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn papirus_probe_local_init(capacity: u64, probe: u32) -> i64 {
    crate::init(capacity, probe_of(probe));
    0
}

/// In-process use: turns tracing on (non-zero) or off (as [`crate::set_tracing`]).
#[unsafe(no_mangle)]
pub extern "C" fn papirus_probe_set_tracing(on: u32) {
    crate::set_tracing(on != 0);
}

/// In-process use: the results segment's address; its length in words goes
/// to `*words` (0 and 0 before set-up).
///
/// # Safety
///
/// `words` must point to a writable `u64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_local_segment(words: *mut u64) -> u64 {
    let w = crate::segment_words();
    if !words.is_null() {
        // SAFETY: the caller passes a writable u64.
        unsafe { words.write(w.len() as u64) };
    }
    w.as_ptr() as u64
}

/// In-process use: switches the probe for calls from now on (as [`crate::set_probe`]).
#[unsafe(no_mangle)]
pub extern "C" fn papirus_probe_set_probe(probe: u32) {
    crate::set_probe(probe_of(probe));
}

/// In-process use: the counters probe's events and the TSC's rate, `len`
/// bytes at `blob` of a JSON [`CounterSetup`](papirus_probe_abi::CounterSetup)
/// the caller resolved (as [`crate::set_counters`]). Returns 0 or -1.
///
/// # Safety
///
/// `blob` must point to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_set_counters(blob: *const u8, len: usize) -> i64 {
    if blob.is_null() || len > SESSION_MAX_BYTES {
        return -1;
    }
    // SAFETY: the caller passes `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(blob, len) };
    std::panic::catch_unwind(|| match serde_json::from_slice(bytes) {
        Ok(setup) => crate::set_counters(&setup).map_or(-1, |()| 0),
        Err(_) => -1,
    })
    .unwrap_or(-1)
}

fn probe_of(v: u32) -> crate::Probe {
    match v {
        0 => crate::Probe::Empty,
        2 => crate::Probe::Counters,
        _ => crate::Probe::Wallclock,
    }
}
