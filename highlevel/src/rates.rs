//! PAPI's rate functions: `flops_rate`, `flips_rate`, `ipc`, `epc`, plus an
//! event rate and a real/virtual time rate that work on any machine.
//!
//! Semantics follow PAPI: the state is per thread; the first call of a
//! function (or a call with another function or event than the previous
//! one) starts counting and returns zeros; every later call returns what
//! happened since the previous call and restarts the interval. Times are
//! in seconds: real time from the TSC, process time as the calling thread's
//! CPU time (what PAPI's `get_virt_usec` gives a threaded program).
//! Mflop/s and Mflip/s are counts per µs of *process* time, as PAPI
//! computes them.
//!
//! On a machine without the hardware events (no PMU, as on these KVM
//! guests), the functions fail with [`RateError::MissingEvent`] naming the
//! event and the kernel's reason; [`event_rate`] with a software event and
//! [`time_rate`] still work.

use std::cell::RefCell;

use papirus_lowlevel::{Code, EventSet, real_nsec, virt_nsec};

/// What one call of a rate function reports, since the previous call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateReading {
    /// Real time, s.
    pub real_time_s: f64,
    /// The thread's CPU time, s.
    pub proc_time_s: f64,
    /// The event count (flops, flips, instructions, or the event of [`event_rate`]).
    pub count: i64,
    /// Mflop/s, Mflip/s, IPC, or events per second of real time ([`event_rate`]).
    pub rate: f64,
}

/// What one call of [`epc`] reports, since the previous call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpcReading {
    /// Real time, s.
    pub real_time_s: f64,
    /// The thread's CPU time, s.
    pub proc_time_s: f64,
    /// The event's count.
    pub events: i64,
    /// Reference cycles (`PAPI_REF_CYC`), 0 where the CPU has none.
    pub ref_cycles: i64,
    /// Core cycles (`PAPI_TOT_CYC`).
    pub core_cycles: i64,
    /// Events per core cycle.
    pub epc: f64,
}

/// What one call of [`time_rate`] reports, since the previous call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimeReading {
    /// Real time, s.
    pub real_time_s: f64,
    /// The thread's CPU time, s.
    pub proc_time_s: f64,
    /// CPU time / real time.
    pub utilisation: f64,
}

/// Errors of the rate functions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RateError {
    /// An event the function needs cannot be counted here.
    #[error("{function} needs {event}, which cannot be counted here: {source}")]
    MissingEvent {
        /// The rate function.
        function: &'static str,
        /// The event.
        event: String,
        /// Why, from the low-level layer.
        #[source]
        source: Box<papirus_lowlevel::Error>,
    },
    /// An event the function does not take (PAPI's ENOEVNT).
    #[error("{function} takes one of {allowed:?}, not `{event}`")]
    WrongEvent {
        /// The rate function.
        function: &'static str,
        /// The event given.
        event: String,
        /// The events it takes.
        allowed: &'static [&'static str],
    },
    /// [`rate_stop`] with no rate function running in this thread.
    #[error("no rate function is counting in this thread: nothing to stop")]
    NotRunning,
    /// Starting or reading the counters failed.
    #[error("{function}: {source}")]
    Counters {
        /// The rate function.
        function: &'static str,
        /// The low-level error.
        #[source]
        source: Box<papirus_lowlevel::Error>,
    },
}

impl RateError {
    /// The PAPI error code a PAPI user would get.
    pub fn code(&self) -> Code {
        match self {
            RateError::MissingEvent { source, .. } | RateError::Counters { source, .. } => source.code(),
            RateError::WrongEvent { .. } | RateError::NotRunning => Code::Enoevnt,
        }
    }
}

/// Which function counts, and on what: switching restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mode {
    Flops(String),
    Flips(String),
    Ipc,
    Epc(String),
    Event(String),
    Time,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    set: Option<EventSet>,
    /// Whether the set's last event is PAPI_REF_CYC (epc only).
    has_ref: bool,
    real_ns: u64,
    virt_ns: u64,
    values: Vec<i64>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// Counts since the previous call, or `None` on the first call of `mode`.
struct Interval {
    real_s: f64,
    proc_s: f64,
    values: Vec<i64>,
    has_ref: bool,
}

fn run(
    function: &'static str,
    mode: Mode,
    events: &[&str],
    optional: Option<&str>,
) -> Result<Option<Interval>, RateError> {
    STATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if let Some(st) = slot.as_mut()
            && st.mode == mode
        {
            let (real, virt) = (real_nsec(), virt_nsec());
            st.values.iter_mut().for_each(|v| *v = 0);
            if let Some(set) = st.set.as_mut() {
                set.accum(&mut st.values)
                    .map_err(|source| RateError::Counters { function, source: Box::new(source) })?;
            }
            let iv = Interval {
                real_s: real.saturating_sub(st.real_ns) as f64 / 1e9,
                proc_s: virt.saturating_sub(st.virt_ns) as f64 / 1e9,
                values: st.values.clone(),
                has_ref: st.has_ref,
            };
            st.real_ns = real;
            st.virt_ns = virt;
            return Ok(Some(iv));
        }
        // A new mode: the old set (if any) stops when dropped.
        *slot = None;
        let mut set = None;
        let mut has_ref = false;
        if !events.is_empty() {
            let lib = papirus_lowlevel::init()
                .map_err(|source| RateError::Counters { function, source: Box::new(source) })?;
            let mut s = lib.event_set();
            for e in events {
                s.add_named(e).map_err(|source| RateError::MissingEvent {
                    function,
                    event: (*e).to_string(),
                    source: Box::new(source),
                })?;
            }
            if let Some(o) = optional {
                has_ref = s.add_named(o).is_ok();
            }
            s.start().map_err(|source| RateError::Counters { function, source: Box::new(source) })?;
            set = Some(s);
        }
        let n = events.len() + usize::from(has_ref);
        *slot = Some(State {
            mode,
            set,
            has_ref,
            real_ns: real_nsec(),
            virt_ns: virt_nsec(),
            values: vec![0; n],
        });
        Ok(None)
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

const FLOPS: &[&str] = &["PAPI_FP_OPS", "PAPI_SP_OPS", "PAPI_DP_OPS"];
const FLIPS: &[&str] = &["PAPI_FP_INS", "PAPI_VEC_SP", "PAPI_VEC_DP"];

fn count_rate(
    function: &'static str,
    allowed: &'static [&'static str],
    event: &str,
    mode: Mode,
) -> Result<RateReading, RateError> {
    if !allowed.iter().any(|a| a.eq_ignore_ascii_case(event)) {
        return Err(RateError::WrongEvent { function, event: event.into(), allowed });
    }
    Ok(run(function, mode, &[event], None)?.map_or_else(RateReading::default, |iv| {
        let count = iv.values[0];
        RateReading {
            real_time_s: iv.real_s,
            proc_time_s: iv.proc_s,
            count,
            rate: ratio(count as f64, iv.proc_s * 1e6),
        }
    }))
}

/// Floating-point operations per µs of process time (`PAPI_flops_rate`);
/// `event` is `PAPI_FP_OPS`, `PAPI_SP_OPS` or `PAPI_DP_OPS`.
pub fn flops_rate(event: &str) -> Result<RateReading, RateError> {
    count_rate("flops_rate", FLOPS, event, Mode::Flops(event.to_ascii_uppercase()))
}

/// Floating-point instructions per µs of process time (`PAPI_flips_rate`);
/// `event` is `PAPI_FP_INS`, `PAPI_VEC_SP` or `PAPI_VEC_DP`.
pub fn flips_rate(event: &str) -> Result<RateReading, RateError> {
    count_rate("flips_rate", FLIPS, event, Mode::Flips(event.to_ascii_uppercase()))
}

/// Instructions per cycle (`PAPI_ipc`): `count` is instructions, `rate` the IPC.
pub fn ipc() -> Result<RateReading, RateError> {
    Ok(run("ipc", Mode::Ipc, &["PAPI_TOT_INS", "PAPI_TOT_CYC"], None)?.map_or_else(
        RateReading::default,
        |iv| RateReading {
            real_time_s: iv.real_s,
            proc_time_s: iv.proc_s,
            count: iv.values[0],
            rate: ratio(iv.values[0] as f64, iv.values[1] as f64),
        },
    ))
}

/// Events per core cycle (`PAPI_epc`); `event` `None` counts instructions.
/// Reference cycles are reported where the CPU has them.
pub fn epc(event: Option<&str>) -> Result<EpcReading, RateError> {
    let event = event.unwrap_or("PAPI_TOT_INS");
    let iv = run("epc", Mode::Epc(event.to_string()), &[event, "PAPI_TOT_CYC"], Some("PAPI_REF_CYC"))?;
    Ok(iv.map_or_else(EpcReading::default, |iv| EpcReading {
        real_time_s: iv.real_s,
        proc_time_s: iv.proc_s,
        events: iv.values[0],
        core_cycles: iv.values[1],
        ref_cycles: if iv.has_ref { iv.values[2] } else { 0 },
        epc: ratio(iv.values[0] as f64, iv.values[1] as f64),
    }))
}

/// Any event (preset or perf syntax) per second of real time, with PAPI's
/// call semantics: works here with software events such as `page-faults`.
pub fn event_rate(event: &str) -> Result<RateReading, RateError> {
    Ok(run("event_rate", Mode::Event(event.to_string()), &[event], None)?.map_or_else(
        RateReading::default,
        |iv| RateReading {
            real_time_s: iv.real_s,
            proc_time_s: iv.proc_s,
            count: iv.values[0],
            rate: ratio(iv.values[0] as f64, iv.real_s),
        },
    ))
}

/// Real and virtual (thread CPU) time since the previous call, and their
/// ratio. Needs no counter, so it works on every machine.
pub fn time_rate() -> Result<TimeReading, RateError> {
    Ok(run("time_rate", Mode::Time, &[], None)?.map_or_else(TimeReading::default, |iv| TimeReading {
        real_time_s: iv.real_s,
        proc_time_s: iv.proc_s,
        utilisation: ratio(iv.proc_s, iv.real_s),
    }))
}

/// Stops the calling thread's rate counting (`PAPI_rate_stop`).
pub fn rate_stop() -> Result<(), RateError> {
    STATE.with(|cell| cell.borrow_mut().take().map(drop).ok_or(RateError::NotRunning))
}
