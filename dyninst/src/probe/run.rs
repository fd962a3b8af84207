//! `papirus-probe run`: start a program with the runtime preloaded, patch the
//! chosen functions while it is stopped at its entry point, let it run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::{ProbeError, Selection, TargetHooks, call_with_path, patch_stopped, select, write_session};
use crate::patch::Refused;
use crate::process::{Exit, Spawn};
use crate::{Error, inventory::Inventory};
use papirus_probe_runtime::Probe;

/// What to run and measure.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The probe.
    pub probe: Probe,
    /// Counter events of the counters probe.
    pub events: Vec<String>,
    /// Which functions.
    pub selection: Selection,
    /// Where the report goes.
    pub output: PathBuf,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The runtime library.
    pub runtime: PathBuf,
}

/// How a run went.
#[derive(Debug)]
pub struct RunSummary {
    /// The program's process id.
    pub pid: i32,
    /// How it ended.
    pub exit: Exit,
    /// Functions patched.
    pub installed: usize,
    /// Functions refused, with reasons.
    pub refused: Vec<Refused>,
    /// The report file (written by the runtime at exit).
    pub output: PathBuf,
}

/// Runs the program instrumented and waits for it to end.
pub fn run(opts: &RunOptions) -> Result<RunSummary, ProbeError> {
    super::check_events(opts.probe, &opts.events)?;
    let runtime = std::path::absolute(&opts.runtime).unwrap_or_else(|_| opts.runtime.clone());
    let mut p = Spawn::new(&opts.program).args(&opts.args).preload(&runtime).spawn()?;
    let pid = p.pid();
    let session = std::env::temp_dir().join(format!("papirus-probe-session-run-{pid}.json"));
    let result = (|| {
        let hooks = TargetHooks::find(&p)?;
        let inv = Inventory::of_process(pid)?;
        let entry = p.entry_point().ok();
        let (names, specs) = select(&inv, &opts.selection, &hooks, entry, &mut |a| p.read_u64(a).ok())?;
        write_session(&session, opts.probe, &opts.events, names, &opts.output)?;
        if call_with_path(&mut p, hooks.setup, &session)? as i32 != 0 {
            return Err(ProbeError::Setup { pid, path: session.clone() });
        }
        patch_stopped(&mut p, &specs).map(|o| (o.installed, o.refused))
    })();
    let _ = std::fs::remove_file(&session);
    let (installed, refused) = result?;
    let detached = p.detach()?;
    let exit = loop {
        match detached.wait(Duration::from_secs(3600)) {
            Err(Error::Timeout { .. }) => continue,
            other => break other?,
        }
    };
    Ok(RunSummary { pid, exit, installed: installed.len(), refused, output: opts.output.clone() })
}
