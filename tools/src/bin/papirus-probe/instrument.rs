//! `run`, `attach` and `report`: instrument a program or a running process
//! with the probe runtime, and print what it measured.
//!
//! Nothing of papirus goes to the target's stdout: the profile is printed on
//! stderr, the JSON report goes to `-o FILE` (or a private temporary
//! directory, removed afterwards, when no `-o` is given).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use papirus_calibrate::CostFile;
use papirus_probe::process::Exit;
use papirus_probe::session::{
    self, AttachOptions, Instrumentation, ProbeCost, Report, RunOptions, Selection, SortKey, TraceRequest,
    View,
};
use papirus_substrate::EventAttr;
use papirus_tools::export::{self, Format};

use crate::output::{self, Failure, note};

/// Options shared by `run` and `attach`.
#[derive(Clone, Args, Debug)]
pub struct ProbeArgs {
    /// The probe: wallclock (TSC real time), counters (real time plus --events),
    /// or empty (counts calls only, no clock).
    #[arg(long, default_value = "wallclock")]
    probe: String,
    /// Counter events for the counters probe (1 to 4), named as papirus-stat
    /// -e takes them: perf's syntax (task-clock,page-faults,
    /// 'cpu/event=0x3c,umask=0x00/u'), PAPI presets (PAPI_TOT_CYC) and PAPI's
    /// spellings (perf::TASK-CLOCK); repeatable.
    #[arg(long, value_name = "E,…")]
    events: Vec<String>,
    /// Only functions whose name (stored or demangled) matches one of these
    /// globs (`*` any run, `?` any one byte, nothing else special);
    /// repeatable. `@FILE` reads globs from FILE, one per line or
    /// comma-separated (`#` starts a comment line).
    #[arg(long, short, value_name = "GLOB,…", value_delimiter = ',')]
    functions: Vec<String>,
    /// Leave out functions matching one of these globs, even when --functions
    /// matches them; repeatable; `@FILE` as for --functions.
    #[arg(long, short = 'x', value_name = "GLOB,…", value_delimiter = ',')]
    exclude: Vec<String>,
    /// Instrument this module (basename, or part of its path); repeatable.
    /// `main` names the main program. Default: the main program alone.
    #[arg(long, short, value_name = "M,…", value_delimiter = ',')]
    module: Vec<String>,
    /// Report ended threads one by one (at most half the thread tables, the
    /// oldest folded first) instead of folded into one entry per process.
    #[arg(long)]
    per_thread: bool,
    /// Write the JSON report to FILE (default: none kept; the profile is
    /// printed on stderr either way).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// A machine cost file (`papirus-probe calibrate --json FILE`): show the
    /// probe's estimated cost per instrumented call and the overhead the
    /// instrumentation is predicted to have added (Paradyn's cost model).
    #[arg(long, value_name = "FILE")]
    costs: Option<PathBuf>,
    /// With --costs: subtract the probe's estimated cost from the printed times.
    #[arg(long, requires = "costs")]
    subtract_cost: bool,
    /// Distinct call paths kept per thread (the call-path tree's nodes; a
    /// process keeps 4 times as many for its ended threads; default: 64 per
    /// instrumented function, 16,384 to 1,048,576; 128 bytes each, used only
    /// as paths appear). Calls on new paths beyond it are counted, not
    /// placed, and the report says so.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=1 << 24))]
    tree_nodes: Option<u64>,
    /// Record every call: its entry and exit time, function and thread (and
    /// counter values with the counters probe), into per-thread rings the
    /// tool drains while the program runs, written to FILE (papirus' trace
    /// format: `papirus-probe report FILE --format chrome|otf2|…`). Without
    /// FILE the trace serves --export and the summary, and is not kept.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    trace: Option<Option<PathBuf>>,
    /// Trace only functions matching one of these globs (default: every
    /// instrumented function); repeatable; `@FILE` as for --functions.
    #[arg(long, value_name = "GLOB,…", value_delimiter = ',', requires = "trace")]
    trace_functions: Vec<String>,
    /// Leave calls shorter than this out of the trace (decided at their
    /// exit): 500ns, 2us, 1.5ms, 1s.
    #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "trace")]
    trace_min_duration: Option<Duration>,
    /// Trace only the outermost N levels of instrumented calls of each thread.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "trace")]
    trace_depth: Option<u64>,
    /// Records per thread's trace ring, a power of two (24 bytes a call,
    /// 16 more per counter event; default 262144: 6 MiB per thread). A ring
    /// that fills before the tool drains it (every 2 ms) loses its oldest
    /// calls, counted and reported.
    #[arg(long, value_name = "RECORDS", default_value_t = papirus_probe_abi::DEFAULT_RING, requires = "trace")]
    trace_buffer: u64,
    /// When the measurement ends, also write FORMAT to PATH (repeatable):
    /// text, json, folded, flamegraph, tau (a directory); with --trace also
    /// chrome, flamechart, histogram and otf2 (a directory).
    #[arg(long, value_name = "FORMAT=PATH", value_parser = parse_export)]
    export: Vec<(Format, PathBuf)>,
}

/// A `--export FORMAT=PATH`.
fn parse_export(s: &str) -> Result<(Format, PathBuf), String> {
    use clap::ValueEnum;
    let (f, path) =
        s.split_once('=').ok_or_else(|| format!("`{s}`: give FORMAT=PATH (e.g. flamegraph=app.svg)"))?;
    let format = Format::from_str(f, true).map_err(|_| {
        let names: Vec<&str> = Format::value_variants().iter().map(|v| v.name()).collect();
        format!("unknown format `{f}`: use one of {}", names.join(", "))
    })?;
    if path.is_empty() {
        return Err(format!("`{s}`: the path is empty"));
    }
    Ok((format, PathBuf::from(path)))
}

/// A duration with a unit: `500ns`, `2us`, `1.5ms`, `1s`.
pub fn parse_time(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("`{s}`: give a time with a unit: 500ns, 2us, 1.5ms, 1s")),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}`: `{num}` is not a number"))?;
    if !v.is_finite() || v < 0.0 || v * scale > MAX_DURATION_S {
        return Err(format!("`{s}` is not a time between 0 and a year"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

impl ProbeArgs {
    /// The trace the options ask for: its file (`dir` holds an unnamed one).
    fn trace(&self, dir: &Path) -> Result<Option<TraceRequest>, Failure> {
        let Some(path) = &self.trace else {
            if let Some((f, _)) = self.export.iter().find(|(f, _)| {
                matches!(f, Format::Chrome | Format::Flamechart | Format::Histogram | Format::Otf2)
            }) {
                return Err(format!("--export {}=… shows calls on a timeline: add --trace", f.name()).into());
            }
            return Ok(None);
        };
        let output = path.clone().unwrap_or_else(|| dir.join("trace.ptrace"));
        papirus_formats::output::check_writable(&output)?;
        Ok(Some(TraceRequest {
            output,
            functions: expand_globs(&self.trace_functions)?,
            min_duration: self.trace_min_duration.unwrap_or_default(),
            depth: self.trace_depth,
            ring: self.trace_buffer,
        }))
    }

    /// The probe, its event names, the selection and the runtime library.
    fn parts(&self) -> Result<Parts, Failure> {
        // Every session needs the clock: set up while the events resolve and
        // the target is prepared.
        papirus_substrate::clock::set_up_in_background();
        let p = session::parse_probe(&self.probe)?;
        let events = session::resolve_events(p, &self.events)?;
        let sel = Selection {
            modules: self.module.clone(),
            functions: expand_globs(&self.functions)?,
            exclude: expand_globs(&self.exclude)?,
        };
        Ok((p, events, sel, session::find_runtime()?))
    }

    /// What `run` and `attach` measure, from [`Self::parts`].
    fn instrumentation(
        &self,
        (probe, events, selection, runtime): Parts,
        output: PathBuf,
        trace: Option<TraceRequest>,
    ) -> Instrumentation {
        Instrumentation {
            probe,
            events,
            selection,
            output,
            runtime,
            per_thread: self.per_thread,
            nodes: self.tree_nodes.unwrap_or(0),
            trace,
        }
    }
}

/// The probe, its resolved events, the selection and the runtime library.
type Parts = (session::Probe, Vec<EventAttr>, Selection, PathBuf);

/// The most a `@FILE` of globs may hold.
const MAX_GLOB_FILE: u64 = 16 << 20;

/// Globs with each `@FILE` replaced by the globs in FILE: lists too long for
/// one command-line argument (128 KiB on Linux) fit there.
fn expand_globs(args: &[String]) -> Result<Vec<String>, Failure> {
    use std::io::Read;
    let mut out = Vec::new();
    for a in args {
        let Some(path) = a.strip_prefix('@') else {
            out.push(a.clone());
            continue;
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_GLOB_FILE + 1).read_to_string(&mut text))
            .map_err(|e| format!("glob file {path}: {e}"))?;
        if text.len() as u64 > MAX_GLOB_FILE {
            return Err(format!("glob file {path} is larger than {MAX_GLOB_FILE} bytes").into());
        }
        let lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
        out.extend(
            lines.flat_map(|l| l.split(',')).map(str::trim).filter(|g| !g.is_empty()).map(String::from),
        );
    }
    Ok(out)
}

/// How the profile is printed (`run`, `attach`, `demo`, `report`).
#[derive(Clone, Args, Debug)]
pub struct ViewArgs {
    /// Sort by this column: excl, incl or calls.
    #[arg(long, default_value = "excl")]
    sort: SortKey,
    /// Show this many functions (summary default: 10; full report: all).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Print whole function names (default: cut to 40 characters, marked `…`).
    #[arg(long)]
    wide: bool,
}

impl ViewArgs {
    fn view(&self, thread: Option<u32>) -> View {
        View { thread, sort: self.sort, top: self.top, wide: self.wide, ..View::default() }
    }
}

/// What `run`, `attach` and `demo` take alike: the probe, how the summary
/// is shown, and whether the full report is.
#[derive(Args, Debug, Clone)]
pub struct Measure {
    #[command(flatten)]
    probe: ProbeArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// Print the full report (every thread, caller → callee pairs) on stderr
    /// instead of the summary.
    #[arg(long)]
    full: bool,
}

/// `run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    measure: Measure,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    command: Vec<OsString>,
}

/// The bundled example: nested calls, recursion, several return paths, a
/// tail call, many arguments, threads and a longjmp.
const DEMO_SOURCE: &str = include_str!("demo.c");

/// `papirus-probe demo`: builds the bundled example with gcc and runs it
/// instrumented, as `run` would.
pub fn demo(args: &Measure) -> Result<u8, Failure> {
    // A fresh private directory: nobody else can have put a source, a
    // binary or a link in it before gcc writes there.
    let (dir, exe) = papirus_probe::session::cost::gcc_scratch(
        "papirus-probe-demo-",
        "probe_program",
        DEMO_SOURCE,
        &["-pthread"],
    )
    .map_err(|e| e.to_string())?;
    note(&format!("papirus-probe: built the demo program {} from the bundled source", exe.display()));
    let result = run(&RunArgs { measure: args.clone(), command: vec![exe.clone().into_os_string()] });
    drop(dir);
    result
}

/// `attach` arguments.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The running process.
    pid: i32,
    /// Measure this many seconds (decimals allowed), then detach (default: until Ctrl-C).
    #[arg(long, value_name = "S", value_parser = parse_duration, allow_hyphen_values = true)]
    duration: Option<Duration>,
    #[command(flatten)]
    measure: Measure,
}

/// The longest `--duration`: a year, far beyond any measurement and within `Duration`.
const MAX_DURATION_S: f64 = 365.0 * 86400.0;

/// A `--duration` in seconds: finite, positive, at most a year.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds (e.g. 2.5)"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("`{s}` is not a positive, finite number of seconds (e.g. 2.5)"));
    }
    if secs > MAX_DURATION_S {
        return Err(format!(
            "`{s}` seconds is more than a year ({MAX_DURATION_S} s): give a shorter duration"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}` seconds: {e}"))
}

/// `report` arguments.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A JSON report written by `run` or `attach` (`-o FILE`), a trace file
    /// (`--trace FILE`), or a region report of papirus' high-level API
    /// (`papirus_PID.json`).
    file: PathBuf,
    /// What to write: text (the report), json, chrome (Chrome trace JSON:
    /// Perfetto, speedscope), folded (folded stacks), flamegraph (SVG),
    /// flamechart (SVG of a trace's calls over time), histogram (SVG of
    /// the calls a trace's run began per interval), tau (a TAU profile
    /// directory: ParaProf, Hatchet), otf2 (an OTF2 archive directory:
    /// Vampir; needs Debian's libopen-trace-format2-10).
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Write to PATH instead of stdout (a new directory for tau and otf2).
    #[arg(long, short, value_name = "PATH")]
    output: Option<PathBuf>,
    /// Print each thread's call-path tree (text format).
    #[arg(long)]
    tree: bool,
    /// With --tree: show this many levels.
    #[arg(long, value_name = "N", requires = "tree")]
    depth: Option<usize>,
    /// Leave out tree nodes (--tree) and flame-graph frames whose inclusive
    /// time is below this percentage of their thread's total.
    #[arg(long, value_name = "PCT", default_value_t = 0.0, value_parser = parse_percent)]
    threshold: f64,
    /// Only this thread (kernel thread id; text format).
    #[arg(long)]
    thread: Option<u32>,
    #[command(flatten)]
    view: ViewArgs,
    /// A machine cost file: show (and with --subtract-cost remove) the probe's cost per call.
    #[arg(long, value_name = "FILE")]
    costs: Option<PathBuf>,
    /// With --costs: subtract the probe's estimated cost from the printed times.
    #[arg(long, requires = "costs")]
    subtract_cost: bool,
}

/// A percentage from 0 to 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().trim_end_matches('%').parse().map_err(|_| format!("`{s}` is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}`: give a percentage from 0 to 100"));
    }
    Ok(v)
}

/// Where papirus-probe writes the JSON report: `-o FILE`, or a file in a
/// private temporary directory that goes away with this value (which also
/// holds a trace the user did not name).
struct ReportFile {
    path: PathBuf,
    /// The private directory, removed with what is in it when this value drops.
    scratch: PathBuf,
    _dir: tempfile::TempDir,
}

impl ReportFile {
    fn new(output: Option<&Path>) -> Result<ReportFile, Failure> {
        let dir = tempfile::Builder::new().prefix("papirus-probe-").tempdir()?;
        let path = output.map_or_else(|| dir.path().join("report.json"), Path::to_path_buf);
        Ok(ReportFile { path, scratch: dir.path().to_path_buf(), _dir: dir })
    }
}

/// The `--costs` file, read before the run so a bad one costs no run.
fn load_costs(path: Option<&Path>) -> Result<Option<(&Path, CostFile)>, Failure> {
    Ok(match path {
        Some(p) => Some((p, CostFile::load(p)?)),
        None => None,
    })
}

/// The probe's cost per call for `report`, and the predicted total as a header note.
fn cost_view(
    costs: Option<(&Path, CostFile)>,
    subtract: bool,
    report: &Report,
    view: &mut View,
) -> Result<(), Failure> {
    let Some((path, costs)) = costs else { return Ok(()) };
    let p = papirus_tools::probe_costs::predict(&costs, report)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut source = format!("{}, row {}", path.display(), p.row);
    if let Some(n) = &p.note {
        source.push_str(&format!("; {n}"));
    }
    view.cost = Some(ProbeCost { ns_per_call: p.added_ns, source, subtract });
    view.notes.push(("overhead".into(), p.to_string()));
    Ok(())
}

/// Prints the session's report on stderr.
fn show(
    r: &Report,
    costs: Option<(&Path, CostFile)>,
    probe: &ProbeArgs,
    mut view: View,
    full: bool,
) -> Result<(), Failure> {
    cost_view(costs, probe.subtract_cost, r, &mut view)?;
    if let Some(o) = &probe.output {
        view.notes.push(("JSON report".into(), o.display().to_string()));
    }
    view.notes.push(window_note(&r.window));
    if r.processes.len() > 1 {
        for p in &r.processes {
            view.notes.push(("process".into(), format!("pid {} (parent {}): {}", p.pid, p.parent, p.ended)));
        }
    }
    let text = if full { session::format_report(r, &view) } else { session::format_summary(r, &view) };
    output::stderr(&text)
}

/// The report's measurement window as a header line.
fn window_note(w: &session::Window) -> (String, String) {
    let secs = |ns: u64| ns as f64 / 1e9;
    let value = format!(
        "{:.6} s, Unix time {:.6} to {:.6}",
        secs(w.duration_ns),
        secs(w.start_unix_ns),
        secs(w.end_unix_ns)
    );
    ("window".into(), value)
}

/// The exit status that passes on how the target ended.
fn status_of(exit: Exit) -> Result<u8, Failure> {
    match exit {
        Exit::Code(c) => Ok(c as u8),
        Exit::Signal(s) => Ok(128u8.saturating_add(s as u8)),
        Exit::Unknown => Err("the target ended and the kernel no longer says how".into()),
    }
}

/// `papirus-probe run`: returns the target's exit status.
pub fn run(args: &RunArgs) -> Result<u8, Failure> {
    let parts = args.measure.probe.parts()?;
    let costs = load_costs(args.measure.probe.costs.as_deref())?;
    let file = ReportFile::new(args.measure.probe.output.as_deref())?;
    let trace = args.measure.probe.trace(&file.scratch)?;
    let opts = RunOptions {
        program: PathBuf::from(&args.command[0]),
        args: args.command[1..].to_vec(),
        instrumentation: args.measure.probe.instrumentation(parts, file.path.clone(), trace.clone()),
    };
    let s = session::run(&opts)?;
    let mut view = args.measure.view.view(None);
    let ended = if s.exec { format!("called execve, then {}", s.exit) } else { s.exit.to_string() };
    view.notes.push(("target".into(), format!("pid {}, {ended}", s.pid)));
    view.notes.push(("report written in".into(), format!("{:.1} ms", s.report_time.as_secs_f64() * 1e3)));
    trace_notes(s.trace.as_ref(), matches!(args.measure.probe.trace, Some(Some(_))), &mut view);
    show(&s.report, costs, &args.measure.probe, view, args.measure.full)?;
    let name = args.command[0].to_string_lossy().rsplit('/').next().unwrap_or_default().to_string();
    export(s.report, trace.as_ref(), &args.measure.probe.export, &name)?;
    status_of(s.exit)
}

/// The trace's figures as header notes.
fn trace_notes(t: Option<&session::TraceSummary>, named: bool, view: &mut View) {
    let Some(t) = t else { return };
    let kept =
        if named { format!("in {}", t.path.display()) } else { "not kept (--trace FILE keeps it)".into() };
    view.notes.push(("trace".into(), format!("{} calls, {:.1} MB, {kept}", t.calls, t.bytes as f64 / 1e6)));
    if t.lost > 0 {
        view.notes.push((
            "trace lost".into(),
            format!(
                "{} calls: rings filled before papirus-probe drained them (a larger --trace-buffer keeps them)",
                t.lost
            ),
        ));
    }
}

/// Writes each `--export FORMAT=PATH` from the report (and the trace).
fn export(
    report: Report,
    trace: Option<&TraceRequest>,
    exports: &[(Format, PathBuf)],
    title: &str,
) -> Result<(), Failure> {
    if exports.is_empty() {
        return Ok(());
    }
    let input = export::Input {
        report,
        trace: trace.map(|t| session::read_trace(&t.output)).transpose()?,
        regions: None,
    };
    let o = export::Options { view: View::default(), tree: None, threshold: 0.0, title: title.to_string() };
    for (f, path) in exports {
        write_format(&input, *f, Some(path), &o)?;
        note(&format!("papirus-probe: {} written to {}", f.name(), path.display()));
    }
    Ok(())
}

/// One format to `dest` (a file, or a directory for tau and otf2) or stdout.
fn write_format(
    input: &export::Input,
    f: Format,
    dest: Option<&Path>,
    o: &export::Options,
) -> Result<(), Failure> {
    match dest {
        Some(dir) if f.is_directory() => export::write_dir(input, f, dir),
        Some(path) => {
            let bytes = export::render(input, f, o)?;
            papirus_formats::output::write_atomic(path, &bytes)?;
            Ok(())
        }
        None if f.is_directory() => {
            Err(format!("the {} format is a directory: name one with -o DIR", f.name()).into())
        }
        None => output::stdout(&String::from_utf8_lossy(&export::render(input, f, o)?)),
    }
}

/// The signal that ended an attach, 0 for none.
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

/// The signals that end an attach cleanly (restore, flush, detach) instead of
/// killing the tool with the target still patched.
const ENDING: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

fn ending_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in ENDING {
        set.add(s);
    }
    set
}

/// `papirus-probe attach`.
///
/// SIGINT, SIGTERM and SIGHUP are blocked in every thread before the target is
/// touched and taken by a thread waiting for them: whenever one arrives, the
/// attach runs to its end (the report written, every patch restored, the
/// target detached) before the tool exits. Ctrl-C without `--duration` is the
/// normal end of the measurement; any other of these signals is raised again
/// afterwards with its default action, so the exit status says what ended us.
pub fn attach(args: &AttachArgs) -> Result<u8, Failure> {
    let parts = args.measure.probe.parts()?;
    let costs = load_costs(args.measure.probe.costs.as_deref())?;
    let file = ReportFile::new(args.measure.probe.output.as_deref())?;
    let duration = args.duration;
    let ending = ending_signals();
    ending.thread_block()?;
    let stop = std::sync::Arc::new(session::Stop::new()?);
    let stopper = stop.clone();
    std::thread::spawn(move || {
        if let Ok(sig) = ending.wait() {
            STOPPED_BY.store(sig as i32, Ordering::Relaxed);
            stopper.stop();
        }
    });
    if duration.is_none() {
        note(&format!("papirus-probe: measuring pid {} until Ctrl-C", args.pid));
    }
    let trace = args.measure.probe.trace(&file.scratch)?;
    let opts = AttachOptions {
        pid: args.pid,
        duration,
        instrumentation: args.measure.probe.instrumentation(parts, file.path.clone(), trace.clone()),
    };
    let attached = session::attach(&opts, &stop);
    let by = Signal::try_from(STOPPED_BY.load(Ordering::Relaxed)).ok();
    if let Some(sig) = by.filter(|&s| s != Signal::SIGINT || duration.is_some()) {
        note(&format!("papirus-probe: {sig} received: pid {} restored and detached", args.pid));
        match &attached {
            Ok(_) if args.measure.probe.output.is_some() => {
                note(&format!("papirus-probe: report in {}", file.path.display()))
            }
            Ok(_) => {}
            Err(e) => note(&format!("papirus-probe: error: {e}")),
        }
        reraise(sig);
    }
    let s = attached?;
    let mut view = args.measure.view.view(None);
    view.notes.push(("target".into(), format!("pid {}, detached, left running uninstrumented", args.pid)));
    view.notes.push(("stopped".into(), format!("{:.1} ms to instrument", s.stop_window.as_secs_f64() * 1e3)));
    for c in &s.children {
        view.notes.push(("restored child".into(), format!("pid {c}, forked during the measurement")));
    }
    let kb = |b: u64| b.div_ceil(1024);
    let tramps = match s.kept.bytes() {
        0 => format!("{} kB unmapped", kb(s.released)),
        k => format!("{} kB unmapped, {} kB stay: {}", kb(s.released), kb(k), s.kept.reason),
    };
    view.notes.push(("trampolines".into(), tramps));
    let runtime = match &s.runtime_stays {
        None => "unloaded".to_string(),
        Some(why) => format!("stays loaded: {why}"),
    };
    view.notes.push(("probe runtime".into(), runtime));
    view.notes.push(("report written in".into(), format!("{:.1} ms", s.report_time.as_secs_f64() * 1e3)));
    trace_notes(s.trace.as_ref(), matches!(args.measure.probe.trace, Some(Some(_))), &mut view);
    show(&s.report, costs, &args.measure.probe, view, args.measure.full)?;
    export(s.report, trace.as_ref(), &args.measure.probe.export, &format!("pid {}", args.pid))?;
    Ok(0)
}

/// Ends the tool by `sig` with its default action (the exit status a shell reports).
fn reraise(sig: Signal) -> ! {
    let _ = papirus_substrate::signal::set_default(sig as i32);
    let _ = nix::sys::signal::raise(sig);
    let mut only = SigSet::empty();
    only.add(sig);
    let _ = only.thread_unblock();
    // Not reached when the signal's default action ends the process.
    std::process::exit(128 + sig as i32)
}

/// `papirus-probe report`: the report (or another format) on stdout or in `-o PATH`.
pub fn report(args: &ReportArgs) -> Result<u8, Failure> {
    let input = export::load(&args.file)?;
    let mut view = args.view.view(args.thread);
    if args.format == Format::Text && input.regions.is_none() {
        cost_view(load_costs(args.costs.as_deref())?, args.subtract_cost, &input.report, &mut view)?;
    }
    let threshold = args.threshold / 100.0;
    let tree = args.tree.then_some(session::TreeView { depth: args.depth, threshold });
    let title = args.file.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let o = export::Options { view, tree, threshold, title };
    write_format(&input, args.format, args.output.as_deref(), &o)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_files_expand_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("globs");
        std::fs::write(&file, "# left out\nlib_c\n\n  lib_d , ma*\n").unwrap();
        let at = format!("@{}", file.display());
        let got = expand_globs(&["first".into(), at, "last".into()]).unwrap();
        assert_eq!(got, ["first", "lib_c", "lib_d", "ma*", "last"]);
        assert!(expand_globs(&[format!("@{}", dir.path().join("missing").display())]).is_err());
    }

    #[test]
    fn durations_are_finite_positive_and_bounded() {
        for bad in ["nan", "inf", "-inf", "-1", "0", "-0", "1e30", "", "two"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("31536000"), Ok(Duration::from_secs(31_536_000)));
    }
}
