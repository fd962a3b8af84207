//! PAPI_overflow and PAPI_profil on event sets against the real kernel,
//! with events that exist on PMU-less machines (breakpoints, task-clock,
//! page-faults).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use papirus_lowlevel::overflow::{OVERFLOW_HARDWARE, OverflowHandler, SampleQueue, overflow_event_indices};
use papirus_lowlevel::profil::{ProfilFlags, Region};
use papirus_lowlevel::{Code, EventSet, Granularity, Library};
use papirus_substrate::signal::gettid;
use papirus_substrate::symbolize::ProcessSymbols;
use papirus_substrate::sys::clock_gettime;

use crate::util::{fd_count, serial};

fn lib() -> Library {
    papirus_lowlevel::init().expect("init")
}

fn counter(n: &Arc<AtomicU64>) -> OverflowHandler {
    let n = n.clone();
    Arc::new(move |_| {
        n.fetch_add(1, Ordering::Relaxed);
    })
}

#[inline(never)]
fn f(x: u64) -> u64 {
    black_box(x.rotate_left(7) ^ 0x1234)
}

#[inline(never)]
fn g(x: u64) -> u64 {
    black_box(x.rotate_right(3) ^ 0x4321)
}

fn addr_of(func: fn(u64) -> u64) -> u64 {
    func as *const () as u64
}

fn thread_cpu_ns() -> u64 {
    clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// Burns `ms` of this thread's CPU time inside this function: the loop is
/// plain integer arithmetic (no calls even in debug builds, where
/// `wrapping_mul` or `Range::next` are function calls) and the clock is
/// checked every 200k iterations, so almost every sample lands here.
#[inline(never)]
fn busy(ms: u64) -> u64 {
    let end = thread_cpu_ns() + ms * 1_000_000;
    let mut acc = black_box(0x9e37_79b9_7f4a_7c15u64);
    while thread_cpu_ns() < end {
        let mut i = 0u32;
        while i < 200_000 {
            acc ^= acc << 13;
            acc ^= acc >> 7;
            acc ^= acc << 17;
            i += 1;
        }
        acc = black_box(acc);
    }
    acc
}

/// A second busy function, for sprofil over two regions.
#[inline(never)]
fn busy_other(ms: u64) -> u64 {
    let end = thread_cpu_ns() + ms * 1_000_000;
    let mut acc = black_box(0x2545_f491_4f6c_dd1du64);
    while thread_cpu_ns() < end {
        let mut i = 0u32;
        while i < 200_000 {
            acc ^= acc >> 12;
            acc ^= acc << 25;
            acc ^= acc >> 27;
            i += 1;
        }
        acc = black_box(acc);
    }
    acc
}

#[test]
fn acceptance_1_breakpoint_threshold_1_exact_handler_calls_at_f() {
    let _g = serial();
    let fa = addr_of(f);
    let mut set = lib().event_set();
    let fds = fd_count();
    set.add_named("task-clock").unwrap();
    let bp_code = set.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    let bp = set.index_of(bp_code).unwrap();
    let id = set.id();
    let calls = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let (c, b) = (calls.clone(), bad.clone());
    let handler: OverflowHandler = Arc::new(move |info| {
        c.fetch_add(1, Ordering::Relaxed);
        let idx: Vec<usize> = overflow_event_indices(info.vector).collect();
        if info.address != fa || info.event_set != id || idx != [bp] || info.context == 0 {
            b.fetch_add(1, Ordering::Relaxed);
        }
    });
    // By code, as PAPI_overflow takes it.
    set.overflow(bp_code, 1, OVERFLOW_HARDWARE, handler).unwrap();
    assert_eq!(set.status().bits(), 0x1 | 0x10, "stopped and overflowing");
    assert_eq!((set.descriptors(), fd_count()), (2, fds + 2), "one descriptor per event, sampling or not");
    set.start().unwrap();
    assert_eq!(set.status().bits(), 0x2 | 0x10);
    let mut x = 0;
    for i in 0..400 {
        x ^= f(i);
    }
    let mid = set.read().unwrap();
    for i in 400..1000 {
        x ^= f(i);
    }
    let values = set.stop().unwrap();
    black_box(x);
    assert_eq!(calls.load(Ordering::Relaxed), 1000, "{:?}", set.overflow_stats(bp));
    assert_eq!(bad.load(Ordering::Relaxed), 0);
    assert_eq!(mid[bp], 400, "read while running counts the sampling event");
    assert_eq!(values[bp], 1000, "the sampling event's count is the counter");
    assert!(values[0] > 0, "the non-overflowing event counts too");
    let stats = set.overflow_stats(bp).unwrap();
    assert_eq!((stats.ring.samples, stats.ring.lost), (1000, 0));
    // A restart zeroes the values; the handler keeps counting.
    set.start().unwrap();
    for i in 0..10 {
        black_box(f(i));
    }
    assert_eq!(set.stop().unwrap()[bp], 10);
    assert_eq!(calls.load(Ordering::Relaxed), 1010);
    drop(set);
    assert_eq!(fd_count(), fds, "dropping the set closes every descriptor");
}

#[test]
fn acceptance_2_task_clock_profil_puts_samples_in_the_busy_function() {
    let _g = serial();
    let syms = ProcessSymbols::current().unwrap();
    let func = syms.resolve(addr_of(busy)).expect("test binaries keep their symbol table");
    let mut set = lib().event_set();
    set.add_named("task-clock").unwrap();
    // One 16-bit bucket per 4 bytes of the function; by name this time.
    let profile = set
        .profil("task-clock", Region::covering(func.range.clone(), 4).unwrap(), 1_000_000, ProfilFlags::POSIX)
        .unwrap()
        .expect("a non-zero threshold profiles");
    assert_eq!(set.status().bits(), 0x1 | 0x10 | 0x20, "profiling implies overflowing, as in PAPI");
    set.start().unwrap();
    busy(200);
    let values = set.stop().unwrap();
    let samples = profile.samples();
    let inside: u64 = profile.buckets(0).unwrap().iter().sum();
    eprintln!(
        "{}: {:#x?}, task-clock {} ns, {samples} samples, {inside} in the function, {} outside, stats {:?}",
        func.name,
        func.range,
        values[0],
        profile.outside(),
        set.overflow_stats(0usize)
    );
    assert!(samples >= 180, "{samples} samples over 200 ms of CPU at 1 ms");
    assert!(inside * 100 >= samples * 95, "{inside} of {samples} in {}", func.name);
    // Sampling does not pause or reset the count: it holds every sampled period.
    assert!(samples <= values[0] as u64 / 1_000_000 + 1, "{samples} samples, {} ns of task-clock", values[0]);
}

#[test]
fn sprofil_splits_samples_between_two_functions() {
    let _g = serial();
    let syms = ProcessSymbols::current().unwrap();
    let a = syms.resolve(addr_of(busy)).unwrap().range;
    let b = syms.resolve(addr_of(busy_other)).unwrap().range;
    let mut set = lib().event_set();
    let tc = set.add_named("task-clock").unwrap();
    let regions = vec![Region::covering(a, 16).unwrap(), Region::covering(b, 16).unwrap()];
    let profile = set.sprofil(tc, regions, 1_000_000, ProfilFlags::BUCKET_32).unwrap().unwrap();
    set.start().unwrap();
    busy(60);
    busy_other(30);
    set.stop().unwrap();
    let in_a: u64 = profile.buckets(0).unwrap().iter().sum();
    let in_b: u64 = profile.buckets(1).unwrap().iter().sum();
    eprintln!("busy {in_a}, busy_other {in_b}, outside {}", profile.outside());
    assert!(in_a >= 45 && in_b >= 20, "{in_a} / {in_b}");
    assert!(in_a > in_b, "twice the CPU time, about twice the samples");
    assert!(set.sprofil(tc, vec![], 0, ProfilFlags::POSIX).unwrap().is_none(), "threshold 0: off");
    assert_eq!(set.status().bits(), 0x1);
}

/// A large zeroed block from the allocator is a fresh anonymous mapping
/// (calloc skips zeroing what mmap already zeroed): pages fault when written.
#[inline(never)]
fn touch_fresh_pages(pages: usize) -> usize {
    let page = papirus_substrate::mmap::page_size();
    let mut v = vec![0u8; pages * page];
    let mut i = 0;
    while i < v.len() {
        v[i] = 1;
        i += page;
    }
    black_box(v.len())
}

#[test]
fn acceptance_3_page_faults_threshold_100_over_10000_touches() {
    let _g = serial();
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[always]") {
        eprintln!(
            "skipped: transparent_hugepage is `always` ({}), fresh memory faults in 2 MiB steps",
            thp.trim()
        );
        return;
    }
    let mut set = lib().event_set();
    // page-faults beside a counting event; the counting core's layout keeps
    // the clock apart from events read by read(2), so two groups.
    set.add_all(["task-clock", "page-faults"]).unwrap();
    let overflows = Arc::new(AtomicU64::new(0));
    set.overflow("page-faults", 100, 0, counter(&overflows)).unwrap();
    assert_eq!(set.overflow_threshold("page-faults").unwrap(), 100);
    assert_eq!(set.groups(), 2);
    set.start().unwrap();
    touch_fresh_pages(10_000);
    let values = set.stop().unwrap();
    let n = overflows.load(Ordering::Relaxed);
    eprintln!("{} page faults, {n} overflows, task-clock {} ns", values[1], values[0]);
    assert!((98..=102).contains(&n), "{n} overflows");
    assert_eq!(n, values[1] as u64 / 100, "the set's count is the sampling event's");
}

#[test]
fn acceptance_4_two_threads_each_get_their_own_signals() {
    let _g = serial();
    let lib = lib();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let lib = lib.clone();
            std::thread::spawn(move || {
                let owner = gettid();
                let mut set = lib.event_set();
                let id = set.id();
                let tc = set.add_named("task-clock").unwrap();
                let (mine, foreign) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
                let (m, fo) = (mine.clone(), foreign.clone());
                set.overflow(
                    tc,
                    1_000_000,
                    0,
                    Arc::new(move |info| {
                        if gettid() == owner && info.tid == owner && info.event_set == id {
                            m.fetch_add(1, Ordering::Relaxed);
                        } else {
                            fo.fetch_add(1, Ordering::Relaxed);
                        }
                    }),
                )
                .unwrap();
                set.start().unwrap();
                busy(80);
                set.stop().unwrap();
                (mine.load(Ordering::Relaxed), foreign.load(Ordering::Relaxed))
            })
        })
        .collect();
    for t in threads {
        let (mine, foreign) = t.join().unwrap();
        eprintln!("{mine} on the owner, {foreign} elsewhere");
        assert!(mine >= 60, "{mine} overflows in 80 ms of CPU at 1 ms");
        assert_eq!(foreign, 0);
    }
}

#[test]
fn deferred_mode_queues_every_overflow_for_a_normal_thread() {
    let _g = serial();
    let fa = addr_of(f);
    let queue = Arc::new(SampleQueue::new(4096));
    let mut set = lib().event_set();
    let bp = set.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    set.overflow_deferred(bp, 1, queue.clone()).unwrap();
    let id = set.id();
    let q = queue.clone();
    let drainer = std::thread::spawn(move || {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.len() < 500 && std::time::Instant::now() < deadline {
            match q.pop() {
                Some(i) => got.push(i),
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        got
    });
    set.start().unwrap();
    for i in 0..500 {
        black_box(f(i));
    }
    set.stop().unwrap();
    let got = drainer.join().unwrap();
    assert_eq!(got.len(), 500);
    assert!(got.iter().all(|i| i.address == fa && i.vector == 1 && i.event_set == id));
    assert_eq!(queue.dropped(), 0);
    assert!(queue.pop().is_none());
}

fn code<T: std::fmt::Debug>(r: papirus_lowlevel::Result<T>) -> Code {
    r.expect_err("expected an error").code()
}

#[test]
fn papi_rules_for_overflow_on_an_event_set() {
    let _g = serial();
    let fa = addr_of(f);
    let mut set: EventSet = lib().event_set();
    let fds = fd_count();
    let tc = set.add_named("task-clock").unwrap();
    let bp = set.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    let n = Arc::new(AtomicU64::new(0));
    let e = set.overflow("page-faults", 100, 0, counter(&n)).unwrap_err();
    assert_eq!(e.code(), Code::Enoevnt, "{e}");
    assert!(e.to_string().contains("task-clock"), "the message lists the set's events: {e}");
    assert_eq!(code(set.overflow(7usize, 100, 0, counter(&n))), Code::Enoevnt, "no event #7");
    assert_eq!(code(set.overflow(tc, 1_000, 0, counter(&n))), Code::Einval, "1 µs clock period");
    assert_eq!(code(set.overflow(tc, 1_000_000, 0x1, counter(&n))), Code::Einval, "unknown flag");
    assert_eq!(
        code(set.overflow(tc, 1_000_000, papirus_lowlevel::overflow::OVERFLOW_FORCE_SW, counter(&n))),
        Code::Enosupp
    );
    assert_eq!(set.status().bits(), 0x1, "refused requests change nothing");

    set.overflow(bp, 1, 0, counter(&n)).unwrap();
    set.start().unwrap();
    assert_eq!(code(set.overflow(bp, 2, 0, counter(&n))), Code::Eisrun);
    assert_eq!(code(set.overflow(bp, 0, 0, counter(&n))), Code::Eisrun, "not even to turn it off");
    assert_eq!(code(set.set_overflow_signal(libc::SIGRTMAX() - 4)), Code::Eisrun);
    for i in 0..5 {
        black_box(f(i));
    }
    assert_eq!(set.stop().unwrap()[1], 5);
    assert_eq!(n.load(Ordering::Relaxed), 5);

    // Options that would send the samples elsewhere are refused while overflowing.
    let me = std::process::id() as i32;
    assert_eq!(code(set.attach(me)), Code::Einval);
    assert_eq!(code(set.set_granularity(Granularity::Process)), Code::Ecombo);
    set.set_cpu(Some(0)).unwrap();
    assert_eq!(code(set.set_granularity(Granularity::System)), Code::Einval);
    set.set_cpu(None).unwrap();
    assert_eq!(set.status().bits(), 0x1 | 0x10, "still overflowing after the refusals");
    assert_eq!(code(set.set_overflow_signal(libc::SIGUSR1)), Code::Einval, "not a real-time signal");
    set.set_overflow_signal(libc::SIGRTMAX() - 4).unwrap();
    assert_eq!(set.overflow_signal(), libc::SIGRTMAX() - 4);
    set.start().unwrap();
    black_box(f(1));
    set.stop().unwrap();
    assert_eq!(n.load(Ordering::Relaxed), 6, "delivered on the new signal");

    // Threshold 0 turns it off: the event counts again, no handler call.
    set.overflow(bp, 0, 0, counter(&n)).unwrap();
    assert_eq!((set.status().bits(), set.overflow_threshold(bp).unwrap()), (0x1, 0));
    assert!(set.overflow_stats(bp).is_none());
    set.start().unwrap();
    for i in 0..3 {
        black_box(f(i));
    }
    assert_eq!(set.stop().unwrap()[1], 3);
    assert_eq!(n.load(Ordering::Relaxed), 6);
    assert_eq!(fd_count(), fds + 2, "toggling overflow neither leaks nor duplicates descriptors");

    // The other way round: a set attached or inheriting cannot overflow.
    set.attach(me).unwrap();
    assert_eq!(code(set.overflow(bp, 1, 0, counter(&n))), Code::Einval);
    set.detach().unwrap();
    set.set_granularity(Granularity::Process).unwrap();
    assert_eq!(code(set.overflow(bp, 1, 0, counter(&n))), Code::Ecombo);
    assert_eq!(set.status().bits(), 0x1);
    drop(set);
    assert_eq!(fd_count(), fds);
}

#[test]
fn several_overflowing_events_in_one_set_report_their_own_index() {
    let _g = serial();
    let (fa, ga) = (addr_of(f), addr_of(g));
    let mut set = lib().event_set();
    // page-faults first: the set still counts the breakpoints (they get a
    // group of their own; in one led by page-faults they would read 0).
    set.add_named("page-faults").unwrap();
    let ef = set.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    let eg = set.add_named(&format!("mem:{ga:#x}:x")).unwrap();
    let (on_f, on_g, bad) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (cf, cg, b) = (on_f.clone(), on_g.clone(), bad.clone());
    let handler: OverflowHandler = Arc::new(move |info| {
        match (overflow_event_indices(info.vector).collect::<Vec<_>>().as_slice(), info.address) {
            ([1], a) if a == fa => cf.fetch_add(1, Ordering::Relaxed),
            ([2], a) if a == ga => cg.fetch_add(1, Ordering::Relaxed),
            _ => b.fetch_add(1, Ordering::Relaxed),
        };
    });
    set.overflow(ef, 1, 0, handler.clone()).unwrap();
    set.overflow(eg, 2, 0, handler).unwrap();
    assert_eq!((set.descriptors(), set.groups()), (3, 2));
    set.start().unwrap();
    for i in 0..100 {
        black_box(f(i));
        black_box(g(i));
        black_box(g(i));
    }
    touch_fresh_pages(1000);
    let v = set.stop().unwrap();
    eprintln!("values {v:?}");
    assert_eq!((v[1], v[2]), (100, 200));
    assert!(v[0] > 0, "page-faults counts beside the breakpoints");
    assert_eq!(
        (on_f.load(Ordering::Relaxed), on_g.load(Ordering::Relaxed), bad.load(Ordering::Relaxed)),
        (100, 100, 0)
    );
}

#[test]
fn a_multiplexed_set_overflows_too() {
    let _g = serial();
    let fa = addr_of(f);
    let mut set = lib().event_set();
    set.set_multiplex(true).unwrap();
    set.add_named("task-clock").unwrap();
    let bp = set.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    let n = Arc::new(AtomicU64::new(0));
    set.overflow(bp, 10, 0, counter(&n)).unwrap();
    assert_eq!(set.status().bits(), 0x1 | 0x10 | 0x40);
    assert_eq!((set.groups(), set.descriptors()), (2, 2));
    set.start().unwrap();
    for i in 0..1000 {
        black_box(f(i));
    }
    let v = set.read_detailed().unwrap();
    set.stop().unwrap();
    assert_eq!(v[1].raw, 1000);
    assert_eq!(v[1].time_enabled, v[1].time_running, "software events are never rotated out");
    assert_eq!(n.load(Ordering::Relaxed), 100, "one overflow per 10 hits");
}
