//! Cost of one overflow delivery (breakpoint exception + signal + handler
//! draining the ring; no re-arm is needed) and of one drained ring sample,
//! beside a plain `read(2)` of a counter and a bare call of the function,
//! all measured in the same run.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use papirus_substrate::attr::consts::{PERF_TYPE_BREAKPOINT, PERF_TYPE_SOFTWARE};
use papirus_substrate::sample::{Record, SampleType, Sampler, Sampling};
use papirus_substrate::signal::{Notifier, default_signal, gettid};
use papirus_substrate::{EventAttr, Kind};

#[inline(never)]
fn hit(x: u64) -> u64 {
    black_box(x + 1)
}

#[inline(never)]
fn drained(x: u64) -> u64 {
    black_box(x ^ 3)
}

fn breakpoint(addr: u64) -> EventAttr {
    let mut a = EventAttr::new(format!("mem:{addr:#x}:x"), Kind::Breakpoint, PERF_TYPE_BREAKPOINT, 0);
    a.config1(addr).config2(8).bp_type(4);
    a
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("overflow");

    // Baselines: a bare call, and read(2) of a task-clock counter.
    g.bench_function("baseline_bare_call", |b| b.iter(|| hit(black_box(1))));
    let tc = Sampler::open(
        &EventAttr::new("task-clock", Kind::Software, PERF_TYPE_SOFTWARE, 1),
        Sampling::period(u64::MAX >> 1).data_pages(1),
        0,
        -1,
    )
    .expect("task-clock");
    tc.events().enable().unwrap();
    g.bench_function("baseline_read_syscall", |b| b.iter(|| tc.events().read_count().unwrap()));

    // A counting breakpoint on the same function: the debug exception alone,
    // so delivery minus this is the signal + handler + ring cost.
    let counting = breakpoint(hit as *const () as u64).open(papirus_substrate::Target::ThisThread).unwrap();
    counting.enable().unwrap();
    g.bench_function("baseline_breakpoint_hit_counting_only", |b| b.iter(|| hit(black_box(1))));
    counting.disable().unwrap();
    drop(counting);

    // One overflow delivered per call: breakpoint, threshold 1, signal to this thread.
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    let mut cfg = Sampling::period(1);
    cfg.sample_type(SampleType::IP);
    let sampler = Sampler::open(&breakpoint(hit as *const () as u64), &cfg, 0, -1).unwrap();
    let n = Notifier::attach(
        sampler,
        default_signal(),
        gettid(),
        Box::new(move |r, _| {
            if matches!(r, Record::Sample(_)) {
                s2.fetch_add(1, Ordering::Relaxed);
            }
        }),
    )
    .unwrap();
    n.events().enable().unwrap();
    let before = seen.load(Ordering::Relaxed);
    let mut calls = 0u64;
    g.bench_function("overflow_delivery_breakpoint_signal_handler", |b| {
        b.iter(|| {
            calls += 1;
            hit(black_box(1))
        })
    });
    n.events().disable().unwrap();
    let delivered = seen.load(Ordering::Relaxed) - before;
    println!("overflow deliveries: {delivered} handler calls for {calls} calls, stats {:?}", n.stats());
    drop(n);

    // One drained sample: fill a ring with breakpoint samples (no signal),
    // time only the drain.
    let mut cfg = Sampling::period(1);
    cfg.sample_type(SampleType::IP | SampleType::TID | SampleType::TIME).data_pages(64).wakeup_events(0);
    let mut s = Sampler::open(&breakpoint(drained as *const () as u64), &cfg, 0, -1).unwrap();
    g.bench_function("drain_one_ring_sample", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let batch = left.min(2000);
                s.events().enable().unwrap();
                for i in 0..batch {
                    drained(i);
                }
                s.events().disable().unwrap();
                let t = Instant::now();
                let mut got = 0u64;
                s.ring().drain(|r| {
                    if let Ok(Record::Sample(x)) = r {
                        got += x.ip.unwrap_or(0) & 1;
                    }
                });
                total += t.elapsed();
                black_box(got);
                left -= batch;
            }
            total
        })
    });
    println!("drain ring stats: {:?}", s.stats());
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
