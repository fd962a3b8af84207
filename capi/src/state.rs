//! Process-wide state of the C interface: initialisation, the default
//! options PAPI keeps per process, and threads as PAPI knows them.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_ulong};
use std::sync::{Condvar, Mutex, MutexGuard};

use papirus_lowlevel::Library;

use crate::Code;
use crate::raw::{IdFn, call_id_fn};

/// `PAPI_VER_CURRENT` of PAPI 7.0; 7.1 has the same interface.
pub const VER_CURRENT: c_int = 0x0700_0000;
const VER_7_1: c_int = 0x0701_0000;

/// What `PAPI_library_init` set up.
#[derive(Debug, Default)]
pub struct Init {
    /// The process that initialised (a forked child initialises again).
    pub pid: u32,
    /// The low-level library.
    pub lib: Option<Library>,
    /// `PAPI_thread_init`'s function.
    pub id_fn: Option<IdFn>,
    /// Default domain of new sets (`PAPI_set_domain`), PAPI bits.
    pub domain: c_int,
    /// Default granularity of new sets.
    pub granularity: c_int,
    /// `PAPI_set_debug` level.
    pub debug: c_int,
    /// Components disabled before init, with the reason.
    pub disabled: BTreeMap<usize, String>,
}

fn init_state() -> MutexGuard<'static, Init> {
    static STATE: Mutex<Init> = Mutex::new(Init {
        pid: 0,
        lib: None,
        id_fn: None,
        domain: 1,
        granularity: 1,
        debug: 0,
        disabled: BTreeMap::new(),
    });
    // Every update leaves the state whole, so a poisoned lock is usable.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the state.
pub fn with<T>(f: impl FnOnce(&mut Init) -> T) -> T {
    f(&mut init_state())
}

/// `PAPI_library_init`.
pub fn library_init(version: c_int) -> Result<c_int, Code> {
    if version != VER_CURRENT && version != VER_7_1 {
        return Err(Code::Einval);
    }
    let pid = std::process::id();
    let mut st = init_state();
    if st.lib.is_some() && st.pid == pid {
        return Ok(VER_CURRENT);
    }
    if st.lib.is_some() {
        // A forked child: the parent's sets share their descriptors with
        // the parent; closing or disabling them here would stop its counting.
        crate::sets::forget_all();
        st.id_fn = None;
    }
    let lib = papirus_lowlevel::init().map_err(|e| e.code())?;
    st.lib = Some(lib);
    st.pid = pid;
    drop(st);
    register_current();
    Ok(VER_CURRENT)
}

/// The library, or ENOINIT before `PAPI_library_init` in this process.
pub fn lib() -> Result<Library, Code> {
    let st = init_state();
    match &st.lib {
        Some(l) if st.pid == std::process::id() => Ok(l.clone()),
        _ => Err(Code::Enoinit),
    }
}

/// Whether `PAPI_library_init` ran in this process.
pub fn initialized() -> bool {
    lib().is_ok()
}

/// `PAPI_is_initialized`: PAPI's bits.
pub fn is_initialized() -> c_int {
    let st = init_state();
    if st.lib.is_none() || st.pid != std::process::id() {
        return 0;
    }
    1 | if st.id_fn.is_some() { 4 } else { 0 }
}

/// `PAPI_shutdown`: every set stopped and freed, back to not initialised.
pub fn shutdown() {
    crate::sets::destroy_all();
    let mut st = init_state();
    st.lib = None;
    st.id_fn = None;
    st.domain = 1;
    st.granularity = 1;
    drop(st);
    threads().clear();
}

// ---------------------------------------------------------------------------
// Threads.

/// `PAPI_thread_init`.
pub fn thread_init(f: Option<IdFn>) -> Result<c_int, Code> {
    let mut st = init_state();
    if st.lib.is_none() {
        return Err(Code::Enoinit);
    }
    let Some(f) = f else { return Err(Code::Einval) };
    // As PAPI: the first function stays; later calls change nothing.
    if st.id_fn.is_none() {
        st.id_fn = Some(f);
        drop(st);
        threads().clear();
        register_current();
    }
    Ok(0)
}

/// `PAPI_thread_id`: the application's id, or `PAPI_EMISC` as an unsigned
/// long before `PAPI_thread_init`, as PAPI returns.
pub fn thread_id() -> c_ulong {
    match init_state().id_fn {
        Some(f) => call_id_fn(f),
        None => Code::Emisc.value() as c_ulong,
    }
}

/// The key a thread is known by: the application's id when it gave a
/// function, else the kernel's.
fn key() -> c_ulong {
    match init_state().id_fn {
        Some(f) => call_id_fn(f),
        None => papirus_lowlevel::thread_id() as c_ulong,
    }
}

/// A thread PAPI knows, with its `PAPI_set_thr_specific` slots.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadData {
    /// USR1, USR2, HIGH_LEVEL, and the slot PAPI's range check admits.
    pub slots: [usize; 4],
}

fn threads() -> MutexGuard<'static, BTreeMap<c_ulong, ThreadData>> {
    static THREADS: Mutex<BTreeMap<c_ulong, ThreadData>> = Mutex::new(BTreeMap::new());
    THREADS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the calling thread (idempotent).
pub fn register_current() {
    let k = key();
    threads().entry(k).or_default();
}

/// `PAPI_unregister_thread`: EMISC when the thread is unknown.
pub fn unregister_current() -> Result<c_int, Code> {
    let k = key();
    if threads().remove(&k).is_none() {
        return Err(Code::Emisc);
    }
    crate::sets::destroy_owned_by(papirus_lowlevel::thread_id());
    Ok(0)
}

/// The ids of the known threads, ascending.
pub fn thread_ids() -> Vec<c_ulong> {
    threads().keys().copied().collect()
}

/// The calling thread's slot `tag`.
pub fn thr_specific(tag: usize) -> usize {
    let k = key();
    threads().entry(k).or_default().slots[tag]
}

/// Sets the calling thread's slot `tag`.
pub fn set_thr_specific(tag: usize, v: usize) {
    let k = key();
    threads().entry(k).or_default().slots[tag] = v;
}

/// Every known thread's slot `tag`, by id.
pub fn all_thr_specific(tag: usize) -> Vec<(c_ulong, usize)> {
    threads().iter().map(|(&k, d)| (k, d.slots[tag])).collect()
}

// ---------------------------------------------------------------------------
// PAPI_lock / PAPI_unlock: locks held across calls, so not RAII guards.

/// PAPI's two user locks plus the internal ones its range check admits.
pub const LOCKS: usize = 10;

struct Lock {
    held: Mutex<bool>,
    cv: Condvar,
}

fn lock_at(i: usize) -> &'static Lock {
    static LOCKS_: [Lock; LOCKS] = [const { Lock { held: Mutex::new(false), cv: Condvar::new() } }; LOCKS];
    &LOCKS_[i]
}

/// `PAPI_lock`.
pub fn lock(i: usize) {
    let l = lock_at(i);
    let mut held = l.held.lock().unwrap_or_else(|p| p.into_inner());
    while *held {
        held = l.cv.wait(held).unwrap_or_else(|p| p.into_inner());
    }
    *held = true;
}

/// `PAPI_unlock`.
pub fn unlock(i: usize) {
    let l = lock_at(i);
    *l.held.lock().unwrap_or_else(|p| p.into_inner()) = false;
    l.cv.notify_one();
}
