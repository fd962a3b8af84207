//! Per-call cost of an instrumented call, every row beside its baselines
//! from the same run: the uninstrumented call; the trampoline with the empty
//! probe (entry and exit hooks, no clock), the wallclock probe (two TSC
//! reads, the call-path tree), the wallclock probe tracing every call into
//! its ring while a thread drains it into a trace file (as `papirus-probe
//! run --trace` does), and the counters probe reading task-clock (from its
//! mmap page and the TSC) and task-clock + page-faults (page-faults by one
//! `read(2)` per hook); uprobe+uretprobe counting on the same body (a
//! typical -O2 entry, and one behind a 5-byte nop); and end to end, one
//! program plain, under `papirus-probe run` (with and without `--trace`) and
//! under `uftrace record -P` (Debian's uftrace, installed when missing).
//! Beside the wallclock row, its floor: the same trampoline, hijacked
//! return and two `rdtsc` with no bookkeeping, in a program of its own
//! (testkit/targets/probe_floor.c), so what papirus adds shows.
//!
//! The counters probe's events are fixed per process, so the task-clock +
//! page-faults rows run in a child process of this bench (the same binary),
//! started in the same run. Times are this thread's CPU time (user +
//! kernel, so uprobe traps and `read(2)` count), not wall time: the machines
//! these run on are shared, and a preempted sample would otherwise measure
//! someone else's work. The summary's figures are medians over rounds that
//! interleave the probes, so every probe sees the same load.
//!
//! `cargo bench -p papirus-probe --bench probe -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::process::Command;
use std::time::Duration;

use criterion::Criterion;
use papirus_probe::session::cost::{Body, Drive, Instrumented, Target, Tiny, cpu_time, ns_per_call};
use papirus_probe_abi::Probe;
use papirus_substrate::stats::median;

/// Set in the child that measures the task-clock + page-faults rows.
const CHILD: &str = "PAPIRUS_PROBE_BENCH_EVENTS";
/// The events of the child's counters probe.
const TWO_EVENTS: &str = "task-clock,page-faults";
/// Interleaved rounds of the summary.
const ROUNDS: usize = 9;
/// Calls per measurement of the summary.
const CALLS: i64 = 1_000_000;

fn bench(c: &mut Criterion, name: &str, drive: Drive, f: Tiny) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let t = cpu_time();
            black_box(drive(f, iters as i64));
            cpu_time() - t
        })
    });
}

/// Medians of interleaved rounds: ns per call of the uninstrumented body,
/// then of the patched body under each of `probes`.
fn interleaved(lib: &Target, patched: &Instrumented, probes: &[Probe]) -> (f64, Vec<f64>) {
    let (drive, tiny, tiny_ref) = (lib.drive(), lib.tiny(Body::Patched), lib.tiny(Body::Reference));
    let mut base = Vec::new();
    let mut rows = vec![Vec::new(); probes.len()];
    for _ in 0..ROUNDS {
        base.push(ns_per_call(drive, tiny_ref, CALLS, 1));
        for (p, row) in probes.iter().zip(&mut rows) {
            patched.set_probe(*p);
            let n = if *p == Probe::Counters { CALLS / 10 } else { CALLS };
            row.push(ns_per_call(drive, tiny, n, 1));
        }
    }
    patched.set_probe(Probe::Empty);
    (median(&base), rows.iter().map(|r| median(r)).collect())
}

/// The child: the counters probe reading task-clock and page-faults.
fn child(events: &str) {
    let mut c = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(1));
    let lib = Target::build().unwrap_or_else(|e| panic!("{e}"));
    let events: Vec<&str> = events.split(',').collect();
    let patched = lib.instrument_with(&events).unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = patched.counters() {
        println!("child unavailable {e}");
        return;
    }
    patched.set_probe(Probe::Counters);
    bench(
        &mut c,
        &format!("call/trampoline+counters({})", events.join("+")),
        lib.drive(),
        lib.tiny(Body::Patched),
    );
    let (base, rows) = interleaved(&lib, &patched, &[Probe::Counters]);
    println!("child {base} {}", rows[0]);
    c.final_summary();
}

/// Runs the child and returns its (uninstrumented, counters) medians.
fn two_events() -> Result<(f64, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD, TWO_EVENTS)
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().filter(|l| !l.starts_with("child ")) {
        println!("{line}");
    }
    let line = text.lines().find_map(|l| l.strip_prefix("child ")).ok_or_else(|| {
        format!(
            "the child printed no figures ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    if let Some(why) = line.strip_prefix("unavailable ") {
        return Err(why.to_string());
    }
    let v: Vec<f64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match v[..] {
        [base, counters] => Ok((base, counters)),
        _ => Err(format!("the child printed `{line}`")),
    }
}

/// A thread draining the in-process session's trace rings into a trace
/// file every 2 ms while tracing is on, as the tool does for a target.
struct Drain {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl Drain {
    fn start(patched: &papirus_probe::session::cost::Instrumented<'_>) -> Drain {
        use papirus_probe::session::trace::{Filter, TRACE_VERSION, TraceFooter, TraceHeader, Tracing};
        let words = patched.segment();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let seg = papirus_probe_abi::segment::Segment::new(words).expect("the in-process segment");
            let g = seg.geometry();
            let header = TraceHeader {
                format_version: TRACE_VERSION,
                pid: std::process::id(),
                probe: "wallclock".into(),
                command: "bench".into(),
                functions: vec!["tiny".into()],
                traced: g.shape.funcs,
                events: vec![],
                start_tsc: 0,
                ticks_per_second: 0.0,
                ring: g.shape.ring,
                record_words: g.shape.record_words,
                min_duration_ns: 0,
                max_depth: None,
            };
            let dir = tempfile::tempdir().expect("a scratch directory");
            let filter = Filter { functions: g.shape.funcs, depth: u64::MAX, min_ticks: 0 };
            let mut t =
                Tracing::start(&dir.path().join("bench.ptrace"), &seg, &header, filter).expect("trace file");
            t.drain_until(&seg, &flag);
            let s = t.finish(&seg, 0, TraceFooter::default()).expect("trace file");
            (s.calls, s.lost)
        });
        patched.set_tracing(true);
        Drain { stop, thread }
    }

    /// Stops tracing, then the drainer; (calls written, calls lost).
    fn stop(self, patched: &papirus_probe::session::cost::Instrumented<'_>) -> (u64, u64) {
        patched.set_tracing(false);
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the drainer")
    }
}

/// The same body in a separate program, timed inside it (wall clock, so a
/// tool's start-up and write-out are left out): plain, under `papirus-probe
/// run` with the wallclock probe, with `--trace` (the tool draining the
/// rings into a trace file as the program runs), and under `uftrace record
/// -P` (Debian's uftrace, installed here if missing), one after the other.
fn end_to_end() {
    use papirus_probe::session::cost::{Driver, DriverRun, uftrace, uftraced};
    use papirus_probe::session::{Instrumentation, RunOptions, Selection, TraceRequest, find_runtime, run};
    const BATCH: u64 = 16_384;
    const SAMPLES: u64 = 60;
    let driver = Driver::build().unwrap_or_else(|e| panic!("{e}"));
    let plain = driver.run_under(std::process::Command::new(driver.path()), BATCH, SAMPLES, "plain").unwrap();
    let dir = tempfile::tempdir().expect("a scratch directory");
    let papirus = |name: &str, trace: bool| -> (DriverRun, Option<papirus_probe::session::TraceSummary>) {
        let (args, out) = driver.args(BATCH, SAMPLES, name);
        let opts = RunOptions {
            program: driver.path().to_path_buf(),
            args,
            instrumentation: Instrumentation {
                probe: Probe::Wallclock,
                events: vec![],
                selection: Selection { functions: vec!["tiny".into()], ..Selection::default() },
                output: dir.path().join(format!("{name}.json")),
                runtime: find_runtime().unwrap_or_else(|e| panic!("{e}")),
                per_thread: false,
                nodes: 0,
                trace: trace.then(|| TraceRequest {
                    output: dir.path().join(format!("{name}.ptrace")),
                    functions: vec![],
                    min_duration: Duration::ZERO,
                    depth: None,
                    ring: papirus_probe_abi::DEFAULT_RING,
                }),
            },
        };
        let s = run(&opts).unwrap_or_else(|e| panic!("papirus-probe run: {e}"));
        (Driver::read(&out).unwrap(), s.trace)
    };
    let (wall, _) = papirus("wallclock", false);
    let (traced, summary) = papirus("trace", true);
    for r in [&wall, &traced] {
        assert_eq!(r.checksum, plain.checksum, "instrumented, the driver computes what it computes plain");
    }
    let uf = papirus_testkit::debian_package("uftrace", || uftrace().is_some())
        .and_then(|()| uftrace().ok_or_else(|| "uftrace not on PATH".to_string()))
        .and_then(|u| uftraced(&driver, &u, &plain, BATCH, SAMPLES));
    let base = median(&plain.ns);
    let added = |r: &DriverRun| median(&r.ns) - base;
    println!(
        "\nend to end, each a separate run of one program, timed inside it (median of {SAMPLES} × {BATCH} calls, wall clock):"
    );
    println!("  uninstrumented                 {base:8.2} ns");
    println!("  papirus-probe run, wallclock   {:8.2} ns  (+{:.2} ns)", median(&wall.ns), added(&wall));
    println!(
        "  papirus-probe run --trace      {:8.2} ns  (+{:.2} ns, {:.2}× the wallclock probe's added cost; goal ≤ 2×)",
        median(&traced.ns),
        added(&traced),
        added(&traced) / added(&wall)
    );
    if let Some(t) = summary {
        println!(
            "    trace: {} calls written ({:.1} MB, {:.0} bytes a call), {} lost to ring overwrites",
            t.calls,
            t.bytes as f64 / 1e6,
            t.bytes as f64 / t.calls.max(1) as f64,
            t.lost
        );
    }
    match uf {
        Ok(u) => println!(
            "  uftrace record -P tiny         {:8.2} ns  (+{:.2} ns, {:.1}× papirus' trace, {:.1}× the wallclock probe per call)",
            median(&u.ns),
            added(&u),
            added(&u) / added(&traced),
            added(&u) / added(&wall)
        ),
        Err(e) => println!("  uftrace record -P tiny         not measured: {e}"),
    }
}

/// Calls per second (and bytes per second) one drainer moves from a full
/// ring into a trace file: a segment of one slot whose ring a pretend
/// writer refills between drains.
fn drain_rate() -> (f64, f64) {
    use papirus_probe::session::trace::{Filter, TRACE_VERSION, TraceFooter, TraceHeader, Tracing};
    use papirus_probe_abi::layout::{self, Geometry, Shape, hdr, record, slot};
    use std::sync::atomic::{AtomicU64, Ordering};
    let ring = 1 << 16;
    let shape =
        Shape { funcs: 1, nodes: 2, proc_nodes: 2, depth: 1, slots: 1, procs: 1, ring, record_words: 3 };
    let g = Geometry::new(shape).expect("a small geometry");
    let w: Vec<AtomicU64> = (0..g.total_words).map(|_| AtomicU64::new(0)).collect();
    let set = |i: u64, v: u64| w[i as usize].store(v, Ordering::Relaxed);
    set(hdr::MAGIC as u64, layout::MAGIC);
    set(hdr::VERSION as u64, layout::VERSION);
    set(hdr::TOTAL_WORDS as u64, g.total_words);
    for (i, v) in shape.header() {
        set(i as u64, v);
    }
    set(hdr::SLOTS_USED as u64, 1);
    let r = g.slot_at(0) + g.slot_ring();
    for i in 0..ring {
        set(r + i * 3, i);
        set(r + i * 3 + 1, i + 10);
        set(r + i * 3 + 2, (record::RETURNED << 48) | (1 << 50));
    }
    let seg = papirus_probe_abi::segment::Segment::new(&w).expect("the segment");
    let header = TraceHeader {
        format_version: TRACE_VERSION,
        pid: 1,
        probe: "wallclock".into(),
        command: "bench".into(),
        functions: vec!["f".into()],
        traced: 1,
        events: vec![],
        start_tsc: 0,
        ticks_per_second: 1e9,
        ring,
        record_words: 3,
        min_duration_ns: 0,
        max_depth: None,
    };
    let dir = tempfile::tempdir().expect("a scratch directory");
    let filter = Filter { functions: 1, depth: u64::MAX, min_ticks: 0 };
    let mut t = Tracing::start(&dir.path().join("rate.ptrace"), &seg, &header, filter).expect("trace file");
    let head = g.slot_at(0) + slot::TRACE_HEAD as u64;
    let rounds = 200;
    let t0 = std::time::Instant::now();
    // A ring's worth less one each round: the record past the head is the
    // one a writer could be overwriting, which a drainer never trusts.
    for k in 1..=rounds {
        w[head as usize].store(k * (ring - 1), Ordering::Release);
        t.drain(&seg);
    }
    let s = t.finish(&seg, 0, TraceFooter::default()).expect("trace file");
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!((s.calls, s.lost), (rounds * (ring - 1), 0), "every call drained");
    (s.calls as f64 / secs, s.bytes as f64 / secs)
}

/// The cost floor of any return-hijacking probe with two TSC reads, part by
/// part (testkit/targets/probe_floor.c, ns per call, medians in thread CPU
/// time): what the wallclock probe's added cost is made of.
struct Floor {
    plain: f64,
    trampoline: f64,
    hijack: f64,
    clock: f64,
}

fn floor() -> Result<Floor, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("probe_floor.c")).build(dir.path(), "floor");
    let out = Command::new(&exe).output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> =
        text.trim().strip_prefix("floor ").unwrap_or("").split(' ').filter_map(|w| w.parse().ok()).collect();
    match v[..] {
        [plain, trampoline, hijack, clock] => Ok(Floor { plain, trampoline, hijack, clock }),
        _ => Err(format!("the floor program printed `{}` ({})", text.trim(), out.status)),
    }
}

impl Floor {
    /// Prints the parts beside `added`, the wallclock probe's added cost.
    fn print(&self, added: f64) {
        let floor = self.clock - self.plain;
        println!("    where it goes (the same call shape in a program of its own, this run):");
        for (what, ns) in [
            ("trampoline + call of a hook doing nothing", self.trampoline - self.plain),
            (
                "return hijacked through an exit stub (the function's `ret` mispredicts)",
                self.hijack - self.trampoline,
            ),
            ("one `rdtsc` in each hook", self.clock - self.hijack),
        ] {
            println!("      +{ns:6.2} ns  {what}");
        }
        println!(
            "      ={floor:6.2} ns  the floor of a return-hijacking probe with two TSC reads; papirus' own bookkeeping (thread lookup, shadow stack, call-path tree) adds {:.2} ns",
            added - floor
        );
    }
}

fn main() {
    if let Some(events) = std::env::var_os(CHILD) {
        child(&events.to_string_lossy());
        return;
    }
    let mut c = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(1));
    let lib = Target::build().unwrap_or_else(|e| panic!("{e}"));
    let drive = lib.drive();
    let (tiny, tiny_ref) = (lib.tiny(Body::Patched), lib.tiny(Body::Reference));

    bench(&mut c, "call/uninstrumented", drive, tiny_ref);

    let patched = lib.instrument().unwrap_or_else(|e| panic!("{e}"));
    let counters = match patched.counters() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("counters probe not measured: {e}");
            false
        }
    };
    bench(&mut c, "call/trampoline+empty", drive, tiny);
    patched.set_probe(Probe::Wallclock);
    bench(&mut c, "call/trampoline+wallclock", drive, tiny);
    let traced = Drain::start(&patched);
    bench(&mut c, "call/trampoline+wallclock+trace", drive, tiny);
    let drained = traced.stop(&patched);
    if counters {
        patched.set_probe(Probe::Counters);
        bench(&mut c, "call/trampoline+counters(task-clock)", drive, tiny);
    }
    patched.set_probe(Probe::Empty);

    let mut probes = Vec::new();
    let mut uprobes = Vec::new();
    for body in [Body::Typical, Body::Nop5] {
        match lib.uprobe_uretprobe(body) {
            Ok(p) => {
                probes.push(p);
                bench(&mut c, &format!("call/uprobe+uretprobe/{}", body.symbol()), drive, lib.tiny(body));
                uprobes.push((body.symbol(), lib.tiny(body)));
            }
            Err(e) => eprintln!("uprobe on {}: {e} (not measured)", body.symbol()),
        }
    }

    // The summary: every figure from this run.
    let mut which = vec![Probe::Empty, Probe::Wallclock];
    if counters {
        which.push(Probe::Counters);
    }
    let (base, rows) = interleaved(&lib, &patched, &which);
    let traced = Drain::start(&patched);
    let (trace_base, trace_rows) = interleaved(&lib, &patched, &[Probe::Wallclock]);
    let drained_summary = traced.stop(&patched);
    let two = two_events();
    let (empty, wall) = (rows[0], rows[1]);
    println!("\nper call, thread CPU time, medians of {ROUNDS} interleaved rounds:");
    let line = |what: &str, ns: f64, base: f64, more: &str| {
        println!(
            "  {what:<38}{ns:8.2} ns  (+{:.2} ns, {:.1}× the uninstrumented call){more}",
            ns - base,
            ns / base
        );
    };
    println!("  {:<38}{base:8.2} ns", "uninstrumented");
    line("trampoline, empty probe", empty, base, "");
    line("trampoline, wallclock probe", wall, base, "");
    match floor() {
        Ok(f) => f.print(wall - base),
        Err(e) => println!("  the wallclock probe's floor: not measured: {e}"),
    }
    if counters {
        let cnt = rows[2];
        line(
            "trampoline, counters (task-clock)",
            cnt,
            base,
            &format!("; {:.2}× the wallclock probe", cnt / wall),
        );
    }
    match &two {
        Ok((b2, c2)) => line(
            "trampoline, counters (task-clock, page-faults)",
            *c2,
            *b2,
            " [child process; uninstrumented there]",
        ),
        Err(e) => println!("  counters (task-clock, page-faults): not measured: {e}"),
    }
    let trace = trace_rows[0];
    line(
        "trampoline, wallclock probe + trace",
        trace,
        trace_base,
        &format!(
            "; {:.2}× the wallclock probe's added cost, goal ≤ 2× [rounds of their own]",
            (trace - trace_base) / (wall - base)
        ),
    );
    for (what, (calls, lost)) in [("criterion rows", drained), ("summary", drained_summary)] {
        println!(
            "    trace drained during the {what}: {calls} calls written, {lost} lost to ring overwrites"
        );
    }
    for (name, f) in uprobes {
        let up = ns_per_call(drive, f, 20_000, 7);
        println!(
            "  uprobe+uretprobe {name:<21}{up:8.0} ns  ({:.0}× the wallclock probe per call, {:.0}× its added cost)",
            up / wall,
            (up - base) / (wall - base)
        );
    }
    let (rate, bytes) = drain_rate();
    println!(
        "  trace drain (ring to trace file): {:.1} M calls/s, {:.0} MB/s written; ring memory: {} MiB per traced thread (default --trace-buffer)",
        rate / 1e6,
        bytes / 1e6,
        (papirus_probe_abi::DEFAULT_RING * 3 * 8) >> 20
    );
    end_to_end();
    drop(probes);
    patched.remove().unwrap_or_else(|e| panic!("{e}"));
    c.final_summary();
}
