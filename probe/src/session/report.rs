//! The text report of a probe run: a header naming the units, a flat
//! profile per thread and summed over threads, then the caller → callee
//! table; or a short summary (totals and the top functions).
//!
//! Times are microseconds with three decimals (nanosecond resolution) in
//! every column; a nonzero time under half a nanosecond prints `<0.001`.
//! Exclusive figures never exceed inclusive ones in print: where the data
//! says otherwise (activations open across the measurement boundary) the
//! exclusive figure is clamped and marked `*`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use papirus_probe_abi::{FunctionReport, Report};

use super::escape;
use super::select::is_internal_hook;
use crate::patch::{Installed, Refused};

/// Column a profile is sorted by (descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Exclusive time.
    #[default]
    Excl,
    /// Inclusive time.
    Incl,
    /// Calls.
    Calls,
}

impl std::str::FromStr for SortKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "excl" => Ok(SortKey::Excl),
            "incl" => Ok(SortKey::Incl),
            "calls" => Ok(SortKey::Calls),
            other => Err(format!("unknown sort key `{other}`: use excl, incl or calls")),
        }
    }
}

/// The probe's own cost per instrumented call, from a calibrate cost file.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeCost {
    /// Nanoseconds one instrumented call adds (probe row minus the uninstrumented call).
    pub ns_per_call: f64,
    /// Where the figure comes from (cost file and row), for the header.
    pub source: String,
    /// Whether to subtract it from the printed times.
    pub subtract: bool,
}

/// How to print a report.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Only this thread.
    pub thread: Option<u32>,
    /// Sort column.
    pub sort: SortKey,
    /// Only the first N rows of each table.
    pub top: Option<usize>,
    /// Whole function names instead of names cut to [`NAME_WIDTH`].
    pub wide: bool,
    /// The probe's cost per call, when known.
    pub cost: Option<ProbeCost>,
    /// Lines for the header beyond what the report holds (how the target
    /// ended, the measurement window), printed as `key: value`.
    pub notes: Vec<(String, String)>,
}

/// Width of the function column unless [`View::wide`].
pub const NAME_WIDTH: usize = 40;

/// A nanosecond figure as microseconds with three decimals.
fn us(ns: f64) -> String {
    if ns <= 0.0 {
        "0".into()
    } else if ns < 0.5 {
        "<0.001".into()
    } else {
        format!("{:.3}", ns / 1e3)
    }
}

/// The unit the kernel counts `event` in.
fn event_unit(event: &str) -> &'static str {
    let bare = event.split(':').next().unwrap_or(event);
    match bare {
        "task-clock" | "cpu-clock" | "duration_time" => "ns",
        "msr/tsc/" | "tsc" => "TSC ticks",
        _ => "count",
    }
}

/// A function's printed figures, cost subtracted when asked, exclusive clamped to inclusive.
struct Row {
    name: String,
    calls: u64,
    unwound: u64,
    incl_ns: f64,
    excl_ns: f64,
    min_ns: f64,
    max_ns: f64,
    clamped: bool,
    counters: Vec<(u64, u64, bool)>,
}

/// The longest caller → callee chain followed when subtracting the probe's cost.
const MAX_CHAIN: usize = 4096;

/// Calls each function makes to instrumented functions: directly, and in all
/// (descendants, recursion counted once), from the caller → callee pairs.
fn callee_calls(
    edges: &BTreeMap<(u32, u32), (u64, u64)>,
    calls: &BTreeMap<u32, u64>,
) -> BTreeMap<u32, (f64, f64)> {
    fn all(
        id: u32,
        edges: &BTreeMap<(u32, u32), (u64, u64)>,
        calls: &BTreeMap<u32, u64>,
        memo: &mut BTreeMap<u32, f64>,
        path: &mut BTreeSet<u32>,
    ) -> f64 {
        if let Some(v) = memo.get(&id) {
            return *v;
        }
        // A cycle counts once; a chain deeper than any real stack (a crafted
        // report) is cut rather than overflowing ours.
        if path.len() >= MAX_CHAIN || !path.insert(id) {
            return 0.0;
        }
        let mut sum = 0.0;
        for (&(_, callee), &(n, _)) in edges.range((id, 0)..=(id, u32::MAX)) {
            let per_call = match calls.get(&callee) {
                Some(&c) if c > 0 && callee != id => all(callee, edges, calls, memo, path) / c as f64,
                _ => 0.0,
            };
            sum += n as f64 * (1.0 + per_call);
        }
        path.remove(&id);
        memo.insert(id, sum);
        sum
    }
    let mut memo = BTreeMap::new();
    calls
        .keys()
        .map(|&id| {
            let direct =
                edges.range((id, 0)..=(id, u32::MAX)).fold(0u64, |a, (_, (n, _))| a.saturating_add(*n));
            (id, (direct as f64, all(id, edges, calls, &mut memo, &mut BTreeSet::new())))
        })
        .collect()
}

fn rows(
    r: &Report,
    fs: &[FunctionReport],
    edges: &BTreeMap<(u32, u32), (u64, u64)>,
    view: &View,
) -> Vec<Row> {
    let calls: BTreeMap<u32, u64> = fs.iter().map(|f| (f.id, f.figures.calls)).collect();
    let inner = match &view.cost {
        Some(c) if c.subtract => callee_calls(edges, &calls),
        _ => BTreeMap::new(),
    };
    let cost = view.cost.as_ref().filter(|c| c.subtract).map_or(0.0, |c| c.ns_per_call);
    fs.iter()
        .map(|f| {
            let (direct, all) = inner.get(&f.id).copied().unwrap_or_default();
            let incl_ns = (r.ns(f.figures.incl_ticks) - cost * all).max(0.0);
            let excl_raw = (r.ns(f.figures.excl_ticks) - cost * direct).max(0.0);
            let counters = (0..r.events.len())
                .map(|i| {
                    let incl = f.figures.counters_incl.get(i).copied().unwrap_or(0);
                    let excl = f.figures.counters_excl.get(i).copied().unwrap_or(0);
                    (incl, excl.min(incl), excl > incl)
                })
                .collect();
            Row {
                name: escape(r.functions.get(f.id as usize).map_or("?", String::as_str)),
                calls: f.figures.calls,
                unwound: f.figures.unwound,
                incl_ns,
                excl_ns: excl_raw.min(incl_ns),
                min_ns: r.ns(f.figures.min_ticks),
                max_ns: r.ns(f.figures.max_ticks),
                clamped: excl_raw > incl_ns,
                counters,
            }
        })
        .collect()
}

/// `name` cut to `width` characters, the cut marked with `…`.
fn fit(name: &str, width: usize) -> String {
    if name.chars().count() <= width {
        name.to_string()
    } else {
        let mut s: String = name.chars().take(width.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

fn table(out: &mut String, r: &Report, mut rows: Vec<Row>, view: &View) -> bool {
    rows.sort_by(|a, b| match view.sort {
        SortKey::Excl => b.excl_ns.total_cmp(&a.excl_ns),
        SortKey::Incl => b.incl_ns.total_cmp(&a.incl_ns),
        SortKey::Calls => b.calls.cmp(&a.calls),
    });
    let hidden = view.top.map_or(0, |n| rows.len().saturating_sub(n));
    rows.truncate(rows.len() - hidden);
    let width = if view.wide {
        rows.iter().map(|r| r.name.chars().count()).max().unwrap_or(0).max(8)
    } else {
        NAME_WIDTH
    };
    let timed = r.ticks_per_second > 0.0;
    let _ = write!(
        out,
        "  {:<width$} {:>10} {:>8} {:>14} {:>14} {:>10} {:>12}",
        "function", "calls", "unwound", "incl us", "excl us", "min us", "max us"
    );
    for e in &r.events {
        let _ = write!(out, " {:>18} {:>18}", format!("{} incl", escape(e)), format!("{} excl", escape(e)));
    }
    let _ = writeln!(out);
    let mut clamped = false;
    for row in &rows {
        let t = |ns: f64| if timed { us(ns) } else { "-".into() };
        let mark = if row.clamped { "*" } else { "" };
        let _ = write!(
            out,
            "  {:<width$} {:>10} {:>8} {:>14} {:>14} {:>10} {:>12}",
            fit(&row.name, width),
            row.calls,
            row.unwound,
            t(row.incl_ns),
            format!("{}{mark}", t(row.excl_ns)),
            t(row.min_ns),
            t(row.max_ns)
        );
        for &(incl, excl, c) in &row.counters {
            let _ = write!(out, " {:>18} {:>18}", incl, format!("{excl}{}", if c { "*" } else { "" }));
            clamped |= c;
        }
        let _ = writeln!(out);
        clamped |= row.clamped;
    }
    if hidden > 0 {
        let _ = writeln!(out, "  … {hidden} more (--top to show more)");
    }
    clamped
}

fn header(out: &mut String, r: &Report, view: &View) {
    let _ = writeln!(
        out,
        "papirus-probe report: pid {}, probe {}, threads: {}, functions selected: {}",
        r.pid,
        escape(&r.probe),
        r.threads.len(),
        r.functions.len()
    );
    for (k, v) in &view.notes {
        let _ = writeln!(out, "  {k}: {v}");
    }
    if r.ticks_per_second > 0.0 {
        let _ = writeln!(
            out,
            "  times: microseconds (us) of wall-clock time; incl = with callees, excl = the function's own"
        );
    } else {
        let _ = writeln!(out, "  times: none (the {} probe counts calls only)", escape(&r.probe));
    }
    if !r.events.is_empty() {
        let units: Vec<String> =
            r.events.iter().map(|e| format!("{} [{}]", escape(e), event_unit(e))).collect();
        let _ = writeln!(out, "  counters: raw kernel values, scale ×1: {}", units.join(", "));
    }
    match &view.cost {
        Some(c) => {
            let _ = writeln!(
                out,
                "  probe cost: {:.1} ns added per instrumented call ({}); {}",
                c.ns_per_call,
                c.source,
                if c.subtract {
                    "subtracted from incl and excl times (min and max left as measured)"
                } else {
                    "included in the times (--subtract-cost removes it)"
                }
            );
        }
        None => {
            let _ = writeln!(out, "  probe cost: included in the times (--costs FILE estimates it)");
        }
    }
}

fn edges_of(r: &Report, thread: Option<u32>) -> BTreeMap<(u32, u32), (u64, u64)> {
    let mut edges: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    for t in r.threads.iter().filter(|t| thread.is_none_or(|n| n == t.tid)) {
        for e in &t.callees {
            let v = edges.entry((e.caller, e.callee)).or_default();
            // Report files are data: saturate rather than overflow.
            v.0 = v.0.saturating_add(e.calls);
            v.1 = v.1.saturating_add(e.incl_ticks);
        }
    }
    edges
}

fn totals(r: &Report) -> Vec<FunctionReport> {
    let ids: BTreeSet<u32> = r.threads.iter().flat_map(|t| t.functions.iter().map(|f| f.id)).collect();
    ids.into_iter().map(|id| r.total(id)).collect()
}

const SUM_LABEL: &str = "all threads (sums across threads: with several threads running at once, \
    times add up to more than the wall-clock time)";
const CLAMP_NOTE: &str = "  * exclusive clamped to inclusive: activations open across the measurement boundary \
    (or more probe cost subtracted from inclusive than from exclusive)";

/// Formats the report: every thread (or only `view.thread`), the sum over all
/// threads, then the caller → callee table.
pub fn format_report(r: &Report, view: &View) -> String {
    let mut out = String::new();
    header(&mut out, r, view);
    let mut clamped = false;
    for t in r.threads.iter().filter(|t| view.thread.is_none_or(|n| n == t.tid)) {
        if t.exited_threads > 0 {
            let _ = writeln!(out, "\n{} exited threads of pid {}", t.exited_threads, t.pid);
        } else {
            let _ = writeln!(out, "\nthread {}", t.tid);
        }
        let edges = edges_of(r, Some(t.tid));
        clamped |= table(&mut out, r, rows(r, &t.functions, &edges, view), view);
        if t.open > 0 {
            let _ = writeln!(out, "  open (unfinished) activations when the report was written: {}", t.open);
        }
        if t.overflow > 0 {
            let _ = writeln!(
                out,
                "  ({} calls deeper than the shadow stack: not timed, not in the figures)",
                t.overflow
            );
        }
        if t.reentered.saturating_add(t.node_overflow) > 0 {
            let _ = writeln!(
                out,
                "  (uninstrumented: {} calls from signal handlers inside a hook; {} calls on paths \
                 beyond the call-path tree's bound, their time in their callers' exclusive time)",
                t.reentered, t.node_overflow
            );
        }
        if let Some(e) = &t.counters_error {
            let _ = writeln!(out, "  (no counters on this thread: {})", escape(e));
        }
    }
    let edges = edges_of(r, view.thread);
    if view.thread.is_none() && r.threads.len() > 1 {
        let _ = writeln!(out, "\n{SUM_LABEL}");
        clamped |= table(&mut out, r, rows(r, &totals(r), &edges, view), view);
    }
    if clamped {
        let _ = writeln!(out, "{CLAMP_NOTE}");
    }
    let _ = writeln!(out, "\ncaller -> callee (inclusive time of the callee under this caller)");
    // A callee's time under one caller is part of its own inclusive time:
    // nested recursive activations would count it again.
    let mut callee_incl: BTreeMap<u32, u64> = BTreeMap::new();
    for t in r.threads.iter().filter(|t| view.thread.is_none_or(|n| n == t.tid)) {
        for f in &t.functions {
            let v = callee_incl.entry(f.id).or_default();
            *v = v.saturating_add(f.figures.incl_ticks);
        }
    }
    let mut list: Vec<_> = edges.into_iter().collect();
    list.sort_by_key(|(_, (_, incl))| std::cmp::Reverse(*incl));
    let hidden = view.top.map_or(0, |n| list.len().saturating_sub(n));
    list.truncate(list.len() - hidden);
    let name = |id: u32| escape(r.functions.get(id as usize).map_or("?", String::as_str));
    for ((caller, callee), (calls, incl)) in list {
        let bound = callee_incl.get(&callee).copied().unwrap_or(0);
        let t = if r.ticks_per_second == 0.0 {
            "-".into()
        } else if caller == callee {
            format!("recursive: time within {}'s inclusive time", name(callee))
        } else if incl > bound {
            format!("{} us (recursion: bounded by the callee's inclusive time)", us(r.ns(bound)))
        } else {
            format!("{} us", us(r.ns(incl)))
        };
        let _ = writeln!(out, "  {} -> {}: {} calls, {}", name(caller), name(callee), calls, t);
    }
    if hidden > 0 {
        let _ = writeln!(out, "  … {hidden} more pairs");
    }
    out
}

/// What `report --tree` shows of each thread's call-path tree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TreeView {
    /// Levels shown (1: the outermost calls only); all when `None`.
    pub depth: Option<usize>,
    /// Nodes whose inclusive time is below this fraction of their thread's
    /// total are left out (counted in a closing line).
    pub threshold: f64,
}

/// The header, then per thread its call-path tree: inclusive and exclusive
/// time, calls, and the function indented by its depth, children by
/// inclusive time.
pub fn format_tree(r: &Report, view: &View, tree: &TreeView) -> String {
    let mut out = String::new();
    header(&mut out, r, view);
    let timed = r.ticks_per_second > 0.0;
    for t in r.threads.iter().filter(|t| view.thread.is_none_or(|n| n == t.tid)) {
        if t.exited_threads > 0 {
            let _ = writeln!(out, "\n{} exited threads of pid {}", t.exited_threads, t.pid);
        } else {
            let _ = writeln!(out, "\nthread {}", t.tid);
        }
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); t.tree.len()];
        let mut roots = Vec::new();
        for (i, n) in t.tree.iter().enumerate() {
            match n.parent.map(|p| p as usize).filter(|&p| p < i) {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
        }
        let key = |i: &usize| {
            std::cmp::Reverse(if timed { t.tree[*i].figures.incl_ticks } else { t.tree[*i].figures.calls })
        };
        roots.sort_by_key(key);
        for c in &mut children {
            c.sort_by_key(key);
        }
        let total: u64 = roots.iter().map(|&i| t.tree[i].figures.incl_ticks).fold(0, u64::saturating_add);
        let cut = (tree.threshold * total as f64) as u64;
        let _ = writeln!(out, "  {:>14} {:>14} {:>10}  function", "incl us", "excl us", "calls");
        let (mut hidden, mut hidden_ticks, mut deeper) = (0u64, 0u64, 0u64);
        let mut todo: Vec<(usize, usize)> = roots.iter().rev().map(|&i| (i, 0)).collect();
        while let Some((i, level)) = todo.pop() {
            let n = &t.tree[i];
            if timed && n.figures.incl_ticks < cut {
                hidden += 1;
                hidden_ticks = hidden_ticks.saturating_add(n.figures.incl_ticks);
                continue;
            }
            if tree.depth.is_some_and(|d| level >= d) {
                deeper += 1;
                continue;
            }
            let time = |ticks: u64| if timed { us(r.ns(ticks)) } else { "-".into() };
            let name = escape(r.functions.get(n.function as usize).map_or("?", String::as_str));
            let name = if view.wide { name } else { fit(&name, NAME_WIDTH) };
            let _ = writeln!(
                out,
                "  {:>14} {:>14} {:>10}  {}{name}",
                time(n.figures.incl_ticks),
                time(n.figures.excl_ticks),
                n.figures.calls,
                "  ".repeat(level)
            );
            todo.extend(children[i].iter().rev().map(|&c| (c, level + 1)));
        }
        if hidden > 0 {
            let _ = writeln!(
                out,
                "  ({hidden} subtrees under the threshold of {:.2}% of the thread's time, {} us in all, not shown)",
                tree.threshold * 100.0,
                us(r.ns(hidden_ticks))
            );
        }
        if deeper > 0 {
            let _ = writeln!(
                out,
                "  ({deeper} subtrees deeper than {} levels not shown)",
                tree.depth.unwrap_or(0)
            );
        }
    }
    out
}

/// A short summary: the header, totals, and the top functions summed over threads.
pub fn format_summary(r: &Report, view: &View) -> String {
    let mut out = String::new();
    header(&mut out, r, view);
    let all = totals(r);
    let calls = all.iter().fold(0u64, |a, f| a.saturating_add(f.figures.calls));
    let open = r.threads.iter().fold(0u64, |a, t| a.saturating_add(t.open));
    let called = all.iter().filter(|f| f.figures.calls > 0).count();
    let _ = writeln!(
        out,
        "  totals: {calls} calls of {called} distinct functions; threads: {}; activations open at the end: {open}",
        r.threads.len()
    );
    let deep = r.threads.iter().fold(0u64, |a, t| a.saturating_add(t.overflow));
    if deep > 0 {
        let _ = writeln!(out, "  ({deep} calls deeper than the shadow stack: not timed, not in the figures)");
    }
    let top = View { top: Some(view.top.unwrap_or(10)), ..view.clone() };
    let label = if r.threads.len() > 1 { SUM_LABEL } else { "top functions" };
    let _ = writeln!(out, "\n{label}");
    if table(&mut out, r, rows(r, &all, &edges_of(r, None), &top), &top) {
        let _ = writeln!(out, "{CLAMP_NOTE}");
    }
    out
}

/// The lines of [`super::print_summary`].
pub(super) fn write_summary(
    out: &mut impl std::io::Write,
    installed: &[Installed],
    refused: &[Refused],
) -> std::io::Result<()> {
    let mut groups: Vec<(String, Vec<&Refused>)> = Vec::new();
    for r in refused.iter().filter(|r| !is_internal_hook(&r.name)) {
        let reason = r.reason.to_string();
        match groups.iter_mut().find(|(g, _)| *g == reason) {
            Some((_, v)) => v.push(r),
            None => groups.push((reason, vec![r])),
        }
    }
    for (reason, rs) in &groups {
        match rs.as_slice() {
            [r] => writeln!(out, "papirus-probe: refused {} at {:#x}: {reason}", escape(&r.name), r.addr)?,
            _ => {
                let shown: Vec<String> = rs.iter().take(3).map(|r| escape(&r.name)).collect();
                let more = if rs.len() > 3 { ", …" } else { "" };
                writeln!(
                    out,
                    "papirus-probe: refused {} functions ({}{more}): {reason}",
                    rs.len(),
                    shown.join(", ")
                )?;
            }
        }
    }
    let hooks = installed.iter().filter(|i| is_internal_hook(&i.name)).count();
    let refused_hooks = refused.iter().filter(|r| is_internal_hook(&r.name)).count();
    write!(
        out,
        "papirus-probe: instrumented {} functions, refused {}",
        installed.len() - hooks,
        refused.len() - refused_hooks
    )?;
    if hooks + refused_hooks > 0 {
        write!(out, " (plus {} unwinder hooks of papirus' own", hooks + refused_hooks)?;
        if refused_hooks > 0 {
            write!(
                out,
                "; {refused_hooks} refused: C++ exceptions through instrumented frames may misreport"
            )?;
        }
        write!(out, ")")?;
    }
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use papirus_probe_abi::{EdgeReport, FORMAT_VERSION, Figures, ThreadReport};

    fn report(names: &[&str], threads: Vec<ThreadReport>) -> Report {
        Report {
            format_version: FORMAT_VERSION,
            probe: "wallclock".into(),
            pid: 7,
            ticks_per_second: 1e9,
            events: vec![],
            functions: names.iter().map(|s| s.to_string()).collect(),
            threads,
            window: Default::default(),
            processes: Vec::new(),
            unmeasured_threads: 0,
        }
    }

    fn thread(tid: u32, functions: Vec<FunctionReport>, callees: Vec<EdgeReport>) -> ThreadReport {
        ThreadReport { tid, functions, callees, ..Default::default() }
    }

    fn f(id: u32, calls: u64, incl: u64, excl: u64) -> FunctionReport {
        let figures =
            Figures { calls, exits: calls, incl_ticks: incl, excl_ticks: excl, ..Default::default() };
        FunctionReport { id, figures }
    }

    #[test]
    fn table_sorts_filters_and_names_pairs() {
        let edge = EdgeReport { caller: 0, callee: 1, calls: 9, incl_ticks: 1000 };
        let t = |tid| thread(tid, vec![f(0, 1, 4000, 3000), f(1, 9, 4000, 1000)], vec![edge.clone()]);
        let r = report(&["main", "leaf"], vec![t(7), t(8)]);
        let text = format_report(&r, &View::default());
        assert!(text.find("  main ").unwrap() < text.find("  leaf ").unwrap());
        assert!(text.contains("all threads (sums across threads"));
        assert!(text.contains("main -> leaf: 18 calls, 2.000 us"), "{text}");
        assert!(text.contains("microseconds (us)"), "{text}");
        let text = format_report(&r, &View { thread: Some(8), sort: SortKey::Calls, ..View::default() });
        assert!(text.find("  leaf ").unwrap() < text.find("  main ").unwrap());
        assert_eq!(text.matches("\nthread ").count(), 1);
        assert!(!text.contains("all threads"));
        assert!("bogus".parse::<SortKey>().is_err());
    }

    #[test]
    fn small_times_names_and_clamping() {
        let mut tiny = f(0, 3, 30, 30);
        tiny.figures.min_ticks = 7;
        let r = report(
            &["tiny\x1b[31mred", &format!("ns::{}", "long_name".repeat(10)), "open"],
            vec![thread(1, vec![tiny, f(1, 1, 10, 10), f(2, 1, 5, 9)], vec![])],
        );
        let text = format_report(&r, &View::default());
        assert!(text.contains("0.007"), "sub-10 ns minimum lost: {text}");
        assert!(!text.contains('\x1b') && text.contains("\\u{1b}"), "{text}");
        assert!(text.contains('…') && !text.contains(&"long_name".repeat(10)), "{text}");
        assert!(text.contains("0.005*") && text.contains("clamped"), "{text}");
        let wide = format_report(&r, &View { wide: true, ..View::default() });
        assert!(wide.contains(&"long_name".repeat(10)), "{wide}");
    }

    #[test]
    fn cost_is_shown_and_subtracted_per_inner_call() {
        // main calls mid once; mid calls leaf 4 times; 10 ns per call.
        let edges = vec![
            EdgeReport { caller: 0, callee: 1, calls: 1, incl_ticks: 500 },
            EdgeReport { caller: 1, callee: 2, calls: 4, incl_ticks: 200 },
        ];
        let r = report(
            &["main", "mid", "leaf"],
            vec![thread(1, vec![f(0, 1, 1000, 500), f(1, 1, 500, 300), f(2, 4, 200, 200)], edges)],
        );
        let cost = |subtract| ProbeCost { ns_per_call: 10.0, source: "costs.json".into(), subtract };
        let shown = format_report(&r, &View { cost: Some(cost(false)), ..View::default() });
        assert!(shown.contains("10.0 ns added per instrumented call"), "{shown}");
        let sub = format_report(&r, &View { cost: Some(cost(true)), ..View::default() });
        // main: incl 1000 - 5 inner calls × 10; excl 500 - 1 direct call × 10.
        assert!(sub.contains("0.950") && sub.contains("0.490"), "{sub}");
        // mid: incl 500 - 40, excl 300 - 40.
        assert!(sub.contains("0.460") && sub.contains("0.260"), "{sub}");
    }

    #[test]
    fn recursive_pairs_are_not_counted_twice() {
        // fib called once from main; nested fib activations sum to more than fib's own time.
        let edges = vec![
            EdgeReport { caller: 0, callee: 1, calls: 1, incl_ticks: 700 },
            EdgeReport { caller: 1, callee: 1, calls: 20, incl_ticks: 8000 },
            EdgeReport { caller: 1, callee: 2, calls: 3, incl_ticks: 900 },
            EdgeReport { caller: 2, callee: 1, calls: 3, incl_ticks: 850 },
        ];
        let r = report(
            &["main", "fib", "odd"],
            vec![thread(1, vec![f(0, 1, 1000, 300), f(1, 24, 700, 600), f(2, 3, 800, 100)], edges)],
        );
        let text = format_report(&r, &View::default());
        assert!(text.contains("fib -> fib: 20 calls, recursive"), "{text}");
        assert!(!text.contains("8.000"), "{text}");
        assert!(text.contains("fib -> odd: 3 calls, 0.800 us (recursion"), "{text}");
        assert!(text.contains("odd -> fib: 3 calls, 0.700 us (recursion"), "{text}");
        assert!(text.contains("main -> fib: 1 calls, 0.700 us\n"), "{text}");
    }

    #[test]
    fn refusals_collapse_by_reason_and_hooks_are_not_counted() {
        use crate::patch::Refusal;
        let installed = |name: &str| Installed { name: name.into(), at: 0, original: vec![], trampoline: 0 };
        let refused = |name: &str, reason| Refused { name: name.into(), addr: 0x10, reason };
        let mut refusals: Vec<Refused> =
            (0..598).map(|i| refused(&format!("alias{i}"), Refusal::AlreadyPatched)).collect();
        refusals.push(refused("sigreturn", Refusal::PltStub));
        refusals.push(refused("_Unwind_Resume", Refusal::PltStub));
        let done = [installed("main"), installed("work"), installed("_Unwind_RaiseException")];
        let mut out = Vec::new();
        write_summary(&mut out, &done, &refusals).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.contains("refused 598 functions (alias0, alias1, alias2, …): already instrumented"),
            "{text}"
        );
        assert!(text.contains("refused sigreturn at 0x10"), "{text}");
        assert!(
            text.contains(
                "instrumented 2 functions, refused 599 (plus 2 unwinder hooks of papirus' own; 1 refused"
            ),
            "{text}"
        );
    }

    #[test]
    fn crafted_figures_do_not_panic() {
        let max = u64::MAX;
        let edge = EdgeReport { caller: 0, callee: 7, calls: max, incl_ticks: max };
        let mut t = thread(1, vec![f(0, max, max, max), f(9, 1, 0, max)], vec![edge.clone(), edge]);
        t.open = max;
        let r = report(&["a"], vec![t]);
        let cost = ProbeCost { ns_per_call: f64::MAX, source: String::new(), subtract: true };
        for view in [View::default(), View { cost: Some(cost), top: Some(0), ..View::default() }] {
            assert!(format_report(&r, &view).contains("caller -> callee"));
            assert!(format_summary(&r, &view).contains("totals: "));
        }
    }

    #[test]
    fn summary_has_totals_and_top() {
        let r = report(
            &["a", "b", "c"],
            vec![thread(1, vec![f(0, 1, 30, 30), f(1, 2, 20, 20), f(2, 3, 10, 10)], vec![])],
        );
        let text = format_summary(&r, &View { top: Some(2), ..View::default() });
        assert!(text.contains("totals: 6 calls of 3 distinct functions; threads: 1"), "{text}");
        assert!(text.contains("1 more"), "{text}");
        assert!(!text.contains("\n  c "), "{text}");
    }
}
