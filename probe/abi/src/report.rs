//! The profile a run leaves behind: versioned JSON, per thread and function.

use serde::{Deserialize, Serialize};

/// Version of the report format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 2;

/// A probe run's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The probe that produced it (`wallclock` or `empty`).
    pub probe: String,
    /// Process id of the instrumented program.
    pub pid: u32,
    /// TSC ticks per second: papirus-substrate's clock rate, or the rate
    /// measured over the run against CLOCK_MONOTONIC when the substrate does
    /// not use the TSC (0 when the probe takes no timestamps).
    pub ticks_per_second: f64,
    /// Counter events (counters probe), in the order of the counter columns.
    #[serde(default)]
    pub events: Vec<String>,
    /// Function names; a function's id is its index.
    pub functions: Vec<String>,
    /// Live threads that called an instrumented function, then per process
    /// one entry folding every exited thread (`exited_threads` > 0, `tid` 0).
    pub threads: Vec<ThreadReport>,
    /// When the measurement ran.
    #[serde(default)]
    pub window: Window,
    /// Every process of the measured tree: the target first, then forked children.
    #[serde(default)]
    pub processes: Vec<ProcessReport>,
    /// Threads that found no free table in the results segment (their calls were not measured).
    #[serde(default)]
    pub unmeasured_threads: u64,
}

/// The measurement window, in the tool's clocks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Start, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// End (when the figures were read), nanoseconds since the Unix epoch.
    pub end_unix_ns: u64,
    /// Duration on CLOCK_MONOTONIC.
    pub duration_ns: u64,
}

/// One process of the measured tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Process id.
    pub pid: u32,
    /// Parent's process id.
    pub parent: u32,
    /// How its measurement ended: `exit code 0`, `killed by SIGKILL`,
    /// `execve`, `detached`, `running`, `ended` (not our child: status unknown).
    pub ended: String,
    /// Threads whose figures were folded into the process' exited-threads entry.
    pub exited_threads: u64,
}

/// One thread's results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadReport {
    /// Kernel thread id (0 for the folded figures of exited threads).
    pub tid: u32,
    /// Process the thread belongs to.
    #[serde(default)]
    pub pid: u32,
    /// 0 for one thread; else how many exited threads these figures fold together.
    #[serde(default)]
    pub exited_threads: u64,
    /// This one thread has ended (its figures kept per thread on request).
    #[serde(default)]
    pub ended: bool,
    /// The figures were sampled while the thread kept writing them (each
    /// figure is whole, they may mix two moments).
    #[serde(default)]
    pub torn: bool,
    /// Functions called at least once.
    pub functions: Vec<FunctionReport>,
    /// Caller → callee inclusive table (one level).
    pub callees: Vec<EdgeReport>,
    /// Activations still open when the report was taken (e.g. `main` during `attach`).
    pub open: u64,
    /// Calls made from a signal handler that interrupted a probe hook, left uninstrumented.
    pub reentered: u64,
    /// Calls made deeper than the shadow stack: counted in `calls`, not timed.
    pub overflow: u64,
    /// Caller → callee pairs dropped because the thread's pair table was full.
    pub edge_overflow: u64,
    /// Why this thread's counters read nothing (counters probe; the kernel's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters_error: Option<String>,
}

/// One function's totals in one thread. Times are in TSC ticks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionReport {
    /// Function id (index into [`Report::functions`]).
    pub id: u32,
    /// Entries.
    pub calls: u64,
    /// Returns.
    pub exits: u64,
    /// Activations left without returning (longjmp, exception), closed when noticed.
    pub unwound: u64,
    /// Inclusive time; for recursion, only the outermost activation counts.
    pub incl_ticks: u64,
    /// Exclusive time: inclusive minus instrumented callees.
    pub excl_ticks: u64,
    /// Shortest activation.
    pub min_ticks: u64,
    /// Longest activation.
    pub max_ticks: u64,
    /// Inclusive counts per event of [`Report::events`] (outermost activations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters_incl: Vec<u64>,
    /// Exclusive counts per event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters_excl: Vec<u64>,
}

/// One caller → callee pair in one thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeReport {
    /// Calling function id.
    pub caller: u32,
    /// Called function id.
    pub callee: u32,
    /// Calls.
    pub calls: u64,
    /// Inclusive time of the callee under this caller, in ticks.
    pub incl_ticks: u64,
}

impl Report {
    /// Ticks as nanoseconds (0 when the probe took no timestamps).
    pub fn ns(&self, ticks: u64) -> f64 {
        if self.ticks_per_second > 0.0 { ticks as f64 * 1e9 / self.ticks_per_second } else { 0.0 }
    }

    /// The id of a function by name.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.functions.iter().position(|n| n == name).map(|i| i as u32)
    }

    /// A function's totals over all threads (min and max over all threads).
    pub fn total(&self, id: u32) -> FunctionReport {
        let mut out = FunctionReport { id, ..Default::default() };
        for f in self.threads.iter().flat_map(|t| t.functions.iter()).filter(|f| f.id == id) {
            let first = out.exits + out.unwound == 0;
            out.calls += f.calls;
            out.exits += f.exits;
            out.unwound += f.unwound;
            out.incl_ticks += f.incl_ticks;
            out.excl_ticks += f.excl_ticks;
            for (v, src) in
                [(&mut out.counters_incl, &f.counters_incl), (&mut out.counters_excl, &f.counters_excl)]
            {
                v.resize(v.len().max(src.len()), 0);
                for (a, b) in v.iter_mut().zip(src) {
                    *a += b;
                }
            }
            if f.exits + f.unwound > 0 {
                out.min_ticks = if first { f.min_ticks } else { out.min_ticks.min(f.min_ticks) };
                out.max_ticks = out.max_ticks.max(f.max_ticks);
            }
        }
        out
    }

    /// A caller → callee pair's totals over all threads: (calls, inclusive ticks).
    pub fn edge(&self, caller: u32, callee: u32) -> (u64, u64) {
        self.threads
            .iter()
            .flat_map(|t| t.callees.iter())
            .filter(|e| e.caller == caller && e.callee == callee)
            .fold((0, 0), |(c, i), e| (c + e.calls, i + e.incl_ticks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: u32, calls: u64, incl: u64, min: u64, max: u64) -> FunctionReport {
        FunctionReport {
            id,
            calls,
            exits: calls,
            incl_ticks: incl,
            excl_ticks: incl / 2,
            min_ticks: min,
            max_ticks: max,
            counters_incl: vec![calls * 10],
            ..Default::default()
        }
    }

    fn thread(tid: u32, functions: Vec<FunctionReport>) -> ThreadReport {
        ThreadReport {
            tid,
            functions,
            callees: vec![EdgeReport { caller: 0, callee: 1, calls: 3, incl_ticks: 30 }],
            ..Default::default()
        }
    }

    fn report() -> Report {
        Report {
            format_version: FORMAT_VERSION,
            probe: "counters".into(),
            pid: 1,
            ticks_per_second: 2e9,
            events: vec!["page-faults".into()],
            functions: vec!["main".into(), "f".into()],
            threads: vec![
                thread(1, vec![f(0, 1, 100, 100, 100), f(1, 3, 30, 5, 20)]),
                thread(2, vec![f(1, 2, 40, 7, 33)]),
            ],
            window: Window::default(),
            processes: vec![],
            unmeasured_threads: 0,
        }
    }

    #[test]
    fn totals_over_threads() {
        let r = report();
        let t = r.total(r.id("f").unwrap());
        assert_eq!((t.calls, t.exits, t.incl_ticks, t.excl_ticks), (5, 5, 70, 35));
        assert_eq!((t.min_ticks, t.max_ticks), (5, 33));
        assert_eq!(t.counters_incl, [50]);
        assert_eq!(r.edge(0, 1), (6, 60));
        assert_eq!(r.edge(1, 0), (0, 0));
        assert_eq!(r.ns(2000), 1000.0);
        assert_eq!(r.id("nope"), None);
    }

    #[test]
    fn json_round_trip_and_old_readers_defaults() {
        let r = report();
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), r);
        // A wallclock report has no events and no counter columns.
        let mut w = report();
        w.events.clear();
        for t in &mut w.threads {
            for f in &mut t.functions {
                f.counters_incl.clear();
            }
        }
        let text = serde_json::to_string(&w).unwrap();
        assert!(!text.contains("counters_incl"));
        assert_eq!(serde_json::from_str::<Report>(&text.replace(",\"events\":[]", "")).unwrap(), w);
    }
}
