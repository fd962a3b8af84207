//! The command-line tools.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::util::{tool, work};

#[test]
fn avail_lists_every_preset_with_a_reason_and_what_the_machine_offers() {
    let out = tool("papirus-avail").arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["format_version"], 1);
    let presets = j["presets"].as_array().unwrap();
    assert_eq!(presets.len(), 110);
    let no_pmu = j["machine"]["no_hardware_reason"].as_str();
    match no_pmu {
        Some(why) => {
            eprintln!("no hardware PMU here: {why}");
            for p in presets {
                let name = p["preset"]["name"].as_str().unwrap();
                assert_eq!(p["available"], false, "{name}");
                let reason = p["reason"].as_str().unwrap_or("");
                assert!(
                    reason.starts_with("no hardware PMU exposed to this machine")
                        || reason.starts_with("no definition for"),
                    "{name}: {reason}"
                );
            }
            let offered = j["offered_instead"].to_string();
            for e in ["task-clock", "page-faults", "context-switches", "msr/tsc/", "tracepoint", "breakpoint"]
            {
                assert!(offered.contains(e), "{e} missing from {offered}");
            }
        }
        None => {
            let avail = presets.iter().filter(|p| p["available"] == true).count();
            eprintln!("this machine has a hardware PMU: {avail} presets available");
            assert!(presets.iter().filter(|p| p["available"] == true).all(|p| !p["definition"].is_null()));
        }
    }
    let text = tool("papirus-avail").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("PAPI_TOT_CYC") && text.contains("Of 110 presets"), "{text}");
}

#[test]
fn avail_shows_one_definition() {
    let out = tool("papirus-avail").args(["-e", "PAPI_BR_PRC"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("0x8000002f") && text.contains("DERIVED_SUB") && text.contains("source:"),
        "{text}"
    );
    let out = tool("papirus-avail").args(["-e", "PAPI_NOPE"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown event `PAPI_NOPE`"));
}

#[test]
fn native_avail_checks_what_counts() {
    let out = tool("papirus-native-avail").args(["--check", "--pmu", "software", "--json"]).output().unwrap();
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = j["events"].as_array().unwrap();
    let tc = ev.iter().find(|e| e["name"] == "task-clock").expect("task-clock listed");
    assert_eq!(tc["counts"], true);
    assert!(tc["code"].as_u64().unwrap() & 0x4000_0000 != 0);
    let text = tool("papirus-native-avail").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("PMU: software") && text.contains("Total events reported"), "{text}");
}

#[test]
fn stat_counts_a_running_process_and_reports_bad_input() {
    let work = work();
    let mut child = Command::new(&work).args(["100", "2000"]).spawn().unwrap();
    // The kernel's own CPU time of the child (ns) around the tool's window.
    let schedstat = |pid: u32| -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    };
    let before = schedstat(child.id());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("counts.json");
    let o = tool("papirus-stat")
        .args(["--json", "-o"])
        .arg(&json)
        .args(["-e", "task-clock,context-switches", "-p", &child.id().to_string(), "--duration", "0.2"])
        .output()
        .unwrap();
    let after = schedstat(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let tc = j["events"][0]["value"].as_f64().unwrap();
    eprintln!(
        "-p for 0.2 s: task-clock {:.1} ms, schedstat over a wider window {:.1} ms",
        tc / 1e6,
        (after - before) / 1e6
    );
    assert!(
        tc > 0.0 && tc <= (after - before) * 1.01 + 1e6,
        "the window's CPU time is within the child's: {tc}"
    );

    let o = tool("papirus-stat").args(["-e", "task-clok", "--", "true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("did you mean `task-clock`"));
    let o = tool("papirus-stat").args(["-e", "task-clock", "-p", "4000000"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no process or thread 4000000"));
}

#[test]
fn stat_refuses_an_untraceable_process() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    // Nobody may not trace init. The tool is run from a copy nobody can
    // reach: the build tree may lie in a directory only root enters.
    let copy = tempfile::tempdir().unwrap();
    let mut cmd = if root {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(copy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = copy.path().join("papirus-stat");
        std::fs::copy(env!("CARGO_BIN_EXE_papirus-stat"), &exe).unwrap();
        let mut cmd = std::process::Command::new(exe);
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        cmd
    } else {
        tool("papirus-stat")
    };
    cmd.args(["-e", "task-clock", "-p", "1", "--duration", "0.01"]);
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not permitted") && err.contains("perf_event_paranoid"), "{err}");
}

/// Every tool but papirus-probe: its path, and arguments that print something.
fn every_tool() -> Vec<(&'static str, Option<PathBuf>, Vec<&'static str>)> {
    let here = Path::new(env!("CARGO_BIN_EXE_papirus-stat"));
    let sibling = |n: &str| Some(here.with_file_name(n)).filter(|p| p.exists());
    vec![
        ("papirus-avail", Some(env!("CARGO_BIN_EXE_papirus-avail").into()), vec!["-a"]),
        (
            "papirus-native-avail",
            Some(env!("CARGO_BIN_EXE_papirus-native-avail").into()),
            vec!["--pmu", "software"],
        ),
        ("papirus-stat", Some(here.into()), vec!["-e", "task-clock", "--", "echo", "counted"]),
        ("papirus-hwinfo", sibling("papirus-hwinfo"), vec![]),
        ("papirus-calibrate", sibling("papirus-calibrate"), vec!["--list"]),
    ]
}

fn no_panic(what: &str, o: &std::process::Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// Criterion 5: /dev/full, a closed stdout and `| head -1` end every tool
/// with a message and status 2, or quietly; never with a panic. A reader
/// that goes away ends a tool by SIGPIPE, as perf ends.
#[test]
fn every_tool_survives_a_full_closed_or_short_stdout() {
    for (name, path, args) in every_tool() {
        let Some(path) = path else {
            papirus_testkit::skip(format!(
                "{name}: not built by this test run (cargo test --workspace builds it)"
            ));
            continue;
        };
        let o = Command::new("sh").arg("-c").arg("exec \"$0\" --version").arg(&path).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).split_whitespace().next(),
            Some(name),
            "--version names {name}"
        );
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let o = Command::new(&path).args(&args).stdout(Stdio::from(full)).output().unwrap();
        no_panic(&format!("{name} >/dev/full"), &o);
        if name != "papirus-stat" {
            assert_eq!(o.status.code(), Some(2), "{name} >/dev/full");
            assert!(String::from_utf8_lossy(&o.stderr).contains("cannot write to standard output"), "{name}");
        }
        let o = Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" >&-")
            .arg(&path)
            .args(&args)
            .output()
            .unwrap();
        no_panic(&format!("{name} >&-"), &o);
        assert_eq!(o.status.code(), Some(2), "{name} >&-: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("standard output is closed"), "{name}");
        let o = Command::new("sh")
            .arg("-c")
            .arg("\"$0\" \"$@\" | head -1")
            .arg(&path)
            .args(&args)
            .output()
            .unwrap();
        no_panic(&format!("{name} | head -1"), &o);
        assert!(o.status.success(), "{name} | head -1");
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1, "{name} | head -1");
    }
}

/// Criterion 5: duration options refuse every edge value with a clear error.
#[test]
fn durations_are_refused_at_every_edge_value() {
    for d in ["1e30", "nan", "inf", "-1", "0", "-inf", "soon"] {
        let o = tool("papirus-stat").args(["-e", "task-clock", "-p", "1", "-d", d]).output().unwrap();
        no_panic(&format!("-d {d}"), &o);
        assert_eq!(o.status.code(), Some(2), "-d {d}");
        let o = tool("papirus-stat").args(["-e", "task-clock", "-I", d, "--", "true"]).output().unwrap();
        no_panic(&format!("-I {d}"), &o);
        assert_eq!(o.status.code(), Some(2), "-I {d}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("milliseconds"), "-I {d}");
    }
}
