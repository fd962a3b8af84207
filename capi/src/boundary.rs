//! The panic boundary every exported function runs behind: a Rust panic
//! never unwinds into C and never aborts the process; it becomes
//! `PAPI_EBUG` (or a NULL/zero result), and each error becomes the PAPI code
//! `PAPI_perror` reports.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::Code;

/// The last error any call returned (PAPI keeps one per process).
static LAST: AtomicI32 = AtomicI32::new(0);

/// The code the last failing call returned.
pub fn last_error() -> c_int {
    LAST.load(Ordering::Relaxed)
}

fn failed(c: Code) -> c_int {
    LAST.store(c.value(), Ordering::Relaxed);
    c.value()
}

/// Runs an `int`-returning entry point: its value, or its error code.
pub fn int(f: impl FnOnce() -> Result<c_int, Code>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(c)) => failed(c),
        Err(_) => failed(Code::Ebug),
    }
}

/// Runs an entry point whose C type has no room for an error (a pointer, a
/// time, `void`): `fallback` when it fails or panics.
pub fn value<T>(fallback: T, f: impl FnOnce() -> Result<T, Code>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(c)) => {
            failed(c);
            fallback
        }
        Err(_) => {
            failed(Code::Ebug);
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_ebug_and_the_last_error() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert_eq!(int(|| panic!("a bug")), Code::Ebug.value());
        assert_eq!(last_error(), Code::Ebug.value());
        assert!(value(std::ptr::null::<u8>(), || panic!("a bug")).is_null());
        std::panic::set_hook(prev);
        assert_eq!(int(|| Err(Code::Enoevst)), -11);
        assert_eq!(last_error(), -11);
        assert_eq!(int(|| Ok(3)), 3);
        assert_eq!(value(7i64, || Err(Code::Einval)), 7);
    }
}
