//! papirus' own rows: baselines, clocks, counter reads, event-set
//! operations and Paradyn's primitives.

use std::cell::Cell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use papirus_highlevel::{Counter as PCounter, Predicate, ProcessTime, TimeSource, Timer, Wall};
use papirus_substrate::clock::{Source, clock};
use papirus_substrate::fastread::{self, ReadMethod, ReadPath};
use papirus_substrate::vclock;
use papirus_substrate::{Count, EventAttr, Group, GroupCounts, Target, arch, parse_event, sys};

use crate::rows::{Bench, Registry, RowResult};

/// The software events the counter-read rows use, in set order (1 to 4).
pub static SOFTWARE_EVENTS: [&str; 4] = ["task-clock", "page-faults", "context-switches", "cpu-migrations"];

/// Registers every built-in row on `r`.
pub fn register(r: &mut Registry) {
    baselines(r);
    clocks(r);
    counters(r);
    eventset(r);
    regions(r);
    paradyn(r);
}

#[inline(never)]
fn not_inlined(x: u64) -> u64 {
    x.wrapping_add(1)
}

fn baselines(r: &mut Registry) {
    r.add_timed(
        "baseline.loop",
        "an empty loop iteration: the floor every batched row includes",
        None,
        || {
            black_box(());
        },
    );
    r.add_timed("baseline.call", "a call to a non-inlined function (call + ret)", None, || {
        black_box(not_inlined(black_box(1)));
    });
    r.add_timed("baseline.rdtsc", "raw rdtsc, unordered, back to back", Some("rdtsc"), || {
        black_box(arch::rdtsc());
    });
    r.add_timed("baseline.rdtsc_ordered", "lfence; rdtsc back to back", Some("lfence+rdtsc"), || {
        black_box(arch::rdtsc_ordered());
    });
    r.add_timed(
        "baseline.clock_gettime_monotonic",
        "clock_gettime(CLOCK_MONOTONIC) through libc",
        Some("vdso"),
        || {
            black_box(sys::clock_gettime(libc::CLOCK_MONOTONIC).ok());
        },
    );
    r.add_timed(
        "baseline.clock_gettime_thread_cputime",
        "clock_gettime(CLOCK_THREAD_CPUTIME_ID): the syscall PAPI's virtual time makes",
        Some("syscall"),
        || {
            black_box(sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).ok());
        },
    );
    r.add_timed("baseline.null_syscall", "getppid(): the floor of any kernel entry", Some("syscall"), || {
        black_box(std::os::unix::process::parent_id());
    });
    r.add("baseline.perf_read", "read() of one task-clock perf fd (value, enabled, running)", |b| {
        let c = open_counter("task-clock")?;
        c.enable().map_err(|e| e.to_string())?;
        Ok(vec![b.time(Some("read()"), || {
            black_box(c.read().ok());
        })])
    });
}

fn real_path() -> String {
    match clock().info().source {
        Source::Tsc => "rdtsc".into(),
        Source::Monotonic { reason } => format!("clock_gettime(CLOCK_MONOTONIC): {reason}"),
    }
}

fn virt_path(m: &ReadMethod, syncs: Option<(u64, u64)>) -> String {
    let per = |what: &str| match syncs {
        Some((s, n)) if n > 0 => {
            format!(
                "{what}; {s} of {n} reads resynced by clock_gettime ({:.3} %)",
                100.0 * s as f64 / n as f64
            )
        }
        _ => what.to_string(),
    };
    match m {
        ReadMethod::PageTime => per("user-space (cap_user_time page)"),
        ReadMethod::ReadPlusTsc => {
            per("user-space (the last syscall plus the TSC while the task-clock page's lock holds)")
        }
        ReadMethod::Syscall { reason } => format!("syscall clock_gettime(CLOCK_THREAD_CPUTIME_ID): {reason}"),
        ReadMethod::Rdpmc => per("rdpmc"),
    }
}

fn clocks(r: &mut Registry) {
    let path = real_path();
    r.add_timed(
        "real.cycles",
        "real time in TSC cycles, back-to-back reads (papirus_lowlevel::real_cyc, PAPI_get_real_cyc)",
        Some(&path),
        || {
            black_box(papirus_lowlevel::real_cyc());
        },
    );
    r.add_timed(
        "real.ns",
        "real time in ns, back-to-back reads (papirus_lowlevel::real_nsec, PAPI_get_real_nsec)",
        Some(&path),
        || {
            black_box(papirus_lowlevel::real_nsec());
        },
    );
    r.add("virtual.ns", "virtual (thread CPU) time in ns, back-to-back reads (a vclock::ThreadClock, as papirus_lowlevel::virt_nsec uses)", |b| {
        let tc = vclock::ThreadClock::new();
        let n = Cell::new(0u64);
        let s0 = tc.syncs();
        let mut cost = b.time(None, || {
            n.set(n.get() + 1);
            black_box(tc.now());
        });
        cost.path = Some(virt_path(&tc.method(), Some((tc.syncs() - s0, n.get()))));
        Ok(vec![cost])
    });
    r.add(
        "virtual.cycles",
        "virtual time in TSC cycles (papirus_lowlevel::virt_cyc, PAPI_get_virt_cyc)",
        |b| {
            let m = vclock::thread_method();
            Ok(vec![b.time(Some(&virt_path(&m, None)), || {
                black_box(papirus_lowlevel::virt_cyc());
            })])
        },
    );
}

fn attr(name: &str) -> Result<EventAttr, String> {
    parse_event(name).map_err(|e| e.to_string())
}

fn open_counter(name: &str) -> Result<papirus_substrate::Counter, String> {
    attr(name)?.open(Target::ThisThread).map_err(|e| e.to_string())
}

/// Tallies the read paths seen while timing, for the row's `path`.
#[derive(Default)]
struct Paths {
    user: Cell<u64>,
    resync: Cell<u64>,
    syscall: Cell<u64>,
}

impl Paths {
    fn note(&self, p: ReadPath) {
        let c = match p {
            ReadPath::UserSpace => &self.user,
            ReadPath::Resync => &self.resync,
            ReadPath::Syscall => &self.syscall,
        };
        c.set(c.get() + 1);
    }

    fn describe(&self, why_not: Option<&str>) -> String {
        let (u, r, s) = (self.user.get(), self.resync.get(), self.syscall.get());
        let n = (u + r + s).max(1) as f64;
        let pct = |x: u64| 100.0 * x as f64 / n;
        if s > 0 && u + r == 0 {
            match why_not {
                Some(w) => format!("read() on every call: {w}"),
                None => "read() on every call".into(),
            }
        } else {
            format!("user-space {:.2} %, resync by read() {:.2} %, read() {:.2} %", pct(u), pct(r), pct(s))
        }
    }
}

fn why_not_user(methods: &[ReadMethod], names: &[&str]) -> Option<String> {
    methods.iter().zip(names).find_map(|(p, n)| match p {
        ReadMethod::Syscall { reason } => Some(format!("{n}: {reason}")),
        _ => None,
    })
}

fn counters(r: &mut Registry) {
    for n in 1..=SOFTWARE_EVENTS.len() {
        let names = &SOFTWARE_EVENTS[..n];
        let list = names.join(", ");
        r.add(
            &format!("counter.read.user.{n}"),
            &format!(
                "read of a {n}-event group ({list}) by the user-space path where every member has one (fastread::MappedGroup), else one read()"
            ),
            move |b| {
                let attrs = names.iter().map(|e| attr(e)).collect::<Result<Vec<_>, _>>()?;
                let g = fastread::group(&attrs, Target::ThisThread).map_err(|e| e.to_string())?;
                g.enable().map_err(|e| e.to_string())?;
                let why = why_not_user(g.methods(), names);
                let paths = Paths::default();
                let mut out: Vec<Count> = Vec::new();
                let mut cost = b.time(None, || {
                    if let Ok(p) = g.read_into(&mut out) {
                        paths.note(p);
                    }
                });
                cost.path = Some(paths.describe(why.as_deref()));
                Ok(vec![cost])
            },
        );
        r.add(
            &format!("counter.read.syscall.{n}"),
            &format!("read() of a {n}-event group ({list}), PERF_FORMAT_GROUP: one syscall"),
            move |b| {
                let mut it = names.iter();
                let leader = attr(it.next().copied().unwrap_or("task-clock"))?;
                let mut g = Group::open(&leader, Target::ThisThread).map_err(|e| e.to_string())?;
                for e in it {
                    g.add(&attr(e)?).map_err(|e| e.to_string())?;
                }
                g.enable().map_err(|e| e.to_string())?;
                let mut counts = GroupCounts::default();
                Ok(vec![b.time(Some("read()"), || {
                    black_box(g.read_into(&mut counts).ok());
                })])
            },
        );
    }
    r.add(
        "counter.read.rdpmc",
        "read of one hardware counter (instructions:u) by rdpmc from its mmap page",
        |b| {
            let a = attr("instructions:u")?;
            let c = fastread::counter(&a, Target::ThisThread)
                .map_err(|e| format!("instructions:u cannot be opened: {e}"))?;
            if let ReadMethod::Syscall { reason } = c.method() {
                return Err(format!("no rdpmc path: {reason}"));
            }
            c.enable().map_err(|e| e.to_string())?;
            let paths = Paths::default();
            let mut cost = b.time(None, || {
                if let Ok((_, p)) = c.read() {
                    paths.note(p);
                }
            });
            cost.path = Some(format!("rdpmc: {}", paths.describe(None)));
            Ok(vec![cost])
        },
    );
}

/// The lowlevel event-set rows use papi_cost's size: two events.
const EVENTSET_EVENTS: [&str; 2] = ["task-clock", "page-faults"];

/// The path text of an event-set row: the paths its reads took, and why
/// not user space when none did.
fn set_paths(paths: &Paths, set: &papirus_lowlevel::EventSet) -> String {
    let names: Vec<String> = set.events().into_iter().map(|e| e.name).collect();
    let terms: Vec<ReadMethod> = set.read_methods().into_iter().flatten().collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    format!("EventSet via read::GroupReader: {}", paths.describe(why_not_user(&terms, &names).as_deref()))
}

fn eventset(r: &mut Registry) {
    let desc = EVENTSET_EVENTS.join(", ");
    let open = |events: &'static [&'static str]| -> Result<papirus_lowlevel::EventSet, String> {
        let lib = papirus_lowlevel::init().map_err(|e| e.to_string())?;
        let mut set = lib.event_set();
        set.add_all(events.iter().copied()).map_err(|e| e.to_string())?;
        Ok(set)
    };
    r.add(
        "eventset.start_stop",
        &format!("lowlevel EventSet start + stop, 2 events ({desc}), one sample per pair as papi_cost"),
        move |b| {
            let mut set = open(&EVENTSET_EVENTS)?;
            let mut v = [0i64; 2];
            // One start/stop first, so errors surface as the row's reason.
            set.start().map_err(|e| e.to_string())?;
            set.stop_into(&mut v).map_err(|e| e.to_string())?;
            let paths = Paths::default();
            let mut cost = b.time(None, || {
                let _ = set.start();
                if set.stop_into(&mut v).is_ok()
                    && let Some(p) = set.read_path()
                {
                    paths.note(p);
                }
            });
            cost.path =
                Some(format!("ioctl ENABLE + DISABLE, then stop's read: {}", set_paths(&paths, &set)));
            Ok(vec![cost])
        },
    );
    let running = move |events: &'static [&'static str]| -> Result<papirus_lowlevel::EventSet, String> {
        let mut set = open(events)?;
        set.start().map_err(|e| e.to_string())?;
        Ok(set)
    };
    // One timed operation per row: read, accum or reset.
    type Op = fn(&mut papirus_lowlevel::EventSet, &mut [i64]) -> papirus_lowlevel::Result<()>;
    let rows: [(&str, &str, &'static [&'static str], Op); 4] = [
        ("eventset.read", "read", &EVENTSET_EVENTS, |s, v| s.read_into(v)),
        ("eventset.read.task_clock", "read", &["task-clock"], |s, v| s.read_into(v)),
        ("eventset.accum", "accum (read, add, reset)", &EVENTSET_EVENTS, |s, v| s.accum(v)),
        ("eventset.reset", "reset", &EVENTSET_EVENTS, |s, _| s.reset()),
    ];
    for (name, what, events, op) in rows {
        let list = events.join(", ");
        let n = events.len();
        r.add(name, &format!("lowlevel EventSet {what}, {n} event(s) ({list}), running"), move |b| {
            let mut set = running(events)?;
            let mut v = vec![0i64; n];
            op(&mut set, &mut v).map_err(|e| e.to_string())?;
            let paths = Paths::default();
            let mut cost = b.time(None, || {
                if op(&mut set, black_box(&mut v)).is_ok()
                    && let Some(p) = set.read_path()
                {
                    paths.note(p);
                }
            });
            cost.path = Some(set_paths(&paths, &set));
            Ok(vec![cost])
        });
    }
}

/// The events the region row measures: the highlevel defaults every Linux
/// machine counts.
static REGION_EVENTS: [&str; 3] = ["task-clock", "page-faults", "context-switches"];

fn regions(r: &mut Registry) {
    r.add(
        "region.begin_end",
        "highlevel region_begin + region_end of one region (real time, virtual time, task-clock, page-faults, context-switches)",
        |b| {
            use papirus_highlevel::region::{self, Config, RegionError};
            // Regions are set up once per process; reuse a setup made earlier.
            let setup = match Config::new().events(REGION_EVENTS).write_at_exit(false).install() {
                Ok(s) => s,
                Err(RegionError::AlreadyConfigured) => region::setup().map_err(|e| e.to_string())?,
                Err(e) => return Err(e.to_string()),
            };
            let names: Vec<&str> = setup.events.iter().map(|e| e.name.as_str()).collect();
            // The first pair opens the thread's counters; errors surface here.
            region::region_begin("papirus-calibrate").map_err(|e| e.to_string())?;
            region::region_end("papirus-calibrate").map_err(|e| e.to_string())?;
            let path = format!(
                "TSC, user-space virtual time, and the thread's group of {} by fastread (read() unless every event has a user-space path)",
                names.join(", ")
            );
            Ok(vec![b.time(Some(&path), || {
                let _ = region::region_begin("papirus-calibrate");
                let _ = region::region_end("papirus-calibrate");
            })])
        },
    );
}

/// A timer source of the calling thread's CPU time (virtual time), the
/// clock a per-thread process timer of the probe tool would read.
#[derive(Debug, Clone, Copy)]
struct ThreadCpu;

impl TimeSource for ThreadCpu {
    fn now_ns(&self) -> u64 {
        vclock::thread_cpu_ns()
    }
}

static PROCESS_TIME: ProcessTime = ProcessTime::new();

/// Timers per sample of the timer rows: each start is an outermost start.
const TIMERS: u32 = 64;

fn timer_rows<S: TimeSource>(b: &Bench, kind: &str, source: impl Fn() -> S, path: &str) -> RowResult {
    let timers: Vec<Timer<S>> = (0..TIMERS).map(|_| Timer::new(source())).collect();
    let costs = b.phases(
        TIMERS,
        (&format!("paradyn.{kind}_timer_start"), &format!("paradyn.{kind}_timer_stop")),
        (
            &format!("Paradyn {kind} timer start (outermost)"),
            &format!("Paradyn {kind} timer stop (outermost)"),
        ),
        Some(path),
        |i| timers[i].start(),
        |i| {
            let _ = timers[i].stop();
        },
    );
    Ok(costs)
}

fn paradyn(r: &mut Registry) {
    r.add("paradyn.counter_add", "Paradyn counter add (atomic, relaxed)", |b| {
        let c = PCounter::new(0);
        Ok(vec![b.time(Some("user-space"), || black_box(&c).add(1))])
    });
    r.add(
        "paradyn.wall_timer",
        "Paradyn wall timer (highlevel Wall): paradyn.wall_timer_start and paradyn.wall_timer_stop, each outermost, timed apart over 64 timers",
        |b| timer_rows(b, "wall", || Wall, &format!("{}, fenced both sides", real_path())),
    );
    r.add(
        "paradyn.process_timer",
        "Paradyn process timer (highlevel ProcessTime, CPU time of all threads): paradyn.process_timer_start and paradyn.process_timer_stop, timed apart over 64 timers",
        |b| timer_rows(b, "process", || &PROCESS_TIME, "syscall clock_gettime(CLOCK_PROCESS_CPUTIME_ID)"),
    );
    r.add(
        "paradyn.thread_timer",
        "Paradyn timer over the thread's virtual time (vclock::thread_cpu_ns): paradyn.thread_timer_start and paradyn.thread_timer_stop, timed apart over 64 timers",
        |b| {
            let path = virt_path(&vclock::thread_method(), None);
            timer_rows(b, "thread", || ThreadCpu, &path)
        },
    );
    r.add(
        "paradyn.predicate",
        "Paradyn predicate `calls < 1000000000 && depth == 0` evaluated over two counters",
        |b| {
            let calls = Arc::new(PCounter::new(5));
            let depth = Arc::new(PCounter::new(0));
            let names = HashMap::from([("calls".to_string(), calls), ("depth".to_string(), depth)]);
            let p =
                Predicate::parse("calls < 1000000000 && depth == 0", &names).map_err(|e| e.to_string())?;
            Ok(vec![b.time(Some("user-space"), || {
                black_box(black_box(&p).holds());
            })])
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{Cost, Plan, Ticks};

    fn find<'a>(c: &'a [Cost], name: &str) -> Option<&'a Cost> {
        c.iter().find(|c| c.name == name)
    }

    fn tsc() -> u64 {
        arch::rdtsc_ordered()
    }

    #[test]
    fn every_builtin_row_measures_or_says_why() {
        let mut r = Registry::builtin();
        let rows: Vec<String> = r.rows().map(|(n, _)| n.to_string()).collect();
        let ticks = Ticks { read: tsc, per_ns: clock().tsc_hz().unwrap_or(1e9) / 1e9 };
        let plan = Plan { samples: 5, sample_cycles: 2_000, bins: 0 };
        let rep = r.run(ticks, plan, None, |_, _| {});
        for name in &rows {
            let measured = rep.costs.iter().any(|c| c.name.starts_with(name.as_str()));
            let why = rep.unavailable.iter().find(|u| &u.name == name);
            assert!(measured || why.is_some(), "{name}: neither measured nor unavailable");
            if let Some(u) = why {
                assert!(!u.reason.is_empty(), "{name}: unavailable without a reason");
                eprintln!("{name}: unavailable: {}", u.reason);
            }
        }
        for c in &rep.costs {
            assert!(c.cycles.min <= c.cycles.median && c.cycles.median <= c.cycles.max, "{c:?}");
        }
        // The paired timer rows give both halves.
        for n in [
            "paradyn.wall_timer_start",
            "paradyn.wall_timer_stop",
            "paradyn.process_timer_stop",
            "paradyn.thread_timer_start",
        ] {
            assert!(find(&rep.costs, n).is_some(), "{n} missing");
        }
        // A read() row says so; a syscall row never claims user space.
        let s = find(&rep.costs, "counter.read.syscall.3").expect("3-event read() row");
        assert_eq!(s.path.as_deref(), Some("read()"));
    }
}
