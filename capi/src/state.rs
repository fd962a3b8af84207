//! Process-wide state of the C interface: initialisation, the default
//! options PAPI keeps per process, and threads as PAPI knows them.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_ulong};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use papirus_lowlevel::Library;

use crate::Code;
use crate::raw::{IdFn, call_id_fn};

/// `PAPI_VER_CURRENT` of PAPI 7.0; 7.1 has the same interface.
pub const VER_CURRENT: c_int = 0x0700_0000;
const VER_7_1: c_int = 0x0701_0000;

/// What `PAPI_library_init` set up that changes rarely (the hot paths
/// read atomics instead: a preempted lock holder would stall every thread).
#[derive(Debug, Default)]
pub struct Init {
    /// The process that initialised (a forked child initialises again).
    pub pid: u32,
    /// `PAPI_set_debug` level.
    pub debug: c_int,
    /// Components disabled before init, with the reason.
    pub disabled: BTreeMap<usize, String>,
}

fn init_state() -> MutexGuard<'static, Init> {
    static STATE: Mutex<Init> = Mutex::new(Init { pid: 0, debug: 0, disabled: BTreeMap::new() });
    // Every update leaves the state whole, so a poisoned lock is usable.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the state.
pub fn with<T>(f: impl FnOnce(&mut Init) -> T) -> T {
    f(&mut init_state())
}

/// Whether the library is initialised (between init and shutdown).
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// `PAPI_thread_init`'s function, as an address (0: none).
static ID_FN: AtomicUsize = AtomicUsize::new(0);
/// Default domain of new sets (`PAPI_set_domain`), PAPI bits.
static DOMAIN: AtomicI32 = AtomicI32::new(1);
/// Default granularity of new sets.
static GRANULARITY: AtomicI32 = AtomicI32::new(1);

/// The default domain and granularity of new sets.
pub fn defaults() -> (c_int, c_int) {
    (DOMAIN.load(Ordering::Relaxed), GRANULARITY.load(Ordering::Relaxed))
}

/// Sets the default domain of new sets.
pub fn set_default_domain(d: c_int) {
    DOMAIN.store(d, Ordering::Relaxed);
}

/// Sets the default granularity of new sets.
pub fn set_default_granularity(g: c_int) {
    GRANULARITY.store(g, Ordering::Relaxed);
}

/// `PAPI_library_init`.
pub fn library_init(version: c_int) -> Result<c_int, Code> {
    if version != VER_CURRENT && version != VER_7_1 {
        return Err(Code::Einval);
    }
    let pid = std::process::id();
    let mut st = init_state();
    if INITIALIZED.load(Ordering::Acquire) && st.pid == pid {
        return Ok(VER_CURRENT);
    }
    if INITIALIZED.load(Ordering::Acquire) {
        // A forked child: the parent's sets share their descriptors with
        // the parent; closing or disabling them here would stop its counting.
        crate::sets::forget_all();
        ID_FN.store(0, Ordering::Relaxed);
        threads().clear();
    }
    papirus_lowlevel::init().map_err(|e| e.code())?;
    st.pid = pid;
    INITIALIZED.store(true, Ordering::Release);
    drop(st);
    register_current();
    Ok(VER_CURRENT)
}

/// The library, or ENOINIT before `PAPI_library_init` (or after shutdown).
pub fn lib() -> Result<Library, Code> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(Code::Enoinit);
    }
    papirus_lowlevel::init().map_err(|e| e.code())
}

/// Whether `PAPI_library_init` ran.
pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

/// `PAPI_is_initialized`: PAPI's bits.
pub fn is_initialized() -> c_int {
    if !initialized() {
        return 0;
    }
    1 | if id_fn().is_some() { 4 } else { 0 }
}

/// `PAPI_shutdown`: every set stopped and freed, back to not initialised.
pub fn shutdown() {
    crate::sets::destroy_all();
    INITIALIZED.store(false, Ordering::Release);
    ID_FN.store(0, Ordering::Relaxed);
    DOMAIN.store(1, Ordering::Relaxed);
    GRANULARITY.store(1, Ordering::Relaxed);
    threads().clear();
}

fn id_fn() -> Option<IdFn> {
    crate::raw::id_fn_at(ID_FN.load(Ordering::Acquire))
}

// ---------------------------------------------------------------------------
// Threads.

/// `PAPI_thread_init`.
pub fn thread_init(f: Option<IdFn>) -> Result<c_int, Code> {
    if !initialized() {
        return Err(Code::Enoinit);
    }
    let Some(f) = f else { return Err(Code::Einval) };
    // As PAPI: the first function stays; later calls change nothing.
    if ID_FN.compare_exchange(0, f as usize, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        threads().clear();
        register_current();
    }
    Ok(0)
}

/// `PAPI_thread_id`: the application's id, or `PAPI_EMISC` as an unsigned
/// long before `PAPI_thread_init`, as PAPI returns.
pub fn thread_id() -> c_ulong {
    match id_fn() {
        Some(f) => call_id_fn(f),
        None => Code::Emisc.value() as c_ulong,
    }
}

/// The key a thread is known by: the application's id when it gave a
/// function, else the kernel's.
fn key() -> c_ulong {
    match id_fn() {
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
