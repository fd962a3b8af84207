//! The cost of reading counters with read(2): one task-clock Counter and a
//! group of three software events, against a null syscall (getppid)
//! measured in the same run. This is the baseline the user-space read path
//! has to beat.
//!
//! Criterion prints its own report; a summary table of the median ns per
//! operation and the ratio to the null syscall follows it.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::Criterion;
use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::{Domain, EventAttr, Group, GroupCounts, Kind, Target};

/// Samples criterion takes per benchmark (its default).
const SAMPLE_SIZE: usize = 100;

/// ns per operation of every call criterion made, per benchmark; the last
/// [`SAMPLE_SIZE`] are the measurement, the ones before the warm-up.
static SAMPLES: Mutex<BTreeMap<&'static str, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Times `iters` runs of `op` and records the sample for the summary.
fn timed(name: &'static str, iters: u64, mut op: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        op();
    }
    let took = start.elapsed();
    let per_op = took.as_nanos() as f64 / iters as f64;
    SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).entry(name).or_default().push(per_op);
    took
}

fn software(name: &str, config: u64) -> EventAttr {
    EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, config)
}

const NULL: &str = "getppid (null syscall)";
const ONE: &str = "read() task-clock Counter";
const THREE: &str = "read() group of 3, reused buffers";
const THREE_ALLOC: &str = "read() group of 3, new GroupCounts";

fn benches(c: &mut Criterion) {
    let counter = software("task-clock", 1).open(Target::ThisThread).expect("task-clock opens");
    counter.enable().expect("enable");

    let mut group = Group::open(&software("task-clock", 1), Target::ThisThread).expect("group opens");
    group.add(&software("page-faults", 2)).expect("page-faults joins");
    let mut cs = software("context-switches", 3);
    cs.default_domain("software");
    if let Err(e) = group.add(&cs) {
        // Unprivileged: the all-domain default is refused; user only costs the same to read.
        println!("context-switches with all domains refused ({e}); benchmarking it user only");
        cs.domain(Domain::USER);
        group.add(&cs).expect("context-switches joins user only");
    }
    group.enable().expect("enable group");
    let mut counts = GroupCounts::default();

    let mut g = c.benchmark_group("read");
    g.sample_size(SAMPLE_SIZE);
    g.bench_function(NULL, |b| {
        b.iter_custom(|n| {
            timed(NULL, n, || {
                black_box(std::os::unix::process::parent_id());
            })
        })
    });
    g.bench_function(ONE, |b| {
        b.iter_custom(|n| {
            timed(ONE, n, || {
                black_box(counter.read().expect("read"));
            })
        })
    });
    g.bench_function(THREE, |b| {
        b.iter_custom(|n| timed(THREE, n, || group.read_into(black_box(&mut counts)).expect("group read")))
    });
    g.bench_function(THREE_ALLOC, |b| {
        b.iter_custom(|n| {
            timed(THREE_ALLOC, n, || {
                black_box(group.read().expect("group read"));
            })
        })
    });
    g.finish();
}

/// The median of the measured samples (warm-up calls dropped).
fn median(v: &[f64]) -> f64 {
    papirus_substrate::stats::median(&v[v.len().saturating_sub(SAMPLE_SIZE)..])
}

fn summary() {
    let samples = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    let base = samples.get(NULL).map_or(f64::NAN, |v| median(v));
    println!("\nread() costs, median of criterion's {SAMPLE_SIZE} samples in this run:");
    println!("{:<40} {:>10} {:>16}", "operation", "ns/op", "× null syscall");
    for name in [NULL, ONE, THREE, THREE_ALLOC] {
        if let Some(v) = samples.get(name) {
            let m = median(v);
            println!("{name:<40} {m:>10.1} {:>16.2}", m / base);
        }
    }
    if let (Some(three), Some(one)) =
        (samples.get(THREE).map(|v| median(v)), samples.get(ONE).map(|v| median(v)))
    {
        println!(
            "group of 3 per event: {:.1} ns ({:.2}× one counter's read per event)",
            three / 3.0,
            three / 3.0 / one
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    summary();
}
