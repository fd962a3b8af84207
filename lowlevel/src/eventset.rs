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
//! Without multiplexing all native terms form one perf group with a pinned
//! leader: read atomically, never rotated, and a set that does not fit the
//! counters fails to add ([`Code::Ecnflct`](crate::Code::Ecnflct)). Breakpoints
//! are the exception: they form a second pinned group, since on kernel 6.18
//! a breakpoint in a group led by a software event counts 0. With
//! multiplexing each event (all the terms of a derived preset together) is
//! its own group, the kernel rotates the groups, and values come back
//! scaled by `time_enabled / time_running` with the scaling in [`Value`].
//! The terms of a derived event always share one group, so they share one
//! scaling and a difference of terms cannot turn negative from terms
//! scaled apart.
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
//! Each group is read through the substrate's
//! [`GroupPages`](papirus_substrate::fastread::GroupPages): from user space
//! (no system call) when every member has an exact user-space path
//! (task-clock and cpu-clock by the virtual-time method, rdpmc where the
//! page offers it) and the set counts the thread that reads it, is running,
//! not multiplexed, not inherited (process granularity) and not
//! overflowing; by one `read(2)` otherwise. [`EventSet::read_path`] says
//! which path the last read took, [`EventSet::user_paths`] why. Counts are
//! never allowed to go down: a user-space value extrapolated a little ahead
//! of the kernel's (host steal time, within the substrate's stated bound)
//! is held until the kernel's count passes it, so a delta is never negative.

use std::fmt;
use std::sync::{Arc, Mutex};

use papirus_substrate::attr::consts::PERF_TYPE_BREAKPOINT;
use papirus_substrate::fastread::{GroupPages, ReadPath, UserPath};
use papirus_substrate::group::{GroupCounts, Member};
use papirus_substrate::ring::RingBuffer;
use papirus_substrate::signal::{NotifierStats, Route, default_signal};
use papirus_substrate::{Domain, EventAttr, Group, Kind, Scaling, Target};
use serde::Serialize;

use crate::derived::Derivation;
use crate::error::{Error, Result, SetOp};
use crate::library::{Library, Tid, thread_id};
use crate::native::{self, NATIVE_MASK};
use crate::overflow::{self, Dispatch, OverflowHandler, SampleQueue};
use crate::preset::{Definition, PRESET_MASK, preset_by_code, preset_by_name};
use crate::profil::{ProfilFlags, Profile, Region};

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
        papirus_substrate::Count { raw: 0, time_enabled: self.time_enabled, time_running: self.time_running }
            .scaling()
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

#[derive(Clone, Debug)]
struct Entry {
    info: EventInfo,
    attrs: Vec<EventAttr>,
    hw_terms: usize,
    overflow: Option<Overflow>,
}

/// An event's overflow: its descriptor samples every `threshold` events.
#[derive(Clone, Debug)]
struct Overflow {
    threshold: u64,
    dispatch: Dispatch,
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

/// Where one native term lives: its group and member.
#[derive(Clone, Copy, Debug)]
struct Slot {
    group: usize,
    member: Member,
}

/// A group's counts and times at the last start, reset or accum.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    raw: Vec<u64>,
    enabled: u64,
    running: u64,
}

#[derive(Debug)]
struct Opened {
    /// Per entry, the overflow routing of its sampling descriptor. Declared
    /// first so routes drop before the descriptors close.
    routes: Vec<Option<Route>>,
    groups: Vec<Group>,
    /// Per group, its user-space read state. In a `Mutex` only so that the
    /// set stays `Sync`; reads take `&mut self` and use `get_mut` (no lock).
    pages: Vec<Mutex<GroupPages>>,
    /// Per event, the user-space path of each term (copied out of `pages`).
    paths: Vec<Vec<UserPath>>,
    slots: Vec<Vec<Slot>>,
    base: Vec<Snapshot>,
    /// Per group, the counts of the last read, indexed by member.
    counts: Vec<Vec<papirus_substrate::Count>>,
    /// Per group, the highest count returned per member (reads never go down).
    high: Vec<Vec<u64>>,
    target: Target,
    /// What `start` must do to zero the counters.
    zero: Zero,
}

/// How `start` finds the zero of the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Zero {
    /// Never enabled: counts and times are 0, the default snapshot.
    Fresh,
    /// `scratch` holds a read taken while disabled, and a disabled,
    /// uninherited event does not change: rebase on it, no syscall.
    LastRead,
    /// Read the counters (inherited events gain exited children's counts
    /// even while disabled).
    Read,
}

/// A PAPI event set. See the [module documentation](self).
pub struct EventSet {
    lib: Library,
    id: u64,
    owner: Tid,
    entries: Vec<Entry>,
    options: Options,
    opened: Option<Opened>,
    running: Option<Target>,
    /// Reused by accum so it does not allocate.
    tmp: Vec<i64>,
    /// How the last read obtained its values.
    last_path: Option<ReadPath>,
    /// Whether reads may take the user-space path.
    user_space: bool,
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

/// What to add: a name or a code.
#[derive(Clone, Copy, Debug)]
enum Key<'a> {
    Name(&'a str),
    Code(u32),
}

/// The set entry of one resolved native event.
fn native_entry(resolved: native::Resolved) -> Entry {
    let attr = resolved.parsed.attr;
    Entry {
        hw_terms: usize::from(attr.kind() == Kind::Hardware),
        info: EventInfo {
            code: resolved.code,
            name: resolved.name.clone(),
            preset: false,
            derivation: Derivation::NotDerived,
            terms: vec![resolved.name],
            note: None,
            unit: resolved.parsed.unit,
            scale: resolved.parsed.scale,
        },
        attrs: vec![attr],
        overflow: None,
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
            last_path: None,
            user_space: true,
            claimed: false,
            signal: default_signal(),
        }
    }

    /// Adds an event by name: a PAPI preset (`PAPI_TOT_CYC`, any case), or a
    /// native event in perf's syntax (`task-clock`, `msr/tsc/`, `r01c2`).
    /// Returns the event's code.
    pub fn add_named(&mut self, name: &str) -> Result<u32> {
        self.add(Key::Name(name))
    }

    /// Adds an event by code: a preset (`0x80000000 | index`) or a native
    /// code this process handed out.
    pub fn add_code(&mut self, code: u32) -> Result<u32> {
        self.add(Key::Code(code))
    }

    /// Adds several events by name, stopping at the first failure (the
    /// events before it stay added).
    ///
    /// A list of native events is opened once for the whole list, so adding
    /// n events costs n opens rather than n²/2 (closing a tracepoint waits
    /// for an RCU grace period: 100 tracepoints one by one took minutes).
    /// When that fails, or presets are in the list, the events are added one
    /// by one, which finds the culprit and applies each event's fallbacks.
    pub fn add_all<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> Result<Vec<u32>> {
        let names: Vec<&str> = names.into_iter().collect();
        if self.running.is_none() && names.len() > 1 && self.add_batch(&names).is_some() {
            return Ok(self.entries[self.entries.len() - names.len()..]
                .iter()
                .map(|e| e.info.code)
                .collect());
        }
        names.into_iter().map(|n| self.add_named(n)).collect()
    }

    /// Adds native events `names` with one reopen; `None` (and the set as
    /// before) when any is a preset, a duplicate, unknown, or fails to open.
    fn add_batch(&mut self, names: &[&str]) -> Option<()> {
        let mut codes: std::collections::HashSet<u32> = self.entries.iter().map(|e| e.info.code).collect();
        let mut batch = Vec::with_capacity(names.len());
        for n in names {
            if preset_by_name(n.trim()).is_some() {
                return None;
            }
            let entry = native_entry(native::resolve(n).ok()?);
            if !codes.insert(entry.info.code) {
                return None;
            }
            batch.push(entry);
        }
        let before = self.entries.len();
        self.entries.extend(batch);
        if self.reopen().is_ok() {
            return Some(());
        }
        self.entries.truncate(before);
        self.reopen_or_clear();
        None
    }

    fn add(&mut self, key: Key<'_>) -> Result<u32> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Add });
        }
        let preset = match key {
            Key::Name(n) => preset_by_name(n.trim()),
            Key::Code(c) if c & 0xC000_0000 == PRESET_MASK => {
                Some(preset_by_code(c).ok_or(Error::NoSuchCode { code: c })?)
            }
            Key::Code(_) => None,
        };
        if let Some(p) = preset {
            if self.entries.iter().any(|e| e.info.code == p.code()) {
                return Err(Error::Duplicate { event: p.name.to_string() });
            }
            return self.add_preset(p.name, p.code());
        }
        let resolved = match key {
            Key::Name(n) => native::resolve(n)?,
            Key::Code(c) if c & 0xC000_0000 == NATIVE_MASK => native::resolve_code(c)?,
            Key::Code(c) => return Err(Error::NoSuchCode { code: c }),
        };
        if self.entries.iter().any(|e| e.info.code == resolved.code) {
            return Err(Error::Duplicate { event: resolved.name });
        }
        let code = resolved.code;
        let entry = native_entry(resolved);
        let fallback = (entry.attrs[0].domain_value() != Domain::USER
            && self.options.domain.is_none()
            && !native::has_modifier(&entry.info.name))
        .then(|| entry.clone());
        match (self.push(entry), fallback) {
            (Ok(()), _) => Ok(code),
            // As perf does: a default domain with the kernel in it is refused
            // at perf_event_paranoid ≥ 2 without CAP_PERFMON; count user space.
            (Err(Error::Substrate(papirus_substrate::Error::Permission { .. })), Some(mut entry)) => {
                entry.attrs[0].domain(Domain::USER);
                entry.info.note = Some(
                    "user space only: counting the kernel is not permitted here (perf_event_paranoid ≥ 2 without CAP_PERFMON)"
                        .into(),
                );
                self.push(entry)?;
                Ok(code)
            }
            (Err(e), _) => Err(e),
        }
    }

    fn add_preset(&mut self, name: &str, code: u32) -> Result<u32> {
        let machine = self.lib.machine().clone();
        let defs: Vec<Definition> =
            self.lib.presets().definitions(&machine.cpu, name).into_iter().cloned().collect();
        if defs.is_empty() {
            return Err(Error::PresetUnavailable {
                name: name.to_string(),
                reason: format!("no definition for {} and no generic perf one", machine.cpu),
            });
        }
        let mut last = None;
        for def in defs {
            let entry = match preset_entry(name, code, &def) {
                Ok(e) => e,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match self.push(entry) {
                Ok(()) => return Ok(code),
                Err(e) => last = Some(e),
            }
        }
        let err =
            last.unwrap_or(Error::PresetUnavailable { name: name.into(), reason: "no definition".into() });
        // A preset that exists but cannot open here is "not available", with the reason.
        Err(match err {
            Error::Substrate(papirus_substrate::Error::Unsupported {
                hardware: true,
                ref event,
                errno,
                ..
            }) => {
                let reason = match &machine.no_hardware_reason {
                    Some(why) => format!("{why} (perf_event_open of `{event}` returned {errno})"),
                    None => err.to_string(),
                };
                Error::PresetUnavailable { name: name.to_string(), reason }
            }
            Error::Substrate(e @ papirus_substrate::Error::Unsupported { .. }) => {
                Error::PresetUnavailable { name: name.to_string(), reason: e.to_string() }
            }
            other => other,
        })
    }

    /// Opens the set with `entry` appended; keeps the old layout on failure.
    fn push(&mut self, entry: Entry) -> Result<()> {
        self.entries.push(entry);
        match self.reopen() {
            Ok(()) => Ok(()),
            Err(e) => {
                let bad = self.entries.pop();
                // The old layout was opened before and is unchanged; reopening restores it.
                self.reopen_or_clear();
                Err(match (e, bad) {
                    (Error::Substrate(papirus_substrate::Error::NoCounterSlot { .. }), Some(b)) => Error::Conflict {
                        event: b.info.name,
                        reason: "no free counter slot for it beside the set's other events (x86 has 4 debug \
                                 registers for breakpoints per thread); remove events or use another set on another thread"
                            .into(),
                    },
                    (e, _) => e,
                })
            }
        }
    }

    fn reopen_or_clear(&mut self) {
        if self.reopen().is_err() {
            // Something outside changed (the attached task exited); keep the entries, closed.
            self.opened = None;
        }
    }

    /// Removes an event by name or code (as added). Fails with EINVAL when
    /// it is not in the set.
    pub fn remove_named(&mut self, name: &str) -> Result<()> {
        let code = match preset_by_name(name.trim()) {
            Some(p) => p.code(),
            None => native::code_of(name),
        };
        self.remove_code(code).map_err(|e| match e {
            Error::NotInSet { .. } => Error::NotInSet { event: name.to_string() },
            e => e,
        })
    }

    /// Removes the event with `code`.
    pub fn remove_code(&mut self, code: u32) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Remove });
        }
        let at = self
            .entries
            .iter()
            .position(|e| e.info.code == code)
            .ok_or_else(|| Error::NotInSet { event: format!("{code:#010x}") })?;
        let removed = self.entries.remove(at);
        if let Err(e) = self.reopen() {
            self.entries.insert(at, removed);
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// Removes every event (PAPI's cleanup); the set must be stopped.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Cleanup });
        }
        self.entries.clear();
        self.opened = None;
        Ok(())
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

    fn set_option(&mut self, change: impl FnOnce(&mut Options) -> Result<()>) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        let old = self.options;
        change(&mut self.options)?;
        if let Err(e) = self.check_options().and_then(|()| self.reopen()) {
            self.options = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    fn check_options(&self) -> Result<()> {
        let o = &self.options;
        if let Some(e) = self.entries.iter().find(|e| e.overflow.is_some()) {
            check_overflow_options(o, &e.info.name)?;
        }
        if o.granularity == Granularity::System && o.attached.is_some() {
            return Err(Error::Combination {
                reason: "system-wide granularity counts a CPU, not a task: detach first".into(),
            });
        }
        if o.granularity == Granularity::System && o.cpu.is_none() {
            return Err(Error::Combination {
                reason: "system-wide granularity needs a CPU: call set_cpu first".into(),
            });
        }
        Ok(())
    }

    /// Sets the counting domain of every event (`None`: each event's default).
    pub fn set_domain(&mut self, domain: Option<Domain>) -> Result<()> {
        self.set_option(|o| {
            o.domain = domain;
            Ok(())
        })
    }

    /// Sets the granularity.
    pub fn set_granularity(&mut self, g: Granularity) -> Result<()> {
        self.set_option(|o| {
            o.granularity = g;
            Ok(())
        })
    }

    /// Counts process or thread `pid` instead of the owner (PAPI_attach).
    /// Fails with ESYS when it does not exist, EPERM when this process may
    /// not trace it.
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        if pid <= 0 {
            return Err(Error::Invalid {
                what: "pid",
                reason: format!("{pid}: a process or thread id is positive"),
            });
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Error::NoSuchProcess { pid });
        }
        self.set_option(|o| {
            o.attached = Some(pid);
            Ok(())
        })
    }

    /// Counts the owner again (PAPI_detach).
    pub fn detach(&mut self) -> Result<()> {
        self.set_option(|o| {
            o.attached = None;
            Ok(())
        })
    }

    /// Restricts counting to one CPU (`None`: any CPU).
    pub fn set_cpu(&mut self, cpu: Option<u32>) -> Result<()> {
        let cpus = self.lib.machine().cpus;
        if let Some(c) = cpu
            && c as usize >= cpus
        {
            return Err(Error::Invalid {
                what: "cpu",
                reason: format!("CPU {c} does not exist: this machine has CPUs 0-{}", cpus - 1),
            });
        }
        self.set_option(|o| {
            o.cpu = cpu;
            Ok(())
        })
    }

    /// Turns multiplexing on or off.
    pub fn set_multiplex(&mut self, on: bool) -> Result<()> {
        self.set_option(|o| {
            o.multiplex = on;
            Ok(())
        })
    }

    fn target(&self) -> Target {
        let o = &self.options;
        match (o.granularity, o.attached, o.cpu) {
            (Granularity::System, _, Some(cpu)) => Target::Cpu(cpu),
            (_, Some(pid), None) => Target::Task(pid),
            (_, Some(pid), Some(cpu)) => Target::TaskOnCpu { pid, cpu },
            (_, None, cpu) => {
                let pid = if thread_id() == self.owner { 0 } else { self.owner };
                match (pid, cpu) {
                    (0, None) => Target::ThisThread,
                    (pid, None) => Target::Task(pid),
                    (pid, Some(cpu)) => Target::TaskOnCpu { pid, cpu },
                }
            }
        }
    }

    /// (Re)opens every descriptor for the current entries and options.
    fn reopen(&mut self) -> Result<()> {
        self.opened = None;
        if self.entries.is_empty() {
            return Ok(());
        }
        let hw: usize = self.entries.iter().map(|e| e.hw_terms).sum();
        if let Some(limit) = self.lib.machine().hw_counters.filter(|&n| n > 0) {
            let widest = self.entries.iter().map(|e| e.hw_terms).max().unwrap_or(0);
            if self.options.multiplex && widest > limit {
                let e =
                    self.entries.iter().find(|e| e.hw_terms == widest).map_or("", |e| e.info.name.as_str());
                return Err(Error::Conflict {
                    event: e.to_string(),
                    reason: format!(
                        "its {widest} terms must be counted together but this CPU has {limit} counters"
                    ),
                });
            }
            if !self.options.multiplex && hw > limit {
                let last = self.entries.last().map_or("", |e| e.info.name.as_str());
                return Err(Error::Conflict {
                    event: last.to_string(),
                    reason: format!(
                        "the set would need {hw} hardware counters and this CPU has {limit}; turn on multiplexing (set_multiplex(true)) or split the events over several sets run one after another"
                    ),
                });
            }
        }
        let target = self.target();
        let sys = self.lib.sys();
        // Open order: entry by entry, term by term; without multiplexing the
        // first term that is not a software clock leads the one group (a group
        // led by task-clock or cpu-clock loses its software members' counts
        // across context switches: ~2% of page faults on a busy 2-CPU VM).
        // Breakpoints form a group of their own, first: measured on 6.18
        // here, a breakpoint in a group led by a software event counts 0,
        // and software members of a breakpoint-led group sometimes do too.
        let bp = |e: &Entry| matches!(e.attrs.as_slice(), [a] if a.type_() == PERF_TYPE_BREAKPOINT);
        let split = !self.options.multiplex;
        let terms = |want_bp: bool| {
            self.entries
                .iter()
                .enumerate()
                .filter(move |(_, e)| !split || bp(e) == want_bp)
                .flat_map(|(i, e)| (0..e.attrs.len()).map(move |k| (i, k)))
                .collect::<Vec<_>>()
        };
        let breakpoints = if split { terms(true) } else { vec![] };
        let mut order = terms(false);
        if !self.options.multiplex
            && let Some(p) = order.iter().position(|&(i, k)| !is_sw_clock(&self.entries[i].attrs[k]))
        {
            let lead = order.remove(p);
            order.insert(0, lead);
        }
        // The first term after the breakpoints starts the second group.
        let second_group = breakpoints.len();
        order.splice(0..0, breakpoints);
        let (mut groups, mut slots): (Vec<Group>, Vec<Vec<Option<Slot>>>) =
            (vec![], self.entries.iter().map(|e| vec![None; e.attrs.len()]).collect());
        let mut group_attrs: Vec<Vec<EventAttr>> = vec![];
        for (n, (i, k)) in order.into_iter().enumerate() {
            let mut a = self.entries[i].attrs[k].clone();
            if let Some(d) = self.options.domain {
                a.domain(d);
            }
            a.inherit(self.options.granularity == Granularity::Process);
            // An overflowing event (one term) is the same descriptor, sampling.
            let sampling = self.entries[i].overflow.as_ref().map(|o| overflow::sampling(o.threshold));
            let slot =
                if groups.is_empty() || (self.options.multiplex && k == 0) || (split && n == second_group) {
                    // A pinned leader keeps an unmultiplexed set on the PMU or in error state.
                    a.pinned(!self.options.multiplex);
                    groups.push(match &sampling {
                        Some(s) => Group::open_sampling_with(sys.clone(), &a, s, target)?,
                        None => Group::open_with(sys.clone(), &a, target)?,
                    });
                    group_attrs.push(vec![a]);
                    let g = groups.len() - 1;
                    Slot { group: g, member: groups[g].leader() }
                } else {
                    let g = groups.len() - 1;
                    let member = match &sampling {
                        Some(s) => groups[g].add_sampling(&a, s)?,
                        None => groups[g].add(&a)?,
                    };
                    group_attrs[g].push(a);
                    Slot { group: g, member }
                };
            slots[i][k] = Some(slot);
        }
        let slots: Vec<Vec<Slot>> = slots.into_iter().map(|v| v.into_iter().flatten().collect()).collect();
        let n = groups.len();
        let no_pages = self.no_user_space();
        let pages: Vec<GroupPages> = groups
            .iter()
            .zip(&group_attrs)
            .map(|(g, attrs)| match &no_pages {
                Some(reason) => GroupPages::unmapped(g, reason),
                None => GroupPages::map(&*sys, g, attrs),
            })
            .collect();
        let paths = slots
            .iter()
            .map(|terms| terms.iter().map(|s| pages[s.group].paths()[s.member.index()].clone()).collect())
            .collect();
        let mut opened = Opened {
            routes: self.entries.iter().map(|_| None).collect(),
            counts: groups.iter().map(|g| vec![papirus_substrate::Count::default(); g.len()]).collect(),
            high: groups.iter().map(|g| vec![0; g.len()]).collect(),
            pages: pages.into_iter().map(Mutex::new).collect(),
            paths,
            groups,
            slots,
            base: vec![Snapshot::default(); n],
            target,
            zero: if self.options.granularity == Granularity::Process { Zero::Read } else { Zero::Fresh },
        };
        if hw > 0 && !self.options.multiplex {
            check_schedulable(&mut opened, &self.entries)?;
            opened.zero = Zero::Read;
        }
        // Rings are mapped after that check: samples of an unmapped event are
        // discarded by the kernel, so the check cannot call a handler.
        for (i, e) in self.entries.iter().enumerate() {
            let Some(ov) = &e.overflow else { continue };
            let Some(slot) = opened.slots[i].first() else { continue };
            let fd = opened.groups[slot.group].fd(&slot.member).ok_or_else(|| closed(SetOp::SetOption))?;
            let s = overflow::sampling(ov.threshold);
            let ring = RingBuffer::map(sys.clone(), fd, s.data_pages_value(), s.layout(), &e.info.name)?;
            let callback = overflow::callback(self.id, i, ov.threshold, ov.dispatch.clone());
            let route = Route::attach(&sys, fd, &e.info.name, ring, self.signal, self.owner, callback)?;
            opened.routes[i] = Some(route);
        }
        self.opened = Some(opened);
        Ok(())
    }

    /// Why the set's groups are read by `read(2)` whatever their events,
    /// or `None` when each group's pages decide.
    fn no_user_space(&self) -> Option<String> {
        if self.options.multiplex {
            return Some("multiplexed: scaling needs the kernel's enabled and running times".into());
        }
        if self.options.granularity == Granularity::Process {
            return Some("process granularity: inherited events also count children".into());
        }
        if self.entries.iter().any(|e| e.overflow.is_some()) {
            return Some("an event overflows: its descriptor's mapping is the sampling ring".into());
        }
        None
    }

    fn opened(&mut self, op: SetOp) -> Result<&mut Opened> {
        self.opened.as_mut().ok_or_else(|| closed(op))
    }

    /// Resets and starts counting. Fails with EISRUN when running, EINVAL
    /// when empty, ECNFLCT when other running sets hold the counters.
    pub fn start(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Start });
        }
        if self.entries.is_empty() {
            return Err(Error::EmptySet);
        }
        let hw = if self.options.multiplex { 0 } else { self.entries.iter().map(|e| e.hw_terms).sum() };
        let id = self.id;
        let key = self_key(self.opened(SetOp::Start)?.target, self.owner);
        if hw > 0
            && let Err(used) = self.lib.claim(key, id, hw)
        {
            return Err(Error::Conflict {
                event: self.entries.iter().map(|e| e.info.name.as_str()).collect::<Vec<_>>().join(","),
                reason: format!(
                    "other running event sets on this target hold {used} of the {} hardware counters and this set needs {hw}; stop them first or turn on multiplexing",
                    self.lib.machine().hw_counters.unwrap_or(0)
                ),
            });
        }
        let opened = self.opened.as_mut().ok_or(Error::EmptySet)?;
        let zeroed = match opened.zero {
            Zero::Fresh => Ok(()),
            Zero::LastRead => {
                rebase(opened);
                Ok(())
            }
            Zero::Read => snapshot(opened, false, true).map(drop),
        };
        let r = zeroed.and_then(|()| opened.groups.iter().try_for_each(|g| g.enable().map_err(Error::from)));
        if let Err(e) = r {
            for g in &opened.groups {
                let _ = g.disable();
            }
            if hw > 0 {
                self.lib.release(key, id);
            }
            return Err(e);
        }
        self.running = Some(key);
        self.claimed = hw > 0;
        Ok(())
    }

    /// Stops counting and returns the values since start (or the last
    /// reset/accum). Fails with ENOTRUN when not running.
    pub fn stop(&mut self) -> Result<Vec<i64>> {
        let mut v = vec![0; self.entries.len()];
        self.stop_into(&mut v)?;
        Ok(v)
    }

    /// Like [`EventSet::stop`], into `values` (one per event).
    pub fn stop_into(&mut self, values: &mut [i64]) -> Result<()> {
        let key = self.running.ok_or(Error::NotRunning { op: SetOp::Stop })?;
        self.check_len(values.len())?;
        let opened = self.opened(SetOp::Stop)?;
        let mut first_err = None;
        for g in &opened.groups {
            if let Err(e) = g.disable() {
                first_err.get_or_insert(Error::from(e));
            }
        }
        if std::mem::take(&mut self.claimed) {
            self.lib.release(key, self.id);
        }
        self.running = None;
        if let Some(e) = first_err {
            return Err(e);
        }
        self.read_values(values, None)?;
        let inherit = self.options.granularity == Granularity::Process;
        if let Some(o) = self.opened.as_mut() {
            o.zero = if inherit { Zero::Read } else { Zero::LastRead };
        }
        Ok(())
    }

    fn check_len(&self, got: usize) -> Result<()> {
        if got != self.entries.len() {
            return Err(Error::Buffer { got, expected: self.entries.len() });
        }
        Ok(())
    }

    /// The current values (no reset). Works on a stopped set too (the
    /// values at stop), as PAPI's read does.
    pub fn read(&mut self) -> Result<Vec<i64>> {
        let mut v = vec![0; self.entries.len()];
        self.read_into(&mut v)?;
        Ok(v)
    }

    /// Like [`EventSet::read`], into `values` without allocating.
    pub fn read_into(&mut self, values: &mut [i64]) -> Result<()> {
        self.check_len(values.len())?;
        self.read_values(values, None)
    }

    /// The current values with their scaling.
    pub fn read_detailed(&mut self) -> Result<Vec<Value>> {
        let n = self.entries.len();
        let mut v = vec![0; n];
        let mut d = vec![Value { value: 0, raw: 0, time_enabled: 0, time_running: 0 }; n];
        self.read_values(&mut v, Some(&mut d))?;
        Ok(d)
    }

    /// The current values and the real-time timestamp (TSC ticks, as
    /// [`real_cyc`](crate::real_cyc)) taken right after the read.
    pub fn read_ts(&mut self, values: &mut [i64]) -> Result<u64> {
        self.read_into(values)?;
        Ok(crate::library::real_cyc())
    }

    /// Adds the current values into `values` and resets the counters
    /// (PAPI_accum). Needs a running set.
    pub fn accum(&mut self, values: &mut [i64]) -> Result<()> {
        if self.running.is_none() {
            return Err(Error::NotRunning { op: SetOp::Accum });
        }
        self.check_len(values.len())?;
        let mut now = std::mem::take(&mut self.tmp);
        now.resize(values.len(), 0);
        let r = self.read_values(&mut now, None);
        if r.is_ok() {
            for (v, n) in values.iter_mut().zip(&now) {
                *v = v.saturating_add(*n);
            }
            if let Some(o) = self.opened.as_mut() {
                rebase(o);
            }
        }
        self.tmp = now;
        r
    }

    /// Zeroes the counters (running or stopped).
    pub fn reset(&mut self) -> Result<()> {
        let (running, user_space) = (self.running.is_some(), self.user_space);
        let opened = self.opened(SetOp::Reset)?;
        self.last_path = Some(snapshot(opened, running, user_space)?);
        Ok(())
    }

    /// Whether reads may take the user-space path (the default) or always
    /// use `read(2)`; may change at any time, running or not. With it off,
    /// values are the kernel's own, not held at the highest value returned
    /// before (see the [module documentation](self)): a reference to
    /// compare user-space reads with, or a way to rule them out.
    pub fn set_user_space_reads(&mut self, on: bool) {
        self.user_space = on;
    }

    /// Whether reads may take the user-space path.
    pub fn user_space_reads(&self) -> bool {
        self.user_space
    }

    /// How the last read, `read_ts`, `accum`, `stop` or `reset` obtained
    /// its values (`None` before the first): [`ReadPath::UserSpace`] when
    /// every group was read without a system call, [`ReadPath::Resync`]
    /// when a group's user-space base was resynchronised by one `read(2)`,
    /// [`ReadPath::Syscall`] when some group was read by `read(2)` only.
    pub fn read_path(&self) -> Option<ReadPath> {
        self.last_path
    }

    /// Per event, the user-space path of each native term (see
    /// [`UserPath`]; its `None` variant says why a term is read by `read(2)`).
    /// Empty when the set is closed.
    pub fn user_paths(&self) -> Vec<Vec<UserPath>> {
        self.opened.as_ref().map_or_else(Vec::new, |o| o.paths.clone())
    }

    /// perf cannot load a value into a counter: always ENOSUPP.
    pub fn write(&mut self, _values: &[i64]) -> Result<()> {
        Err(Error::NotSupported {
            op: SetOp::Write,
            reason:
                "perf_event has no way to set a counter's value; use reset() to zero it, or keep an offset"
                    .into(),
        })
    }

    fn read_values(&mut self, values: &mut [i64], mut detail: Option<&mut [Value]>) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let opened = self.opened.as_mut().ok_or_else(|| closed(SetOp::Read))?;
        self.last_path = Some(read_groups(opened, self.running.is_some(), self.user_space)?);
        let mut terms: Vec<i64> = Vec::with_capacity(4);
        for (i, entry) in self.entries.iter().enumerate() {
            terms.clear();
            let slots = &opened.slots[i];
            let g = slots.first().map_or(0, |s| s.group);
            let (counts, base) = (&opened.counts[g], &opened.base[g]);
            for s in slots {
                let now = counts.get(s.member.index()).map_or(0, |c| c.raw);
                let then = base.raw.get(s.member.index()).copied().unwrap_or(0);
                terms.push(now.wrapping_sub(then) as i64);
            }
            let raw = entry.info.derivation.eval(&terms);
            let lead = counts.first().copied().unwrap_or_default();
            let enabled = lead.time_enabled.saturating_sub(base.enabled);
            let running = lead.time_running.saturating_sub(base.running);
            let value = scale(raw, enabled, running);
            values[i] = value;
            if let Some(d) = detail.as_deref_mut() {
                d[i] = Value { value, raw, time_enabled: enabled, time_running: running };
            }
        }
        Ok(())
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

    /// PAPI's overflow rules, then the change applied and the set reopened
    /// (the old state kept on failure).
    /// `dispatch` `None` (or threshold 0) turns overflow off.
    fn set_overflow(
        &mut self,
        event: EventRef<'_>,
        threshold: u64,
        flags: u32,
        dispatch: Option<Dispatch>,
    ) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        let i = self.index_of(event)?;
        let new = if let Some(d) = dispatch.filter(|_| threshold > 0) {
            let e = &self.entries[i];
            if let [_, _, ..] = e.attrs.as_slice() {
                return Err(Error::Invalid {
                    what: "overflow event",
                    reason: format!(
                        "`{}` is derived from {} native events ({}): perf samples one event, and a sum or difference of counters has no overflow point; set overflow on one of its native terms instead",
                        e.info.name,
                        e.attrs.len(),
                        e.info.terms.join(", ")
                    ),
                });
            }
            if i >= 64 {
                return Err(Error::Invalid {
                    what: "overflow event",
                    reason: format!(
                        "event #{i}: an overflow vector has 64 bits, so only the set's first 64 events can overflow"
                    ),
                });
            }
            overflow::check_request(&e.attrs[0], threshold, flags)?;
            check_overflow_options(&self.options, &e.info.name)?;
            Some(Overflow { threshold, dispatch: d })
        } else {
            None
        };
        let old = std::mem::replace(&mut self.entries[i].overflow, new);
        if let Err(e) = self.reopen() {
            self.entries[i].overflow = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// `PAPI_overflow`: calls `handler` on the counted thread every
    /// `threshold` events of `event` (a code, position or name in the set);
    /// threshold 0 turns overflow (or profil) of the event off. `flags`: 0 or
    /// [`OVERFLOW_HARDWARE`](crate::overflow::OVERFLOW_HARDWARE).
    ///
    /// The handler runs in signal context (see [`crate::overflow`]). The
    /// event keeps its one descriptor, now sampling, so its value in
    /// [`EventSet::read`] and [`EventSet::stop`] stays the exact count.
    ///
    /// Errors: EISRUN while running; ENOEVNT when `event` is not in the set;
    /// EINVAL for a derived event, a task-clock/cpu-clock period under
    /// 100 µs, unknown flags, or a set attached to another task or to a
    /// CPU; ECOMBO with process granularity; ENOSUPP for
    /// `OVERFLOW_FORCE_SW`.
    pub fn overflow<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        threshold: u64,
        flags: u32,
        handler: OverflowHandler,
    ) -> Result<()> {
        self.set_overflow(event.into(), threshold, flags, Some(Dispatch::Handler(handler)))
    }

    /// Like [`EventSet::overflow`], but each overflow is queued in `queue`
    /// for a normal thread to drain; a full queue counts the drop.
    pub fn overflow_deferred<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        threshold: u64,
        queue: Arc<SampleQueue>,
    ) -> Result<()> {
        self.set_overflow(event.into(), threshold, 0, Some(Dispatch::Deferred(queue)))
    }

    /// `PAPI_profil`: a PC histogram of `event` sampled every `threshold`
    /// events over one region (see [`crate::profil`]). Returns the profile
    /// being filled, or `None` when threshold 0 turned profiling off. The
    /// rules are [`EventSet::overflow`]'s.
    pub fn profil<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        region: Region,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Option<Arc<Profile>>> {
        self.sprofil(event, vec![region], threshold, flags)
    }

    /// `PAPI_sprofil`: like [`EventSet::profil`] over several regions.
    pub fn sprofil<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        regions: Vec<Region>,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Option<Arc<Profile>>> {
        let event = event.into();
        if threshold == 0 {
            self.set_overflow(event, 0, 0, None)?;
            return Ok(None);
        }
        // Refuses FORCE_SW and the EAR flags with ENOSUPP.
        let profile = Arc::new(Profile::new(regions, flags, threshold)?);
        self.set_overflow(event, threshold, 0, Some(Dispatch::Profile(profile.clone())))?;
        Ok(Some(profile))
    }

    /// The overflow threshold of `event`, 0 when it does not overflow.
    pub fn overflow_threshold<'a>(&self, event: impl Into<EventRef<'a>>) -> Result<u64> {
        let i = self.index_of(event)?;
        Ok(self.entries[i].overflow.as_ref().map_or(0, |o| o.threshold))
    }

    /// Signals, samples and losses the handler has seen for overflowing
    /// `event` since its descriptor was opened (the last overflow or
    /// membership change); `None` when it does not overflow.
    pub fn overflow_stats<'a>(&self, event: impl Into<EventRef<'a>>) -> Option<NotifierStats> {
        let i = self.index_of(event).ok()?;
        self.opened.as_ref()?.routes.get(i)?.as_ref().map(Route::stats)
    }

    /// Routes this set's overflows to real-time signal `signal` (default
    /// `SIGRTMAX - 3`, see [`papirus_substrate::signal`]). The set must be stopped.
    pub fn set_overflow_signal(&mut self, signal: i32) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
            return Err(Error::Invalid {
                what: "overflow signal",
                reason: format!(
                    "{signal} is not a real-time signal ({}..={}): overflows need a queued signal",
                    libc::SIGRTMIN(),
                    libc::SIGRTMAX()
                ),
            });
        }
        let old = std::mem::replace(&mut self.signal, signal);
        if self.entries.iter().any(|e| e.overflow.is_some())
            && let Err(e) = self.reopen()
        {
            self.signal = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// The real-time signal this set's overflows use.
    pub fn overflow_signal(&self) -> i32 {
        self.signal
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

fn closed(op: SetOp) -> Error {
    Error::Invalid {
        what: "event set",
        reason: format!("cannot {op}: its events are closed after a failed change; remove and re-add them"),
    }
}

/// PAPI's option rules for overflow: the kernel signals the thread that
/// owns a sampling descriptor's `F_SETOWN_EX`, which must be the counted
/// thread for the handler's address and context to be that thread's.
fn check_overflow_options(o: &Options, event: &str) -> Result<()> {
    if let Some(pid) = o.attached {
        return Err(Error::Invalid {
            what: "overflow",
            reason: format!(
                "`{event}` overflows, and the set is attached to task {pid}: its samples would interrupt this set's owner thread with another task's addresses; detach, or sample that task from a set created on one of its threads"
            ),
        });
    }
    if o.granularity == Granularity::System {
        return Err(Error::Invalid {
            what: "overflow",
            reason: format!(
                "`{event}` overflows, and a system-wide set counts a CPU, not a thread that could receive the signal; use thread granularity"
            ),
        });
    }
    if o.granularity == Granularity::Process {
        return Err(Error::Combination {
            reason: format!(
                "`{event}` overflows, and process granularity (inherit) would send the samples of child tasks to this thread's handler; use thread granularity"
            ),
        });
    }
    Ok(())
}

/// The target as a key for counter accounting: the owner by its tid.
fn self_key(t: Target, owner: Tid) -> Target {
    match t {
        Target::ThisThread => Target::Task(owner),
        Target::TaskOnCpu { pid: 0, cpu } => Target::TaskOnCpu { pid: owner, cpu },
        t => t,
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

/// task-clock and cpu-clock: software events driven by hrtimers.
fn is_sw_clock(a: &EventAttr) -> bool {
    a.type_() == papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE && a.config_value() <= 1
}

/// Scales `raw` by `enabled / running` exactly, saturating; 0 when the
/// event never ran.
fn scale(raw: i64, enabled: u64, running: u64) -> i64 {
    if running == 0 {
        return if enabled == 0 { raw } else { 0 };
    }
    if running >= enabled {
        return raw;
    }
    let v = i128::from(raw) * i128::from(enabled) / i128::from(running);
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Makes the counts last read into `counts` the new zero.
fn rebase(o: &mut Opened) {
    for (base, counts) in o.base.iter_mut().zip(&o.counts) {
        base.raw.clear();
        base.raw.extend(counts.iter().map(|c| c.raw));
        // Every member of a group shares the leader's times.
        let lead = counts.first().copied().unwrap_or_default();
        (base.enabled, base.running) = (lead.time_enabled, lead.time_running);
    }
}

/// Reads every group into `counts`, each by user space where it can
/// (`running`: the groups are enabled), and returns the path of the read:
/// user space only when every group took it. `user_space` false: every
/// group by `read(2)`, values as the kernel gives them (not held).
fn read_groups(o: &mut Opened, running: bool, user_space: bool) -> Result<ReadPath> {
    let mut path = ReadPath::UserSpace;
    for (g, group) in o.groups.iter().enumerate() {
        let pages = o.pages[g].get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let counts = &mut o.counts[g];
        let p = pages
            .read_into(group, running && user_space, counts)
            .map_err(|e| conflict_on_error_state(e, group))?;
        if user_space {
            // A value extrapolated ahead of the kernel's is held, never taken back.
            for (c, h) in counts.iter_mut().zip(&mut o.high[g]) {
                c.raw = c.raw.max(*h);
                *h = c.raw;
            }
        }
        path = match (path, p) {
            (ReadPath::Syscall, _) | (_, ReadPath::Syscall) => ReadPath::Syscall,
            (ReadPath::Resync, _) | (_, ReadPath::Resync) => ReadPath::Resync,
            _ => ReadPath::UserSpace,
        };
    }
    Ok(path)
}

/// Reads every group and makes the counts the new zero.
fn snapshot(o: &mut Opened, running: bool, user_space: bool) -> Result<ReadPath> {
    let path = read_groups(o, running, user_space)?;
    rebase(o);
    Ok(path)
}

fn conflict_on_error_state(e: papirus_substrate::Error, group: &Group) -> Error {
    match e {
        papirus_substrate::Error::InErrorState { event } => Error::Conflict {
            event,
            reason: format!(
                "the kernel could not put the set's {} events on the counters together (another pinned group or the NMI watchdog may hold some); turn on multiplexing or use fewer events",
                group.len()
            ),
        },
        e => e.into(),
    }
}

/// PAPI's add-time check: enable the groups briefly and see that the kernel
/// scheduled them, so a set that can never count fails to add.
fn check_schedulable(o: &mut Opened, entries: &[Entry]) -> Result<()> {
    let mut c = GroupCounts::default();
    for g in &o.groups {
        check_group(g, &mut c, entries)?;
    }
    Ok(())
}

fn check_group(g: &Group, c: &mut GroupCounts, entries: &[Entry]) -> Result<()> {
    g.enable()?;
    let mut spin = 0u64;
    for i in 0..10_000u64 {
        spin = std::hint::black_box(spin.wrapping_add(i));
    }
    g.disable()?;
    g.read_into(c).map_err(|e| conflict_on_error_state(e, g))?;
    if c.time_enabled() > 0 && c.time_running() == 0 {
        let last = entries.last().map_or("", |e| e.info.name.as_str());
        return Err(Error::Conflict {
            event: last.to_string(),
            reason: format!(
                "the kernel could not schedule the set's {} events together on this CPU's counters; turn on multiplexing or use fewer events",
                g.len()
            ),
        });
    }
    Ok(())
}

fn preset_entry(name: &str, code: u32, def: &Definition) -> Result<Entry> {
    let mut attrs = Vec::with_capacity(def.terms.len());
    for t in &def.terms {
        let attr = match t.core_attr() {
            Some(a) => a,
            None => native::resolve(t.text())?.parsed.attr,
        };
        attrs.push(attr);
    }
    Ok(Entry {
        hw_terms: attrs.iter().filter(|a| a.kind() == Kind::Hardware).count(),
        info: EventInfo {
            code,
            name: name.to_string(),
            preset: true,
            derivation: def.derivation.clone(),
            terms: def.terms.iter().map(|t| t.text().to_string()).collect(),
            note: def.note.clone(),
            unit: None,
            scale: 1.0,
        },
        attrs,
        overflow: None,
    })
}

#[cfg(test)]
mod tests {
    use papirus_substrate::attr::consts::{PERF_TYPE_RAW, PERF_TYPE_SOFTWARE};

    const _: () = {
        const fn send_sync<T: Send + Sync>() {}
        send_sync::<EventSet>();
        send_sync::<Library>();
    };

    use super::*;
    use crate::error::Code;
    use crate::mock::MockKernel;

    fn lib(counters: usize) -> (Library, std::sync::Arc<MockKernel>) {
        let k = MockKernel::new(counters);
        (Library::with_machine(k.clone(), MockKernel::machine(counters)), k)
    }

    fn code(r: Result<impl fmt::Debug>) -> Code {
        r.expect_err("expected an error").code()
    }

    #[test]
    fn every_rule_is_its_papi_error() {
        let (lib, _k) = lib(4);
        let mut s = lib.event_set();
        assert_eq!(code(s.start()), Code::Einval, "empty set started");
        assert!(matches!(s.start(), Err(Error::EmptySet)));
        assert_eq!(code(s.stop()), Code::Enotrun, "stop a stopped set");
        assert_eq!(code(s.accum(&mut [])), Code::Enotrun, "accum a stopped set");
        assert_eq!(code(s.add_named("no-such-event")), Code::Enoevnt);
        assert_eq!(code(s.add_code(0x8000_00f0)), Code::Enoevnt, "nonexistent preset code");
        assert_eq!(
            code(s.add_code(0x4000_0000 | 0x3fff_fff0)),
            Code::Enoevnt,
            "native code never handed out"
        );
        assert_eq!(code(s.add_code(0x1234)), Code::Enoevnt, "not a preset or native code");
        s.add_named("task-clock").unwrap();
        assert_eq!(code(s.add_named("task-clock")), Code::Einval, "duplicate");
        assert_eq!(code(s.remove_named("page-faults")), Code::Einval, "remove an absent event");
        assert_eq!(code(s.read_into(&mut [0, 0])), Code::Ebuf);
        assert_eq!(code(s.set_cpu(Some(2))), Code::Einval, "CPU out of range (2 CPUs)");
        assert_eq!(code(s.attach(0)), Code::Einval);
        assert_eq!(code(s.attach(i32::MAX)), Code::Esys, "no such process");
        assert_eq!(code(s.set_granularity(Granularity::System)), Code::Ecombo, "system-wide needs a CPU");
        assert_eq!(s.options().granularity, Granularity::Thread, "a refused option is not kept");

        s.start().unwrap();
        assert_eq!(code(s.start()), Code::Eisrun, "start a running set");
        assert_eq!(code(s.add_named("page-faults")), Code::Eisrun, "add while running");
        assert_eq!(code(s.remove_named("task-clock")), Code::Eisrun);
        assert_eq!(code(s.set_multiplex(true)), Code::Eisrun);
        assert_eq!(code(s.cleanup()), Code::Eisrun);
        assert_eq!(code(s.write(&[1])), Code::Enosupp);
        assert!(s.status().running && s.status().bits() == 0x2);
        s.stop().unwrap();
        assert_eq!(s.status().bits(), 0x1);
        s.remove_named("task-clock").unwrap();
        assert!(s.is_empty());
        assert_eq!(code(s.start()), Code::Einval);
    }

    #[test]
    fn values_are_deltas_since_start_reset_and_accum() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        s.add_all(["task-clock", "page-faults"]).unwrap();
        // A fresh set starts from zero without reading.
        s.start().unwrap();
        k.set_value(PERF_TYPE_SOFTWARE, 1, 100);
        k.set_value(PERF_TYPE_SOFTWARE, 2, 7);
        assert_eq!(s.stop().unwrap(), vec![100, 7]);
        // A restart rebases on the values read at stop, again without reading.
        let reads = k.reads();
        s.start().unwrap();
        assert_eq!(k.reads(), reads, "start after stop issues no read");
        k.set_value(PERF_TYPE_SOFTWARE, 1, 150);
        k.set_value(PERF_TYPE_SOFTWARE, 2, 9);
        assert_eq!(s.read().unwrap(), vec![50, 2]);
        let mut acc = vec![10, 10];
        s.accum(&mut acc).unwrap();
        assert_eq!(acc, vec![60, 12]);
        k.set_value(PERF_TYPE_SOFTWARE, 1, 170);
        assert_eq!(s.read().unwrap(), vec![20, 0], "accum reset the counters");
        s.reset().unwrap();
        k.set_value(PERF_TYPE_SOFTWARE, 1, 200);
        assert_eq!(s.stop().unwrap(), vec![30, 0]);
        assert_eq!(s.read().unwrap(), vec![30, 0], "a stopped set reads its final values");
        // One pinned group, led by page-faults rather than the task-clock added first.
        let ev = k.open_events();
        assert_eq!(ev.len(), 2);
        assert!(ev[0].leader.is_none() && ev[0].pinned && ev[1].leader == Some(ev[0].id));
        assert_eq!((ev[0].config, ev[1].config), (2, 1));
    }

    fn hw(k: &MockKernel, umask_event: u64, v: u64) {
        k.set_value(PERF_TYPE_RAW, umask_event, v);
    }

    #[test]
    fn derived_presets_are_computed_from_one_group() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        // Skylake PAPI_BR_TKN = BR_INST_RETIRED.CONDITIONAL - NOT_TAKEN; PAPI_FP_OPS is a postfix.
        s.add_named("PAPI_BR_TKN").unwrap();
        let info = &s.events()[0];
        assert!(info.preset && info.derivation == Derivation::Sub);
        assert_eq!(info.terms, vec!["cpu/event=0xc4,umask=0x01/", "cpu/event=0xc4,umask=0x10/"]);
        s.start().unwrap();
        hw(&k, 0x01c4, 1000);
        hw(&k, 0x10c4, 300);
        assert_eq!(s.read().unwrap(), vec![700]);
        s.stop().unwrap();
        s.cleanup().unwrap();
        s.add_named("PAPI_FP_OPS").unwrap();
        s.start().unwrap();
        hw(&k, 0x03c7, 5);
        hw(&k, 0x04c7, 7);
        hw(&k, 0x18c7, 11);
        hw(&k, 0x20c7, 13);
        assert_eq!(s.stop().unwrap(), vec![5 + 7 * 2 + 11 * 4 + 13 * 8]);
        assert_eq!(s.groups(), 1);
        assert_eq!(s.descriptors(), 4);
    }

    #[test]
    fn multiplexed_values_are_scaled_and_derived_terms_share_a_group() {
        let (lib, k) = lib(2);
        let mut s = lib.event_set();
        s.set_multiplex(true).unwrap();
        s.add_all(["PAPI_BR_TKN", "PAPI_TOT_CYC", "PAPI_TOT_INS"]).unwrap();
        assert_eq!(s.groups(), 3, "one group per event");
        assert!(s.status().multiplexing && s.status().bits() & 0x40 != 0);
        assert!(k.open_events().iter().all(|e| !e.pinned), "multiplexed groups are not pinned");
        s.start().unwrap();
        hw(&k, 0x01c4, 1000);
        hw(&k, 0x10c4, 300);
        hw(&k, 0x3c, 2_000);
        hw(&k, 0xc0, 900);
        // The kernel ran the branch group half, cycles a quarter, instructions never.
        k.set_times_nth_group(0, 2_000, 1_000);
        k.set_times_nth_group(1, 2_000, 500);
        k.set_times_nth_group(2, 2_000, 0);
        let d = s.read_detailed().unwrap();
        assert_eq!(d[0].raw, 700);
        assert_eq!(d[0].value, 1400, "the difference is scaled once, never negative");
        assert_eq!(d[0].scaling(), Scaling::Scaled { factor: 2.0 });
        assert_eq!((d[1].value, d[1].raw), (8_000, 2_000));
        assert_eq!((d[1].time_enabled, d[1].time_running), (2_000, 500));
        assert_eq!(d[2].value, 0);
        assert_eq!(d[2].scaling(), Scaling::NeverScheduled);
        s.stop().unwrap();
    }

    #[test]
    fn a_set_that_does_not_fit_the_counters_fails_to_add() {
        let (lib, _k) = lib(4);
        let mut s = lib.event_set();
        for c in ["r01c4", "r02c4", "r04c4", "r08c4"] {
            s.add_named(c).unwrap();
        }
        let e = s.add_named("r10c4").unwrap_err();
        assert_eq!(e.code(), Code::Ecnflct);
        assert!(e.to_string().contains("multiplexing"), "{e}");
        assert_eq!(s.len(), 4, "the failed add leaves the set as it was");
        assert_eq!(s.descriptors(), 4);
        // Software events do not use hardware counters.
        s.add_named("task-clock").unwrap();
        s.set_multiplex(true).unwrap();
        s.add_named("r10c4").unwrap();
        assert_eq!(s.groups(), 6);
    }

    #[test]
    fn a_group_the_kernel_cannot_schedule_fails_to_add() {
        // The machine claims 4 counters, the PMU has 2 free: PAPI's add-time check catches it.
        let k = MockKernel::new(2);
        let lib = Library::with_machine(k.clone(), MockKernel::machine(4));
        let mut s = lib.event_set();
        s.add_all(["r01c4", "r02c4"]).unwrap();
        let e = s.add_named("r04c4").unwrap_err();
        assert_eq!(e.code(), Code::Ecnflct, "{e}");
        assert!(e.to_string().contains("could not put"), "{e}");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn running_sets_conflict_only_over_hardware_counters() {
        let (lib, _k) = lib(3);
        let mut a = lib.event_set();
        a.add_all(["r01c4", "r02c4"]).unwrap();
        let mut b = lib.event_set();
        b.add_all(["r04c4", "r08c4"]).unwrap();
        a.start().unwrap();
        let e = b.start().unwrap_err();
        assert_eq!(e.code(), Code::Ecnflct, "{e}");
        assert!(e.to_string().contains("hold 2 of the 3"), "{e}");
        a.stop().unwrap();
        b.start().unwrap();
        // Two software sets run at once on one thread.
        let mut c = lib.event_set();
        c.add_named("task-clock").unwrap();
        let mut d = lib.event_set();
        d.add_named("task-clock").unwrap();
        c.start().unwrap();
        d.start().unwrap();
        drop(b); // releases its counters while running
        a.start().unwrap();
    }

    #[test]
    fn options_reach_the_kernel() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        s.add_all(["task-clock", "page-faults"]).unwrap();
        s.set_granularity(Granularity::Process).unwrap();
        assert!(k.open_events().iter().all(|e| e.inherit && e.pid == 0 && e.cpu == -1));
        s.set_cpu(Some(1)).unwrap();
        assert!(k.open_events().iter().all(|e| e.cpu == 1));
        let me = std::process::id() as i32;
        s.attach(me).unwrap();
        assert!(s.status().attached && s.status().bits() & 0x80 != 0);
        assert!(k.open_events().iter().all(|e| e.pid == me && e.cpu == 1));
        assert_eq!(code(s.set_granularity(Granularity::System)), Code::Ecombo);
        s.detach().unwrap();
        s.set_granularity(Granularity::System).unwrap();
        assert!(s.status().cpu_attached && s.status().bits() & 0x100 != 0);
        assert!(k.open_events().iter().all(|e| e.pid == -1 && e.cpu == 1));
        s.set_domain(Some(Domain::ALL)).unwrap();
        assert_eq!(s.options().domain, Some(Domain::ALL));
    }

    #[test]
    fn kernel_refusals_keep_the_set_usable() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        s.add_named("task-clock").unwrap();
        k.fail_open_config(2, libc::EACCES);
        let e = s.add_named("page-faults").unwrap_err();
        assert_eq!(e.code(), Code::Eperm, "{e}");
        k.fail_open_config(0x4242, libc::ENOSPC);
        assert_eq!(s.add_named("r4242").unwrap_err().code(), Code::Ecnflct);
        assert_eq!(s.len(), 1);
        s.start().unwrap();
        assert_eq!(s.stop().unwrap().len(), 1);
    }

    #[test]
    fn a_refused_default_kernel_domain_falls_back_to_user_space() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        // context-switches defaults to every domain; refuse it as paranoid 2 does.
        k.fail_open_config(3, libc::EACCES);
        let e = s.add_named("context-switches:uk").unwrap_err();
        assert_eq!(e.code(), Code::Eperm, "an explicit domain is not changed: {e}");
        k.fail_open_config(3, 0);
        k.refuse_kernel_domain(true);
        s.add_named("context-switches").unwrap();
        assert!(s.events()[0].note.as_deref().unwrap().starts_with("user space only"));
        assert!(k.open_events().iter().all(|e| e.exclude_kernel));
    }

    #[test]
    fn overflow_rules_checked_before_any_descriptor_changes() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        let h: crate::overflow::OverflowHandler = Arc::new(|_| {});
        let br = s.add_named("PAPI_BR_TKN").unwrap();
        s.add_named("page-faults").unwrap();
        let e = s.overflow(br, 1000, 0, h.clone()).unwrap_err();
        assert_eq!(e.code(), Code::Einval, "{e}");
        assert!(e.to_string().contains("derived from 2 native events"), "{e}");
        let e = s.overflow(0x8000_0000u32, 1000, 0, h.clone()).unwrap_err();
        assert_eq!(e.code(), Code::Enoevnt, "PAPI_L1_DCM is not in the set: {e}");
        assert!(e.to_string().contains("PAPI_BR_TKN, page-faults"), "{e}");
        assert_eq!(code(s.overflow("task-clock", 1000, 0, h.clone())), Code::Enoevnt);
        assert_eq!(code(s.overflow(2usize, 1000, 0, h.clone())), Code::Enoevnt);
        assert_eq!(s.index_of("PAGE-FAULTS").unwrap(), 1, "names match as added, any case");
        let before = (k.live_fds(), k.open_events().len());
        // The mock kernel maps no rings: the failed change keeps the old layout.
        let e = s.overflow("page-faults", 100, 0, h.clone()).unwrap_err();
        assert_eq!(e.code(), Code::Esys, "{e}");
        assert_eq!((k.live_fds(), k.open_events().len()), before);
        assert_eq!(s.status().bits(), 0x1);
        assert_eq!(s.overflow_threshold("page-faults").unwrap(), 0);
        assert!(s.overflow_stats("page-faults").is_none());
        s.start().unwrap();
        assert_eq!(code(s.overflow("page-faults", 100, 0, h.clone())), Code::Eisrun);
        assert_eq!(
            code(s.profil(1usize, Region::covering(0..64, 4).unwrap(), 100, ProfilFlags::POSIX)),
            Code::Eisrun
        );
        s.stop().unwrap();
        let r = Region::covering(0..64, 4).unwrap();
        assert_eq!(code(s.profil(1usize, r, 100, ProfilFlags::FORCE_SW)), Code::Enosupp);
        assert_eq!(code(s.sprofil(1usize, vec![], 100, ProfilFlags::POSIX)), Code::Einval, "no region");
        assert!(s.profil(1usize, r, 0, ProfilFlags::POSIX).unwrap().is_none(), "threshold 0: off");
    }

    #[test]
    fn breakpoints_get_a_group_of_their_own() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        s.add_all(["page-faults", "mem:0x1000:x", "task-clock", "mem:0x2000:w"]).unwrap();
        assert_eq!((s.groups(), s.descriptors()), (2, 4));
        let ev = k.open_events();
        let (b1, b2) = (&ev[0], &ev[1]);
        assert!(b1.type_ == PERF_TYPE_BREAKPOINT && b1.leader.is_none() && b1.pinned);
        assert!(b2.type_ == PERF_TYPE_BREAKPOINT && b2.leader == Some(b1.id));
        assert!(ev[2].type_ == PERF_TYPE_SOFTWARE && ev[2].config == 2 && ev[2].leader.is_none());
        assert_eq!(ev[3].leader, Some(ev[2].id));
        s.start().unwrap();
        k.set_value(PERF_TYPE_SOFTWARE, 2, 5);
        k.set_value(PERF_TYPE_BREAKPOINT, 0, 9);
        assert_eq!(s.stop().unwrap(), vec![5, 9, 0, 9], "values come back in the order added");
        s.set_multiplex(true).unwrap();
        assert_eq!(s.groups(), 4, "multiplexing keeps one group per event");
    }

    #[test]
    fn status_bits_follow_papi() {
        let all = Status {
            running: true,
            attached: true,
            cpu_attached: true,
            multiplexing: true,
            overflowing: true,
            profiling: true,
        };
        assert_eq!(all.bits(), 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100);
        let stopped = Status { running: false, overflowing: true, ..all };
        assert_eq!(stopped.bits() & 0x3, 0x1);
    }

    #[test]
    fn dropping_a_running_set_disables_and_closes_everything() {
        let (lib, k) = lib(4);
        let mut s = lib.event_set();
        s.add_all(["task-clock", "page-faults", "PAPI_BR_TKN"]).unwrap();
        assert_eq!(k.live_fds(), 4);
        s.start().unwrap();
        let before = k.ioctls().len();
        drop(s);
        assert_eq!(k.ioctls()[before..], [papirus_substrate::sys::Ioctl::Disable { group: false }]);
        assert_eq!(k.live_fds(), 0);
        let mut s = lib.event_set();
        s.add_named("task-clock").unwrap();
        s.destroy().unwrap();
        assert_eq!(k.live_fds(), 0);
    }
}
