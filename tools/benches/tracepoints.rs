//! papirus-stat counting 500 tracepoints on one command (`true`) against 50
//! in the same run: linear means a ratio near 10 (it was quadratic: every
//! added event reopened the whole set).
//!
//! Closing the last descriptor of a tracepoint makes the kernel wait for
//! RCU grace periods (30-50 ms each on the 6.18 KVM guest, serialised by its
//! event mutex, the same under `perf stat`). This bench holds one descriptor
//! per tracepoint open for its whole run so that wait, which no tool can
//! avoid, stays out of the figures; it prints that wait once, measured on
//! 20 tracepoints, for scale.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

const TOOL: &str = env!("CARGO_BIN_EXE_papirus-stat");

fn syscall_tracepoints(root: &Path, n: usize) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("events/syscalls"))
        .map(|d| d.filter_map(|e| Some(format!("syscalls:{}", e.ok()?.file_name().to_str()?))).collect())
        .unwrap_or_default();
    names.retain(|n| n.contains("sys_e"));
    names.sort();
    names.truncate(n);
    names
}

/// One papirus-stat run counting `list` on `true`.
fn stat(list: &str) -> Duration {
    let t = Instant::now();
    let s = Command::new(TOOL)
        .args(["-x,", "-e", list, "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("papirus-stat runs");
    assert!(s.success(), "papirus-stat -e {} tracepoints failed", list.split(',').count());
    t.elapsed()
}

fn bench(c: &mut Criterion) {
    let root = match papirus_substrate::names::ensure_tracefs() {
        Ok(r) => r,
        Err(why) => return println!("skipped: {why}"),
    };
    let names = syscall_tracepoints(&root, 500);
    if names.len() < 500 {
        return println!("skipped: only {} syscall tracepoints here", names.len());
    }
    // The kernel's wait at close, once, on tracepoints the keeper does not hold.
    let spare = syscall_tracepoints(&root, 520).split_off(500);
    let unheld = stat(&spare.join(","));

    let lib = papirus_lowlevel::init().expect("init");
    let mut keeper = lib.event_set();
    keeper.add_all(names.iter().map(String::as_str)).expect("500 tracepoints open on this thread");
    let (few, many) = (names[..50].join(","), names.join(","));
    let mean = |list: &str, runs: u32| (0..runs).map(|_| stat(list)).sum::<Duration>() / runs;
    let mut g = c.benchmark_group("papirus-stat tracepoints");
    g.sample_size(10);
    g.bench_function("50", |b| b.iter(|| stat(&few)));
    g.bench_function("500", |b| b.iter(|| stat(&many)));
    g.finish();
    let (t50, t500) = (mean(&few, 5), mean(&many, 5));
    println!(
        "500 tracepoints {:.1} ms, 50 tracepoints {:.1} ms: ratio {:.2} (10 = linear, 100 = quadratic); \
         closing 20 tracepoints no one else holds adds {:.0} ms of kernel wait",
        t500.as_secs_f64() * 1e3,
        t50.as_secs_f64() * 1e3,
        t500.as_secs_f64() / t50.as_secs_f64(),
        unheld.as_secs_f64() * 1e3
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
