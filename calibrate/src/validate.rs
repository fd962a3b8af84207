//! `--validate`: counts of known workloads against what they must be.
//!
//! Each check returns a [`Check`]: PASS or FAIL with the measured and the
//! expected value, or SKIP with the reason the event cannot be opened here
//! (the kernel's own, through the substrate's error). Checks that compare
//! two clocks repeat a few times and keep the best run: a shared VM loses
//! whole milliseconds to the host now and then, which is noise, not error.

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use papirus_substrate::clock::clock;
use papirus_substrate::elf::ElfFile;
use papirus_substrate::vclock::{self, ERROR_BOUND};
use papirus_substrate::{Counter, Target, parse_event, sys};

use crate::costfile::{Check, Outcome};
use crate::measure::Stats;

/// Sizes of the workloads.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Calls of the probed function (breakpoint and uprobe checks).
    pub calls: u64,
    /// Fresh pages touched.
    pub pages: usize,
    /// write(2) calls.
    pub writes: u64,
    /// Busy time of the task-clock check.
    pub busy: Duration,
    /// Intervals of the real-time check, and their length.
    pub intervals: usize,
    /// Length of one real-time interval.
    pub interval: Duration,
    /// Bracketed reads of the virtual-time check.
    pub vreads: usize,
}

impl Sizes {
    /// The default sizes.
    pub const DEFAULT: Sizes = Sizes {
        calls: 10_000,
        pages: 4096,
        writes: 10_000,
        busy: Duration::from_millis(100),
        intervals: 20,
        interval: Duration::from_millis(20),
        vreads: 20_000,
    };
    /// The `--quick` sizes.
    pub const QUICK: Sizes = Sizes {
        calls: 1_000,
        pages: 1024,
        writes: 1_000,
        busy: Duration::from_millis(30),
        intervals: 10,
        interval: Duration::from_millis(10),
        vreads: 5_000,
    };
}

/// Runs every check, calling `progress` after each.
pub fn run(sizes: Sizes, mut progress: impl FnMut(&Check)) -> Vec<Check> {
    let checks: [fn(Sizes) -> Check; 12] = [
        breakpoint_hits,
        uprobe_hits,
        page_faults,
        task_clock,
        write_tracepoint,
        real_time,
        virtual_time,
        instructions,
        fp_inner,
        fp_matvec,
        fp_matmat,
        branches,
    ];
    checks
        .iter()
        .map(|c| {
            let r = c(sizes);
            progress(&r);
            r
        })
        .collect()
}

fn check(name: &str, outcome: Outcome, detail: String) -> Check {
    Check { name: name.into(), outcome, detail }
}

fn pass_if(name: &str, ok: bool, detail: String) -> Check {
    check(name, if ok { Outcome::Pass } else { Outcome::Fail }, detail)
}

/// Opens `event` on this thread, or the SKIP line saying why not.
fn open(name: &str, event: &str) -> Result<Counter, Check> {
    let skip = |why: String| check(name, Outcome::Skip, format!("{event}: {why}"));
    let attr = parse_event(event).map_err(|e| skip(e.to_string()))?;
    attr.open(Target::ThisThread).map_err(|e| skip(e.to_string()))
}

/// Counts `event` over `work`, or the FAIL line of a kernel error after a
/// successful open (those are not expected).
fn count(name: &str, c: &Counter, work: impl FnOnce()) -> Result<u64, Check> {
    let fail = |e: papirus_substrate::Error| check(name, Outcome::Fail, e.to_string());
    c.reset().map_err(fail)?;
    c.enable().map_err(fail)?;
    work();
    c.disable().map_err(fail)?;
    Ok(c.read().map_err(fail)?.raw)
}

/// The function the breakpoint and uprobe checks count calls of. Its body
/// is its own, so the linker cannot fold it into another function.
#[inline(never)]
pub fn calibrate_probe_target(x: u64) -> u64 {
    black_box(x).rotate_left(13) ^ 0x70a9_17c4_1b5e_d3f1
}

fn call_target(n: u64) {
    let f: fn(u64) -> u64 = black_box(calibrate_probe_target);
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(f(i));
    }
    black_box(acc);
}

/// Exact execution-breakpoint hits on the target function.
pub fn breakpoint_hits(s: Sizes) -> Check {
    const NAME: &str = "breakpoint hits (mem:ADDR:x) of a function called N times";
    let addr = calibrate_probe_target as fn(u64) -> u64 as usize;
    let c = match open(NAME, &format!("mem:{addr:#x}:x")) {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    match count(NAME, &c, || call_target(s.calls)) {
        Ok(n) => pass_if(NAME, n == s.calls, format!("{n} hits for {} calls (exact)", s.calls)),
        Err(fail) => fail,
    }
}

/// The stored (mangled) name of [`calibrate_probe_target`] in this executable.
fn target_symbol(exe: &std::path::Path) -> Result<String, String> {
    let elf = ElfFile::open(exe).map_err(|e| e.to_string())?;
    let found: Vec<&str> =
        elf.functions().map(|s| s.name.as_str()).filter(|n| n.contains("calibrate_probe_target")).collect();
    match found.as_slice() {
        [one] => Ok(one.to_string()),
        [] if elf.is_stripped() => Err(format!("{} is stripped: no symbol to probe", exe.display())),
        [] => Err(format!("no calibrate_probe_target symbol in {}", exe.display())),
        many => Err(format!("{} symbols match calibrate_probe_target: {many:?}", many.len())),
    }
}

/// Exact uprobe hits on the target function.
pub fn uprobe_hits(s: Sizes) -> Check {
    const NAME: &str = "uprobe hits (uprobe:EXE:SYMBOL) of a function called N times";
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return check(NAME, Outcome::Skip, format!("the executable's path is unknown: {e}")),
    };
    let sym = match target_symbol(&exe) {
        Ok(s) => s,
        Err(why) => return check(NAME, Outcome::Skip, why),
    };
    let c = match open(NAME, &format!("uprobe:{}:{sym}", exe.display())) {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    match count(NAME, &c, || call_target(s.calls)) {
        Ok(n) => pass_if(NAME, n == s.calls, format!("{n} hits for {} calls of {sym} (exact)", s.calls)),
        Err(fail) => fail,
    }
}

/// Page faults of K fresh anonymous pages: at least K, at most K plus a
/// little (the loop's own stack and code may fault once or twice).
pub fn page_faults(s: Sizes) -> Check {
    const NAME: &str = "page-faults of K fresh pages";
    let c = match open(NAME, "page-faults") {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    let page = papirus_substrate::mmap::page_size();
    let mut map = match memmap2::MmapMut::map_anon(s.pages * page) {
        Ok(m) => m,
        Err(e) => {
            return check(NAME, Outcome::Fail, format!("anonymous mmap of {} pages failed: {e}", s.pages));
        }
    };
    // Keep the kernel from backing the range with huge pages (one fault per 2 MiB).
    let _ = map.advise(memmap2::Advice::NoHugePage);
    let n = match count(NAME, &c, || {
        for i in 0..s.pages {
            map[i * page] = 1;
        }
        black_box(&map);
    }) {
        Ok(n) => n,
        Err(fail) => return fail,
    };
    let k = s.pages as u64;
    let slack = (k / 100).max(16);
    pass_if(
        NAME,
        (k..=k + slack).contains(&n),
        format!("{n} faults for {k} pages (expected {k}..={})", k + slack),
    )
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        black_box(0);
    }
}

/// task-clock against CLOCK_THREAD_CPUTIME_ID over a busy loop.
pub fn task_clock(s: Sizes) -> Check {
    const NAME: &str = "task-clock vs CLOCK_THREAD_CPUTIME_ID over a busy loop";
    const TOLERANCE: f64 = 0.02;
    let c = match open(NAME, "task-clock") {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    let mut best: Option<(f64, u64, u64)> = None;
    for _ in 0..3 {
        let mut cpu = (0, 0);
        let tc = match count(NAME, &c, || {
            cpu.0 = sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0);
            spin(s.busy);
            cpu.1 = sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0);
        }) {
            Ok(n) => n,
            Err(fail) => return fail,
        };
        let ct = cpu.1.saturating_sub(cpu.0);
        let err = (tc as f64 - ct as f64).abs() / (ct.max(1) as f64);
        if best.is_none_or(|b| err < b.0) {
            best = Some((err, tc, ct));
        }
        if err <= TOLERANCE / 4.0 {
            break;
        }
    }
    let Some((err, tc, ct)) = best else {
        return check(NAME, Outcome::Fail, "no run completed".into());
    };
    pass_if(
        NAME,
        err <= TOLERANCE,
        format!(
            "task-clock {:.3} ms, CLOCK_THREAD_CPUTIME_ID {:.3} ms: {:.3} % apart (tolerance {:.0} %, best of up to 3 runs)",
            tc as f64 / 1e6,
            ct as f64 / 1e6,
            err * 100.0,
            TOLERANCE * 100.0
        ),
    )
}

/// Exact syscalls:sys_enter_write hits for N writes.
pub fn write_tracepoint(s: Sizes) -> Check {
    const NAME: &str = "syscalls:sys_enter_write for N write(2) calls";
    let c = match open(NAME, "syscalls:sys_enter_write") {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    let mut null = match std::fs::OpenOptions::new().write(true).open("/dev/null") {
        Ok(f) => f,
        Err(e) => return check(NAME, Outcome::Fail, format!("/dev/null: {e}")),
    };
    let mut failed = 0u64;
    let n = match count(NAME, &c, || {
        for _ in 0..s.writes {
            // One write(2) each: a File is unbuffered.
            if null.write(b"x").is_err() {
                failed += 1;
            }
        }
    }) {
        Ok(n) => n,
        Err(fail) => return fail,
    };
    pass_if(
        NAME,
        n == s.writes,
        format!("{n} sys_enter_write for {} write calls ({failed} returned an error; exact)", s.writes),
    )
}

fn stats_line(v: &mut [f64], unit: &str) -> String {
    match Stats::of(v) {
        Some(s) => {
            format!("min {:.2} / median {:.2} / p99 {:.2} / max {:.2} {unit}", s.min, s.median, s.p99, s.max)
        }
        None => "no samples".into(),
    }
}

/// One reading of papirus' real time bracketed by CLOCK_MONOTONIC_RAW,
/// the tightest of a few tries: `(papirus ns, raw midpoint ns)`.
fn paired() -> (f64, f64) {
    let c = clock();
    let mut best = (f64::INFINITY, 0.0, 0.0);
    for _ in 0..8 {
        let r0 = sys::clock_gettime(libc::CLOCK_MONOTONIC_RAW).unwrap_or(0);
        let t = c.now();
        let r1 = sys::clock_gettime(libc::CLOCK_MONOTONIC_RAW).unwrap_or(0);
        let w = r1.saturating_sub(r0) as f64;
        if w < best.0 {
            best = (w, t as f64, r0 as f64 + w / 2.0);
        }
    }
    (best.1, best.2)
}

/// papirus' TSC real time against CLOCK_MONOTONIC_RAW over many intervals.
pub fn real_time(s: Sizes) -> Check {
    const NAME: &str = "TSC real time vs CLOCK_MONOTONIC_RAW";
    const TOLERANCE_PPM: f64 = 100.0;
    let c = clock();
    if !c.is_tsc() {
        return check(
            NAME,
            Outcome::Skip,
            format!("real time is not read from the TSC here: {:?}", c.info().source),
        );
    }
    let mut best: Option<(f64, Vec<f64>, Vec<f64>)> = None;
    for _ in 0..3 {
        let mut ppm = Vec::with_capacity(s.intervals);
        let mut offset_us = Vec::with_capacity(s.intervals + 1);
        let (mut t0, mut r0) = paired();
        offset_us.push((t0 - r0) / 1e3);
        for i in 0..s.intervals {
            // Alternate busy and sleeping intervals: the TSC must not care.
            if i % 2 == 0 {
                spin(s.interval);
            } else {
                std::thread::sleep(s.interval);
            }
            let (t1, r1) = paired();
            ppm.push(((t1 - t0) - (r1 - r0)) / (r1 - r0) * 1e6);
            offset_us.push((t1 - r1) / 1e3);
            (t0, r0) = (t1, r1);
        }
        let worst = ppm.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        if best.as_ref().is_none_or(|b| worst < b.0) {
            best = Some((worst, ppm, offset_us));
        }
        if worst <= TOLERANCE_PPM / 4.0 {
            break;
        }
    }
    let Some((worst, mut ppm, mut off)) = best else {
        return check(NAME, Outcome::Fail, "no run completed".into());
    };
    pass_if(
        NAME,
        worst <= TOLERANCE_PPM,
        format!(
            "rate error over {} intervals of {} ms: {}; offset from MONOTONIC_RAW: {} (tolerance {TOLERANCE_PPM} ppm per interval, best of up to 3 runs)",
            ppm.len(),
            s.interval.as_millis(),
            stats_line(&mut ppm, "ppm"),
            stats_line(&mut off, "us"),
        ),
    )
}

/// papirus' virtual time against CLOCK_THREAD_CPUTIME_ID: each read is
/// bracketed by two syscalls; its error is its distance outside the bracket.
pub fn virtual_time(s: Sizes) -> Check {
    const NAME: &str = "virtual time vs CLOCK_THREAD_CPUTIME_ID (error outside the syscall bracket)";
    let method = vclock::thread_method();
    let syscall = || sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0);
    let mut best: Option<(f64, Vec<f64>, usize)> = None;
    for _ in 0..3 {
        let mut err = Vec::with_capacity(s.vreads);
        let mut inside = 0;
        for i in 0..s.vreads {
            // Work between reads, and now and then a sleep, so the reader
            // extrapolates, crosses its sync interval and sees context switches.
            match i % 500 {
                0 => std::thread::sleep(Duration::from_micros(50)),
                250 => std::thread::yield_now(),
                _ => spin(Duration::from_micros(2)),
            }
            let c0 = syscall();
            let v = vclock::thread_cpu_ns();
            let c1 = syscall();
            let e = if v < c0 {
                -((c0 - v) as f64)
            } else if v > c1 {
                (v - c1) as f64
            } else {
                inside += 1;
                0.0
            };
            err.push(e / 1e3);
        }
        let worst = err.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        if best.as_ref().is_none_or(|b| worst < b.0) {
            best = Some((worst, err, inside));
        }
        if worst * 1e3 <= ERROR_BOUND.as_nanos() as f64 / 4.0 {
            break;
        }
    }
    let Some((worst, mut err, inside)) = best else {
        return check(NAME, Outcome::Fail, "no run completed".into());
    };
    let n = err.len();
    pass_if(
        NAME,
        worst * 1e3 <= ERROR_BOUND.as_nanos() as f64,
        format!(
            "method {method:?}; {n} reads, {:.2} % inside the bracket; error {} (bound {} us, best of up to 3 runs)",
            100.0 * inside as f64 / n.max(1) as f64,
            stats_line(&mut err, "us"),
            ERROR_BOUND.as_micros(),
        ),
    )
}

fn work_loop(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..black_box(n) {
        acc = black_box(acc.wrapping_mul(31).wrapping_add(i));
    }
    acc
}

fn branchy_loop(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..black_box(n) {
        // Taken on two iterations of every three: a fixed pattern.
        if black_box(i % 3) != 0 {
            acc = acc.wrapping_add(i);
        } else {
            acc ^= i;
        }
    }
    black_box(acc)
}

/// Counts of `loop_fn(n)`, `loop_fn(2n)`, `loop_fn(4n)`: the count per
/// `period` iterations (the loop body's pattern repeats every `period`;
/// `n` is a multiple of it) must be a whole number and the same for both
/// doublings, within 1 %. The loop's fixed setup cancels in the differences.
fn linear_check(name: &str, event: &str, loop_fn: fn(u64) -> u64, n: u64, period: u64) -> Check {
    let c = match open(name, event) {
        Ok(c) => c,
        Err(skip) => return skip,
    };
    let mut counts = [0u64; 3];
    for (k, slot) in counts.iter_mut().enumerate() {
        match count(name, &c, || {
            black_box(loop_fn(n << k));
        }) {
            Ok(v) => *slot = v,
            Err(fail) => return fail,
        }
    }
    let (ok, d1, d2) = linear_verdict(counts, n, period);
    pass_if(
        name,
        ok,
        format!(
            "{event}: {} / {} / {} for {n} / {} / {} iterations: {d1:.3} and {d2:.3} per {period} iteration(s) (expected the same whole number within 1 %)",
            counts[0],
            counts[1],
            counts[2],
            2 * n,
            4 * n
        ),
    )
}

/// Whether counts of n, 2n and 4n iterations grow by the same whole number
/// per `period` iterations (1 %); also the two per-period increments.
fn linear_verdict(counts: [u64; 3], n: u64, period: u64) -> (bool, f64, f64) {
    let p = period as f64;
    let d1 = counts[1].saturating_sub(counts[0]) as f64 / n as f64 * p;
    let d2 = counts[2].saturating_sub(counts[1]) as f64 / (2 * n) as f64 * p;
    let whole = d1.round().max(1.0);
    let ok = (d1 - whole).abs() / whole <= 0.01 && (d2 - whole).abs() / whole <= 0.01;
    (ok, d1, d2)
}

/// Instructions of a known loop (needs a hardware PMU).
pub fn instructions(_: Sizes) -> Check {
    linear_check("instructions of a known loop", "instructions:u", work_loop, 1_000_000, 1)
}

/// Branches of a known pattern (needs a hardware PMU).
pub fn branches(_: Sizes) -> Check {
    // The two arms may differ by a jump: whole per 3-iteration period.
    linear_check("branches of a known branch pattern", "branches:u", branchy_loop, 999_999, 3)
}

/// Floating-point operations of `kernel` against `expected` (PAPI_FP_OPS,
/// needs a hardware PMU), within 5 %.
fn fp_check(name: &str, expected: u64, kernel: impl FnOnce() -> f64) -> Check {
    const TOLERANCE: f64 = 0.05;
    let lib = match papirus_lowlevel::init() {
        Ok(l) => l,
        Err(e) => return check(name, Outcome::Skip, format!("papirus-lowlevel: {e}")),
    };
    let mut set = lib.event_set();
    if let Err(e) = set.add_named("PAPI_FP_OPS") {
        return check(name, Outcome::Skip, format!("PAPI_FP_OPS: {e}"));
    }
    let mut v = [0i64];
    let r = set.start().and_then(|()| {
        black_box(kernel());
        set.stop_into(&mut v)
    });
    if let Err(e) = r {
        return check(name, Outcome::Fail, format!("PAPI_FP_OPS: {e}"));
    }
    let got = v[0].max(0) as u64;
    let err = relative_error(got, expected);
    pass_if(
        name,
        err <= TOLERANCE,
        format!("PAPI_FP_OPS {got}, expected {expected}: {:.2} % off (tolerance 5 %)", err * 100.0),
    )
}

fn relative_error(got: u64, expected: u64) -> f64 {
    (got as f64 - expected as f64).abs() / (expected.max(1) as f64)
}

fn vector(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| seed + i as f64 * 1e-3).collect()
}

/// Inner product of length n: 2n operations.
pub fn fp_inner(_: Sizes) -> Check {
    let n = 1_000_000;
    let (x, y) = (vector(n, 1.0), vector(n, 2.0));
    fp_check("FP ops of an inner product (2n)", 2 * n as u64, || {
        let mut s = 0.0;
        for i in 0..n {
            s += black_box(x[i]) * y[i];
        }
        s
    })
}

/// Matrix-vector product of order n: 2n² operations.
pub fn fp_matvec(_: Sizes) -> Check {
    let n = 1000;
    let (a, x) = (vector(n * n, 1.0), vector(n, 2.0));
    fp_check("FP ops of a matrix-vector product (2n^2)", 2 * (n * n) as u64, || {
        let mut y = vec![0.0; n];
        for i in 0..n {
            let mut s = 0.0;
            for j in 0..n {
                s += black_box(a[i * n + j]) * x[j];
            }
            y[i] = s;
        }
        y[n - 1]
    })
}

/// Matrix-matrix product of order n: 2n³ operations.
pub fn fp_matmat(_: Sizes) -> Check {
    let n = 100;
    let (a, b) = (vector(n * n, 1.0), vector(n * n, 2.0));
    fp_check("FP ops of a matrix-matrix product (2n^3)", 2 * (n * n * n) as u64, || {
        let mut c = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                let mut s = 0.0;
                for k in 0..n {
                    s += black_box(a[i * n + k]) * b[k * n + j];
                }
                c[i * n + j] = s;
            }
        }
        c[0]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_target_is_found_in_the_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let sym = target_symbol(&exe).unwrap();
        assert!(sym.contains("calibrate_probe_target"), "{sym}");
    }

    #[test]
    fn linear_verdicts_without_a_pmu() {
        // 7 per iteration plus 500 of setup: whole and linear.
        let c = |n: u64| 500 + 7 * n;
        assert!(linear_verdict([c(1000), c(2000), c(4000)], 1000, 1).0);
        // 7.5 per iteration is not whole...
        let h = |n: u64| 500 + 15 * n / 2;
        assert!(!linear_verdict([h(1000), h(2000), h(4000)], 1000, 1).0);
        // ...but is per 2-iteration period (an arm with an extra jump).
        assert!(linear_verdict([h(1000), h(2000), h(4000)], 1000, 2).0);
        // Not linear: the second doubling adds 10 % more per iteration.
        let (ok, d1, d2) = linear_verdict([7000, 14000, 29400], 1000, 1);
        assert!(!ok, "{d1} {d2}");
        // Nothing counted is not a pass.
        assert!(!linear_verdict([0, 0, 0], 1000, 1).0);
        assert!(relative_error(2_040_000, 2_000_000) <= 0.05);
        assert!(relative_error(2_200_000, 2_000_000) > 0.05);
    }

    #[test]
    fn breakpoint_count_is_exact_or_skipped_with_a_reason() {
        let c = breakpoint_hits(Sizes::QUICK);
        eprintln!("{c:?}");
        assert_ne!(c.outcome, Outcome::Fail, "{}", c.detail);
        assert!(!c.detail.is_empty());
    }
}
