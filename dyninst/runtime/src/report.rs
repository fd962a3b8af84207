//! The profile a run leaves behind: versioned JSON, per thread and function.

use serde::{Deserialize, Serialize};

/// Version of the report format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// A probe run's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The probe that produced it (`wallclock` or `empty`).
    pub probe: String,
    /// Process id of the instrumented program.
    pub pid: u32,
    /// TSC ticks per second, measured over the run against CLOCK_MONOTONIC
    /// (0 when the probe takes no timestamps).
    pub ticks_per_second: f64,
    /// Counter events (counters probe), in the order of the counter columns.
    #[serde(default)]
    pub events: Vec<String>,
    /// Function names; a function's id is its index.
    pub functions: Vec<String>,
    /// One entry per thread that called an instrumented function, including exited threads.
    pub threads: Vec<ThreadReport>,
}

/// One thread's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadReport {
    /// Kernel thread id.
    pub tid: u32,
    /// Functions called at least once.
    pub functions: Vec<FunctionReport>,
    /// Caller → callee inclusive table (one level).
    pub callees: Vec<EdgeReport>,
    /// Activations still open when the report was taken (e.g. `main` during `attach`).
    pub open: u64,
    /// Calls made from a signal handler that interrupted a probe hook, left uninstrumented.
    pub reentered: u64,
    /// Calls left uninstrumented because the shadow stack was full.
    pub overflow: u64,
    /// Caller → callee pairs dropped because the thread's pair table was full.
    pub edge_overflow: u64,
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
