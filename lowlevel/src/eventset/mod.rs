//! Event sets with PAPI's semantics.
//!
//! An [`EventSet`] holds events added by preset name, native name or code,
//! and counts them on one target: the thread that created it (the default),
//! that thread and its future children (process granularity), another
//! process or thread (attach), or one CPU (system-wide). Descriptors are
//! opened when events are added, so an event that cannot be counted with
//! the others fails at [`EventSet::add_named`], as in PAPI; every
//! descriptor closes when the set is dropped.
//!
//! # Layout
//!
//! The substrate's counting core decides the groups
//! ([`papirus_substrate::layout`]): without multiplexing at most four pinned
//! groups — breakpoints, hardware counters, the clocks (task-clock,
//! cpu-clock), and the events read by `read(2)` only — each read
//! atomically and never rotated, so a set that does not fit the counters
//! fails to add ([`Code::Ecnflct`](crate::Code::Ecnflct)). With multiplexing
//! each event (all the terms of a derived preset together) is its own
//! group, the kernel rotates the groups, and values come back scaled by
//! `time_enabled / time_running` with the scaling in [`Value`]. The terms of
//! a derived event always share one group, so they share one scaling and a
//! difference of terms cannot turn negative from terms scaled apart.
//!
//! # Conflicts between sets
//!
//! perf gives every software, tracepoint and msr event its own counter, so
//! any number of sets using them may run at once on one thread. What can
//! run out: hardware counters (a set that starts while other running,
//! non-multiplexed sets on the same target hold so many that the sum
//! exceeds the CPU's counters fails with `ECNFLCT`), and the four x86 debug
//! registers behind breakpoints (the kernel reserves them at open, so the
//! fifth breakpoint on a thread fails to add with `ECNFLCT`).
//!
//! # Reset
//!
//! `start`, `reset` and `accum` move a software zero (a snapshot of counts
//! and times) instead of issuing `PERF_EVENT_IOC_RESET`: one `read(2)` gives
//! values and times at the same instant, so a multiplexed set's scaling
//! after a reset uses the times since that reset only. `start` needs no
//! read at all for a fresh set (everything is 0) or after `stop` (a
//! disabled event does not change, so the values `stop` read are the zero),
//! except with process granularity, where exiting children add their
//! counts even to a disabled event.
//!
//! # Reads
//!
//! Each group is read by the counting core's
//! [`GroupReader`](papirus_substrate::read::GroupReader): from user space
//! (no system call) when every member has an exact user-space method
//! (task-clock and cpu-clock by the thread's CPU time, rdpmc where the page
//! offers it) and the set counts the thread that reads it, is running, not
//! multiplexed, not inherited (process granularity) and not overflowing; by
//! one `read(2)` otherwise. A set of task-clock and page-faults therefore
//! reads task-clock without a system call and page-faults with one.
//! [`EventSet::read_path`] says which path the last read took,
//! [`EventSet::read_methods`] why. Counts never go down (the reader holds a
//! user-space value extrapolated a little ahead of the kernel's), and each
//! value is the count since start, reset or accum by the core's one
//! estimator ([`papirus_substrate::count`]).

mod counting;
mod members;
mod open;
mod options;
mod overflow;
#[cfg(test)]
mod tests;
mod types;

use std::fmt;

use papirus_substrate::read::ReadPath;
use papirus_substrate::signal::default_signal;
use papirus_substrate::{Group, Target};

use crate::error::{Error, Result, SetOp};
use crate::library::{Library, Tid, thread_id};
use crate::overflow::Dispatch;
use members::Entry;
use open::OpenGroups;
use overflow::Overflow;

pub use members::ResolvedEvent;
pub use types::{EventInfo, EventRef, Granularity, Options, Status, Value};

/// A PAPI event set. See the [module documentation](self).
pub struct EventSet {
    lib: Library,
    id: u64,
    owner: Tid,
    entries: Vec<Entry>,
    options: Options,
    opened: Option<OpenGroups>,
    running: Option<Target>,
    /// Reused by accum so it does not allocate.
    tmp: Vec<i64>,
    /// Reused by reads: one event's terms, counted and raw.
    terms: (Vec<i64>, Vec<i64>),
    /// How the last read obtained its values.
    last_path: Option<ReadPath>,
    /// Whether reads may take the user-space path.
    user_space: bool,
    /// Whether opening maps the counters' pages for user-space reads: a set
    /// that only resolves names maps none, so it never waits for the TSC's rate.
    maps_pages: bool,
    /// Whether the running set holds a claim on hardware counters (a set
    /// that uses none never conflicts, and skips the library's lock).
    claimed: bool,
    /// The real-time signal overflows are routed to.
    signal: i32,
}

impl fmt::Debug for EventSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSet")
            .field("id", &self.id)
            .field("owner", &self.owner)
            .field("events", &self.entries.iter().map(|e| &e.info.name).collect::<Vec<_>>())
            .field("options", &self.options)
            .field("running", &self.running.is_some())
            .finish()
    }
}

impl EventSet {
    pub(crate) fn new(lib: Library, id: u64) -> EventSet {
        EventSet {
            lib,
            id,
            owner: thread_id(),
            entries: vec![],
            options: Options::default(),
            opened: None,
            running: None,
            tmp: vec![],
            terms: (vec![], vec![]),
            last_path: None,
            user_space: true,
            maps_pages: true,
            claimed: false,
            signal: default_signal(),
        }
    }

    /// The events in the order they were added.
    pub fn events(&self) -> Vec<EventInfo> {
        self.entries.iter().map(|e| e.info.clone()).collect()
    }

    /// The events' codes in order (PAPI's `PAPI_list_events`).
    pub fn codes(&self) -> Vec<u32> {
        self.entries.iter().map(|e| e.info.code).collect()
    }

    /// The number of events (a derived preset counts as one).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set holds no event.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The open perf descriptors (for fd accounting and tests).
    pub fn descriptors(&self) -> usize {
        self.opened.as_ref().map_or(0, |o| o.groups.iter().map(Group::len).sum())
    }

    /// The number of perf groups the events are spread over.
    pub fn groups(&self) -> usize {
        self.opened.as_ref().map_or(0, |o| o.groups.len())
    }

    /// The set's options.
    pub fn options(&self) -> Options {
        self.options
    }

    /// The set's state.
    pub fn status(&self) -> Status {
        Status {
            running: self.running.is_some(),
            attached: self.options.attached.is_some(),
            cpu_attached: self.options.granularity == Granularity::System,
            multiplexing: self.options.multiplex,
            overflowing: self.entries.iter().any(|e| e.overflow.is_some()),
            profiling: self
                .entries
                .iter()
                .any(|e| matches!(e.overflow, Some(Overflow { dispatch: Dispatch::Profile(_), .. }))),
        }
    }

    /// The thread that created the set (and is counted by default).
    pub fn owner(&self) -> Tid {
        self.owner
    }

    /// The set's id, unique in the process (what overflow handlers get as
    /// [`OverflowInfo::event_set`](crate::overflow::OverflowInfo::event_set)).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The position of `event` in the set: ENOEVNT when it is not there.
    pub fn index_of<'a>(&self, event: impl Into<EventRef<'a>>) -> Result<usize> {
        let event = event.into();
        let found = match event {
            EventRef::Index(i) => (i < self.entries.len()).then_some(i),
            EventRef::Code(c) => self.entries.iter().position(|e| e.info.code == c),
            EventRef::Name(n) => {
                let n = n.trim();
                self.entries.iter().position(|e| e.info.name == n || e.info.name.eq_ignore_ascii_case(n))
            }
        };
        found.ok_or_else(|| Error::EventNotInSet {
            event: event.to_string(),
            held: self.entries.iter().map(|e| e.info.name.as_str()).collect::<Vec<_>>().join(", "),
        })
    }

    /// Stops (if running) and closes everything; the same as dropping the
    /// set, with the error of the final disable reported.
    pub fn destroy(mut self) -> Result<()> {
        if self.running.is_some() {
            self.stop()?;
        }
        Ok(())
    }
}

impl Drop for EventSet {
    fn drop(&mut self) {
        if let Some(key) = self.running.take() {
            if let Some(o) = &self.opened {
                for g in &o.groups {
                    // Closing the descriptors below stops counting anyway.
                    let _ = g.disable();
                }
            }
            if self.claimed {
                self.lib.release(key, self.id);
            }
        }
    }
}

fn closed(op: SetOp) -> Error {
    Error::Invalid {
        what: "event set",
        reason: format!("cannot {op}: its events are closed after a failed change; remove and re-add them"),
    }
}

/// The target as a key for counter accounting: the owner by its tid.
fn self_key(t: Target, owner: Tid) -> Target {
    match t {
        Target::ThisThread => Target::Task(owner),
        Target::TaskOnCpu { pid: 0, cpu } => Target::TaskOnCpu { pid: owner, cpu },
        t => t,
    }
}
