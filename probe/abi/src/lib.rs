//! papirus-probe-abi: what the probe tool and the probe runtime inside the
//! target share, and nothing else (no hooks, no unsafe code).
//!
//! - [`Session`]: the blob the tool writes into the target's memory and hands
//!   to `papirus_probe_setup` by a remote call.
//! - [`layout`]: the results segment, a sealed memfd the runtime creates and
//!   lays its tables in, and the tool maps read-only ([`segment`] reads it).
//! - [`report`]: the JSON report the tool writes.
#![forbid(unsafe_code)]

pub mod layout;
pub mod report;
pub mod segment;

use papirus_counting::EventAttr;
use papirus_counting::read::TscRate;
use serde::{Deserialize, Serialize};

pub use report::{
    EdgeReport, FORMAT_VERSION, Figures, FunctionReport, NodeReport, ProcessReport, Report, ThreadReport,
    Window,
};

/// What the hooks measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Probe {
    /// Counts calls and tracks returns, takes no timestamps (the probe's own cost floor).
    Empty,
    /// Real time from the TSC.
    Wallclock,
    /// Real time plus counter events, read per thread.
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

/// Version of [`Session`]; the runtime refuses any other.
pub const SESSION_VERSION: u32 = 2;
/// Call-path tree nodes per thread unless a session says otherwise: 64 per
/// instrumented function, at least 16,384 and at most 2^20. (An interpreter
/// instrumented whole makes about 20 paths per function: all of
/// libpython3.13, 5,300 functions, made 97,000 on a short script.)
pub fn default_nodes(functions: u64) -> u64 {
    functions.saturating_mul(64).clamp(16_384, 1 << 20)
}
/// Trace records per thread's ring unless a session says otherwise.
pub const DEFAULT_RING: u64 = 1 << 18;
/// Largest session blob the runtime reads.
pub const SESSION_MAX_BYTES: usize = 64 << 10;

/// The session blob (JSON) the tool writes into the target: attributes only,
/// never names or paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// [`SESSION_VERSION`] of the writer.
    pub version: u32,
    /// The probe.
    pub probe: Probe,
    /// Instrumented functions; ids are `0..functions`.
    pub functions: u64,
    /// What the counters probe reads.
    #[serde(default)]
    pub counters: CounterSetup,
    /// Thread tables in the segment: threads alive at once that can be measured.
    pub slots: u64,
    /// Process records: the target and the children it forks.
    pub processes: u64,
    /// The tool's process id (named to a second tool that tries to attach).
    pub tool_pid: u32,
    /// Keep ended threads' figures per thread (up to half the slots, the
    /// oldest folded first) instead of folding them at once.
    #[serde(default)]
    pub per_thread: bool,
    /// Call-path tree nodes per thread (a process record holds four times
    /// as many); 0 takes [`default_nodes`].
    #[serde(default)]
    pub nodes: u64,
    /// Trace every call into per-thread rings, when set.
    #[serde(default)]
    pub trace: Option<TraceOptions>,
}

impl Session {
    /// The segment's shape for this session, or `None` when it is out of the layout's limits.
    pub fn shape(&self, depth: u64) -> Option<layout::Shape> {
        let nodes = if self.nodes == 0 { default_nodes(self.functions) } else { self.nodes };
        let counters = if self.probe == Probe::Counters { self.counters.events.len() as u64 } else { 0 };
        Some(layout::Shape {
            funcs: self.functions,
            nodes,
            proc_nodes: nodes.saturating_mul(4).min(layout::MAX_NODES),
            depth,
            slots: self.slots,
            procs: self.processes,
            ring: self.trace.as_ref().map_or(0, |t| t.ring),
            record_words: 3 + 2 * counters.min(layout::MAX_EVENTS as u64),
        })
    }
}

/// What a session traces ([`layout::record`]): calls of functions with ids
/// below `functions`, shallower than `depth`, lasting at least `min_ticks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceOptions {
    /// Records per thread's ring (a power of two).
    pub ring: u64,
    /// Calls shorter than this many TSC ticks are not traced.
    pub min_ticks: u64,
    /// Calls at this shadow-stack depth or deeper (0: the outermost) are not traced.
    pub depth: u64,
    /// Functions traced: ids below this (the tool numbers them first).
    pub functions: u64,
}

impl Session {
    /// Encodes the blob.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a blob, refusing other versions and oversized input.
    pub fn from_bytes(bytes: &[u8]) -> Result<Session, SetupCode> {
        if bytes.len() > SESSION_MAX_BYTES {
            return Err(SetupCode::BadSession);
        }
        let s: Session = serde_json::from_slice(bytes).map_err(|_| SetupCode::BadSession)?;
        if s.version != SESSION_VERSION {
            return Err(SetupCode::BadSession);
        }
        Ok(s)
    }
}

/// What the counters probe reads, resolved by the tool: the events'
/// descriptions (the runtime has no name parser and reads no sysfs file)
/// and the TSC's rate (the runtime measures nothing to extrapolate
/// task-clock between reads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterSetup {
    /// The events, at most [`layout::MAX_EVENTS`].
    pub events: Vec<EventAttr>,
    /// The TSC's rate, when real time is read from the TSC.
    pub tsc: Option<TscRate>,
}

/// Why `papirus_probe_setup` failed: its negative return value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub enum SetupCode {
    /// The blob does not parse, is too large or of another version.
    BadSession = -1,
    /// The segment's geometry overflows or exceeds the limits of [`layout`].
    Geometry = -2,
    /// memfd_create, ftruncate, sealing or mmap failed in the target.
    Memory = -3,
    /// A counter event the target's kernel refuses or papirus cannot parse.
    Events = -4,
    /// A session is already active in this process; see [`SetupCode::active_owner`].
    Active = -5,
}

/// Set-up returns `-(ACTIVE_BASE + pid)` when the tool `pid` holds a session.
pub const ACTIVE_BASE: i64 = 1 << 32;

impl SetupCode {
    /// The code for a negative return value.
    pub fn from_return(v: i64) -> Option<SetupCode> {
        [SetupCode::BadSession, SetupCode::Geometry, SetupCode::Memory, SetupCode::Events, SetupCode::Active]
            .into_iter()
            .find(|c| *c as i64 == v)
    }

    /// The pid of the tool holding the session, from set-up's return value.
    pub fn active_owner(v: i64) -> Option<u32> {
        (v <= -ACTIVE_BASE).then(|| (-(v + ACTIVE_BASE)) as u32)
    }

    /// What it means for the user.
    pub fn describe(self) -> &'static str {
        match self {
            SetupCode::BadSession => "the runtime refused the session blob (another papirus version?)",
            SetupCode::Geometry => "the results segment would be too large for this many functions",
            SetupCode::Memory => "the target could not create or seal its results segment (memfd)",
            SetupCode::Events => "the target cannot open the counter events",
            SetupCode::Active => "a papirus session is already active in this process",
        }
    }
}
