//! Recording: a sampling event opened on a command papirus-profile starts,
//! or on every thread of a running process, drained while the target runs.
//!
//! As `perf record` does, the event is opened once per online CPU with
//! `inherit`, so every thread and child process the target creates later
//! is sampled too, into that CPU's ring; for `-p PID` one event per
//! existing thread and CPU, each CPU's events writing into one ring
//! (`PERF_EVENT_IOC_SET_OUTPUT`). Each sample carries its thread id, so the
//! profile is per thread. The tool polls the rings (woken when one is half
//! full, and every 100 ms) and drains them in place; a ring the tool did
//! not drain in time loses samples, which the kernel reports in LOST
//! records and the recording counts.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use papirus_substrate::attr::{Domain, Kind};
use papirus_substrate::command::{Exit, StoppedCommand};
use papirus_substrate::names;
use papirus_substrate::ring::RingStats;
use papirus_substrate::sample::{SampleType, Sampler, Sampling, SamplingEvents, x86_regs};
use papirus_substrate::{EventAttr, hwinfo, maps, sys};
use rustix::event::{PollFd, PollFlags};

use crate::Error;
use crate::collect::Collector;
use crate::recording::{
    CallGraph, EventInfo, ExitInfo, FORMAT, FORMAT_VERSION, Recording, RingInfo, TargetInfo, TriggerInfo,
};

/// What to profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Start this command (program first) and profile it to its end.
    Command(Vec<OsString>),
    /// Profile this running process (all its threads).
    Pid(i32),
}

/// How to sample. Defaults: task-clock at 4000 Hz (breakpoints and
/// tracepoints: every event), no call chains (8 KiB user stack copies
/// when they are DWARF-unwound), 128 data pages per ring.
#[derive(Clone, Debug)]
pub struct Options {
    /// The event, in perf's syntax, optionally followed by `/PERIOD`.
    pub event: String,
    /// `-F` or `-c`; `None` takes the default above.
    pub trigger: Option<TriggerInfo>,
    /// How to record call chains (`-g`: frame pointers).
    pub call_graph: CallGraph,
    /// Bytes of user stack each sample copies for [`CallGraph::Dwarf`].
    pub stack_bytes: u32,
    /// Data pages of each ring, a power of two (`-m`).
    pub data_pages: usize,
    /// For a running process: how long to record (`None`: until it ends or `stop`).
    pub duration: Option<Duration>,
    /// Set (by a signal handler) to end recording of a running process
    /// early; a started command is profiled to its end.
    pub stop: Arc<AtomicBool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            event: "task-clock".into(),
            trigger: None,
            call_graph: CallGraph::None,
            stack_bytes: DEFAULT_STACK_BYTES,
            data_pages: 128,
            duration: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The default sampling frequency, as perf record's.
pub const DEFAULT_FREQUENCY: u64 = 4000;

/// The default user stack copy for DWARF unwinding, as perf record's.
pub const DEFAULT_STACK_BYTES: u32 = 8192;

/// How often the rings are drained when no wakeup comes.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Splits `EVENT/PERIOD` (`task-clock/1000000`); an event whose own syntax
/// ends in `/` (`msr/tsc/`, `cpu/event=0x3c/`) keeps it.
pub fn split_period(event: &str) -> Result<(&str, Option<u64>), Error> {
    match event.rsplit_once('/') {
        Some((name, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            let period = p.parse::<u64>().ok().filter(|&p| p > 0).ok_or_else(|| {
                Error::Usage(format!("{event}: the period after `/` must be a whole number ≥ 1"))
            })?;
            Ok((name, Some(period)))
        }
        _ => Ok((event, None)),
    }
}

/// One ring and the events that write into it.
struct Ring {
    sampler: Sampler,
    others: Vec<SamplingEvents>,
    hung_up: bool,
}

/// Records `target` as `opts` says and returns the symbolized recording.
pub fn record(target: &Target, opts: &Options) -> Result<Recording, Error> {
    let (name, period) = split_period(&opts.event)?;
    let trigger = match (period, opts.trigger) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage(format!(
                "{}: give the period either after `/` or with -c/-F, not both",
                opts.event
            )));
        }
        (Some(p), None) => Some(TriggerInfo::Period(p)),
        (None, t) => t,
    };
    if name.contains(':') && !name.to_ascii_lowercase().starts_with("mem:") && !name.contains("probe:") {
        // A tracepoint needs tracefs; where mounting is refused, parsing says why.
        let _ = names::ensure_tracefs();
    }
    let mut command = None;
    let mut cmdline = None;
    let pid = match target {
        Target::Command(argv) => {
            let c = StoppedCommand::spawn(argv)?;
            let pid = c.pid();
            command = Some(c);
            pid
        }
        Target::Pid(pid) => {
            if *pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return Err(Error::NoSuchProcess(*pid));
            }
            cmdline = cmdline_at(&format!("/proc/{pid}/cmdline"), CMDLINE_LIMIT);
            *pid
        }
    };
    let mut parser = names::default_parser()?.clone();
    parser.symbols_in(Some(pid));
    let mut attr: EventAttr = parser.parse(name)?;
    attr.inherit(true);
    // As perf record: without a modifier, kernel-mode samples too where
    // the kernel allows them (root, CAP_PERFMON, paranoid ≤ 1).
    let widened = attr.domain_value() == Domain::USER && !names_a_domain(name);
    if widened {
        attr.domain(USER_KERNEL);
    }
    let trigger = trigger.unwrap_or(match attr.kind() {
        Kind::Breakpoint | Kind::Tracepoint => TriggerInfo::Period(1),
        _ => TriggerInfo::Frequency(DEFAULT_FREQUENCY),
    });
    let mut sampling = match trigger {
        TriggerInfo::Frequency(hz) => Sampling::frequency(hz),
        TriggerInfo::Period(p) => Sampling::period(p),
    };
    let mut st = SampleType::IP | SampleType::TID | SampleType::PERIOD;
    let mut collector = Collector::new();
    match opts.call_graph {
        CallGraph::None => {}
        CallGraph::Fp => st |= SampleType::CALLCHAIN,
        CallGraph::Dwarf => {
            // The kernel's walk for kernel frames; user frames from the stack copy.
            st |= SampleType::CALLCHAIN | SampleType::REGS_USER | SampleType::STACK_USER;
            sampling
                .user_regs(1 << x86_regs::IP | 1 << x86_regs::SP | 1 << x86_regs::BP)
                .user_stack(opts.stack_bytes)
                .exclude_callchain_user(true);
            collector.unwind_stacks(true);
        }
    }
    // wakeup_events 0: the kernel wakes the reader when a ring is half full.
    sampling
        .sample_type(st)
        .mmap_records(true)
        .task_records(true)
        .wakeup_events(0)
        .data_pages(opts.data_pages);
    let tids = match target {
        Target::Command(_) => vec![pid],
        Target::Pid(_) => threads_of(pid)?,
    };
    for &tid in &tids {
        collector.thread(pid as u32, tid as u32, &comm_of(pid, tid));
    }
    let cpus = hwinfo::online_cpus();
    if cpus.is_empty() {
        return Err(Error::Usage("no online CPU listed in /sys/devices/system/cpu/online".into()));
    }
    let mut notes = Vec::new();
    let mut rings = match open_rings(&attr, &sampling, tids[0], &cpus) {
        Err(papirus_substrate::Error::Permission { paranoid, .. }) if widened => {
            attr.domain(Domain::USER);
            notes.push(format!(
                "kernel.perf_event_paranoid={paranoid}: user-mode samples only (kernel-mode samples need root, \
                 CAP_PERFMON or paranoid ≤ 1)"
            ));
            open_rings(&attr, &sampling, tids[0], &cpus)?
        }
        r => r?,
    };
    let mut opened: Vec<i32> = vec![tids[0]];
    if let Target::Pid(_) = target {
        // Threads created while the events open are found by listing again.
        for _ in 0..16 {
            let new: Vec<i32> = threads_of(pid)?.into_iter().filter(|t| !opened.contains(t)).collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                for (ring, &cpu) in rings.iter_mut().zip(&cpus) {
                    match SamplingEvents::open(sys::kernel(), &attr, &sampling, &[], tid, cpu as i32) {
                        Ok(ev) => {
                            ev.output_to(ring.sampler.events())?;
                            ring.others.push(ev);
                        }
                        // A thread that ended meanwhile.
                        Err(papirus_substrate::Error::NoSuchProcess { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                collector.thread(pid as u32, tid as u32, &comm_of(pid, tid));
                opened.push(tid);
            }
        }
    }
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid).ok_or(Error::NoSuchProcess(pid))?,
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| Error::Io { what: format!("pidfd_open({pid})"), source: e.into() })?;
    for r in &rings {
        r.sampler.events().enable()?;
        for o in &r.others {
            o.enable()?;
        }
    }
    // Read once the events are on: a mapping made meanwhile has its MMAP2
    // record (disabled events get none), at worst twice.
    let mappings = maps::read(pid).map_err(|e| Error::Io { what: format!("/proc/{pid}/maps"), source: e })?;
    collector.process_maps(pid as u32, &mappings);
    let start_unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let t0 = Instant::now();
    if let Some(c) = &mut command {
        c.resume().map_err(|e| Error::Io { what: "resuming the command".into(), source: e })?;
    }
    let deadline = match target {
        Target::Pid(_) => opts.duration.map(|d| t0 + d),
        Target::Command(_) => None,
    };
    let mut parse_errors = 0;
    loop {
        let ended = wait_for_work(&mut rings, &pidfd, deadline)?;
        for r in &mut rings {
            drain(&mut r.sampler, &mut collector, &mut parse_errors);
        }
        let stopped = matches!(target, Target::Pid(_)) && opts.stop.load(Ordering::Relaxed);
        if ended || stopped || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    for r in &rings {
        r.sampler.events().disable()?;
        for o in &r.others {
            o.disable()?;
        }
    }
    let duration_ns = t0.elapsed().as_nanos() as u64;
    for r in &mut rings {
        drain(&mut r.sampler, &mut collector, &mut parse_errors);
    }
    let exit = match &mut command {
        Some(c) => {
            let e = c.wait().map_err(|e| Error::Io { what: "waiting for the command".into(), source: e })?;
            let signal = match e {
                Exit::Signal(s) => Some(s),
                Exit::Code(_) => None,
            };
            Some(ExitInfo { code: e.code(), signal })
        }
        None => None,
    };
    let stats = rings.iter().fold(RingStats::default(), |a, r| {
        let s = r.sampler.stats();
        RingStats {
            samples: a.samples + s.samples,
            lost: a.lost + s.lost,
            lost_records: a.lost_records + s.lost_records,
            throttles: a.throttles + s.throttles,
            ..a
        }
    });
    let rings_info = RingInfo {
        rings: rings.len() as u32,
        data_pages: opts.data_pages as u64,
        samples: stats.samples,
        lost: stats.lost,
        lost_records: stats.lost_records,
        throttles: stats.throttles,
        parse_errors,
    };
    drop(rings);
    let unit = match attr.kind() {
        Kind::Software if matches!(name, "task-clock" | "cpu-clock") => "ns",
        _ => "events",
    };
    let s = collector.finish();
    Ok(Recording {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        target: TargetInfo {
            command: match target {
                Target::Command(argv) => {
                    Some(argv.iter().map(|a| a.to_string_lossy().into_owned()).collect())
                }
                Target::Pid(_) => None,
            },
            cmdline,
            pid,
        },
        event: EventInfo {
            name: name.into(),
            trigger,
            unit: unit.into(),
            call_graph: opts.call_graph,
            domain: Some(domain_text(attr.domain_value())),
        },
        notes,
        start_unix_ns,
        duration_ns,
        exit,
        rings: rings_info,
        unreadable_modules: s.unreadable,
        threads: s.threads,
        frames: s.frames,
        stacks: s.stacks,
        samples: s.samples,
    })
}

/// perf's default domain for a sampling event: user and kernel mode.
const USER_KERNEL: Domain = Domain { user: true, kernel: true, hypervisor: false };

/// Whether `event` ends in perf's privilege modifiers (`:u`, `:uk`,
/// `cpu/event=0x3c/u`), so its domain is the user's choice.
fn names_a_domain(event: &str) -> bool {
    let last = event.rsplit([':', '/']).next().unwrap_or("");
    !last.is_empty() && last.chars().all(|c| "ukh".contains(c))
}

/// Names a domain as the report shows it.
fn domain_text(d: Domain) -> String {
    let modes: Vec<&str> = [(d.user, "user"), (d.kernel, "kernel"), (d.hypervisor, "hypervisor")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    modes.join("+")
}

/// One sampler, and so one ring, per CPU for thread `tid` (inherited by
/// what it creates).
fn open_rings(
    attr: &EventAttr,
    sampling: &Sampling,
    tid: i32,
    cpus: &[u32],
) -> Result<Vec<Ring>, papirus_substrate::Error> {
    cpus.iter()
        .map(|&cpu| {
            let sampler = Sampler::open(attr, sampling, tid, cpu as i32)?;
            Ok(Ring { sampler, others: Vec::new(), hung_up: false })
        })
        .collect()
}

/// Waits until a ring wakes the tool, the target ends, the poll interval
/// passes, or the deadline; returns whether the target ended.
fn wait_for_work(rings: &mut [Ring], pidfd: &impl AsFd, deadline: Option<Instant>) -> Result<bool, Error> {
    let mut wait = POLL_INTERVAL;
    if let Some(d) = deadline {
        wait = wait.min(d.saturating_duration_since(Instant::now()));
    }
    let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(rings.len() + 1);
    fds.push(PollFd::new(pidfd, PollFlags::IN));
    let live: Vec<usize> = (0..rings.len()).filter(|&i| !rings[i].hung_up).collect();
    for &i in &live {
        fds.push(PollFd::from_borrowed_fd(rings[i].sampler.events().fd(), PollFlags::IN));
    }
    let timeout = rustix::event::Timespec::try_from(wait).unwrap_or_default();
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(Error::Io { what: "poll".into(), source: e.into() }),
    }
    let ended = !fds[0].revents().is_empty();
    let hung: Vec<usize> = live
        .iter()
        .zip(&fds[1..])
        .filter(|(_, f)| f.revents().contains(PollFlags::HUP))
        .map(|(&i, _)| i)
        .collect();
    drop(fds);
    // A ring whose event hung up (its thread ended) is still drained, not polled.
    for i in hung {
        rings[i].hung_up = true;
    }
    Ok(ended)
}

fn drain(sampler: &mut Sampler, collector: &mut Collector, parse_errors: &mut u64) {
    sampler.ring().drain(|r| match r {
        Ok(rec) => collector.record(&rec),
        Err(_) => *parse_errors += 1,
    });
}

fn threads_of(pid: i32) -> Result<Vec<i32>, Error> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| Error::NoSuchProcess(pid))?;
    let mut tids: Vec<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    // The process' own thread first: its events own the rings.
    if let Some(i) = tids.iter().position(|&t| t == pid) {
        tids.swap(0, i);
    }
    if tids.is_empty() {
        return Err(Error::NoSuchProcess(pid));
    }
    Ok(tids)
}

/// Bytes of a running process's command line kept for the report header.
const CMDLINE_LIMIT: usize = 4096;

/// The arguments in a `/proc/PID/cmdline` file, at most `limit` bytes of it
/// read (a longer line is cut, `…` marking the cut); `None` when it cannot
/// be read or is empty (a kernel thread, a process that ended).
fn cmdline_at(path: &str, limit: usize) -> Option<Vec<String>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(limit as u64 + 1).read_to_end(&mut bytes).ok()?;
    let cut = bytes.len() > limit;
    bytes.truncate(limit);
    if bytes.last() == Some(&0) {
        bytes.pop();
    }
    if bytes.is_empty() {
        return None;
    }
    let mut args: Vec<String> =
        bytes.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if cut && let Some(last) = args.last_mut() {
        last.push('…');
    }
    Some(args)
}

fn comm_of(pid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_command_line_is_read_bounded() {
        let own = cmdline_at(&format!("/proc/{}/cmdline", std::process::id()), CMDLINE_LIMIT).unwrap();
        assert_eq!(own, std::env::args().collect::<Vec<_>>());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cmdline");
        let long = format!("python3\0-c\0{}\0", "x".repeat(10_000));
        std::fs::write(&path, &long).unwrap();
        let args = cmdline_at(path.to_str().unwrap(), 100).unwrap();
        assert_eq!(args, ["python3".to_string(), "-c".into(), format!("{}…", "x".repeat(100 - 11))]);
        std::fs::write(&path, "").unwrap();
        assert_eq!(cmdline_at(path.to_str().unwrap(), 100), None);
        assert_eq!(cmdline_at("/proc/0/cmdline", 100), None);
    }

    #[test]
    fn periods_split_off_only_where_they_are_numbers() {
        assert_eq!(split_period("task-clock/1000").unwrap(), ("task-clock", Some(1000)));
        assert_eq!(split_period("msr/tsc/").unwrap(), ("msr/tsc/", None));
        assert_eq!(split_period("cpu/event=0x3c/").unwrap(), ("cpu/event=0x3c/", None));
        assert_eq!(split_period("mem:main:x").unwrap(), ("mem:main:x", None));
        assert!(split_period("task-clock/0").is_err());
    }

    #[test]
    fn only_modifiers_name_a_domain() {
        for e in ["task-clock:u", "cycles:uk", "cpu/event=0x3c/u", "page-faults:k"] {
            assert!(names_a_domain(e), "{e}");
        }
        for e in ["task-clock", "msr/tsc/", "mem:main:x", "syscalls:sys_enter_write", "cpu/event=0x3c/"] {
            assert!(!names_a_domain(e), "{e}");
        }
        assert_eq!(domain_text(USER_KERNEL), "user+kernel");
        assert_eq!(domain_text(Domain::USER), "user");
    }
}
