//! papirus-avail: the machine, then every PAPI preset with whether it can be
//! counted here, whether it is derived, and why not when not.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use papirus_lowlevel::avail::{FORMAT_VERSION, PresetStatus, check_one, native_statuses};
use papirus_lowlevel::preset::{Term, preset_by_name};
use papirus_lowlevel::{Library, init};
use papirus_tools::{out, outln};
use serde_json::json;

const EXAMPLES: &str = "Examples:
  papirus-avail                 every preset, available or not, with the reason
  papirus-avail -a              available presets only
  papirus-avail -e PAPI_TOT_CYC one preset's definitions and native terms
  papirus-avail --json | jq .presets

A write error on stdout ends the tool with status 2; a closed pipe (| head) ends it quietly.";

/// List PAPI presets and their availability on this machine.
#[derive(Parser, Debug)]
#[command(name = "papirus-avail", version, after_help = EXAMPLES)]
struct Args {
    /// Show one preset's definitions, native terms and encodings.
    #[arg(short, long, value_name = "NAME")]
    event: Option<String>,
    /// List available presets only.
    #[arg(short, long)]
    avail: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    papirus_tools::cli::run_printing("papirus-avail", run)
}

fn run(args: &Args, w: &mut String) -> papirus_lowlevel::Result<ExitCode> {
    // Tracepoints are among what the machine offers.
    papirus_tools::cli::mount_tracefs("papirus-avail", "");
    let lib = init()?;
    if let Some(name) = &args.event {
        return one(&lib, name, args.json, w);
    }
    let statuses: Vec<PresetStatus> =
        lib.preset_statuses().into_iter().filter(|s| s.available || !args.avail).collect();
    let offered = offered();
    if args.json {
        let out = json!({
            "format_version": FORMAT_VERSION,
            "hardware": lib.hwinfo(),
            "machine": lib.machine(),
            "presets": statuses,
            "offered_instead": offered,
        });
        outln!(w, "{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(hw) = lib.hwinfo() {
        out!(w, "{hw}");
    }
    let m = lib.machine();
    outln!(w, "{}", "=".repeat(100));
    outln!(
        w,
        "{:<13} {:<10} {:<5} {:<5} {:<45} Reason / note",
        "Name",
        "Code",
        "Avail",
        "Deriv",
        "Description"
    );
    for s in &statuses {
        let note = if s.available {
            s.definition.as_ref().and_then(|d| d.note.clone()).unwrap_or_default()
        } else {
            s.reason.clone().unwrap_or_default()
        };
        outln!(
            w,
            "{:<13} {:#010x} {:<5} {:<5} {:<45} {}",
            s.preset.name,
            s.code,
            if s.available { "Yes" } else { "No" },
            if s.derived { "Yes" } else { "No" },
            s.preset.long,
            note
        );
    }
    let avail = statuses.iter().filter(|s| s.available).count();
    let derived = statuses.iter().filter(|s| s.available && s.derived).count();
    outln!(w, "{}", "-".repeat(100));
    outln!(
        w,
        "Of {} presets, {avail} are available here, of which {derived} are derived (definitions for {}).",
        statuses.len(),
        m.cpu
    );
    if !offered.is_empty() {
        outln!(w, "\nWhat this machine does offer (papirus-native-avail --check lists every event):");
        for (pmu, names) in &offered {
            outln!(w, "  {pmu:<11} {}", names.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Native events that open here, grouped by PMU (tracepoints counted, not listed).
fn offered() -> Vec<(String, Vec<String>)> {
    let Ok(all) = native_statuses(false) else { return vec![] };
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut tracepoints = 0usize;
    for mut s in all {
        if s.event.pmu == "tracepoint" {
            tracepoints += 1;
            continue;
        }
        check_one(&mut s);
        if s.counts != Some(true) {
            continue;
        }
        match out.iter_mut().find(|(p, _)| *p == s.event.pmu) {
            Some((_, v)) => v.push(s.event.name),
            None => out.push((s.event.pmu, vec![s.event.name])),
        }
    }
    if tracepoints > 0 {
        out.push(("tracepoint".into(), vec![format!("{tracepoints} tracepoints (syscalls:*, sched:*, …)")]));
    }
    out.push((
        "breakpoint".into(),
        vec!["mem:ADDR[/LEN][:rwx] and mem:SYMBOL:x (4 debug registers per thread)".into()],
    ));
    out.push(("uprobe".into(), vec!["uprobe:PATH:SYMBOL[+OFF], uretprobe:PATH:SYMBOL".into()]));
    out
}

fn one(lib: &Library, name: &str, json: bool, w: &mut String) -> papirus_lowlevel::Result<ExitCode> {
    let Some(p) = preset_by_name(name) else {
        return Err(papirus_lowlevel::Error::NoSuchEvent {
            name: name.to_string(),
            suggestions: papirus_lowlevel::native::closest_presets(name, 3),
        });
    };
    let s = lib.preset_status(p);
    if json {
        let out = json!({ "format_version": FORMAT_VERSION, "preset": s });
        outln!(w, "{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    outln!(w, "Event name:        {}", p.name);
    outln!(w, "Event code:        {:#010x}", p.code());
    outln!(w, "Short description: {}", p.short);
    outln!(w, "Long description:  {}", p.long);
    outln!(w, "Available here:    {}", if s.available { "yes" } else { "no" });
    if let Some(r) = &s.reason {
        outln!(w, "Reason:            {r}");
    }
    if s.candidates.is_empty() {
        outln!(w, "Definitions:       none for {}", lib.machine().cpu);
    }
    for (i, d) in s.candidates.iter().enumerate() {
        let used = s.available && s.definition.as_ref() == Some(d);
        outln!(
            w,
            "\nDefinition {}{} (presets.csv line {}):",
            i + 1,
            if used { ", in use" } else { "" },
            d.line
        );
        outln!(w, "  derived:  {}", d.derivation.papi_name());
        outln!(w, "  formula:  {}", d.formula());
        for (k, t) in d.terms.iter().enumerate() {
            let enc = match t {
                Term::Core { .. } => {
                    t.core_attr().map_or(String::new(), |a| format!("raw config {:#x}", a.config_value()))
                }
                Term::Perf { name } => match papirus_lowlevel::native::resolve(name) {
                    Ok(r) => {
                        format!(
                            "type {} config {:#x}",
                            r.parsed.attr.pmu_type(),
                            r.parsed.attr.config_value()
                        )
                    }
                    Err(e) => e.to_string(),
                },
            };
            outln!(w, "  N{k}:       {:<34} {enc}", t.text());
        }
        if let Some(n) = &d.note {
            outln!(w, "  note:     {n}");
        }
        if let Some(src) = &d.source {
            outln!(w, "  source:   {src}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
