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

use std::hint::black_box;

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
    g.finish();
    tc.stop().unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
