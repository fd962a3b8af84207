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

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use papirus_lowlevel::derived::Derivation;
use papirus_lowlevel::{Library, Tid, native, thread_id};
use papirus_substrate::fastread::MappedGroup;
use papirus_substrate::{Count, EventAttr, Kind, Target, clock, vclock};
use serde::{Deserialize, Serialize};

/// The events measured when neither the caller nor the environment chooses.
pub const DEFAULT_EVENTS: [&str; 5] =
    ["task-clock", "page-faults", "context-switches", "cycles", "instructions"];

/// The built-in metrics every region has, before the events.
pub const TIME_METRICS: [&str; 2] = ["real_time_ns", "virtual_time_ns"];

/// Environment variable naming the events (papirus' own).
pub const ENV_EVENTS: &str = "PAPIRUS_EVENTS";
/// PAPI's variable, read when [`ENV_EVENTS`] is unset.
pub const ENV_PAPI_EVENTS: &str = "PAPI_EVENTS";
/// Environment variable naming the output directory.
pub const ENV_OUTPUT_DIRECTORY: &str = "PAPIRUS_OUTPUT_DIRECTORY";
/// The output directory when [`ENV_OUTPUT_DIRECTORY`] is unset.
pub const DEFAULT_OUTPUT_DIRECTORY: &str = "papirus_output";

/// Errors of the region API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// `region_end` of a name that is open nowhere.
    #[error(
        "region `{name}` ended in thread {thread} but was never begun: call region_begin(\"{name}\") first"
    )]
    NotBegun {
        /// The region.
        name: String,
        /// The calling thread.
        thread: Tid,
    },
    /// `region_end` of a region that has a region begun inside it still open.
    #[error(
        "region `{ended}` ended in thread {thread} while `{innermost}`, begun inside it, is still open: end `{innermost}` first (regions nest)"
    )]
    OutOfOrder {
        /// The region the caller ended.
        ended: String,
        /// The innermost open region.
        innermost: String,
        /// The calling thread.
        thread: Tid,
    },
    /// `region_end` in a thread other than the one that began the region.
    #[error(
        "region `{name}` was begun in thread {begun_in} and cannot end in thread {ended_in}: regions are per thread, end it where it began"
    )]
    OtherThread {
        /// The region.
        name: String,
        /// The thread that began it.
        begun_in: Tid,
        /// The calling thread.
        ended_in: Tid,
    },
    /// An event of [`Config::events`] cannot be counted here.
    #[error("region event `{event}` cannot be counted: {source}")]
    Event {
        /// The event as given.
        event: String,
        /// Why, from the low-level layer (with the PAPI code).
        #[source]
        source: Box<papirus_lowlevel::Error>,
    },
    /// An entry of an event list that is not an event name.
    #[error("bad event list entry `{entry}`: {reason}")]
    EventSyntax {
        /// The entry.
        entry: String,
        /// What is wrong.
        reason: String,
    },
    /// [`Config::install`] after regions were set up.
    #[error(
        "regions are already set up (by Config::install or the first region_begin): install the configuration before the first region"
    )]
    AlreadyConfigured,
    /// Reading or opening the thread's counters failed.
    #[error("thread {thread}: {op} of the region counters failed: {source}")]
    Counters {
        /// The calling thread.
        thread: Tid,
        /// What was done.
        op: &'static str,
        /// The substrate's error.
        #[source]
        source: Box<papirus_substrate::Error>,
    },
    /// The thread is exiting (its thread-locals are gone).
    #[error("the calling thread is exiting: regions cannot begin or end in thread-local destructors")]
    ThreadExiting,
    /// Writing the report failed.
    #[error("writing the region report {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// How the region API is set up: events and output. Setters chain;
/// [`install`](Config::install) fixes the configuration for the process.
#[derive(Clone, Debug, Default)]
pub struct Config {
    events: Option<Vec<String>>,
    output_directory: Option<PathBuf>,
    write_at_exit: Option<bool>,
}

/// Where the event list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    /// [`Config::events`].
    Caller,
    /// `PAPIRUS_EVENTS`.
    PapirusEvents,
    /// `PAPI_EVENTS`.
    PapiEvents,
    /// [`DEFAULT_EVENTS`].
    Default,
}

/// An event the regions measure.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventDef {
    /// The name as requested (after PAPI spelling is translated).
    pub name: String,
    /// Whether it is a PAPI preset.
    pub preset: bool,
    /// How the value combines the native terms (PAPI's names).
    pub derivation: String,
    /// The native terms opened.
    pub terms: Vec<String>,
}

/// A requested event that is not measured, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Unavailable {
    /// The name as requested.
    pub name: String,
    /// Why it is not counted here.
    pub reason: String,
}

/// The process-wide setup, fixed at the first region or [`Config::install`].
#[derive(Debug)]
pub struct Setup {
    /// Where the events came from.
    pub source: EventSource,
    /// The events measured, in metric order after [`TIME_METRICS`].
    pub events: Vec<EventDef>,
    /// Requested events that are not measured.
    pub unavailable: Vec<Unavailable>,
    /// The output directory.
    pub output_directory: PathBuf,
    /// The low-level library (machine facts).
    pub library: Library,
    /// Per event: its native terms' perf descriptions and its derivation.
    plans: Vec<(Vec<EventAttr>, Derivation)>,
    /// Metric names: [`TIME_METRICS`] then the events.
    pub metrics: Vec<String>,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

impl Config {
    /// A configuration that takes everything from the environment.
    pub fn new() -> Self {
        Config::default()
    }

    /// Measures these events (PAPI preset names or perf syntax) instead of
    /// the environment's or the defaults; every one must be countable.
    pub fn events<I, S>(&mut self, names: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.events = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Writes reports into `dir` instead of `$PAPIRUS_OUTPUT_DIRECTORY`
    /// (default [`DEFAULT_OUTPUT_DIRECTORY`] in the working directory).
    pub fn output_directory(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.output_directory = Some(dir.into());
        self
    }

    /// Whether to write the report when the process exits normally
    /// (default: yes).
    pub fn write_at_exit(&mut self, on: bool) -> &mut Self {
        self.write_at_exit = Some(on);
        self
    }

    /// Resolves the events and fixes the setup for this process. Fails when
    /// regions are already set up or a caller-chosen event cannot be counted.
    pub fn install(&self) -> Result<&'static Setup, RegionError> {
        if SETUP.get().is_some() {
            return Err(RegionError::AlreadyConfigured);
        }
        let setup = self.resolve()?;
        let at_exit = self.write_at_exit.unwrap_or(true);
        let mut installed = false;
        let s = SETUP.get_or_init(|| {
            installed = true;
            setup
        });
        if !installed {
            return Err(RegionError::AlreadyConfigured);
        }
        if at_exit {
            crate::report::register_at_exit();
        }
        Ok(s)
    }

    fn resolve(&self) -> Result<Setup, RegionError> {
        let library = papirus_lowlevel::init().map_err(|e| RegionError::Event {
            event: "(library initialisation)".into(),
            source: Box::new(e),
        })?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let (source, requested): (EventSource, Vec<String>) =
            match (&self.events, env(ENV_EVENTS), env(ENV_PAPI_EVENTS)) {
                (Some(list), _, _) => (EventSource::Caller, list.clone()),
                (None, Some(v), _) => (EventSource::PapirusEvents, split_list(&v)),
                (None, None, Some(v)) => (EventSource::PapiEvents, split_list(&v)),
                (None, None, None) => {
                    (EventSource::Default, DEFAULT_EVENTS.iter().map(|s| s.to_string()).collect())
                }
            };
        let mut events = vec![];
        let mut plans = vec![];
        let mut unavailable = vec![];
        for entry in requested {
            let resolved = translate(&entry).and_then(|name| {
                if events.iter().any(|e: &EventDef| e.name == name) {
                    return Err(RegionError::EventSyntax {
                        entry: entry.clone(),
                        reason: "listed twice".into(),
                    });
                }
                resolve_event(&library, &name)
            });
            match resolved {
                Ok((def, plan)) => {
                    events.push(def);
                    plans.push(plan);
                }
                Err(e) if source == EventSource::Caller => return Err(e),
                Err(e) => {
                    let reason = match &e {
                        RegionError::Event { source, .. } => source.to_string(),
                        other => other.to_string(),
                    };
                    if source != EventSource::Default {
                        eprintln!("papirus: region event `{entry}` dropped: {reason}");
                    }
                    unavailable.push(Unavailable { name: entry, reason });
                }
            }
        }
        let output_directory = self.output_directory.clone().unwrap_or_else(|| {
            env(ENV_OUTPUT_DIRECTORY).map_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIRECTORY), PathBuf::from)
        });
        let metrics =
            TIME_METRICS.iter().map(|s| s.to_string()).chain(events.iter().map(|e| e.name.clone())).collect();
        Ok(Setup { source, events, unavailable, output_directory, library, plans, metrics })
    }
}

/// The setup, made from the environment on first use. Events from the
/// environment that cannot be counted are dropped, so this fails only when
/// the low-level library cannot initialise.
pub fn setup() -> Result<&'static Setup, RegionError> {
    if let Some(s) = SETUP.get() {
        return Ok(s);
    }
    match Config::new().install() {
        // A concurrent first call won the race: use its setup.
        Err(RegionError::AlreadyConfigured) => SETUP.get().ok_or(RegionError::AlreadyConfigured),
        r => r,
    }
}

/// Whether regions have been set up in this process.
pub fn is_set_up() -> bool {
    SETUP.get().is_some()
}

/// Splits a comma-separated event list, dropping blanks (spaces are
/// stripped, as PAPI does).
pub fn split_list(v: &str) -> Vec<String> {
    v.split(',').map(|s| s.split_whitespace().collect::<String>()).filter(|s| !s.is_empty()).collect()
}

/// Translates PAPI's spellings: `NAME=delta` (the only type papirus
/// measures) and `perf::NAME` (perf's name, upper-cased by PAPI).
pub fn translate(entry: &str) -> Result<String, RegionError> {
    let (name, kind) = match entry.split_once('=') {
        Some((n, k)) if !n.contains('/') => (n, Some(k)),
        _ => (entry, None),
    };
    match kind {
        None | Some("delta") => {}
        Some(k) => {
            return Err(RegionError::EventSyntax {
                entry: entry.into(),
                reason: format!(
                    "event type `{k}` is not supported: regions measure deltas (`NAME=delta` or plain `NAME`)"
                ),
            });
        }
    }
    if let Some(rest) = name.strip_prefix("perf::") {
        if rest.is_empty() {
            return Err(RegionError::EventSyntax {
                entry: entry.into(),
                reason: "empty name after `perf::`".into(),
            });
        }
        // PAPI upper-cases perf's names; the hw-cache names keep their own case.
        return Ok(if native::resolve(rest).is_ok() { rest.to_string() } else { rest.to_ascii_lowercase() });
    }
    if name.is_empty() {
        return Err(RegionError::EventSyntax { entry: entry.into(), reason: "empty event name".into() });
    }
    Ok(name.to_string())
}

/// Resolves one event through the low-level layer (which knows presets and
/// perf syntax, and says why an event cannot be counted), opening it once
/// on this thread to be sure it counts.
fn resolve_event(lib: &Library, name: &str) -> Result<(EventDef, (Vec<EventAttr>, Derivation)), RegionError> {
    let err = |source| RegionError::Event { event: name.to_string(), source: Box::new(source) };
    let mut probe = lib.event_set();
    probe.add_named(name).map_err(err)?;
    let info = probe.events().into_iter().next().ok_or_else(|| {
        err(papirus_lowlevel::Error::Invalid { what: "event", reason: "the event set kept no event".into() })
    })?;
    drop(probe);
    let attrs = if info.preset {
        // The definition the event set chose is the one whose terms it lists.
        let defs = lib.presets().definitions(&lib.machine().cpu, &info.name);
        let def = defs
            .into_iter()
            .find(|d| d.terms.iter().map(|t| t.text()).eq(info.terms.iter().map(String::as_str)))
            .ok_or_else(|| {
                err(papirus_lowlevel::Error::PresetUnavailable {
                    name: info.name.clone(),
                    reason: "its definition changed while resolving".into(),
                })
            })?;
        let mut attrs = vec![];
        for t in &def.terms {
            attrs.push(match t.core_attr() {
                Some(a) => a,
                None => native::resolve(t.text()).map_err(err)?.parsed.attr,
            });
        }
        attrs
    } else {
        vec![native::resolve(name).map_err(err)?.parsed.attr]
    };
    let def = EventDef {
        name: name.to_string(),
        preset: info.preset,
        derivation: info.derivation.papi_name().to_string(),
        terms: info.terms.clone(),
    };
    Ok((def, (attrs, info.derivation)))
}

// ---------------------------------------------------------------------------
// Shared statistics, read by the report writer.

/// One region of one thread, as the report writer reads it.
#[derive(Debug)]
pub(crate) struct RegionCell {
    pub(crate) name: Box<str>,
    pub(crate) id: u32,
    pub(crate) parent: Option<u32>,
    /// Even when stable, odd while the owner writes.
    seq: AtomicU32,
    /// Open instances (begun, not ended).
    open: AtomicU32,
    calls: AtomicU64,
    /// Per metric: total, min, max.
    values: Box<[AtomicI64]>,
}

/// A consistent copy of a region's statistics.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RegionSample {
    pub(crate) calls: u64,
    pub(crate) open: u32,
    /// Per metric: (total, min, max).
    pub(crate) metrics: Vec<(i64, i64, i64)>,
}

impl RegionCell {
    fn new(name: &str, id: u32, parent: Option<u32>, metrics: usize) -> RegionCell {
        let values =
            (0..metrics * 3).map(|i| AtomicI64::new(if i % 3 == 1 { i64::MAX } else { 0 })).collect();
        RegionCell {
            name: name.into(),
            id,
            parent,
            seq: AtomicU32::new(0),
            open: AtomicU32::new(0),
            calls: AtomicU64::new(0),
            values,
        }
    }

    // ATOMICS: the owning thread is the only writer. `seq` goes odd before
    // the fields change and even (Release) after; a reader retries while it
    // is odd or moved across its loads, so it sees one call's update whole.
    fn write(&self, f: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    fn record(&self, deltas: &[i64]) {
        self.write(|| {
            self.calls.store(self.calls.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            self.open.store(self.open.load(Ordering::Relaxed).saturating_sub(1), Ordering::Relaxed);
            for (m, &d) in self.values.chunks_exact(3).zip(deltas) {
                m[0].store(m[0].load(Ordering::Relaxed).saturating_add(d), Ordering::Relaxed);
                m[1].store(m[1].load(Ordering::Relaxed).min(d), Ordering::Relaxed);
                m[2].store(m[2].load(Ordering::Relaxed).max(d), Ordering::Relaxed);
            }
        });
    }

    fn opened(&self) {
        self.write(|| self.open.store(self.open.load(Ordering::Relaxed) + 1, Ordering::Relaxed));
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn sample(&self) -> RegionSample {
        let mut metrics = Vec::with_capacity(self.values.len() / 3);
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                metrics.clear();
                let calls = self.calls.load(Ordering::Relaxed);
                let open = self.open.load(Ordering::Relaxed);
                for m in self.values.chunks_exact(3) {
                    let (t, lo, hi) = (
                        m[0].load(Ordering::Relaxed),
                        m[1].load(Ordering::Relaxed),
                        m[2].load(Ordering::Relaxed),
                    );
                    // No call yet: min is still its identity.
                    metrics.push(if calls == 0 { (0, 0, 0) } else { (t, lo, hi) });
                }
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return RegionSample { calls, open, metrics };
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// A thread that used regions, as the report writer sees it.
#[derive(Debug)]
pub(crate) struct ThreadShared {
    pub(crate) tid: Tid,
    pub(crate) name: String,
    /// Set when the thread exits; its statistics stay.
    pub(crate) exited: AtomicBool,
    /// Guards dropped with an error (they cannot return it).
    pub(crate) guard_errors: AtomicU64,
    regions: Mutex<Vec<Arc<RegionCell>>>,
}

impl ThreadShared {
    pub(crate) fn regions(&self) -> MutexGuard<'_, Vec<Arc<RegionCell>>> {
        // Each update is one push; a poisoned lock holds a consistent list.
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn threads() -> MutexGuard<'static, Vec<Arc<ThreadShared>>> {
    static THREADS: Mutex<Vec<Arc<ThreadShared>>> = Mutex::new(Vec::new());
    THREADS.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// The owning thread's state.

/// One perf group of the thread and where its members' values go.
#[derive(Debug)]
struct GroupReader {
    group: MappedGroup,
    /// Term index of each member, in group order.
    terms: Vec<usize>,
    buf: Vec<Count>,
}

/// Per-term reading: raw count, time enabled, time running.
const TERM_WIDTH: usize = 3;

#[derive(Debug)]
struct ThreadRegions {
    shared: Arc<ThreadShared>,
    setup: &'static Setup,
    groups: Vec<GroupReader>,
    /// Term range of each event.
    event_terms: Vec<std::ops::Range<usize>>,
    nterms: usize,
    names: HashMap<Box<str>, u32>,
    nodes: HashMap<(u32, u32), u32>,
    /// The owner's handles, indexed by region id.
    cells: Vec<Arc<RegionCell>>,
    /// Open regions, innermost last.
    stack: Vec<u32>,
    /// Readings at begin, `stride` per open region.
    starts: Vec<i64>,
    now: Vec<i64>,
    term_deltas: Vec<i64>,
    deltas: Vec<i64>,
}

const NO_PARENT: u32 = u32::MAX;

impl ThreadRegions {
    fn new() -> Result<ThreadRegions, RegionError> {
        let setup = setup()?;
        let tid = thread_id();
        let counters = |op, source| RegionError::Counters { thread: tid, op, source: Box::new(source) };
        let mut event_terms = vec![];
        let mut all: Vec<(usize, EventAttr)> = vec![];
        for (attrs, _) in &setup.plans {
            let start = all.len();
            for a in attrs {
                all.push((all.len(), a.clone()));
            }
            event_terms.push(start..all.len());
        }
        let nterms = all.len();
        // Terms with a user-space read (time events, hardware via rdpmc) go in
        // one group; the software counters that need read(2) in another, so
        // they do not drag the first onto the syscall path.
        let is_time = |a: &EventAttr| a.name() == "task-clock" || a.name() == "cpu-clock";
        let (fast, slow): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|(_, a)| a.kind() == Kind::Hardware || is_time(a));
        let mut fast = fast;
        // A hardware leader: software events may join its group, not the reverse.
        fast.sort_by_key(|(_, a)| a.kind() != Kind::Hardware);
        let mut groups = vec![];
        for set in [fast, slow] {
            if set.is_empty() {
                continue;
            }
            let attrs: Vec<EventAttr> = set.iter().map(|(_, a)| a.clone()).collect();
            match MappedGroup::open(&attrs, Target::ThisThread) {
                Ok(group) => groups.push(GroupReader {
                    group,
                    terms: set.iter().map(|(i, _)| *i).collect(),
                    buf: vec![Count::default(); set.len()],
                }),
                Err(_) => {
                    // Some PMUs refuse to share a group: one group per term.
                    for (i, a) in set {
                        let group = MappedGroup::open(std::slice::from_ref(&a), Target::ThisThread)
                            .map_err(|e| counters("perf_event_open", e))?;
                        groups.push(GroupReader { group, terms: vec![i], buf: vec![Count::default()] });
                    }
                }
            }
        }
        for g in &groups {
            g.group.enable().map_err(|e| counters("enable", e))?;
        }
        let shared = Arc::new(ThreadShared {
            tid,
            name: std::thread::current().name().unwrap_or("").to_string(),
            exited: AtomicBool::new(false),
            guard_errors: AtomicU64::new(0),
            regions: Mutex::new(vec![]),
        });
        threads().push(shared.clone());
        let nmetrics = setup.metrics.len();
        Ok(ThreadRegions {
            shared,
            setup,
            groups,
            event_terms,
            nterms,
            names: HashMap::new(),
            nodes: HashMap::new(),
            cells: vec![],
            stack: vec![],
            starts: vec![],
            now: vec![0; 2 + nterms * TERM_WIDTH],
            term_deltas: vec![0; nterms],
            deltas: vec![0; nmetrics],
        })
    }

    fn stride(&self) -> usize {
        2 + self.nterms * TERM_WIDTH
    }

    /// Reads every counter into `out`: TSC ticks, virtual ns, then per term
    /// (raw, enabled, running). `tsc_last` puts the TSC read after the
    /// counters (at begin) rather than before (at end), so a region's time
    /// excludes most of the reading itself.
    fn read(
        groups: &mut [GroupReader],
        out: &mut [i64],
        tsc_last: bool,
    ) -> Result<(), papirus_substrate::Error> {
        let c = clock::clock();
        if !tsc_last {
            out[0] = c.raw() as i64;
        }
        out[1] = vclock::thread_cpu_ns() as i64;
        for g in groups {
            g.group.read_into(&mut g.buf)?;
            for (k, &t) in g.terms.iter().enumerate() {
                let at = 2 + t * TERM_WIDTH;
                out[at] = g.buf[k].raw as i64;
                out[at + 1] = g.buf[k].time_enabled as i64;
                out[at + 2] = g.buf[k].time_running as i64;
            }
        }
        if tsc_last {
            out[0] = c.raw() as i64;
        }
        Ok(())
    }

    fn node(&mut self, name: &str) -> u32 {
        let parent = self.stack.last().copied().unwrap_or(NO_PARENT);
        let name_id = match self.names.get(name) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.insert(name.into(), id);
                id
            }
        };
        if let Some(&n) = self.nodes.get(&(parent, name_id)) {
            return n;
        }
        let id = self.cells.len() as u32;
        let cell = Arc::new(RegionCell::new(
            name,
            id,
            (parent != NO_PARENT).then_some(parent),
            self.setup.metrics.len(),
        ));
        self.shared.regions().push(cell.clone());
        self.cells.push(cell);
        self.nodes.insert((parent, name_id), id);
        id
    }

    fn begin(&mut self, name: &str) -> Result<(), RegionError> {
        let node = self.node(name);
        let stride = self.stride();
        let depth = self.stack.len();
        if self.starts.len() < (depth + 1) * stride {
            self.starts.resize((depth + 1) * stride, 0);
        }
        let slot = &mut self.starts[depth * stride..(depth + 1) * stride];
        Self::read(&mut self.groups, slot, true).map_err(|e| RegionError::Counters {
            thread: self.shared.tid,
            op: "read",
            source: Box::new(e),
        })?;
        self.cells[node as usize].opened();
        self.stack.push(node);
        Ok(())
    }

    fn end(&mut self, name: &str) -> Result<(), RegionError> {
        let tid = self.shared.tid;
        let Some(&top) = self.stack.last() else {
            return Err(not_open_here(name, tid));
        };
        if &*self.cells[top as usize].name != name {
            if self.stack.iter().any(|&n| &*self.cells[n as usize].name == name) {
                return Err(RegionError::OutOfOrder {
                    ended: name.into(),
                    innermost: self.cells[top as usize].name.to_string(),
                    thread: tid,
                });
            }
            return Err(not_open_here(name, tid));
        }
        let mut now = std::mem::take(&mut self.now);
        let r = Self::read(&mut self.groups, &mut now, false);
        let result = r.map(|()| {
            let stride = self.stride();
            let depth = self.stack.len() - 1;
            let start = &self.starts[depth * stride..(depth + 1) * stride];
            metric_deltas(
                self.setup,
                &self.event_terms,
                start,
                &now,
                &mut self.term_deltas,
                &mut self.deltas,
            );
            self.cells[top as usize].record(&self.deltas);
            self.stack.pop();
        });
        self.now = now;
        result.map_err(|e| RegionError::Counters { thread: tid, op: "read", source: Box::new(e) })
    }
}

/// Each metric's change between two readings (the layout of
/// [`ThreadRegions::read`]): real ns, virtual ns, then each event from its
/// terms' scaled deltas. `terms` is scratch space of one slot per term.
fn metric_deltas(
    setup: &Setup,
    event_terms: &[std::ops::Range<usize>],
    start: &[i64],
    now: &[i64],
    terms: &mut [i64],
    out: &mut [i64],
) {
    out[0] = clock::clock().delta_ns(start[0] as u64, now[0] as u64) as i64;
    out[1] = now[1].saturating_sub(start[1]).max(0);
    for (t, d) in terms.iter_mut().enumerate() {
        let at = 2 + t * TERM_WIDTH;
        *d = scaled_delta(&start[at..at + 3], &now[at..at + 3]);
    }
    for (e, range) in event_terms.iter().enumerate() {
        out[2 + e] = setup.plans[e].1.eval(&terms[range.clone()]);
    }
}

/// A counter's increase between two readings of (raw, enabled, running),
/// scaled up when it was multiplexed for part of the interval.
fn scaled_delta(then: &[i64], now: &[i64]) -> i64 {
    let raw = (now[0] as u64).wrapping_sub(then[0] as u64) as i64;
    let enabled = now[1].saturating_sub(then[1]);
    let running = now[2].saturating_sub(then[2]);
    if running <= 0 || running >= enabled {
        return if running <= 0 && enabled > 0 { 0 } else { raw };
    }
    let v = i128::from(raw) * i128::from(enabled) / i128::from(running);
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// The error for ending a region not open in the calling thread: which
/// thread has it open, if any.
fn not_open_here(name: &str, tid: Tid) -> RegionError {
    for t in threads().iter() {
        if t.tid != tid && t.regions().iter().any(|c| &*c.name == name && c.is_open()) {
            return RegionError::OtherThread { name: name.into(), begun_in: t.tid, ended_in: tid };
        }
    }
    RegionError::NotBegun { name: name.into(), thread: tid }
}

impl Drop for ThreadRegions {
    fn drop(&mut self) {
        self.shared.exited.store(true, Ordering::Release);
    }
}

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

/// A reading of the calling thread's region counters: the TSC, the
/// thread's virtual time and every event's terms, as [`region_begin`]
/// records them. For callers that keep their own record of each region
/// instance (PAPI's high-level API writes one record per begin, with the
/// reads in between) while measuring with the same counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    values: Vec<i64>,
}

impl Reading {
    /// The TSC at the reading (PAPI's `cycles`).
    pub fn ticks(&self) -> u64 {
        self.values[0] as u64
    }

    /// Each metric's change since `earlier`, in the order of
    /// [`Setup::metrics`]: real ns, virtual ns, then each event (scaled
    /// when multiplexed, derived presets computed from their terms).
    pub fn since(&self, earlier: &Reading) -> Vec<i64> {
        let Some(setup) = SETUP.get() else { return vec![] };
        let mut event_terms = Vec::with_capacity(setup.plans.len());
        let mut at = 0;
        for (attrs, _) in &setup.plans {
            event_terms.push(at..at + attrs.len());
            at += attrs.len();
        }
        let mut terms = vec![0; at];
        let mut out = vec![0; setup.metrics.len()];
        metric_deltas(setup, &event_terms, &earlier.values, &self.values, &mut terms, &mut out);
        out
    }
}

/// Reads the calling thread's region counters (opening them on first use,
/// as the thread's first [`region_begin`] does) without beginning or
/// ending a region.
pub fn read_counters() -> Result<Reading, RegionError> {
    with_state(|s| {
        let mut values = vec![0; s.stride()];
        ThreadRegions::read(&mut s.groups, &mut values, true).map_err(|e| RegionError::Counters {
            thread: s.shared.tid,
            op: "read",
            source: Box::new(e),
        })?;
        Ok(Reading { values })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn papi_spellings() {
        assert_eq!(
            split_list(" PAPI_TOT_INS, perf::TASK-CLOCK ,,page-faults "),
            ["PAPI_TOT_INS", "perf::TASK-CLOCK", "page-faults"]
        );
        assert_eq!(translate("perf::TASK-CLOCK").unwrap(), "task-clock");
        assert_eq!(translate("PAPI_TOT_CYC=delta").unwrap(), "PAPI_TOT_CYC");
        assert_eq!(translate("cpu/event=0x3c/").unwrap(), "cpu/event=0x3c/");
        assert!(matches!(translate("x=instant"), Err(RegionError::EventSyntax { .. })));
        assert!(matches!(translate("perf::"), Err(RegionError::EventSyntax { .. })));
    }

    #[test]
    fn caller_events_must_all_work() {
        let err = Config::new().events(["page-faults", "no-such-event-x"]).resolve().unwrap_err();
        assert!(matches!(&err, RegionError::Event { event, .. } if event == "no-such-event-x"), "{err:?}");
        let ok = Config::new().events(["page-faults", "PAPI_TOT_CYC=delta"]).resolve();
        let no_pmu = papirus_lowlevel::init().unwrap().machine().hw_counters == Some(0);
        match ok {
            Ok(s) => {
                assert!(!no_pmu, "cycles resolved without a PMU");
                assert_eq!(s.metrics, ["real_time_ns", "virtual_time_ns", "page-faults", "PAPI_TOT_CYC"]);
            }
            Err(e) => {
                assert!(no_pmu, "{e}");
                assert!(e.to_string().contains("PAPI_TOT_CYC"), "{e}");
                println!("{e}");
            }
        }
        let s = Config::new().events(Vec::<String>::new()).resolve().unwrap();
        assert_eq!(s.metrics, TIME_METRICS);
        assert_eq!(s.source, EventSource::Caller);
    }

    #[test]
    fn multiplexed_deltas_scale() {
        assert_eq!(scaled_delta(&[10, 100, 100], &[30, 200, 200]), 20);
        // Counted half the interval: doubled.
        assert_eq!(scaled_delta(&[10, 100, 100], &[30, 300, 200]), 40);
        // Never on the PMU during the interval.
        assert_eq!(scaled_delta(&[10, 100, 100], &[10, 300, 100]), 0);
        // Wrapped raw counter.
        assert_eq!(scaled_delta(&[u64::MAX as i64, 0, 0], &[4, 0, 0]), 5);
    }

    #[test]
    fn readings_give_each_metrics_change() {
        let before = read_counters().unwrap();
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = read_counters().unwrap();
        assert!(after.ticks() > before.ticks());
        let d = after.since(&before);
        assert_eq!(d.len(), setup().unwrap().metrics.len());
        assert!(d[0] > 0 && d[1] > 0, "real and virtual time advance: {d:?}");
        let tc = setup().unwrap().metrics.iter().position(|m| m == "task-clock");
        if let Some(i) = tc {
            // task-clock and virtual time measure the same thing.
            let (v, t) = (d[1] as f64, d[i] as f64);
            assert!((t - v).abs() <= 0.2 * v + 200_000.0, "task-clock {t} vs virtual {v}");
        }
        assert_eq!(after.since(&after).iter().filter(|&&v| v != 0).count(), 0);
    }

    #[test]
    fn cell_min_max_total() {
        let c = RegionCell::new("r", 0, None, 2);
        assert_eq!(c.sample().metrics, vec![(0, 0, 0); 2]);
        c.opened();
        assert!(c.is_open());
        c.record(&[5, -1]);
        c.opened();
        c.record(&[3, 7]);
        let s = c.sample();
        assert_eq!((s.calls, s.open), (2, 0));
        assert_eq!(s.metrics, vec![(8, 3, 5), (6, -1, 7)]);
    }
}
