//! Creating, describing and removing the results segment ([`papirus_probe_abi::layout`]).
//!
//! # Safety
//!
//! The segment is a fresh `MAP_SHARED` mapping of a memfd this module sized
//! and sealed against shrinking, so every word of [`Geometry::total_words`]
//! stays backed while mapped; it is published in [`state::BASE`] only after
//! its header is written, and unmapped only by [`teardown`].
#![allow(unsafe_code)]

use std::sync::Once;
use std::sync::atomic::Ordering;
use std::time::Instant;

use papirus_probe_abi::layout::{self, Geometry, hdr, proc};
use papirus_probe_abi::segment::{Segment, flatten};
use papirus_probe_abi::{ACTIVE_BASE, Probe, Report, Session, SetupCode, Window};

use crate::state::{self, EPOCH, Seg, Word};
use crate::{counters, sys};

/// Tool pid of the active session.
static OWNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// When the active session began (in-process snapshots measure the TSC rate against it).
static STARTED: std::sync::Mutex<Option<(Instant, u64)>> = std::sync::Mutex::new(None);

/// Creates the results segment for `s` and starts the session; returns the
/// memfd (the tool takes a copy and closes this one).
pub fn setup(s: &Session) -> Result<i32, i64> {
    if state::BASE.load(Ordering::Acquire) != 0 {
        return Err(-(ACTIVE_BASE + OWNER.load(Ordering::Relaxed) as i64));
    }
    let g = s.shape(state::DEPTH).and_then(Geometry::new).ok_or(SetupCode::Geometry as i64)?;
    if s.probe == Probe::Counters && crate::set_counters(&s.counters).is_err() {
        return Err(SetupCode::Events as i64);
    }
    let bytes = g.total_words as usize * 8;
    let (fd, base) = map_new(bytes).ok_or(SetupCode::Memory as i64)?;
    let seg_words = |i: usize, v: u64| {
        // SAFETY: `i` is a header word of the fresh mapping.
        unsafe { ((base + i * 8) as *mut u64).write(v) }
    };
    let trace = s.trace.as_ref();
    let (trace_min, trace_depth, trace_funcs) =
        trace.map_or((0, 0, 0), |t| (t.min_ticks, t.depth, t.functions));
    for (i, v) in g.shape.header().into_iter().chain([
        (hdr::MAGIC, layout::MAGIC),
        (hdr::VERSION, layout::VERSION),
        (hdr::TRACE_MIN_TICKS, trace_min),
        (hdr::TRACE_DEPTH, trace_depth),
        (hdr::TRACE_FUNCS, trace_funcs),
        (hdr::TOTAL_WORDS, g.total_words),
        (hdr::START_TSC, sys::rdtsc()),
        (hdr::NEXT_PROC, 1),
        (hdr::PROBE, probe_word(s.probe)),
        (
            hdr::NEVENTS,
            counters::NEVENTS.load(Ordering::Acquire) as u64 * u64::from(s.probe == Probe::Counters),
        ),
        (hdr::EXIT_STUB, crate::hooks::exit_stub()),
    ]) {
        seg_words(i, v);
    }
    let rec = layout::HEADER_WORDS as usize;
    seg_words(rec + proc::PID, u64::from(std::process::id()));
    seg_words(rec + proc::PARENT, u64::from(std::os::unix::process::parent_id()));
    seg_words(rec + g.proc_nodes() as usize + layout::node::LINK, layout::ROOT_LINK);
    seg_words(rec + proc::NODES_USED, 1);
    seg_words(rec + proc::STATE, 1);
    *STARTED.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), sys::rdtsc()));
    OWNER.store(u64::from(s.tool_pid), Ordering::Relaxed);
    state::PROCESS.store(0, Ordering::Relaxed);
    state::FLAT.set(&g, trace_min, trace_depth, trace_funcs);
    state::PER_THREAD.store(s.per_thread, Ordering::Relaxed);
    state::create_exit_key();
    state::BASE.store(base, Ordering::Release);
    EPOCH.fetch_add(1, Ordering::AcqRel);
    crate::set_probe(s.probe);
    static ATFORK: Once = Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registers plain functions of this library; glibc drops them
        // when the library is unloaded (the registration names this library).
        unsafe {
            libc::pthread_atfork(
                Some(state::before_fork),
                Some(state::after_fork_parent),
                Some(state::after_fork_child),
            )
        };
    });
    Ok(fd)
}

/// A sealed memfd of `bytes` mapped shared: (fd, address).
fn map_new(bytes: usize) -> Option<(i32, usize)> {
    // SAFETY: plain system calls on a name literal and a fd this function owns.
    unsafe {
        let fd = libc::memfd_create(
            c"papirus-probe-results".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if fd < 0 {
            return None;
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        let p = if libc::ftruncate(fd, bytes as libc::off_t) == 0
            && libc::fcntl(fd, libc::F_ADD_SEALS, seals) == 0
        {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        if p == libc::MAP_FAILED {
            libc::close(fd);
            return None;
        }
        Some((fd, p as usize))
    }
}

/// Closes a segment fd of this process.
pub(crate) fn close(fd: i32) {
    // SAFETY: closes a fd `setup` returned to this process.
    unsafe { libc::close(fd) };
}

/// Ends the session: no thread measures anything from now on and the
/// segment is unmapped. The tool calls it while every thread is stopped
/// outside the runtime, after putting every hijacked return address back.
pub fn teardown() -> i64 {
    let Some(seg) = Seg::current() else { return 0 };
    state::BASE.store(0, Ordering::Release);
    EPOCH.fetch_add(1, Ordering::AcqRel);
    state::delete_exit_key();
    OWNER.store(0, Ordering::Relaxed);
    // SAFETY: the session's own mapping, no longer reachable (BASE is 0, every TLS epoch stale).
    unsafe { libc::munmap(seg.words().as_ptr() as *mut libc::c_void, seg.g.total_words as usize * 8) };
    0
}

fn probe_word(p: Probe) -> u64 {
    match p {
        Probe::Empty => 0,
        Probe::Wallclock => 1,
        Probe::Counters => 2,
    }
}

/// Records the probe in the header (in-process benches switch probes).
pub(crate) fn set_probe_word(p: Probe) {
    if let Some(seg) = Seg::current() {
        seg.word(hdr::PROBE as u64).set(probe_word(p));
    }
}

/// Records the number of counter events in the header.
pub(crate) fn set_nevents_word(n: u64) {
    if let Some(seg) = Seg::current() {
        seg.word(hdr::NEVENTS as u64).set(n);
    }
}

/// Shortest interval the TSC rate is measured over.
const RATE_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

/// This process' report from its own segment.
pub(crate) fn snapshot(functions: Vec<String>) -> Report {
    let timed = crate::hooks::TIMED.load(Ordering::Relaxed);
    let started = *STARTED.lock().unwrap_or_else(|e| e.into_inner());
    // The TSC rate the counters were set up with; else the rate measured
    // over this session against CLOCK_MONOTONIC.
    let hz = counters::SETUP.get().and_then(|c| c.tsc).map(|r| r.hz);
    let ticks_per_second = match (timed, hz, started) {
        (false, ..) => 0.0,
        (true, Some(hz), _) => hz,
        (true, None, Some((t0, c0))) => {
            while t0.elapsed() < RATE_WINDOW {
                std::hint::spin_loop();
            }
            let (c1, dt) = (sys::rdtsc(), t0.elapsed());
            c1.saturating_sub(c0) as f64 / dt.as_secs_f64()
        }
        (true, None, None) => 0.0,
    };
    let events: Vec<String> = match (crate::hooks::COUNTERS.load(Ordering::Relaxed), counters::SETUP.get()) {
        (true, Some(setup)) => setup.events.iter().map(|a| a.name().to_string()).collect(),
        _ => Vec::new(),
    };
    let probe = if !events.is_empty() {
        Probe::Counters
    } else if timed {
        Probe::Wallclock
    } else {
        Probe::Empty
    };
    let (threads, processes, unmeasured) = match Seg::current() {
        Some(seg) => match Segment::new(seg.words()).and_then(|s| s.sample()) {
            Ok(procs) => {
                let (t, p) = flatten(procs);
                (t, p, seg.word(hdr::SLOT_MISSES as u64).get())
            }
            Err(_) => (Vec::new(), Vec::new(), 0),
        },
        None => (Vec::new(), Vec::new(), 0),
    };
    Report {
        format_version: papirus_probe_abi::FORMAT_VERSION,
        probe: probe.name().to_string(),
        pid: std::process::id(),
        ticks_per_second,
        events,
        functions,
        threads,
        window: Window {
            duration_ns: started.map_or(0, |(t0, _)| t0.elapsed().as_nanos() as u64),
            ..Window::default()
        },
        processes,
        unmeasured_threads: unmeasured,
    }
}
