//! `papirus-probe attach`: load the runtime into a running process, patch the
//! chosen functions, let it run, then flush the report, restore the original
//! code and detach, leaving the program running uninstrumented.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{
    ProbeError, Selection, TargetHooks, call_with_path, patch_stopped, select, unpatch_stopped, write_session,
};
use crate::inventory::Inventory;
use crate::patch::Refused;
use crate::process::Process;
use papirus_probe_runtime::Probe;

/// What to attach to and measure.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The process.
    pub pid: i32,
    /// The probe.
    pub probe: Probe,
    /// Counter events of the counters probe.
    pub events: Vec<String>,
    /// Which functions.
    pub selection: Selection,
    /// Where the report goes.
    pub output: PathBuf,
    /// How long to measure; until `stop` is set when `None`.
    pub duration: Option<Duration>,
    /// The runtime library.
    pub runtime: PathBuf,
}

/// Instruments process `pid` until the duration ends or `stop` is set, then
/// writes the report and detaches. Returns (functions patched, refused).
pub fn attach(opts: &AttachOptions, stop: &AtomicBool) -> Result<(usize, Vec<Refused>), ProbeError> {
    super::check_events(opts.probe, &opts.events)?;
    let pid = opts.pid;
    let mut p = Process::attach(pid)?;
    let image = p.image()?;
    let already = TargetHooks::find(&p).ok();
    if already.is_none() {
        p.inject(&opts.runtime)?;
    }
    let hooks = TargetHooks::find(&p)?;
    let inv = Inventory::of_process(pid)?;
    let (names, specs) = select(&inv, &opts.selection, &hooks, None)?;
    let session = std::env::temp_dir().join(format!("papirus-probe-session-attach-{pid}.json"));
    write_session(&session, opts.probe, &opts.events, names, &opts.output)?;
    let ok = call_with_path(&mut p, hooks.setup, &session);
    let _ = std::fs::remove_file(&session);
    if ok? as i32 != 0 {
        return Err(ProbeError::Setup { pid, path: session });
    }
    let (installed, refused) = patch_stopped(&mut p, &specs)?;
    let count = installed.len();
    // Let it run without us: a detached process needs no tracer to keep going.
    p.detach()?;
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && opts.duration.is_none_or(|d| start.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut p = Process::attach(pid)?;
    p.check_image(&image)?;
    let flushed = p.call(hooks.flush, &[]);
    // Restore even if the flush failed; live frames still return through the
    // runtime's exit stub, which stays loaded.
    unpatch_stopped(&mut p, installed)?;
    p.detach()?;
    if flushed? as i32 != 0 {
        return Err(ProbeError::Setup { pid, path: opts.output.clone() });
    }
    Ok((count, refused))
}
