//! Paradyn primitives under concurrency.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use papirus_highlevel::{Counter, Predicate, TimeSource, Timer, Wall};

/// A sampler reading a timer that another thread starts and stops 10 million
/// times never sees it decrease, nor exceed the wall time elapsed.
#[test]
fn sampled_timer_is_monotonic_and_bounded() {
    let timer = Arc::new(Timer::new(Wall));
    let origin = Wall.now_ns();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (timer, done) = (timer.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..10_000_000 {
                timer.start();
                timer.stop().unwrap();
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut last = 0;
    let mut reads = 0u64;
    while reads < 1_000_000 || !done.load(Ordering::Acquire) {
        let v = timer.sample();
        let elapsed = Wall.now_ns() - origin;
        assert!(v >= last, "timer went backwards: {last} then {v}");
        assert!(v <= elapsed, "timer {v} ns ahead of wall time {elapsed} ns");
        last = v;
        reads += 1;
    }
    writer.join().unwrap();
    assert!(reads >= 1_000_000);
    assert!(last > 0, "10 million start/stop pairs accumulated no time");
}

/// Paradyn's example: a timer in `bar` that runs only while `foo` is active.
#[test]
fn timer_guarded_by_active_counter() {
    let foo_active = Arc::new(Counter::new(0));
    let env: HashMap<_, _> = [("fooActive".to_string(), foo_active.clone())].into();
    let pred = Predicate::parse("fooActive", &env).unwrap();
    let timer = Timer::new(Wall);
    let bar = |timer: &Timer<Wall>| {
        pred.guard(|| timer.start());
        std::thread::sleep(std::time::Duration::from_millis(5));
        pred.guard(|| timer.stop().unwrap());
    };
    // bar called outside foo: not timed.
    bar(&timer);
    assert_eq!(timer.sample(), 0);
    // foo entry, bar inside foo, foo exit: timed.
    foo_active.add(1);
    bar(&timer);
    foo_active.sub(1);
    let inside = timer.sample();
    assert!(inside >= 5_000_000, "bar inside foo should be timed, got {inside} ns");
    bar(&timer);
    assert_eq!(timer.sample(), inside);
}
