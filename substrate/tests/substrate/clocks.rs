//! Clocks and syscall-free reads against the real kernel (issue 3):
//! real time vs CLOCK_MONOTONIC_RAW, virtual time vs
//! CLOCK_THREAD_CPUTIME_ID, user-space task-clock reads vs read(), group
//! read paths, and hardware info vs /proc/cpuinfo.

use std::time::{Duration, Instant};

use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::clock::clock;
use papirus_substrate::event::{Count, Target};
use papirus_substrate::fastread::{self, ReadMethod, ReadPath};
use papirus_substrate::hwinfo::{Counters, HwInfo, Hypervisor};
use papirus_substrate::sys::clock_gettime;
use papirus_substrate::vclock::{ERROR_BOUND, thread_cpu_ns, thread_method};
use papirus_substrate::{EventAttr, Kind};

use crate::util::serial;

fn thread_cputime() -> u64 {
    clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).expect("CLOCK_THREAD_CPUTIME_ID")
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// A small deterministic generator for the workload's mix.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// How far `v` lies outside `[lo, hi]`.
fn outside(v: u64, lo: u64, hi: u64) -> u64 {
    if v < lo { lo - v } else { v.saturating_sub(hi) }
}

/// Errors of a series of bracketed comparisons.
#[derive(Default, Debug)]
struct Errors {
    n: u64,
    within_5us: u64,
    max: u64,
    sum: u64,
}

impl Errors {
    fn add(&mut self, e: u64) {
        self.n += 1;
        self.within_5us += u64::from(e <= 5_000);
        self.max = self.max.max(e);
        self.sum += e;
    }
    fn fraction(&self) -> f64 {
        self.within_5us as f64 / self.n as f64
    }
    fn check(&self, what: &str) {
        eprintln!(
            "{what}: {} reads, {:.3} % within 5 µs, max error {:.3} µs, mean {:.1} ns (bound {:?})",
            self.n,
            100.0 * self.fraction(),
            self.max as f64 / 1e3,
            self.sum as f64 / self.n as f64,
            ERROR_BOUND
        );
        assert!(self.fraction() >= 0.99, "{what}: only {:.3} % within 5 µs", 100.0 * self.fraction());
        assert!(
            self.max <= ERROR_BOUND.as_nanos() as u64,
            "{what}: max error {} ns beyond the bound",
            self.max
        );
    }
}

#[test]
fn real_time_agrees_with_monotonic_raw_over_100ms() {
    let _s = serial();
    let c = clock();
    eprintln!("real time: {:?}", c.info());
    let pair = || {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..5 {
            let a = c.raw_ordered();
            let ns = clock_gettime(libc::CLOCK_MONOTONIC_RAW).unwrap();
            let b = c.raw_ordered();
            if b - a < best.0 {
                best = (b - a, a + (b - a) / 2, ns);
            }
        }
        (best.1, best.2)
    };
    // The VM can stall either endpoint; take the best of a few tries.
    let mut best = u64::MAX;
    for _ in 0..3 {
        let (t0, n0) = pair();
        std::thread::sleep(Duration::from_millis(100));
        let (t1, n1) = pair();
        let diff = c.delta_ns(t0, t1).abs_diff(n1 - n0);
        eprintln!("100 ms: TSC {} ns, MONOTONIC_RAW {} ns, |diff| {diff} ns", c.delta_ns(t0, t1), n1 - n0);
        best = best.min(diff);
        if best < 20_000 {
            break;
        }
    }
    assert!(best < 20_000, "TSC time and CLOCK_MONOTONIC_RAW differ by {best} ns over 100 ms");
}

#[test]
fn real_time_never_goes_backwards_on_two_threads() {
    let _s = serial();
    let c = clock();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut last = c.now();
                let mut back = 0u64;
                for _ in 0..10_000_000 {
                    let now = c.now();
                    back += u64::from(now < last);
                    last = now;
                }
                back
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 0, "real time went backwards");
    }
}

#[test]
fn virtual_time_tracks_thread_cputime_on_8_threads() {
    let _s = serial();
    let threads: Vec<_> = (0..8u64)
        .map(|k| {
            std::thread::spawn(move || {
                let method = thread_method();
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (k + 1));
                let mut e = Errors::default();
                for i in 0..100_000u32 {
                    if i % 500 == 0 {
                        std::thread::sleep(Duration::from_micros(50 + rng.next() % 450));
                    } else if i % 8 == 0 {
                        spin(Duration::from_nanos(rng.next() % 20_000));
                    }
                    let c0 = thread_cputime();
                    let v = thread_cpu_ns();
                    let c1 = thread_cputime();
                    e.add(outside(v, c0, c1));
                }
                (method, e)
            })
        })
        .collect();
    for (k, t) in threads.into_iter().enumerate() {
        let (method, e) = t.join().unwrap();
        if let ReadMethod::Syscall { reason } = &method {
            eprintln!("thread {k}: virtual time falls back to the syscall here: {reason}");
        }
        e.check(&format!("thread {k} virtual time ({method:?}) vs CLOCK_THREAD_CPUTIME_ID"));
    }
}

#[test]
fn virtual_time_does_not_advance_while_sleeping() {
    let _s = serial();
    let mut best = u64::MAX;
    for _ in 0..3 {
        let a = thread_cpu_ns();
        let ca = thread_cputime();
        std::thread::sleep(Duration::from_millis(100));
        let cb = thread_cputime();
        let b = thread_cpu_ns();
        eprintln!("over a 100 ms sleep: virtual time {} ns, CLOCK_THREAD_CPUTIME_ID {} ns", b - a, cb - ca);
        best = best.min(b - a);
        if best < 500_000 {
            break;
        }
    }
    assert!(best < 500_000, "virtual time advanced {best} ns during a 100 ms sleep");
}

/// Perf mappings and descriptors of this process.
fn perf_resources() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps.lines().filter(|l| l.contains("perf_event")).count();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains("perf_event"))
        .count();
    (mapped, fds)
}

#[test]
fn a_thread_pays_nothing_until_it_asks_and_releases_at_exit() {
    let _s = serial();
    let before = perf_resources();
    let quiet = std::thread::spawn(perf_resources).join().unwrap();
    assert_eq!(quiet, before, "a thread that never asked opened something");
    let during = std::thread::spawn(|| {
        let v = thread_cpu_ns();
        (v, thread_method(), perf_resources())
    })
    .join()
    .unwrap();
    if let (_, ReadMethod::ReadPlusTsc | ReadMethod::PageTime, (m, f)) = during {
        assert_eq!((m, f), (before.0 + 1, before.1 + 1), "one page and one fd per asking thread");
    }
    assert_eq!(perf_resources(), before, "the thread's page and fd outlived it");
}

#[test]
fn process_cpu_time_covers_the_threads() {
    let _s = serial();
    let p0 = papirus_substrate::vclock::process_cpu_ns().unwrap();
    let worker = std::thread::spawn(|| {
        let t0 = thread_cpu_ns();
        spin(Duration::from_millis(20));
        thread_cpu_ns() - t0
    });
    let used = worker.join().unwrap();
    let p1 = papirus_substrate::vclock::process_cpu_ns().unwrap();
    eprintln!("worker used {used} ns of CPU; the process {} ns", p1 - p0);
    assert!(p1 - p0 >= used, "process CPU time grew less than one of its threads' time");
}

fn sw(name: &str, config: u32) -> EventAttr {
    EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, u64::from(config))
}

use perf_event_open_sys::bindings as b;

#[test]
fn user_space_task_clock_agrees_with_read() {
    let _s = serial();
    let c = match fastread::counter(&sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK), Target::ThisThread) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("task-clock cannot be opened here: {e}; skipping");
            return;
        }
    };
    assert!(
        matches!(c.method(), ReadMethod::ReadPlusTsc | ReadMethod::PageTime),
        "task-clock of this thread has no user-space path: {:?}",
        c.method()
    );
    c.enable().unwrap();
    let mut rng = XorShift(42);
    let mut e = Errors::default();
    let mut paths = [0u64; 3];
    for i in 0..100_000u32 {
        if i % 1000 == 0 {
            std::thread::sleep(Duration::from_micros(50 + rng.next() % 450));
        } else if i % 8 == 0 {
            spin(Duration::from_nanos(rng.next() % 20_000));
        }
        let r0 = c.read_syscall().unwrap().raw;
        let (v, path) = c.read().unwrap();
        let r1 = c.read_syscall().unwrap().raw;
        paths[path as usize] += 1;
        e.add(outside(v.raw, r0, r1));
    }
    eprintln!("paths: user space {}, resync {}, syscall {}", paths[0], paths[1], paths[2]);
    assert_eq!(paths[2], 0, "an enabled task-clock of this thread never needs a plain read()");
    assert!(paths[0] > paths[1], "most reads should take the user-space path");
    e.check(&format!("task-clock user space ({:?}) vs read()", c.method()));
    // Disabled, reads go to the kernel and say so.
    c.disable().unwrap();
    assert_eq!(c.read().unwrap().1, ReadPath::Syscall);
}

#[test]
fn group_read_takes_user_space_only_when_every_member_can() {
    let _s = serial();
    let times = [
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
        sw("cpu-clock", b::PERF_COUNT_SW_CPU_CLOCK),
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
    ];
    let g = match fastread::group(&times, Target::ThisThread) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("software group cannot be opened here: {e}; skipping");
            return;
        }
    };
    assert!(g.user_space(), "{:?}", g.methods());
    g.enable().unwrap();
    let mut out: Vec<Count> = Vec::new();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut e = Errors::default();
    let mut user = 0;
    for i in 0..20_000u32 {
        if i % 8 == 0 {
            spin(Duration::from_micros(3));
        }
        g.read_syscall(&mut before).unwrap();
        let path = g.read_into(&mut out).unwrap();
        g.read_syscall(&mut after).unwrap();
        user += u32::from(path == ReadPath::UserSpace);
        assert_ne!(path, ReadPath::Syscall);
        for m in g.members() {
            let i = m.index();
            e.add(outside(out[i].raw, before[i].raw, after[i].raw));
        }
    }
    assert!(user > 10_000, "only {user} of 20000 group reads were syscall-free");
    e.check("group {task-clock, cpu-clock, task-clock} user space vs read()");

    let mixed = [
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
        sw("page-faults", b::PERF_COUNT_SW_PAGE_FAULTS),
        sw("context-switches", b::PERF_COUNT_SW_CONTEXT_SWITCHES),
    ];
    let g = fastread::group(&mixed, Target::ThisThread).unwrap();
    assert!(!g.user_space());
    assert!(
        matches!(&g.methods()[1], ReadMethod::Syscall { reason } if reason.contains("page-faults")),
        "{:?}",
        g.methods()
    );
    g.enable().unwrap();
    assert_eq!(g.read_into(&mut out).unwrap(), ReadPath::Syscall);
    assert!(out[0].raw > 0, "task-clock counted nothing: {out:?}");
}

#[test]
fn task_clock_of_another_thread_is_read_with_read() {
    let _s = serial();
    let tid = std::process::id() as i32;
    let attr = sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK);
    match fastread::counter(&attr, Target::Task(tid)) {
        Ok(c) => {
            assert!(matches!(c.method(), ReadMethod::Syscall { .. }), "{:?}", c.method());
            c.enable().unwrap();
            assert_eq!(c.read().unwrap().1, ReadPath::Syscall);
        }
        Err(e) => eprintln!("task-clock on pid {tid} refused here: {e}; skipping"),
    }
}

fn cpuinfo_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find(|l| l.split(':').next().map(str::trim) == Some(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

#[test]
fn hardware_info_is_consistent_with_proc_cpuinfo_and_sysfs() {
    let _s = serial();
    let h = HwInfo::collect();
    eprintln!("{h}");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    assert_eq!(cpuinfo_field(&cpuinfo, "vendor_id").as_deref(), Some(h.vendor.as_str()));
    assert_eq!(cpuinfo_field(&cpuinfo, "model name"), h.model_name);
    let num = |k: &str| cpuinfo_field(&cpuinfo, k).and_then(|v| v.parse::<u32>().ok());
    assert_eq!(num("cpu family"), Some(h.family));
    assert_eq!(num("model"), Some(h.model));
    assert_eq!(num("stepping"), Some(h.stepping));
    let processors = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    assert_eq!(h.cpus, processors);
    assert_eq!(h.cores * h.threads_per_core, h.cpus);
    assert!(h.sockets >= 1 && h.numa_nodes >= 1);
    assert!(h.caches.iter().any(|c| c.level == 1), "{:?}", h.caches);
    let flags: Vec<String> =
        cpuinfo_field(&cpuinfo, "flags").unwrap_or_default().split_whitespace().map(String::from).collect();
    assert_eq!(flags.iter().any(|f| f == "hypervisor"), h.hypervisor.is_some());
    // The TSC: frequency and method are present whenever the TSC is the clock.
    if h.clock.source == papirus_substrate::clock::Source::Tsc {
        let hz = h.clock.tsc_hz.expect("TSC frequency");
        assert!(h.clock.method.is_some());
        // The kernel's own figure is in cpu MHz on machines whose cores run
        // at the TSC rate (VMs, or fixed frequency); report, don't assert.
        if let Some(mhz) = cpuinfo_field(&cpuinfo, "cpu MHz").and_then(|v| v.parse::<f64>().ok()) {
            eprintln!("TSC {:.3} MHz ({:?}), /proc/cpuinfo cpu MHz {mhz}", hz / 1e6, h.clock.method);
        }
        assert!(flags.iter().any(|f| f == "tsc"));
    }
    // Counters: 0 with the reason exactly when sysfs shows no core PMU.
    let devices = std::path::Path::new("/sys/bus/event_source/devices");
    let core = devices.join("cpu").exists() || devices.join("cpu_core").exists();
    assert_eq!(h.counters.core_pmu.is_some(), core);
    if !core {
        assert_eq!((h.counters.general_purpose, h.counters.fixed), (0, 0));
        assert!(h.counters.reason.as_deref().unwrap().contains("no core PMU"));
        assert_eq!(h.rdpmc, None);
    }
    assert!(h.pmus.iter().any(|p| p.name == "software" && p.type_ == 1), "{:?}", h.pmus);
    // What event layers read without the clock is what HwInfo reports.
    let id = papirus_substrate::arch::identity();
    assert_eq!(Counters::collect(&id), h.counters);
    assert_eq!(Hypervisor::of(&id), h.hypervisor);
    // Virtual time takes a user-space method whenever the TSC is usable and
    // a task-clock can be opened (this test opens one to know).
    let tc = fastread::counter(&sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK), Target::ThisThread);
    if h.clock.source == papirus_substrate::clock::Source::Tsc && tc.is_ok() {
        assert!(
            matches!(h.virtual_time, ReadMethod::ReadPlusTsc | ReadMethod::PageTime),
            "{:?}",
            h.virtual_time
        );
    }
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok();
    assert_eq!(h.perf_event_paranoid, paranoid.and_then(|s| s.trim().parse().ok()));
}
