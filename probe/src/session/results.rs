//! The tool's side of the results segment: start a session in the stopped
//! target, take its memfd, map it read-only, and turn it into reports.
//!
//! The segment is untrusted input (the target can write anything into it):
//! the fd must be a memfd sealed against shrinking and growing, of a size
//! that holds its own header's geometry, and it is read only through
//! [`papirus_probe_abi::segment::Segment`], which bounds-checks everything.
//!
//! # Safety
//!
//! The mapping is `PROT_READ`, `MAP_SHARED`, of a memfd sealed with
//! `F_SEAL_SHRINK`: its pages stay backed for as long as it is mapped, so
//! viewing it as `&[AtomicU64]` never faults; other processes write it
//! concurrently, which atomics allow.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::sys::mman::ProtFlags;
use papirus_probe_abi::layout::{self, hdr};
use papirus_probe_abi::segment::{Segment, flatten};
use papirus_probe_abi::{
    CounterSetup, Probe, Report, SESSION_VERSION, Session, SetupCode, TraceOptions, Window,
};
use papirus_substrate::EventAttr;
use rustix::fs::{SealFlags, fcntl_get_seals};
use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};

use super::{ProbeError, TargetHooks};
use crate::process::Process;

/// Thread tables of a session: threads alive at once that can be measured.
pub(super) const SLOTS: u64 = 512;
/// Process records: the target and up to this many minus one forked children.
pub(super) const PROCESSES: u64 = 64;

/// Rounds of letting the target run while its worker thread is inside a
/// process-creating system call.
const SETTLE_ROUNDS: usize = 200;

/// Chooses a worker thread that is not stopped inside `clone`, `clone3`,
/// `fork` or `vfork` (code run there would change the outcome of the system
/// call it was making; a new thread's side, which returns 0, is done),
/// letting the process run a moment at a time until one is.
pub(super) fn settle(p: &mut Process) -> Result<(), ProbeError> {
    const CREATING: [u64; 4] = [56, 57, 58, 435];
    for _ in 0..SETTLE_ROUNDS {
        for tid in p.threads() {
            // A new thread's side of clone (rax 0) has finished its system call.
            let ok = p.regs(tid).is_ok_and(|r| !CREATING.contains(&r.orig_rax) || r.rax == 0);
            if ok && p.set_worker(tid).is_ok() {
                return Ok(());
            }
        }
        p.run_for(std::time::Duration::from_millis(1))?;
    }
    Err(ProbeError::Setup {
        pid: p.pid(),
        reason: "every thread stayed inside a process-creating system call".into(),
    })
}

/// What a session records, as the tool asks the runtime for it.
#[derive(Debug, Clone)]
pub(super) struct SessionSpec<'a> {
    /// The probe.
    pub probe: Probe,
    /// Its counter events.
    pub events: &'a [EventAttr],
    /// Functions instrumented.
    pub functions: usize,
    /// Keep ended threads apart.
    pub per_thread: bool,
    /// Tree nodes per thread (0: the default).
    pub nodes: u64,
    /// Tracing, when on.
    pub trace: Option<TraceOptions>,
}

/// TSC ticks per second: papirus-substrate's rate, else measured now over
/// [`RATE_WINDOW`] against CLOCK_MONOTONIC.
pub(super) fn tsc_rate() -> f64 {
    if let Some(hz) = papirus_substrate::clock::clock().tsc_hz() {
        return hz;
    }
    let (t0, c0) = (Instant::now(), papirus_substrate::arch::rdtsc());
    std::thread::sleep(RATE_WINDOW);
    papirus_substrate::arch::rdtsc().saturating_sub(c0) as f64 / t0.elapsed().as_secs_f64()
}

/// How long [`tsc_rate`] measures when the substrate has no rate.
const RATE_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

/// The tool's read-only mapping of a target's results segment.
#[derive(Debug)]
pub(super) struct Results {
    /// The target whose segment this is (for errors).
    pid: i32,
    addr: usize,
    words: usize,
    started: (Instant, SystemTime, u64),
}

impl Drop for Results {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `words * 8` bytes, not used after this.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.words * 8) };
    }
}

fn sys_err(op: &'static str, pid: i32) -> ProbeError {
    ProbeError::Io { op, path: format!("/proc/{pid}").into(), source: std::io::Error::last_os_error() }
}

impl Results {
    /// Starts a session in the stopped target and maps its segment.
    pub(super) fn start(
        p: &mut Process,
        hooks: &TargetHooks,
        spec: &SessionSpec<'_>,
    ) -> Result<Results, ProbeError> {
        let pid = p.pid();
        let session = Session {
            version: SESSION_VERSION,
            probe: spec.probe,
            functions: spec.functions as u64,
            // The TSC rate only for the counters probe: other probes need not
            // wait for a calibration before the target starts.
            counters: CounterSetup {
                events: spec.events.to_vec(),
                tsc: (spec.probe == Probe::Counters)
                    .then(|| papirus_substrate::clock::clock().tsc_rate())
                    .flatten(),
            },
            slots: SLOTS,
            processes: PROCESSES,
            tool_pid: std::process::id(),
            per_thread: spec.per_thread,
            nodes: spec.nodes,
            trace: spec.trace.clone(),
        };
        let blob = session.to_bytes();
        let started = (Instant::now(), SystemTime::now(), papirus_substrate::arch::rdtsc());
        settle(p)?;
        let page = p.mmap_anywhere(blob.len() as u64, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        let r = p.write_memory(page, &blob).and_then(|()| p.call(hooks.setup, &[page, blob.len() as u64]));
        let unmapped = p.munmap(page, blob.len() as u64);
        let r = r? as i64;
        unmapped?;
        if let Some(owner) = SetupCode::active_owner(r) {
            return Err(ProbeError::Busy { pid, owner });
        }
        if r < 0 {
            let why = SetupCode::from_return(r).map_or("unknown failure", SetupCode::describe);
            return Err(ProbeError::Setup { pid, reason: why.to_string() });
        }
        let fd = r as i32;
        let mapped = Self::map(pid, fd);
        // The target keeps only its mapping, whatever happened here.
        let closed = p.syscall(libc::SYS_close, &[fd as u64]);
        let mut results = mapped?;
        closed?;
        results.started = started;
        let seg = results.segment()?;
        // The geometry asked for, not one the target chose: it bounds every copy the tool makes.
        let g = seg.geometry();
        if session.shape(g.shape.depth) != Some(g.shape) {
            return Err(ProbeError::BadSegment { pid, reason: "its geometry is not the session's".into() });
        }
        Ok(results)
    }

    /// Takes the target's fd, checks it and maps it read-only.
    fn map(pid: i32, target_fd: i32) -> Result<Results, ProbeError> {
        let io = |op| {
            move |e: rustix::io::Errno| ProbeError::Io {
                op,
                path: format!("/proc/{pid}").into(),
                source: e.into(),
            }
        };
        let target = Pid::from_raw(pid).ok_or_else(|| io("pidfd_open")(rustix::io::Errno::SRCH))?;
        let pidfd = pidfd_open(target, PidfdFlags::empty()).map_err(io("pidfd_open"))?;
        let fd = pidfd_getfd(&pidfd, target_fd, PidfdGetfdFlags::empty()).map_err(io("pidfd_getfd"))?;
        let bad = |what: String| ProbeError::BadSegment { pid, reason: what };
        let sealed = fcntl_get_seals(&fd).is_ok_and(|s| s.contains(SealFlags::SHRINK | SealFlags::GROW));
        if !sealed {
            return Err(bad("its fd is not a memfd sealed against resizing".into()));
        }
        let len = std::fs::File::from(fd.try_clone().map_err(|e| bad(e.to_string()))?)
            .metadata()
            .map_err(|e| bad(e.to_string()))?
            .len();
        if len < layout::HEADER_WORDS * 8 || len % 8 != 0 || len > layout::MAX_TOTAL_WORDS * 8 {
            return Err(bad(format!("its size {len} is not a segment's")));
        }
        // SAFETY: a read-only shared mapping of a sealed memfd of `len` bytes.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(sys_err("mmap the results segment of", pid));
        }
        let r = Results {
            pid,
            addr: addr as usize,
            words: (len / 8) as usize,
            started: (Instant::now(), SystemTime::now(), 0),
        };
        r.segment()?;
        Ok(r)
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: see the module docs; the mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.addr as *const AtomicU64, self.words) }
    }

    /// A checked view.
    pub(super) fn segment(&self) -> Result<Segment<'_>, ProbeError> {
        Segment::new(self.words())
            .map_err(|e| ProbeError::BadSegment { pid: self.pid, reason: e.to_string() })
    }

    /// The report of everything measured so far. `ended` says how each
    /// process' measurement ended (by pid; the target is the first).
    pub(super) fn report(
        &self,
        pid: i32,
        probe: Probe,
        events: &[EventAttr],
        functions: Vec<String>,
        ended: &dyn Fn(u32) -> String,
    ) -> Result<Report, ProbeError> {
        let seg = self.segment()?;
        let procs = seg.sample().map_err(|e| ProbeError::BadSegment { pid, reason: e.to_string() })?;
        let (threads, mut processes) = flatten(procs);
        for p in &mut processes {
            p.ended = ended(p.pid);
        }
        let (t0, wall0, tsc0) = self.started;
        let duration = t0.elapsed();
        let ticks_per_second = match (probe, papirus_substrate::clock::clock().tsc_hz()) {
            (Probe::Empty, _) => 0.0,
            (_, Some(hz)) => hz,
            // The rate over this run, TSC against CLOCK_MONOTONIC.
            (_, None) => {
                papirus_substrate::arch::rdtsc().saturating_sub(tsc0) as f64
                    / duration.as_secs_f64().max(1e-9)
            }
        };
        let ns = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Ok(Report {
            format_version: papirus_probe_abi::FORMAT_VERSION,
            probe: probe.name().to_string(),
            pid: pid as u32,
            ticks_per_second,
            events: if probe == Probe::Counters {
                events.iter().map(|a| a.name().to_string()).collect()
            } else {
                Vec::new()
            },
            functions,
            threads,
            window: Window {
                start_unix_ns: ns(wall0),
                end_unix_ns: ns(wall0 + duration),
                duration_ns: duration.as_nanos() as u64,
            },
            processes,
            unmeasured_threads: seg.header(hdr::SLOT_MISSES),
        })
    }
}

/// The memfd's name as /proc/PID/maps shows it.
const SEGMENT_NAME: &str = "memfd:papirus-probe-results";

/// Whether process `pid` maps a results segment (it has neither exec'd nor ended).
pub(super) fn maps_segment(pid: u32) -> bool {
    papirus_substrate::maps::read(pid as i32).is_ok_and(|m| m.iter().any(|m| m.name.contains(SEGMENT_NAME)))
}

/// How a process other than the one we wait for ended: it is not our child,
/// so only whether it still runs is known.
pub(super) fn other_process_state(pid: u32) -> String {
    if std::path::Path::new(&format!("/proc/{pid}")).exists() { "running" } else { "ended" }.to_string()
}

/// Writes `report` to `path` atomically.
pub(super) fn write(path: &std::path::Path, report: &Report) -> Result<(), ProbeError> {
    let text = serde_json::to_vec_pretty(report).map_err(|e| ProbeError::Events(e.to_string()))?;
    papirus_formats::output::write_atomic(path, &text)?;
    Ok(())
}
