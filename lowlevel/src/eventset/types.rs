//! The public types of event sets: options, state, values, event descriptions.

use std::fmt;

use papirus_substrate::{Domain, Estimate, Scaling};
use serde::Serialize;

use crate::derived::Derivation;

/// What a set counts: PAPI's granularities as perf offers them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// The owning (or attached) thread only. The default.
    #[default]
    Thread,
    /// The owning (or attached) task and the threads and processes it
    /// creates after the events are opened (perf's `inherit`); children's
    /// counts are added when they exit.
    Process,
    /// Everything that runs on one CPU (set with [`EventSet::set_cpu`]);
    /// needs CAP_PERFMON or `perf_event_paranoid` ≤ 0.
    System,
}

/// A set's options. Defaults: each event's own domain (user only, except
/// scheduler software events, tracepoints and msr-like PMUs, which count
/// every domain), thread granularity, the creating thread, any CPU, no
/// multiplexing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Options {
    /// The domain applied to every event, or `None` for each event's default.
    pub domain: Option<Domain>,
    /// The granularity.
    pub granularity: Granularity,
    /// The process or thread counted instead of the owner.
    pub attached: Option<i32>,
    /// Restrict counting to one CPU.
    pub cpu: Option<u32>,
    /// Whether events may be multiplexed.
    pub multiplex: bool,
}

/// A set's state (PAPI's `PAPI_state` bits as fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Counting.
    pub running: bool,
    /// Counting another process or thread.
    pub attached: bool,
    /// Counting one CPU system-wide.
    pub cpu_attached: bool,
    /// Multiplexing is on.
    pub multiplexing: bool,
    /// An event has an overflow handler, queue or profile.
    pub overflowing: bool,
    /// An event fills a profil histogram (then `overflowing` too, as in PAPI).
    pub profiling: bool,
}

impl Status {
    /// PAPI's state bitmask: `PAPI_STOPPED` 0x1, `PAPI_RUNNING` 0x2,
    /// `PAPI_OVERFLOWING` 0x10, `PAPI_PROFILING` 0x20, `PAPI_MULTIPLEXING`
    /// 0x40, `PAPI_ATTACHED` 0x80, `PAPI_CPU_ATTACHED` 0x100.
    pub fn bits(&self) -> u32 {
        let mut b = if self.running { 0x2 } else { 0x1 };
        if self.overflowing {
            b |= 0x10;
        }
        if self.profiling {
            b |= 0x20;
        }
        if self.multiplexing {
            b |= 0x40;
        }
        if self.attached {
            b |= 0x80;
        }
        if self.cpu_attached {
            b |= 0x100;
        }
        b
    }
}

/// One value of a read, with how it relates to the true count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Value {
    /// The value: scaled when the event was multiplexed.
    pub value: i64,
    /// The value before scaling.
    pub raw: i64,
    /// Nanoseconds the event was enabled since start (or the last reset).
    pub time_enabled: u64,
    /// Nanoseconds it was on the PMU in that time.
    pub time_running: u64,
}

impl Value {
    /// How `value` was obtained from `raw`.
    pub fn scaling(&self) -> Scaling {
        Estimate { enabled: self.time_enabled, running: self.time_running, ..Estimate::default() }.scaling()
    }
}

/// An event of a set, as [`EventSet::events`] lists it.
#[derive(Clone, Debug, Serialize)]
pub struct EventInfo {
    /// Its code (`0x8…` preset, `0x4…` native).
    pub code: u32,
    /// Its name as added.
    pub name: String,
    /// Whether it is a PAPI preset.
    pub preset: bool,
    /// How its value is computed from the terms.
    pub derivation: Derivation,
    /// The native terms, as opened.
    pub terms: Vec<String>,
    /// The definition's note, for presets.
    pub note: Option<String>,
    /// The unit of the value (sysfs `.unit`), if any.
    pub unit: Option<String>,
    /// Multiply the value by this to get `unit`.
    pub scale: f64,
}

/// An event of a set, for the calls that take one (PAPI's take an event
/// code): its code (`From<u32>`), its position (`From<usize>`) or its name
/// as added (`From<&str>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// The event's code, as [`EventSet::add_named`] returned it.
    Code(u32),
    /// The event's position in the set.
    Index(usize),
    /// The event's name as added.
    Name(&'a str),
}

impl From<u32> for EventRef<'_> {
    fn from(code: u32) -> Self {
        EventRef::Code(code)
    }
}

impl From<usize> for EventRef<'_> {
    fn from(index: usize) -> Self {
        EventRef::Index(index)
    }
}

impl<'a> From<&'a str> for EventRef<'a> {
    fn from(name: &'a str) -> Self {
        EventRef::Name(name)
    }
}

impl fmt::Display for EventRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventRef::Code(c) => write!(f, "{c:#010x}"),
            EventRef::Index(i) => write!(f, "event #{i}"),
            EventRef::Name(n) => f.write_str(n),
        }
    }
}
