//! PAPI_overflow and PAPI_profil against the real kernel, with events that
//! exist on PMU-less machines (breakpoints, task-clock, page-faults).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use papirus_lowlevel::overflow::{OverflowHandler, OverflowSet, SampleQueue, overflow_event_indices};
use papirus_lowlevel::profil::{ProfilFlags, Region};
use papirus_substrate::signal::gettid;
use papirus_substrate::symbolize::ProcessSymbols;
use papirus_substrate::sys::clock_gettime;

#[inline(never)]
fn f(x: u64) -> u64 {
    black_box(x.rotate_left(7) ^ 0x1234)
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
    let fa = addr_of(f);
    let mut set = OverflowSet::new(7);
    let counter = set.add("task-clock").unwrap();
    let bp = set.add(&format!("mem:{fa:#x}:x")).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let (c, b) = (calls.clone(), bad.clone());
    let handler: OverflowHandler = Arc::new(move |info| {
        c.fetch_add(1, Ordering::Relaxed);
        let idx: Vec<usize> = overflow_event_indices(info.vector).collect();
        if info.address != fa || info.event_set != 7 || idx != [bp] || info.context == 0 {
            b.fetch_add(1, Ordering::Relaxed);
        }
    });
    set.overflow(bp, 1, 0, handler).unwrap();
    set.start().unwrap();
    let mut x = 0;
    for i in 0..1000 {
        x ^= f(i);
    }
    let values = set.stop().unwrap();
    black_box(x);
    assert_eq!(calls.load(Ordering::Relaxed), 1000, "{:?}", set.overflow_stats(bp));
    assert_eq!(bad.load(Ordering::Relaxed), 0);
    assert_eq!(values[bp], 1000);
    assert!(values[counter] > 0, "the non-overflowing event counts too");
    assert_eq!(set.overflow_stats(bp).unwrap().ring.lost, 0);
}

#[test]
fn acceptance_2_task_clock_profil_puts_samples_in_the_busy_function() {
    let syms = ProcessSymbols::current().unwrap();
    let func = syms.resolve(addr_of(busy)).expect("test binaries keep their symbol table");
    let mut set = OverflowSet::new(2);
    let tc = set.add("task-clock").unwrap();
    // One 16-bit bucket per 4 bytes of the function.
    let profile = set
        .profil(tc, Region::covering(func.range.clone(), 4).unwrap(), 1_000_000, ProfilFlags::POSIX)
        .unwrap();
    set.start().unwrap();
    busy(200);
    let values = set.stop().unwrap();
    let samples = profile.samples();
    let inside: u64 = profile.buckets(0).unwrap().iter().sum();
    eprintln!(
        "{}: {:#x?}, task-clock {} ns, {samples} samples, {inside} in the function, {} outside, stats {:?}",
        func.name,
        func.range,
        values[tc],
        profile.outside(),
        set.overflow_stats(tc)
    );
    assert!(samples >= 180, "{samples} samples over 200 ms of CPU at 1 ms");
    assert!(inside * 100 >= samples * 95, "{inside} of {samples} in {}", func.name);
}

#[test]
fn sprofil_splits_samples_between_two_functions() {
    let syms = ProcessSymbols::current().unwrap();
    let a = syms.resolve(addr_of(busy)).unwrap().range;
    let b = syms.resolve(addr_of(busy_other)).unwrap().range;
    let mut set = OverflowSet::new(3);
    let tc = set.add("task-clock").unwrap();
    let regions = vec![Region::covering(a, 16).unwrap(), Region::covering(b, 16).unwrap()];
    let profile = set.sprofil(tc, regions, 1_000_000, ProfilFlags::BUCKET_32).unwrap();
    set.start().unwrap();
    busy(60);
    busy_other(30);
    set.stop().unwrap();
    let in_a: u64 = profile.buckets(0).unwrap().iter().sum();
    let in_b: u64 = profile.buckets(1).unwrap().iter().sum();
    eprintln!("busy {in_a}, busy_other {in_b}, outside {}", profile.outside());
    assert!(in_a >= 45 && in_b >= 20, "{in_a} / {in_b}");
    assert!(in_a > in_b, "twice the CPU time, about twice the samples");
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
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[always]") {
        eprintln!(
            "skipped: transparent_hugepage is `always` ({}), fresh memory faults in 2 MiB steps",
            thp.trim()
        );
        return;
    }
    let mut set = OverflowSet::new(4);
    let pf = set.add("page-faults").unwrap();
    let overflows = Arc::new(AtomicU64::new(0));
    let o = overflows.clone();
    set.overflow(
        pf,
        100,
        0,
        Arc::new(move |_| {
            o.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .unwrap();
    set.start().unwrap();
    touch_fresh_pages(10_000);
    let values = set.stop().unwrap();
    let n = overflows.load(Ordering::Relaxed);
    eprintln!("{} page faults, {n} overflows", values[pf]);
    assert!((98..=102).contains(&n), "{n} overflows");
    assert_eq!(n, values[pf] / 100);
}

#[test]
fn acceptance_4_two_threads_each_get_their_own_signals() {
    let threads: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                let owner = gettid();
                let mut set = OverflowSet::new(10 + t);
                let tc = set.add("task-clock").unwrap();
                let (mine, foreign) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
                let (m, fo) = (mine.clone(), foreign.clone());
                set.overflow(
                    tc,
                    1_000_000,
                    0,
                    Arc::new(move |info| {
                        if gettid() == owner && info.tid == owner && info.event_set == 10 + t {
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
    let fa = addr_of(f);
    let queue = Arc::new(SampleQueue::new(4096));
    let mut set = OverflowSet::new(5);
    let bp = set.add(&format!("mem:{fa:#x}:x")).unwrap();
    set.overflow_deferred(bp, 1, queue.clone()).unwrap();
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
    assert!(got.iter().all(|i| i.address == fa && i.vector == 1 << bp && i.event_set == 5));
    assert_eq!(queue.dropped(), 0);
    assert!(queue.pop().is_none());
}

#[test]
fn overflow_set_from_an_event_set_keeps_positions() {
    let fa = addr_of(f);
    let lib = papirus_lowlevel::init().unwrap();
    let mut es = lib.event_set();
    es.add_named("task-clock").unwrap();
    es.add_named(&format!("mem:{fa:#x}:x")).unwrap();
    let mut set = OverflowSet::from_event_set(&es, 42).unwrap();
    assert_eq!(set.len(), 2);
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    set.overflow(
        1,
        1,
        0,
        Arc::new(move |i| {
            if i.vector == 1 << 1 && i.address == fa && i.event_set == 42 {
                h.fetch_add(1, Ordering::Relaxed);
            }
        }),
    )
    .unwrap();
    set.start().unwrap();
    for i in 0..100 {
        black_box(f(i));
    }
    let v = set.stop().unwrap();
    assert_eq!((hits.load(Ordering::Relaxed), v[1]), (100, 100));
}
