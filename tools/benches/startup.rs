//! What papirus-probe adds around a program beside uftrace, in the same run:
//! the fixed start-up (the tool's start to the program's `main`) and the
//! work after the program ends (the end of its `main` to the tool's exit),
//! for `papirus-probe run` with the wallclock probe and with the counters
//! probe (task-clock, page-faults), `uftrace record` (Debian's uftrace,
//! installed when missing) and the program alone. The program prints
//! CLOCK_MONOTONIC at both points (testkit/targets/startup_stamp.c); the
//! tools are started and waited for here. Rounds interleave the tools, so
//! each sees the same load; the table gives medians.
//!
//! `cargo bench -p papirus-tools --bench startup`

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use papirus_probe::session::cost;
use papirus_substrate::stats::median;
use papirus_substrate::sys::clock_gettime;

const PROBE: &str = env!("CARGO_BIN_EXE_papirus-probe");
const ROUNDS: usize = 15;

fn monotonic_ns() -> i64 {
    clock_gettime(libc::CLOCK_MONOTONIC).unwrap_or(0) as i64
}

/// One run of `cmd`: (start-up ms, exit ms), from the program's stamps.
fn once(cmd: &mut Command) -> Result<(f64, f64), String> {
    let t0 = monotonic_ns();
    let out = cmd.output().map_err(|e| e.to_string())?;
    let t1 = monotonic_ns();
    let err = String::from_utf8_lossy(&out.stderr);
    let stamp = err
        .lines()
        .find_map(|l| l.strip_prefix("STAMP "))
        .ok_or_else(|| format!("no stamp ({}): {}", out.status, err.lines().last().unwrap_or("")))?;
    let w: Vec<i64> = stamp.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    match w[..] {
        [start, end, _] => Ok(((start - t0) as f64 / 1e6, (t1 - end) as f64 / 1e6)),
        _ => Err(format!("a bad stamp: {stamp}")),
    }
}

/// A tool's name and how to start it on the program.
type Tool<'a> = (&'static str, Box<dyn Fn() -> Command + 'a>);

fn main() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let program =
        papirus_testkit::Cc::new(papirus_testkit::target("startup_stamp.c")).build(dir.path(), "stamp");
    let uftrace = papirus_testkit::debian_package("uftrace", || cost::uftrace().is_some())
        .and_then(|()| cost::uftrace().ok_or_else(|| "uftrace is not on PATH after installing it".into()))
        .map_err(|e| println!("uftrace not measured: {e}"))
        .ok();
    let report = dir.path().join("report.json");
    let data = dir.path().join("uftrace.data");
    let tools: Vec<Tool> = {
        let mut t: Vec<Tool> = vec![
            ("the program alone", Box::new(|| Command::new(&program))),
            (
                "papirus-probe run (wallclock)",
                Box::new(|| {
                    let mut c = Command::new(PROBE);
                    c.args(["run", "-o"]).arg(&report).arg("--").arg(&program);
                    c
                }),
            ),
            (
                "papirus-probe run (counters: task-clock, page-faults)",
                Box::new(|| {
                    let mut c = Command::new(PROBE);
                    c.args(["run", "--probe", "counters", "--events", "task-clock,page-faults", "-o"])
                        .arg(&report)
                        .arg("--")
                        .arg(&program);
                    c
                }),
            ),
        ];
        if let Some(u) = &uftrace {
            let (data, program) = (&data, &program);
            t.push((
                "uftrace record -P step",
                Box::new(move || {
                    let mut c = Command::new(u);
                    c.args(["record", "-P", "^step$", "--no-libcall", "--no-event", "-d"])
                        .arg(data)
                        .arg(program);
                    c
                }),
            ));
        }
        t
    };
    let mut results: Vec<(Vec<f64>, Vec<f64>, Option<String>)> =
        tools.iter().map(|_| (vec![], vec![], None)).collect();
    for _ in 0..ROUNDS {
        for ((_, make), r) in tools.iter().zip(&mut results) {
            match once(&mut make()) {
                Ok((s, e)) => {
                    r.0.push(s);
                    r.1.push(e);
                }
                Err(e) => r.2 = Some(e),
            }
        }
    }
    let when = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    println!("\nstart-up and exit, ms, medians of {ROUNDS} interleaved rounds (unix time {when}):");
    println!("  {:<56}{:>10}{:>10}", "", "start-up", "exit");
    for ((name, _), (s, e, err)) in tools.iter().zip(results) {
        match err {
            Some(err) if s.is_empty() => println!("  {name:<56}not measured: {err}"),
            _ => println!("  {name:<56}{:>10.1}{:>10.1}", median(&s), median(&e)),
        }
    }
}
