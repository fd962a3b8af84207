//! Per-call cost of an instrumented call: the uninstrumented call, the
//! trampoline with the empty probe (entry + exit hooks, no clock), with the
//! wallclock probe (two TSC reads), with the counters probe reading
//! task-clock (the substrate's user-space path, behind an XSAVE of the
//! extended state), and uprobe+uretprobe counting on the same body (a typical
//! -O2 entry, and one behind a 5-byte nop), all in one run.
//!
//! Times are this thread's CPU time (user + kernel, so uprobe traps count),
//! not wall time: the machines these run on are shared, and a preempted
//! sample would otherwise measure someone else's work.
//!
//! `cargo bench -p papirus-probe --bench probe -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use papirus_probe::session::cost::{Body, Drive, Target, Tiny, cpu_time, ns_per_call};
use papirus_probe_abi::Probe;

fn bench(c: &mut Criterion, name: &str, drive: Drive, f: Tiny) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let t = cpu_time();
            black_box(drive(f, iters as i64));
            cpu_time() - t
        })
    });
}

fn main() {
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

    // A summary from one more pass, so every ratio comes from this run.
    patched.set_probe(Probe::Empty);
    let n = 1_000_000;
    let base = ns_per_call(drive, tiny_ref, n, 7);
    let empty = ns_per_call(drive, tiny, n, 7);
    patched.set_probe(Probe::Wallclock);
    let wall = ns_per_call(drive, tiny, n, 7);
    patched.set_probe(Probe::Counters);
    let cnt = counters.then(|| ns_per_call(drive, tiny, n / 10, 7));
    patched.set_probe(Probe::Wallclock);
    println!("\nper call, thread CPU time (best of 7 × {n} calls):");
    println!("  uninstrumented             {base:8.2} ns");
    println!(
        "  trampoline, empty probe    {empty:8.2} ns  (+{:.2} ns, {:.1}× the call)",
        empty - base,
        empty / base
    );
    println!(
        "  trampoline, wallclock      {wall:8.2} ns  (+{:.2} ns, {:.1}× the call)",
        wall - base,
        wall / base
    );
    if let Some(cnt) = cnt {
        println!(
            "  trampoline, counters       {cnt:8.2} ns  (+{:.2} ns, {:.1}× the call; task-clock)",
            cnt - base,
            cnt / base
        );
    }
    for (name, f) in uprobes {
        let up = ns_per_call(drive, f, 20_000, 7);
        println!(
            "  uprobe+uretprobe {name:<10}{up:8.0} ns  ({:.0}× the wallclock probe per call, {:.0}× its added cost)",
            up / wall,
            (up - base) / (wall - base)
        );
    }
    drop(probes);
    patched.remove().unwrap_or_else(|e| panic!("{e}"));
    c.final_summary();
}
