//! The probe tool's rows of papirus-calibrate's cost table and cost file
//! (`papirus-probe calibrate`): what one call of a tiny gcc -O2 function
//! costs uninstrumented, under uprobe+uretprobe, and through a trampoline
//! with each probe, each with its ratios against the uninstrumented call and
//! against uprobe+uretprobe, measured in the same run; and, when uftrace is
//! installed, the same body under `uftrace record -P`.
//!
//! The ratios go in each row's `path` (printed in the table's last column):
//! they hold for this run only, and the cost model reads the medians.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;

use papirus_calibrate::{Bench, Cost, CostFile, Registry, RowResult};
use papirus_probe_abi::Probe;

use papirus_probe::session::cost::{self, Body, Target, Tiny};

/// The uninstrumented call.
pub const UNINSTRUMENTED: &str = "probe.uninstrumented_call";
/// uprobe+uretprobe behind a 5-byte nop.
pub const UPROBE_NOP5: &str = "probe.uprobe_uretprobe.nop5";
/// uprobe+uretprobe on a typical gcc -O2 entry.
pub const UPROBE_TYPICAL: &str = "probe.uprobe_uretprobe.typical";
/// Trampoline with the empty probe.
pub const EMPTY: &str = "probe.empty";
/// Trampoline with the wallclock probe.
pub const WALLCLOCK: &str = "probe.wallclock";
/// Trampoline with the counters probe reading task-clock.
pub const COUNTERS: &str = "probe.counters.task-clock";
/// uftrace -P on the same function.
pub const UFTRACE: &str = "probe.uftrace";

/// Every row [`register`] adds, in order.
pub const ROWS: [&str; 7] =
    [UNINSTRUMENTED, UPROBE_NOP5, UPROBE_TYPICAL, EMPTY, WALLCLOCK, COUNTERS, UFTRACE];

const D_UNINSTRUMENTED: &str = "one call of a tiny gcc -O2 C function (tiny_ref), not instrumented";
const D_NOP5: &str = "one call of the same body behind a 5-byte nop (tiny_nop5) with a counting uprobe and uretprobe: the kernel's fastest uprobe path";
const D_TYPICAL: &str = "one call of the same body (tiny_up, a typical -O2 entry) with a counting uprobe and uretprobe: the kernel single-steps the entry";
const D_EMPTY: &str =
    "one call of the same body (tiny) through papirus' entry+exit trampoline with the empty probe";
const D_WALLCLOCK: &str = "one call of the same body through the trampoline with the wallclock probe (two TSC reads, the call-path tree)";
const D_COUNTERS: &str = "one call of the same body through the trampoline with the counters probe reading task-clock (user-space path, extended state saved)";
const D_UFTRACE: &str = "one call of the same body under uftrace record -P (dynamic patching)";

/// What the rows share: the target library, built by the first row that runs,
/// and each reference row's median (or why it is missing).
#[derive(Default)]
struct Shared {
    target: Option<Result<Rc<Target>, String>>,
    medians: HashMap<&'static str, Result<f64, String>>,
}

type State = Rc<RefCell<Shared>>;

fn target(s: &State) -> Result<Rc<Target>, String> {
    s.borrow_mut()
        .target
        .get_or_insert_with(|| Target::build().map(Rc::new).map_err(|e| e.to_string()))
        .clone()
}

/// Times one call of `f` as the cost `name`.
fn time_call(b: &Bench, name: &str, description: &str, path: &str, f: Tiny) -> Cost {
    let mut i = 0i32;
    b.time_named(name, description, Some(path), || {
        i = i.wrapping_add(1);
        black_box(f(black_box(i), black_box(7)));
    })
}

fn uninstrumented(b: &Bench, t: &Target) -> Cost {
    time_call(
        b,
        UNINSTRUMENTED,
        D_UNINSTRUMENTED,
        "direct call through a function pointer",
        t.tiny(Body::Reference),
    )
}

fn uprobed(b: &Bench, t: &Target, name: &str, description: &str, body: Body) -> RowResult {
    let probes = t.uprobe_uretprobe(body).map_err(|e| e.to_string())?;
    let calls = Cell::new(0u64);
    let f = t.tiny(body);
    let mut i = 0i32;
    let mut c = b.time_named(name, description, None, || {
        i = i.wrapping_add(1);
        calls.set(calls.get() + 1);
        black_box(f(black_box(i), black_box(7)));
    });
    let (entry, exit) = probes.hits().map_err(|e| format!("reading the uprobe counts: {e}"))?;
    let n = calls.get();
    let exact = if entry == n && exit == n {
        format!("{n} hits each, exact")
    } else {
        format!("hits {entry} and {exit} for {n} calls: NOT exact")
    };
    c.path = Some(format!("kernel uprobe+uretprobe, perf counting ({exact})"));
    Ok(vec![c])
}

/// The median of reference row `name`, from this run: measured by its own
/// row if that ran already, else now (and kept for the rows after).
fn reference(s: &State, b: &Bench, name: &'static str) -> Result<f64, String> {
    if let Some(m) = s.borrow().medians.get(name) {
        return m.clone();
    }
    let t = target(s)?;
    let m = match name {
        UNINSTRUMENTED => Ok(uninstrumented(b, &t).ns.median),
        UPROBE_NOP5 => uprobed(b, &t, name, D_NOP5, Body::Nop5).map(|c| c[0].ns.median),
        _ => uprobed(b, &t, name, D_TYPICAL, Body::Typical).map(|c| c[0].ns.median),
    };
    s.borrow_mut().medians.insert(name, m.clone());
    m
}

fn ratio_text(
    ns: f64,
    base: &Result<f64, String>,
    nop5: &Result<f64, String>,
    typical: &Result<f64, String>,
) -> String {
    let vs_base = match base {
        Ok(b) if *b > 0.0 => format!("{:.1}× the uninstrumented call (+{:.1} ns)", ns / b, ns - b),
        Ok(_) => "uninstrumented call below the clock's resolution".into(),
        Err(e) => format!("uninstrumented call unavailable: {e}"),
    };
    let up = |what: &str, r: &Result<f64, String>| match r {
        Ok(u) if ns > 0.0 => format!("uprobe+uretprobe {what} costs {:.0}× this", u / ns),
        Ok(_) => format!("uprobe+uretprobe {what}: this is below the clock's resolution"),
        Err(_) => format!("uprobe+uretprobe {what} unavailable"),
    };
    format!("{vs_base}; {}, {}", up("nop5", nop5), up("typical", typical))
}

fn trampoline(s: &State, b: &Bench, name: &'static str, description: &str, probe: Probe) -> RowResult {
    let t = target(s)?;
    let base = reference(s, b, UNINSTRUMENTED);
    let nop5 = reference(s, b, UPROBE_NOP5);
    let typical = reference(s, b, UPROBE_TYPICAL);
    let patched = t.instrument().map_err(|e| e.to_string())?;
    if probe == Probe::Counters {
        patched.counters().map_err(|e| format!("the counters probe cannot read task-clock here: {e}"))?;
    }
    patched.set_probe(probe);
    let mut c = time_call(b, name, description, "", t.tiny(Body::Patched));
    patched.set_probe(Probe::Empty);
    patched.remove().map_err(|e| e.to_string())?;
    s.borrow_mut().medians.insert(name, Ok(c.ns.median));
    c.path = Some(format!(
        "trampoline, {} probe; {}",
        probe.name(),
        ratio_text(c.ns.median, &base, &nop5, &typical)
    ));
    Ok(vec![c])
}

/// Calls per sample of the uftrace row: four of uftrace's default 128 KiB
/// buffers (32 bytes a call), so their hand-off to its writer is counted.
const UFTRACE_BATCH: u32 = 16_384;

/// The uftrace row: the driver timed plain and under `uftrace record -P tiny`
/// in this run; the cost is one instrumented call as the driver measured it.
fn uftraced(s: &State, b: &Bench, uftrace: &Path) -> RowResult {
    let driver = cost::Driver::build().map_err(|e| e.to_string())?;
    let samples = u64::from((b.plan().samples / 20).clamp(10, 100));
    let batch = u64::from(UFTRACE_BATCH);
    let plain = driver.run_under(Command::new(driver.path()), batch, samples, "the uftrace driver")?;
    let traced = cost::uftraced(&driver, uftrace, &plain, batch, samples)?;

    let per_ns = b.ticks().per_ns;
    let cycles = traced.ns.iter().map(|ns| ns * per_ns).collect();
    let mut c = Cost::from_samples(b.ticks(), b.plan(), UFTRACE, D_UFTRACE, None, cycles, UFTRACE_BATCH)
        .ok_or("no uftrace samples")?;
    let plain_ns = papirus_substrate::stats::median(&plain.ns);
    let added = c.ns.median - plain_ns;
    let version = Command::new(uftrace)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "uftrace".into());
    let base = reference(s, b, UNINSTRUMENTED);
    let vs_base = match base {
        Ok(u) if u > 0.0 => format!("{:.1}× the uninstrumented call", c.ns.median / u),
        _ => "uninstrumented call unavailable".into(),
    };
    let wall = s.borrow().medians.get(WALLCLOCK).cloned();
    let vs_wall = match (wall, base) {
        (Some(Ok(w)), Ok(u)) if w > u => {
            format!("{:.1}× the wallclock probe's added cost (+{:.1} ns in this run)", added / (w - u), w - u)
        }
        (Some(Ok(_)), Ok(_)) => "the wallclock probe added nothing measurable".into(),
        _ => "wallclock probe row not run".into(),
    };
    c.path = Some(format!(
        "{version} record -P tiny --no-libcall, timed inside the driver: +{added:.1} ns over the same driver uninstrumented ({plain_ns:.1} ns/call), {} calls recorded, exact; {vs_base}; {vs_wall}",
        traced.calls
    ));
    Ok(vec![c])
}

/// Adds the probe rows ([`ROWS`]) to `reg`.
pub fn register(reg: &mut Registry) {
    let s: State = Rc::default();
    let st = s.clone();
    reg.add(UNINSTRUMENTED, D_UNINSTRUMENTED, move |b| {
        let c = uninstrumented(b, &*target(&st)?);
        st.borrow_mut().medians.insert(UNINSTRUMENTED, Ok(c.ns.median));
        Ok(vec![c])
    });
    for (name, description, body) in
        [(UPROBE_NOP5, D_NOP5, Body::Nop5), (UPROBE_TYPICAL, D_TYPICAL, Body::Typical)]
    {
        let st = s.clone();
        reg.add(name, description, move |b| {
            let mut r = uprobed(b, &*target(&st)?, name, description, body);
            let m = r.as_ref().map(|c| c[0].ns.median).map_err(String::clone);
            if let (Ok(c), Ok(m)) = (&mut r, &m) {
                let base = reference(&st, b, UNINSTRUMENTED);
                if let (Some(p), Ok(base)) = (c[0].path.as_mut(), base) {
                    p.push_str(&format!("; {:.0}× the uninstrumented call", m / base.max(f64::MIN_POSITIVE)));
                }
            }
            st.borrow_mut().medians.insert(name, m);
            r
        });
    }
    for (name, description, probe) in [
        (EMPTY, D_EMPTY, Probe::Empty),
        (WALLCLOCK, D_WALLCLOCK, Probe::Wallclock),
        (COUNTERS, D_COUNTERS, Probe::Counters),
    ] {
        let st = s.clone();
        reg.add(name, description, move |b| trampoline(&st, b, name, description, probe));
    }
    match cost::uftrace() {
        None => {
            reg.add_unavailable(
                UFTRACE,
                D_UFTRACE,
                "uftrace is not installed (not on PATH; Debian package `uftrace`)",
            );
        }
        Some(p) => {
            let st = s.clone();
            reg.add(UFTRACE, D_UFTRACE, move |b| uftraced(&st, b, &p));
        }
    }
}

/// Paradyn's cost model applied to a probe report: how much time the
/// instrumentation added, predicted from a machine cost file's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Instrumented calls in the report, all threads.
    pub calls: u64,
    /// The cost file row used.
    pub row: &'static str,
    /// What one call adds: the row's median minus the uninstrumented call's.
    pub added_ns: f64,
    /// `calls × added_ns`.
    pub total_ns: f64,
    /// A caveat, e.g. the counters row measured other events than the report's.
    pub note: Option<String>,
}

impl std::fmt::Display for Prediction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "predicted instrumentation overhead: {} calls × {:.1} ns ({} − {UNINSTRUMENTED}) = {:.3} ms",
            self.calls,
            self.added_ns,
            self.row,
            self.total_ns / 1e6
        )?;
        if let Some(n) = &self.note {
            write!(f, " ({n})")?;
        }
        Ok(())
    }
}

/// Predicts the overhead of the run `report` describes from `costs` (rows
/// written by `papirus-probe calibrate --json`), or says which row is missing.
pub fn predict(costs: &CostFile, report: &papirus_probe_abi::Report) -> Result<Prediction, String> {
    let (row, note) = match report.probe.as_str() {
        "empty" => (EMPTY, None),
        "wallclock" => (WALLCLOCK, None),
        "counters" if report.events.iter().map(String::as_str).eq(["task-clock"]) => (COUNTERS, None),
        "counters" => {
            (COUNTERS, Some(format!("measured with task-clock, this run read {}", report.events.join(","))))
        }
        other => return Err(format!("no cost file row for the `{other}` probe")),
    };
    let missing = |name: &str| {
        format!("the cost file has no {name} row: write one with `papirus-probe calibrate --json FILE`")
    };
    let probed = costs.median_ns(row).ok_or_else(|| missing(row))?;
    let base = costs.median_ns(UNINSTRUMENTED).ok_or_else(|| missing(UNINSTRUMENTED))?;
    let calls = report.threads.iter().flat_map(|t| &t.functions).map(|f| f.figures.calls).sum::<u64>();
    let added_ns = (probed - base).max(0.0);
    Ok(Prediction { calls, row, added_ns, total_ns: calls as f64 * added_ns, note })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(rows: &[(&str, f64)]) -> CostFile {
        let cost = |(name, ns): &(&str, f64)| {
            serde_json::json!({
                "name": name, "description": "", "samples": 1, "batch": 1,
                "cycles": {"min": ns, "median": ns, "p99": ns, "max": ns},
                "ns": {"min": ns, "median": ns, "p99": ns, "max": ns},
            })
        };
        let v = serde_json::json!({
            "format_version": papirus_calibrate::FORMAT_VERSION, "generator": "test", "machine": {},
            "tsc_hz": 1e9, "costs": rows.iter().map(cost).collect::<Vec<_>>(),
        });
        CostFile::from_json(&v.to_string()).unwrap()
    }

    fn report(probe: &str, events: &[&str], calls: &[&[u64]]) -> papirus_probe_abi::Report {
        use papirus_probe_abi::{FORMAT_VERSION, Figures, FunctionReport, Report, ThreadReport};
        let threads = calls
            .iter()
            .zip(1..)
            .map(|(fs, tid)| ThreadReport {
                tid,
                functions: (0..)
                    .zip(fs.iter())
                    .map(|(id, &calls)| FunctionReport {
                        id,
                        figures: Figures { calls, exits: calls, ..Default::default() },
                    })
                    .collect(),
                callees: Vec::new(),
                ..Default::default()
            })
            .collect();
        Report {
            format_version: FORMAT_VERSION,
            probe: probe.into(),
            pid: 1,
            ticks_per_second: 1e9,
            events: events.iter().map(|e| e.to_string()).collect(),
            functions: vec!["a".into(), "b".into()],
            threads,
            window: Default::default(),
            processes: Vec::new(),
            unmeasured_threads: 0,
        }
    }

    #[test]
    fn calls_times_the_added_cost_of_the_probe_row() {
        let c = costs(&[(UNINSTRUMENTED, 2.0), (WALLCLOCK, 42.0), (COUNTERS, 402.0)]);
        let p = predict(&c, &report("wallclock", &[], &[&[10, 20], &[30]])).unwrap();
        assert_eq!((p.calls, p.row, p.added_ns, p.total_ns), (60, WALLCLOCK, 40.0, 2400.0));
        assert!(p.note.is_none());
        let p = predict(&c, &report("counters", &["page-faults"], &[&[5]])).unwrap();
        assert_eq!((p.row, p.total_ns), (COUNTERS, 2000.0));
        assert!(p.note.unwrap().contains("page-faults"));
        let e = predict(&c, &report("empty", &[], &[&[5]])).unwrap_err();
        assert!(e.contains(EMPTY), "{e}");
    }
}
