//! papirus-probe-runtime: the code papirus-probe's trampolines call inside the
//! instrumented program.
//!
//! Loaded by `LD_PRELOAD` for `papirus-probe run` and by an injected `dlopen`
//! for `attach`; tests link it as an rlib and patch functions of their own
//! process. The hot path ([`mod@hooks`]) keeps, per thread, a call-path
//! tree (calls, inclusive and exclusive time, min and max, counter deltas per
//! distinct path of instrumented functions) and, when tracing, a ring of
//! closed calls, without locks, allocation, system calls, libc or vector
//! registers (the trampolines save general registers and flags only; papirus'
//! tests disassemble the hooks to prove they touch nothing else), the
//! counters probe's reads included ([`counters`]: the counting core's group
//! readers, with a `read(2)` of its own where the kernel requires one). The
//! cold path (set-up, a thread's registration, thread exit, fork) is
//! ordinary Rust; a thread's registration runs behind an XSAVE/XRSTOR of the
//! whole extended state.
//!
//! # Set-up and results
//!
//! The library does nothing when loaded: no constructor, no `atexit`, no
//! file. The tool calls [`cabi::papirus_probe_setup`] inside the stopped
//! target with a [`Session`] blob it wrote into the target's memory; the
//! runtime creates the results segment (a sealed memfd,
//! [`papirus_probe_abi::layout`]) and lays every thread's tables in it. The
//! tool maps the same memfd and writes every report itself. At detach the
//! tool calls [`cabi::papirus_probe_teardown`], which unmaps the segment,
//! and then gives back its `dlopen` reference: nothing here keeps the
//! loader from unloading the library (no thread-local destructor, no Rust
//! thread-local with one, no `atexit`; the `pthread_atfork` handlers go
//! with the library).
//!
//! A thread's slot is recycled when the thread ends (the destructor of a
//! pthread key the session creates, set on the thread's first instrumented
//! call; teardown deletes the key): its open frames are closed as unwound,
//! its tree folded into its process' tree of exited threads, so memory grows
//! with distinct paths, not with threads. A forked child takes a process
//! record and a slot of its own (`pthread_atfork`), keeping the forking
//! thread's open frames.
//!
//! # Caveats
//!
//! - Inclusive time of a tail caller includes its tail callee (they share a
//!   return address); the callee's time is excluded from the caller's
//!   exclusive time.
//! - Threads still running are sampled without stopping them (see the
//!   layout's ordering rules).
//! - The counters probe's events are fixed by the first set-up that names
//!   them; threads that made their first instrumented call before that read
//!   no counters.
//! - An activation's return address lives on the shadow stack while it runs,
//!   so `backtrace()` and other unwinders that are not hooked stop at the
//!   exit stub.
//! - Exceptions are handled for unwinders that go through the hooked libgcc
//!   entry points and `__cxa_begin_catch`; Rust panics caught by
//!   `catch_unwind` across instrumented frames are not.
#![deny(unsafe_code)]

pub mod cabi;
pub mod counters;
pub mod hooks;
mod segment;
mod state;
mod sys;

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

pub use papirus_probe_abi::{
    CounterSetup, EdgeReport, FORMAT_VERSION, FunctionReport, Probe, ProcessReport, Report, Session,
    SetupCode, ThreadReport, Window,
};
pub use segment::{setup, teardown};

/// Set-up errors of the in-process API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// More functions than the capacity chosen at [`init`].
    #[error(
        "the probe runtime was set up for {capacity} functions; {requested} requested: set it up with a larger capacity"
    )]
    Capacity {
        /// Capacity given to [`init`].
        capacity: u64,
        /// Functions registered so far plus the new ones.
        requested: u64,
    },
    /// [`register_functions`] before [`init`], or the segment could not be made.
    #[error("the probe runtime is not set up: {0}")]
    NotInitialised(&'static str),
    /// A counter event that cannot be used.
    #[error("counter event {name}: {reason}")]
    Event {
        /// The event.
        name: String,
        /// Why.
        reason: String,
    },
}

/// Names registered in this process (the in-process API; in a target, names stay in the tool).
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn names() -> std::sync::MutexGuard<'static, Vec<String>> {
    NAMES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Thread tables of an in-process session.
const LOCAL_SLOTS: u64 = 256;

/// Sets this process up for in-process patching with `capacity` function
/// ids (first call wins; later calls keep the segment) and the probe.
pub fn init(capacity: u64, probe: Probe) {
    if state::Seg::current().is_none() {
        let s = Session {
            version: papirus_probe_abi::SESSION_VERSION,
            probe,
            functions: capacity.max(1),
            counters: CounterSetup::default(),
            slots: LOCAL_SLOTS,
            processes: 16,
            tool_pid: std::process::id(),
            // In-process users (tests, benches) look at their own threads.
            per_thread: true,
            nodes: 0,
            // A ring per thread for benches that trace; off until set_tracing.
            trace: Some(papirus_probe_abi::TraceOptions {
                ring: LOCAL_RING,
                min_ticks: 0,
                depth: u64::MAX,
                functions: capacity.max(1),
            }),
        };
        if let Ok(fd) = setup(&s) {
            // This process maps it; nobody else needs the fd.
            segment::close(fd);
        }
        set_tracing(false);
    }
    set_probe(probe);
}

/// Trace records per thread of an in-process session.
const LOCAL_RING: u64 = 1 << 16;

/// Turns tracing of every closed call on or off from now on (in-process
/// sessions, whose rings exist from [`init`]: benches compare the cost).
pub fn set_tracing(on: bool) {
    state::TRACING.store(on && state::FLAT.ring.load(Ordering::Relaxed) > 0, Ordering::Relaxed);
}

/// The in-process session's results segment (for a drainer in this
/// process), or an empty slice before [`init`].
pub fn segment_words() -> &'static [std::sync::atomic::AtomicU64] {
    state::Seg::current().map_or(&[], |s| s.words())
}

/// Switches the probe for calls from now on (benches compare probes in one process).
pub fn set_probe(probe: Probe) {
    hooks::TIMED.store(probe != Probe::Empty, Ordering::Relaxed);
    hooks::COUNTERS.store(probe == Probe::Counters, Ordering::Relaxed);
    segment::set_probe_word(probe);
}

/// Chooses the counters probe's events and the TSC's rate (at most 4 events,
/// resolved by the caller; the first call that names events fixes them for
/// the process). Threads that call an instrumented function for the first
/// time afterwards read them.
pub fn set_counters(setup: &CounterSetup) -> Result<(), Error> {
    let names = || setup.events.iter().map(|a| a.name()).collect::<Vec<_>>().join(",");
    let n = setup.events.len();
    if n == 0 || n > state::MAX_EVENTS {
        return Err(Error::Event {
            name: names(),
            reason: format!("give 1 to {} events", state::MAX_EVENTS),
        });
    }
    let fixed = counters::SETUP.get_or_init(|| setup.clone());
    if fixed.events != setup.events {
        let held = fixed.events.iter().map(|a| a.name()).collect::<Vec<_>>().join(",");
        return Err(Error::Event { name: names(), reason: format!("this process already reads {held}") });
    }
    counters::NEVENTS.store(n, Ordering::Release);
    segment::set_nevents_word(n as u64);
    Ok(())
}

/// Adds functions to this process' in-process session; returns their ids.
pub fn register_functions<S: AsRef<str>>(new: &[S]) -> Result<Range<u32>, Error> {
    let seg = state::Seg::current().ok_or(Error::NotInitialised("call init first"))?;
    let capacity = seg.g.shape.funcs;
    let mut g = names();
    let first = g.len() as u64;
    let requested = first + new.len() as u64;
    if requested > capacity {
        return Err(Error::Capacity { capacity, requested });
    }
    g.extend(new.iter().map(|n| n.as_ref().to_string()));
    Ok(first as u32..requested as u32)
}

/// Addresses of the hooks in this process, for the in-process patcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hooks {
    /// [`hooks::papirus_probe_enter`].
    pub enter: u64,
    /// [`hooks::papirus_probe_unwind_begin`].
    pub unwind_begin: u64,
    /// [`hooks::papirus_probe_catch`].
    pub catch: u64,
    /// The exit stub hijacked returns go to.
    pub exit_stub: u64,
    /// The registration of a thread, behind a save of the whole extended
    /// state (the one path the hooks take into code that may use vector
    /// registers and libc).
    pub cold_call: u64,
}

/// The hooks of this process.
pub fn hooks() -> Hooks {
    Hooks {
        enter: hooks::papirus_probe_enter as *const () as usize as u64,
        unwind_begin: hooks::papirus_probe_unwind_begin as *const () as usize as u64,
        catch: hooks::papirus_probe_catch as *const () as usize as u64,
        exit_stub: hooks::exit_stub(),
        cold_call: counters::cold_call_address(),
    }
}

/// The results so far of this process' in-process session, every live
/// thread and the folded exited ones (an empty report before [`init`]).
pub fn snapshot() -> Report {
    let names = names().clone();
    segment::snapshot(names)
}
