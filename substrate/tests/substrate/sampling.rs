//! Sampling, ring buffers and overflow signals against the real kernel.
//!
//! Every event used here exists on PMU-less machines: breakpoints (type 5)
//! and software events (task-clock, page-faults). The tests run
//! beside each other but never beside a timing check ([`shared`]).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use papirus_substrate::attr::consts::PERF_TYPE_BREAKPOINT;
use papirus_substrate::sample::{ReadFormat, Record, SampleType, Sampler, Sampling};
use papirus_substrate::signal::{Notifier, default_signal, gettid};
use papirus_substrate::{EventAttr, Kind};

use crate::util::{shared, software};

const HW_BREAKPOINT_X: u32 = 4;
const SW_TASK_CLOCK: u64 = 1;
const SW_PAGE_FAULTS: u64 = 2;

fn breakpoint(addr: usize) -> EventAttr {
    let mut a = EventAttr::new(format!("mem:{addr:#x}:x"), Kind::Breakpoint, PERF_TYPE_BREAKPOINT, 0);
    // Execute breakpoints must have bp_len == sizeof(long).
    a.config1(addr as u64).config2(8).bp_type(HW_BREAKPOINT_X);
    a
}

#[inline(never)]
fn target_f(x: u64) -> u64 {
    black_box(x.wrapping_mul(3).wrapping_add(1))
}

/// The calling thread's CPU time, from /proc/thread-self/schedstat.
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Busy work that stays inside this function between rare clock checks.
#[inline(never)]
fn spin_cpu(cpu: Duration) -> u64 {
    let start = thread_cpu();
    let mut acc = 0u64;
    while thread_cpu() - start < cpu {
        for i in 0..200_000u64 {
            acc = black_box(acc.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    acc
}

#[test]
fn breakpoint_threshold_one_calls_handler_once_per_call() {
    let _s = shared();
    let f = target_f as *const () as usize;
    let mut s = Sampling::period(1);
    s.sample_type(SampleType::IP | SampleType::TID);
    let sampler = Sampler::open(&breakpoint(f), &s, 0, -1).expect("breakpoint events exist on x86 Linux");
    let calls = Arc::new(AtomicU64::new(0));
    let wrong_ip = Arc::new(AtomicU64::new(0));
    let (c, w) = (calls.clone(), wrong_ip.clone());
    let n = Notifier::attach(
        sampler,
        default_signal(),
        gettid(),
        Box::new(move |rec, _d| {
            if let Record::Sample(s) = rec {
                c.fetch_add(1, Ordering::Relaxed);
                if s.ip != Some(f as u64) {
                    w.fetch_add(1, Ordering::Relaxed);
                }
            }
        }),
    )
    .unwrap();
    n.events().enable().unwrap();
    let mut x = 0;
    for i in 0..1000 {
        x += target_f(i);
    }
    n.events().disable().unwrap();
    black_box(x);
    assert_eq!(calls.load(Ordering::Relaxed), 1000, "stats: {:?}", n.stats());
    assert_eq!(wrong_ip.load(Ordering::Relaxed), 0);
    assert_eq!(n.events().read_count().unwrap().value, 1000);
    assert_eq!(n.stats().ring.lost, 0);
}

#[test]
fn task_clock_every_ms_gives_about_one_sample_per_ms() {
    let _s = shared();
    let mut s = Sampling::period(1_000_000);
    s.sample_type(SampleType::IP | SampleType::TID | SampleType::TIME | SampleType::PERIOD | SampleType::CPU)
        .data_pages(64)
        .wakeup_events(0);
    let mut sampler = Sampler::open(&software("task-clock", SW_TASK_CLOCK), &s, 0, -1).unwrap();
    sampler.events().enable().unwrap();
    spin_cpu(Duration::from_millis(200));
    sampler.events().disable().unwrap();
    let tid = gettid() as u32;
    let (mut samples, mut other_tid, mut bad_period) = (0, 0, 0);
    sampler.ring().drain(|r| {
        if let Ok(Record::Sample(s)) = r {
            samples += 1;
            other_tid += u32::from(s.pid_tid.map(|p| p.1) != Some(tid));
            bad_period += u32::from(s.period != Some(1_000_000));
        }
    });
    let count = sampler.events().read_count().unwrap().value;
    eprintln!("task-clock {count} ns, {samples} samples, stats {:?}", sampler.stats());
    assert!(samples >= 180, "only {samples} samples over 200 ms of CPU at 1 ms");
    assert!(samples as u64 <= count / 1_000_000 + 1);
    assert_eq!((other_tid, bad_period), (0, 0));
    assert_eq!(sampler.stats().lost, 0);
}

#[test]
fn page_faults_threshold_100_over_10000_touches() {
    let _s = shared();
    const PAGES: usize = 10_000;
    let page = papirus_substrate::mmap::page_size();
    let mut s = Sampling::period(100);
    s.sample_type(SampleType::IP);
    let sampler = Sampler::open(&software("page-faults", SW_PAGE_FAULTS), &s, 0, -1).unwrap();
    let overflows = Arc::new(AtomicU64::new(0));
    let o = overflows.clone();
    let n = Notifier::attach(
        sampler,
        default_signal(),
        gettid(),
        Box::new(move |rec, _| {
            if matches!(rec, Record::Sample(_)) {
                o.fetch_add(1, Ordering::Relaxed);
            }
        }),
    )
    .unwrap();
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[always]") {
        eprintln!(
            "skipped: transparent_hugepage is `always` ({}), so fresh memory faults in 2 MiB steps",
            thp.trim()
        );
        return;
    }
    let mut mem = FreshPages::new(PAGES * page);
    n.events().enable().unwrap();
    mem.touch_every(page);
    n.events().disable().unwrap();
    let faults = n.events().read_count().unwrap().value;
    let got = overflows.load(Ordering::Relaxed);
    eprintln!("page-faults {faults}, overflows {got}, stats {:?}", n.stats());
    assert!((98..=102).contains(&got), "{got} overflows for {faults} faults");
    assert_eq!(got, faults / 100, "one overflow per 100 counted faults");
}

/// A large zeroed block from the allocator: a fresh anonymous mapping
/// (calloc skips zeroing what mmap already zeroed), so each page faults once
/// when first written.
struct FreshPages(Vec<u8>);

impl FreshPages {
    fn new(len: usize) -> Self {
        FreshPages(vec![0; len])
    }
    fn touch_every(&mut self, step: usize) {
        let mut i = 0;
        while i < self.0.len() {
            self.0[i] = 1;
            i += step;
        }
        black_box(&self.0);
    }
}

#[test]
fn each_thread_gets_its_own_overflow_signals() {
    let _s = shared();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                let owner = gettid();
                let mut s = Sampling::period(1_000_000);
                s.sample_type(SampleType::IP | SampleType::TID);
                let sampler = Sampler::open(&software("task-clock", SW_TASK_CLOCK), &s, 0, -1).unwrap();
                let delivered = Arc::new(AtomicU64::new(0));
                let foreign = Arc::new(AtomicU64::new(0));
                let (d, f) = (delivered.clone(), foreign.clone());
                let n = Notifier::attach(
                    sampler,
                    default_signal(),
                    owner,
                    Box::new(move |rec, del| {
                        if matches!(rec, Record::Sample(_)) {
                            d.fetch_add(1, Ordering::Relaxed);
                            if gettid() != owner || del.tid != owner {
                                f.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }),
                )
                .unwrap();
                n.events().enable().unwrap();
                spin_cpu(Duration::from_millis(100));
                n.events().disable().unwrap();
                (delivered.load(Ordering::Relaxed), foreign.load(Ordering::Relaxed), n.stats())
            })
        })
        .collect();
    for h in handles {
        let (delivered, foreign, stats) = h.join().unwrap();
        eprintln!("thread: {delivered} delivered, {foreign} on a foreign thread, {stats:?}");
        assert!(delivered >= 50, "{delivered} samples in 100 ms of CPU at 1 ms");
        assert_eq!(foreign, 0);
    }
}

#[inline(never)]
fn stress_g(x: u64) -> u64 {
    black_box(x ^ 0x5a5a)
}

/// At the kernel's maximum sample rate with a consumer far slower than the
/// producer, every sample is either delivered or reported lost.
///
/// The check that can be exact: a breakpoint on `stress_g` with period 1 is
/// a software-overflow event the kernel never throttles (each hit is a
/// single overflow), so the kernel's own count of hits equals the number of
/// samples it tried to write: delivered + lost must equal it to the unit,
/// and equal the calls we made. For the task-clock sampler at
/// `perf_event_max_sample_rate` the kernel adapts the period and may
/// throttle, so there the check is that the LOST records we surfaced add up
/// exactly to the kernel's own lost counter (`PERF_FORMAT_LOST`).
#[test]
fn stress_at_max_rate_with_slow_consumer_counts_every_loss() {
    let _s = shared();
    let max_rate: u64 = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1000);
    let mut bp_cfg = Sampling::period(1);
    bp_cfg
        .sample_type(SampleType::IP | SampleType::TIME)
        .read_format(ReadFormat::LOST)
        .data_pages(1)
        .wakeup_events(0);
    let mut tc_cfg = Sampling::frequency(max_rate);
    tc_cfg
        .sample_type(SampleType::IP | SampleType::TIME | SampleType::PERIOD)
        .read_format(ReadFormat::LOST)
        .data_pages(1)
        .wakeup_events(0);
    let bp = Sampler::open(&breakpoint(stress_g as *const () as usize), &bp_cfg, 0, -1).unwrap();
    let tc = Sampler::open(&software("task-clock", SW_TASK_CLOCK), &tc_cfg, 0, -1).unwrap();
    let (bp_ev, mut bp_ring) = bp.into_parts();
    let (tc_ev, mut tc_ring) = tc.into_parts();

    let slow = Arc::new(AtomicBool::new(true));
    let s2 = slow.clone();
    let consumer = std::thread::spawn(move || {
        let mut delivered = [0u64; 2];
        loop {
            let slow = s2.load(Ordering::Acquire);
            let mut got = 0;
            for (i, ring) in [&mut bp_ring, &mut tc_ring].into_iter().enumerate() {
                if let Ok(Some(rec)) = ring.next_record() {
                    got += 1;
                    if matches!(rec.record(), Ok(Record::Sample(_))) {
                        delivered[i] += 1;
                    }
                }
            }
            if slow {
                // Deliberately slow: one record per ring every 200 µs.
                std::thread::sleep(Duration::from_micros(200));
            } else if got == 0 {
                return (delivered, bp_ring, tc_ring);
            }
        }
    });

    bp_ev.enable().unwrap();
    tc_ev.enable().unwrap();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_secs(2) {
        for i in 0..1000 {
            black_box(stress_g(i));
        }
        calls += 1000;
    }
    bp_ev.disable().unwrap();
    tc_ev.disable().unwrap();
    slow.store(false, Ordering::Release);
    let (mut delivered, mut bp_ring, mut tc_ring) = consumer.join().unwrap();

    // The kernel reports pending losses in a LOST record ahead of the next
    // record it writes: produce a few more samples on each now that the
    // rings are empty, draining in between so the flush itself loses nothing.
    bp_ev.enable().unwrap();
    black_box(stress_g(1));
    calls += 1;
    bp_ev.disable().unwrap();
    let drain = |ring: &mut papirus_substrate::ring::RingBuffer, n: &mut u64| {
        ring.drain(|r| {
            if let Ok(Record::Sample(_)) = r {
                *n += 1;
            }
        });
    };
    drain(&mut bp_ring, &mut delivered[0]);
    drain(&mut tc_ring, &mut delivered[1]);
    // Each burst must fit the one-page ring (about 100 samples at the
    // maximum rate), or it loses samples of its own: spin in small steps.
    for _ in 0..100 {
        if Some(tc_ring.stats().lost) == tc_ev.read_count().unwrap().lost {
            break;
        }
        tc_ev.enable().unwrap();
        let start = thread_cpu();
        while thread_cpu() - start < Duration::from_micros(200) {
            black_box(stress_g(1));
        }
        tc_ev.disable().unwrap();
        drain(&mut tc_ring, &mut delivered[1]);
    }

    let bp_kernel = bp_ev.read_count().unwrap();
    let tc_kernel = tc_ev.read_count().unwrap();
    let (bs, ts) = (bp_ring.stats(), tc_ring.stats());
    eprintln!(
        "max rate {max_rate} Hz; breakpoint: {calls} calls, kernel count {}, kernel lost {:?}, delivered {}, ring {bs:?}",
        bp_kernel.value, bp_kernel.lost, delivered[0]
    );
    eprintln!(
        "task-clock: {} ns, kernel lost {:?}, delivered {}, ring {ts:?}",
        tc_kernel.value, tc_kernel.lost, delivered[1]
    );
    assert_eq!(bp_kernel.value, calls, "the breakpoint counted every call");
    assert!(bs.lost > 0, "a 1-page ring with a slow consumer must lose samples");
    assert_eq!(delivered[0] + bs.lost, bp_kernel.value, "delivered + lost == kernel's count");
    assert_eq!(Some(bs.lost), bp_kernel.lost, "LOST records == kernel's lost counter");
    assert_eq!(delivered[0], bs.samples);
    assert!(ts.lost > 0 && delivered[1] > 0);
    assert_eq!(Some(ts.lost), tc_kernel.lost, "task-clock LOST records == kernel's lost counter");
    assert_eq!(bs.corrupt_bytes + ts.corrupt_bytes, 0);
}

/// Notifiers attached and dropped while their signals are in flight, on two
/// threads at once (so descriptor numbers get reused across threads): no
/// crash, no callback on a foreign thread, and stale signals are only
/// counted as stray.
#[test]
fn attach_and_detach_under_signal_load() {
    let _s = shared();
    let foreign = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (foreign, delivered) = (foreign.clone(), delivered.clone());
            std::thread::spawn(move || {
                let owner = gettid();
                for _ in 0..20 {
                    let mut s = Sampling::period(50_000);
                    s.sample_type(SampleType::IP);
                    let sampler = Sampler::open(&software("task-clock", SW_TASK_CLOCK), &s, 0, -1).unwrap();
                    let (f, d) = (foreign.clone(), delivered.clone());
                    let n = Notifier::attach(
                        sampler,
                        default_signal(),
                        owner,
                        Box::new(move |_, _| {
                            d.fetch_add(1, Ordering::Relaxed);
                            if gettid() != owner {
                                f.fetch_add(1, Ordering::Relaxed);
                            }
                        }),
                    )
                    .unwrap();
                    n.events().enable().unwrap();
                    spin_cpu(Duration::from_micros(500));
                    drop(n);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "delivered {}, stray so far {}",
        delivered.load(Ordering::Relaxed),
        papirus_substrate::signal::stray_signals()
    );
    assert!(delivered.load(Ordering::Relaxed) > 0);
    assert_eq!(foreign.load(Ordering::Relaxed), 0);
}
