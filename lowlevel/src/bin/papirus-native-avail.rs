//! papirus-native-avail: every native event of this machine by PMU, with
//! its code and description; `--check` opens each one.

use std::process::ExitCode;

use clap::Parser;
use papirus_lowlevel::avail::{FORMAT_VERSION, native_statuses};
use serde_json::json;

/// List native events (perf's tables, sysfs PMU events, tracepoints).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Open each event for this thread and show whether it counts here.
    #[arg(short, long)]
    check: bool,
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
    let args = Args::parse();
    let all = match native_statuses(false) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("papirus-native-avail: {e}");
            return ExitCode::from(2);
        }
    };
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
    if args.check {
        for s in &mut list {
            if s.event.pmu == "tracepoint" && !check_tracepoints {
                skipped += 1;
                continue;
            }
            papirus_lowlevel::avail::check_one(s);
        }
    }
    if args.json {
        let out =
            json!({ "format_version": FORMAT_VERSION, "events": list, "tracepoints_not_checked": skipped });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let mut pmu = String::new();
    for s in &list {
        if s.event.pmu != pmu {
            pmu = s.event.pmu.clone();
            println!("{}\n PMU: {pmu}\n{}", "=".repeat(100), "-".repeat(100));
        }
        let check = match s.counts {
            Some(true) => "  [counts here]".to_string(),
            Some(false) => format!("  [no: {}]", s.reason.as_deref().unwrap_or("")),
            None => String::new(),
        };
        let aliases = if s.event.aliases.is_empty() {
            String::new()
        } else {
            format!(" (also {})", s.event.aliases.join(", "))
        };
        println!("| {:<40} {:#010x}{aliases}{check}", s.event.name, s.event.code);
        if !s.event.description.is_empty() {
            println!("|     {}", s.event.description);
        }
    }
    let counting = list.iter().filter(|s| s.counts == Some(true)).count();
    println!("{}", "=".repeat(100));
    if args.check {
        println!("Total events reported: {}, of which {counting} count here", list.len());
        if skipped > 0 {
            println!(
                "{skipped} tracepoints were not opened (opening and closing one took ~35 ms of kernel time on the development VM): add --all, or --pmu tracepoint / --include NAME to check them"
            );
        }
    } else {
        println!("Total events reported: {}", list.len());
    }
    ExitCode::SUCCESS
}
