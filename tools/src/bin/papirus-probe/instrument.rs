//! `run`, `attach` and `report`: instrument a program or a running process
//! with the probe runtime, and print what it measured.
//!
//! Nothing of papirus goes to the target's stdout: the profile is printed on
//! stderr, the JSON report goes to `-o FILE` (or a private temporary
//! directory, removed afterwards, when no `-o` is given).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use papirus_calibrate::CostFile;
use papirus_probe::process::Exit;
use papirus_probe::session::{self, AttachOptions, ProbeCost, Report, RunOptions, Selection, SortKey, View};

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
    /// globs (`*`, `?`); repeatable. `@FILE` reads globs from FILE, one per
    /// line or comma-separated (`#` starts a comment line).
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
}

impl ProbeArgs {
    /// The probe, its event names, the selection and the runtime library.
    fn parts(&self) -> Result<(session::Probe, Vec<String>, Selection, PathBuf), Failure> {
        let p = session::parse_probe(&self.probe)?;
        let events = session::expand_events(&self.events)?;
        session::check_events(p, &events)?;
        let sel = Selection {
            modules: self.module.clone(),
            functions: expand_globs(&self.functions)?,
            exclude: expand_globs(&self.exclude)?,
        };
        Ok((p, events, sel, session::find_runtime()?))
    }
}

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
    // A fresh private directory (mkdtemp, mode 0700): nobody else can have
    // put a source, a binary or a link in it before gcc writes there.
    let dir = tempfile::Builder::new().prefix("papirus-probe-demo-").tempdir()?;
    let exe = papirus_probe::session::cost::gcc(dir.path(), "probe_program", DEMO_SOURCE, &["-pthread"])
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
    /// A JSON report written by `run` or `attach` (`-o FILE`).
    file: PathBuf,
    /// Only this thread (kernel thread id).
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

/// Where papirus-probe writes the JSON report: `-o FILE`, or a file in a
/// private temporary directory that goes away with this value.
struct ReportFile {
    path: PathBuf,
    /// Removed, with the report in it, when this value drops.
    _dir: Option<tempfile::TempDir>,
}

impl ReportFile {
    fn new(output: Option<&Path>) -> Result<ReportFile, Failure> {
        Ok(match output {
            Some(p) => ReportFile { path: p.to_path_buf(), _dir: None },
            None => {
                let dir = tempfile::Builder::new().prefix("papirus-probe-").tempdir()?;
                ReportFile { path: dir.path().join("report.json"), _dir: Some(dir) }
            }
        })
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

/// Reads the report the runtime wrote and prints it on stderr.
fn show(
    file: &ReportFile,
    costs: Option<(&Path, CostFile)>,
    probe: &ProbeArgs,
    mut view: View,
    full: bool,
) -> Result<(), Failure> {
    let r = session::read_report(&file.path)?;
    cost_view(costs, probe.subtract_cost, &r, &mut view)?;
    if let Some(o) = &probe.output {
        view.notes.push(("JSON report".into(), o.display().to_string()));
    }
    view.notes.push(window_note(&r.window));
    if r.processes.len() > 1 {
        for p in &r.processes {
            view.notes.push(("process".into(), format!("pid {} (parent {}): {}", p.pid, p.parent, p.ended)));
        }
    }
    let text = if full { session::format_report(&r, &view) } else { session::format_summary(&r, &view) };
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
    let (p, events, selection, runtime) = args.measure.probe.parts()?;
    let costs = load_costs(args.measure.probe.costs.as_deref())?;
    let file = ReportFile::new(args.measure.probe.output.as_deref())?;
    let opts = RunOptions {
        probe: p,
        events,
        selection,
        output: file.path.clone(),
        program: PathBuf::from(&args.command[0]),
        args: args.command[1..].to_vec(),
        runtime,
        per_thread: args.measure.probe.per_thread,
    };
    let s = session::run(&opts)?;
    let mut view = args.measure.view.view(None);
    let ended = if s.exec { format!("called execve, then {}", s.exit) } else { s.exit.to_string() };
    view.notes.push(("target".into(), format!("pid {}, {ended}", s.pid)));
    view.notes.push(("report written in".into(), format!("{:.1} ms", s.report_time.as_secs_f64() * 1e3)));
    show(&file, costs, &args.measure.probe, view, args.measure.full)?;
    status_of(s.exit)
}

static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that set [`STOP`], 0 for none.
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
    let (p, events, selection, runtime) = args.measure.probe.parts()?;
    let costs = load_costs(args.measure.probe.costs.as_deref())?;
    let file = ReportFile::new(args.measure.probe.output.as_deref())?;
    let duration = args.duration;
    let ending = ending_signals();
    ending.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(sig) = ending.wait() {
            STOPPED_BY.store(sig as i32, Ordering::Relaxed);
            STOP.store(true, Ordering::Relaxed);
        }
    });
    if duration.is_none() {
        note(&format!("papirus-probe: measuring pid {} until Ctrl-C", args.pid));
    }
    let opts = AttachOptions {
        pid: args.pid,
        probe: p,
        events,
        selection,
        output: file.path.clone(),
        duration,
        runtime,
        per_thread: args.measure.probe.per_thread,
    };
    let attached = session::attach(&opts, &STOP);
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
    view.notes.push(("report written in".into(), format!("{:.1} ms", s.report_time.as_secs_f64() * 1e3)));
    show(&file, costs, &args.measure.probe, view, args.measure.full)?;
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

/// `papirus-probe report`: the full report on stdout.
pub fn report(args: &ReportArgs) -> Result<u8, Failure> {
    let r = session::read_report(&args.file)?;
    let mut view = args.view.view(args.thread);
    cost_view(load_costs(args.costs.as_deref())?, args.subtract_cost, &r, &mut view)?;
    output::stdout(&session::format_report(&r, &view))?;
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
