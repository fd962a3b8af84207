//! papirus-stat with events the kernel cannot count here: like perf stat,
//! they are shown as `<not supported>` (the rest of their group as
//! `<not counted>`) and the others are counted; a list of which nothing can
//! be counted fails before the command runs.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::util::tool;

/// `papirus-stat ARGS -- sh -c 'touch MARKER'`.
fn stat(args: &[&str], marker: &Path) -> Output {
    tool("papirus-stat").args(args).args(["--", "sh", "-c", "touch \"$0\""]).arg(marker).output().unwrap()
}

/// A scratch directory and the command's marker path in it, where `cycles`
/// cannot be counted (no hardware PMU); `None`, with why, where it can.
fn scratch_where_cycles_is_unsupported() -> Option<(tempfile::TempDir, PathBuf)> {
    let o = tool("papirus-stat").args(["-e", "cycles", "--", "true"]).output().unwrap();
    let why = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        papirus_testkit::skip("cycles counts on this machine: no event here the kernel refuses");
        return None;
    }
    assert!(why.contains("perf_event_open of `cycles` failed"), "{why}");
    let dir = papirus_testkit::scratch();
    let marker = dir.path().join("ran");
    Some((dir, marker))
}

/// The reason lines papirus-stat printed for `cycles`.
fn reasons(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("papirus-stat: perf_event_open of `cycles` failed")).collect()
}

#[test]
fn stat_counts_the_other_events_beside_an_unsupported_one() {
    let Some((dir, marker)) = scratch_where_cycles_is_unsupported() else { return };
    // The table, with the reason printed once over three runs.
    let o = stat(&["-r", "3", "-e", "task-clock,page-faults,context-switches,cycles"], &marker);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "the command's own status\n{err}");
    assert!(marker.exists());
    let why = reasons(&err);
    assert_eq!(why.len(), 1, "{err}");
    assert!(why[0].ends_with("(shown as <not supported>)"), "{err}");
    let line = |name: &str| {
        err.lines().find(|l| l.split_whitespace().any(|w| w == name)).unwrap_or_else(|| panic!("{err}"))
    };
    let row = |name: &str| line(name).split_whitespace().next().unwrap().replace(',', "");
    assert!(line("cycles").trim_start().starts_with("<not supported> "), "{err}");
    assert!(row("task-clock").parse::<f64>().unwrap() > 0.0, "{err}");
    assert!(row("page-faults").parse::<u64>().unwrap() > 0, "{err}");
    // -x, with perf stat's line for an unsupported event.
    let o = stat(&["-x,", "-e", "page-faults,cycles"], &marker);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.lines().any(|l| l == "<not supported>,,cycles,0,100.00,,"), "{err}");
    let faults = err.lines().find(|l| l.contains(",page-faults,")).unwrap_or_else(|| panic!("{err}"));
    assert!(faults.split(',').next().unwrap().parse::<u64>().unwrap() > 0, "{err}");
    // JSON: no value, and perf's word for why.
    let out = dir.path().join("counts.json");
    let o = stat(&["-j", "-o", out.to_str().unwrap(), "-e", "page-faults,cycles"], &marker);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(j["events"][0]["missing"], Value::Null, "{j}");
    assert!(j["events"][0]["value"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["events"][1]["missing"], "<not supported>", "{j}");
    assert_eq!(j["events"][1]["value"], Value::Null, "{j}");
}

#[test]
fn stat_leaves_out_a_group_with_an_unsupported_member() {
    let Some((_dir, marker)) = scratch_where_cycles_is_unsupported() else { return };
    let o = stat(&["-x,", "-e", "{task-clock,cycles},page-faults"], &marker);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let why = reasons(&err);
    assert!(why.len() == 1 && why[0].ends_with("the rest of its group as <not counted>)"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("papirus-stat:")).collect();
    assert_eq!(lines[0], "<not counted>,msec,task-clock,0,100.00,,", "{err}");
    assert_eq!(lines[1], "<not supported>,,cycles,0,100.00,,", "{err}");
    assert!(lines[2].split(',').next().unwrap().parse::<u64>().unwrap() > 0, "{err}");
}

#[test]
fn stat_fails_before_the_command_when_no_event_can_be_counted() {
    let Some((_dir, marker)) = scratch_where_cycles_is_unsupported() else { return };
    let o = stat(&["-e", "cycles,instructions"], &marker);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("papirus-stat: perf_event_open of `cycles` failed"), "{err}");
    assert!(!err.contains("Performance counter stats"), "{err}");
    assert!(!marker.exists(), "the command ran");
}
