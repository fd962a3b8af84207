//! `papirus-probe`: list a program's functions, and (later) instrument them.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[path = "papirus-probe/instrument.rs"]
mod instrument;
use papirus_dyninst::inventory::{Function, Inventory, Module, Patchability, Plt, glob_match};
use serde::Serialize;

/// Version of the `--json` output of `list`; bumped on incompatible changes.
const LIST_FORMAT_VERSION: u32 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "papirus-probe",
    version,
    about = "Find and instrument the functions of a program or a running process",
    long_about = "Find and instrument the functions of a program or a running process.\n\n\
        Start with `list` to see which functions a program or process has, in each \
        of its modules (the executable and its shared libraries), at which address, \
        and whether their entry can take a trampoline."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the functions of a program file or of a running process.
    #[command(long_about = "List the functions of a program file or of a running process.\n\n\
        For a file, addresses are link-time addresses (what `nm` prints). For a process \
        (--pid), every mapped executable and shared object is listed with its load bias \
        and run-time addresses. A stripped module still lists its dynamic (exported) \
        functions and is marked stripped.\n\n\
        Examples:\n  papirus-probe list ./app\n  papirus-probe list --pid 4242 --module libc --functions 'mem*'\n  \
        papirus-probe list ./app --patchable --json")]
    List(ListArgs),
    /// Start a program with chosen functions instrumented; print its profile at exit.
    #[command(long_about = "Start a program with chosen functions instrumented at entry and exit; \
            write the JSON report at exit and print the profile.\n\n\
            Examples:\n  papirus-probe run -- ./app arg\n  papirus-probe run --functions 'solve*' -o app.json -- ./app")]
    Run(instrument::RunArgs),
    /// Instrument a running process for a while, then detach leaving it uninstrumented.
    Attach(instrument::AttachArgs),
    /// Print a report written by `run` or `attach`.
    Report(instrument::ReportArgs),
    /// Build the bundled example program with gcc and `run` it instrumented.
    #[command(long_about = "Build the bundled example program (nested calls, recursion, several return \
        paths, a tail call, many arguments, threads, a longjmp) with gcc and `run` it with every \
        function instrumented, printing the profile. Takes the options of `run`.\n\n\
        Example:\n  papirus-probe demo --probe counters --events task-clock,page-faults")]
    Demo(instrument::DemoArgs),
    /// papirus-calibrate with the probe rows: what an instrumented call costs
    /// here (trampoline with each probe, uprobe+uretprobe, the uninstrumented
    /// call) beside every papirus primitive; `calibrate --help` for its options.
    #[command(disable_help_flag = true)]
    Calibrate {
        /// papirus-calibrate's options (e.g. `--quick --only probe --json FILE`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "OPTIONS")]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Program or shared object to read (a path, or a name searched on PATH).
    #[arg(required_unless_present = "pid", conflicts_with = "pid")]
    program: Option<std::path::PathBuf>,
    /// List the modules of this running process instead.
    #[arg(long, short)]
    pid: Option<i32>,
    /// Only modules whose basename equals, or whose path contains, this text.
    #[arg(long, short, value_name = "M")]
    module: Option<String>,
    /// Only functions whose name (stored or demangled) matches this glob (`*`, `?`).
    #[arg(long, short, value_name = "GLOB")]
    functions: Option<String>,
    /// Add a column saying whether each entry can take a 5-byte jump, or why not.
    #[arg(long)]
    patchable: bool,
    /// With PROGRAM: also list the shared objects it needs, found as the
    /// dynamic loader would (DT_NEEDED, RPATH/RUNPATH, LD_LIBRARY_PATH,
    /// /etc/ld.so.conf, default directories), at link-time addresses.
    #[arg(long, conflicts_with = "pid")]
    libs: bool,
    /// Also list PLT stubs (calls to imported functions).
    #[arg(long)]
    plt: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    papirus_substrate::sys::default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Calibrate { args } => {
            return papirus_calibrate::cli::main_with_args(
                "papirus-probe calibrate",
                args,
                papirus_dyninst::probe::calibrate::register,
            );
        }
        Command::List(args) => list(&args),
        Command::Run(args) => instrument::run(&args),
        Command::Attach(args) => instrument::attach(&args),
        Command::Report(args) => instrument::report(&args),
        Command::Demo(args) => instrument::demo(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("papirus-probe: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Failure = Box<dyn std::error::Error>;

fn list(args: &ListArgs) -> Result<(), Failure> {
    let inventory = match (args.pid, &args.program) {
        (Some(pid), _) => Inventory::of_process(pid)?,
        (None, Some(program)) if args.libs => Inventory::of_file_with_deps(program)?,
        (None, Some(program)) => Inventory::of_file(program)?,
        (None, None) => return Err("give a PROGRAM or --pid PID".into()),
    };
    let modules: Vec<&Module> =
        inventory.modules.iter().filter(|m| args.module.as_deref().is_none_or(|p| m.matches(p))).collect();
    if modules.is_empty() {
        let names: Vec<String> = inventory.modules.iter().map(Module::basename).collect();
        return Err(format!(
            "no module matches `{}`; modules: {}",
            args.module.as_deref().unwrap_or_default(),
            names.join(", ")
        )
        .into());
    }
    let wanted = |name: &str, demangled: Option<&str>| {
        args.functions
            .as_deref()
            .is_none_or(|g| glob_match(g, name) || demangled.is_some_and(|d| glob_match(g, d)))
    };
    for missing in &inventory.unresolved {
        eprintln!("papirus-probe: warning: left out: {missing}");
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = ListReport {
            format_version: LIST_FORMAT_VERSION,
            pid: inventory.pid,
            unresolved: &inventory.unresolved,
            modules: modules
                .iter()
                .map(|m| ModuleReport {
                    path: m.path.display().to_string(),
                    is_main: m.is_main,
                    kind: m.kind,
                    load_bias: m.load_bias,
                    base: m.base,
                    text: m.text.as_ref().map(|r| [r.start, r.end]),
                    stripped: m.stripped,
                    build_id: m.build_id.as_deref(),
                    functions: m
                        .functions
                        .iter()
                        .filter(|f| wanted(&f.name, f.demangled.as_deref()))
                        .map(|f| FunctionReport {
                            function: f,
                            patchability: args.patchable.then(|| m.patchability(f)),
                        })
                        .collect(),
                    plt: m.plt.iter().filter(|p| wanted(&p.name, None)).collect(),
                })
                .collect(),
        };
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    // With a function filter, modules without a match are noise.
    let shown = modules.iter().filter(|m| {
        args.functions.is_none()
            || m.functions.iter().any(|f| wanted(&f.name, f.demangled.as_deref()))
            || (args.plt && m.plt.iter().any(|p| wanted(&p.name, None)))
    });
    for (i, m) in shown.enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        write_module_table(&mut out, m, args, &wanted)?;
    }
    Ok(())
}

fn write_module_table(
    out: &mut impl Write,
    m: &Module,
    args: &ListArgs,
    wanted: &impl Fn(&str, Option<&str>) -> bool,
) -> std::io::Result<()> {
    let funcs: Vec<&Function> =
        m.functions.iter().filter(|f| wanted(&f.name, f.demangled.as_deref())).collect();
    write!(out, "{}  ({}", m.path.display(), m.kind)?;
    if m.base.is_some() {
        write!(out, ", load bias {:#x}", m.load_bias)?;
    }
    if let Some(t) = &m.text {
        write!(out, ", text {:#x}-{:#x}", t.start, t.end)?;
    }
    writeln!(
        out,
        ", {} of {} functions{})",
        funcs.len(),
        m.functions.len(),
        match (m.stripped, m.functions.is_empty()) {
            (true, true) => ", stripped: no symbols at all",
            (true, false) => ", stripped: dynamic symbols only",
            _ => "",
        }
    )?;
    write!(out, "  {:<18} {:>8}  {:<6}  ", "ADDRESS", "SIZE", "BIND")?;
    if args.patchable {
        write!(out, "{:<40}  ", "PATCHABLE")?;
    }
    writeln!(out, "NAME")?;
    for f in funcs {
        let bind = format!("{:?}", f.binding).to_lowercase();
        write!(out, "  {:#018x} {:>8}  {bind:<6}  ", f.address, f.size)?;
        if args.patchable {
            let p: &Patchability = m.patchability(f);
            write!(out, "{:<40}  ", p.to_string())?;
        }
        writeln!(out, "{}", f.versioned_name())?;
    }
    if args.plt {
        let stubs: Vec<&Plt> = m.plt.iter().filter(|p| wanted(&p.name, None)).collect();
        writeln!(out, "  PLT stubs ({}):", stubs.len())?;
        for p in stubs {
            writeln!(
                out,
                "  {:#018x}  {:<8}  {}@plt  (GOT slot {:#x})",
                p.address, p.section, p.name, p.got
            )?;
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct ListReport<'a> {
    format_version: u32,
    pid: Option<i32>,
    unresolved: &'a [String],
    modules: Vec<ModuleReport<'a>>,
}

#[derive(Serialize)]
struct ModuleReport<'a> {
    path: String,
    is_main: bool,
    kind: papirus_substrate::elf::ElfKind,
    load_bias: u64,
    base: Option<u64>,
    text: Option<[u64; 2]>,
    stripped: bool,
    build_id: Option<&'a str>,
    functions: Vec<FunctionReport<'a>>,
    plt: Vec<&'a Plt>,
}

#[derive(Serialize)]
struct FunctionReport<'a> {
    #[serde(flatten)]
    function: &'a Function,
    #[serde(skip_serializing_if = "Option::is_none")]
    patchability: Option<&'a Patchability>,
}
