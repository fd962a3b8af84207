//! The probe tool's work: choose a target's functions, load the probe
//! runtime into it, start a session whose results segment the tool maps
//! ([`results`]), patch the functions with trampolines that call the
//! runtime, and write the report from the segment (`papirus-probe run`,
//! `attach`, `report`). The target never writes a file for papirus.
//!
//! The runtime (`libpapirus_probe_runtime.so`) is found with no configuration
//! at fixed places relative to the running executable, first hit wins (see
//! [`RUNTIME_PLACES`]); `$PAPIRUS_PROBE_RUNTIME` overrides.

mod attach;
pub mod cost;
mod patching;
mod release;
mod report;
mod results;
mod run;
mod select;
pub mod trace;

use std::path::{Path, PathBuf};

use papirus_substrate::EventAttr;

pub use papirus_probe_abi::{Probe, Report, Window};

pub use attach::{AttachOptions, AttachSummary, Stop, attach};
pub use patching::RemoteSpace;
use patching::{patch_stopped, unpatch_stopped};
pub use release::Kept;
pub use report::{
    NAME_WIDTH, ProbeCost, SortKey, TreeView, View, format_report, format_summary, format_tree,
};
pub use run::{RunOptions, RunSummary, run};
use select::{Chosen, select, trace_first};
pub use select::{MAIN_MODULE, Selection};
pub use trace::{Trace, TraceSummary, read_trace};

use crate::patch::{Installed, PatchError, Refused};
use crate::process::Process;

/// File name of the runtime library.
pub const RUNTIME_FILE: &str = "libpapirus_probe_runtime.so";
/// Environment variable that overrides where the runtime is looked for.
pub const RUNTIME_ENV: &str = "PAPIRUS_PROBE_RUNTIME";

/// Failures of the probe tool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// Process control or inventory.
    #[error(transparent)]
    Process(#[from] crate::Error),
    /// Patching.
    #[error(transparent)]
    Patch(#[from] PatchError),
    /// The runtime library is not where it should be.
    #[error(
        "the probe runtime {RUNTIME_FILE} was not found for {}: looked in {searched} \
         (and ${RUNTIME_ENV} is unset); build it with `cargo build -p papirus-probe-runtime` \
         (same profile as papirus-probe)", .exe.display()
    )]
    NoRuntime {
        /// The running executable.
        exe: PathBuf,
        /// Every place looked, in order.
        searched: String,
    },
    /// A file the tool reads or writes.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A report that does not parse.
    #[error("{path} is not a papirus probe report: {source}")]
    BadReport {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A trace file that does not parse.
    #[error("{path} is not a readable papirus trace: {reason}")]
    BadTrace {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A report of another format version.
    #[error("{path} has report format {found}; this papirus-probe reads format {expected}")]
    ReportVersion {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// A `--module` pattern that names no module of the process.
    #[error("no module of the process matches `{pattern}`; its modules: {modules}")]
    NoModule {
        /// The pattern.
        pattern: String,
        /// The modules there are.
        modules: String,
    },
    /// No function matched the selection.
    #[error("no function of {modules} matches {globs}: see `papirus-probe list`")]
    NothingSelected {
        /// Modules searched.
        modules: String,
        /// The globs.
        globs: String,
    },
    /// The runtime refused its session inside the target.
    #[error("the probe runtime in pid {pid} could not start a session: {reason}")]
    Setup {
        /// The target.
        pid: i32,
        /// Why.
        reason: String,
    },
    /// Another papirus-probe holds a session in the target.
    #[error("pid {pid} is already instrumented by papirus-probe pid {owner}: wait for it to detach")]
    Busy {
        /// The target.
        pid: i32,
        /// The other tool's pid.
        owner: u32,
    },
    /// A results segment that cannot be trusted.
    #[error("the results segment of pid {pid} is unusable: {reason}")]
    BadSegment {
        /// The target.
        pid: i32,
        /// What is wrong.
        reason: String,
    },
    /// The report cannot be written.
    #[error(transparent)]
    Output(#[from] papirus_formats::output::OutputError),
    /// `run` could not instrument the program it started, so it killed it.
    #[error("{reason}; the program (pid {pid}) was killed")]
    Killed {
        /// The program.
        pid: i32,
        /// Why instrumenting it failed.
        reason: String,
    },
    /// An unknown probe name.
    #[error("unknown probe `{0}`: use wallclock, counters or empty")]
    UnknownProbe(String),
    /// Events given to a probe that reads none, or a bad event list.
    #[error("{0}")]
    Events(String),
}

/// Where the runtime is looked for, relative to the directory of the
/// running executable, in this order; the first that exists wins.
///
/// - `deps/`: `cargo build`/`cargo run` put the tool in `target/<profile>/`
///   and build the runtime, a dependency, into `target/<profile>/deps/`;
///   that copy is rebuilt with the tool (the one uplifted to
///   `target/<profile>/` is refreshed only when the runtime is built by name).
/// - `.`: test binaries live in `deps/` themselves; an installed tool may
///   keep the runtime beside it.
/// - `../lib/papirus/`: an installation under a prefix (`bin/`, `lib/papirus/`).
pub const RUNTIME_PLACES: [&str; 3] = ["deps", ".", "../lib/papirus"];

/// Finds the runtime library: `$PAPIRUS_PROBE_RUNTIME` when set, else the
/// first of [`RUNTIME_PLACES`] beside the running executable that holds
/// a regular file of that name. Never a directory the user did not install
/// papirus in, and never "the newest of several".
pub fn find_runtime() -> Result<PathBuf, ProbeError> {
    if let Some(p) = std::env::var_os(RUNTIME_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|source| ProbeError::Io {
        op: "locate",
        path: "/proc/self/exe".into(),
        source,
    })?;
    runtime_beside(&exe)
}

/// The first of [`RUNTIME_PLACES`] relative to `exe`'s directory that holds
/// a regular file named [`RUNTIME_FILE`].
fn runtime_beside(exe: &Path) -> Result<PathBuf, ProbeError> {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let places: Vec<PathBuf> = RUNTIME_PLACES.iter().map(|p| dir.join(p).join(RUNTIME_FILE)).collect();
    match places.iter().find(|p| std::fs::metadata(p).is_ok_and(|md| md.is_file())) {
        Some(p) => Ok(p.clone()),
        None => Err(ProbeError::NoRuntime {
            exe: exe.to_path_buf(),
            searched: places.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Parses a probe name.
pub fn parse_probe(name: &str) -> Result<Probe, ProbeError> {
    match name {
        "wallclock" => Ok(Probe::Wallclock),
        "empty" => Ok(Probe::Empty),
        "counters" => Ok(Probe::Counters),
        other => Err(ProbeError::UnknownProbe(other.to_string())),
    }
}

/// Resolves `--events` values to the descriptions the runtime opens, here,
/// before the target is touched: each value split as perf splits event
/// lists (commas inside `pmu/…/` terms stay), each name resolved as an event
/// set resolves it ([`papirus_lowlevel::Library::resolve_event`]: PAPI presets,
/// PAPI's `perf::` spellings, perf's syntax; an event that cannot be counted
/// here fails with the reason papirus-stat gives). The counters probe needs 1
/// to 4 events, each one native event; the other probes none. Each
/// description keeps the name as given, for the report.
pub fn resolve_events(probe: Probe, values: &[String]) -> Result<Vec<EventAttr>, ProbeError> {
    let mut names = Vec::new();
    for v in values {
        names.extend(
            papirus_substrate::names::split_event_names(v)
                .map_err(|e| ProbeError::Events(format!("--events {v}: {e}")))?,
        );
    }
    match probe {
        Probe::Counters if names.is_empty() || names.len() > 4 => Err(ProbeError::Events(
            "the counters probe reads 1 to 4 events: --events task-clock,page-faults".into(),
        )),
        Probe::Counters => {
            let lib = papirus_lowlevel::init().map_err(|e| ProbeError::Events(e.to_string()))?;
            names.iter().map(|n| resolve_event(&lib, n)).collect()
        }
        _ if !names.is_empty() => {
            Err(ProbeError::Events(format!("--events needs --probe counters (probe is {})", probe.name())))
        }
        _ => Ok(Vec::new()),
    }
}

/// Checks resolved events against the probe: 1 to 4 for the counters probe,
/// none for the others (a library caller may skip [`resolve_events`]).
fn check_counter_events(probe: Probe, events: &[EventAttr]) -> Result<(), ProbeError> {
    match probe {
        Probe::Counters if events.is_empty() || events.len() > 4 => {
            Err(ProbeError::Events("the counters probe reads 1 to 4 events".into()))
        }
        Probe::Counters => Ok(()),
        _ if !events.is_empty() => {
            Err(ProbeError::Events(format!("events need the counters probe (probe is {})", probe.name())))
        }
        _ => Ok(()),
    }
}

/// Checks a trace request against the probe before the target is touched:
/// a trace needs timestamps, which the empty probe does not take.
pub fn check_trace(probe: Probe, trace: Option<&TraceRequest>) -> Result<(), ProbeError> {
    if trace.is_some() && probe == Probe::Empty {
        return Err(ProbeError::Events(
            "--trace records times, which the empty probe does not take: use the wallclock or counters probe"
                .into(),
        ));
    }
    Ok(())
}

/// The one native event `name` counts on this machine, named `name`.
fn resolve_event(lib: &papirus_lowlevel::Library, name: &str) -> Result<EventAttr, ProbeError> {
    let r = lib.resolve_event(name).map_err(|e| ProbeError::Events(e.to_string()))?;
    match <[EventAttr; 1]>::try_from(r.attrs) {
        Ok([mut attr]) => {
            attr.name_as(name);
            Ok(attr)
        }
        Err(_) => Err(ProbeError::Events(format!(
            "{name} is derived from several native events here ({}); the counters probe reads native events: name them instead",
            r.info.terms.join(", ")
        ))),
    }
}

/// What to trace beside the call-path profile, and where the trace goes.
#[derive(Debug, Clone)]
pub struct TraceRequest {
    /// The trace file.
    pub output: PathBuf,
    /// Trace only functions matching one of these globs (every
    /// instrumented function when empty).
    pub functions: Vec<String>,
    /// Calls shorter than this are not traced (dropped at their exit).
    pub min_duration: std::time::Duration,
    /// Calls this deep or deeper are not traced (depth 0: the outermost
    /// instrumented call of a thread).
    pub depth: Option<u64>,
    /// Records per thread's ring: a power of two.
    pub ring: u64,
}

/// Numbers the functions `req` traces first (renumbering `specs`) and gives
/// the runtime's trace options; `rate` is the TSC's ticks per second.
fn trace_options(
    req: &TraceRequest,
    names: &mut Vec<String>,
    specs: &mut [crate::patch::FunctionSpec],
    rate: f64,
) -> Result<papirus_probe_abi::TraceOptions, ProbeError> {
    use papirus_probe_abi::layout::MAX_RING;
    if !req.ring.is_power_of_two() || !(2..=MAX_RING).contains(&req.ring) {
        return Err(ProbeError::Events(format!(
            "the trace buffer holds a power of two records per thread, 2 to {MAX_RING} (got {})",
            req.ring
        )));
    }
    let globs = crate::inventory::Globs::new(&req.functions).map_err(crate::Error::from)?;
    let functions = trace_first(names, specs, &globs);
    if functions == 0 {
        return Err(ProbeError::NothingSelected {
            modules: "the instrumented functions".into(),
            globs: format!("--trace-functions {}", req.functions.join(",")),
        });
    }
    Ok(papirus_probe_abi::TraceOptions {
        ring: req.ring,
        min_ticks: (req.min_duration.as_secs_f64() * rate) as u64,
        depth: req.depth.unwrap_or(u64::MAX),
        functions,
    })
}

/// What to measure and where its report goes: what `run` and `attach` share.
#[derive(Debug, Clone)]
pub struct Instrumentation {
    /// The probe.
    pub probe: Probe,
    /// Counter events of the counters probe, resolved ([`resolve_events`]).
    pub events: Vec<EventAttr>,
    /// Which functions.
    pub selection: Selection,
    /// Where the report goes.
    pub output: PathBuf,
    /// The runtime library.
    pub runtime: PathBuf,
    /// Keep ended threads' figures per thread (bounded) instead of folding them.
    pub per_thread: bool,
    /// Call-path tree nodes per thread (0: the default).
    pub nodes: u64,
    /// Trace every call, when set.
    pub trace: Option<TraceRequest>,
}

/// Numbers the traced functions first (renumbering `specs`), starts the
/// session in the stopped target and the trace file; a trace file that
/// cannot be started ends the session again.
fn start_session(
    p: &mut Process,
    hooks: &TargetHooks,
    m: &Instrumentation,
    names: &mut Vec<String>,
    specs: &mut [crate::patch::FunctionSpec],
) -> Result<(results::Results, Option<trace::Tracing>), ProbeError> {
    // The TSC's rate only for a trace: other sessions need not wait for its
    // calibration before the target starts.
    let traced = m.trace.as_ref().map(|req| (req, results::tsc_rate()));
    let trace = traced.map(|(req, rate)| trace_options(req, names, specs, rate)).transpose()?;
    let spec = results::SessionSpec {
        probe: m.probe,
        events: &m.events,
        functions: names.len(),
        per_thread: m.per_thread,
        nodes: m.nodes,
        trace,
    };
    let results = results::Results::start(p, hooks, &spec)?;
    let tracing = match traced {
        Some((req, rate)) => match start_tracing(req, &results, &spec, p.pid(), names, rate) {
            Ok(t) => Some(t),
            Err(e) => {
                let _ = p.call(hooks.teardown, &[]);
                return Err(e);
            }
        },
        None => None,
    };
    Ok((results, tracing))
}

/// Starts the trace file of `results`' session (what `trace_options` asked for).
fn start_tracing(
    req: &TraceRequest,
    results: &results::Results,
    spec: &results::SessionSpec<'_>,
    pid: i32,
    names: &[String],
    rate: f64,
) -> Result<trace::Tracing, ProbeError> {
    let opts = spec.trace.as_ref().ok_or_else(|| ProbeError::Events("tracing was not set up".into()))?;
    let seg = results.segment()?;
    let g = seg.geometry();
    let header = trace::TraceHeader {
        format_version: trace::TRACE_VERSION,
        pid: pid as u32,
        probe: spec.probe.name().to_string(),
        command: command_of(pid),
        functions: names.to_vec(),
        traced: opts.functions,
        events: if spec.probe == Probe::Counters {
            spec.events.iter().map(|a| a.name().to_string()).collect()
        } else {
            Vec::new()
        },
        start_tsc: seg.header(papirus_probe_abi::layout::hdr::START_TSC),
        ticks_per_second: rate,
        ring: g.shape.ring,
        record_words: g.shape.record_words,
        min_duration_ns: req.min_duration.as_nanos() as u64,
        max_depth: req.depth,
    };
    let filter = trace::Filter { functions: opts.functions, depth: opts.depth, min_ticks: opts.min_ticks };
    trace::Tracing::start(&req.output, &seg, &header, filter)
}

/// A process' command name (`/proc/PID/comm`, bounded), empty when unreadable.
fn command_of(pid: i32) -> String {
    papirus_substrate::input::read_file(Path::new(&format!("/proc/{pid}/comm")), 64)
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default()
}

/// The trace's footer from the report that ends the same session.
fn trace_footer(r: &Report) -> trace::TraceFooter {
    trace::TraceFooter {
        ticks_per_second: r.ticks_per_second,
        window: r.window.clone(),
        processes: r.processes.clone(),
        ..Default::default()
    }
}

/// The runtime's entry points inside the target.
#[derive(Debug, Clone, Copy)]
struct TargetHooks {
    enter: u64,
    unwind_begin: u64,
    catch: u64,
    setup: u64,
    teardown: u64,
}

impl TargetHooks {
    fn find(p: &Process) -> Result<TargetHooks, ProbeError> {
        let module = RUNTIME_FILE.trim_end_matches(".so");
        let [enter, unwind_begin, catch, setup, teardown] = p.module_functions(
            module,
            &[
                "papirus_probe_enter",
                "papirus_probe_unwind_begin",
                "papirus_probe_catch",
                "papirus_probe_setup",
                "papirus_probe_teardown",
            ],
        )?;
        Ok(TargetHooks { enter, unwind_begin, catch, setup, teardown })
    }
}

/// Prints what was instrumented and refused, to stderr (the program owns
/// stdout). The run and attach flows call it right after patching, before the
/// target resumes, so a hang still shows it. Refusals with the same reason
/// are one line with a count; the unwinder hooks papirus adds for itself are
/// not counted as instrumented functions. A failed write is ignored: the
/// target is stopped and must be resumed whatever stderr does.
pub fn print_summary(installed: &[Installed], refused: &[Refused]) {
    let _ = report::write_summary(&mut std::io::stderr().lock(), installed, refused);
}

/// `name` with control characters (terminal escapes included) written as
/// Rust escapes, so a symbol name cannot drive the terminal.
pub fn escape(name: &str) -> String {
    if !name.chars().any(char::is_control) {
        return name.to_string();
    }
    name.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// Reads a report file.
pub fn read_report(path: &Path) -> Result<Report, ProbeError> {
    // A regular file of bounded size, opened without blocking: `report` on a
    // FIFO, a device or a huge sparse file fails at once.
    let bytes = papirus_substrate::input::read_file(path, papirus_substrate::input::REPORT_LIMIT)
        .map_err(crate::Error::from)?;
    let text = String::from_utf8(bytes).map_err(|e| ProbeError::Io {
        op: "read report",
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    parse_report(path, text.as_bytes())
}

/// Parses a report's bytes (`path` names them in errors), checking its
/// format version first; the flat figures are derived from the trees again.
pub fn parse_report(path: &Path, bytes: &[u8]) -> Result<Report, ProbeError> {
    #[derive(serde::Deserialize)]
    struct Version {
        format_version: u32,
    }
    let v: Version = serde_json::from_slice(bytes)
        .map_err(|source| ProbeError::BadReport { path: path.into(), source })?;
    if v.format_version != papirus_probe_abi::FORMAT_VERSION {
        return Err(ProbeError::ReportVersion {
            path: path.into(),
            found: v.format_version,
            expected: papirus_probe_abi::FORMAT_VERSION,
        });
    }
    let mut r: Report = serde_json::from_slice(bytes)
        .map_err(|source| ProbeError::BadReport { path: path.into(), source })?;
    for t in &mut r.threads {
        t.derive();
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_search_order_is_fixed() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        std::fs::create_dir_all(bin.join("deps")).unwrap();
        let exe = bin.join("papirus-probe");
        let err = runtime_beside(&exe).unwrap_err().to_string();
        for place in ["bin/deps/", "bin/./", "bin/../lib/papirus/"] {
            assert!(err.contains(&format!("{place}{RUNTIME_FILE}")), "{place} not named: {err}");
        }
        // A directory of that name is not a runtime.
        std::fs::create_dir(bin.join(RUNTIME_FILE)).unwrap();
        assert!(runtime_beside(&exe).is_err());
        std::fs::create_dir_all(root.path().join("lib/papirus")).unwrap();
        std::fs::write(root.path().join("lib/papirus").join(RUNTIME_FILE), b"").unwrap();
        assert_eq!(runtime_beside(&exe).unwrap(), bin.join("../lib/papirus").join(RUNTIME_FILE));
        // deps/ comes first, whichever copy is newer.
        std::fs::write(bin.join("deps").join(RUNTIME_FILE), b"").unwrap();
        assert_eq!(runtime_beside(&exe).unwrap(), bin.join("deps").join(RUNTIME_FILE));
    }
}
