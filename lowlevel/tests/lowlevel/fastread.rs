//! Event sets read through the substrate's user-space path where it is
//! exact, and by `read(2)` elsewhere.

use papirus_lowlevel::{EventSet, Library, init};
use papirus_substrate::fastread::{ReadMethod, ReadPath};
use papirus_substrate::vclock::ERROR_BOUND;

use crate::util::serial;

/// A few µs of work between reads, so they are not all back to back.
fn spin() {
    let mut x = 0u64;
    for i in 0..5_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    std::hint::black_box(x);
}

/// The acceptance tolerance of issue 3: a user-space read agrees with
/// `read(2)` within 5 µs in 99 % of reads, and within the stated bound in all.
const TOLERANCE_NS: i64 = 5_000;

fn task_clock_set(lib: &Library) -> Option<EventSet> {
    let mut s = lib.event_set();
    s.add_named("task-clock").unwrap();
    match &s.read_methods()[..] {
        [p] if matches!(p[..], [ReadMethod::ReadPlusTsc | ReadMethod::PageTime]) => Some(s),
        other => {
            eprintln!("task-clock has no user-space path here ({other:?}); skipping");
            None
        }
    }
}

/// Distance of `v` outside `[lo, hi]`, 0 inside.
fn outside(v: i64, lo: i64, hi: i64) -> i64 {
    if v < lo { lo - v } else { (v - hi).max(0) }
}

#[derive(Default)]
struct Misses {
    n: u32,
    over: u32,
    worst: i64,
}

impl Misses {
    fn add(&mut self, err: i64) {
        self.n += 1;
        self.over += u32::from(err > TOLERANCE_NS);
        self.worst = self.worst.max(err);
    }

    /// The 99 % rule, and the stated bound on every read.
    fn check(&self, what: &str) {
        eprintln!("{what}: {} of {} beyond 5 µs, worst {} ns", self.over, self.n, self.worst);
        assert!(self.over * 100 <= self.n, "{what}: {} of {} reads beyond 5 µs", self.over, self.n);
        assert!(self.worst <= ERROR_BOUND.as_nanos() as i64, "{what}: worst {} ns", self.worst);
    }
}

#[test]
fn a_task_clock_set_reads_from_user_space_within_5us_of_read() {
    let _s = serial();
    let lib = init().unwrap();
    let Some(mut s) = task_clock_set(&lib) else { return };
    s.start().unwrap();
    let (mut before, mut fast, mut after) = ([0i64], [0i64], [0i64]);
    let (mut misses, mut user) = (Misses::default(), 0u32);
    const READS: u32 = 20_000;
    for i in 0..READS {
        if i % 8 == 0 {
            spin();
        }
        s.set_user_space_reads(false);
        s.read_into(&mut before).unwrap();
        assert_eq!(s.read_path(), Some(ReadPath::Syscall));
        s.set_user_space_reads(true);
        s.read_into(&mut fast).unwrap();
        let path = s.read_path().unwrap();
        assert_ne!(path, ReadPath::Syscall, "a running task-clock set fell back to read(2)");
        user += u32::from(path == ReadPath::UserSpace);
        s.set_user_space_reads(false);
        s.read_into(&mut after).unwrap();
        if i == 1 {
            eprintln!(
                "read(2) {} ns, user space {} ns ({path:?}), read(2) {} ns",
                before[0], fast[0], after[0]
            );
        }
        misses.add(outside(fast[0], before[0], after[0]));
    }
    eprintln!("{user} of {READS} reads took no system call");
    assert!(user * 4 > READS, "only {user} of {READS} reads were syscall-free");
    misses.check("EventSet task-clock user space vs read()");
    // Stopped, the set reads the kernel's final value.
    let stopped = s.stop().unwrap();
    assert_eq!(s.read_path(), Some(ReadPath::Syscall));
    s.set_user_space_reads(true);
    assert_eq!(s.read().unwrap(), stopped);
    assert_eq!(s.read_path(), Some(ReadPath::Syscall));
}

#[test]
fn sets_with_events_without_a_user_space_path_read_by_syscall() {
    let _s = serial();
    let lib = init().unwrap();
    let mut s = lib.event_set();
    s.add_all(["task-clock", "page-faults"]).unwrap();
    // task-clock is read apart from page-faults, from user space; page-faults by read(2).
    let methods = s.read_methods();
    assert!(
        matches!(&methods[1][..], [ReadMethod::Syscall { reason }] if reason.contains("page-faults")),
        "{methods:?}"
    );
    if task_clock_set(&lib).is_some() {
        assert!(
            matches!(&methods[0][..], [ReadMethod::ReadPlusTsc | ReadMethod::PageTime]),
            "task-clock keeps its user-space read beside page-faults: {methods:?}"
        );
    }
    s.start().unwrap();
    for _ in 0..100 {
        s.read().unwrap();
        assert_eq!(s.read_path(), Some(ReadPath::Syscall));
    }
    s.stop().unwrap();

    // Multiplexed: scaling takes the kernel's times, so read(2) even for task-clock.
    let mut m = lib.event_set();
    m.set_multiplex(true).unwrap();
    m.add_named("task-clock").unwrap();
    assert!(
        matches!(&m.read_methods()[0][..], [ReadMethod::Syscall { reason }] if reason.contains("multiplexed")),
        "{:?}",
        m.read_methods()
    );
    m.start().unwrap();
    m.read().unwrap();
    assert_eq!(m.read_path(), Some(ReadPath::Syscall));
    m.stop().unwrap();

    // Read on another thread than the counted one: the pages' times and
    // rdpmc describe the reader, so read(2).
    if let Some(mut t) = task_clock_set(&lib) {
        t.start().unwrap();
        t.read().unwrap();
        assert_ne!(t.read_path(), Some(ReadPath::Syscall));
        let mut t = std::thread::spawn(move || {
            for _ in 0..10 {
                t.read().unwrap();
                assert_eq!(t.read_path(), Some(ReadPath::Syscall), "read off the counted thread");
            }
            t
        })
        .join()
        .unwrap();
        t.read().unwrap();
        assert_ne!(t.read_path(), Some(ReadPath::Syscall), "back on its thread");
        t.stop().unwrap();
    }

    // Counting another thread: its pages describe that thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        tx.send(papirus_lowlevel::thread_id()).unwrap();
        done_rx.recv().unwrap();
    });
    let mut a = lib.event_set();
    a.add_named("task-clock").unwrap();
    a.attach(rx.recv().unwrap()).unwrap();
    assert!(matches!(&a.read_methods()[0][..], [ReadMethod::Syscall { .. }]), "{:?}", a.read_methods());
    a.start().unwrap();
    a.read().unwrap();
    assert_eq!(a.read_path(), Some(ReadPath::Syscall));
    a.stop().unwrap();
    done_tx.send(()).unwrap();
    other.join().unwrap();
}

/// Two sets compared after the same operation, one operation of the kernel
/// set apart: how far their values are beyond the tolerance.
fn apply(round: u32, sets: &mut [&mut EventSet], acc: &mut [[i64; 1]]) -> Vec<i64> {
    match round % 5 {
        0 | 1 => sets.iter_mut().map(|s| s.read().unwrap()[0]).collect(),
        2 => sets
            .iter_mut()
            .zip(acc.iter_mut())
            .map(|(s, a)| {
                let before = a[0];
                s.accum(a).unwrap();
                a[0] - before
            })
            .collect(),
        3 => {
            for s in sets.iter_mut() {
                s.reset().unwrap();
            }
            sets.iter_mut().map(|s| s.read().unwrap()[0]).collect()
        }
        _ => {
            let v: Vec<i64> = sets.iter_mut().map(|s| s.stop().unwrap()[0]).collect();
            let fast = &mut sets[2];
            assert_eq!(fast.read_path(), Some(ReadPath::Syscall), "stop reads after disabling");
            assert_eq!(fast.read().unwrap()[0], v[2], "a stopped set keeps its value");
            // Busy while stopped: none of it may show after the restart
            // (within the sync interval, so a stale base would be used).
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_micros(50) {
                spin();
            }
            for s in sets.iter_mut() {
                s.start().unwrap();
            }
            v
        }
    }
}

#[test]
fn user_space_reads_keep_start_stop_accum_and_reset_exact() {
    let _s = serial();
    let lib = init().unwrap();
    // `fast` reads from user space, `kernel` and `base` by read(2). Each
    // operation is applied to kernel, base, then fast, so base-kernel and
    // fast-base are both one operation apart: base-kernel is what this
    // machine (host preemption, a loaded CPU) adds to such a difference in
    // this very run, fast-base that plus the user-space error.
    let Some(mut fast) = task_clock_set(&lib) else { return };
    let mut kernel = lib.event_set();
    kernel.add_named("task-clock").unwrap();
    kernel.set_user_space_reads(false);
    let mut base = lib.event_set();
    base.add_named("task-clock").unwrap();
    base.set_user_space_reads(false);
    let (mut misses, mut baseline) = (Misses::default(), Misses::default());
    let mut paths = [0u32; 3];
    let mut acc = [[0i64]; 3];
    for s in [&mut kernel, &mut base, &mut fast] {
        s.start().unwrap();
    }
    for round in 0..2_000u32 {
        if round % 16 == 0 {
            spin();
        }
        let v = apply(round, &mut [&mut kernel, &mut base, &mut fast], &mut acc);
        let (k, b, f) = (v[0], v[1], v[2]);
        assert!(f >= 0, "round {round}: a user-space value went negative: {f}");
        match fast.read_path() {
            Some(ReadPath::UserSpace) => paths[0] += 1,
            Some(ReadPath::Resync) => paths[1] += 1,
            _ => paths[2] += 1,
        }
        baseline.add((b - k).abs().saturating_sub(TOLERANCE_NS));
        misses.add((f - b).abs().saturating_sub(TOLERANCE_NS));
    }
    eprintln!("fast set paths: {} user space, {} resync, {} read(2)", paths[0], paths[1], paths[2]);
    assert!(paths[0] > 200, "too few user-space reads to test them: {paths:?}");
    eprintln!(
        "beyond 5 µs: user space vs read(2) {} of {}, read(2) vs read(2) {} of {} (worst {} and {} ns)",
        misses.over, misses.n, baseline.over, baseline.n, misses.worst, baseline.worst
    );
    // The 99 % rule over what the machine itself adds in this run: the user-space
    // path may miss the tolerance in at most 1 % of rounds more than read(2) does.
    assert!(
        misses.over <= baseline.over + misses.n / 100,
        "user space beyond 5 µs in {} of {} rounds, read(2) against itself in {}",
        misses.over,
        misses.n,
        baseline.over
    );
    for s in [&mut kernel, &mut base, &mut fast] {
        s.stop().unwrap();
    }
}
