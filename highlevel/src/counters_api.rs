//! PAPI's classic counters API (PAPI 3–5's `PAPI_start_counters` family):
//! one implicit event set per thread.
//!
//! * [`start_counters`] starts counting the named events (presets or perf
//!   syntax) in the calling thread.
//! * [`read_counters`] copies the counts since the start or the previous
//!   read/accum into `values` and restarts them from zero.
//! * [`accum_counters`] adds the counts into `values` and restarts them.
//! * [`stop_counters`] stops, copies the counts since the previous
//!   read/accum, and releases the set.
//! * [`num_counters`] is the number of hardware counters of the CPU (0 on
//!   a machine without a PMU, where software events still count).
//!
//! Errors are the low-level [`Error`]s with PAPI's codes: starting twice is
//! `EISRUN`, reading without a start `ENOTRUN`, a `values` slice of the
//! wrong length `EBUF`, an event that cannot be counted `ENOEVNT` naming it.

use std::cell::RefCell;

use papirus_lowlevel::{Error, EventSet, Result, SetOp};

thread_local! {
    static SET: RefCell<Option<EventSet>> = const { RefCell::new(None) };
}

/// Starts counting `events` in the calling thread.
pub fn start_counters(events: &[&str]) -> Result<()> {
    SET.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_some() {
            return Err(Error::IsRunning { op: SetOp::Start });
        }
        let mut set = papirus_lowlevel::init()?.event_set();
        set.add_all(events.iter().copied())?;
        set.start()?;
        *slot = Some(set);
        Ok(())
    })
}

fn with_running<T>(op: SetOp, f: impl FnOnce(&mut EventSet) -> Result<T>) -> Result<T> {
    SET.with(|cell| match cell.borrow_mut().as_mut() {
        Some(set) => f(set),
        None => Err(Error::NotRunning { op }),
    })
}

/// Copies the counts since the start or the previous read/accum into
/// `values` (one per event, in start order) and restarts them from zero.
pub fn read_counters(values: &mut [i64]) -> Result<()> {
    with_running(SetOp::Read, |set| {
        values.iter_mut().for_each(|v| *v = 0);
        set.accum(values)
    })
}

/// Adds the counts since the start or the previous read/accum into
/// `values` and restarts them from zero.
pub fn accum_counters(values: &mut [i64]) -> Result<()> {
    with_running(SetOp::Accum, |set| set.accum(values))
}

/// Stops counting, copies the counts since the previous read/accum into
/// `values`, and releases the thread's set (also when the copy fails).
pub fn stop_counters(values: &mut [i64]) -> Result<()> {
    SET.with(|cell| {
        let mut set = cell.borrow_mut().take().ok_or(Error::NotRunning { op: SetOp::Stop })?;
        set.stop_into(values)
    })
}

/// The number of hardware counters one thread may use (0 without a PMU).
pub fn num_counters() -> Result<usize> {
    Ok(papirus_lowlevel::init()?.machine().hw_counters.unwrap_or(0))
}
