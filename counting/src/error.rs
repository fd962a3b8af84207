//! The substrate's error type: every failure keeps the errno, the operation
//! and the event, and says what the user can do about it.

use std::path::PathBuf;

use crate::sys::Errno;

/// What the substrate was doing when the kernel refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `perf_event_open(2)`
    Open,
    /// `PERF_EVENT_IOC_ENABLE`
    Enable,
    /// `PERF_EVENT_IOC_DISABLE`
    Disable,
    /// `PERF_EVENT_IOC_RESET`
    Reset,
    /// Another ioctl (period, refresh, output, id).
    Ioctl,
    /// `read(2)` of counter values
    Read,
    /// `mmap(2)` of the event's pages
    Mmap,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Open => "perf_event_open",
            Op::Enable => "enable",
            Op::Disable => "disable",
            Op::Reset => "reset",
            Op::Ioctl => "ioctl",
            Op::Read => "read",
            Op::Mmap => "mmap",
        })
    }
}

const NO_PMU_HINT: &str = "no hardware PMU is exposed to this machine (running under a hypervisor without PMU passthrough?): hardware events are unavailable; software, msr, breakpoint, tracepoint and uprobe events still work";

/// Errors of the substrate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel has no such event or PMU here (ENOENT, EOPNOTSUPP, ENODEV).
    #[error("{op} of `{event}` failed: {errno}: this kernel or machine does not support it{}", if *.hardware { format!("; {NO_PMU_HINT}") } else { String::new() })]
    Unsupported {
        /// The operation.
        op: Op,
        /// The event as the user named it.
        event: String,
        /// The kernel's code.
        errno: Errno,
        /// Whether the event needs a hardware PMU (cycles, caches, raw, cpu/…/).
        hardware: bool,
    },
    /// Refused for lack of privilege (EACCES, EPERM).
    #[error(
        "{op} of `{event}` failed: {errno}: not permitted at perf_event_paranoid={paranoid}; count user space only (`:u`), measure your own processes, or run with CAP_PERFMON / lower /proc/sys/kernel/perf_event_paranoid"
    )]
    Permission {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
        /// The paranoid level in force, or -99 when it could not be read.
        paranoid: i32,
    },
    /// No counter slot is free (ENOSPC): four breakpoints per thread, or a full PMU.
    #[error(
        "{op} of `{event}` failed: {errno}: no free counter slot (x86 has 4 debug registers for breakpoints); close another event of this kind first"
    )]
    NoCounterSlot {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
    },
    /// The kernel expects another perf_event_attr size (E2BIG).
    #[error(
        "{op} of `{event}` failed: {errno}: the kernel expects a perf_event_attr of {expected} bytes; papirus was built for a newer or older kernel ABI"
    )]
    AttrSize {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
        /// The size the kernel wrote back.
        expected: u32,
    },
    /// The target thread or process does not exist (ESRCH).
    #[error("{op} of `{event}` failed: {errno}: no process or thread {pid}")]
    NoSuchProcess {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
        /// The id asked for.
        pid: i32,
    },
    /// Too many open files (EMFILE, ENFILE).
    #[error("{op} of `{event}` failed: {errno}: out of file descriptors; raise `ulimit -n` or close events")]
    TooManyFiles {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
    },
    /// Any other refusal, EINVAL most often: the attr combination is not valid here.
    #[error("{op} of `{event}` failed: {errno}{}", if .hint.is_empty() { String::new() } else { format!(": {}", .hint) })]
    Kernel {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// The kernel's code.
        errno: Errno,
        /// What is likely wrong, or empty.
        hint: String,
    },
    /// An event name no table or PMU knows.
    #[error("unknown event `{name}`{}", suggest(.suggestions))]
    UnknownEvent {
        /// The name given.
        name: String,
        /// The closest known names, best first.
        suggestions: Vec<String>,
    },
    /// A PMU name that sysfs does not list.
    #[error("unknown PMU `{name}` in `{event}`{}", suggest(.suggestions))]
    UnknownPmu {
        /// The PMU name given.
        name: String,
        /// The whole event.
        event: String,
        /// The closest PMUs.
        suggestions: Vec<String>,
    },
    /// A name that does not follow the event syntax.
    #[error("malformed event `{event}`: {reason}")]
    Malformed {
        /// The whole event.
        event: String,
        /// What is wrong, where.
        reason: String,
    },
    /// A `pmu/term=…/` term that is neither a format field nor an event of that PMU.
    #[error("unknown term `{term}` for PMU `{pmu}` in `{event}`{}", suggest(.suggestions))]
    UnknownTerm {
        /// The whole event.
        event: String,
        /// The PMU whose `format/` and `events/` were searched.
        pmu: String,
        /// The term given.
        term: String,
        /// The closest format fields and events of that PMU.
        suggestions: Vec<String>,
    },
    /// A `cpu/…/` event on a machine whose sysfs lists no core PMU.
    #[error(
        "`{event}` needs the CPU's core PMU (`cpu` in /sys/bus/event_source/devices), which is absent: {NO_PMU_HINT}"
    )]
    NoHardwarePmu {
        /// The whole event.
        event: String,
    },
    /// A breakpoint whose address, length or access cannot be set on this CPU.
    #[error("bad breakpoint `{event}`: {reason}")]
    BadAddress {
        /// The whole event.
        event: String,
        /// What is wrong and what the CPU accepts.
        reason: String,
    },
    /// The file a probe names does not exist or cannot be read.
    #[error("`{event}`: cannot use {}: {source}; name an existing executable or shared library (absolute path)", .path.display())]
    NoSuchFile {
        /// The whole event.
        event: String,
        /// The path given.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },
    /// Tracepoint ids come from tracefs, which is not mounted.
    #[error(
        "`{event}` is a tracepoint but tracefs is not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing; mount it (`mount -t tracefs nodev /sys/kernel/tracing`)"
    )]
    NoTracefs {
        /// The whole event.
        event: String,
    },
    /// A symbol not found in an ELF file.
    #[error("symbol `{symbol}` not found in {}{}", .path.display(), suggest(.suggestions))]
    SymbolNotFound {
        /// The file searched.
        path: PathBuf,
        /// The symbol.
        symbol: String,
        /// Close names in the same file.
        suggestions: Vec<String>,
    },
    /// An ELF file that could not be parsed.
    #[error("{}: not a usable ELF file: {reason}", .path.display())]
    Elf {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        reason: String,
    },
    /// A file or sysfs entry that could not be read.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Data the kernel returned that does not have the expected shape.
    #[error("{op} of `{event}` returned {got} bytes, expected {expected}")]
    ShortRead {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// Data the kernel returned that is well-sized but inconsistent (an
    /// unknown event id, a member count that does not match the group).
    #[error("{op} of `{event}` returned data papirus cannot use: {reason}")]
    KernelData {
        /// The operation.
        op: Op,
        /// The event.
        event: String,
        /// What does not match.
        reason: String,
    },
    /// `read(2)` returned end of file: the event is in error state, which
    /// happens to a pinned event (or group) the PMU could not schedule.
    #[error(
        "`{event}` is in error state: it is pinned but could not be put on a counter (read returned end of file); unpin it, or close events that compete for the same counters"
    )]
    InErrorState {
        /// The event.
        event: String,
    },
}

fn suggest(s: &[String]) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", s.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "))
    }
}

/// The result type of the substrate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The current `/proc/sys/kernel/perf_event_paranoid`, or -99 if unreadable.
pub fn paranoid_level() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-99)
}

impl Error {
    /// Classifies a kernel refusal of `op` on `event`.
    ///
    /// `hardware` says whether the event needs a hardware PMU, so ENOENT can
    /// be explained as a missing PMU; `pid` is the target for ESRCH.
    pub fn from_errno(op: Op, event: &str, errno: Errno, hardware: bool, pid: i32) -> Self {
        let event = event.to_string();
        match errno.0 {
            libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV => {
                Error::Unsupported { op, event, errno, hardware }
            }
            libc::EACCES | libc::EPERM => Error::Permission { op, event, errno, paranoid: paranoid_level() },
            libc::ENOSPC => Error::NoCounterSlot { op, event, errno },
            libc::ESRCH => Error::NoSuchProcess { op, event, errno, pid },
            libc::EMFILE | libc::ENFILE => Error::TooManyFiles { op, event, errno },
            _ => Error::Kernel { op, event, errno, hint: String::new() },
        }
    }

    /// The errno behind this error, if the kernel gave one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Unsupported { errno, .. }
            | Error::Permission { errno, .. }
            | Error::NoCounterSlot { errno, .. }
            | Error::AttrSize { errno, .. }
            | Error::NoSuchProcess { errno, .. }
            | Error::TooManyFiles { errno, .. }
            | Error::Kernel { errno, .. } => Some(*errno),
            Error::Io { source, .. } | Error::NoSuchFile { source, .. } => source.raw_os_error().map(Errno),
            _ => None,
        }
    }
}
