//! The papirus-calibrate binary end to end: `--validate --quick` has no
//! FAIL line, and `--quick --json` writes a cost file that validates against
//! the documented schema and round-trips through the library reader.

use std::process::Command;

use papirus_calibrate::{CostFile, Registry};

use crate::util::{calibration, cost_file};

fn calibrate(args: &[&str]) -> (bool, String) {
    calibration(Command::new(env!("CARGO_BIN_EXE_papirus-calibrate")), args)
}

#[test]
fn validate_quick_has_no_failing_check() {
    let (ok, out) = calibrate(&["--validate", "--quick"]);
    let lines: Vec<&str> =
        out.lines().filter(|l| ["PASS", "FAIL", "SKIP"].iter().any(|t| l.starts_with(t))).collect();
    assert_eq!(lines.len(), 12, "one line per check");
    let fails: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(fails.is_empty(), "failing checks: {fails:#?}");
    assert!(ok, "exit status must be 0 without FAIL");
    for l in lines.iter().filter(|l| l.starts_with("SKIP")) {
        let reason = l.split_once(": ").map_or("", |(_, r)| r);
        assert!(reason.len() > 10, "a SKIP without its reason: {l}");
    }
    // These need no hardware PMU, so they must really run here.
    for name in ["breakpoint hits", "page-faults of K", "task-clock vs", "TSC real time", "virtual time vs"] {
        assert!(lines.iter().any(|l| l.starts_with("PASS") && l.contains(name)), "`{name}` did not pass");
    }
}

#[test]
fn quick_json_validates_against_the_schema_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("costs.json");
    let (ok, _) = calibrate(&["--quick", "-d", "8", "--json", path.to_str().unwrap()]);
    assert!(ok);
    let (instance, validator) = cost_file(&path);
    // The schema really constrains: a cost without its cycles is rejected.
    let mut broken = instance.clone();
    broken["costs"][0].as_object_mut().unwrap().remove("cycles");
    assert!(!validator.is_valid(&broken), "the schema accepts a cost without cycles");

    let file = CostFile::load(&path).expect("the reader accepts the file");
    assert_eq!(serde_json::to_value(&file).unwrap(), instance, "reader round trip");
    // Every built-in row is there: measured, or unavailable with its reason.
    for (name, _) in Registry::builtin().rows() {
        let measured = file.costs.iter().any(|c| c.name.starts_with(name));
        let why = file.unavailable.iter().find(|u| u.name == name);
        assert!(measured || why.is_some_and(|u| !u.reason.is_empty()), "row {name} missing");
    }
    for c in &file.costs {
        assert_eq!(c.histogram.as_ref().map(Vec::len), Some(8), "{} has no 8-bin histogram", c.name);
    }
    let read = file.cost("counter.read.syscall.1").expect("read() row");
    assert_eq!(read.path.as_deref(), Some("read()"));
    assert!(file.cost("counter.read.user.1").and_then(|c| c.path.as_deref()).is_some());
}

#[test]
fn help_explains_rows_and_options() {
    let (ok, out) = calibrate(&["--help"]);
    assert!(ok);
    for s in
        ["--json", "--histogram", "--cpu", "--quick", "--validate", "baseline.rdtsc", "paradyn.predicate"]
    {
        assert!(out.contains(s), "--help does not mention {s}");
    }
}

#[test]
fn a_bad_cpu_is_an_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_papirus-calibrate"))
        .args(["--quick", "--only", "baseline.loop", "--cpu", "100000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cpu 100000"));
}
