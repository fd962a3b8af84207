//! Event-set operations on a 3-event software set (task-clock, page-faults,
//! context-switches) beside the substrate's raw group calls they are built
//! on, measured in the same run.
//!
//! Baselines: `raw/enable+disable+read` is what `start`+`stop` must do at
//! least, `raw/read` what `read` must do, `raw/read+reset` what `accum` does
//! in PAPI, `raw/reset` what `reset` does in PAPI (papirus resets by taking
//! a snapshot, which is a read). `papirus/read task-clock` is a set whose
//! one event has a user-space path, beside `raw/read task-clock`, the
//! `read(2)` of the same event.
//!
//! Last, the read of {task-clock, page-faults} — task-clock from user space,
//! page-faults by one `read(2)` — beside Debian's PAPI 7.0 reading the same
//! events (`perf::TASK-CLOCK`, `perf::PAGE-FAULTS`) from a C program built
//! against libpapi-dev (installed when missing), medians of batches of the
//! same size, interleaved in the same run and timed in thread CPU time (on
//! a loaded machine, wall time would add whatever the scheduler gives
//! others).

use std::hint::black_box;
use std::process::Command;

use criterion::{Criterion, criterion_group, criterion_main};
use papirus_substrate::names::parse_event;
use papirus_substrate::{Group, Target};

const EVENTS: [&str; 3] = ["task-clock", "page-faults", "context-switches"];

fn bench(c: &mut Criterion) {
    let lib = papirus_lowlevel::init().expect("init");
    let mut set = lib.event_set();
    set.add_all(EVENTS).expect("software events open here");
    let mut values = [0i64; 3];

    let attrs: Vec<_> = EVENTS.iter().map(|n| parse_event(n).expect("parse")).collect();
    let mut group = Group::open(&attrs[0], Target::ThisThread).expect("open");
    for a in &attrs[1..] {
        group.add(a).expect("add");
    }
    let mut counts = papirus_substrate::GroupCounts::default();

    let mut g = c.benchmark_group("eventset");
    g.bench_function("raw/enable+disable+read", |b| {
        b.iter(|| {
            group.enable().unwrap();
            group.disable().unwrap();
            group.read_into(&mut counts).unwrap();
        })
    });
    g.bench_function("papirus/start+stop", |b| {
        b.iter(|| {
            set.start().unwrap();
            set.stop_into(&mut values).unwrap();
            black_box(&values);
        })
    });
    group.enable().unwrap();
    set.start().unwrap();
    g.bench_function("raw/read", |b| b.iter(|| group.read_into(&mut counts).unwrap()));
    g.bench_function("papirus/read", |b| {
        b.iter(|| {
            set.read_into(&mut values).unwrap();
            black_box(&values);
        })
    });
    g.bench_function("raw/read+reset", |b| {
        b.iter(|| {
            group.read_into(&mut counts).unwrap();
            group.reset().unwrap();
        })
    });
    g.bench_function("papirus/accum", |b| b.iter(|| set.accum(&mut values).unwrap()));
    g.bench_function("raw/reset", |b| b.iter(|| group.reset().unwrap()));
    g.bench_function("papirus/reset", |b| b.iter(|| set.reset().unwrap()));
    set.stop().unwrap();
    group.disable().unwrap();

    // A task-clock-only set reads from user space (the substrate's fastread).
    let mut tc = lib.event_set();
    tc.add_named("task-clock").expect("task-clock opens here");
    let tc_group = Group::open(&attrs[0], Target::ThisThread).expect("open");
    tc_group.enable().unwrap();
    tc.start().unwrap();
    let mut one = [0i64; 1];
    g.bench_function("raw/read task-clock", |b| b.iter(|| tc_group.read_into(&mut counts).unwrap()));
    g.bench_function("papirus/read task-clock", |b| {
        b.iter(|| {
            tc.read_into(&mut one).unwrap();
            black_box(&one);
        })
    });
    eprintln!("papirus/read task-clock: last read {:?}", tc.read_path());
    tc.stop().unwrap();

    let mut two = lib.event_set();
    two.add_all(["task-clock", "page-faults"]).expect("software events open here");
    two.start().unwrap();
    let mut v2 = [0i64; 2];
    g.bench_function("papirus/read task-clock+page-faults", |b| {
        b.iter(|| {
            two.read_into(&mut v2).unwrap();
            black_box(&v2);
        })
    });
    g.finish();
    // Interleaved rounds, so both sides see the same load: the median of
    // each side's per-round medians.
    let (mut ours, mut papi) = (Vec::new(), Vec::new());
    let mut why = None;
    for _ in 0..ROUNDS {
        ours.push(median_ns(BATCHES, CALLS, || {
            two.read_into(&mut v2).unwrap();
            black_box(&v2);
        }));
        match papi_read(&["perf::TASK-CLOCK", "perf::PAGE-FAULTS"]) {
            Ok(ns) => papi.push(ns),
            Err(e) => why = Some(e),
        }
    }
    let methods: Vec<_> = two.read_methods().into_iter().flatten().collect();
    two.stop().unwrap();
    println!(
        "\nread of {{task-clock, page-faults}}, ns of thread CPU time per call (median of {ROUNDS} interleaved rounds, each the median of {BATCHES} batches of {CALLS}):"
    );
    let ours = papirus_substrate::stats::median(&ours);
    println!("  papirus EventSet::read     {ours:8.1}  ({methods:?})");
    match ((!papi.is_empty()).then(|| papirus_substrate::stats::median(&papi)), why) {
        (Some(p), _) => println!("  Debian PAPI 7.0 PAPI_read  {p:8.1}  (papirus / PAPI = {:.2})", ours / p),
        (None, Some(e)) => println!("  Debian PAPI 7.0: not measured: {e}"),
        (None, None) => {}
    }
}

/// Rounds of the papirus/PAPI comparison.
const ROUNDS: usize = 5;
const BATCHES: u32 = 15;
const CALLS: u32 = 20_000;

/// This thread's CPU time in ns: a batch's cost without the time it waited
/// for a CPU on a loaded machine (a system call's kernel time counts).
fn cpu_ns() -> f64 {
    papirus_substrate::sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0) as f64
}

/// Median ns per call of `f` (thread CPU time) over `batches` batches of `calls` calls.
fn median_ns(batches: u32, calls: u32, mut f: impl FnMut()) -> f64 {
    let v: Vec<f64> = (0..batches)
        .map(|_| {
            let t = cpu_ns();
            for _ in 0..calls {
                f();
            }
            (cpu_ns() - t) / f64::from(calls)
        })
        .collect();
    papirus_substrate::stats::median(&v)
}

/// Debian PAPI's `PAPI_read` of `events`, median ns per call, measured as
/// [`median_ns`] measures (testkit/targets/papi_read.c).
fn papi_read(events: &[&str]) -> Result<f64, String> {
    papirus_testkit::debian_package("libpapi-dev", || std::path::Path::new("/usr/include/papi.h").exists())?;
    let dir = papirus_testkit::scratch();
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("papi_read.c"))
        .arg("-lpapi")
        .try_build(dir.path(), "papi_read")?;
    let out = Command::new(exe)
        .args([BATCHES.to_string(), CALLS.to_string()])
        .args(events)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().map_err(|e| format!("{e}"))
}

criterion_group!(benches, bench);
criterion_main!(benches);
