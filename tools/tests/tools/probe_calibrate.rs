//! `papirus-probe calibrate`: papirus-calibrate with the probe rows. Its
//! cost file validates against calibrate's schema, round-trips through the
//! library reader, and holds every probe row, measured or unavailable with
//! the reason; the wallclock probe costs more than the uninstrumented call;
//! uftrace -P, when installed, is measured on the same body and records
//! every call.

use std::process::Command;

use papirus_calibrate::CostFile;
use papirus_tools::probe_costs::{
    COUNTERS, EMPTY, ROWS, UFTRACE, UNINSTRUMENTED, UPROBE_NOP5, UPROBE_TYPICAL, WALLCLOCK,
};

use crate::util::{calibration, cost_file};

fn probe_calibrate(args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_papirus-probe"));
    cmd.arg("calibrate");
    calibration(cmd, args)
}

fn uftrace_installed() -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("uftrace").is_file()))
}

fn gcc_runs() -> bool {
    papirus_testkit::runs("gcc", &["--version"])
}

#[test]
fn probe_rows_are_in_a_valid_cost_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("costs.json");
    let (ok, out) = probe_calibrate(&["--quick", "--only", "probe", "--json", path.to_str().unwrap()]);
    assert!(ok, "papirus-probe calibrate failed");

    let (instance, _) = cost_file(&path);

    let file = CostFile::load(&path).expect("the reader accepts the file");
    assert_eq!(serde_json::to_value(&file).unwrap(), instance, "reader round trip");
    assert!(file.costs.iter().all(|c| c.name.starts_with("probe.")), "--only probe ran other rows");

    for name in ROWS {
        let measured = file.cost(name);
        let why = file.unavailable.iter().find(|u| u.name == name);
        match (measured, why) {
            (Some(c), None) => {
                assert!(c.samples > 0 && c.ns.median > 0.0, "{name}: {c:?}");
                assert!(out.lines().any(|l| l.starts_with(name)), "{name} not printed");
            }
            (None, Some(u)) => {
                assert!(u.reason.len() > 10, "{name} unavailable without a reason");
                println!("{name} unavailable here: {}", u.reason);
            }
            other => panic!("{name}: measured and unavailable, or neither: {other:?}"),
        }
    }

    if !gcc_runs() {
        let u = file.unavailable.iter().find(|u| u.name == WALLCLOCK).expect("no gcc: wallclock unavailable");
        assert!(u.reason.contains("gcc"), "the reason should name gcc: {}", u.reason);
        println!("gcc does not run here: the probe rows say so ({}); relations not checked", u.reason);
        return;
    }
    // With gcc, the trampoline rows must really run (in-process patching needs no privilege).
    for name in [UNINSTRUMENTED, EMPTY, WALLCLOCK] {
        assert!(file.cost(name).is_some(), "{name} not measured although gcc runs");
    }
    // No order of the medians is asserted: on a shared machine a noisy
    // baseline can exceed a probe's row (the bench compares them instead).
    for name in [EMPTY, WALLCLOCK, COUNTERS] {
        if let Some(c) = file.cost(name) {
            let p = c.path.as_deref().unwrap_or("");
            assert!(p.contains("× the uninstrumented call"), "{name} path lacks its ratio: {p}");
            assert!(p.contains("uprobe+uretprobe nop5") && p.contains("uprobe+uretprobe typical"), "{p}");
        }
    }
    // uftrace -P on the same body, when installed (the test never installs it).
    if uftrace_installed() {
        let c =
            file.cost(UFTRACE).expect("uftrace is installed and gcc runs: probe.uftrace must be measured");
        assert!(c.samples > 0 && c.ns.median > 0.0, "{c:?}");
        let p = c.path.as_deref().unwrap_or("");
        assert!(p.contains("calls recorded, exact") && p.contains("the wallclock probe's added cost"), "{p}");
    } else {
        let u = file
            .unavailable
            .iter()
            .find(|u| u.name == UFTRACE)
            .expect("no uftrace: probe.uftrace unavailable");
        assert!(u.reason.contains("uftrace is not installed"), "{}", u.reason);
        println!("uftrace is not installed here: {}", u.reason);
    }
    // Where the kernel lets us attach uprobes, their counts must be exact.
    for name in [UPROBE_NOP5, UPROBE_TYPICAL] {
        if let Some(c) = file.cost(name) {
            let p = c.path.as_deref().unwrap_or("");
            assert!(p.contains("exact") && !p.contains("NOT exact"), "{name}: {p}");
        }
    }
}

#[test]
fn help_lists_the_probe_rows() {
    let (ok, out) = probe_calibrate(&["--help"]);
    assert!(ok);
    assert!(out.contains("papirus-probe calibrate"), "{out}");
    for name in ROWS.iter().chain(&["baseline.rdtsc", "--quick", "--json"]) {
        assert!(out.contains(name), "--help does not mention {name}");
    }
}

#[test]
fn run_with_a_cost_file_predicts_the_overhead() {
    if !gcc_runs() {
        println!("gcc does not run here: no target program, not checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let costs = dir.path().join("costs.json");
    let (ok, _) = probe_calibrate(&["--quick", "--only", "probe", "--json", costs.to_str().unwrap()]);
    assert!(ok);
    let file = CostFile::load(&costs).unwrap();
    let program =
        papirus_testkit::Cc::new(crate::util::DEMO).arg("-pthread").build(dir.path(), "probe_program");
    let report = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
        .args(["run", "--costs"])
        .arg(&costs)
        .arg("-o")
        .arg(&report)
        .arg("--")
        .arg(&program)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let r: papirus_probe_abi::Report = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let calls: u64 = r.threads.iter().flat_map(|t| &t.functions).map(|f| f.figures.calls).sum();
    // The prediction is a header line of the profile, on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line =
        stderr.lines().find(|l| l.contains("predicted instrumentation overhead")).expect("no prediction");
    let added = file.median_ns(WALLCLOCK).unwrap() - file.median_ns(UNINSTRUMENTED).unwrap();
    assert!(line.contains(&format!(": {calls} calls × {:.1} ns ({WALLCLOCK}", added.max(0.0))), "{line}");

    // A file that is no cost file is refused before the program runs.
    std::fs::write(&costs, "{}").unwrap();
    let bad = Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
        .args(["run", "--costs"])
        .arg(&costs)
        .arg("--")
        .arg(&program)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a papirus cost file"));
    assert!(bad.stdout.is_empty(), "the program ran although the cost file is bad");
}
