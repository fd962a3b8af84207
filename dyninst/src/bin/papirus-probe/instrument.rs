//! `run`, `attach` and `report`: instrument a program or a running process
//! with the probe runtime, and print what it measured.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use papirus_calibrate::CostFile;
use papirus_dyninst::probe::{self, AttachOptions, RunOptions, Selection, SortKey};

/// Options shared by `run` and `attach`.
#[derive(Clone, Args, Debug)]
pub struct ProbeArgs {
    /// The probe: wallclock (TSC real time), counters (real time plus --events),
    /// or empty (counts calls only, no clock).
    #[arg(long, default_value = "wallclock")]
    probe: String,
    /// Counter events for the counters probe (1 to 4, e.g. task-clock,page-faults).
    #[arg(long, value_name = "E,…", value_delimiter = ',')]
    events: Vec<String>,
    /// Only functions whose name (stored or demangled) matches one of these globs.
    #[arg(long, short, value_name = "GLOB,…", value_delimiter = ',')]
    functions: Vec<String>,
    /// Instrument this module (basename or path part) instead of the main program.
    #[arg(long, short, value_name = "M")]
    module: Option<String>,
    /// Where the JSON report goes.
    #[arg(long, short, default_value = "papirus-probe.json")]
    output: PathBuf,
    /// A machine cost file (`papirus-probe calibrate --json FILE`): print the
    /// overhead the instrumentation is predicted to have added (calls × the
    /// probe's added cost per call, Paradyn's cost model).
    #[arg(long, value_name = "FILE")]
    costs: Option<PathBuf>,
}

impl ProbeArgs {
    fn parts(&self) -> Result<(probe::Probe, Selection, PathBuf), Failure> {
        let p = probe::parse_probe(&self.probe)?;
        probe::check_events(p, &self.events)?;
        let sel = Selection { module: self.module.clone(), functions: self.functions.clone() };
        Ok((p, sel, probe::find_runtime()?))
    }
}

/// `run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    probe: ProbeArgs,
    /// Print the report sorted by this column: excl, incl or calls.
    #[arg(long, default_value = "excl")]
    sort: SortKey,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    command: Vec<OsString>,
}

/// `demo` arguments.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    probe: ProbeArgs,
    /// Print the report sorted by this column: excl, incl or calls.
    #[arg(long, default_value = "excl")]
    sort: SortKey,
}

/// The bundled example: nested calls, recursion, several return paths, a
/// tail call, many arguments, threads and a longjmp.
const DEMO_SOURCE: &str = include_str!("../../../tests/targets/probe_program.c");

/// `papirus-probe demo`: builds the bundled example with gcc and runs it
/// instrumented, as `run` would.
pub fn demo(args: &DemoArgs) -> Result<(), Failure> {
    let dir = std::env::temp_dir().join(format!("papirus-probe-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("probe_program.c");
    let exe = dir.join("probe_program");
    std::fs::write(&src, DEMO_SOURCE)?;
    let built = std::process::Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(|e| {
            format!("cannot run gcc to build the demo program ({e}): install it (apt-get install gcc)")
        })?;
    if !built.success() {
        return Err(format!("gcc failed to build the demo program {} ({built})", src.display()).into());
    }
    eprintln!("papirus-probe: built the demo program {} from the bundled source", exe.display());
    let result = run(&RunArgs {
        probe: args.probe.clone(),
        sort: args.sort,
        command: vec![exe.clone().into_os_string()],
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `attach` arguments.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The running process.
    pid: i32,
    #[command(flatten)]
    probe: ProbeArgs,
    /// Measure this many seconds, then detach (default: until Ctrl-C).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Print the report sorted by this column: excl, incl or calls.
    #[arg(long, default_value = "excl")]
    sort: SortKey,
}

/// `report` arguments.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A JSON report written by `run` or `attach`.
    file: PathBuf,
    /// Only this thread (kernel thread id).
    #[arg(long)]
    thread: Option<u32>,
    /// Sort by excl, incl or calls.
    #[arg(long, default_value = "excl")]
    sort: SortKey,
}

type Failure = Box<dyn std::error::Error>;

fn print_report(file: &std::path::Path, thread: Option<u32>, sort: SortKey) -> Result<(), Failure> {
    let r = probe::read_report(file)?;
    print!("{}", probe::format_report(&r, thread, sort));
    Ok(())
}

/// The `--costs` file, read before the run so a bad one costs no run.
fn load_costs(args: &ProbeArgs) -> Result<Option<(&std::path::Path, CostFile)>, Failure> {
    Ok(match &args.costs {
        Some(p) => Some((p.as_path(), CostFile::load(p)?)),
        None => None,
    })
}

/// With `--costs`, prints the predicted overhead of the run that wrote `report`.
fn print_prediction(
    costs: Option<(&std::path::Path, CostFile)>,
    report: &std::path::Path,
) -> Result<(), Failure> {
    let Some((path, costs)) = costs else { return Ok(()) };
    let r = probe::read_report(report)?;
    let p = probe::calibrate::predict(&costs, &r).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{p}");
    Ok(())
}

/// `papirus-probe run`.
pub fn run(args: &RunArgs) -> Result<(), Failure> {
    let (p, selection, runtime) = args.probe.parts()?;
    let costs = load_costs(&args.probe)?;
    let opts = RunOptions {
        probe: p,
        events: args.probe.events.clone(),
        selection,
        output: args.probe.output.clone(),
        program: PathBuf::from(&args.command[0]),
        args: args.command[1..].to_vec(),
        runtime,
    };
    let s = probe::run(&opts)?;
    probe::print_summary(s.installed, &s.refused);
    eprintln!("papirus-probe: pid {} {}; report in {}", s.pid, s.exit, s.output.display());
    print_report(&s.output, None, args.sort)?;
    print_prediction(costs, &s.output)
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
/// attach runs to its end (the runtime flushed, every patch restored, the
/// target detached) before the tool exits. Ctrl-C without `--duration` is the
/// normal end of the measurement; any other of these signals is raised again
/// afterwards with its default action, so the exit status says what ended us.
pub fn attach(args: &AttachArgs) -> Result<(), Failure> {
    let (p, selection, runtime) = args.probe.parts()?;
    let costs = load_costs(&args.probe)?;
    let duration = args.duration.map(Duration::from_secs_f64);
    let ending = ending_signals();
    ending.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(sig) = ending.wait() {
            STOPPED_BY.store(sig as i32, Ordering::Relaxed);
            STOP.store(true, Ordering::Relaxed);
        }
    });
    if duration.is_none() {
        eprintln!("papirus-probe: measuring pid {} until Ctrl-C", args.pid);
    }
    let opts = AttachOptions {
        pid: args.pid,
        probe: p,
        events: args.probe.events.clone(),
        selection,
        output: args.probe.output.clone(),
        duration,
        runtime,
    };
    let attached = probe::attach(&opts, &STOP);
    let by = Signal::try_from(STOPPED_BY.load(Ordering::Relaxed)).ok();
    if let Some(sig) = by.filter(|&s| s != Signal::SIGINT || duration.is_some()) {
        eprintln!("papirus-probe: {sig} received: pid {} restored and detached", args.pid);
        if let Err(e) = &attached {
            eprintln!("papirus-probe: error: {e}");
        }
        reraise(sig);
    }
    let (installed, refused) = attached?;
    probe::print_summary(installed, &refused);
    eprintln!("papirus-probe: detached from pid {}; report in {}", args.pid, args.probe.output.display());
    print_report(&args.probe.output, None, args.sort)?;
    print_prediction(costs, &args.probe.output)
}

/// Ends the tool by `sig` with its default action (the exit status a shell reports).
fn reraise(sig: Signal) -> ! {
    use nix::sys::signal::{SigHandler, raise, signal};
    // SAFETY: restoring the default disposition installs no handler of ours.
    let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    let _ = raise(sig);
    let mut only = SigSet::empty();
    only.add(sig);
    let _ = only.thread_unblock();
    // Not reached when the signal's default action ends the process.
    std::process::exit(128 + sig as i32)
}

/// `papirus-probe report`.
pub fn report(args: &ReportArgs) -> Result<(), Failure> {
    print_report(&args.file, args.thread, args.sort)
}
