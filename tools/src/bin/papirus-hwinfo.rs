//! `papirus-hwinfo`: what this machine offers papirus — CPU, topology,
//! caches, TSC, hypervisor, hardware counters, perf PMUs — as a table, or
//! as JSON with `--json`.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use papirus_substrate::hwinfo::HwInfo;

const EXAMPLES: &str = "Examples:
  papirus-hwinfo                 the machine as a table
  papirus-hwinfo --json | jq .tsc

A write error on stdout ends the tool with status 2; a closed pipe (| head) ends it quietly.";

/// Show what this machine offers papirus: CPU, topology, caches, TSC,
/// hypervisor, hardware counters and perf PMUs.
#[derive(Parser, Debug)]
#[command(name = "papirus-hwinfo", version, after_help = EXAMPLES)]
struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    papirus_substrate::sys::default_sigpipe();
    // A closed stdout was reopened on /dev/null by Rust's runtime: refuse it.
    if !papirus_tools::cli::stdout_is_open() {
        return fail("standard output is closed; redirect it (e.g. >/dev/null)");
    }
    let info = HwInfo::collect();
    let text = if args.json {
        match serde_json::to_string_pretty(&info) {
            Ok(s) => s + "\n",
            Err(e) => return fail(&format!("cannot encode JSON: {e}")),
        }
    } else {
        info.to_string()
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write to standard output: {e}")),
    }
}

fn fail(why: &str) -> ExitCode {
    // stderr may be closed as well; nothing is left to report to then.
    let _ = writeln!(std::io::stderr(), "papirus-hwinfo: {why}");
    ExitCode::from(2)
}
