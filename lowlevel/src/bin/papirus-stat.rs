//! papirus-stat: count events of a command, or of a running process for a
//! while, like `perf stat` and `papi_command_line`.
//!
//! A command is counted through inheritance: the events are opened on this
//! thread with process granularity before the command is spawned, so the
//! command and everything it starts are counted (plus this tool's own
//! spawn and wait, a few page faults and microseconds). A process given
//! with `-p` is counted on each of its threads that exist at start, and
//! what they create afterwards.

use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use papirus_lowlevel::avail::FORMAT_VERSION;
use papirus_lowlevel::native::split_list;
use papirus_lowlevel::{EventSet, Granularity, Library, Value, init, real_nsec};
use serde::Serialize;
use serde_json::json;

/// Count events of a command or a running process.
#[derive(Parser, Debug)]
#[command(version, trailing_var_arg = true)]
struct Args {
    /// Events: presets or perf-syntax names, comma-separated
    /// (`task-clock,page-faults,msr/tsc/`).
    #[arg(short, long, required = true)]
    events: Vec<String>,
    /// Count this running process (all its threads) instead of a command.
    #[arg(short, long, conflicts_with = "command")]
    pid: Option<i32>,
    /// With --pid: seconds to count for.
    #[arg(short, long, default_value_t = 1.0)]
    duration: f64,
    /// Let the kernel multiplex events that do not fit the counters together.
    #[arg(short, long)]
    multiplex: bool,
    /// Print JSON on stdout instead of the table on stderr.
    #[arg(long)]
    json: bool,
    /// The command and its arguments (after `--`).
    command: Vec<String>,
}

#[derive(Serialize)]
struct Row {
    name: String,
    value: i64,
    raw: i64,
    time_enabled: u64,
    time_running: u64,
    unit: Option<String>,
    note: Option<String>,
}

fn main() -> ExitCode {
    papirus_lowlevel::cli::run_tool("papirus-stat", || run(&Args::parse()))
}

fn build(
    lib: &Library,
    args: &Args,
    events: &[String],
    attach: Option<i32>,
) -> papirus_lowlevel::Result<EventSet> {
    let mut set = lib.event_set();
    set.set_multiplex(args.multiplex)?;
    set.set_granularity(Granularity::Process)?;
    if let Some(tid) = attach {
        set.attach(tid)?;
    }
    for e in events {
        set.add_named(e)?;
    }
    Ok(set)
}

fn run(args: &Args) -> papirus_lowlevel::Result<ExitCode> {
    let events: Vec<String> = args.events.iter().flat_map(|e| split_list(e)).collect();
    if args.pid.is_none() && args.command.is_empty() {
        return Err(papirus_lowlevel::Error::Invalid {
            what: "arguments",
            reason: "give a command after `--`, or a process with -p PID".into(),
        });
    }
    let lib = init()?;
    let (label, totals, elapsed, code) = match args.pid {
        Some(pid) => {
            if !(args.duration > 0.0 && args.duration.is_finite()) {
                return Err(papirus_lowlevel::Error::Invalid {
                    what: "duration",
                    reason: format!("{}: give a positive number of seconds", args.duration),
                });
            }
            let tids = threads_of(pid)?;
            let mut sets =
                tids.iter().map(|&t| build(&lib, args, &events, Some(t))).collect::<Result<Vec<_>, _>>()?;
            let t0 = real_nsec();
            for s in &mut sets {
                s.start()?;
            }
            std::thread::sleep(Duration::from_secs_f64(args.duration));
            let mut totals: Vec<Value> = Vec::new();
            for s in &mut sets {
                s.stop()?;
                let v = s.read_detailed()?;
                if totals.is_empty() {
                    totals = v;
                } else {
                    for (t, x) in totals.iter_mut().zip(v) {
                        t.value += x.value;
                        t.raw += x.raw;
                        t.time_enabled += x.time_enabled;
                        t.time_running += x.time_running;
                    }
                }
            }
            (
                format!("process id '{pid}' ({} threads)", tids.len()),
                totals,
                real_nsec() - t0,
                ExitCode::SUCCESS,
            )
        }
        None => {
            let mut set = build(&lib, args, &events, None)?;
            let mut cmd = Command::new(&args.command[0]);
            cmd.args(&args.command[1..]);
            let t0 = real_nsec();
            set.start()?;
            let status = cmd.status();
            set.stop()?;
            let elapsed = real_nsec() - t0;
            let status = status.map_err(|e| papirus_lowlevel::Error::Invalid {
                what: "command",
                reason: format!("cannot run `{}`: {e}", args.command[0]),
            })?;
            let code = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
                (Some(c), _) => c,
                (None, Some(sig)) => 128 + sig,
                _ => 1,
            };
            (
                format!("'{}'", args.command.join(" ")),
                set.read_detailed()?,
                elapsed,
                ExitCode::from(code as u8),
            )
        }
    };
    let infos = {
        let mut s = lib.event_set();
        // Names and units, without counting: the same names resolve the same way.
        events.iter().filter_map(|e| s.add_named(e).ok()).count();
        s.events()
    };
    let rows: Vec<Row> = events
        .iter()
        .zip(&totals)
        .map(|(n, v)| Row {
            name: n.clone(),
            value: v.value,
            raw: v.raw,
            time_enabled: v.time_enabled,
            time_running: v.time_running,
            unit: infos.iter().find(|i| &i.name == n).and_then(|i| i.unit.clone()),
            note: infos.iter().find(|i| &i.name == n).and_then(|i| i.note.clone()),
        })
        .collect();
    if args.json {
        let out = json!({ "format_version": FORMAT_VERSION, "target": label, "elapsed_ns": elapsed, "events": rows });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        eprint!("{}", table(&label, &rows, elapsed));
    }
    Ok(code)
}

/// The thread ids of process `pid`.
fn threads_of(pid: i32) -> papirus_lowlevel::Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|_| papirus_lowlevel::Error::NoSuchProcess { pid })?;
    let mut tids: Vec<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort();
    if tids.is_empty() {
        return Err(papirus_lowlevel::Error::NoSuchProcess { pid });
    }
    Ok(tids)
}

fn grouped(v: i64) -> String {
    let s = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0 { format!("-{out}") } else { out }
}

fn table(label: &str, rows: &[Row], elapsed: u64) -> String {
    let mut out = format!("\n Performance counter stats for {label}:\n\n");
    for r in rows {
        let clock = r.name == "task-clock" || r.name == "cpu-clock";
        let (value, unit) = if clock {
            (format!("{:.2}", r.value as f64 / 1e6), "msec".to_string())
        } else {
            (grouped(r.value), r.unit.clone().unwrap_or_default())
        };
        let mut note = String::new();
        if clock && elapsed > 0 {
            note = format!("#  {:.3} CPUs utilized", r.value as f64 / elapsed as f64);
        }
        if r.time_running < r.time_enabled {
            let pct =
                if r.time_enabled == 0 { 0.0 } else { 100.0 * r.time_running as f64 / r.time_enabled as f64 };
            note.push_str(&format!("  (scaled: counted {pct:.2}% of the time)"));
        }
        if let Some(n) = &r.note {
            note.push_str(&format!("  ({n})"));
        }
        out.push_str(&format!("{value:>18} {unit:<5} {:<32} {note}\n", r.name));
    }
    out.push_str(&format!("\n{:>15.9} seconds time elapsed\n\n", elapsed as f64 / 1e9));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, value: i64, enabled: u64, running: u64) -> Row {
        Row {
            name: name.into(),
            value,
            raw: value,
            time_enabled: enabled,
            time_running: running,
            unit: None,
            note: None,
        }
    }

    #[test]
    fn table_shows_clocks_in_msec_counts_grouped_and_multiplex_scaling() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(grouped(-1_000), "-1,000");
        let t = table(
            "'prog'",
            &[
                row("task-clock", 12_340_000, 10, 10),
                row("page-faults", 1234, 10, 10),
                row("r01c2", 5000, 200, 100),
            ],
            24_680_000,
        );
        assert!(t.contains("Performance counter stats for 'prog':"), "{t}");
        assert!(t.contains("12.34 msec  task-clock") && t.contains("0.500 CPUs utilized"), "{t}");
        assert!(t.contains("1,234") && t.contains("page-faults"), "{t}");
        assert!(t.contains("(scaled: counted 50.00% of the time)"), "{t}");
        assert_eq!(t.matches("scaled").count(), 1, "only the multiplexed event says so: {t}");
        assert!(t.contains("0.024680000 seconds time elapsed"), "{t}");
    }
}
