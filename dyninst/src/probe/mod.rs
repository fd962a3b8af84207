//! The probe tool's work: choose a target's functions, load the probe
//! runtime into it, start a session whose results segment the tool maps
//! ([`results`]), patch the functions with trampolines that call the
//! runtime, and write the report from the segment (`papirus-probe run`,
//! `attach`, `report`). The target never writes a file for papirus.
//!
//! The runtime (`libpapirus_probe_runtime.so`) is found with no configuration
//! beside the running executable: cargo builds it with papirus-probe into
//! `target/<profile>/deps/` (and copies it to `target/<profile>/` when the
//! runtime package is built by name); the newest copy wins. `$PAPIRUS_PROBE_RUNTIME`
//! overrides.

mod attach;
pub mod calibrate;
pub mod cost;
mod patching;
mod report;
mod results;
mod run;
mod select;

use std::path::{Path, PathBuf};

pub use papirus_probe_abi::{Probe, Report};

pub use attach::{AttachOptions, AttachSummary, attach};
pub use patching::RemoteSpace;
use patching::{patch_stopped, unpatch_stopped};
pub use report::{SortKey, format_report};
pub use run::{RunOptions, RunSummary, run};
pub use select::Selection;
use select::select;

use crate::patch::{PatchError, Refused};
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
    Dyninst(#[from] crate::Error),
    /// Patching.
    #[error(transparent)]
    Patch(#[from] PatchError),
    /// The runtime library is not where it should be.
    #[error(
        "the probe runtime {RUNTIME_FILE} is not beside {exe} nor named by ${RUNTIME_ENV}: \
         build it with `cargo build -p papirus-probe-runtime` (same profile as papirus-probe)"
    )]
    NoRuntime {
        /// The running executable.
        exe: PathBuf,
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
    Output(#[from] crate::output::OutputError),
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

/// Finds the runtime library.
pub fn find_runtime() -> Result<PathBuf, ProbeError> {
    if let Some(p) = std::env::var_os(RUNTIME_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|source| ProbeError::Io {
        op: "locate",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    // cargo builds the cdylib into target/<profile>/deps and copies it up to
    // target/<profile>/ only when the runtime package itself is built: take
    // the newest copy. Test binaries live in deps/ themselves.
    [dir.join(RUNTIME_FILE), dir.join("deps").join(RUNTIME_FILE), dir.join("..").join(RUNTIME_FILE)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
        .ok_or(ProbeError::NoRuntime { exe })
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

/// Checks a probe's event list here, before the target is touched: the
/// counters probe needs 1 to 4 events papirus-substrate can parse, the others none.
pub fn check_events(probe: Probe, events: &[String]) -> Result<(), ProbeError> {
    match probe {
        Probe::Counters if events.is_empty() || events.len() > 4 => Err(ProbeError::Events(
            "the counters probe reads 1 to 4 events: --events task-clock,page-faults".into(),
        )),
        Probe::Counters => {
            for e in events {
                papirus_substrate::parse_event(e)
                    .map_err(|err| ProbeError::Events(format!("event {e}: {err}")))?;
            }
            Ok(())
        }
        _ if !events.is_empty() => {
            Err(ProbeError::Events(format!("--events needs --probe counters (probe is {})", probe.name())))
        }
        _ => Ok(()),
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
        let f = |name| p.module_function(module, name);
        Ok(TargetHooks {
            enter: f("papirus_probe_enter")?,
            unwind_begin: f("papirus_probe_unwind_begin")?,
            catch: f("papirus_probe_catch")?,
            setup: f("papirus_probe_setup")?,
            teardown: f("papirus_probe_teardown")?,
        })
    }
}

/// Prints what was instrumented and refused (to stderr: the program owns stdout).
pub fn print_summary(installed: usize, refused: &[Refused]) {
    for r in refused {
        eprintln!("papirus-probe: refused {} at {:#x}: {}", r.name, r.addr, r.reason);
    }
    eprintln!("papirus-probe: instrumented {installed} functions, refused {}", refused.len());
}

/// Reads a report file.
pub fn read_report(path: &Path) -> Result<Report, ProbeError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProbeError::Io {
        op: "read report",
        path: path.into(),
        source,
    })?;
    parse_report(path, text.as_bytes())
}

/// Parses a report into typed structs, checking its format version first.
fn parse_report(path: &Path, bytes: &[u8]) -> Result<Report, ProbeError> {
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
    serde_json::from_slice(bytes).map_err(|source| ProbeError::BadReport { path: path.into(), source })
}
