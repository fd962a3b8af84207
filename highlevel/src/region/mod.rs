//! Regions: named, nested, per-thread brackets around code, each measured
//! with real time, virtual time and a set of perf events.
//!
//! ```no_run
//! use papirus_highlevel::region::{region, region_begin, region_end};
//! region_begin("solve")?;
//! {
//!     let _inner = region("assemble")?; // ends when dropped
//!     // ...
//! }
//! region_end("solve")?;
//! papirus_highlevel::report::flush()?; // also written at exit
//! # Ok::<(), papirus_highlevel::region::RegionError>(())
//! ```
//!
//! # Events
//!
//! Every region measures `real_time_ns` (the TSC) and `virtual_time_ns`
//! (the thread's CPU time), plus the events chosen by [`Config::events`],
//! else by `PAPIRUS_EVENTS`, else by PAPI's `PAPI_EVENTS` (comma-separated,
//! PAPI preset names or perf syntax; PAPI's `perf::NAME` and `NAME=delta`
//! are accepted), else [`DEFAULT_EVENTS`]: task-clock, page-faults and
//! context-switches, which every Linux machine counts, and cycles and
//! instructions, kept only where a hardware PMU counts them. Events from
//! the environment that cannot be counted are dropped with their reason
//! (kept in the report, as PAPI does); events given to [`Config::events`]
//! must all work.
//!
//! # Cost
//!
//! A thread's first region opens its counters (tens of µs); a region's
//! first call in a thread allocates its statistics (and, under a lock, makes
//! them visible to the report writer). After that, begin and end take no
//! lock and allocate nothing (except for presets derived by a postfix
//! formula): each reads the TSC, the thread's virtual time (user space), and
//! the thread's perf groups — from user space where the substrate has an
//! exact path (task-clock, rdpmc), else with one `read(2)` per group (the
//! software counters here, e.g. page-faults).
//!
//! # Concurrency
//!
//! Regions are per thread: a region begun in one thread cannot end in
//! another ([`RegionError::OtherThread`]); [`Region`] guards are not `Send`.
//! Each region's statistics sit behind a sequence lock written only by its
//! thread, so [`report::snapshot`](crate::report::snapshot) (and the writer
//! at exit) reads consistent values of running threads without stopping them.

mod cells;
mod config;
mod counters;
mod error;
mod thread;

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

pub(crate) use cells::threads;
pub use config::{
    Config, DEFAULT_EVENTS, DEFAULT_OUTPUT_DIRECTORY, ENV_EVENTS, ENV_OUTPUT_DIRECTORY, ENV_PAPI_EVENTS,
    EventDef, EventSource, Setup, TIME_METRICS, Unavailable, is_set_up, setup, split_list, translate,
};
pub use counters::{Reading, ThreadCounters};
pub use error::RegionError;
use thread::ThreadRegions;

thread_local! {
    static STATE: RefCell<Option<ThreadRegions>> = const { RefCell::new(None) };
}

fn with_state<T>(f: impl FnOnce(&mut ThreadRegions) -> Result<T, RegionError>) -> Result<T, RegionError> {
    STATE
        .try_with(|s| {
            let mut s = s.borrow_mut();
            if s.is_none() {
                *s = Some(ThreadRegions::new()?);
            }
            match s.as_mut() {
                Some(state) => f(state),
                None => Err(RegionError::ThreadExiting),
            }
        })
        .unwrap_or(Err(RegionError::ThreadExiting))
}

/// Begins region `name` in the calling thread, nested in the innermost open
/// one. The first region of the process sets up the events (see the
/// [module documentation](self)).
pub fn region_begin(name: &str) -> Result<(), RegionError> {
    with_state(|s| s.begin(name))
}

/// Ends region `name`, which must be the innermost open region of the
/// calling thread, and adds the call to its statistics.
pub fn region_end(name: &str) -> Result<(), RegionError> {
    with_state(|s| s.end(name))
}

/// Reads the calling thread's region counters (opening them on first use,
/// as the thread's first [`region_begin`] does) without beginning or ending
/// a region: for callers that keep their own record of each region
/// instance (PAPI's high-level API writes one record per begin, with the
/// reads in between) while measuring with the same counters.
pub fn read_counters() -> Result<Reading, RegionError> {
    with_state(|s| {
        let mut r = s.counters.reading();
        s.counters.read(&mut r, true).map_err(|source| RegionError::Counters {
            thread: s.shared.tid,
            op: "read",
            source: Box::new(source),
        })?;
        Ok(r)
    })
}

/// How deeply regions are nested in the calling thread right now.
pub fn depth() -> usize {
    STATE.try_with(|s| s.borrow().as_ref().map_or(0, |s| s.stack.len())).unwrap_or(0)
}

/// A region that ends when dropped. Not `Send`: it ends in its own thread.
#[must_use = "a region guard ends its region when dropped; bind it (`let _r = region(..)?`)"]
#[derive(Debug)]
pub struct Region<'a> {
    name: &'a str,
    ended: bool,
    _not_send: PhantomData<*const ()>,
}

/// Begins region `name` and returns a guard that ends it on drop.
pub fn region(name: &str) -> Result<Region<'_>, RegionError> {
    region_begin(name)?;
    Ok(Region { name, ended: false, _not_send: PhantomData })
}

impl Region<'_> {
    /// Ends the region now, returning what `region_end` says (a drop cannot).
    pub fn end(mut self) -> Result<(), RegionError> {
        self.ended = true;
        region_end(self.name)
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(e) = region_end(self.name)
        {
            // A drop cannot return the error: count it for the report and say it once here.
            let _ = with_state(|s| {
                s.shared.guard_errors.fetch_add(1, Ordering::Relaxed);
                Ok(())
            });
            eprintln!("papirus: region guard: {e}");
        }
    }
}
