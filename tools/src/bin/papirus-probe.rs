//! `papirus-probe`: list a program's functions, instrument them in a program
//! it starts or in a running process, and print what they cost.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[path = "papirus-probe/instrument.rs"]
mod instrument;
use papirus_probe::inventory::{Function, Globs, Inventory, Module, Patchability, Plt};
use papirus_probe::session::MAIN_MODULE;
use serde::Serialize;

/// Version of the `--json` output of `list`; bumped on incompatible changes.
const LIST_FORMAT_VERSION: u32 = 1;

/// What `--help` says about exit statuses and output.
const EXIT_HELP: &str = "Output: the profile and every message of papirus-probe go to stderr; \
    `list` and `report` print their results on stdout. A program started by `run` owns its \
    stdout alone.\n\n\
    Exit status:\n  \
    0-255  `run`: the program's own exit code; `list`, `report`, `attach`: 0 on success\n  \
    128+N  `run`: the program was killed by signal N (139: SIGSEGV, 134: SIGABRT)\n  \
    125    papirus-probe itself failed (bad arguments, selection, patching, report, \
    or writing its output); the message says what, and how the program ended\n  \
    126    the program could not be executed (not an ELF executable, exec failed)\n  \
    127    the program was not found\n  \
    141    an output pipe was closed by its reader (`| head`): papirus-probe stops quietly";

#[derive(Parser, Debug)]
#[command(
    name = "papirus-probe",
    version,
    about = "Find and instrument the functions of a program or a running process",
    long_about = "Find and instrument the functions of a program or a running process.\n\n\
        Start with `list` to see which functions a program or process has, in each \
        of its modules (the executable and its shared libraries), at which address, \
        and whether their entry can take a trampoline; then `run` a program or `attach` \
        to a process with chosen functions instrumented.\n\n\
        Examples:\n  papirus-probe list ./app --patchable\n  \
        papirus-probe run --functions 'solve*' -o app.json -- ./app\n  \
        papirus-probe report app.json --top 20\n  \
        papirus-probe attach 4242 --duration 5",
    after_long_help = EXIT_HELP
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
        papirus-probe list ./app --patchable --json", after_long_help = EXIT_HELP)]
    List(ListArgs),
    /// Start a program with chosen functions instrumented; print its profile on stderr at exit.
    #[command(long_about = "Start a program with chosen functions instrumented at entry and exit. \
            The refusals and the count of instrumented functions are printed before the program \
            starts; at its end, a summary of the profile (totals, wall time, top functions) is \
            printed on stderr, the full JSON report written to -o FILE. The program's stdout \
            and exit status are its own.\n\n\
            Modules: --module takes basenames or path parts, repeatable or comma-separated; \
            `main` names the main program, which is instrumented alone when --module is absent.\n\n\
            Examples:\n  papirus-probe run -- ./app arg\n  \
            papirus-probe run --functions 'solve*' -o app.json -- ./app\n  \
            papirus-probe run --module liblzma.so.5 -- xz -c big.tar > big.tar.xz\n  \
            papirus-probe run --module main,libm --exclude 'sin*,cos*' --top 20 -- ./app\n  \
            papirus-probe run --trace app.ptrace --export chrome=app.trace.json -- ./app\n  \
            papirus-probe run --trace --trace-functions 'solve*' --trace-min-duration 2us \
            --export flamechart=app.svg -- ./app\n  \
            papirus-probe run --costs costs.json --subtract-cost --full -- ./app",
            after_long_help = EXIT_HELP)]
    Run(instrument::RunArgs),
    /// Instrument a running process for a while, then detach leaving it uninstrumented.
    #[command(long_about = "Instrument a running process for a while (--duration, or until Ctrl-C), \
            then restore its code and detach, leaving it running uninstrumented. The profile \
            summary is printed on stderr, the JSON report written to -o FILE.\n\n\
            Examples:\n  papirus-probe attach 4242 --duration 10\n  \
            papirus-probe attach 4242 --module libc --functions 'malloc,free' -o heap.json\n  \
            papirus-probe attach 4242 --duration 2.5 --full --wide",
            after_long_help = EXIT_HELP)]
    Attach(instrument::AttachArgs),
    /// Print a report or trace (run/attach -o FILE, --trace FILE) on stdout, or write it
    /// in a format other tools open.
    #[command(long_about = "Print the full text report of a JSON report written by `run` or `attach` \
            (-o FILE) on stdout: every thread, the sum over threads, the caller -> callee pairs; \
            with --tree each thread's call-path tree. Or write another format (--format, to stdout \
            or -o PATH): a Chrome trace (Perfetto, speedscope), folded stacks, a flame graph, a \
            flame chart or time histogram of a trace (SVG), a TAU profile directory (ParaProf, \
            Hatchet) or an OTF2 archive (Vampir). FILE may also be a trace file (--trace FILE), \
            whose calls make the profile, or a region report of papirus' high-level API.\n\n\
            Examples:\n  papirus-probe report app.json\n  \
            papirus-probe report app.json --thread 4243 --sort calls --top 20\n  \
            papirus-probe report app.json --tree --depth 4 --threshold 1\n  \
            papirus-probe report app.json --format flamegraph -o app.svg\n  \
            papirus-probe report app.ptrace --format chrome -o app.trace.json\n  \
            papirus-probe report app.ptrace --format otf2 -o app-otf2\n  \
            papirus-probe report app.json --costs costs.json --subtract-cost --wide",
            after_long_help = EXIT_HELP)]
    Report(instrument::ReportArgs),
    /// Build the bundled example program with gcc and `run` it instrumented.
    #[command(long_about = "Build the bundled example program (nested calls, recursion, several return \
        paths, a tail call, many arguments, threads, a longjmp) with gcc and `run` it with every \
        function instrumented, printing the profile. Takes the options of `run`.\n\n\
        Examples:\n  papirus-probe demo\n  papirus-probe demo --probe counters --events task-clock,page-faults",
        after_long_help = EXIT_HELP)]
    Demo(instrument::Measure),
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
    /// Only modules whose basename equals, or whose path contains, this text
    /// (`main`: the main program).
    #[arg(long, short, value_name = "M")]
    module: Option<String>,
    /// Only functions whose name (stored or demangled) matches this glob
    /// (`*` any run, `?` any one byte, nothing else special).
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
    // A program papirus-probe starts finds its streams as the user left them.
    papirus_substrate::stdio::close_stand_ins_on_exec();
    output::catch_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(output::clap_error(&e)),
    };
    let result = match cli.command {
        Command::Calibrate { args } => {
            // papirus-calibrate prints with print!: a closed pipe ends it by SIGPIPE as before.
            papirus_substrate::sys::default_sigpipe();
            return papirus_tools::calibrate::main_with_args(
                "papirus-probe calibrate",
                args,
                papirus_tools::probe_costs::register,
            );
        }
        Command::List(args) => list(&args).map(|()| 0),
        Command::Run(args) => instrument::run(&args),
        Command::Attach(args) => instrument::attach(&args),
        Command::Report(args) => instrument::report(&args),
        Command::Demo(args) => instrument::demo(&args),
    };
    ExitCode::from(match result {
        Ok(code) => code,
        Err(e) => output::failure(&*e),
    })
}

/// papirus-probe's own output: stdout and stderr writes that fail with a
/// message and an exit status instead of a panic, and the exit statuses.
mod output {
    use std::io::Write;

    use papirus_probe::session::ProbeError;

    pub type Failure = Box<dyn std::error::Error>;

    /// papirus-probe itself failed.
    pub const EXIT_FAILED: u8 = 125;
    /// The program to run could not be executed.
    pub const EXIT_CANNOT_EXECUTE: u8 = 126;
    /// The program to run was not found.
    pub const EXIT_NOT_FOUND: u8 = 127;
    /// An output pipe was closed by its reader: 128 + SIGPIPE, as a shell shows a filter killed by it.
    pub const EXIT_BROKEN_PIPE: u8 = 128 + libc::SIGPIPE as u8;

    /// A failed write of papirus-probe's own output.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot write to {stream}: {source}")]
    pub struct OutputError {
        stream: &'static str,
        source: std::io::Error,
    }

    fn write(stream: &'static str, w: &mut dyn Write, text: &str) -> Result<(), Failure> {
        w.write_all(text.as_bytes())
            .and_then(|()| w.flush())
            .map_err(|source| OutputError { stream, source }.into())
    }

    fn closed(stream: &'static str, fd: i32) -> Result<(), Failure> {
        if papirus_substrate::stdio::closed_at_start(fd) {
            let source = std::io::Error::from_raw_os_error(libc::EBADF);
            return Err(OutputError { stream, source }.into());
        }
        Ok(())
    }

    /// Writes `text` to stdout, flushed.
    pub fn stdout(text: &str) -> Result<(), Failure> {
        closed("stdout", 1)?;
        write("stdout", &mut std::io::stdout().lock(), text)
    }

    /// Writes `text` to stderr.
    pub fn stderr(text: &str) -> Result<(), Failure> {
        closed("stderr", 2)?;
        write("stderr", &mut std::io::stderr().lock(), text)
    }

    /// A message on stderr whose loss changes nothing (a progress note).
    pub fn note(text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }

    /// Turns SIGPIPE into EPIPE write errors for papirus-probe, without
    /// changing what a program it starts inherits (see [`signal::discard`]).
    pub fn catch_sigpipe() {
        let _ = papirus_substrate::signal::discard(libc::SIGPIPE);
    }

    /// The exit status of a failure, after printing it (quietly for a closed pipe).
    pub fn failure(e: &(dyn std::error::Error + 'static)) -> u8 {
        if e.downcast_ref::<OutputError>().is_some_and(|o| o.source.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return EXIT_BROKEN_PIPE;
        }
        note(&format!("papirus-probe: error: {e}"));
        match e.downcast_ref::<ProbeError>() {
            Some(ProbeError::Process(papirus_probe::Error::MissingProgram { .. })) => EXIT_NOT_FOUND,
            Some(ProbeError::Process(
                papirus_probe::Error::NotElf { .. } | papirus_probe::Error::Spawn { .. },
            )) => EXIT_CANNOT_EXECUTE,
            _ => EXIT_FAILED,
        }
    }

    /// Help and version on stdout, argument errors on stderr; a failed write
    /// is an error too.
    pub fn clap_error(e: &clap::Error) -> u8 {
        use clap::error::ErrorKind;
        let text = e.render().to_string();
        match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => match stdout(&text) {
                Ok(()) => 0,
                Err(e) => failure(&*e),
            },
            _ => {
                let _ = stderr(&text);
                EXIT_FAILED
            }
        }
    }
}

use output::Failure;

fn list(args: &ListArgs) -> Result<(), Failure> {
    let inventory = match (args.pid, &args.program) {
        (Some(pid), _) => Inventory::of_process(pid)?,
        (None, Some(program)) if args.libs => Inventory::of_file_with_deps(program)?,
        (None, Some(program)) => Inventory::of_file(program)?,
        (None, None) => return Err("give a PROGRAM or --pid PID".into()),
    };
    let named = |m: &Module, p: &str| if p == MAIN_MODULE { m.is_main } else { m.matches(p) };
    let modules: Vec<&Module> =
        inventory.modules.iter().filter(|m| args.module.as_deref().is_none_or(|p| named(m, p))).collect();
    if modules.is_empty() {
        let names: Vec<String> = inventory.modules.iter().map(Module::basename).collect();
        return Err(format!(
            "no module matches `{}`; modules: {}",
            args.module.as_deref().unwrap_or_default(),
            names.join(", ")
        )
        .into());
    }
    let globs =
        args.functions.as_ref().map(|g| Globs::new(&[g])).transpose().map_err(papirus_probe::Error::from)?;
    let wanted = |name: &str, demangled: Option<&str>| {
        globs.as_ref().is_none_or(|g| g.is_match_either(name, demangled))
    };
    for missing in &inventory.unresolved {
        output::note(&format!(
            "papirus-probe: warning: left out: {}",
            papirus_probe::session::escape(missing)
        ));
    }
    // Built whole, then written once: a write error is reported as such.
    let mut out = Vec::new();
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
        return output::stdout(&String::from_utf8_lossy(&out));
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
    output::stdout(&String::from_utf8_lossy(&out))
}

fn write_module_table(
    out: &mut impl Write,
    m: &Module,
    args: &ListArgs,
    wanted: &impl Fn(&str, Option<&str>) -> bool,
) -> std::io::Result<()> {
    let funcs: Vec<&Function> =
        m.functions.iter().filter(|f| wanted(&f.name, f.demangled.as_deref())).collect();
    write!(out, "{}  ({}", papirus_probe::session::escape(&m.path.display().to_string()), m.kind)?;
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
        writeln!(out, "{}", papirus_probe::session::escape(&f.versioned_name()))?;
    }
    if args.plt {
        let stubs: Vec<&Plt> = m.plt.iter().filter(|p| wanted(&p.name, None)).collect();
        writeln!(out, "  PLT stubs ({}):", stubs.len())?;
        for p in stubs {
            writeln!(
                out,
                "  {:#018x}  {:<8}  {}@plt  (GOT slot {:#x})",
                p.address,
                p.section,
                papirus_probe::session::escape(&p.name),
                p.got
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
