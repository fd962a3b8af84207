//! `papirus-probe attach`: choose the functions, load the runtime into a
//! running process (or take a reference to the one it has), start a
//! session, patch, let it run; then restore the original code, put back
//! every return address the runtime hijacked, write the report from the
//! results segment, end the session, give the runtime back and detach.
//!
//! What stays in the target after detach: nothing of papirus but trampoline
//! pages a word of a thread's stack points into ([`super::release`]: a
//! frame may still return there), which the summary counts and explains
//! and the next detach looks at again. The results segment is unmapped, the
//! other trampoline pages too, and papirus' reference to the runtime
//! library is given back once no thread can be inside it, so the loader
//! unloads it (the summary says why when it stays: a preload, another
//! reference). Children the target forked during the window are held,
//! restored the same way and released before the target itself.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use super::release::{Kept, release_recorded, runtime_mapping, unload_runtime};
use super::results::{Results, maps_segment, other_process_state, write};
use super::trace::TraceSummary;
use super::{
    Chosen, Instrumentation, ProbeError, RUNTIME_FILE, TargetHooks, patch_stopped, select, start_session,
    unpatch_stopped,
};
use crate::inventory::Inventory;
use crate::patch::{Arena, Refused};
use crate::process::{Image, Process};
use papirus_probe_abi::Report;
use papirus_probe_abi::layout::hdr;

/// What to attach to and measure.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The process.
    pub pid: i32,
    /// How long to measure; until `stop` is set when `None`.
    pub duration: Option<Duration>,
    /// What to measure, and where the report goes.
    pub instrumentation: Instrumentation,
}

/// Rounds of letting the target run while a thread is inside the runtime at detach.
const LEAVE_ROUNDS: usize = 200;
/// Rounds of choosing a worker and looking again at the threads at detach.
const QUIET_ROUNDS: usize = 20;

/// Placeholders for the hooks while selecting, before the runtime is loaded.
const PLACEHOLDER: TargetHooks = TargetHooks { enter: 1, unwind_begin: 2, catch: 3, setup: 0, teardown: 0 };

/// How an attach went.
#[derive(Debug)]
pub struct AttachSummary {
    /// Functions patched.
    pub installed: usize,
    /// Functions refused, with reasons.
    pub refused: Vec<Refused>,
    /// Children forked during the window that were restored (their partial results are reported).
    pub children: Vec<u32>,
    /// How long reading the segment and writing the report took.
    pub report_time: Duration,
    /// How long the target's threads were stopped to instrument it.
    pub stop_window: Duration,
    /// Bytes of trampoline arenas unmapped at detach.
    pub released: u64,
    /// Trampoline pages left mapped at detach, and why.
    pub kept: Kept,
    /// The trace, when asked for.
    pub trace: Option<TraceSummary>,
    /// Why the runtime library stays loaded in the target (`None`: unloaded).
    pub runtime_stays: Option<String>,
    /// The report written to the output (so the caller need not read it back).
    pub report: Report,
}

/// A request to end an attach before its duration ends: [`Stop::stop`] from
/// any thread (one that waits for the ending signals, say), and the attach,
/// asleep until the target ends, the duration runs out or this is set,
/// wakes at once.
#[derive(Debug)]
pub struct Stop {
    set: AtomicBool,
    /// An eventfd written by [`Stop::stop`]: what the attach sleeps on.
    wake: OwnedFd,
}

impl Stop {
    /// A request not yet made.
    pub fn new() -> Result<Stop, ProbeError> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| ProbeError::Io { op: "eventfd", path: "(an eventfd)".into(), source: e.into() })?;
        Ok(Stop { set: AtomicBool::new(false), wake })
    }

    /// Ends the attach.
    pub fn stop(&self) {
        self.set.store(true, Ordering::Release);
        // A full counter (never, at one write per request) still wakes the waiter.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
}

/// Sleeps until process `pid` ends, `stop` is set or `until` passes (the
/// kernel wakes the tool: a pidfd for the end, `stop`'s eventfd). Without
/// pidfds (kernels before 5.3) it looks every 20 ms instead. With `drain`
/// (a trace), it wakes every [`DRAIN_INTERVAL`](super::trace::DRAIN_INTERVAL)
/// to call it.
fn sleep_while_running(pid: i32, stop: &Stop, until: Option<Instant>, mut drain: Option<&mut dyn FnMut()>) {
    let pidfd = Pid::from_raw(pid).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
    while !stop.is_set() && !gone(pid) {
        let left = until.map(|t| t.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return;
        }
        let every = match (&drain, &pidfd) {
            (Some(_), _) => Some(super::trace::DRAIN_INTERVAL),
            (None, Some(_)) => None,
            (None, None) => Some(Duration::from_millis(20)),
        };
        let left = match (left, every) {
            (Some(l), Some(e)) => Some(l.min(e)),
            (l, e) => l.or(e),
        };
        let timeout = left.and_then(|l| Timespec::try_from(l).ok());
        let mut fds = vec![PollFd::new(&stop.wake, PollFlags::IN)];
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p, PollFlags::IN));
        }
        // EINTR (a signal to this thread) only means: look again.
        let _ = poll(&mut fds, timeout.as_ref());
        if let Some(d) = drain.as_mut() {
            d();
        }
    }
}

/// Instruments process `pid` until the duration ends or `stop` is set, then
/// writes the report and detaches.
pub fn attach(opts: &AttachOptions, stop: &Stop) -> Result<AttachSummary, ProbeError> {
    // The image first: an execve after this look, even one that ends
    // before the seize, shows as another image once the target is held,
    // and explains any failure it caused (a thread killed under a request,
    // every thread "exiting", a seize refused, a program not loaded yet).
    let seen = Image::of(opts.pid).ok();
    attach_image(opts, stop, seen).map_err(|e| match seen {
        Some(image)
            if !matches!(e, ProbeError::Process(crate::Error::Exec { .. })) && image.replaced(opts.pid) =>
        {
            ProbeError::Process(crate::Error::Exec { pid: opts.pid, during: "the attach" })
        }
        _ => e,
    })
}

fn attach_image(opts: &AttachOptions, stop: &Stop, seen: Option<Image>) -> Result<AttachSummary, ProbeError> {
    // The report converts ticks with it: calibrated while the target runs, not after.
    papirus_substrate::clock::set_up_in_background();
    super::check_counter_events(opts.instrumentation.probe, &opts.instrumentation.events)?;
    super::check_trace(opts.instrumentation.probe, opts.instrumentation.trace.as_ref())?;
    papirus_formats::output::check_writable(&opts.instrumentation.output)?;
    let pid = opts.pid;
    // The modules are read before the target is stopped, so its threads wait
    // only for the patching; read again once it is stopped if its code
    // mappings changed meanwhile (an execve, a dlopen or dlclose).
    let before = code_mappings(pid);
    let early = Inventory::of_process(pid);
    let mut p = Process::attach(pid)?;
    let stopped = Instant::now();
    // What the program runs now: an execve while detached is noticed before anything is written back.
    let image = p.image()?;
    let exec = |during| ProbeError::Process(crate::Error::Exec { pid, during });
    if seen.is_some_and(|s| s != image) {
        return Err(exec("the attach"));
    }
    // An execve just before the first look: the new program is not loaded yet.
    if p.loader_pending()? {
        return Err(exec("the attach (its new program was still being loaded)"));
    }
    let inv = match early {
        Ok(inv) if before.is_some() && code_mappings(pid) == before => inv,
        _ => Inventory::of_process(pid)?,
    };
    // Select before touching anything: a selection that matches nothing loads nothing.
    let Chosen { mut names, mut specs, left_out } =
        select(&inv, &opts.instrumentation.selection, &PLACEHOLDER, None, &mut |a| p.read_u64(a).ok())?;
    // A reference of papirus' own to the runtime, given back at detach
    // (without one, the runtime stays: it was there before papirus came).
    let (library, no_reference) = match runtime_mapping(pid) {
        Some(m) => match p.reference(&m) {
            Ok(l) => (Some(l), None),
            Err(e) => (None, Some(format!("papirus could take no reference to it ({e})"))),
        },
        None => {
            super::results::settle(&mut p)?;
            (Some(p.inject(&opts.instrumentation.runtime)?), None)
        }
    };
    let started = TargetHooks::find(&p).and_then(|hooks| {
        for s in &mut specs {
            s.hook = match s.hook {
                1 => hooks.enter,
                2 => hooks.unwind_begin,
                _ => hooks.catch,
            };
        }
        let (results, tracing) =
            start_session(&mut p, &hooks, &opts.instrumentation, &mut names, &mut specs)?;
        Ok((hooks, results, tracing))
    });
    let (hooks, results, mut tracing) = match started {
        Ok(v) => v,
        Err(e) => {
            // No session: nothing of it can be running.
            if let Some(l) = &library {
                let _ = p.unload(l);
            }
            return Err(e);
        }
    };
    let (outcome, patched) = patch_stopped(&mut p, &specs);
    let (installed, refused, arenas) =
        (outcome.installed, [left_out, outcome.refused].concat(), outcome.arenas);
    if let Err(e) = patched {
        // What was patched may have run meanwhile: undone as at detach (an
        // image that exec'd or ended has nothing of ours left to undo).
        let gone =
            matches!(e, ProbeError::Process(crate::Error::Exec { .. } | crate::Error::TargetExited { .. }));
        if !gone && let Err(undo) = restore(&mut p, installed, &arenas, &results, 0, &hooks, library.as_ref())
        {
            eprintln!("papirus-probe: pid {pid}: restoring after the failure: {undo}");
        }
        return Err(e);
    }
    let count = installed.len();
    // Let it run without us: a detached process needs no tracer to keep going.
    p.detach()?;
    let stop_window = stopped.elapsed();
    super::print_summary(&installed, &refused);
    let seg = results.segment()?;
    let until = opts.duration.map(|d| Instant::now() + d);
    match tracing.as_mut() {
        Some(t) => sleep_while_running(pid, stop, until, Some(&mut || t.drain(&seg))),
        None => sleep_while_running(pid, stop, until, None),
    }
    // Ended meanwhile, or running a new image (execve while detached): its
    // results are still in our mapping of the segment, and nothing of ours is
    // in a new image to restore.
    let attached = match Process::attach(pid) {
        Ok(p) => match p.check_image(&image) {
            Ok(()) => Ok(p),
            Err(e) => {
                eprintln!("papirus-probe: {e}; its new image was left as it is");
                Err("execve during the measurement")
            }
        },
        Err(e) if gone(pid) => {
            eprintln!("papirus-probe: pid {pid} ended during the measurement ({e})");
            Err("ended during the measurement")
        }
        Err(e) => return Err(e.into()),
    };
    let mut p = match attached {
        Ok(p) => p,
        Err(how) => {
            let t0 = Instant::now();
            let end = papirus_substrate::arch::rdtsc();
            let report = report_ended(&results, opts, names, how)?;
            let trace = tracing.map(|t| t.finish(&seg, end, super::trace_footer(&report))).transpose()?;
            return Ok(AttachSummary {
                installed: count,
                refused,
                children: Vec::new(),
                report_time: t0.elapsed(),
                stop_window,
                released: 0,
                kept: Kept::default(),
                trace,
                runtime_stays: None,
                report,
            });
        }
    };
    // Children forked meanwhile share the patched code and the segment: held first, so they fork no more.
    let mut kids = Vec::new();
    for (record, child) in children(&results, pid) {
        match Process::attach(child as i32) {
            Ok(c) => kids.push((record, child, c)),
            Err(e) => eprintln!("papirus-probe: child {child} of pid {pid} not restored: {e}"),
        }
    }
    let mut restored = Vec::new();
    let mut failures = Vec::new();
    for (record, child, mut c) in kids {
        match restore(&mut c, installed.clone(), &arenas, &results, record, &hooks, library.as_ref()) {
            Ok(()) => restored.push(child),
            // A child that exits meanwhile takes its patched code with it
            // (held at its exit stop, it is not a zombie yet).
            Err(ProbeError::Process(crate::Error::TargetExited { .. })) => {}
            Err(_) if gone(child as i32) => {}
            Err(e) => failures.push(format!("child {child}: {e}")),
        }
    }
    let tramps = trampolines(&installed);
    unpatch_stopped(&mut p, installed)?;
    quiet(&mut p, &tramps, &results, 0)?;
    restore_returns(&mut p, &results, 0)?;
    let t0 = Instant::now();
    let end = papirus_substrate::arch::rdtsc();
    let report = results.report(pid, opts.instrumentation.probe, &opts.instrumentation.events, names, &|q| {
        if q == pid as u32 || restored.contains(&q) { "detached".to_string() } else { other_process_state(q) }
    });
    // End the session whatever the report's fate: nothing of it may stay
    // active. The process has not run since `quiet` found no thread inside
    // the runtime, and does not run before the segment is gone.
    let ended = p.call_held(hooks.teardown, &[]);
    // Every patch is restored and every hijacked return put back: the
    // arenas go, and what an earlier detach left where nothing returns now.
    let kept = release_recorded(&mut p, &arenas);
    let runtime = match (&ended, &library) {
        (Ok(_), Some(l)) => unload_runtime(&mut p, l),
        (Ok(_), None) => Ok(no_reference),
        (Err(_), _) => Ok(Some("its session could not be ended".to_string())),
    };
    p.detach()?;
    ended?;
    let (kept, released) = kept?;
    let runtime_stays = runtime?;
    let report = report?;
    write(&opts.instrumentation.output, &report)?;
    let trace = tracing.map(|t| t.finish(&seg, end, super::trace_footer(&report))).transpose()?;
    let report_time = t0.elapsed();
    if !failures.is_empty() {
        return Err(ProbeError::Setup {
            pid,
            reason: format!("forked children not restored: {}", failures.join("; ")),
        });
    }
    Ok(AttachSummary {
        installed: count,
        refused,
        children: restored,
        report_time,
        stop_window,
        released,
        kept,
        trace,
        runtime_stays,
        report,
    })
}

/// Writes the report of a target whose measurement ended on its own side
/// (exit, execve) while papirus was detached, and returns it.
fn report_ended(
    results: &Results,
    opts: &AttachOptions,
    names: Vec<String>,
    how: &str,
) -> Result<Report, ProbeError> {
    let pid = opts.pid;
    let report =
        results.report(pid, opts.instrumentation.probe, &opts.instrumentation.events, names, &|q| {
            if q == pid as u32 { how.to_string() } else { other_process_state(q) }
        })?;
    write(&opts.instrumentation.output, &report)?;
    Ok(report)
}

/// An executable file mapping: start, end, inode, device.
type CodeMapping = (u64, u64, u64, (u32, u32));

/// The executable file mappings of `pid`: where each module's code is.
fn code_mappings(pid: i32) -> Option<Vec<CodeMapping>> {
    let maps = papirus_substrate::maps::read(pid).ok()?;
    Some(
        maps.iter()
            .filter(|m| m.perms.exec && m.inode != 0)
            .map(|m| (m.start, m.end, m.inode, m.dev))
            .collect(),
    )
}

/// Whether process `pid` has ended (gone or a zombie).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Children recorded in the segment (record index, pid) that still run our image.
fn children(results: &Results, pid: i32) -> Vec<(u32, u32)> {
    let Ok(seg) = results.segment() else { return Vec::new() };
    let Ok(procs) = seg.sample() else { return Vec::new() };
    procs
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, p)| p.pid != pid as u32 && maps_segment(p.pid))
        .map(|(i, p)| (i as u32, p.pid))
        .collect()
}

/// Restores a stopped process of the session (a child forked during the
/// window, or the target after a failed patch): its code, its hijacked
/// returns, its session ended and its copy of the arenas unmapped (pages a
/// frame may return into excepted); then lets it go.
fn restore(
    c: &mut Process,
    installed: Vec<crate::patch::Installed>,
    arenas: &[Arena],
    results: &Results,
    record: u32,
    hooks: &TargetHooks,
    library: Option<&crate::process::Library>,
) -> Result<(), ProbeError> {
    let tramps = trampolines(&installed);
    unpatch_stopped(c, installed)?;
    quiet(c, &tramps, results, record)?;
    restore_returns(c, results, record)?;
    c.call_held(hooks.teardown, &[])?;
    let (kept, _) = release_recorded(c, arenas)?;
    if let Some(library) = library
        && let Some(why) = unload_runtime(c, library)?
    {
        eprintln!("papirus-probe: pid {}: the probe runtime stays loaded: {why}", c.pid());
    }
    if !kept.ranges.is_empty() {
        eprintln!(
            "papirus-probe: pid {}: {} bytes of trampolines stay: {}",
            c.pid(),
            kept.bytes(),
            kept.reason
        );
    }
    Ok(())
}

/// Brings the process to a stop where no thread is inside the runtime (see
/// [`leave_runtime`]) and a worker can run the teardown, without letting it
/// run after the last look: choosing the worker may let it run, so the look
/// is taken again after that.
fn quiet(p: &mut Process, tramps: &[(u64, u64)], results: &Results, record: u32) -> Result<(), ProbeError> {
    for _ in 0..QUIET_ROUNDS {
        super::results::settle(p)?;
        if !leave_runtime(p, tramps, results, record)? {
            return Ok(());
        }
    }
    Err(ProbeError::Setup {
        pid: p.pid(),
        reason: "threads kept entering the probe runtime; the session was left running".into(),
    })
}

/// Longest trampoline: saved registers, the hook call, a whole moved short
/// function and the jump back fit well within it.
const TRAMPOLINE_MAX: u64 = 512;

/// The code ranges of the trampolines (a range may reach into the next
/// trampoline: waiting for a thread there too is only cautious).
fn trampolines(installed: &[crate::patch::Installed]) -> Vec<(u64, u64)> {
    installed.iter().map(|i| (i.trampoline, i.trampoline + TRAMPOLINE_MAX)).collect()
}

/// Lets the process run a moment at a time until no thread will resume
/// inside the runtime's code (a hook or the exit stub) or a trampoline —
/// its own PC or the PC saved in any signal frame it is inside (a handler
/// that interrupted a hook) — and none is inside a cold path of the runtime
/// that called into libc (registering a thread's exit handler, a thread's
/// exit, the fork handler: counted in the segment's process record), so
/// none touches the tables after they go. Returns whether it let the
/// process run.
fn leave_runtime(
    p: &mut Process,
    tramps: &[(u64, u64)],
    results: &Results,
    record: u32,
) -> Result<bool, ProbeError> {
    let module = RUNTIME_FILE.trim_end_matches(".so");
    let maps = papirus_substrate::maps::read(p.pid()).map_err(|source| ProbeError::Io {
        op: "read",
        path: format!("/proc/{}/maps", p.pid()).into(),
        source,
    })?;
    let code: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.perms.exec && m.name.rsplit('/').next().is_some_and(|b| b.starts_with(module)))
        .map(|m| (m.start, m.end))
        .chain(tramps.iter().copied())
        .collect();
    let seg = results.segment()?;
    for round in 0..LEAVE_ROUNDS {
        // A thread in a cold path that called into libc has its PC there.
        let mut inside = seg.cold(record) != 0;
        for tid in p.threads() {
            inside |= p.resume_pcs(tid)?.iter().any(|pc| code.iter().any(|&(s, e)| (s..e).contains(pc)));
        }
        if !inside {
            return Ok(round > 0);
        }
        p.run_for(Duration::from_millis(1))?;
    }
    Err(ProbeError::Setup {
        pid: p.pid(),
        reason: "a thread stayed inside the probe runtime; the session was left running".into(),
    })
}

/// Puts back every return address the runtime replaced with its exit stub
/// in the process of record `record` (innermost first, so tail calls
/// sharing a slot resolve).
fn restore_returns(p: &mut Process, results: &Results, record: u32) -> Result<(), ProbeError> {
    let seg = results.segment()?;
    let stub = seg.header(hdr::EXIT_STUB);
    for f in seg.open_frames().into_iter().filter(|f| f.process == record) {
        if p.read_u64(f.slot).ok() == Some(stub) {
            p.write_u64(f.slot, f.ret)?;
        }
    }
    Ok(())
}
