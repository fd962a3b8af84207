//! What the high-level primitives cost, beside the raw clock and counter
//! reads they are built on, all measured in the same run.
//!
//! Baselines: `raw/rdtsc` (the substrate's unfenced TSC read),
//! `raw/lfence+rdtsc+lfence` (what `Wall` reads), `raw/clock_gettime`
//! (`CLOCK_MONOTONIC` through the vDSO), `raw/thread_cpu` (the substrate's
//! user-space virtual time), `raw/process_cpu` (`CLOCK_PROCESS_CPUTIME_ID`,
//! a syscall), and `raw/group_read` (one `read(2)` of a page-faults +
//! context-switches group, which a region does at begin and end with the
//! default events because those software counters have no user-space read).
//!
//! After criterion's report, a table of the same operations timed by a
//! plain loop (best of 7 batches) with the ratio to `raw/rdtsc`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::Criterion;
use papirus_highlevel::region::{Config, region_begin, region_end};
use papirus_highlevel::{Counter, Predicate, ProcessTime, TimeSource, Timer, Wall};
use papirus_substrate::fastread;
use papirus_substrate::names::parse_event;
use papirus_substrate::{Count, Target, arch, clock, sys, vclock};

struct Fixture {
    counter: Arc<Counter>,
    wall: Timer<Wall>,
    process: Timer<ProcessTime>,
    pred: Predicate,
    group: fastread::MappedGroup,
    counts: Vec<Count>,
}

fn fixture() -> Fixture {
    let counter = Arc::new(Counter::new(1));
    let env: HashMap<String, Arc<Counter>> =
        [("fooActive".to_string(), counter.clone()), ("calls".to_string(), Arc::new(Counter::new(5)))].into();
    let pred = Predicate::parse("fooActive > 0 && calls % 4 != 0", &env).expect("predicate parses");
    let attrs = [parse_event("page-faults").expect("parse"), parse_event("context-switches").expect("parse")];
    let group = fastread::group(&attrs, Target::ThisThread).expect("software events open here");
    group.enable().expect("enable");
    Fixture {
        counter,
        wall: Timer::new(Wall),
        process: Timer::new(ProcessTime::new()),
        pred,
        counts: vec![Count::default(); 2],
        group,
    }
}

type Op<'a> = (&'static str, Box<dyn FnMut() + 'a>);

fn ops(f: &mut Fixture) -> Vec<Op<'_>> {
    let c = clock::clock();
    let Fixture { counter, wall, process, pred, group, counts } = f;
    vec![
        (
            "raw/rdtsc",
            Box::new(move || {
                black_box(arch::rdtsc());
            }),
        ),
        (
            "raw/lfence+rdtsc+lfence",
            Box::new(move || {
                black_box(arch::rdtsc_ordered());
                arch::lfence();
            }),
        ),
        (
            "raw/clock_gettime",
            Box::new(|| {
                let _ = black_box(sys::clock_gettime(libc::CLOCK_MONOTONIC));
            }),
        ),
        (
            "raw/thread_cpu",
            Box::new(|| {
                black_box(vclock::thread_cpu_ns());
            }),
        ),
        (
            "raw/process_cpu",
            Box::new(|| {
                let _ = black_box(vclock::process_cpu_ns());
            }),
        ),
        (
            "raw/group_read",
            Box::new(move || {
                let _ = black_box(group.read_into(counts));
            }),
        ),
        (
            "wall/now",
            Box::new(move || {
                black_box(Wall.now_ns());
            }),
        ),
        (
            "tsc/now (unfenced)",
            Box::new(move || {
                black_box(c.now());
            }),
        ),
        ("counter/add", Box::new(move || counter.add(black_box(1))) as Box<dyn FnMut()>),
        (
            "timer/start+stop wall",
            Box::new(move || {
                wall.start();
                let _ = black_box(wall.stop());
            }),
        ),
        (
            "timer/start+stop process",
            Box::new(move || {
                process.start();
                let _ = black_box(process.stop());
            }),
        ),
        (
            "predicate/eval",
            Box::new(move || {
                black_box(pred.holds());
            }),
        ),
        (
            "region/begin+end",
            Box::new(|| {
                region_begin("bench").expect("begin");
                region_end("bench").expect("end");
            }),
        ),
    ]
}

/// ns per call of `f`: best of 7 batches of `n`.
fn time(f: &mut dyn FnMut(), n: u32) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    Config::new().write_at_exit(false).install().expect("default region events open here");
    let mut c = Criterion::default().configure_from_args();
    let mut f = fixture();
    // The first region call sets up the thread's counters; keep that out.
    region_begin("bench").expect("begin");
    region_end("bench").expect("end");
    {
        let mut g = c.benchmark_group("primitives");
        for (name, mut op) in ops(&mut f) {
            g.bench_function(name, |b| b.iter(&mut op));
        }
        g.finish();
    }
    c.final_summary();

    let mut rows = vec![];
    for (name, mut op) in ops(&mut f) {
        let n = if name.contains("process") || name.contains("group") || name.contains("region") {
            20_000
        } else {
            1_000_000
        };
        rows.push((name, time(&mut *op, n)));
    }
    let base = rows.iter().find(|r| r.0 == "raw/rdtsc").map_or(1.0, |r| r.1);
    println!("\n{:<28} {:>10} {:>10}", "operation", "ns/op", "× rdtsc");
    for (name, ns) in &rows {
        println!("{name:<28} {ns:>10.1} {:>10.1}", ns / base);
    }
    println!("(best of 7 plain-loop batches; load average {})", load());
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "unknown".into(), |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}
