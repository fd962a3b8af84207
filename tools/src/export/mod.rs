//! The files other tools open, made from what papirus measured: a probe
//! report (the call-path profile), a trace file (every call on a timeline),
//! or a region report of the high-level API.
//!
//! | format | from | opens in |
//! | --- | --- | --- |
//! | `text` | any | a terminal (`--tree` for the call-path tree) |
//! | `json` | any | the report itself (from a trace: the profile built from its calls) |
//! | `chrome` | a trace; a region report | Perfetto UI, speedscope, `chrome://tracing` |
//! | `folded` | any | inferno, flamegraph.pl, speedscope, Perfetto |
//! | `flamegraph` | any | a browser (SVG drawn by inferno) |
//! | `flamechart` | a trace | a browser: each thread's calls in time order |
//! | `histogram` | a trace | a browser: calls begun over time (SVG) |
//! | `tau` | any | ParaProf, TAU's `pprof`, Hatchet (a directory) |
//! | `otf2` | a trace | Vampir, Score-P's tools, `otf2-print` (a directory) |
//!
//! A profile built from a trace counts what the trace holds: calls its
//! filters dropped or its rings lost are not in it.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use papirus_formats::{chrome, flamegraph, folded, otf2, tau};

use papirus_probe::session::trace::{Call, OPEN, Trace};
use papirus_probe_abi::layout::record;
use papirus_probe_abi::{Figures, NodeReport, Report, ThreadReport, Window};

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The text report.
    Text,
    /// The JSON report.
    Json,
    /// Chrome Trace Event Format JSON.
    Chrome,
    /// Folded stacks, weighted by exclusive nanoseconds.
    Folded,
    /// A flame graph SVG of the call-path profile.
    Flamegraph,
    /// A flame chart SVG of a trace: each thread's calls in time order.
    Flamechart,
    /// A time histogram SVG of a trace: calls begun per interval over the
    /// run (Paradyn's folding histogram, 200 buckets).
    Histogram,
    /// A TAU profile directory.
    Tau,
    /// An OTF2 archive directory.
    Otf2,
}

impl Format {
    /// Whether the format is a directory (written only to a path).
    pub fn is_directory(self) -> bool {
        matches!(self, Format::Tau | Format::Otf2)
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Chrome => "chrome",
            Format::Folded => "folded",
            Format::Flamegraph => "flamegraph",
            Format::Flamechart => "flamechart",
            Format::Histogram => "histogram",
            Format::Tau => "tau",
            Format::Otf2 => "otf2",
        }
    }
}

/// What a file holds, made ready for every format.
#[derive(Debug)]
pub struct Input {
    /// The call-path profile (from a trace: built from its calls).
    pub report: Report,
    /// The timeline, when the file is a trace.
    pub trace: Option<Trace>,
    /// The region report, when the file is one.
    pub regions: Option<papirus_highlevel::Report>,
}

/// Why an output cannot be made.
pub type Error = Box<dyn std::error::Error>;

/// Reads a probe report, a trace file or a region report (told apart by content).
pub fn load(path: &Path) -> Result<Input, Error> {
    use papirus_probe::session::trace;
    // Traces may be large: their bound holds only for a file that is one.
    if let Some(bytes) =
        papirus_substrate::input::read_file_if(path, &trace::TRACE_MAGIC, trace::TRACE_LIMIT)?
    {
        let t = trace::parse_trace(&bytes).map_err(|why| format!("{}: {why}", path.display()))?;
        return Ok(Input { report: report_of_trace(&t), trace: Some(t), regions: None });
    }
    let bytes = papirus_substrate::input::read_file(path, papirus_substrate::input::REPORT_LIMIT)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is neither a papirus report nor a trace: {e}", path.display()))?;
    if v.get("tool").is_some() && v.get("process").is_some() {
        let version = v.get("format_version").and_then(serde_json::Value::as_u64).unwrap_or(0);
        if version != u64::from(papirus_highlevel::report::FORMAT_VERSION) {
            return Err(format!(
                "{} is a region report of format {version}; this papirus reads format {}",
                path.display(),
                papirus_highlevel::report::FORMAT_VERSION
            )
            .into());
        }
        let regions: papirus_highlevel::Report = serde_json::from_value(v)?;
        return Ok(Input { report: report_of_regions(&regions), trace: None, regions: Some(regions) });
    }
    Ok(Input { report: papirus_probe::session::parse_report(path, &bytes)?, trace: None, regions: None })
}

/// How an output is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// The text report's view.
    pub view: papirus_probe::session::View,
    /// The call-path tree instead of the flat text report.
    pub tree: Option<papirus_probe::session::TreeView>,
    /// Flame graph and folded stacks: nodes whose inclusive figure is below
    /// this fraction of their thread's are merged into their parent.
    pub threshold: f64,
    /// A name for titles (the program).
    pub title: String,
}

/// Why a format needs a trace, for the error message.
fn needs_trace(f: Format) -> Error {
    format!(
        "the {} format shows calls on a timeline: give a trace file (papirus-probe run --trace FILE), not a report",
        f.name()
    )
    .into()
}

/// The bytes of a one-file format.
pub fn render(input: &Input, format: Format, o: &Options) -> Result<Vec<u8>, Error> {
    let r = &input.report;
    let title = if o.title.is_empty() { format!("pid {}", r.pid) } else { o.title.clone() };
    let timed = r.ticks_per_second > 0.0;
    let unit = if timed { "ns" } else { "calls" };
    let mut out = Vec::new();
    match format {
        Format::Text => match (&input.regions, &o.tree) {
            (Some(g), None) => out = papirus_highlevel::report::text(g).into_bytes(),
            (_, Some(tree)) => out = papirus_probe::session::format_tree(r, &o.view, tree).into_bytes(),
            (None, None) => out = papirus_probe::session::format_report(r, &o.view).into_bytes(),
        },
        Format::Json => {
            match &input.regions {
                Some(g) => serde_json::to_writer_pretty(&mut out, g)?,
                None => serde_json::to_writer_pretty(&mut out, r)?,
            }
            out.push(b'\n');
        }
        Format::Folded => folded::write(&mut out, stacks(r, o.threshold))?,
        Format::Flamegraph => {
            let what = if input.regions.is_some() { "region tree" } else { "call-path profile" };
            let p = flamegraph::Options {
                title: format!("{title}: {what}"),
                subtitle: Some(format!("width: exclusive {unit}, exact (not sampled); one frame per node")),
                count_name: unit.into(),
                // Every node above papirus' own threshold, however narrow.
                min_width: 0.0,
                ..flamegraph::Options::default()
            };
            flamegraph::write_svg(&mut out, stacks(r, o.threshold), &p)?;
        }
        Format::Flamechart => {
            let t = input.trace.as_ref().ok_or_else(|| needs_trace(format))?;
            let p = flamegraph::Options {
                title: format!("{title}: calls over time, per thread"),
                subtitle: Some("width: nanoseconds; left to right in time".into()),
                count_name: "ns".into(),
                min_width: 0.0,
                ..flamegraph::Options::default()
            };
            flamechart(&mut out, t, &p)?;
        }
        Format::Histogram => {
            let t = input.trace.as_ref().ok_or_else(|| needs_trace(format))?;
            out = histogram(t)
                .svg(&format!("{title}: calls begun over time, all threads"), "calls")
                .into_bytes();
        }
        Format::Chrome => match (&input.trace, &input.regions) {
            (Some(t), _) => chrome_of_trace(&mut out, t)?,
            (None, Some(_)) => chrome_of_regions(&mut out, r)?,
            (None, None) => return Err(needs_trace(format)),
        },
        Format::Tau | Format::Otf2 => {
            return Err(format!("the {} format is a directory: name one with -o DIR", format.name()).into());
        }
    }
    Ok(out)
}

/// Writes a directory format into `dir` (a new directory).
pub fn write_dir(input: &Input, format: Format, dir: &Path) -> Result<(), Error> {
    match format {
        Format::Tau => {
            let (metrics, threads) = tau_of(&input.report);
            tau::write_dir(dir, &metrics, &threads).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Format::Otf2 => {
            let t = input.trace.as_ref().ok_or_else(|| needs_trace(format))?;
            otf2::write(dir, &otf2_of(t))?;
        }
        _ => return Err(format!("the {} format is one file, not a directory", format.name()).into()),
    }
    Ok(())
}

/// A thread's name in every output.
pub fn thread_label(r: &Report, t: &ThreadReport) -> String {
    let several = r.processes.len() > 1 || r.threads.iter().any(|o| o.pid != t.pid);
    label(t.pid, t.tid, t.exited_threads, several)
}

/// A traced thread's name in every output.
pub fn trace_label(t: &Trace, th: &papirus_probe::session::trace::ThreadTrace) -> String {
    label(th.pid, th.tid, 0, t.threads.iter().any(|o| o.pid != th.pid))
}

fn label(pid: u32, tid: u32, exited: u64, several: bool) -> String {
    let base = if exited > 0 {
        format!("{exited} exited threads")
    } else if tid == 0 {
        "a thread whose start was lost".to_string()
    } else if tid == pid {
        format!("thread {tid} (main)")
    } else {
        format!("thread {tid}")
    };
    if several || exited > 0 { format!("{base} of pid {pid}") } else { base }
}

/// Intervals of one thread's calls in order: `(time, enter, call)` events
/// nesting properly (a call leaves before anything that began after it at
/// a smaller depth enters), each time at least the one before.
pub fn nest(calls: &[Call]) -> Vec<(u64, bool, usize)> {
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| (calls[i].start, calls[i].depth, std::cmp::Reverse(calls[i].end)));
    let mut out = Vec::with_capacity(2 * calls.len());
    let mut stack: Vec<usize> = Vec::new();
    let mut last = 0;
    let leave = |i: usize, out: &mut Vec<(u64, bool, usize)>, last: &mut u64| {
        *last = (*last).max(calls[i].end);
        out.push((*last, false, i));
    };
    for i in order {
        let c = &calls[i];
        while let Some(&top) = stack.last() {
            let t = &calls[top];
            if t.depth < c.depth && t.end > c.start {
                break;
            }
            stack.pop();
            leave(top, &mut out, &mut last);
        }
        last = last.max(c.start);
        out.push((last, true, i));
        stack.push(i);
    }
    while let Some(top) = stack.pop() {
        leave(top, &mut out, &mut last);
    }
    out
}

/// The call-path profile a trace's calls make (ticks as the trace's).
pub fn report_of_trace(t: &Trace) -> Report {
    let h = &t.header;
    let nev = h.events.len();
    let mut threads = Vec::new();
    for th in &t.threads {
        let mut tree: Vec<NodeReport> = Vec::new();
        let mut index: HashMap<(Option<u32>, u32), u32> = HashMap::new();
        // Open nodes with the inclusive time and counts of their completed children.
        let mut path: Vec<(u32, u64, Vec<u64>)> = Vec::new();
        let w = th.counters_per_call;
        let delta = |i: usize, k: usize| {
            if w == 2 * nev { th.counters[i * w + nev + k].saturating_sub(th.counters[i * w + k]) } else { 0 }
        };
        for (_, enter, i) in nest(&th.calls) {
            let c = th.calls[i];
            if enter {
                let parent = path.last().map(|p| p.0);
                let n = *index.entry((parent, c.function)).or_insert_with(|| {
                    tree.push(NodeReport {
                        parent,
                        function: c.function,
                        figures: Figures {
                            counters_incl: vec![0; nev],
                            counters_excl: vec![0; nev],
                            ..Default::default()
                        },
                    });
                    tree.len() as u32 - 1
                });
                tree[n as usize].figures.calls += 1;
                path.push((n, 0, vec![0; nev]));
                continue;
            }
            let Some((n, children, child_counts)) = path.pop() else { continue };
            // As in the runtime, an activation's figures count once it closes.
            if c.kind == OPEN {
                continue;
            }
            let dur = c.end.saturating_sub(c.start);
            let node = &mut tree[n as usize].figures;
            if c.kind == record::UNWOUND {
                node.unwound += 1;
            } else {
                node.exits += 1;
            }
            let first = node.exits + node.unwound == 1;
            node.incl_ticks += dur;
            node.excl_ticks += dur.saturating_sub(children);
            node.min_ticks = if first { dur } else { node.min_ticks.min(dur) };
            node.max_ticks = node.max_ticks.max(dur);
            let deltas: Vec<u64> = (0..nev).map(|k| delta(i, k)).collect();
            for (k, d) in deltas.iter().enumerate() {
                node.counters_incl[k] += d;
                node.counters_excl[k] += d.saturating_sub(child_counts[k]);
            }
            if let Some(p) = path.last_mut() {
                p.1 += dur;
                for (a, d) in p.2.iter_mut().zip(&deltas) {
                    *a += d;
                }
            }
        }
        let mut tr = ThreadReport {
            tid: th.tid,
            pid: th.pid,
            tree,
            open: th.calls.iter().filter(|c| c.kind == OPEN).count() as u64,
            ..Default::default()
        };
        tr.derive();
        threads.push(tr);
    }
    let footer = t.footer.clone().unwrap_or_default();
    Report {
        format_version: papirus_probe_abi::FORMAT_VERSION,
        probe: h.probe.clone(),
        pid: h.pid,
        ticks_per_second: t.ticks_per_second(),
        events: h.events.clone(),
        functions: h.functions.clone(),
        threads,
        window: footer.window,
        processes: footer.processes,
        unmeasured_threads: 0,
    }
}

/// The region tree as a call-path profile: a region is a node (its real
/// time inclusive, its children's taken out for exclusive; ticks are
/// nanoseconds), its other metrics counter columns.
pub fn report_of_regions(r: &papirus_highlevel::Report) -> Report {
    let p = &r.process;
    let mut functions: Vec<String> = Vec::new();
    let mut ids: BTreeMap<String, u32> = BTreeMap::new();
    let events: Vec<String> = p.metrics.iter().filter(|m| *m != "real_time_ns").cloned().collect();
    let value = |g: &papirus_highlevel::report::RegionReport, m: &str| {
        g.metrics.get(m).map_or(0, |s| s.total.max(0) as u64)
    };
    let mut threads = Vec::new();
    for t in &p.threads {
        // Regions by id; a parent begins before its children, so has a smaller id.
        let mut regions: Vec<_> = t.regions.iter().collect();
        regions.sort_by_key(|g| g.id);
        let pos: BTreeMap<u32, u32> = regions.iter().enumerate().map(|(i, g)| (g.id, i as u32)).collect();
        let mut tree: Vec<NodeReport> = regions
            .iter()
            .map(|g| {
                let f = *ids.entry(g.name.clone()).or_insert_with(|| {
                    functions.push(g.name.clone());
                    functions.len() as u32 - 1
                });
                let real = g.metrics.get("real_time_ns");
                let counters: Vec<u64> = events.iter().map(|e| value(g, e)).collect();
                NodeReport {
                    parent: g.parent.and_then(|id| pos.get(&id).copied()),
                    function: f,
                    figures: Figures {
                        calls: g.calls + u64::from(g.open),
                        exits: g.calls,
                        unwound: 0,
                        incl_ticks: value(g, "real_time_ns"),
                        excl_ticks: value(g, "real_time_ns"),
                        min_ticks: real.map_or(0, |s| s.min.max(0) as u64),
                        max_ticks: real.map_or(0, |s| s.max.max(0) as u64),
                        counters_excl: counters.clone(),
                        counters_incl: counters,
                    },
                }
            })
            .collect();
        for i in 0..tree.len() {
            if let Some(pi) = tree[i].parent.map(|p| p as usize).filter(|&p| p < i) {
                let (incl, counters) = (tree[i].figures.incl_ticks, tree[i].figures.counters_incl.clone());
                let parent = &mut tree[pi];
                parent.figures.excl_ticks = parent.figures.excl_ticks.saturating_sub(incl);
                for (a, b) in parent.figures.counters_excl.iter_mut().zip(counters) {
                    *a = a.saturating_sub(b);
                }
            }
        }
        let mut tr = ThreadReport { tid: t.tid.max(0) as u32, pid: p.pid, tree, ..Default::default() };
        tr.derive();
        threads.push(tr);
    }
    Report {
        format_version: papirus_probe_abi::FORMAT_VERSION,
        probe: "regions".into(),
        pid: p.pid,
        ticks_per_second: 1e9,
        events,
        functions,
        threads,
        window: Window::default(),
        processes: Vec::new(),
        unmeasured_threads: 0,
    }
}

/// Nanoseconds for `ticks` of `r`, rounded down.
fn ns(r: &Report, ticks: u64) -> u64 {
    r.ns(ticks) as u64
}

/// Folded stacks of the call-path profile: per tree node, its thread's
/// label then its path, weighted by its exclusive nanoseconds (calls, for
/// a probe that takes no time). A node whose inclusive figure is below
/// `threshold` (a fraction of its thread's) is merged into the nearest
/// ancestor above it, so every width still adds up to the total.
pub fn stacks(r: &Report, threshold: f64) -> Vec<(Vec<String>, u64)> {
    let timed = r.ticks_per_second > 0.0;
    let mut out = Vec::new();
    for t in &r.threads {
        let weight = |n: &NodeReport| if timed { ns(r, n.figures.excl_ticks) } else { n.figures.calls };
        // Inclusive figure per node: time, or calls in its subtree for an untimed probe.
        let mut incl: Vec<u64> = t
            .tree
            .iter()
            .map(|n| if timed { ns(r, n.figures.incl_ticks) } else { n.figures.calls })
            .collect();
        if !timed {
            for j in (0..t.tree.len()).rev() {
                if let Some(p) = t.tree[j].parent.map(|p| p as usize).filter(|&p| p < j) {
                    incl[p] += incl[j];
                }
            }
        }
        let total: u64 = t.tree.iter().zip(&incl).filter(|(n, _)| n.parent.is_none()).map(|(_, v)| v).sum();
        let cut = ((threshold * total as f64).ceil() as u64).max(1);
        // Per node: the node its weight goes to (itself, or its nearest ancestor above the cut).
        let mut shown: Vec<Option<usize>> = Vec::with_capacity(t.tree.len());
        let mut weights: BTreeMap<usize, u64> = BTreeMap::new();
        let mut lost = 0u64;
        for (i, n) in t.tree.iter().enumerate() {
            let parent = n.parent.map(|p| p as usize).filter(|&p| p < i);
            let target = if incl[i] >= cut { Some(i) } else { parent.and_then(|p| shown[p]) };
            shown.push(target);
            match target {
                Some(k) => *weights.entry(k).or_default() += weight(n),
                None => lost += weight(n),
            }
        }
        let label = thread_label(r, t);
        for (k, w) in weights {
            let mut path = vec![label.clone()];
            let mut chain = Vec::new();
            let mut at = Some(k);
            while let Some(i) = at {
                chain.push(r.functions.get(t.tree[i].function as usize).cloned().unwrap_or_default());
                at = t.tree[i].parent.map(|p| p as usize).filter(|&p| p < i);
            }
            path.extend(chain.into_iter().rev());
            out.push((path, w));
        }
        if lost > 0 {
            out.push((vec![label, "[below the threshold]".to_string()], lost));
        }
    }
    out
}

/// A flame chart of a trace: per thread (its label the bottom frame), the
/// stack over time, each interval as wide as its nanoseconds.
pub fn flamechart(out: impl Write, t: &Trace, o: &flamegraph::Options) -> Result<(), Error> {
    let mut intervals: Vec<(Vec<String>, u64)> = Vec::new();
    for th in &t.threads {
        let mut stack: Vec<String> = vec![trace_label(t, th)];
        let mut at: Option<u64> = None;
        for (time, enter, i) in nest(&th.calls) {
            let now = t.ns(time) as u64;
            if let Some(prev) = at
                && stack.len() > 1
            {
                intervals.push((stack.clone(), now.saturating_sub(prev)));
            }
            at = Some(now);
            if enter {
                stack.push(t.name(th.calls[i].function));
            } else {
                stack.pop();
            }
        }
    }
    flamegraph::write_chart_svg(out, intervals, o).map_err(|e| format!("nothing to draw: {e}"))?;
    Ok(())
}

/// Buckets of [`histogram`].
const HISTOGRAM_BUCKETS: usize = 200;

/// Calls begun per interval of a trace's run from its first call, in a
/// folding time histogram (1 µs per bucket, the width doubling as the run
/// goes on; times in nanoseconds since the session began).
pub fn histogram(t: &Trace) -> papirus_highlevel::TimeHistogram {
    let first = t.threads.iter().flat_map(|th| &th.calls).map(|c| c.start).min().unwrap_or(0);
    let mut h = papirus_highlevel::TimeHistogram {
        start_ns: t.ns(first) as u64,
        width_ns: 1000,
        folds: 0,
        buckets: vec![0.0; HISTOGRAM_BUCKETS],
    };
    for c in t.threads.iter().flat_map(|th| &th.calls) {
        h.add(t.ns(c.start) as u64, 1.0);
    }
    h
}

/// Each call's (start, end) in nanoseconds, the events of the thread
/// strictly ordered: where two fall on the same nanosecond (the frames a
/// longjmp left all close at the next hook's one timestamp) the later one is
/// moved on by a nanosecond, so viewers that sort events by time (and
/// speedscope, which sums floats) still nest them as they ran.
fn strict_times(t: &Trace, calls: &[Call]) -> Vec<(u64, u64)> {
    let mut out = vec![(0, 0); calls.len()];
    let mut prev: Option<u64> = None;
    for (time, enter, i) in nest(calls) {
        let ns = t.ns(time) as u64;
        let at = match prev {
            Some(p) if ns <= p => p + 1,
            _ => ns,
        };
        prev = Some(at);
        if enter {
            out[i].0 = at;
        } else {
            out[i].1 = at;
        }
    }
    out
}

/// The Chrome trace of a trace file: per thread its calls as complete
/// events and, with counters, one counter track per thread and event.
pub fn chrome_of_trace(out: impl Write, t: &Trace) -> Result<(), Error> {
    let mut w = chrome::Writer::new(out)?;
    let mut named = std::collections::BTreeSet::new();
    // Viewers add the pid themselves.
    let command = if t.header.command.is_empty() { "process" } else { t.header.command.as_str() };
    for th in &t.threads {
        if named.insert(th.pid) {
            w.process_name(th.pid, command)?;
        }
        w.thread_name(th.pid, th.tid, &trace_label(t, th))?;
        let nev = t.header.events.len();
        let times = strict_times(t, &th.calls);
        for (i, c) in th.calls.iter().enumerate() {
            let (s, e) = times[i];
            let cat = match c.kind {
                record::UNWOUND => "function,unwound",
                OPEN => "function,open",
                _ => "function",
            };
            w.complete(th.pid, th.tid, &t.name(c.function), cat, s, e - s)?;
            if th.counters_per_call == 2 * nev {
                for (k, ev) in t.header.events.iter().enumerate() {
                    let name = format!("tid {} {ev}", th.tid);
                    let at = i * 2 * nev;
                    w.counter(th.pid, &name, s, th.counters[at + k])?;
                    w.counter(th.pid, &name, e, th.counters[at + nev + k])?;
                }
            }
        }
    }
    let other = serde_json::json!({
        "papirus": { "source": "trace", "probe": t.header.probe, "calls": t.calls(), "lost": t.lost() }
    });
    w.finish(&other)?;
    Ok(())
}

/// The Chrome trace of a region report: not a timeline (regions keep
/// totals), a layout of the region tree per thread: each region as wide as
/// its total real time, children side by side from their parent's start.
pub fn chrome_of_regions(out: impl Write, r: &Report) -> Result<(), Error> {
    let mut w = chrome::Writer::new(out)?;
    w.process_name(r.pid, "regions (totals, laid out)")?;
    for t in &r.threads {
        w.thread_name(r.pid, t.tid, &thread_label(r, t))?;
        let mut next_child: Vec<u64> = vec![0; t.tree.len()];
        let mut next_root = 0;
        for (i, n) in t.tree.iter().enumerate() {
            let start = match n.parent.map(|p| p as usize).filter(|&p| p < i) {
                Some(p) => &mut next_child[p],
                None => &mut next_root,
            };
            let at = *start;
            *start += n.figures.incl_ticks;
            next_child[i] = at;
            let name = r.functions.get(n.function as usize).cloned().unwrap_or_default();
            w.complete(r.pid, t.tid, &name, "region,total", at, n.figures.incl_ticks)?;
        }
    }
    w.finish(&serde_json::json!({ "papirus": { "source": "regions", "layout": "totals" } }))?;
    Ok(())
}

/// The TAU profile of a call-path profile: node = process, thread = its
/// index in that process; metric TIME (µs) then each counter event.
pub fn tau_of(r: &Report) -> (Vec<String>, Vec<tau::Thread>) {
    let mut metrics = vec!["TIME".to_string()];
    metrics.extend(r.events.iter().cloned());
    let mut pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
    let mut per_process: BTreeMap<u32, u32> = BTreeMap::new();
    let mut threads = Vec::new();
    for t in &r.threads {
        if !pids.contains(&t.pid) {
            pids.push(t.pid);
        }
        let node = pids.iter().position(|&p| p == t.pid).unwrap_or(0) as u32;
        let index = per_process.entry(t.pid).or_default();
        let thread = *index;
        *index += 1;
        let us = |ticks: u64| r.ns(ticks) / 1e3;
        let values = |time: u64, counters: &[u64]| {
            let mut v = vec![us(time)];
            v.extend(counters.iter().map(|&c| c as f64));
            v.resize(metrics.len(), 0.0);
            v
        };
        let mut subrs = vec![0u64; t.tree.len()];
        for (i, n) in t.tree.iter().enumerate() {
            if let Some(p) = n.parent.map(|p| p as usize).filter(|&p| p < i) {
                subrs[p] += n.figures.calls;
            }
        }
        let name = |f: u32| r.functions.get(f as usize).cloned().unwrap_or_else(|| format!("function {f}"));
        let paths = t
            .tree
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut path = Vec::new();
                let mut at = Some(i);
                while let Some(k) = at {
                    path.push(name(t.tree[k].function));
                    at = t.tree[k].parent.map(|p| p as usize).filter(|&p| p < k);
                }
                path.reverse();
                tau::Entry {
                    path,
                    calls: n.figures.calls,
                    subrs: subrs[i],
                    excl: values(n.figures.excl_ticks, &n.figures.counters_excl),
                    incl: values(n.figures.incl_ticks, &n.figures.counters_incl),
                }
            })
            .collect();
        let mut flat_subrs: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, n) in t.tree.iter().enumerate() {
            *flat_subrs.entry(n.function).or_default() += subrs[i];
        }
        let functions = t
            .functions
            .iter()
            .map(|f| tau::Entry {
                path: vec![name(f.id)],
                calls: f.figures.calls,
                subrs: flat_subrs.get(&f.id).copied().unwrap_or(0),
                excl: values(f.figures.excl_ticks, &f.figures.counters_excl),
                incl: values(f.figures.incl_ticks, &f.figures.counters_incl),
            })
            .collect();
        let mut metadata = vec![("papirus thread".to_string(), thread_label(r, t))];
        metadata.push(("papirus probe".into(), r.probe.clone()));
        threads.push(tau::Thread { node, context: 0, thread, functions, paths, metadata });
    }
    (metrics, threads)
}

/// The OTF2 trace of a trace file: per thread its calls as enter/leave
/// events in nanoseconds from the trace's start.
pub fn otf2_of(t: &Trace) -> otf2::Trace {
    let mut processes: Vec<u32> = Vec::new();
    let mut locations = Vec::new();
    let mut length = 0;
    for th in &t.threads {
        if !processes.contains(&th.pid) {
            processes.push(th.pid);
        }
        let process = processes.iter().position(|&p| p == th.pid).unwrap_or(0) as u32;
        let events: Vec<otf2::Event> = nest(&th.calls)
            .into_iter()
            .map(|(time, enter, i)| {
                let ns = t.ns(time) as u64;
                length = length.max(ns);
                let f = th.calls[i].function;
                if enter { otf2::Event::Enter(ns, f) } else { otf2::Event::Leave(ns, f) }
            })
            .collect();
        locations.push(otf2::Location { process, name: trace_label(t, th), events });
    }
    otf2::Trace {
        resolution: 1_000_000_000,
        length,
        realtime_ns: t.footer.as_ref().map(|f| f.window.start_unix_ns).filter(|&s| s > 0),
        regions: t.header.functions.clone(),
        processes: processes.iter().map(|p| format!("pid {p}")).collect(),
        locations,
    }
}
