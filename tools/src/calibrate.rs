//! The `papirus-calibrate` command line, callable with extra rows so that
//! other tools (the probe tool) can ship the same binary with theirs.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{CommandFactory, FromArgMatches, Parser};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use papirus_substrate::arch;
use papirus_substrate::clock::clock;
use papirus_substrate::hwinfo::HwInfo;

use papirus_calibrate::costfile::{Check, CostFile, FORMAT_VERSION, Outcome};
use papirus_calibrate::measure::{Cost, Plan, Ticks};
use papirus_calibrate::rows::{Registry, Unavailable};
use papirus_calibrate::validate::{self, Sizes};

const ABOUT: &str = "What each papirus primitive costs on this machine, and proof that counts are right.";

const LONG_ABOUT: &str = "\
What each papirus primitive costs on this machine, in TSC cycles and
nanoseconds, beside the baselines it must be read against.

Every row is timed in samples: a sample runs a batch of calls sized to
about 20 us (8 us with --quick) between two `lfence; rdtsc` reads, so a
cost includes the loop around the call (row baseline.loop) and the two TSC
reads spread over the batch. After a warm-up, 2,000 samples (300 with
--quick) give min / median / p99 / max per call. Compare rows by their
median; p99 and max show interrupts and VM exits. A row that cannot run
here (for example the rdpmc read without a hardware PMU) says why instead.
Rows that read counters say which path each read took: user-space (mmap
page + TSC or rdpmc), resync (one read() to re-base the user-space path
after a context switch) or read().

--validate runs known workloads against expected counts instead and prints
PASS / FAIL / SKIP per check; the exit status is 1 if any check FAILs:
exact breakpoint and uprobe hits of a function called N times; page faults
of K fresh pages; task-clock against CLOCK_THREAD_CPUTIME_ID (2 %); exact
syscalls:sys_enter_write hits for N writes; TSC real time against
CLOCK_MONOTONIC_RAW (100 ppm) and virtual time against
CLOCK_THREAD_CPUTIME_ID (the error distribution, bound 202 us); and, with a
hardware PMU, instructions and branches of known loops (1 %) and FP
operations of inner product, matrix-vector and matrix-matrix kernels
against 2n, 2n^2, 2n^3 (5 %). Checks a machine cannot run SKIP with the
kernel's reason.";

/// `println!` that ends the tool with status 2 and a message when stdout
/// fails (a full disk, a closed descriptor) instead of panicking. A reader
/// that goes away (`| head -1`) ends the tool quietly by SIGPIPE.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, $($arg)*).and_then(|()| out.flush()) {
            stdout_failed(&e);
        }
    }};
}

/// `print!` with the failure handling of `say!`.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = write!(out, $($arg)*).and_then(|()| out.flush()) {
            stdout_failed(&e);
        }
    }};
}

fn stdout_failed(e: &std::io::Error) -> ! {
    let _ = writeln!(std::io::stderr(), "papirus-calibrate: cannot write to standard output: {e}");
    std::process::exit(2)
}

const EXAMPLES: &str = "Examples:
  papirus-calibrate --quick                    every row, fewer samples (under 10 s)
  papirus-calibrate --json costs.json --cpu 1  the machine cost file, measured on CPU 1
  papirus-calibrate --only counter.read -d 20  one family of rows with histograms
  papirus-calibrate --validate                 known workloads against expected counts

A write error on stdout ends the tool with status 2; a closed pipe (| head) ends it quietly.";

/// Command-line options.
#[derive(Debug, Parser)]
#[command(name = "papirus-calibrate", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXAMPLES)]
pub struct Options {
    /// Write the machine cost file (schema calibrate/schema/costfile.schema.json,
    /// read back by papirus_calibrate::CostFile::load) to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print a histogram of each row's per-call cost over BINS bins
    /// (papi_cost -d), and store it in the cost file.
    #[arg(short = 'd', long = "histogram", value_name = "BINS",
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub histogram: Option<u16>,
    /// Pin the measuring thread to CPU N (sched_setaffinity) before anything runs.
    #[arg(long, value_name = "N")]
    pub cpu: Option<usize>,
    /// Fewer samples and smaller workloads: under 10 s instead of under 60 s.
    #[arg(long)]
    pub quick: bool,
    /// Check counts of known workloads (PASS / FAIL / SKIP with the reason)
    /// instead of measuring costs; exit status 1 on any FAIL.
    #[arg(long)]
    pub validate: bool,
    /// With --validate, measure the costs too.
    #[arg(long, requires = "validate")]
    pub costs: bool,
    /// Only the rows whose name contains PATTERN (e.g. `counter.read`).
    #[arg(long, value_name = "PATTERN")]
    pub only: Option<String>,
    /// List the rows with what each measures, and exit.
    #[arg(long)]
    pub list: bool,
}

fn rows_help(reg: &Registry) -> String {
    let mut s = String::from("Rows:\n");
    for (name, desc) in reg.rows() {
        s.push_str(&format!("  {name}\n      {desc}\n"));
    }
    s
}

fn tsc_ordered() -> u64 {
    arch::rdtsc_ordered()
}

fn monotonic() -> u64 {
    clock().raw_ordered()
}

/// The tick source: the TSC when papirus' real time is TSC based, else
/// CLOCK_MONOTONIC nanoseconds (and then "cycles" are nanoseconds).
pub fn ticks() -> Ticks {
    let c = clock();
    match c.tsc_hz() {
        Some(hz) if c.is_tsc() => Ticks { read: tsc_ordered, per_ns: hz / 1e9 },
        _ => Ticks { read: monotonic, per_ns: 1.0 },
    }
}

fn print_cost(c: &Cost) {
    say!(
        "{:<40} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>9.1}  {}",
        c.name,
        c.ns.min,
        c.ns.median,
        c.ns.p99,
        c.ns.max,
        c.cycles.median,
        c.path.as_deref().unwrap_or("-")
    );
}

fn print_unavailable(u: &Unavailable) {
    say!("{:<40} {:>9} {:>9} {:>9} {:>10} {:>9}  unavailable: {}", u.name, "-", "-", "-", "-", "-", u.reason);
}

fn print_histogram(c: &Cost) {
    let Some(h) = &c.histogram else { return };
    let most = h.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    say!("{} (cycles per call; * = {:.1} samples)", c.name, most as f64 / 50.0);
    for b in h {
        let bar = "*".repeat(((b.count * 50).div_ceil(most)) as usize);
        say!("  {:>10.1} .. {:>10.1} {:>7} {bar}", b.from_cycles, b.to_cycles, b.count);
    }
}

fn print_check(c: &Check) {
    let tag = match c.outcome {
        Outcome::Pass => "PASS",
        Outcome::Fail => "FAIL",
        Outcome::Skip => "SKIP",
    };
    say!("{tag}  {}: {}", c.name, c.detail);
}

fn pin(cpu: usize) -> Result<(), String> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .map_err(|e| format!("--cpu {cpu}: {e} (this build handles CPUs below {})", CpuSet::count()))?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| {
        format!("--cpu {cpu}: sched_setaffinity failed: {e}; list the allowed CPUs with `taskset -p $$`")
    })
}

/// Runs `papirus-calibrate` with the built-in rows plus those `extra` adds.
pub fn main_with(extra: impl FnOnce(&mut Registry)) -> ExitCode {
    main_with_args("papirus-calibrate", std::env::args_os().skip(1), extra)
}

/// Runs `papirus-calibrate` as the command `name` (e.g. a subcommand,
/// `papirus-probe calibrate`) on `args` (without the program name), with the
/// built-in rows plus those `extra` adds.
pub fn main_with_args(
    name: &'static str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
    extra: impl FnOnce(&mut Registry),
) -> ExitCode {
    // Rust's runtime reopens a closed stdout on /dev/null: refuse it.
    if !crate::cli::stdout_is_open() {
        let _ =
            writeln!(std::io::stderr(), "{name}: standard output is closed; redirect it (e.g. >/dev/null)");
        return ExitCode::from(2);
    }
    let mut reg = Registry::builtin();
    extra(&mut reg);
    let cmd = Options::command()
        .name(name)
        .bin_name(name)
        .after_long_help(format!("{EXAMPLES}\n\n{}", rows_help(&reg)));
    let argv = std::iter::once(std::ffi::OsString::from(name)).chain(args);
    let opts = match cmd.try_get_matches_from(argv).and_then(|m| Options::from_arg_matches(&m)) {
        Ok(o) => o,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    if opts.list {
        say_raw!("{}", rows_help(&reg));
        return ExitCode::SUCCESS;
    }
    match run(&opts, &mut reg) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "papirus-calibrate: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(opts: &Options, reg: &mut Registry) -> Result<ExitCode, String> {
    let started = Instant::now();
    if let Some(cpu) = opts.cpu {
        pin(cpu)?;
    }
    // The tracepoint check needs tracefs: mounted when absent, as perf does;
    // otherwise that check says SKIP with the parser's reason.
    if opts.validate
        && let Err(why) = papirus_substrate::names::ensure_tracefs()
    {
        let _ = writeln!(std::io::stderr(), "papirus-calibrate: {why}");
    }
    let hw = HwInfo::collect();
    say!("{hw}");
    if let Some(cpu) = opts.cpu {
        say!("pinned to CPU {cpu}");
    }
    let ticks = ticks();
    let mut plan = if opts.quick { Plan::QUICK } else { Plan::DEFAULT };
    plan.bins = opts.histogram.map_or(0, usize::from);

    let mut costs = Vec::new();
    let mut unavailable = Vec::new();
    if !opts.validate || opts.costs {
        say!("");
        say!(
            "{:<40} {:>9} {:>9} {:>9} {:>10} {:>9}  path",
            "row",
            "ns min",
            "ns median",
            "ns p99",
            "ns max",
            "cyc med"
        );
        let report = reg.run(ticks, plan, opts.only.as_deref(), |cs, u| {
            cs.iter().for_each(print_cost);
            if let Some(u) = u {
                print_unavailable(u);
            }
        });
        if plan.bins > 0 {
            say!("");
            report.costs.iter().for_each(print_histogram);
        }
        costs = report.costs;
        unavailable = report.unavailable;
    }
    let mut validation = Vec::new();
    if opts.validate {
        say!("");
        let sizes = if opts.quick { Sizes::QUICK } else { Sizes::DEFAULT };
        validation = validate::run(sizes, print_check);
    }
    if let Some(path) = &opts.json {
        let file = CostFile {
            format_version: FORMAT_VERSION,
            generator: format!("papirus-calibrate {}", env!("CARGO_PKG_VERSION")),
            machine: serde_json::to_value(&hw).map_err(|e| format!("hardware info: {e}"))?,
            tsc_hz: ticks.per_ns * 1e9,
            pinned_cpu: opts.cpu,
            costs,
            unavailable,
            validation: validation.clone(),
        };
        file.save(path).map_err(|e| format!("{}: {e}", path.display()))?;
        say!("\ncost file written to {}", path.display());
    }
    let fails = validation.iter().filter(|c| c.outcome == Outcome::Fail).count();
    if opts.validate {
        let skips = validation.iter().filter(|c| c.outcome == Outcome::Skip).count();
        say!(
            "\n{} checks: {} PASS, {fails} FAIL, {skips} SKIP",
            validation.len(),
            validation.len() - fails - skips
        );
    }
    say!("done in {:.2} s", started.elapsed().as_secs_f64());
    Ok(if fails > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
