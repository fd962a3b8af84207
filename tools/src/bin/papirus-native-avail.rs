//! papirus-native-avail: every native event of this machine by PMU, with
//! its code and description; `--check` opens each one, `--measure` also
//! counts a short known workload with every event that opens.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use papirus_lowlevel::avail::{FORMAT_VERSION, native_statuses};
use papirus_tools::outln;
use serde_json::json;

const EXAMPLES: &str = "Examples:
  papirus-native-avail                       every native event by PMU
  papirus-native-avail --check --pmu software which software events count here
  papirus-native-avail -i sched_switch       events whose name contains the text
  papirus-native-avail --measure --json      counts of a known workload, as JSON

Tracepoints need tracefs: it is mounted at /sys/kernel/tracing when absent and permitted.
A write error on stdout ends the tool with status 2; a closed pipe (| head) ends it quietly.";

/// List native events (perf's tables, sysfs PMU events, tracepoints).
#[derive(Parser, Debug)]
#[command(name = "papirus-native-avail", version, after_help = EXAMPLES)]
struct Args {
    /// Open each event for this thread and show whether it counts here.
    #[arg(short, long)]
    check: bool,
    /// Like --check, then count a short self-measurement with every event
    /// that opens: 20 ms of busy loop, 256 fresh pages touched, 100 writes
    /// to /dev/null and 5 sleeps of 1 ms.
    #[arg(short, long)]
    measure: bool,
    /// Only events of this PMU (`software`, `hardware`, `hw-cache`, `msr`, `tracepoint`, …).
    #[arg(short, long)]
    pmu: Option<String>,
    /// Only events whose name contains this text.
    #[arg(short, long)]
    include: Option<String>,
    /// With --check, also open every tracepoint (slow: ~35 ms each on the development VM).
    #[arg(long)]
    all: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    papirus_tools::cli::run_printing("papirus-native-avail", run)
}

fn run(args: &Args, w: &mut String) -> papirus_lowlevel::Result<ExitCode> {
    papirus_tools::cli::mount_tracefs("papirus-native-avail", "; tracepoints are not listed");
    let all = native_statuses(false)?;
    let mut list: Vec<_> = all
        .into_iter()
        .filter(|s| args.pmu.as_ref().is_none_or(|p| &s.event.pmu == p))
        .filter(|s| args.include.as_ref().is_none_or(|i| s.event.name.contains(i.as_str())))
        .collect();
    // Opening and closing a tracepoint event took ~35 ms of kernel time on
    // the development VM, so thousands take over a minute: checked only
    // when asked for.
    let check_tracepoints = args.all || args.pmu.is_some() || args.include.is_some();
    let mut skipped = 0usize;
    let check = args.check || args.measure;
    if check {
        for s in &mut list {
            if s.event.pmu == "tracepoint" && !check_tracepoints {
                skipped += 1;
                continue;
            }
            papirus_lowlevel::avail::check_one(s);
        }
    }
    let counted = if args.measure { measure(&list) } else { Vec::new() };
    if args.json {
        let counts: serde_json::Map<_, _> = counted.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        let out = json!({
            "format_version": FORMAT_VERSION,
            "events": list,
            "tracepoints_not_checked": skipped,
            "self_measurement": { "workload": WORKLOAD, "counts": counts },
        });
        outln!(w, "{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    // Many events fail for one reason (no hardware PMU): print each reason once.
    let mut reasons: Vec<String> = Vec::new();
    let mut pmu = String::new();
    let mut tracepoints = std::collections::BTreeSet::new();
    let mut tracepoint_count = 0usize;
    for s in &list {
        if s.event.pmu == "tracepoint" && !check_tracepoints {
            // Thousands of lines: summarised below unless asked for.
            tracepoint_count += 1;
            tracepoints.insert(s.event.name.split(':').next().unwrap_or(""));
            continue;
        }
        if s.event.pmu != pmu {
            pmu = s.event.pmu.clone();
            outln!(w, "{}\n PMU: {pmu}\n{}", "=".repeat(100), "-".repeat(100));
        }
        let check = match s.counts {
            Some(true) => match counted.iter().find(|(n, _)| *n == s.event.name) {
                Some((_, v)) => format!("  [counts here: {v} in the self-measurement]"),
                None => "  [counts here]".to_string(),
            },
            Some(false) => {
                // The same refusal names each event; fold them into one note.
                let r =
                    s.reason.as_deref().unwrap_or("").replace(&format!("`{}`", s.event.name), "the event");
                let i = reasons.iter().position(|x| *x == r).unwrap_or_else(|| {
                    reasons.push(r);
                    reasons.len() - 1
                });
                format!("  [no, see note {}]", i + 1)
            }
            None => String::new(),
        };
        let aliases = if s.event.aliases.is_empty() {
            String::new()
        } else {
            format!(" (also {})", s.event.aliases.join(", "))
        };
        outln!(w, "| {:<40} {:#010x}{aliases}{check}", s.event.name, s.event.code);
        if !s.event.description.is_empty() {
            outln!(w, "|     {}", s.event.description);
        }
    }
    let counting = list.iter().filter(|s| s.counts == Some(true)).count();
    outln!(w, "{}", "=".repeat(100));
    if tracepoint_count > 0 {
        outln!(
            w,
            "tracepoint: {tracepoint_count} events in {} subsystems, not listed: add --pmu tracepoint (or --include TEXT) to list and check them",
            tracepoints.len()
        );
    }
    if args.pmu.is_none() && args.include.is_none() {
        outln!(
            w,
            "parameterised events (not enumerable): mem:ADDR|SYMBOL[/LEN][:rwx] (breakpoint PMU, 4 per thread), uprobe:PATH:SYMBOL[+OFF], uretprobe:PATH:SYMBOL (uprobe PMU)"
        );
    }
    for (i, r) in reasons.iter().enumerate() {
        outln!(w, "note {}: {r}", i + 1);
    }
    if args.measure {
        outln!(w, "self-measurement: {WORKLOAD}");
    }
    if check {
        outln!(w, "Total events reported: {}, of which {counting} count here", list.len());
        if skipped > 0 {
            outln!(
                w,
                "{skipped} tracepoints were not opened (opening and closing one took ~35 ms of kernel time on the development VM)"
            );
        }
    } else {
        outln!(w, "Total events reported: {}", list.len());
    }
    Ok(ExitCode::SUCCESS)
}

const WORKLOAD: &str =
    "20 ms busy loop, 256 fresh pages touched, 100 write(2) to /dev/null, 5 sleeps of 1 ms";

/// Counts the workload with every event that opened, each in a set of its
/// own so one refusal cannot hide the others.
fn measure(list: &[papirus_lowlevel::avail::NativeStatus]) -> Vec<(String, i64)> {
    let lib = match papirus_lowlevel::init() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("papirus-native-avail: {e}");
            return Vec::new();
        }
    };
    let mut sets: Vec<(String, papirus_lowlevel::EventSet)> = list
        .iter()
        .filter(|s| s.counts == Some(true))
        .filter_map(|s| {
            let mut set = lib.event_set();
            set.add_named(&s.event.name).ok()?;
            Some((s.event.name.clone(), set))
        })
        .collect();
    for (_, set) in &mut sets {
        // Refused starts leave the event out of the table.
        let _ = set.start();
    }
    workload();
    sets.into_iter().filter_map(|(name, mut set)| Some((name, *set.stop().ok()?.first()?))).collect()
}

fn workload() {
    let start = std::time::Instant::now();
    let mut x = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(20) {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    let page = 4096;
    let mut v = vec![0u8; 256 * page];
    for i in 0..256 {
        v[i * page] = 1;
    }
    std::hint::black_box(&v);
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::io::Write;
        for _ in 0..100 {
            let _ = f.write(b"x");
        }
    }
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
