//! papirus-stat: count events of a command, a running process or the whole
//! machine, with `perf stat`'s options and output formats.
//!
//! A command is counted the way perf counts it: the tool forks, the child
//! stops at its `exec` (ptrace), and the events are opened on the child with
//! inheritance once the command's own image is mapped, so uprobes and
//! `mem:SYMBOL:x` breakpoints resolve in the command's binary; the child then
//! runs to its end. A process given with `-p` is counted on each of its
//! threads that exist at start (and what they create afterwards), `-a` and
//! `-C` count CPUs.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use papirus_lowlevel::avail::FORMAT_VERSION;
use papirus_lowlevel::{EventSet, Granularity, Library, Value, init, real_nsec};
use papirus_substrate::command::StoppedCommand;
use papirus_substrate::names::{self, split_event_list};
use papirus_tools::cli::{Failure, parse_millis, parse_seconds};
use serde::Serialize;
use serde_json::json;

const EXAMPLES: &str = "Examples:
  papirus-stat -- ./prog arg             count perf's default software events
  papirus-stat -e task-clock,page-faults -r 5 -- ./prog
  papirus-stat -e 'uprobe:./prog:solve,mem:solve:x,syscalls:sys_enter_write' -- ./prog
  papirus-stat -e '{task-clock,page-faults}' -x, -o counts.csv -- ./prog
  papirus-stat -e perf::TASK-CLOCK,PAPI_TOT_CYC -I 100 -- ./prog
  papirus-stat -e task-clock -p 1234 -d 2 --per-thread
  papirus-stat -a -e sched:sched_switch -d 1

Counts go to stderr (or -o FILE), never to the command's stdout. As in perf stat, an event the kernel
cannot count here is shown as <not supported> (the rest of its {group} as <not counted>, its reason on
stderr) and the others are counted; when none can be, papirus-stat fails before the command runs.
Exit status: the command's own, 128+N when a signal N ended it, 2 when papirus-stat itself fails.";

/// Count events of a command, a running process or CPUs, like `perf stat`.
#[derive(Parser, Debug)]
#[command(name = "papirus-stat", version, trailing_var_arg = true, after_help = EXAMPLES)]
struct Args {
    /// Events: presets, perf syntax, PAPI's `perf::NAME`, `{a,b}` groups read
    /// atomically, and the tool events duration_time, user_time, system_time.
    #[arg(short, long = "event", visible_alias = "events", value_name = "LIST")]
    events: Vec<String>,
    /// Count this running process (all its threads) instead of a command.
    #[arg(short, long, conflicts_with = "command")]
    pid: Option<i32>,
    /// Count every CPU (system-wide), while the command runs or for --duration.
    #[arg(short = 'a', long)]
    all_cpus: bool,
    /// Count these CPUs (system-wide): `0`, `0-3,6`.
    #[arg(short = 'C', long = "cpu", value_name = "LIST", conflicts_with = "pid")]
    cpu: Option<String>,
    /// Seconds to count for with -p, -a or -C and no command.
    #[arg(short, long, value_parser = parse_seconds, default_value = "1", allow_hyphen_values = true)]
    duration: Duration,
    /// Run the command N times; print means with their spread (± stddev of the mean, %).
    #[arg(short, long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    repeat: u32,
    /// Print the counts of every interval of MS milliseconds.
    #[arg(short = 'I', long = "interval-print", value_name = "MS", value_parser = parse_millis, allow_hyphen_values = true)]
    interval: Option<Duration>,
    /// CSV with this separator, in perf's column order.
    #[arg(short = 'x', long = "field-separator", value_name = "SEP")]
    separator: Option<String>,
    /// Write the counts to FILE instead of stderr.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// JSON (with a format_version) instead of the table, to -o FILE or stderr.
    #[arg(short = 'j', long, conflicts_with = "separator")]
    json: bool,
    /// With -p: one line per thread instead of the process's sums.
    #[arg(long)]
    per_thread: bool,
    /// Let the kernel multiplex events that do not fit the counters together.
    #[arg(short, long)]
    multiplex: bool,
    /// The command and its arguments (after `--`).
    command: Vec<String>,
}

/// perf's default list where no hardware PMU is assumed.
const DEFAULT_EVENTS: &str = "task-clock,context-switches,cpu-migrations,page-faults";

/// Lone events per event set.
const CHUNK: usize = 16;

/// Events the tool measures itself, as perf's tool PMU does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ToolEvent {
    Duration,
    User,
    System,
}

impl ToolEvent {
    fn by_name(name: &str) -> Option<Self> {
        match name {
            "duration_time" => Some(Self::Duration),
            "user_time" => Some(Self::User),
            "system_time" => Some(Self::System),
            _ => None,
        }
    }
}

/// The events of the run, in the order given.
struct Plan {
    /// Display name of every event, tool events included.
    names: Vec<String>,
    /// Per event: the tool event it is, or `None` when the kernel counts it.
    tool: Vec<Option<ToolEvent>>,
    /// Kernel events by set: the lone events first, then one set per `{…}` group.
    parts: Vec<Vec<usize>>,
    /// How many of `parts` hold lone events (the rest are groups).
    lone_parts: usize,
    /// Per event: why it is not counted at all (decided at the first open).
    missing: Vec<Option<Missing>>,
    /// Whether the first open has left out what the kernel refuses.
    settled: bool,
}

/// Why an event has no value, spelled as perf stat prints it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
enum Missing {
    /// The kernel cannot count it here.
    #[serde(rename = "<not supported>")]
    NotSupported,
    /// It never ran: a member of a group that cannot be opened, or not
    /// counted in one of the runs.
    #[serde(rename = "<not counted>")]
    NotCounted,
}

/// Whether perf stat would show the event as `<not supported>` and count the
/// others: the kernel has no such event or PMU, or refuses its attributes.
fn not_supported(e: &papirus_lowlevel::Error) -> bool {
    use papirus_substrate::Error as Sub;
    match e {
        papirus_lowlevel::Error::PresetUnavailable { .. } => true,
        papirus_lowlevel::Error::Substrate(Sub::Unsupported { .. }) => true,
        papirus_lowlevel::Error::Substrate(Sub::Kernel {
            op: papirus_substrate::Op::Open, errno, ..
        }) => {
            matches!(errno.0, libc::EINVAL | libc::ENOSYS | libc::ENXIO)
        }
        _ => false,
    }
}

fn plan(args: &Args) -> Result<Plan, Failure> {
    let lists: Vec<&str> = if args.events.is_empty() {
        vec![DEFAULT_EVENTS]
    } else {
        args.events.iter().map(String::as_str).collect()
    };
    let (mut names, mut tool, mut lone, mut groups) = (vec![], vec![], vec![], vec![]);
    for list in lists {
        for item in split_event_list(list).map_err(|e| Failure(e.to_string()))? {
            let mut members = vec![];
            for name in item.events {
                let t = ToolEvent::by_name(&name);
                if t.is_some() && item.group {
                    return Err(Failure(format!(
                        "`{name}` is measured by the tool; it cannot be in a group"
                    )));
                }
                if names.contains(&name) {
                    return Err(Failure(format!("`{name}` is given twice")));
                }
                if t.is_none() {
                    members.push(names.len());
                }
                names.push(name);
                tool.push(t);
            }
            if item.group { groups.push(members) } else { lone.extend(members) }
        }
    }
    // Lone events in sets of CHUNK: perf counts each in a group of its own;
    // small sets keep each kernel group (and its one read) small.
    let mut parts: Vec<Vec<usize>> = lone.chunks(CHUNK).map(<[usize]>::to_vec).collect();
    let lone_parts = parts.len();
    // Groups are never empty: the splitter refuses `{}` and tool events in groups.
    parts.extend(groups);
    let missing = vec![None; names.len()];
    Ok(Plan { names, tool, parts, lone_parts, missing, settled: false })
}

/// Where the events of one counting unit are opened.
#[derive(Clone, Copy, Debug)]
enum Where {
    Task(i32),
    Cpu(u32),
}

/// The sets of one task or CPU, one per part of the plan.
struct Unit {
    label: String,
    sets: Vec<EventSet>,
}

/// `mem:SYMBOL…` rewritten to the address SYMBOL has in process `pid`.
fn resolve_symbol(name: &str, pid: i32) -> Result<String, Failure> {
    let Some(rest) = name.get(..4).filter(|h| h.eq_ignore_ascii_case("mem:")).map(|_| &name[4..]) else {
        return Ok(name.to_string());
    };
    let target = rest.split([':', '/']).next().unwrap_or_default();
    if target.is_empty() || target.starts_with(|c: char| c.is_ascii_digit()) {
        return Ok(name.to_string());
    }
    let mut parser = names::default_parser().map_err(|e| Failure(e.to_string()))?.clone();
    parser.symbols_in(Some(pid));
    let addr = parser.parse(name).map_err(|e| Failure(e.to_string()))?.config1_value();
    let after = &rest[target.len()..];
    let (len, tail) = after.find(':').map_or((after, ""), |i| after.split_at(i));
    let has_access = tail.split(':').any(|s| !s.is_empty() && s.chars().all(|c| "rwx".contains(c)));
    Ok(format!("mem:{addr:#x}{len}{}{tail}", if has_access { "" } else { ":x" }))
}

/// Opens the plan's sets on `at`. The first open of the run leaves out, as
/// perf stat does, the events the kernel cannot count (and the groups they
/// are in), says why on stderr and drops them from the plan; it fails when
/// nothing at all can be counted.
fn open_unit(lib: &Library, args: &Args, plan: &mut Plan, at: Where, label: String) -> Result<Unit, Failure> {
    let settling = !std::mem::replace(&mut plan.settled, true);
    let mut refused = vec![];
    let mut sets = Vec::with_capacity(plan.parts.len());
    for (k, part) in plan.parts.iter().enumerate() {
        let mut set = lib.event_set();
        // Groups are one kernel group each: never multiplexed apart.
        set.set_multiplex(args.multiplex && k < plan.lone_parts)?;
        match at {
            Where::Task(pid) => {
                set.set_granularity(Granularity::Process)?;
                set.attach(pid)?;
            }
            Where::Cpu(cpu) => {
                set.set_cpu(Some(cpu))?;
                set.set_granularity(Granularity::System)?;
            }
        }
        let names = part
            .iter()
            .map(|&i| match at {
                Where::Task(pid) => resolve_symbol(&plan.names[i], pid),
                Where::Cpu(_) => Ok(plan.names[i].clone()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut from = 0;
        while from < names.len() {
            let before = set.events().len();
            match set.add_all(names[from..].iter().map(String::as_str)) {
                Ok(_) => break,
                Err(e) if settling && not_supported(&e) => {
                    // The events before the refused one stay added.
                    let bad = from + set.events().len() - before;
                    refused.push((part[bad], e, k >= plan.lone_parts));
                    if k >= plan.lone_parts {
                        set = lib.event_set();
                        break;
                    }
                    from = bad + 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !set.events().is_empty() {
            sets.push(set);
        }
    }
    if !refused.is_empty() {
        leave_out(plan, refused)?;
    }
    Ok(Unit { label, sets })
}

/// Drops refused events (and the other members of their groups) from
/// `plan`, each reason printed once; fails with the first reason when no
/// event is left to measure.
fn leave_out(plan: &mut Plan, refused: Vec<(usize, papirus_lowlevel::Error, bool)>) -> Result<(), Failure> {
    for (i, _, group) in &refused {
        plan.missing[*i] = Some(Missing::NotSupported);
        if *group {
            for &j in plan.parts.iter().find(|p| p.contains(i)).into_iter().flatten() {
                plan.missing[j].get_or_insert(Missing::NotCounted);
            }
        }
    }
    let lone =
        plan.parts[..plan.lone_parts].iter().filter(|p| p.iter().any(|&i| plan.missing[i].is_none())).count();
    for p in &mut plan.parts {
        p.retain(|&i| plan.missing[i].is_none());
    }
    plan.parts.retain(|p| !p.is_empty());
    plan.lone_parts = lone;
    if plan.parts.is_empty() && plan.tool.iter().all(Option::is_none) {
        let (_, first, _) = refused.into_iter().next().expect("refused is not empty");
        return Err(first.into());
    }
    let mut err = std::io::stderr().lock();
    for (_, e, group) in refused {
        let what = if group {
            "shown as <not supported>, the rest of its group as <not counted>"
        } else {
            "shown as <not supported>"
        };
        let _ = writeln!(err, "papirus-stat: {e} ({what})");
    }
    Ok(())
}

/// The values of every kernel event of `units`, by plan index, one vector per unit.
fn read_units(plan: &Plan, units: &mut [Unit]) -> Result<Vec<Vec<Option<Value>>>, Failure> {
    let mut out = Vec::with_capacity(units.len());
    for u in units {
        let mut row = vec![None; plan.names.len()];
        for (set, part) in u.sets.iter_mut().zip(&plan.parts) {
            for (v, &i) in set.read_detailed()?.into_iter().zip(part) {
                row[i] = Some(v);
            }
        }
        out.push(row);
    }
    Ok(out)
}

fn sum(rows: &[Vec<Option<Value>>], i: usize) -> Option<Value> {
    rows.iter().filter_map(|r| r[i]).reduce(|mut t, x| {
        t.value = t.value.saturating_add(x.value);
        t.raw = t.raw.saturating_add(x.raw);
        t.time_enabled = t.time_enabled.saturating_add(x.time_enabled);
        t.time_running = t.time_running.saturating_add(x.time_running);
        t
    })
}

/// One run's results.
struct Measured {
    /// Per unit label (one label, "", unless --per-thread) the values by plan index.
    rows: Vec<(String, Vec<Option<Value>>)>,
    elapsed_ns: u64,
    user_ns: u64,
    sys_ns: u64,
    code: ExitCode,
    /// Per plan index: the unit of the event's value (sysfs `.unit`), if any.
    units: Vec<Option<String>>,
}

/// Where counts are written: -o FILE or stderr.
struct Sink {
    out: Box<dyn std::io::Write>,
    what: String,
}

impl Sink {
    fn put(&mut self, text: &str) -> Result<(), Failure> {
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| Failure(format!("cannot write to {}: {e}", self.what)))
    }
}

/// Creates `-o FILE` without following a symbolic link at its name: papirus-stat
/// often runs as root, and a link someone planted there would aim its output
/// at any file. Counts stream to it (-I), so it is written in place.
fn create_output(path: &std::path::Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Failure(format!(
                "{} is a symbolic link: papirus-stat does not write through links; name the file itself",
                path.display()
            )),
            _ => Failure(format!("cannot create {}: {e}", path.display())),
        })
}

fn main() -> ExitCode {
    papirus_tools::cli::run_tool("papirus-stat", || run(&Args::parse()))
}

fn run(args: &Args) -> Result<ExitCode, Failure> {
    let mut plan = plan(args)?;
    if plan.names.is_empty() {
        return Err(Failure("no events: give some with -e (e.g. -e task-clock,page-faults)".into()));
    }
    let system = args.all_cpus || args.cpu.is_some();
    if args.pid.is_none() && !system && args.command.is_empty() {
        return Err(Failure("give a command after `--`, a process with -p PID, or CPUs with -a / -C".into()));
    }
    if args.per_thread && args.pid.is_none() {
        return Err(Failure("--per-thread needs -p PID (as in perf)".into()));
    }
    if args.repeat > 1 && (args.command.is_empty() || args.interval.is_some()) {
        return Err(Failure("-r repeats a command, and not together with -I".into()));
    }
    if args.separator.as_deref() == Some("") {
        return Err(Failure("-x needs a separator, e.g. -x,".into()));
    }
    let mut sink = match &args.output {
        Some(path) => Sink { out: Box::new(create_output(path)?), what: path.display().to_string() },
        None => Sink { out: Box::new(std::io::stderr()), what: "standard error".into() },
    };
    // Tracepoints are `subsystem:name`; other names with a colon are cheap to
    // over-approximate (the mount happens at most once per boot).
    if plan.names.iter().any(|n| n.contains(':') && !n.starts_with("mem:") && !n.contains("probe:")) {
        papirus_tools::cli::mount_tracefs("papirus-stat", "");
    }
    raise_descriptor_limit();
    let lib = init()?;
    let cpus = match (&args.cpu, args.all_cpus) {
        (Some(list), _) => cpu_list(list, lib.machine().cpus)?,
        (None, true) => (0..lib.machine().cpus as u32).collect(),
        (None, false) => vec![],
    };
    let label = match (args.pid, system) {
        (Some(pid), _) => format!("process id '{pid}'"),
        (None, true) if args.command.is_empty() => {
            if args.all_cpus {
                "'system wide'".into()
            } else {
                format!("'CPU(s) {}'", args.cpu.as_deref().unwrap_or(""))
            }
        }
        _ => format!("'{}'", args.command.join(" ")),
    };
    let mut runs = Vec::with_capacity(args.repeat as usize);
    let mut open = Vec::new();
    for _ in 0..args.repeat {
        drop(open);
        let (m, units) = measure(&lib, args, &mut plan, &cpus, &mut sink)?;
        runs.push(m);
        open = units;
    }
    let code = runs.last().map_or(ExitCode::SUCCESS, |r| r.code);
    let report = summarise(&plan, &runs);
    let text = if args.json {
        json_report(&label, &runs, &report)
    } else if let Some(sep) = &args.separator {
        csv(&report, sep, None, args.repeat > 1, mean_elapsed(&runs))
    } else {
        table(&label, &report, &runs)
    };
    if args.interval.is_none() || args.json {
        sink.put(&text)?;
    }
    drop(open);
    Ok(code)
}

fn cpu_list(list: &str, cpus: usize) -> Result<Vec<u32>, Failure> {
    let bad = || {
        Failure(format!(
            "-C {list}: give CPUs as `0`, `0-3` or `0,2-3` (this machine has CPUs 0-{})",
            cpus - 1
        ))
    };
    let mut out = papirus_substrate::pmu::parse_cpulist(list).map_err(|_| bad())?;
    if out.is_empty() || out.iter().any(|&c| c as usize >= cpus) {
        return Err(bad());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// How a waited-for command ended, and its CPU times.
struct Ended {
    code: ExitCode,
    user_ns: u64,
    sys_ns: u64,
}

/// Waits for the resumed command on a thread, so intervals can be printed meanwhile.
fn waiter(mut command: StoppedCommand) -> mpsc::Receiver<Ended> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let ended = match command.wait_usage() {
            Ok((exit, user, sys)) => {
                Ended { code: ExitCode::from(exit.code()), user_ns: ns(user), sys_ns: ns(sys) }
            }
            Err(_) => Ended { code: ExitCode::from(2), user_ns: 0, sys_ns: 0 },
        };
        let _ = tx.send(ended);
    });
    rx
}

/// One run; the sets are returned open, for the caller to close after it
/// printed (closing a tracepoint waits for RCU grace periods, 30-50 ms each
/// on this 6.18 KVM guest, serialised by the kernel's event mutex).
fn measure(
    lib: &Library,
    args: &Args,
    plan: &mut Plan,
    cpus: &[u32],
    sink: &mut Sink,
) -> Result<(Measured, Vec<Unit>), Failure> {
    let mut stopped = None;
    let mut units = Vec::new();
    if !cpus.is_empty() {
        for &c in cpus {
            units.push(open_unit(lib, args, plan, Where::Cpu(c), format!("CPU{c}"))?);
        }
    } else if let Some(pid) = args.pid {
        for tid in threads_of(pid)? {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
            units.push(open_unit(lib, args, plan, Where::Task(tid), format!("{}-{tid}", comm.trim()))?);
        }
    }
    if !args.command.is_empty() {
        let argv: Vec<std::ffi::OsString> = args.command.iter().map(Into::into).collect();
        let s = StoppedCommand::spawn(&argv).map_err(|e| Failure(e.to_string()))?;
        if cpus.is_empty() {
            units.push(open_unit(lib, args, plan, Where::Task(s.pid()), String::new())?);
        }
        stopped = Some(s);
    }
    let t0 = real_nsec();
    for u in &mut units {
        for s in &mut u.sets {
            s.start()?;
        }
    }
    let done = match stopped.take() {
        Some(mut s) => {
            // As perf does: ^C ends the command, and the counts are still
            // printed (the command resets SIGINT to its default).
            let _ = papirus_substrate::signal::ignore(libc::SIGINT);
            s.resume().map_err(|e| Failure(format!("cannot resume the command: {e}")))?;
            Some(waiter(s))
        }
        None => None,
    };
    let mut ended = None;
    let mut last: Vec<Option<Value>> = vec![None; plan.names.len()];
    let mut prev_t = t0;
    let until = t0.saturating_add(args.duration.as_nanos().min(u64::MAX as u128) as u64);
    loop {
        // Until the next interval, the command's end, or the end of -d.
        let left = Duration::from_nanos(until.saturating_sub(real_nsec()));
        let wait = match (args.interval, done.is_some()) {
            (Some(i), true) => i,
            (Some(i), false) => i.min(left),
            (None, true) => Duration::MAX,
            (None, false) => left,
        };
        match &done {
            Some(rx) => match rx.recv_timeout(wait) {
                Ok(e) => ended = Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Failure("lost the command's exit status".into()));
                }
            },
            None => std::thread::sleep(wait),
        }
        let now = real_nsec();
        let finished = ended.is_some() || (done.is_none() && now >= until);
        if args.interval.is_some() && !args.json {
            let rows = read_units(plan, &mut units)?;
            let cur: Vec<Option<Value>> = (0..plan.names.len()).map(|i| sum(&rows, i)).collect();
            let delta: Vec<Option<Value>> = cur.iter().zip(&last).map(|(c, l)| diff(*c, *l)).collect();
            let span = now - prev_t;
            let m = Measured {
                rows: vec![(String::new(), delta)],
                elapsed_ns: span,
                user_ns: 0,
                sys_ns: 0,
                code: ExitCode::SUCCESS,
                units: vec![],
            };
            let report = summarise(plan, std::slice::from_ref(&m));
            let stamp = (now - t0) as f64 / 1e9;
            let text = match &args.separator {
                Some(sep) => csv(&report, sep, Some(stamp), false, span as f64),
                None => interval_lines(&report, stamp),
            };
            sink.put(&text)?;
            last = cur;
            prev_t = now;
        }
        if finished {
            break;
        }
    }
    let elapsed_ns = real_nsec() - t0;
    for u in &mut units {
        for s in &mut u.sets {
            s.stop()?;
        }
    }
    let read = read_units(plan, &mut units)?;
    let rows: Vec<(String, Vec<Option<Value>>)> = if args.per_thread {
        units.iter().map(|u| u.label.clone()).zip(read).collect()
    } else {
        vec![(String::new(), (0..plan.names.len()).map(|i| sum(&read, i)).collect())]
    };
    let (code, user_ns, sys_ns) = match ended {
        Some(e) => (e.code, e.user_ns, e.sys_ns),
        None => (ExitCode::SUCCESS, 0, 0),
    };
    let mut unit_of = vec![None; plan.names.len()];
    if let Some(u) = units.first() {
        for (set, part) in u.sets.iter().zip(&plan.parts) {
            for (info, &i) in set.events().into_iter().zip(part) {
                unit_of[i] = info.unit;
            }
        }
    }
    Ok((Measured { rows, elapsed_ns, user_ns, sys_ns, code, units: unit_of }, units))
}

/// Raises the soft limit on open descriptors to the hard one, as perf does:
/// every counted event holds a descriptor (2,300 tracepoints need 2,300).
fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: lim.maximum, maximum: lim.maximum });
    }
}

fn diff(cur: Option<Value>, last: Option<Value>) -> Option<Value> {
    let (c, l) = match (cur, last) {
        (Some(c), Some(l)) => (c, l),
        (c, None) => return c,
        (None, _) => return None,
    };
    Some(Value {
        value: c.value.saturating_sub(l.value),
        raw: c.raw.saturating_sub(l.raw),
        time_enabled: c.time_enabled.saturating_sub(l.time_enabled),
        time_running: c.time_running.saturating_sub(l.time_running),
    })
}

/// The thread ids of process `pid`.
fn threads_of(pid: i32) -> Result<Vec<i32>, Failure> {
    let gone = || Failure(papirus_lowlevel::Error::NoSuchProcess { pid }.to_string());
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| gone())?;
    let mut tids: Vec<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort();
    if tids.is_empty() {
        return Err(gone());
    }
    Ok(tids)
}

/// One line of the report: an event (of one thread with --per-thread) over the runs.
#[derive(Serialize, Debug)]
struct Row {
    thread: Option<String>,
    name: String,
    /// Mean over the runs; `None`: not counted.
    value: Option<f64>,
    /// Why there is no value, in perf's words (`null` when counted).
    missing: Option<Missing>,
    /// Standard deviation of the mean, % of the mean (with -r).
    stddev_pct: Option<f64>,
    time_enabled: u64,
    time_running: u64,
    unit: Option<String>,
}

impl Row {
    fn is_clock(&self) -> bool {
        matches!(self.name.as_str(), "task-clock" | "cpu-clock" | "perf::TASK-CLOCK" | "perf::CPU-CLOCK")
    }

    fn pct_running(&self) -> f64 {
        if self.time_enabled == 0 {
            100.0
        } else {
            100.0 * self.time_running as f64 / self.time_enabled as f64
        }
    }
}

/// Mean and standard deviation of the mean, in % of the mean (perf's `+-`).
fn mean_and_spread(xs: &[f64]) -> (f64, Option<f64>) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, None);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let of_mean = (var / n).sqrt();
    (mean, Some(if mean == 0.0 { 0.0 } else { 100.0 * of_mean / mean.abs() }))
}

fn summarise(plan: &Plan, runs: &[Measured]) -> Vec<Row> {
    let mut out = vec![];
    let Some(first) = runs.first() else { return out };
    for (t, (thread, _)) in first.rows.iter().enumerate() {
        for (i, name) in plan.names.iter().enumerate() {
            let vals: Vec<Option<Value>> = runs
                .iter()
                .map(|r| match plan.tool[i] {
                    Some(ToolEvent::Duration) => Some(tool_value(r.elapsed_ns)),
                    Some(ToolEvent::User) => Some(tool_value(r.user_ns)),
                    Some(ToolEvent::System) => Some(tool_value(r.sys_ns)),
                    None => r.rows.get(t).and_then(|(_, v)| v[i]),
                })
                .collect();
            let counted: Vec<Value> = vals.iter().flatten().copied().collect();
            let (value, stddev_pct) = if counted.len() == vals.len() && !counted.is_empty() {
                let (m, s) = mean_and_spread(&counted.iter().map(|v| v.value as f64).collect::<Vec<_>>());
                (Some(m), s)
            } else {
                (None, None)
            };
            let unit = match plan.tool[i] {
                Some(_) => Some("ns".to_string()),
                None => first.units.get(i).cloned().flatten(),
            };
            out.push(Row {
                thread: (!thread.is_empty()).then(|| thread.clone()),
                name: name.clone(),
                value,
                missing: value.is_none().then(|| plan.missing[i].unwrap_or(Missing::NotCounted)),
                stddev_pct,
                time_enabled: counted.iter().map(|v| v.time_enabled).sum::<u64>()
                    / counted.len().max(1) as u64,
                time_running: counted.iter().map(|v| v.time_running).sum::<u64>()
                    / counted.len().max(1) as u64,
                unit,
            });
        }
    }
    out
}

fn tool_value(ns: u64) -> Value {
    let v = ns.min(i64::MAX as u64) as i64;
    Value { value: v, raw: v, time_enabled: ns, time_running: ns }
}

fn grouped(v: f64) -> String {
    let s = (v.round().abs() as u128).to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

/// (value text, unit text) as perf prints them: clocks in msec.
fn shown(r: &Row, csv: bool) -> (String, String) {
    match r.value {
        None if r.missing == Some(Missing::NotSupported) => ("<not supported>".into(), String::new()),
        None => (
            "<not counted>".into(),
            if r.is_clock() { "msec".into() } else { r.unit.clone().unwrap_or_default() },
        ),
        Some(v) if r.is_clock() => (format!("{:.2}", v / 1e6), "msec".into()),
        Some(v) if csv => (format!("{}", v.round()), r.unit.clone().unwrap_or_default()),
        Some(v) => (grouped(v), r.unit.clone().unwrap_or_default()),
    }
}

/// The metric perf prints beside clocks: CPUs utilized.
fn metric(r: &Row, elapsed_ns: f64) -> Option<(f64, &'static str)> {
    match r.value {
        Some(v) if r.is_clock() && elapsed_ns > 0.0 => Some((v / elapsed_ns, "CPUs utilized")),
        _ => None,
    }
}

fn mean_elapsed(runs: &[Measured]) -> f64 {
    runs.iter().map(|r| r.elapsed_ns as f64).sum::<f64>() / runs.len().max(1) as f64
}

fn table(label: &str, rows: &[Row], runs: &[Measured]) -> String {
    let elapsed = mean_elapsed(runs);
    let mut out = format!("\n Performance counter stats for {label}");
    if runs.len() > 1 {
        let _ = write!(out, " ({} runs)", runs.len());
    }
    out.push_str(":\n\n");
    for r in rows {
        let (value, unit) = shown(r, false);
        let mut note = String::new();
        if let Some((m, u)) = metric(r, elapsed) {
            let _ = write!(note, "#  {m:.3} {u}");
        }
        if r.value.is_some() && r.time_running < r.time_enabled {
            let _ = write!(note, "  (scaled: counted {:.2}% of the time)", r.pct_running());
        }
        if let Some(s) = r.stddev_pct {
            let _ = write!(note, "  ( +- {s:.2}% )");
        }
        let thread = r.thread.as_deref().map(|t| format!("{t:>16} ")).unwrap_or_default();
        let _ = writeln!(out, "{thread}{value:>18} {unit:<5} {:<32} {note}", r.name);
    }
    let secs: Vec<f64> = runs.iter().map(|r| r.elapsed_ns as f64 / 1e9).collect();
    let (mean, spread) = mean_and_spread(&secs);
    match spread {
        Some(s) => {
            let _ = write!(
                out,
                "\n{mean:>15.9} +- {:.9} seconds time elapsed  ( +- {s:.2}% )\n",
                mean * s / 100.0
            );
        }
        None => {
            let _ = write!(out, "\n{mean:>15.9} seconds time elapsed\n");
        }
    }
    if let Some(last) = runs.last().filter(|r| r.user_ns > 0 || r.sys_ns > 0) {
        let _ = write!(
            out,
            "\n{:>15.9} seconds user\n{:>15.9} seconds sys\n",
            last.user_ns as f64 / 1e9,
            last.sys_ns as f64 / 1e9
        );
    }
    out.push('\n');
    out
}

fn interval_lines(rows: &[Row], stamp: f64) -> String {
    let mut out = String::new();
    for r in rows {
        let (value, unit) = shown(r, false);
        let _ = writeln!(out, "{stamp:>15.9} {value:>18} {unit:<5} {}", r.name);
    }
    out
}

/// perf's CSV columns: [time,] value, unit, event, [variance,] run time,
/// % running, metric value, metric unit.
fn csv(rows: &[Row], sep: &str, stamp: Option<f64>, variance: bool, elapsed_ns: f64) -> String {
    let mut out = String::new();
    for r in rows {
        let (value, unit) = shown(r, true);
        let mut f: Vec<String> = vec![];
        if let Some(t) = stamp {
            f.push(format!("{t:>15.9}"));
        }
        if let Some(t) = &r.thread {
            f.push(t.clone());
        }
        f.extend([value, unit, r.name.clone()]);
        if variance {
            f.push(format!("{:.2}%", r.stddev_pct.unwrap_or(0.0)));
        }
        f.push(r.time_running.to_string());
        f.push(format!("{:.2}", r.pct_running()));
        match metric(r, elapsed_ns) {
            Some((m, u)) => f.extend([format!("{m:.3}"), u.to_string()]),
            None => f.extend([String::new(), String::new()]),
        }
        let _ = writeln!(out, "{}", f.join(sep));
    }
    out
}

fn json_report(label: &str, runs: &[Measured], rows: &[Row]) -> String {
    let mean =
        |f: fn(&Measured) -> u64| runs.iter().map(|r| f(r) as f64).sum::<f64>() / runs.len().max(1) as f64;
    let out = json!({
        "format_version": FORMAT_VERSION,
        "target": label,
        "runs": runs.len(),
        "elapsed_ns": mean(|r| r.elapsed_ns),
        "user_ns": mean(|r| r.user_ns),
        "system_ns": mean(|r| r.sys_ns),
        "events": rows,
    });
    serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, value: f64, enabled: u64, running: u64) -> Row {
        Row {
            thread: None,
            name: name.into(),
            value: Some(value),
            missing: None,
            stddev_pct: None,
            time_enabled: enabled,
            time_running: running,
            unit: None,
        }
    }

    fn run_of(ns: u64) -> Measured {
        Measured {
            rows: vec![],
            elapsed_ns: ns,
            user_ns: 0,
            sys_ns: 0,
            code: ExitCode::SUCCESS,
            units: vec![],
        }
    }

    #[test]
    fn table_shows_clocks_in_msec_counts_grouped_and_multiplex_scaling() {
        assert_eq!(grouped(0.0), "0");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1_234_567.0), "1,234,567");
        assert_eq!(grouped(-1_000.0), "-1,000");
        let t = table(
            "'prog'",
            &[
                row("task-clock", 12_340_000.0, 10, 10),
                row("page-faults", 1234.0, 10, 10),
                row("r01c2", 5000.0, 200, 100),
            ],
            &[run_of(24_680_000)],
        );
        assert!(t.contains("Performance counter stats for 'prog':"), "{t}");
        assert!(t.contains("12.34 msec  task-clock") && t.contains("0.500 CPUs utilized"), "{t}");
        assert!(t.contains("1,234") && t.contains("page-faults"), "{t}");
        assert!(t.contains("(scaled: counted 50.00% of the time)"), "{t}");
        assert_eq!(t.matches("scaled").count(), 1, "only the multiplexed event says so: {t}");
        assert!(t.contains("0.024680000 seconds time elapsed"), "{t}");
    }

    #[test]
    fn repeats_print_the_spread_of_the_mean() {
        let (m, s) = mean_and_spread(&[9.0, 10.0, 11.0]);
        assert_eq!(m, 10.0);
        // stddev 1, of the mean 1/sqrt(3): 5.77 % of 10.
        assert!((s.unwrap() - 100.0 / 3f64.sqrt() / 10.0).abs() < 1e-9);
        assert_eq!(mean_and_spread(&[4.0]).1, None);
        let mut r = row("page-faults", 10.0, 5, 5);
        r.stddev_pct = Some(5.77);
        let t = table("'p'", &[r], &[run_of(1_000_000), run_of(1_200_000)]);
        assert!(t.contains("( +- 5.77% )") && t.contains("(2 runs)") && t.contains("+-"), "{t}");
    }

    #[test]
    fn csv_follows_perfs_column_order() {
        let rows = [row("task-clock", 2_000_000.0, 4_000_000, 4_000_000), row("page-faults", 47.0, 8, 4)];
        let c = csv(&rows, ",", None, false, 4e6);
        let lines: Vec<Vec<&str>> = c.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(lines[0], ["2.00", "msec", "task-clock", "4000000", "100.00", "0.500", "CPUs utilized"]);
        assert_eq!(lines[1], ["47", "", "page-faults", "4", "50.00", "", ""]);
        let c = csv(&rows[1..], ";", Some(0.1), true, 1e8);
        assert_eq!(
            c.trim().split(';').map(str::trim).collect::<Vec<_>>(),
            ["0.100000000", "47", "", "page-faults", "0.00%", "4", "50.00", "", ""]
        );
    }

    #[test]
    fn symbols_are_rewritten_to_addresses_in_the_target() {
        let me = std::process::id() as i32;
        assert_eq!(resolve_symbol("mem:0x1000:w", me).unwrap(), "mem:0x1000:w");
        assert_eq!(resolve_symbol("task-clock", me).unwrap(), "task-clock");
        match resolve_symbol("mem:main", me) {
            Ok(n) => assert!(n.starts_with("mem:0x") && n.ends_with(":x"), "{n}"),
            Err(e) => println!("skipped: this process's modules are not readable here: {e}"),
        }
        assert!(resolve_symbol("mem:surely_not_a_function_here:x", me).is_err());
    }

    #[test]
    fn cpu_lists_are_checked() {
        assert_eq!(cpu_list("0-1", 2).unwrap(), [0, 1]);
        assert_eq!(cpu_list("1,0,1", 2).unwrap(), [0, 1]);
        for bad in ["", "2", "1-0", "a", "0-", "-1"] {
            assert!(cpu_list(bad, 2).is_err(), "`{bad}`");
        }
    }
}
