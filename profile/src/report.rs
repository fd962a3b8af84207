//! Reports of a recording: a flat and a call-graph text report in the
//! manner of `perf report`, and the files other viewers open: pprof
//! (`go tool pprof`, speedscope, Perfetto), folded stacks (inferno,
//! speedscope) and a flame graph SVG (any browser).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write};

use papirus_formats::{flamegraph, folded, pprof};

use crate::recording::{CallGraph, Frame, Recording, TriggerInfo};

/// A column the flat profile groups samples by (`--sort`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SortKey {
    /// Process id.
    Pid,
    /// Thread id.
    Tid,
    /// Thread name.
    Comm,
    /// Module (shared object).
    Dso,
    /// Function.
    Sym,
}

impl SortKey {
    /// Parses one key by perf's name: `pid`, `tid`, `comm`, `dso`, `sym`.
    pub fn parse(key: &str) -> Result<SortKey, String> {
        match key.trim() {
            "pid" => Ok(SortKey::Pid),
            "tid" => Ok(SortKey::Tid),
            "comm" => Ok(SortKey::Comm),
            "dso" => Ok(SortKey::Dso),
            "sym" | "symbol" => Ok(SortKey::Sym),
            other => Err(format!("unknown sort key {other:?}: use pid, tid, comm, dso, sym")),
        }
    }

    fn heading(self) -> &'static str {
        match self {
            SortKey::Pid => "Pid",
            SortKey::Tid => "Tid",
            SortKey::Comm => "Command",
            SortKey::Dso => "Shared Object",
            SortKey::Sym => "Symbol",
        }
    }
}

/// What a report shows.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Flat profile columns (default `comm,dso,sym`, as perf).
    pub sort: Vec<SortKey>,
    /// Rows and call-graph branches under this share (%) are left out.
    pub percent_limit: f64,
    /// Folded stacks and flame graphs: one root per thread (`comm-pid/tid`)
    /// instead of one per process name.
    pub per_thread: bool,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            sort: vec![SortKey::Comm, SortKey::Dso, SortKey::Sym],
            percent_limit: 0.5,
            per_thread: false,
        }
    }
}

fn module_name(f: &Frame) -> &str {
    f.module.rsplit('/').next().unwrap_or(&f.module)
}

fn pct(part: u64, total: u64) -> f64 {
    if total == 0 { 0.0 } else { 100.0 * part as f64 / total as f64 }
}

fn trigger_text(r: &Recording) -> String {
    match r.event.trigger {
        TriggerInfo::Frequency(hz) => format!("{hz} Hz"),
        TriggerInfo::Period(p) => format!("every {p} {}", r.event.unit),
    }
}

/// A command line on one line: an argument with spaces, quotes or control
/// characters (`python3 -c SCRIPT`) is quoted with its escapes shown.
fn command_line(c: &[String]) -> String {
    let plain =
        |a: &String| !a.is_empty() && a.chars().all(|c| c.is_alphanumeric() || "_-./=:,+@%".contains(c));
    let words: Vec<String> = c.iter().map(|a| if plain(a) { a.clone() } else { format!("{a:?}") }).collect();
    words.join(" ")
}

fn target_text(r: &Recording) -> String {
    let command = r.target.command.as_deref().map(command_line);
    match (command, &r.exit) {
        (Some(c), Some(e)) => {
            let how = match e.signal {
                Some(s) => format!("killed by signal {s}"),
                None => format!("exit status {}", e.code),
            };
            format!("command: {c} (pid {}, {how})", r.target.pid)
        }
        (Some(c), None) => format!("command: {c} (pid {})", r.target.pid),
        (None, _) => {
            let pid = r.target.pid;
            let comm = r.threads.iter().find(|t| i64::from(t.tid) == i64::from(pid)).map(|t| t.comm.as_str());
            match (r.target.cmdline.as_deref().map(command_line), comm.filter(|c| !c.is_empty())) {
                (Some(c), _) => format!("process: {c} (pid {pid})"),
                (None, Some(comm)) => format!("process: [{comm}] (pid {pid})"),
                (None, None) => format!("process: pid {pid}"),
            }
        }
    }
}

/// `n WORD` with WORD in the plural unless n is 1.
fn counted(n: u64, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// What `papirus-profile record` prints on stderr once the recording is
/// written to `output`: samples, threads and time, then notes, losses and throttling.
pub fn record_summary(r: &Recording, output: &std::path::Path) -> String {
    let mut s = format!(
        "papirus-profile: {} of {} from {} in {:.3} s, written to {}",
        counted(r.total_samples(), "sample"),
        r.event.name,
        counted(r.threads.len() as u64, "thread"),
        r.duration_ns as f64 / 1e9,
        output.display()
    );
    for n in &r.notes {
        let _ = write!(s, "\npapirus-profile: {n}");
    }
    if r.rings.lost > 0 {
        let _ = write!(
            s,
            "\npapirus-profile: {} lost in {}: the {}-page rings filled faster than they \
             were read; give more pages (-m) or sample less often (-F, -c)",
            counted(r.rings.lost, "sample"),
            counted(r.rings.lost_records, "LOST record"),
            r.rings.data_pages
        );
    }
    if r.rings.throttles > 0 {
        let _ = write!(
            s,
            "\npapirus-profile: the kernel throttled sampling {} (kernel.perf_event_max_sample_rate)",
            counted(r.rings.throttles, "time")
        );
    }
    s
}

/// Threads listed in a report's header, the busiest first.
const HEADER_THREADS: usize = 16;

/// The `# …` lines every text report starts with: target, event, samples
/// and losses, threads.
pub fn header(r: &Recording) -> String {
    let mut s = String::new();
    let total: u64 = r.samples.iter().map(|x| x.weight).sum();
    let _ = writeln!(s, "# {}", target_text(r));
    let chains = match r.event.call_graph {
        CallGraph::None => "",
        CallGraph::Fp => ", call chains (frame pointers)",
        CallGraph::Dwarf => ", call chains (DWARF unwinding of user stack copies)",
    };
    let domain = r.event.domain.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
    let _ = writeln!(s, "# event: {}{domain}, {}{chains}", r.event.name, trigger_text(r));
    let _ = writeln!(
        s,
        "# {} samples, weight {total} {}, in {:.3} s",
        r.total_samples(),
        r.event.unit,
        r.duration_ns as f64 / 1e9
    );
    let ri = &r.rings;
    let _ = writeln!(
        s,
        "# lost: {} samples ({} LOST records) in {} rings of {} data pages; throttled {} times",
        ri.lost, ri.lost_records, ri.rings, ri.data_pages, ri.throttles
    );
    if ri.parse_errors > 0 {
        let _ = writeln!(s, "# {} records did not parse and were skipped", ri.parse_errors);
    }
    for n in &r.notes {
        let _ = writeln!(s, "# note: {n}");
    }
    for u in &r.unreadable_modules {
        let _ = writeln!(s, "# unreadable module {}: {}", u.path, u.reason);
    }
    let mut per_thread: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for x in &r.samples {
        *per_thread.entry((x.pid, x.tid)).or_default() += x.count;
    }
    // A server's thread per request would bury the profile: the busiest only.
    let mut threads: Vec<((u32, u32), u64)> = per_thread.into_iter().collect();
    threads.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let _ = writeln!(s, "#\n# {:>8} {:>8}  {:<16} {:>10}", "pid", "tid", "comm", "samples");
    for &((pid, tid), n) in threads.iter().take(HEADER_THREADS) {
        let _ = writeln!(s, "# {pid:>8} {tid:>8}  {:<16} {n:>10}", r.comm(tid));
    }
    if let Some(rest) = threads.get(HEADER_THREADS..).filter(|t| !t.is_empty()) {
        let n: u64 = rest.iter().map(|t| t.1).sum();
        let _ =
            writeln!(s, "# {:>8} more threads with {n} samples (--sort tid lists every thread)", rest.len());
    }
    s
}

/// The flat profile and, with call chains, the call graph: `perf report`'s
/// two views as text.
pub fn text(r: &Recording, opts: &ReportOptions) -> String {
    let mut s = header(r);
    let total: u64 = r.samples.iter().map(|x| x.weight).sum();
    // Per row key: self weight, children weight (once per stack), samples.
    let mut rows: HashMap<Vec<String>, (u64, u64, u64)> = HashMap::new();
    for x in &r.samples {
        let frames: Vec<&Frame> = r.stack(x.stack).collect();
        let key_of = |f: &Frame| -> Vec<String> {
            opts.sort
                .iter()
                .map(|k| match k {
                    SortKey::Pid => x.pid.to_string(),
                    SortKey::Tid => x.tid.to_string(),
                    SortKey::Comm => r.comm(x.tid).to_string(),
                    SortKey::Dso => module_name(f).to_string(),
                    SortKey::Sym => f.name.clone(),
                })
                .collect()
        };
        // Children: once per stack however often recursion repeats a key.
        let mut seen = HashSet::new();
        for f in &frames {
            let key = key_of(f);
            if seen.insert(key.clone()) {
                rows.entry(key).or_default().1 += x.weight;
            }
        }
        if let Some(leaf) = frames.last() {
            let e = rows.entry(key_of(leaf)).or_default();
            e.0 += x.weight;
            e.2 += x.count;
        }
    }
    let mut rows: Vec<(Vec<String>, (u64, u64, u64))> = rows.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(b.1.1.cmp(&a.1.1)).then(a.0.cmp(&b.0)));
    let chains = r.event.call_graph != CallGraph::None;
    let widths: Vec<usize> = opts
        .sort
        .iter()
        .enumerate()
        .map(|(i, k)| {
            rows.iter().map(|(key, _)| key[i].chars().count()).max().unwrap_or(0).max(k.heading().len())
        })
        .collect();
    let _ = writeln!(s, "#");
    let mut head = String::from("#");
    if chains {
        head.push_str(" Children");
    }
    head.push_str("     Self   Samples");
    for (k, w) in opts.sort.iter().zip(&widths) {
        let _ = write!(head, "  {:<w$}", k.heading());
    }
    let _ = writeln!(s, "{}", head.trim_end());
    for (key, (own, children, count)) in &rows {
        if pct(*own, total) < opts.percent_limit && pct(*children, total) < opts.percent_limit {
            continue;
        }
        let mut line = String::from(" ");
        if chains {
            let _ = write!(line, " {:>7.2}%", pct(*children, total));
        }
        let _ = write!(line, " {:>7.2}% {count:>9}", pct(*own, total));
        for (v, w) in key.iter().zip(&widths) {
            let _ = write!(line, "  {v:<w$}");
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    if chains {
        let _ = writeln!(
            s,
            "\n# Call graph: callers above their callees, % of all weight; branches under {} % left out",
            opts.percent_limit
        );
        call_graph(r, total, opts.percent_limit, &mut s);
    }
    s
}

#[derive(Default)]
struct Node {
    weight: u64,
    children: HashMap<u32, Node>,
}

fn call_graph(r: &Recording, total: u64, limit: f64, s: &mut String) {
    let mut root = Node::default();
    for x in &r.samples {
        let mut n = &mut root;
        for &f in &r.stacks[x.stack as usize] {
            n = n.children.entry(f).or_default();
            n.weight += x.weight;
        }
    }
    fn walk(r: &Recording, n: &Node, depth: usize, total: u64, limit: f64, s: &mut String) {
        let mut kids: Vec<(&u32, &Node)> = n.children.iter().collect();
        kids.sort_by(|a, b| b.1.weight.cmp(&a.1.weight).then(a.0.cmp(b.0)));
        for (&f, child) in kids {
            let p = pct(child.weight, total);
            if p < limit {
                continue;
            }
            let frame = &r.frames[f as usize];
            let module = module_name(frame);
            let module = if module.starts_with('[') { module.to_string() } else { format!("[{module}]") };
            let _ = writeln!(s, "{:>7.2}%  {}{}  {module}", p, "  ".repeat(depth), frame.name);
            walk(r, child, depth + 1, total, limit, s);
        }
    }
    walk(r, &root, 0, total, limit, s);
}

/// Each thread-and-stack of the recording as frame names from the root
/// (a first frame naming the process, or the thread with `per_thread`)
/// with its sample count.
fn named_stacks<'a>(r: &'a Recording, per_thread: bool) -> impl Iterator<Item = (Vec<String>, u64)> + 'a {
    r.samples.iter().map(move |x| {
        let comm = r.comm(x.tid);
        let root = if per_thread { format!("{comm}-{}/{}", x.pid, x.tid) } else { comm.to_string() };
        let frames = std::iter::once(root).chain(r.stack(x.stack).map(|f| f.name.clone())).collect();
        (frames, x.count)
    })
}

/// Writes folded stacks (sample counts).
pub fn write_folded(r: &Recording, opts: &ReportOptions, out: impl Write) -> io::Result<()> {
    folded::write(out, named_stacks(r, opts.per_thread))
}

/// Writes a flame graph SVG of the sample counts.
pub fn write_flamegraph(r: &Recording, opts: &ReportOptions, out: impl Write) -> io::Result<()> {
    let options = flamegraph::Options {
        title: format!("papirus-profile: {}, {}", r.event.name, trigger_text(r)),
        subtitle: Some(target_text(r)),
        count_name: "samples".into(),
        ..flamegraph::Options::default()
    };
    flamegraph::write_svg(out, named_stacks(r, opts.per_thread), &options)
}

/// Writes the recording as a gzip'd pprof profile: sample counts and summed
/// periods (`cpu`/`nanoseconds` for the clocks, as Go's CPU profiles), a
/// sample per thread and stack labelled `thread`, `pid` and `tid`.
pub fn write_pprof(r: &Recording, out: impl Write) -> io::Result<()> {
    let clock = r.event.unit == "ns";
    let (kind, unit) = if clock { ("cpu", "nanoseconds") } else { (r.event.name.as_str(), "count") };
    let mut b = pprof::Builder::new(&[("samples", "count"), (kind, unit)]);
    let period = match r.event.trigger {
        TriggerInfo::Frequency(hz) if clock && hz > 0 => 1_000_000_000 / hz as i64,
        TriggerInfo::Frequency(_) => 0,
        TriggerInfo::Period(p) => p as i64,
    };
    b.period(kind, unit, period)
        .time(r.start_unix_ns as i64, r.duration_ns as i64)
        .default_sample_type(kind)
        .comment(&target_text(r));
    for x in &r.samples {
        let frames: Vec<&str> = r.stack(x.stack).map(|f| f.name.as_str()).collect();
        let labels = [
            pprof::Label { key: "thread", value: pprof::LabelValue::Str(r.comm(x.tid)) },
            pprof::Label { key: "pid", value: pprof::LabelValue::Num(i64::from(x.pid), None) },
            pprof::Label { key: "tid", value: pprof::LabelValue::Num(i64::from(x.tid), None) },
        ];
        b.add(&frames, &[x.count as i64, x.weight as i64], &labels).map_err(io::Error::other)?;
    }
    b.write_gz(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{EventInfo, RingInfo, SampleCount, TargetInfo, Thread};

    /// A server's recording: `threads` threads, each with one sample in
    /// `[unknown]` → `handle`.
    fn server(threads: u32) -> Recording {
        let frame =
            |name: &str, module: &str| Frame { name: name.into(), module: module.into(), kernel: false };
        Recording {
            format: crate::recording::FORMAT.into(),
            format_version: crate::recording::FORMAT_VERSION,
            target: TargetInfo { command: None, cmdline: None, pid: 100 },
            event: EventInfo {
                name: "task-clock".into(),
                trigger: TriggerInfo::Frequency(1000),
                unit: "ns".into(),
                call_graph: CallGraph::Fp,
                domain: Some("user+kernel".into()),
            },
            start_unix_ns: 0,
            duration_ns: 1_000_000_000,
            exit: None,
            rings: RingInfo::default(),
            notes: vec!["a note".into()],
            unreadable_modules: Vec::new(),
            threads: (0..threads).map(|i| Thread { pid: 100, tid: 100 + i, comm: "srv".into() }).collect(),
            frames: vec![frame("[unknown]", "[unknown]"), frame("handle", "/usr/bin/srv")],
            stacks: vec![vec![0, 1]],
            samples: (0..threads)
                .map(|i| SampleCount { pid: 100, tid: 100 + i, stack: 0, count: 1 + u64::from(i), weight: 1 })
                .collect(),
        }
    }

    #[test]
    fn the_header_lists_the_busiest_threads_only() {
        let t = text(&server(40), &ReportOptions::default());
        assert!(t.contains("# event: task-clock (user+kernel), 1000 Hz"), "{t}");
        assert!(t.contains("# note: a note"), "{t}");
        let listed: Vec<&str> = t.lines().filter(|l| l.starts_with("# ") && l.contains(" srv ")).collect();
        assert_eq!(listed.len(), HEADER_THREADS, "{t}");
        assert!(listed[0].contains(" 139 ") && listed[0].trim_end().ends_with(" 40"), "busiest first: {t}");
        let rest: u64 = (1..=24).sum();
        assert!(t.contains(&format!("# {:>8} more threads with {rest} samples", 24)), "{t}");
        // A pseudo-module keeps its own brackets in the call graph.
        assert!(t.contains("[unknown]  [unknown]\n") && !t.contains("[[unknown]]"), "{t}");
        assert!(t.contains("handle  [srv]"), "{t}");
        let few = text(&server(3), &ReportOptions::default());
        assert!(!few.contains("more threads"), "{few}");
    }

    #[test]
    fn a_command_line_stays_on_its_header_line() {
        let mut r = server(1);
        let args = ["python3", "-c", "import os\nprint(os.getpid())", "", "a b", "x=1"];
        r.target.command = Some(args.iter().map(|a| a.to_string()).collect());
        let t = text(&r, &ReportOptions::default());
        let first = t.lines().next().unwrap();
        assert_eq!(
            first, r#"# command: python3 -c "import os\nprint(os.getpid())" "" "a b" x=1 (pid 100)"#,
            "{t}"
        );
        assert!(t.lines().nth(1).unwrap().starts_with("# event: "), "{t}");
    }

    #[test]
    fn a_running_process_is_named_in_the_header() {
        let mut r = server(2);
        let first = |r: &Recording| text(r, &ReportOptions::default()).lines().next().unwrap().to_string();
        assert_eq!(first(&r), "# process: [srv] (pid 100)");
        r.target.cmdline = Some(vec!["python3".into(), "-m".into(), "http.server".into()]);
        assert_eq!(first(&r), "# process: python3 -m http.server (pid 100)");
        r.target.cmdline = None;
        r.threads.clear();
        assert_eq!(first(&r), "# process: pid 100");
    }

    #[test]
    fn the_record_summary_counts_in_the_singular_and_plural() {
        let out = std::path::Path::new("p.json");
        let one = record_summary(&server(1), out);
        assert!(
            one.starts_with(
                "papirus-profile: 1 sample of task-clock from 1 thread in 1.000 s, written to p.json"
            ),
            "{one}"
        );
        let mut r = server(3);
        r.rings.lost = 1;
        r.rings.lost_records = 1;
        r.rings.throttles = 2;
        let three = record_summary(&r, out);
        assert!(three.starts_with("papirus-profile: 6 samples of task-clock from 3 threads in"), "{three}");
        assert!(three.contains("\npapirus-profile: a note\n"), "{three}");
        assert!(three.contains(": 1 sample lost in 1 LOST record: "), "{three}");
        assert!(three.contains("throttled sampling 2 times"), "{three}");
    }
}
