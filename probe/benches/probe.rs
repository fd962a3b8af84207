//! Per-call cost of an instrumented call, every row beside its baselines
//! from the same run: the uninstrumented call; the trampoline with the empty
//! probe (entry and exit hooks, no clock), the wallclock probe (two TSC
//! reads) and the counters probe reading task-clock (from its mmap page and
//! the TSC) and task-clock + page-faults (page-faults by one `read(2)` per
//! hook); uprobe+uretprobe counting on the same body (a typical -O2 entry,
//! and one behind a 5-byte nop); and `uftrace record -P` on the same body
//! (Debian's uftrace, installed when missing).
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
use papirus_probe::session::cost::{
    self, Body, Drive, Instrumented, Target, Tiny, cpu_time, median, ns_per_call,
};
use papirus_probe_abi::Probe;

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

/// `uftrace record -P` on the same body, per call, with Debian's uftrace
/// (installed when missing): (traced, plain) medians.
fn uftraced() -> Result<(f64, f64, String), String> {
    let present = || cost::uftrace().is_some();
    papirus_testkit::debian_package("uftrace", present)?;
    let uftrace = cost::uftrace().ok_or("uftrace is not on PATH after installing it")?;
    let run = cost::uftrace_run(&uftrace, cost::UFTRACE_BATCH, 30)?;
    Ok((median(&run.traced), median(&run.plain), run.version))
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
    let two = two_events();
    let uft = uftraced();
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
    match &uft {
        Ok((traced, plain, version)) => println!(
            "  {:<38}{traced:8.2} ns  (+{:.2} ns over {plain:.2} ns of the same body, {:.1}× the wallclock probe's added cost; {version}, wall time inside the driver)",
            "uftrace record -P",
            traced - plain,
            (traced - plain) / (wall - base)
        ),
        Err(e) => println!("  uftrace record -P: not measured: {e}"),
    }
    for (name, f) in uprobes {
        let up = ns_per_call(drive, f, 20_000, 7);
        println!(
            "  uprobe+uretprobe {name:<21}{up:8.0} ns  ({:.0}× the wallclock probe per call, {:.0}× its added cost)",
            up / wall,
            (up - base) / (wall - base)
        );
    }
    drop(probes);
    patched.remove().unwrap_or_else(|e| panic!("{e}"));
    c.final_summary();
}
