//! papirus-probe-runtime: the code papirus-probe's trampolines call inside the
//! instrumented program.
//!
//! Loaded by `LD_PRELOAD` for `papirus-probe run` and by an injected `dlopen`
//! for `attach`; tests link it as an rlib and patch functions of their own
//! process. The hot path ([`mod@hooks`]) keeps, per thread and per function,
//! calls, inclusive and exclusive time, min and max, and a one-level caller →
//! callee table, without locks, allocation, system calls, libc or vector
//! registers (the trampolines save general registers and flags only; papirus'
//! tests disassemble the hooks to prove they touch nothing else). The
//! counters probe is the exception: it reads papirus-substrate counter groups
//! per thread, behind an XSAVE/XRSTOR of the whole extended state
//! ([`counters`]). The cold path (set-up, reports) is ordinary Rust.
//!
//! # Set-up
//!
//! A program gets its function names and options from a session file (JSON,
//! [`Session`]): papirus-probe writes one and calls
//! [`cabi::papirus_probe_setup`] inside the stopped target (each `attach`
//! starts a new session); the library constructor also reads one named by
//! `PAPIRUS_PROBE_SESSION` or found at `/tmp/papirus-probe-session-<pid>.json`.
//! The report is written at exit (atexit) and by [`cabi::papirus_probe_flush`]
//! (a forked child writes `<output>.<pid>`).
//!
//! # Caveats
//!
//! - Inclusive time of a tail caller includes its tail callee (they share a
//!   return address); the callee's time is excluded from the caller's
//!   exclusive time.
//! - Reports of threads still running are read without stopping them.
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
pub mod report;
mod state;
mod sys;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use report::{EdgeReport, FORMAT_VERSION, FunctionReport, Report, ThreadReport};

/// What the hooks measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Probe {
    /// Counts calls and tracks returns, takes no timestamps (the probe's own cost floor).
    Empty,
    /// Real time from the TSC.
    Wallclock,
    /// Real time plus counter events ([`set_events`]), read per thread.
    Counters,
}

impl Probe {
    /// The probe's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Probe::Empty => "empty",
            Probe::Wallclock => "wallclock",
            Probe::Counters => "counters",
        }
    }
}

/// A session file: what the tool tells the runtime inside the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The probe.
    pub probe: Probe,
    /// Instrumented function names; ids are indices.
    pub functions: Vec<String>,
    /// Counter events of the counters probe (perf or PAPI names papirus-substrate parses).
    #[serde(default)]
    pub events: Vec<String>,
    /// Where the report goes at exit and at [`cabi::papirus_probe_flush`].
    pub output: PathBuf,
}

/// Set-up and report errors.
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
    /// [`register_functions`] before [`init`].
    #[error("the probe runtime is not set up: call init first")]
    NotInitialised,
    /// No output path configured.
    #[error("no report path was configured for this process")]
    NoOutput,
    /// Reading a session file or writing a report failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A counter event that cannot be used.
    #[error("counter event {name}: {reason}")]
    Event {
        /// The event.
        name: String,
        /// Why.
        reason: String,
    },
    /// A malformed session file.
    #[error("session file {path}: {source}")]
    Session {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: serde_json::Error,
    },
}

struct Global {
    names: Vec<String>,
    output: Option<PathBuf>,
    started: Option<(Instant, u64)>,
    /// The process that was set up; a forked child writes beside its report.
    pid: u32,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { names: Vec::new(), output: None, started: None, pid: 0 });

fn global() -> std::sync::MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the number of functions each thread's table holds (first call wins;
/// later calls keep it) and the probe.
pub fn init(capacity: u64, probe: Probe) {
    let mut g = global();
    if g.started.is_none() {
        g.started = Some((Instant::now(), sys::rdtsc()));
    }
    let _ = state::CAPACITY.compare_exchange(0, capacity.max(1), Ordering::AcqRel, Ordering::Acquire);
    set_probe(probe);
}

/// Switches the probe for calls from now on (benches compare probes in one process).
pub fn set_probe(probe: Probe) {
    hooks::TIMED.store(probe != Probe::Empty, Ordering::Relaxed);
    hooks::COUNTERS.store(probe == Probe::Counters, Ordering::Relaxed);
}

/// Chooses the counters probe's events (at most 4; the first call that names
/// events fixes them for the process). Threads that call an instrumented
/// function for the first time afterwards read them.
pub fn set_events<S: AsRef<str>>(names: &[S]) -> Result<(), Error> {
    let names: Vec<String> = names.iter().map(|n| n.as_ref().to_string()).collect();
    if names.is_empty() || names.len() > state::MAX_EVENTS {
        return Err(Error::Event {
            name: names.join(","),
            reason: format!("give 1 to {} events", state::MAX_EVENTS),
        });
    }
    let mut attrs = Vec::new();
    for n in &names {
        let a = papirus_substrate::parse_event(n)
            .map_err(|e| Error::Event { name: n.clone(), reason: e.to_string() })?;
        attrs.push(a);
    }
    let (fixed, _) = counters::EVENTS.get_or_init(|| (names.clone(), attrs));
    if *fixed != names {
        return Err(Error::Event {
            name: names.join(","),
            reason: format!("this process already reads {}", fixed.join(",")),
        });
    }
    counters::NEVENTS.store(names.len(), Ordering::Release);
    Ok(())
}

/// Adds functions to the current session; returns their ids.
pub fn register_functions<S: AsRef<str>>(names: &[S]) -> Result<Range<u32>, Error> {
    let capacity = state::CAPACITY.load(Ordering::Acquire);
    if capacity == 0 {
        return Err(Error::NotInitialised);
    }
    let mut g = global();
    let first = g.names.len() as u64;
    let requested = first + names.len() as u64;
    if requested > capacity {
        return Err(Error::Capacity { capacity, requested });
    }
    g.names.extend(names.iter().map(|n| n.as_ref().to_string()));
    state::FUNCS.store(requested, Ordering::Relaxed);
    state::ROWS.fetch_max(requested, Ordering::Relaxed);
    Ok(first as u32..requested as u32)
}

/// Starts a new session with these functions (ids from 0): every thread's
/// figures start again from zero, and the report shows only this session.
pub fn new_session<S: AsRef<str>>(names: &[S]) -> Result<Range<u32>, Error> {
    {
        let mut g = global();
        g.names.clear();
        g.started = Some((Instant::now(), sys::rdtsc()));
    }
    state::EPOCH.fetch_add(1, Ordering::AcqRel);
    register_functions(names)
}

/// Functions a session file may name at most (statistics rows per thread;
/// mapped lazily, so unused rows cost address space only).
pub const SESSION_CAPACITY: u64 = 1 << 16;

/// Sets where [`flush`] writes (a forked child of this process writes to
/// `PATH.<child pid>` instead).
pub fn set_output(path: &Path) {
    let mut g = global();
    g.output = Some(path.to_path_buf());
    g.pid = std::process::id();
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
    /// The counters probe's reader, which saves the extended state itself.
    pub counters_read: u64,
}

/// The hooks of this process.
pub fn hooks() -> Hooks {
    Hooks {
        enter: hooks::papirus_probe_enter as *const () as usize as u64,
        unwind_begin: hooks::papirus_probe_unwind_begin as *const () as usize as u64,
        catch: hooks::papirus_probe_catch as *const () as usize as u64,
        exit_stub: hooks::exit_stub(),
        counters_read: counters::reader(),
    }
}

/// Shortest interval the TSC rate is measured over.
const RATE_WINDOW: Duration = Duration::from_millis(20);

/// The results so far, of every thread (exited ones included).
pub fn snapshot() -> Report {
    let g = global();
    let timed = hooks::TIMED.load(Ordering::Relaxed);
    // The substrate's TSC rate (kernel conversion, CPUID, hypervisor or its
    // own calibration); when it does not use the TSC, the rate measured over
    // this run against CLOCK_MONOTONIC.
    let ticks_per_second = match (timed, papirus_substrate::clock::clock().tsc_hz(), g.started) {
        (false, ..) => 0.0,
        (true, Some(hz), _) => hz,
        (true, None, Some((t0, c0))) => {
            while t0.elapsed() < RATE_WINDOW {
                std::hint::spin_loop();
            }
            let (c1, dt) = (sys::rdtsc(), t0.elapsed());
            c1.saturating_sub(c0) as f64 / dt.as_secs_f64()
        }
        (true, None, None) => 0.0,
    };
    let epoch = state::EPOCH.load(Ordering::Acquire);
    let events: Vec<String> = match (hooks::COUNTERS.load(Ordering::Relaxed), counters::EVENTS.get()) {
        (true, Some((names, _))) => names.clone(),
        _ => Vec::new(),
    };
    let threads = state::threads()
        .filter(|t| t.epoch.get() == epoch)
        .map(|t| {
            let functions = (0..t.nfuncs.min(g.names.len() as u64))
                .filter_map(|i| {
                    let s = t.stats(i);
                    let nev = events.len();
                    (s.calls.get() > 0).then(|| FunctionReport {
                        counters_incl: s.cincl.iter().take(nev).map(|w| w.get()).collect(),
                        counters_excl: s.cexcl.iter().take(nev).map(|w| w.get()).collect(),
                        id: i as u32,
                        calls: s.calls.get(),
                        exits: s.exits.get(),
                        unwound: s.unwound.get(),
                        incl_ticks: s.incl.get(),
                        excl_ticks: s.excl.get(),
                        min_ticks: s.min.get(),
                        max_ticks: s.max.get(),
                    })
                })
                .collect();
            let callees = (0..=t.edge_mask)
                .map(|i| t.edge(i))
                .filter(|e| e.key.get() != 0)
                .map(|e| EdgeReport {
                    caller: ((e.key.get() >> 32) - 1) as u32,
                    callee: e.key.get() as u32,
                    calls: e.calls.get(),
                    incl_ticks: e.incl.get(),
                })
                .collect();
            ThreadReport {
                tid: t.tid as u32,
                functions,
                callees,
                open: t.depth.get(),
                reentered: t.reentered.get(),
                overflow: t.overflow.get(),
                edge_overflow: t.edge_overflow.get(),
                counters_error: counters::error_of(t),
            }
        })
        .collect();
    Report {
        format_version: FORMAT_VERSION,
        probe: if !events.is_empty() {
            Probe::Counters
        } else if timed {
            Probe::Wallclock
        } else {
            Probe::Empty
        }
        .name()
        .to_string(),
        events,
        pid: std::process::id(),
        ticks_per_second,
        functions: g.names.clone(),
        threads,
    }
}

/// Writes the report to the configured path.
pub fn flush() -> Result<PathBuf, Error> {
    let (path, pid) = {
        let g = global();
        (g.output.clone().ok_or(Error::NoOutput)?, g.pid)
    };
    let me = std::process::id();
    let path = if me == pid { path } else { PathBuf::from(format!("{}.{me}", path.display())) };
    let text = serde_json::to_string_pretty(&snapshot()).expect("reports serialise");
    std::fs::write(&path, text).map_err(|source| Error::Io {
        op: "write report",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Reads a session file and sets the runtime up from it.
pub fn setup_from(path: &Path) -> Result<Session, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        op: "read session",
        path: path.to_path_buf(),
        source,
    })?;
    let s: Session =
        serde_json::from_str(&text).map_err(|source| Error::Session { path: path.to_path_buf(), source })?;
    if s.probe == Probe::Counters {
        set_events(&s.events)?;
    }
    init(SESSION_CAPACITY.max(s.functions.len() as u64), s.probe);
    new_session(&s.functions)?;
    set_output(&s.output);
    Ok(s)
}

/// Session file of a runtime injected into process `pid`.
pub fn injected_session_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/papirus-probe-session-{pid}.json"))
}
