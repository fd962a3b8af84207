//! `papirus-probe run`: start a program with the runtime preloaded, start a
//! session and patch the chosen functions while it is stopped at its entry
//! point, let it run, and write the report from the results segment however
//! it ends (exit, `_exit`, a fatal signal, SIGKILL from outside, `execve`).
//!
//! While it runs, the tool keeps only the main thread traced, for its
//! `execve` event (the runtime's tables vanish from an image that execs, so
//! the measurement of that process ends there; the hold passes from patching
//! to following without a detach, so no exec goes unseen); every signal that
//! stops it is passed on at once.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::ptrace;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::results::{Results, other_process_state, write};
use super::trace::{TraceSummary, Tracing};
use super::{Chosen, Instrumentation, ProbeError, Report, TargetHooks, patch_stopped, select, start_session};
use crate::inventory::Inventory;
use crate::patch::Refused;
use crate::process::{Exit, Process, Spawn};

/// What to run and measure.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// What to measure, and where the report goes.
    pub instrumentation: Instrumentation,
}

/// How a run went.
#[derive(Debug)]
pub struct RunSummary {
    /// The program's process id.
    pub pid: i32,
    /// How it ended.
    pub exit: Exit,
    /// Whether it replaced itself with `execve` (its measurement ended there).
    pub exec: bool,
    /// Functions patched.
    pub installed: usize,
    /// Functions refused, with reasons.
    pub refused: Vec<Refused>,
    /// The report file (written by the tool when the program ended).
    pub output: PathBuf,
    /// How long reading the segment and writing the report took.
    pub report_time: std::time::Duration,
    /// The trace, when asked for.
    pub trace: Option<TraceSummary>,
    /// The report written to the output (so the caller need not read it back).
    pub report: Report,
}

/// Runs the program instrumented, waits for it to end and writes the report.
pub fn run(opts: &RunOptions) -> Result<RunSummary, ProbeError> {
    // The report converts ticks with it: calibrated while the target runs, not after.
    papirus_substrate::clock::set_up_in_background();
    super::check_counter_events(opts.instrumentation.probe, &opts.instrumentation.events)?;
    super::check_trace(opts.instrumentation.probe, opts.instrumentation.trace.as_ref())?;
    papirus_formats::output::check_writable(&opts.instrumentation.output)?;
    let runtime = std::path::absolute(&opts.instrumentation.runtime)
        .unwrap_or_else(|_| opts.instrumentation.runtime.clone());
    let mut p = Spawn::new(&opts.program).args(&opts.args).preload(&runtime).spawn()?;
    let pid = p.pid();
    let prepared = prepare(&mut p, opts);
    let (names, results, installed, refused, mut tracing) = match prepared {
        Ok(v) => v,
        Err(e) => {
            // Nothing of what was asked can be measured: do not leave it running unmeasured.
            drop(p);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid), None);
            return Err(ProbeError::Killed { pid, reason: e.to_string() });
        }
    };
    p.resume_following(ptrace::Options::PTRACE_O_TRACEEXEC)?;
    let seg = results.segment()?;
    let (exit, exec) = match tracing.as_mut() {
        None => follow(pid)?,
        // The rings are drained while the program runs, so a long run needs no large ring.
        Some(t) => {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let drainer = s.spawn(|| t.drain_until(&seg, &stop));
                let followed = follow(pid);
                stop.store(true, Ordering::Relaxed);
                let _ = drainer.join();
                followed
            })?
        }
    };
    let end = papirus_substrate::arch::rdtsc();
    let ended = |p: u32| {
        if p == pid as u32 {
            if exec { format!("execve, then {exit}") } else { exit.to_string() }
        } else {
            other_process_state(p)
        }
    };
    let t0 = std::time::Instant::now();
    let report =
        results.report(pid, opts.instrumentation.probe, &opts.instrumentation.events, names, &ended)?;
    write(&opts.instrumentation.output, &report)?;
    let trace = tracing.map(|t| t.finish(&seg, end, super::trace_footer(&report))).transpose()?;
    let report_time = t0.elapsed();
    Ok(RunSummary {
        pid,
        exit,
        exec,
        installed,
        refused,
        output: opts.instrumentation.output.clone(),
        report_time,
        trace,
        report,
    })
}

type Prepared = (Vec<String>, Results, usize, Vec<Refused>, Option<Tracing>);

/// Selects, starts the session and patches, the target stopped at its entry.
fn prepare(p: &mut Process, opts: &RunOptions) -> Result<Prepared, ProbeError> {
    let pid = p.pid();
    let hooks = TargetHooks::find(p).map_err(|e| match e {
        ProbeError::Process(_) => ProbeError::Setup {
            pid,
            reason: "the runtime is not loaded in it (a static program cannot load it with LD_PRELOAD)"
                .into(),
        },
        other => other,
    })?;
    let inv = Inventory::of_process(pid)?;
    let Chosen { mut names, mut specs, left_out } =
        select(&inv, &opts.instrumentation.selection, &hooks, p.entry_point().ok(), &mut |a| {
            p.read_u64(a).ok()
        })?;
    let (results, tracing) = start_session(p, &hooks, &opts.instrumentation, &mut names, &mut specs)?;
    // A failure kills the program (see `run`): its patches need no restoring.
    let (outcome, patched) = patch_stopped(p, &specs);
    patched?;
    let (installed, refused) = (outcome.installed, [left_out, outcome.refused].concat());
    super::print_summary(&installed, &refused);
    Ok((names, results, installed.len(), refused, tracing))
}

/// Waits for the program to end, its main thread still traced for
/// `execve` (and nothing else); returns how it ended and whether it exec'd.
fn follow(pid: i32) -> Result<(Exit, bool), ProbeError> {
    let target = Pid::from_raw(pid);
    let mut exec = false;
    let mut traced = true;
    loop {
        let status = match waitpid(target, Some(WaitPidFlag::__WALL)) {
            Ok(s) => s,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                return Err(ProbeError::Io {
                    op: "wait for",
                    path: format!("/proc/{pid}").into(),
                    source: std::io::Error::from(e),
                });
            }
        };
        match status {
            WaitStatus::Exited(_, code) => return Ok((Exit::Code(code), exec)),
            WaitStatus::Signaled(_, sig, _) => return Ok((Exit::Signal(sig as i32), exec)),
            WaitStatus::PtraceEvent(_, _, ev) if ev == libc::PTRACE_EVENT_EXEC => {
                exec = true;
                traced = ptrace::detach(target, None).is_err();
            }
            // A group stop (SIGSTOP and friends) under PTRACE_SEIZE: stay stopped until SIGCONT.
            WaitStatus::PtraceEvent(..) if traced => {
                let _ = crate::process::listen(pid);
            }
            WaitStatus::Stopped(_, sig) if traced => {
                let _ = ptrace::cont(target, sig);
            }
            _ => {}
        }
    }
}
