//! Attach + stop every thread + detach on a 4-thread spinning process, against
//! two baselines in the same run: one PTRACE_SEIZE + PTRACE_INTERRUPT + wait +
//! PTRACE_DETACH of a single spinning thread, and the same raw requests on all
//! five threads with blocking waits (no /proc scans, no timeouts, no re-scan).

use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use nix::sys::ptrace::{self, Options};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use papirus_probe::process::Process;

const SPIN: &str = r#"
#include <pthread.h>
#include <unistd.h>
static void *spin(void *a) { volatile unsigned long n = 0; for (;;) n++; return a; }
int main(void) {
    pthread_t t;
    for (int k = 0; k < 4; k++) pthread_create(&t, 0, spin, 0);
    pause();
    return 0;
}
"#;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = papirus_testkit::Cc::from_text(dir.path(), "spin.c", SPIN)
        .opt("-O1")
        .arg("-pthread")
        .build(dir.path(), "spin");
    let mut child = Command::new(&exe).stdin(Stdio::null()).spawn().expect("start spin");
    let pid = child.id() as i32;
    let task_ids = || -> Vec<i32> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default()
    };
    while task_ids().len() < 5 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let worker = task_ids().into_iter().find(|&t| t != pid).expect("a worker thread");

    let mut g = c.benchmark_group("ptrace");
    g.bench_function("baseline: seize+interrupt+wait+detach, 1 spinning thread", |b| {
        b.iter(|| {
            let tid = Pid::from_raw(worker);
            ptrace::seize(tid, Options::empty()).expect("seize");
            ptrace::interrupt(tid).expect("interrupt");
            waitpid(tid, Some(WaitPidFlag::__WALL)).expect("wait");
            ptrace::detach(tid, None).expect("detach");
        })
    });
    let all = task_ids();
    g.bench_function("baseline: raw seize+interrupt all 5 threads, blocking waits, detach", |b| {
        b.iter(|| {
            for &t in &all {
                ptrace::seize(Pid::from_raw(t), Options::empty()).expect("seize");
                ptrace::interrupt(Pid::from_raw(t)).expect("interrupt");
            }
            for &t in &all {
                waitpid(Pid::from_raw(t), Some(WaitPidFlag::__WALL)).expect("wait");
            }
            for &t in &all {
                ptrace::detach(Pid::from_raw(t), None).expect("detach");
            }
        })
    });
    g.bench_function("Process::attach + drop, 4 spinning threads + main", |b| {
        b.iter(|| {
            let p = Process::attach(pid).expect("attach");
            assert_eq!(p.threads().len(), 5);
            drop(p);
        })
    });
    g.finish();
    let _ = child.kill();
    let _ = child.wait();
}

criterion_group!(benches, bench);
criterion_main!(benches);
