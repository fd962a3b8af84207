//! The region report: one JSON file per process (schema:
//! `highlevel/schema/regions.schema.json`) and a text report of the same
//! numbers, written at normal process exit and on [`flush`].
//!
//! Files: `<dir>/papirus_<pid>.json` and `<dir>/papirus_<pid>.txt`, where
//! `<dir>` is [`Config::output_directory`](crate::region::Config::output_directory),
//! else `$PAPIRUS_OUTPUT_DIRECTORY`, else `papirus_output`. Each write
//! replaces the previous one (written to a temporary file, then renamed).
//!
//! # Exit
//!
//! Setting up regions registers a handler with `atexit(3)` (through
//! [`papirus_substrate::exit`]) that writes the report when `main` returns
//! or `std::process::exit` runs. Nothing runs on a signal, `abort` or
//! `_exit`: call [`flush`] where that matters. Threads still running at
//! exit are read through their regions' sequence locks, so their completed
//! calls are in the report; a region still open is reported with `open > 0`.
//!
//! # Derived metrics
//!
//! From a region's totals, where the inputs were measured and the divisor
//! is not 0: `cpu_utilisation` = virtual / real time; `ipc` = instructions /
//! cycles (`instructions`/`PAPI_TOT_INS`, `cycles`/`PAPI_TOT_CYC`);
//! `mflops` / `mflips` = `PAPI_FP_OPS` / `PAPI_FP_INS` per µs of real time
//! (as PAPI's report writer does); `page_faults_per_s` and
//! `context_switches_per_s` per second of real time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::region::{EventDef, EventSource, RegionError, Setup, Unavailable, setup, threads};

/// The version of the report layout; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// A whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Always `papirus`.
    pub tool: String,
    /// The papirus-highlevel version that wrote it.
    pub version: String,
    /// The machine as the substrate found it (`HwInfo`), `null` if unknown.
    pub machine: serde_json::Value,
    /// The measured process.
    pub process: ProcessReport,
}

/// The process and its threads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Its pid.
    pub pid: u32,
    /// Its command line.
    pub command: Vec<String>,
    /// Where the event list came from.
    pub event_source: EventSource,
    /// The events measured.
    pub events: Vec<EventDef>,
    /// Requested events that are not measured, with the reason.
    pub unavailable_events: Vec<Unavailable>,
    /// The metric names every region carries, in order.
    pub metrics: Vec<String>,
    /// Threads that used regions, in order of their first region.
    pub threads: Vec<ThreadReport>,
}

/// One thread's regions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadReport {
    /// Position in [`ProcessReport::threads`].
    pub index: usize,
    /// The kernel thread id.
    pub tid: i32,
    /// The thread's name (empty when unnamed).
    pub name: String,
    /// Whether the thread had exited when the report was taken.
    pub exited: bool,
    /// Region guards whose end failed on drop (each also printed to stderr).
    pub guard_errors: u64,
    /// Regions by id; a region is a name under one parent, so a name begun
    /// under two different parents is two regions.
    pub regions: Vec<RegionReport>,
}

/// One region of one thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionReport {
    /// Its id within the thread (order of first begin).
    pub id: u32,
    /// The name given to `region_begin`.
    pub name: String,
    /// The enclosing region's id, `null` at top level.
    pub parent: Option<u32>,
    /// Completed calls.
    pub calls: u64,
    /// Calls begun but not ended when the report was taken.
    pub open: u32,
    /// Per metric: inclusive total over the calls, minimum and maximum of one call.
    pub metrics: BTreeMap<String, MetricStats>,
    /// Derived metrics (see the module documentation).
    pub derived: BTreeMap<String, f64>,
}

/// A metric's statistics over a region's completed calls (0 without calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricStats {
    /// Sum over calls.
    pub total: i64,
    /// Smallest value of one call.
    pub min: i64,
    /// Largest value of one call.
    pub max: i64,
}

fn derived(metrics: &BTreeMap<String, MetricStats>) -> BTreeMap<String, f64> {
    let get = |names: &[&str]| names.iter().find_map(|n| metrics.get(*n)).map(|m| m.total as f64);
    let mut out = BTreeMap::new();
    let mut put = |k: &str, num: Option<f64>, den: Option<f64>, factor: f64| {
        if let (Some(n), Some(d)) = (num, den)
            && d > 0.0
        {
            let v = n / d * factor;
            if v.is_finite() {
                out.insert(k.to_string(), v);
            }
        }
    };
    let real = get(&["real_time_ns"]);
    put("cpu_utilisation", get(&["virtual_time_ns"]), real, 1.0);
    put("ipc", get(&["instructions", "PAPI_TOT_INS"]), get(&["cycles", "PAPI_TOT_CYC"]), 1.0);
    // Per µs of real time is per-second / 1e6: mega-ops per second.
    put("mflops", get(&["PAPI_FP_OPS"]), real, 1e3);
    put("mflips", get(&["PAPI_FP_INS"]), real, 1e3);
    put("page_faults_per_s", get(&["page-faults", "faults"]), real, 1e9);
    put("context_switches_per_s", get(&["context-switches", "cs"]), real, 1e9);
    out
}

fn build(setup: &Setup) -> Report {
    let metric_names = &setup.metrics;
    let threads: Vec<ThreadReport> = threads()
        .iter()
        .enumerate()
        .map(|(index, t)| {
            let cells: Vec<_> = t.regions().clone();
            let regions = cells
                .iter()
                .map(|c| {
                    let s = c.sample();
                    let metrics: BTreeMap<String, MetricStats> = metric_names
                        .iter()
                        .zip(&s.metrics)
                        .map(|(n, &(total, min, max))| (n.clone(), MetricStats { total, min, max }))
                        .collect();
                    RegionReport {
                        id: c.id,
                        name: c.name.to_string(),
                        parent: c.parent,
                        calls: s.calls,
                        open: s.open,
                        derived: derived(&metrics),
                        metrics,
                    }
                })
                .collect();
            ThreadReport {
                index,
                tid: t.tid,
                name: t.name.clone(),
                exited: t.exited.load(std::sync::atomic::Ordering::Acquire),
                guard_errors: t.guard_errors.load(std::sync::atomic::Ordering::Relaxed),
                regions,
            }
        })
        .collect();
    Report {
        format_version: FORMAT_VERSION,
        tool: "papirus".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        machine: setup
            .library
            .hwinfo()
            .and_then(|h| serde_json::to_value(h).ok())
            .unwrap_or(serde_json::Value::Null),
        process: ProcessReport {
            pid: std::process::id(),
            command: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            event_source: setup.source,
            events: setup.events.clone(),
            unavailable_events: setup.unavailable.clone(),
            metrics: metric_names.clone(),
            threads,
        },
    }
}

/// The report of everything measured so far, without writing it. Sets
/// regions up from the environment if nothing has yet.
pub fn snapshot() -> Result<Report, RegionError> {
    Ok(build(setup()?))
}

/// The report as text: the same numbers as the JSON, one table per region.
/// Integers are printed in full and derived values in Rust's shortest
/// round-trip form, so parsing the text gives back the JSON's numbers.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let p = &r.process;
    let _ = writeln!(s, "papirus region report, format {}", r.format_version);
    let _ = writeln!(s, "process {}: {}", p.pid, p.command.join(" "));
    let cpu = r.machine.get("model_name").and_then(|v| v.as_str()).unwrap_or("unknown CPU");
    let cpus = r.machine.get("cpus").and_then(|v| v.as_u64()).unwrap_or(0);
    let _ = writeln!(s, "machine: {cpu}, {cpus} CPUs");
    let names: Vec<&str> = p.events.iter().map(|e| e.name.as_str()).collect();
    let _ = writeln!(s, "events ({:?}): {}", p.event_source, names.join(", "));
    for u in &p.unavailable_events {
        let _ = writeln!(s, "not measured: {}: {}", u.name, u.reason);
    }
    let width = p.metrics.iter().map(String::len).chain([24]).max().unwrap_or(24);
    for t in &p.threads {
        let _ = writeln!(
            s,
            "\nthread {} tid {} name {:?}{}",
            t.index,
            t.tid,
            t.name,
            if t.exited { " (exited)" } else { "" }
        );
        for g in &t.regions {
            let parent = g.parent.map_or_else(|| "-".to_string(), |p| p.to_string());
            let _ = writeln!(
                s,
                "  region {} {:?} parent {} calls {} open {}",
                g.id, g.name, parent, g.calls, g.open
            );
            let _ = writeln!(s, "    {:<width$} {:>16} {:>16} {:>16}", "metric", "total", "min", "max");
            for name in &p.metrics {
                if let Some(m) = g.metrics.get(name) {
                    let _ = writeln!(s, "    {:<width$} {:>16} {:>16} {:>16}", name, m.total, m.min, m.max);
                }
            }
            for (k, v) in &g.derived {
                let _ = writeln!(s, "    {k:<width$} {v:>16}");
            }
        }
    }
    s
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RegionError> {
    let io = |source| RegionError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Writes the JSON and text reports now; returns the JSON file's path.
pub fn flush() -> Result<PathBuf, RegionError> {
    let setup = setup()?;
    let report = build(setup);
    let dir = &setup.output_directory;
    std::fs::create_dir_all(dir).map_err(|source| RegionError::Io { path: dir.clone(), source })?;
    let json_path = dir.join(format!("papirus_{}.json", report.process.pid));
    let mut json = serde_json::to_vec_pretty(&report)
        .map_err(|e| RegionError::Io { path: json_path.clone(), source: e.into() })?;
    json.push(b'\n');
    write_atomically(&json_path, &json)?;
    write_atomically(&json_path.with_extension("txt"), text(&report).as_bytes())?;
    Ok(json_path)
}

extern "C" fn write_at_exit() {
    // Unwinding out of an extern "C" function aborts: contain any panic.
    let r = std::panic::catch_unwind(flush);
    match r {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("papirus: region report at exit: {e}"),
        Err(_) => eprintln!("papirus: region report at exit: the writer panicked"),
    }
}

/// Registers the exit writer once per process.
pub(crate) fn register_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = papirus_substrate::exit::at_exit(write_at_exit) {
            eprintln!("papirus: cannot register the region report for exit ({e:?}); call report::flush()");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(total: i64) -> MetricStats {
        MetricStats { total, min: 0, max: total }
    }

    #[test]
    fn derived_metrics_need_their_inputs() {
        let mut metrics = BTreeMap::new();
        metrics.insert("real_time_ns".to_string(), m(2_000_000_000));
        metrics.insert("virtual_time_ns".to_string(), m(1_000_000_000));
        metrics.insert("page-faults".to_string(), m(500));
        let d = derived(&metrics);
        assert_eq!(d.get("cpu_utilisation"), Some(&0.5));
        assert_eq!(d.get("page_faults_per_s"), Some(&250.0));
        assert!(!d.contains_key("ipc") && !d.contains_key("mflops"));
        metrics.insert("PAPI_TOT_INS".to_string(), m(3000));
        metrics.insert("cycles".to_string(), m(1500));
        metrics.insert("PAPI_FP_OPS".to_string(), m(4_000_000));
        let d = derived(&metrics);
        assert_eq!(d.get("ipc"), Some(&2.0));
        // 4e6 ops in 2 s: 2 Mflop/s.
        assert_eq!(d.get("mflops"), Some(&2.0));
        metrics.insert("real_time_ns".to_string(), m(0));
        let d = derived(&metrics);
        assert!(!d.contains_key("cpu_utilisation") && d.contains_key("ipc"));
    }
}
