//! Costs of papirus' clocks and syscall-free reads, each beside its
//! baseline measured in the same run: real time vs `rdtsc` and vDSO
//! `clock_gettime(CLOCK_MONOTONIC)`, virtual time vs
//! `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, a user-space task-clock read
//! vs `read(2)` on the same descriptor, and a 3-event software group read
//! both ways. Ends with a summary table of ratios against the goals.
//!
//! Run briefly on shared machines:
//! `cargo bench -p papirus-substrate --bench clocks -- --warm-up-time 1 --measurement-time 2`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::Criterion;
use perf_event_open_sys::bindings as b;

use papirus_substrate::arch;
use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::clock::clock;
use papirus_substrate::event::{Count, Target};
use papirus_substrate::fastread;
use papirus_substrate::sys::clock_gettime;
use papirus_substrate::vclock::{thread_cpu_ns, thread_method};
use papirus_substrate::{EventAttr, Kind};

/// ns per iteration of every sample criterion took, by "group/name".
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Benchmarks `op` under criterion and keeps each sample's ns/iteration.
fn bench<T>(c: &mut Criterion, group: &str, name: &str, mut op: impl FnMut() -> T) {
    let key = format!("{group}/{name}");
    c.bench_function(&key, |bch| {
        bch.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                black_box(op());
            }
            let e = t.elapsed();
            SAMPLES.lock().unwrap().entry(key.clone()).or_default().push(e.as_nanos() as f64 / iters as f64);
            e
        })
    });
}

fn sw(name: &str, config: u32) -> EventAttr {
    EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, u64::from(config))
}

fn benches(c: &mut Criterion) {
    let clk = clock();
    eprintln!("real time: {:?}", clk.info());
    bench(c, "real_time", "rdtsc", arch::rdtsc);
    bench(c, "real_time", "rdtsc_ordered", arch::rdtsc_ordered);
    bench(c, "real_time", "clock_raw", || clk.raw());
    bench(c, "real_time", "clock_now", || clk.now());
    bench(c, "real_time", "clock_gettime_monotonic", || clock_gettime(libc::CLOCK_MONOTONIC));

    eprintln!("virtual time method: {:?}", thread_method());
    bench(c, "virtual_time", "thread_cpu_ns", thread_cpu_ns);
    bench(c, "virtual_time", "clock_gettime_thread_cputime", || clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID));

    match fastread::counter(&sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK), Target::ThisThread) {
        Ok(tc) => {
            eprintln!("task-clock method: {:?}", tc.method());
            tc.enable().expect("enable task-clock");
            bench(c, "task_clock", "user_space", || tc.read().map(|r| r.0.raw));
            bench(c, "task_clock", "read_syscall", || tc.read_syscall().map(|r| r.raw));
        }
        Err(e) => eprintln!("task-clock unavailable here, its benches skipped: {e}"),
    }

    let times = [
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
        sw("cpu-clock", b::PERF_COUNT_SW_CPU_CLOCK),
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
    ];
    let mixed = [
        sw("task-clock", b::PERF_COUNT_SW_TASK_CLOCK),
        sw("page-faults", b::PERF_COUNT_SW_PAGE_FAULTS),
        sw("context-switches", b::PERF_COUNT_SW_CONTEXT_SWITCHES),
    ];
    match (fastread::group(&times, Target::ThisThread), fastread::group(&mixed, Target::ThisThread)) {
        (Ok(g), Ok(m)) => {
            eprintln!("group methods: {:?}; mixed group methods: {:?}", g.methods(), m.methods());
            g.enable().expect("enable group");
            m.enable().expect("enable group");
            let mut out: Vec<Count> = Vec::new();
            bench(c, "group3", "user_space", || g.read_into(&mut out).map(|_| out[0].raw));
            let mut counts = Vec::new();
            bench(c, "group3", "read_syscall", || g.read_syscall(&mut counts));
            bench(c, "group3", "mixed_fallback", || m.read_into(&mut out).map(|_| out[0].raw));
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("software groups unavailable here, their benches skipped: {e}")
        }
    }
}

fn median(key: &str) -> Option<f64> {
    SAMPLES.lock().unwrap().get(key).map(|v| papirus_substrate::stats::median(v))
}

/// Prints each fast path beside its baseline, with the ratio and the goal.
fn summary() {
    // (what, fast path, baseline, goal: fast/baseline at most, or baseline/fast at least)
    enum Goal {
        AtMost(f64),
        CheaperBy(f64),
        None,
    }
    let rows = [
        ("real time vs rdtsc", "real_time/clock_now", "real_time/rdtsc", Goal::AtMost(1.5)),
        ("raw ticks vs rdtsc", "real_time/clock_raw", "real_time/rdtsc", Goal::AtMost(1.5)),
        (
            "real time vs CLOCK_MONOTONIC",
            "real_time/clock_now",
            "real_time/clock_gettime_monotonic",
            Goal::None,
        ),
        (
            "virtual time vs CLOCK_THREAD_CPUTIME_ID",
            "virtual_time/thread_cpu_ns",
            "virtual_time/clock_gettime_thread_cputime",
            Goal::CheaperBy(20.0),
        ),
        (
            "task-clock user space vs read()",
            "task_clock/user_space",
            "task_clock/read_syscall",
            Goal::CheaperBy(20.0),
        ),
        (
            "group of 3 user space vs read()",
            "group3/user_space",
            "group3/read_syscall",
            Goal::CheaperBy(20.0),
        ),
        ("group of 3 w/ page-faults vs read()", "group3/mixed_fallback", "group3/read_syscall", Goal::None),
    ];
    println!(
        "\n{:<40} {:>10} {:>12} {:>9}  goal",
        "fast path vs baseline (medians)", "ns", "baseline ns", "ratio"
    );
    for (what, fast, base, goal) in rows {
        let (Some(f), Some(bn)) = (median(fast), median(base)) else {
            println!("{what:<40} {:>10} {:>12} {:>9}  (not run)", "-", "-", "-");
            continue;
        };
        let (ratio, verdict) = match goal {
            Goal::AtMost(g) => (
                format!("{:.2}×", f / bn),
                format!("≤ {g}× : {}", if f / bn <= g { "met" } else { "MISSED" }),
            ),
            Goal::CheaperBy(g) => (
                format!("1/{:.1}", bn / f),
                format!("≥ {g}× cheaper : {}", if bn / f >= g { "met" } else { "MISSED" }),
            ),
            Goal::None => (format!("{:.2}×", f / bn), "-".to_string()),
        };
        println!("{what:<40} {f:>10.2} {bn:>12.2} {ratio:>9}  {verdict}");
    }
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    benches(&mut c);
    c.final_summary();
    summary();
}
