//! The stop-the-world window of patching a running 4-thread program: attach
//! (every thread stopped), instrument N functions, detach; then attach,
//! restore, detach. For N = 100 and N = 5,000, it prints the window as the
//! tool measures it (attach to detach), the patcher's own share
//! (`Outcome::window`), the longest gap the target's threads saw in their
//! own clock (the stop as the target lives it), and functions per second.
//! Baseline from the same run: attach + detach with nothing patched.
//!
//! The target is generated here (5,000 small functions called from a table by
//! 4 threads) and calls its own empty hook, so no runtime is needed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use papirus_probe::inventory::Inventory;
use papirus_probe::patch::{FunctionSpec, Patcher, Refusal};
use papirus_probe::process::Process;
use papirus_probe::session::RemoteSpace;
use papirus_substrate::stats::median;

const FUNCTIONS: usize = 5000;
const ROUNDS: usize = 5;

fn source() -> String {
    let mut s = String::from(
        "#include <pthread.h>\n#include <stdio.h>\n#include <string.h>\n#include <time.h>\n\
         volatile long sink;\n\
         __attribute__((noinline)) void hook(unsigned id, void **slot) { (void)id; (void)slot; }\n",
    );
    for i in 0..FUNCTIONS {
        s += &format!("__attribute__((noinline)) int a_{i:04}(int x) {{ sink += x; return x * {i} + 1; }}\n");
    }
    s += "static int (*const tab[])(int) = {\n";
    for i in 0..FUNCTIONS {
        s += &format!("a_{i:04},");
    }
    s += r#"};
static volatile double gap[4];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *work(void *arg) {
    long k = (long)arg;
    double a = now();
    for (unsigned i = 0;; i++) {
        sink += tab[(i * 7 + k) % (sizeof tab / sizeof *tab)](i);
        double b = now();
        if (b - a > gap[k]) gap[k] = b - a;
        a = b;
    }
    return 0;
}
int main(void) {
    pthread_t t;
    for (long k = 0; k < 4; k++) pthread_create(&t, 0, work, (void *)k);
    char line[16];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        double m = 0;
        for (int k = 0; k < 4; k++) { if (gap[k] > m) m = gap[k]; gap[k] = 0; }
        printf("%.6f\n", m);
        fflush(stdout);
    }
    return 0;
}
"#;
    s
}

struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    /// The longest gap (s) any thread saw since the last call.
    fn max_gap(&mut self) -> f64 {
        writeln!(self.stdin, "r").expect("ask the target");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("target answers");
        line.trim().parse().expect("a gap")
    }
}

struct Figures {
    window: Duration,
    patcher: Duration,
    restore: Duration,
    target_gap: f64,
}

fn once(pid: i32, specs: &[FunctionSpec], t: &mut Target) -> Figures {
    t.max_gap();
    let start = Instant::now();
    let mut p = Process::attach(pid).expect("attach");
    let mut patcher = Patcher::new(RemoteSpace::new(&mut p));
    let out = patcher.instrument(specs).expect("instrument");
    // A busy thread may sit inside an entry at the moment of the stop.
    assert!(out.refused.iter().all(|r| r.reason == Refusal::ThreadInside), "{:?}", out.refused.first());
    let installed = patcher.keep();
    p.detach().expect("detach");
    let window = start.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    let restore_start = Instant::now();
    let mut p = Process::attach(pid).expect("attach again");
    let mut patcher = Patcher::adopt(RemoteSpace::new(&mut p), installed);
    patcher.remove_all().expect("restore");
    drop(patcher);
    p.detach().expect("detach again");
    let restore = restore_start.elapsed();
    std::thread::sleep(Duration::from_millis(20));
    Figures { window, patcher: out.window, restore, target_gap: t.max_gap() }
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = papirus_testkit::Cc::from_text(dir.path(), "many.c", &source())
        .arg("-pthread")
        .build(dir.path(), "many");
    let mut child = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start");
    let pid = child.id() as i32;
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ready = String::new();
    stdout.read_line(&mut ready).expect("ready");
    let stdin = child.stdin.take().expect("stdin");
    let mut t = Target { child, stdin, stdout };

    // Planning input, gathered while the target runs.
    let inv = Inventory::of_process(pid).expect("inventory");
    let m = inv.main_module().expect("main module");
    let hook = m.function("hook").expect("hook").address;
    let funcs: Vec<_> = m.functions.iter().filter(|f| f.name.starts_with("a_")).collect();
    assert_eq!(funcs.len(), FUNCTIONS);
    let spec = |i: usize| {
        let f = funcs[i];
        let next = funcs.get(i + 1).map_or(0, |g| g.address);
        FunctionSpec { name: f.name.clone(), addr: f.address, size: f.size, hook, arg: i as u32, limit: next }
    };
    println!("attach + instrument N functions + detach, 4 busy threads, {ROUNDS} rounds, medians:");
    let base: Vec<Figures> = (0..ROUNDS).map(|_| once(pid, &[], &mut t)).collect();
    let base_ms = median(&base.iter().map(|f| f.window.as_secs_f64() * 1e3).collect::<Vec<_>>());
    println!("  baseline (nothing patched): window {base_ms:.2} ms");
    for n in [100, FUNCTIONS] {
        let specs: Vec<FunctionSpec> = (0..n).map(spec).collect();
        let runs: Vec<Figures> = (0..ROUNDS).map(|_| once(pid, &specs, &mut t)).collect();
        let window = median(&runs.iter().map(|f| f.window.as_secs_f64() * 1e3).collect::<Vec<_>>());
        let patcher = median(&runs.iter().map(|f| f.patcher.as_secs_f64() * 1e3).collect::<Vec<_>>());
        let restore = median(&runs.iter().map(|f| f.restore.as_secs_f64() * 1e3).collect::<Vec<_>>());
        let gap = median(&runs.iter().map(|f| f.target_gap * 1e3).collect::<Vec<_>>());
        println!(
            "  N = {n:>5}: window {window:7.2} ms ({:.1}x baseline), patcher {patcher:7.2} ms, \
             {:>9.0} functions/s; restore window {restore:7.2} ms; longest gap seen by the target {gap:7.2} ms",
            window / base_ms,
            n as f64 / (patcher / 1e3),
        );
    }
    drop(t.stdin);
    let _ = t.child.wait();
}
