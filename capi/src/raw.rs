//! Every dereference of a pointer a C caller handed in, and every call of a
//! C function pointer, is here.
//!
//! The wrappers are built by `unsafe` constructors at the exported
//! functions, whose `// SAFETY:` comments cite PAPI's contract for that
//! argument (NULL, or valid for what PAPI's documentation says); after
//! that, the wrappers' methods are safe and check NULL themselves.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_ulong, c_void};

use crate::Code;

/// A nullable pointer to one `T` the caller lets PAPI read or write.
#[derive(Debug)]
pub struct Ptr<T>(*mut T);

impl<T: Copy> Ptr<T> {
    /// # Safety
    /// `p` is NULL or valid for reads and writes of a `T` for the call.
    pub unsafe fn new(p: *mut T) -> Ptr<T> {
        Ptr(p)
    }

    /// Whether the caller passed NULL.
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The value, or EINVAL for NULL.
    pub fn get(&self) -> Result<T, Code> {
        if self.0.is_null() {
            return Err(Code::Einval);
        }
        // SAFETY: non-NULL, and valid for reads by the constructor's contract.
        Ok(unsafe { self.0.read_unaligned() })
    }

    /// Stores `v`, or EINVAL for NULL.
    pub fn set(&self, v: T) -> Result<(), Code> {
        if self.0.is_null() {
            return Err(Code::Einval);
        }
        // SAFETY: non-NULL, and valid for writes by the constructor's contract.
        unsafe { self.0.write_unaligned(v) };
        Ok(())
    }
}

/// A caller's array (NULL allowed where PAPI allows it), whose length the
/// PAPI call's contract fixes: `PAPI_num_events(EventSet)` values for
/// `PAPI_read`, `number` codes for `PAPI_add_events`, and so on.
#[derive(Debug)]
pub struct Array<T>(*mut T);

impl<T> Array<T> {
    /// # Safety
    /// `p` is NULL or valid for reads and writes of as many `T`s as the
    /// contract of the PAPI call it came from promises, and not aliased by
    /// anything Rust holds, for the call.
    pub unsafe fn new(p: *mut T) -> Array<T> {
        Array(p)
    }

    /// Whether the caller passed NULL.
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The first `len` elements (the length the call's contract gives), or
    /// EINVAL for NULL.
    pub fn slice(&mut self, len: usize) -> Result<&mut [T], Code> {
        if self.0.is_null() {
            return Err(Code::Einval);
        }
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: non-NULL and valid for `len` elements by the constructor's
        // contract; the borrow of `self` keeps the slice unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.0, len) })
    }
}

/// A NUL-terminated string from the caller: `None` for NULL. Invalid UTF-8
/// is replaced (event and region names are ASCII in practice).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
pub unsafe fn c_str<'a>(p: *const c_char) -> Option<std::borrow::Cow<'a, str>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

/// A Fortran `CHARACTER` argument: `len` bytes, blank-padded, no NUL.
///
/// # Safety
/// `p` is NULL or valid for reads of `len` bytes.
pub unsafe fn fortran_str(p: *const c_char, len: usize) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: valid for `len` bytes by the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(len);
    Some(String::from_utf8_lossy(&bytes[..end]).trim_end().to_string())
}

/// Where a C caller wants a string: `cap` bytes at `p`.
#[derive(Debug)]
pub struct StrOut {
    ptr: *mut c_char,
    cap: usize,
}

impl StrOut {
    /// # Safety
    /// `p` is NULL or valid for writes of `cap` bytes.
    pub unsafe fn new(p: *mut c_char, cap: usize) -> StrOut {
        StrOut { ptr: p, cap }
    }

    /// Writes `s` NUL-terminated (truncated to fit), or EINVAL for NULL.
    pub fn put(&self, s: &str) -> Result<(), Code> {
        if self.ptr.is_null() || self.cap == 0 {
            return Err(Code::Einval);
        }
        let n = s.len().min(self.cap - 1);
        // SAFETY: `n + 1 <= cap` bytes, valid for writes by the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), self.ptr, n);
            *self.ptr.add(n) = 0;
        }
        Ok(())
    }

    /// Writes `s` blank-padded to `cap` bytes, as Fortran expects.
    pub fn put_padded(&self, s: &str) {
        if self.ptr.is_null() {
            return;
        }
        let n = s.len().min(self.cap);
        // SAFETY: at most `cap` bytes, valid for writes by the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), self.ptr, n);
            std::ptr::write_bytes(self.ptr.add(n), b' ', self.cap - n);
        }
    }
}

/// A thread-id function given to `PAPI_thread_init`.
pub type IdFn = unsafe extern "C" fn() -> c_ulong;

/// The thread-id function stored at address `a` (0: none).
pub fn id_fn_at(a: usize) -> Option<IdFn> {
    if a == 0 {
        return None;
    }
    // SAFETY: the only non-zero addresses stored are `IdFn`s that
    // PAPI_thread_init received (state::thread_init), converted with `as`.
    Some(unsafe { std::mem::transmute::<usize, IdFn>(a) })
}

/// Calls the application's thread-id function.
pub fn call_id_fn(f: IdFn) -> c_ulong {
    // SAFETY: PAPI_thread_init's contract: a function callable from any
    // thread the application lets use PAPI, taking no argument.
    unsafe { f() }
}

/// `PAPI_overflow_handler_t`.
pub type OverflowFn = unsafe extern "C" fn(c_int, *mut c_void, i64, *mut c_void);

/// Calls the application's overflow handler (in signal context).
pub fn call_overflow(f: OverflowFn, set: c_int, address: u64, vector: u64, context: usize) {
    // SAFETY: PAPI_overflow's contract: a handler callable in signal context
    // with the set, the interrupted address, the vector and the ucontext.
    unsafe { f(set, address as *mut c_void, vector as i64, context as *mut c_void) }
}

/// A profil buffer in the caller's memory: `buckets` counters of `width`
/// bytes at address `base` (kept as an address so tables holding it stay
/// `Send`; PAPI's contract keeps the buffer alive while profiling).
#[derive(Clone, Copy, Debug)]
pub struct ProfilBuffer {
    /// The buffer's address.
    pub base: usize,
    /// Its number of buckets.
    pub buckets: usize,
    /// Bytes per bucket: 2, 4 or 8.
    pub width: usize,
}

impl ProfilBuffer {
    /// Adds `n` to bucket `i`, saturating as the bucket width allows.
    pub fn add(&self, i: usize, n: u64) {
        if i >= self.buckets || self.base == 0 || n == 0 {
            return;
        }
        let at = self.base + i * self.width;
        // SAFETY: `i < buckets`; PAPI_profil/PAPI_sprofil's contract is that
        // the buffer holds `buckets` counters of `width` bytes and stays
        // valid until profiling is turned off or the set is cleaned up.
        unsafe {
            match self.width {
                2 => {
                    let p = at as *mut u16;
                    p.write_unaligned(
                        p.read_unaligned().saturating_add(u16::try_from(n).unwrap_or(u16::MAX)),
                    );
                }
                4 => {
                    let p = at as *mut u32;
                    p.write_unaligned(
                        p.read_unaligned().saturating_add(u32::try_from(n).unwrap_or(u32::MAX)),
                    );
                }
                _ => {
                    let p = at as *mut u64;
                    p.write_unaligned(p.read_unaligned().saturating_add(n));
                }
            }
        }
    }
}

/// The first 16 bytes of a `PAPI_option_t` as four ints: every member the
/// options read (`{eventset, value}`, `{def_cidx, eventset, value}`, the
/// itimer, the attach option's int and unsigned long) lies in them.
pub fn union_ints(o: &crate::types::Option_) -> [c_int; 4] {
    // SAFETY: the union is 264 bytes of plain data (ints, chars, pointers,
    // no padding rules for reads of int); any bit pattern is a valid int,
    // and the source came from the caller's memory or a zeroed value.
    unsafe { std::ptr::read_unaligned((o as *const crate::types::Option_).cast::<[c_int; 4]>()) }
}

/// A Fortran argument: gfortran passes every argument by reference.
#[derive(Clone, Copy, Debug)]
pub struct F(*mut c_void);

impl F {
    /// # Safety
    /// `p` points to a variable of the type PAPI's Fortran interface
    /// declares for this argument (INTEGER, INTEGER*8, REAL, an array of
    /// them sized as the call requires, or CHARACTER of the hidden length).
    pub unsafe fn new(p: *mut c_void) -> F {
        F(p)
    }

    /// An `INTEGER` (C int).
    pub fn int(self) -> Ptr<c_int> {
        Ptr(self.0.cast())
    }

    /// An `INTEGER*8` (C long long).
    pub fn long(self) -> Ptr<i64> {
        Ptr(self.0.cast())
    }

    /// A `REAL` (C float).
    pub fn real(self) -> Ptr<f32> {
        Ptr(self.0.cast())
    }

    /// A `CHARACTER*(len)` input, blanks trimmed.
    pub fn text(self, len: usize) -> Option<String> {
        // SAFETY: a CHARACTER of `len` bytes by the constructor's contract.
        unsafe { fortran_str(self.0.cast(), len) }
    }

    /// A `CHARACTER*(len)` output.
    pub fn text_out(self, len: usize) -> StrOut {
        StrOut { ptr: self.0.cast(), cap: len }
    }

    /// The raw pointer, for passing on to the C entry point of the same
    /// contract.
    pub fn ptr<T>(self) -> *mut T {
        self.0.cast()
    }
}
