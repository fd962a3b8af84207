//! The profile a run leaves behind: versioned JSON (schema:
//! `probe/abi/schema/report.schema.json`), per thread a call-path tree and
//! the flat per-function figures and caller → callee pairs derived from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the report format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 3;

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
    /// The call-path tree: every distinct path of instrumented functions
    /// from the thread's first instrumented call, parents before children.
    pub tree: Vec<NodeReport>,
    /// Functions called at least once: sums over [`ThreadReport::tree`]
    /// ([`ThreadReport::derive`]).
    pub functions: Vec<FunctionReport>,
    /// Caller → callee pairs (one level): sums over the tree's parent → child links.
    pub callees: Vec<EdgeReport>,
    /// Activations still open when the report was taken (e.g. `main` during `attach`).
    pub open: u64,
    /// Calls made from a signal handler that interrupted a probe hook, left uninstrumented.
    pub reentered: u64,
    /// Calls made deeper than the shadow stack: neither timed nor in the tree.
    pub overflow: u64,
    /// Calls on new paths beyond the tree's bound: left out of the tree
    /// (their time stays in their callers' exclusive time).
    pub node_overflow: u64,
    /// Why this thread's counters read nothing (counters probe; the kernel's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters_error: Option<String>,
}

/// One node of a call-path tree: one path of instrumented functions. Times
/// are in TSC ticks; recursion keeps one node per level, so a node's
/// inclusive time counts each of its activations once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The parent node's index in the tree, `None` for a call made from no
    /// instrumented function (the thread's root).
    pub parent: Option<u32>,
    /// Function id (index into [`Report::functions`]).
    pub function: u32,
    /// The path's figures; its minimum is 0 when no activation closed.
    #[serde(flatten)]
    pub figures: Figures,
}

/// One function's totals in one thread: sums over its tree nodes. Times are
/// in TSC ticks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionReport {
    /// Function id (index into [`Report::functions`]).
    pub id: u32,
    /// The function's figures; for recursion, the inclusive time and counts
    /// are those of the outermost activations only (tree nodes without an
    /// ancestor of the same function).
    #[serde(flatten)]
    pub figures: Figures,
}

/// What a tree node and a function's totals count, in the same JSON fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Entries.
    pub calls: u64,
    /// Returns.
    pub exits: u64,
    /// Activations left without returning (longjmp, exception, thread exit).
    pub unwound: u64,
    /// Inclusive time of the closed activations.
    pub incl_ticks: u64,
    /// Exclusive time: inclusive minus the instrumented callees' inclusive.
    pub excl_ticks: u64,
    /// Shortest closed activation.
    pub min_ticks: u64,
    /// Longest closed activation.
    pub max_ticks: u64,
    /// Inclusive counts per event of [`Report::events`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters_incl: Vec<u64>,
    /// Exclusive counts per event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters_excl: Vec<u64>,
}

impl Figures {
    /// Adds `other`'s figures, saturating (a report file is data); its
    /// inclusive time and counts only when `inclusive` (else the counter
    /// columns still widen to `other`'s). Minimum and maximum are over the
    /// closed activations of both.
    pub fn add(&mut self, other: &Figures, inclusive: bool) {
        let closed_before = self.exits.saturating_add(self.unwound);
        for (a, b) in [
            (&mut self.calls, other.calls),
            (&mut self.exits, other.exits),
            (&mut self.unwound, other.unwound),
            (&mut self.excl_ticks, other.excl_ticks),
        ] {
            *a = a.saturating_add(b);
        }
        if other.exits.saturating_add(other.unwound) > 0 {
            self.min_ticks =
                if closed_before == 0 { other.min_ticks } else { self.min_ticks.min(other.min_ticks) };
            self.max_ticks = self.max_ticks.max(other.max_ticks);
        }
        add_counts(&mut self.counters_excl, &other.counters_excl);
        if inclusive {
            self.incl_ticks = self.incl_ticks.saturating_add(other.incl_ticks);
            add_counts(&mut self.counters_incl, &other.counters_incl);
        } else if self.counters_incl.len() < other.counters_incl.len() {
            self.counters_incl.resize(other.counters_incl.len(), 0);
        }
    }
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

impl ThreadReport {
    /// Sets [`ThreadReport::functions`] and [`ThreadReport::callees`] from
    /// the tree, the only way they are made, so they cannot disagree with it.
    /// Figures saturate: a report file is data.
    pub fn derive(&mut self) {
        let mut funcs: BTreeMap<u32, FunctionReport> = BTreeMap::new();
        let mut edges: BTreeMap<(u32, u32), EdgeReport> = BTreeMap::new();
        let outermost = self.outermost();
        for (i, n) in self.tree.iter().enumerate() {
            let f = funcs
                .entry(n.function)
                .or_insert_with(|| FunctionReport { id: n.function, ..Default::default() });
            // Inclusive figures count the outermost activation of a recursion only.
            f.figures.add(&n.figures, outermost[i]);
            if let Some(p) = n.parent.and_then(|p| self.tree.get(p as usize)) {
                let e = edges.entry((p.function, n.function)).or_insert_with(|| EdgeReport {
                    caller: p.function,
                    callee: n.function,
                    calls: 0,
                    incl_ticks: 0,
                });
                e.calls = e.calls.saturating_add(n.figures.calls);
                e.incl_ticks = e.incl_ticks.saturating_add(n.figures.incl_ticks);
            }
        }
        self.functions = funcs.into_values().filter(|f| f.figures.calls > 0).collect();
        self.callees = edges.into_values().collect();
    }

    /// Per node, whether no ancestor calls the same function (the
    /// outermost activation of a recursion): one walk down the tree with a
    /// count of each function on the current path. A parent index that
    /// does not come before its child makes the node a root.
    pub fn outermost(&self) -> Vec<bool> {
        let n = self.tree.len();
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut roots = Vec::new();
        for (i, node) in self.tree.iter().enumerate() {
            match node.parent.map(|p| p as usize) {
                Some(p) if p < i => children[p].push(i),
                _ => roots.push(i),
            }
        }
        let mut out = vec![true; n];
        let mut on_path: BTreeMap<u32, u32> = BTreeMap::new();
        // (node, entering): a node is entered, then its children, then left.
        let mut todo: Vec<(usize, bool)> = roots.into_iter().rev().map(|r| (r, true)).collect();
        while let Some((i, entering)) = todo.pop() {
            let f = self.tree[i].function;
            if entering {
                let c = on_path.entry(f).or_default();
                out[i] = *c == 0;
                *c += 1;
                todo.push((i, false));
                todo.extend(children[i].iter().rev().map(|&c| (c, true)));
            } else if let Some(c) = on_path.get_mut(&f) {
                *c -= 1;
            }
        }
        out
    }
}

fn add_counts(into: &mut Vec<u64>, from: &[u64]) {
    into.resize(into.len().max(from.len()), 0);
    for (a, b) in into.iter_mut().zip(from) {
        *a = a.saturating_add(*b);
    }
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
            out.figures.add(&f.figures, true);
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
            figures: Figures {
                calls,
                exits: calls,
                incl_ticks: incl,
                excl_ticks: incl / 2,
                min_ticks: min,
                max_ticks: max,
                counters_incl: vec![calls * 10],
                ..Default::default()
            },
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
        let t = r.total(r.id("f").unwrap()).figures;
        assert_eq!((t.calls, t.exits, t.incl_ticks, t.excl_ticks), (5, 5, 70, 35));
        assert_eq!((t.min_ticks, t.max_ticks), (5, 33));
        assert_eq!(t.counters_incl, [50]);
        assert_eq!(r.edge(0, 1), (6, 60));
        assert_eq!(r.edge(1, 0), (0, 0));
        assert_eq!(r.ns(2000), 1000.0);
        assert_eq!(r.id("nope"), None);
    }

    #[test]
    fn flat_figures_and_pairs_are_the_trees_sums() {
        let n = |parent, function, calls, incl, excl| NodeReport {
            parent,
            function,
            figures: Figures {
                calls,
                exits: calls,
                incl_ticks: incl,
                excl_ticks: excl,
                min_ticks: 1,
                max_ticks: incl,
                ..Default::default()
            },
        };
        // main → fib → fib → fib, main → g, fib → g.
        let mut t = ThreadReport {
            tree: vec![
                n(None, 0, 1, 100, 10),
                n(Some(0), 1, 1, 80, 20),
                n(Some(1), 1, 2, 50, 40),
                n(Some(2), 1, 4, 10, 10),
                n(Some(0), 2, 3, 10, 10),
                n(Some(1), 2, 1, 10, 10),
            ],
            ..Default::default()
        };
        assert_eq!(t.outermost(), [true, true, false, false, true, true]);
        t.derive();
        let f = |id| t.functions.iter().find(|f| f.id == id).unwrap().figures.clone();
        // Inclusive time of a recursion: its outermost level only.
        assert_eq!((f(1).calls, f(1).incl_ticks, f(1).excl_ticks, f(1).max_ticks), (7, 80, 70, 80));
        assert_eq!((f(2).calls, f(2).incl_ticks, f(0).incl_ticks), (4, 20, 100));
        let e: Vec<_> = t.callees.iter().map(|e| (e.caller, e.callee, e.calls, e.incl_ticks)).collect();
        assert_eq!(e, [(0, 1, 1, 80), (0, 2, 3, 10), (1, 1, 6, 60), (1, 2, 1, 10)]);
        // A crafted tree whose links point forward or nowhere neither loops nor panics.
        t.tree[1].parent = Some(5);
        t.tree[2].parent = Some(u32::MAX);
        t.derive();
        assert_eq!(t.functions.iter().map(|f| f.figures.calls).sum::<u64>(), 12);
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
                f.figures.counters_incl.clear();
            }
        }
        let text = serde_json::to_string(&w).unwrap();
        assert!(!text.contains("counters_incl"));
        assert_eq!(serde_json::from_str::<Report>(&text.replace(",\"events\":[]", "")).unwrap(), w);
    }

    /// A format-3 report as the tool wrote it reads back and writes out
    /// byte for byte: figures above 2^53 and the tick rate stay exact.
    #[test]
    fn a_written_report_reads_and_writes_back_unchanged() {
        let text = include_str!("../testdata/report-format-3.json");
        let r: Report = serde_json::from_str(text).unwrap();
        assert_eq!(r.threads[0].tree[0].figures.incl_ticks, u64::MAX);
        assert_eq!(r.threads[0].functions[0].figures.counters_excl, [1, (1 << 53) + 1]);
        assert_eq!(r.ticks_per_second, 2_893_437_123.456_789);
        assert_eq!(String::from_utf8(serde_json::to_vec_pretty(&r).unwrap()).unwrap(), text);
    }
}
