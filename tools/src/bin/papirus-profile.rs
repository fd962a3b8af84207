//! papirus-profile: a sampling profiler with perf record's and perf
//! report's command lines, on papirus' substrate.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use papirus_profile::record::DEFAULT_STACK_BYTES;
use papirus_profile::recording::{CallGraph, TriggerInfo};
use papirus_profile::report::{self, ReportOptions, SortKey};
use papirus_profile::{Options, Recording, Target, record};
use papirus_tools::cli::{Failure, parse_seconds, run_tool};

const RECORD_HELP: &str = "Examples:
  papirus-profile -g -- ./prog arg              task-clock at 4000 Hz with call chains
  papirus-profile -e task-clock -F 1000 -g -o prog.json -- ./prog
  papirus-profile -e page-faults -c 1 -- ./prog  every page fault
  papirus-profile -e mem:solve:x -- ./prog       every call of solve (a breakpoint)
  papirus-profile -e syscalls:sys_enter_write -g -- ./prog
  papirus-profile -p 4242 -d 5 -g               a running process for 5 s (or until ^C)
  papirus-profile report papirus-profile.json
  papirus-profile report prog.json --format flamegraph -o prog.svg

Events: task-clock (default), cpu-clock, page-faults, a breakpoint
(mem:SYMBOL:x, mem:ADDR:rw), a tracepoint (subsystem:name), or a hardware
event (cycles, instructions, …) where the machine exposes a PMU; without
one they fail with the kernel's reason. EVENT/PERIOD samples every PERIOD
events. Breakpoints and tracepoints sample every event unless -c or -F say
otherwise. As perf record, an event without a modifier samples user and
kernel mode where this user may (root, CAP_PERFMON, perf_event_paranoid
≤ 1), else user mode only, saying so; `:u` or `:k` choose (task-clock:u).

Call chains: -g takes the kernel's frame-pointer walk, which needs frame
pointers (gcc/clang -fno-omit-frame-pointer, Rust -C force-frame-pointers=yes):
code without them (most distribution libraries) shows its own function and
loses the rest of the chain. --call-graph dwarf copies the top of the user
stack (8 KiB, or dwarf,SIZE) with each sample and unwinds it with the
modules' .eh_frame (framehop), which needs no frame pointers: larger samples,
so give rings more pages (-m) at high rates.

The recording (-o, default papirus-profile.json) is symbolized when
written: `papirus-profile report FILE` needs neither the process nor its
binaries. Lost samples (rings that filled faster than papirus-profile read
them) are counted and reported; give more pages with -m.

Exit status: the command's own, 128+N when signal N ended it; 2 when
papirus-profile itself fails.";

const REPORT_HELP: &str = "Formats and the viewers that open them:
  text        flat profile (Children/Self, per --sort) and call graph, like perf report
  pprof       gzip'd profile.proto: go tool pprof, speedscope, Perfetto UI
  folded      folded stacks (comm;main;f;g COUNT): inferno-flamegraph, flamegraph.pl, speedscope
  flamegraph  flame graph SVG (inferno): any web browser

text, folded and pprof go to standard output unless -o names a file;
flamegraph needs -o. Files are written atomically.";

/// Record a sampling profile of a command or a running process (perf record).
#[derive(Parser, Debug)]
#[command(
    name = "papirus-profile",
    version,
    trailing_var_arg = true,
    after_help = RECORD_HELP,
    override_usage = "papirus-profile [record] [OPTIONS] (-- COMMAND [ARGS]... | -p PID [-d SECONDS])\n       \
                      papirus-profile report FILE [--format text|pprof|folded|flamegraph] [-o PATH] (see report --help)"
)]
struct RecordArgs {
    /// The event, in perf's syntax, optionally EVENT/PERIOD.
    #[arg(short, long, default_value = "task-clock")]
    event: String,
    /// Sample about HZ times a second (perf record -F; default 4000).
    #[arg(short = 'F', long = "freq", value_name = "HZ", conflicts_with = "count")]
    freq: Option<u64>,
    /// Sample every PERIOD events (perf record -c).
    #[arg(short = 'c', long = "count", value_name = "PERIOD")]
    count: Option<u64>,
    /// Record call chains by frame pointers (--call-graph fp).
    #[arg(short = 'g')]
    callchain: bool,
    /// How to record call chains: fp (frame pointers), or dwarf[,SIZE]:
    /// copy SIZE bytes of user stack (default 8192) and unwind them with
    /// each module's .eh_frame, for code built without frame pointers.
    #[arg(long = "call-graph", value_name = "MODE", value_parser = parse_call_graph)]
    call_graph: Option<(CallGraph, u32)>,
    /// Data pages of each per-CPU ring buffer, a power of two.
    #[arg(short = 'm', long = "mmap-pages", value_name = "PAGES", default_value_t = 128)]
    pages: usize,
    /// Where to write the recording.
    #[arg(short, long, value_name = "FILE", default_value = "papirus-profile.json")]
    output: PathBuf,
    /// Profile this running process (all its threads) instead of a command.
    #[arg(short, long, conflicts_with = "command")]
    pid: Option<i32>,
    /// With -p: seconds to record (default: until it ends or ^C).
    #[arg(short, long, value_parser = parse_seconds, requires = "pid")]
    duration: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Pprof,
    Folded,
    Flamegraph,
}

/// Show a recording as text, or convert it for other viewers (perf report).
#[derive(Parser, Debug)]
#[command(name = "papirus-profile report", bin_name = "papirus-profile report", version, after_help = REPORT_HELP)]
struct ReportArgs {
    /// The recording.
    file: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Write to this file (atomically) instead of standard output.
    #[arg(short, long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// Columns of the flat profile: pid, tid, comm, dso, sym.
    #[arg(long, value_name = "KEYS", default_value = "comm,dso,sym", value_delimiter = ',', value_parser = SortKey::parse)]
    sort: Vec<SortKey>,
    /// Leave out rows and call-graph branches under this share (%).
    #[arg(long, value_name = "PCT", default_value_t = 0.5)]
    percent_limit: f64,
    /// Folded stacks and flame graphs: one root frame per thread (comm-pid/tid).
    #[arg(long)]
    per_thread: bool,
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1).and_then(|a| a.to_str()) {
        Some("report") => {
            args.remove(1);
            run_tool("papirus-profile", || report_cmd(&ReportArgs::parse_from(args)))
        }
        Some("record") => {
            args.remove(1);
            run_tool("papirus-profile", || record_cmd(RecordArgs::parse_from(args)))
        }
        _ => run_tool("papirus-profile", || record_cmd(RecordArgs::parse_from(args))),
    }
}

/// `fp`, `dwarf` or `dwarf,SIZE` (perf record's --call-graph).
fn parse_call_graph(s: &str) -> Result<(CallGraph, u32), String> {
    match s.split_once(',') {
        None if s == "fp" => Ok((CallGraph::Fp, DEFAULT_STACK_BYTES)),
        None if s == "dwarf" => Ok((CallGraph::Dwarf, DEFAULT_STACK_BYTES)),
        Some(("dwarf", size)) => match size.parse::<u32>() {
            Ok(n) if (8..65536).contains(&n) && n.is_multiple_of(8) => Ok((CallGraph::Dwarf, n)),
            _ => Err(format!("dwarf,{size}: give a stack size in bytes, a multiple of 8 below 65536")),
        },
        _ => Err(format!("`{s}`: use fp, dwarf or dwarf,SIZE")),
    }
}

fn record_cmd(args: RecordArgs) -> Result<ExitCode, Failure> {
    let target = match (args.pid, args.command.is_empty()) {
        (Some(pid), _) => Target::Pid(pid),
        (None, false) => Target::Command(args.command.clone()),
        (None, true) => {
            return Err(Failure("give a command after `--`, or a running process with -p PID".into()));
        }
    };
    if args.pages == 0 || !args.pages.is_power_of_two() {
        return Err(Failure(format!("-m {}: give a power of two ≥ 1 (1, 2, 4, … pages)", args.pages)));
    }
    papirus_formats::output::check_writable(&args.output).map_err(|e| Failure(e.to_string()))?;
    let trigger = match (args.freq, args.count) {
        (Some(0), _) | (_, Some(0)) => return Err(Failure("-F and -c need a number ≥ 1".into())),
        (Some(hz), _) => Some(TriggerInfo::Frequency(hz)),
        (None, Some(p)) => Some(TriggerInfo::Period(p)),
        (None, None) => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    // ^C or a termination request ends the recording of a process; a
    // command gets them itself (its process group), and is recorded to its end.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Failure(format!("cannot handle signal {sig}: {e}")))?;
    }
    let (call_graph, stack_bytes) = match (args.call_graph, args.callchain) {
        (Some(cg), _) => cg,
        (None, true) => (CallGraph::Fp, DEFAULT_STACK_BYTES),
        (None, false) => (CallGraph::None, DEFAULT_STACK_BYTES),
    };
    let opts = Options {
        event: args.event.clone(),
        trigger,
        call_graph,
        stack_bytes,
        data_pages: args.pages,
        duration: args.duration,
        stop,
    };
    let rec = record(&target, &opts).map_err(|e| Failure(e.to_string()))?;
    rec.save(&args.output).map_err(|e| Failure(e.to_string()))?;
    let note = report::record_summary(&rec, &args.output);
    let _ = writeln!(std::io::stderr(), "{note}");
    Ok(ExitCode::from(rec.exit.map_or(0, |e| e.code)))
}

fn report_cmd(args: &ReportArgs) -> Result<ExitCode, Failure> {
    let rec = Recording::load(&args.file).map_err(|e| Failure(e.to_string()))?;
    let opts = ReportOptions {
        sort: args.sort.clone(),
        percent_limit: args.percent_limit,
        per_thread: args.per_thread,
    };
    if let Some(path) = &args.output {
        papirus_formats::output::check_writable(path).map_err(|e| Failure(e.to_string()))?;
    }
    let mut bytes = Vec::new();
    let written = match args.format {
        Format::Text => {
            bytes = report::text(&rec, &opts).into_bytes();
            Ok(())
        }
        Format::Pprof => report::write_pprof(&rec, &mut bytes),
        Format::Folded => report::write_folded(&rec, &opts, &mut bytes),
        Format::Flamegraph => {
            if args.output.is_none() {
                return Err(Failure("--format flamegraph writes an SVG file: name it with -o".into()));
            }
            report::write_flamegraph(&rec, &opts, &mut bytes)
        }
    };
    written.map_err(|e| Failure(format!("{}: {e}", args.file.display())))?;
    match &args.output {
        Some(path) => write_file(path, &bytes)?,
        None => raw_stdout(&bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    papirus_formats::output::write_atomic(path, bytes).map_err(|e| Failure(e.to_string()))
}

/// Writes bytes (pprof is binary) to stdout, as `cli::print` writes text.
fn raw_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Failure(format!("cannot write to standard output: {e}")))
}
