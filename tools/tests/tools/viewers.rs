//! Traces and the files other tools open, proved by those tools: the demo
//! under `run --trace` exported to every format; the Chrome trace in
//! speedscope, the SVGs in Chromium (one browser launch for all), the TAU
//! profile in Hatchet, the OTF2 archive in `otf2-print`. Each installs what
//! it needs (Debian packages, npm and PyPI packages in private directories
//! under the build's temporary directory, kept for later runs).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use papirus_probe::session::trace::{Trace, read_trace};
use papirus_probe_abi::Report;

/// Every demo function but fib, whose 21,891 recursive calls would make the
/// trace 27,000 calls: the viewers' inputs stay under 20,000 events.
const TRACED: &str = "main,worker,f,g,three,tail_caller,tail_callee,many,lj1,lj2,lj3,touch_pages";

/// The demo's run, once per test binary.
struct Demo {
    dir: tempfile::TempDir,
    report: Report,
    trace: Trace,
}

impl Demo {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn demo() -> &'static Demo {
    static D: OnceLock<Demo> = OnceLock::new();
    D.get_or_init(|| {
        let dir = papirus_testkit::scratch();
        let exe = papirus_testkit::Cc::new(crate::util::source("probe_program.c"))
            .arg("-pthread")
            .build(dir.path(), "demo");
        let p = |n: &str| dir.path().join(n);
        let exports = [
            ("chrome", "demo.trace.json"),
            ("folded", "demo.folded"),
            ("flamegraph", "demo.svg"),
            ("flamechart", "demo-chart.svg"),
            ("histogram", "demo-histogram.svg"),
            ("tau", "tau"),
            ("otf2", "otf2"),
        ];
        let mut cmd = Command::new(crate::util::probe());
        cmd.args(["run", "--per-thread", "--trace"])
            .arg(p("demo.ptrace"))
            .args(["--trace-functions", TRACED]);
        for (f, name) in exports {
            cmd.arg("--export").arg(format!("{f}={}", p(name).display()));
        }
        let o = cmd.arg("-o").arg(p("demo.json")).arg("--").arg(&exe).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        assert!(stderr.contains("trace: ") && stderr.contains(" calls, "), "{stderr}");
        let report = serde_json::from_slice(&std::fs::read(p("demo.json")).unwrap()).unwrap();
        let trace = read_trace(&p("demo.ptrace")).unwrap();
        Demo { dir, report, trace }
    })
}

/// Calls per (thread, function name) in the report.
fn report_calls(r: &Report) -> BTreeMap<(u32, String), u64> {
    let mut out = BTreeMap::new();
    for t in &r.threads {
        for f in &t.functions {
            out.insert((t.tid, r.functions[f.id as usize].clone()), f.figures.calls);
        }
    }
    out
}

#[test]
fn the_trace_holds_every_call_of_the_traced_functions() {
    let d = demo();
    let t = &d.trace;
    assert_eq!(t.lost(), 0, "nothing lost on the demo");
    assert_eq!(t.threads.len(), 5);
    let footer = t.footer.as_ref().expect("a finished trace");
    assert_eq!(footer.calls as usize, t.calls());
    let mut traced: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for th in &t.threads {
        assert!(th.started.is_some(), "thread {} has its start record", th.tid);
        for c in &th.calls {
            assert!(c.end >= c.start);
            *traced.entry((th.tid, t.name(c.function))).or_default() += 1;
        }
    }
    let wanted: Vec<&str> = TRACED.split(',').collect();
    let expected: BTreeMap<(u32, String), u64> =
        report_calls(&d.report).into_iter().filter(|((_, f), _)| wanted.contains(&f.as_str())).collect();
    assert_eq!(traced, expected, "the trace's calls per thread and function are the report's");
    assert!(t.calls() < 20_000 / 2, "the viewers' inputs stay small");

    // The Chrome trace carries the same calls, as complete events per thread, named threads.
    let chrome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path("demo.trace.json")).unwrap()).unwrap();
    let events = chrome["traceEvents"].as_array().unwrap();
    let mut in_chrome: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["dur"].as_f64().unwrap() >= 0.0 && e.get("args").is_none());
        *in_chrome
            .entry((e["tid"].as_u64().unwrap() as u32, e["name"].as_str().unwrap().into()))
            .or_default() += 1;
    }
    assert_eq!(in_chrome, expected);
    let names = events.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name").count();
    assert_eq!(names, 5);
    assert!(events.len() <= 20_000);

    // A profile built from the trace agrees with the runtime's on every traced path.
    let o = Command::new(crate::util::probe())
        .arg("report")
        .arg(d.path("demo.ptrace"))
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rebuilt: Report = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report_calls(&rebuilt), expected);
}

/// The `<title>` texts of an SVG's frames.
fn titles(svg: &str) -> Vec<String> {
    let mut r = quick_xml::Reader::from_str(svg);
    let (mut out, mut inside) = (Vec::new(), false);
    loop {
        match r.read_event().expect("the SVG parses as XML") {
            quick_xml::events::Event::Start(e) if e.name().as_ref() == b"title" => inside = true,
            quick_xml::events::Event::End(e) if e.name().as_ref() == b"title" => inside = false,
            quick_xml::events::Event::Text(t) if inside => out.push(t.decode().unwrap().into_owned()),
            quick_xml::events::Event::Eof => return out,
            _ => {}
        }
    }
}

#[test]
fn the_flame_graph_has_a_frame_per_node_above_the_threshold() {
    let d = demo();
    let r = &d.report;
    let ns = |ticks: u64| r.ns(ticks) as u64;
    for pct in [0.0, 2.0] {
        let out = d.path(&format!("threshold{pct}.svg"));
        let o = Command::new(crate::util::probe())
            .arg("report")
            .arg(d.path("demo.json"))
            .args(["--format", "flamegraph", "--threshold", &pct.to_string(), "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = titles(&std::fs::read_to_string(&out).unwrap());
        let frames = |name: &str| t.iter().filter(|t| t.starts_with(&format!("{name} ("))).count();
        // The root's width is the total: every node's exclusive time, all threads.
        let total: u64 = r.threads.iter().flat_map(|t| &t.tree).map(|n| ns(n.figures.excl_ticks)).sum();
        let root = t.iter().find(|t| t.starts_with("all (")).expect("the root frame");
        let width: u64 = root["all (".len()..].split(' ').next().unwrap().replace(',', "").parse().unwrap();
        assert_eq!(width, total, "{root}");
        // One frame per node whose inclusive time is at or above the threshold, per function.
        let mut want: BTreeMap<String, usize> = BTreeMap::new();
        for th in &r.threads {
            let thread_total: u64 =
                th.tree.iter().filter(|n| n.parent.is_none()).map(|n| ns(n.figures.incl_ticks)).sum();
            let cut = ((pct / 100.0 * thread_total as f64).ceil() as u64).max(1);
            for n in th.tree.iter().filter(|n| ns(n.figures.incl_ticks) >= cut) {
                *want.entry(r.functions[n.function as usize].clone()).or_default() += 1;
            }
        }
        for (name, n) in &want {
            assert_eq!(frames(name), *n, "frames of {name} at {pct}%: {t:?}");
        }
        if pct > 0.0 {
            assert!(want.get("fib").copied().unwrap_or(0) < 20, "the threshold hides deep fib levels");
        }
    }
}

#[test]
fn speedscope_and_chromium_open_the_outputs() {
    let d = demo();
    // The high-level API's regions, and a time histogram, from this process.
    let regions = d.path("regions.json");
    std::fs::write(&regions, serde_json::to_vec(&region_report()).unwrap()).unwrap();
    for (format, name) in [("chrome", "regions.trace.json"), ("flamegraph", "regions.svg")] {
        let o = Command::new(crate::util::probe())
            .arg("report")
            .arg(&regions)
            .args(["--format", format, "-o"])
            .arg(d.path(name))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let h = papirus_tools::export::histogram(&d.trace);
    assert_eq!(h.total() as usize, d.trace.calls(), "every traced call is in the histogram");
    let bars = h.buckets.iter().filter(|b| **b != 0.0).count();
    // A control: B/E events that do not nest, which speedscope takes with console warnings only.
    let bad = d.path("unbalanced.json");
    std::fs::write(
        &bad,
        r#"{"traceEvents":[{"ph":"B","name":"a","pid":1,"tid":1,"ts":0},{"ph":"B","name":"b","pid":1,"tid":1,"ts":1},
        {"ph":"E","name":"a","pid":1,"tid":1,"ts":2},{"ph":"E","name":"b","pid":1,"tid":1,"ts":3}]}"#,
    )
    .unwrap();
    let files = [
        d.path("demo.trace.json"),
        d.path("regions.trace.json"),
        d.path("demo.svg"),
        d.path("demo-chart.svg"),
        d.path("regions.svg"),
        d.path("demo-histogram.svg"),
        bad,
    ];
    let seen = match papirus_testkit::browser::open(&crate::util::viewers().join("npm"), &files) {
        Ok(s) => s,
        Err(e) => return papirus_testkit::skip(format!("no headless Chromium with speedscope: {e}")),
    };
    let control = seen.last().unwrap();
    assert!(
        control.title.ends_with("- speedscope") && !control.messages.is_empty(),
        "the check sees speedscope's importer warnings: {control:?}"
    );
    for l in &seen[..seen.len() - 1] {
        assert!(l.clean(), "{l:?}");
    }
    // The trace: loaded, one profile per thread, each thread's functions.
    let trace = &seen[0];
    assert_eq!(trace.title, "demo.trace.json - speedscope");
    assert_eq!(trace.profiles.len(), 5, "{:?}", trace.profiles);
    let pid = d.report.pid;
    for prof in &trace.profiles {
        let mut got = prof.symbols.clone();
        got.sort();
        let mut want: Vec<&str> = if prof.name.contains(&format!("thread {pid} (main)")) {
            vec![
                "f",
                "g",
                "lj1",
                "lj2",
                "lj3",
                "main",
                "many",
                "tail_callee",
                "tail_caller",
                "three",
                "touch_pages",
            ]
        } else {
            vec!["f", "g", "worker"]
        };
        want.sort();
        assert_eq!(got, want, "{}", prof.name);
    }
    assert!(seen[1].title.ends_with("- speedscope"));
    let region_names: Vec<&str> =
        seen[1].profiles.iter().flat_map(|p| p.symbols.iter().map(String::as_str)).collect();
    for name in ["solve", "assemble", "io"] {
        assert!(region_names.contains(&name), "{region_names:?}");
    }
    // The SVGs rendered: flame graphs and the chart draw a frame per node
    // or call, the histogram a bar per bucket with a value.
    let nodes: usize = d.report.threads.iter().map(|t| t.tree.len()).sum();
    assert_eq!(seen[2].svg_frames, Some(nodes + d.report.threads.len() + 1), "nodes, threads and `all`");
    let calls = d.trace.calls() + d.trace.threads.len() + 1;
    assert_eq!(seen[3].svg_frames, Some(calls), "a frame per call, per thread and `all`");
    assert!(seen[4].svg_frames.is_some_and(|n| n >= 4), "{:?}", seen[4].svg_frames);
    assert_eq!(seen[5].svg_titles, Some(bars + 1), "the bars and the document's title");
}

/// `attach --trace` drains while the program runs and writes what was open
/// at detach; the counters probe's values become counter tracks.
#[test]
fn attach_traces_and_counters_become_tracks() {
    let dir = papirus_testkit::scratch();
    let p = |n: &str| dir.path().join(n);
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("probe_loop.c")).build(dir.path(), "loop");
    let mut child = Command::new(&exe).arg("400").stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let o = Command::new(crate::util::probe())
        .arg("attach")
        .arg(child.id().to_string())
        .args(["--duration", "0.5", "--trace"])
        .arg(p("attach.ptrace"))
        .arg("-o")
        .arg(p("attach.json"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = read_trace(&p("attach.ptrace")).unwrap();
    let r: Report = serde_json::from_slice(&std::fs::read(p("attach.json")).unwrap()).unwrap();
    let g = r.total(r.id("g").unwrap()).figures.calls;
    let traced_g =
        t.threads.iter().flat_map(|th| &th.calls).filter(|c| t.name(c.function) == "g").count() as u64;
    assert!(g > 1000 && traced_g == g, "{traced_g} of {g} calls of g traced");
    assert_eq!(t.lost(), 0);
    assert!(child.wait().unwrap().success(), "the program runs on after detach");

    let demo = papirus_testkit::Cc::new(crate::util::source("probe_program.c"))
        .arg("-pthread")
        .build(dir.path(), "demo");
    // A trace needs times: the empty probe takes none, refused before anything runs.
    let o = Command::new(crate::util::probe())
        .args(["run", "--probe", "empty", "--trace", "--"])
        .arg(&demo)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("empty probe does not take"), "{o:?}");
    assert!(o.stdout.is_empty(), "the program did not run");
    let o = Command::new(crate::util::probe())
        .args([
            "run",
            "--probe",
            "counters",
            "--events",
            "task-clock",
            "--trace",
            "--trace-functions",
            "main,f,g",
        ])
        .arg("--export")
        .arg(format!("chrome={}", p("counters.json").display()))
        .arg("--")
        .arg(&demo)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let chrome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p("counters.json")).unwrap()).unwrap();
    let mut tracks: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
    for e in chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "C") {
        let v = e["args"]["value"].as_u64().unwrap();
        tracks
            .entry(e["name"].as_str().unwrap().to_string())
            .or_default()
            .push((e["ts"].as_f64().unwrap(), v));
    }
    assert_eq!(tracks.len(), 5, "a task-clock track per thread: {:?}", tracks.keys());
    for (name, mut points) in tracks {
        assert!(name.ends_with(" task-clock"), "{name}");
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(points.windows(2).all(|w| w[0].1 <= w[1].1), "{name}: thread CPU time never goes back");
        assert!(points.last().unwrap().1 > points[0].1, "{name}: it advances");
    }
}

/// A region report of this process: `solve` with `assemble` inside it, and `io`.
fn region_report() -> papirus_highlevel::Report {
    use papirus_highlevel::region::{Config, region};
    let mut c = Config::new();
    c.events(["task-clock"]).write_at_exit(false);
    c.install().unwrap();
    for _ in 0..3 {
        let _s = region("solve").unwrap();
        {
            let _a = region("assemble").unwrap();
            std::hint::black_box((0..10_000u64).sum::<u64>());
        }
    }
    let _io = region("io").unwrap();
    drop(_io);
    papirus_highlevel::report::snapshot().unwrap()
}

/// A private Python with Hatchet, kept between runs of this build.
fn hatchet() -> Result<PathBuf, String> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        papirus_testkit::debian_package("python3-venv", || {
            papirus_testkit::runs("python3", &["-c", "import ensurepip, venv"])
        })?;
        let venv = crate::util::viewers().join("hatchet");
        let py = venv.join("bin/python");
        if papirus_testkit::runs(py.to_str().unwrap_or_default(), &["-c", "import hatchet"]) {
            return Ok(py);
        }
        let ok = |o: std::io::Result<std::process::Output>, what: &str| match o {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!("{what}: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Err(format!("{what}: {e}")),
        };
        ok(Command::new("python3").args(["-m", "venv"]).arg(&venv).output(), "python3 -m venv")?;
        ok(
            Command::new(&py).args(["-m", "pip", "install", "-q", "llnl-hatchet==2026.2.0"]).output(),
            "pip install llnl-hatchet",
        )?;
        Ok(py)
    })
    .clone()
}

/// Reads a TAU directory with Hatchet: per (thread, call path) its inclusive time.
const READ_TAU: &str = r#"
import json, sys, warnings
warnings.simplefilter("ignore")
import hatchet as ht
gf = ht.GraphFrame.from_tau(sys.argv[1])
out = []
for node in gf.graph.traverse():
    path = [n.frame["name"] for n in node.path()]
    rows = gf.dataframe.xs(node, level="node")
    for thread, row in rows.iterrows():
        out.append({"path": path, "thread": int(thread[-1] if isinstance(thread, tuple) else thread),
                    "calls": float(row["Calls"]), "incl": float(row["time (inc)"])})
print(json.dumps(out))
"#;

#[test]
fn hatchet_reads_the_tau_profile() {
    let py = match hatchet() {
        Ok(p) => p,
        Err(e) => return papirus_testkit::skip(format!("no Hatchet: {e}")),
    };
    let d = demo();
    let o = Command::new(&py).arg("-c").arg(READ_TAU).arg(d.path("tau")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let r = &d.report;
    // Threads of the one process, in report order: thread k of node 0 is r.threads[k].
    for (k, t) in r.threads.iter().enumerate() {
        for (i, n) in t.tree.iter().enumerate() {
            let mut path = vec![r.functions[n.function as usize].clone()];
            let mut at = n.parent;
            while let Some(p) = at {
                path.push(r.functions[t.tree[p as usize].function as usize].clone());
                at = t.tree[p as usize].parent;
            }
            path.push(".TAU application".into());
            path.reverse();
            let row = rows
                .iter()
                .find(|row| row["thread"] == k && row["path"].as_array().is_some_and(|p| *p == path))
                .unwrap_or_else(|| panic!("Hatchet has no node {path:?} for thread {k}"));
            assert_eq!(row["calls"].as_f64().unwrap() as u64, n.figures.calls, "{path:?}");
            let want_us = r.ns(n.figures.incl_ticks) / 1e3;
            let got = row["incl"].as_f64().unwrap();
            assert!((got - want_us).abs() <= 1e-6 * want_us.max(1.0), "{path:?}: {got} us, want {want_us}");
            let _ = i;
        }
    }
}

#[test]
fn otf2_print_reads_the_archive_with_every_enter_left() {
    if let Err(e) =
        papirus_testkit::debian_package("otf2-tools", || papirus_testkit::runs("otf2-print", &["--help"]))
    {
        return papirus_testkit::skip(format!("no otf2-print: {e}"));
    }
    let d = demo();
    let anchor = d.path("otf2/traces.otf2");
    let silent = Command::new("otf2-print").arg("--silent").arg(&anchor).output().unwrap();
    assert!(
        silent.status.success() && silent.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&silent.stderr)
    );
    let o = Command::new("otf2-print").arg(&anchor).output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(!text.contains("INVALID"), "every reference resolves");
    // Per location: each ENTER matched by the LEAVE of the same region, in order.
    let mut stacks: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut entered: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with("ENTER") || l.starts_with("LEAVE")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (loc, time): (u64, u64) = (w[1].parse().unwrap(), w[2].parse().unwrap());
        let region = l.split('"').nth(1).unwrap().to_string();
        assert!(time >= last.get(&loc).copied().unwrap_or(0), "{l}");
        last.insert(loc, time);
        let s = stacks.entry(loc).or_default();
        if w[0] == "ENTER" {
            *entered.entry(region.clone()).or_default() += 1;
            s.push(region);
        } else {
            assert_eq!(s.pop().as_deref(), Some(region.as_str()), "{l}");
        }
    }
    assert_eq!(stacks.len(), 5);
    assert!(stacks.values().all(Vec::is_empty), "every enter was left");
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for th in &d.trace.threads {
        for c in &th.calls {
            *want.entry(d.trace.name(c.function)).or_default() += 1;
        }
    }
    assert_eq!(entered, want);
}
