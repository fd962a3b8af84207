//! The command-line tools.

use std::process::Command;

use serde_json::Value;

use crate::util::{serial, tool, work};

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

/// `perf stat -x,` output: value per event name.
fn perf_values(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() > 3).then(|| (f[2].to_string(), f[0].parse().ok()))?.1.map(|v| (f[2].to_string(), v))
        })
        .collect()
}

fn find_perf() -> Option<String> {
    let have = |p: &str| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
    if have("perf") {
        return Some("perf".into());
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        eprintln!("SKIP: perf is not installed and installing linux-perf needs root");
        return None;
    }
    let ok = Command::new("apt-get").arg("update").status().is_ok_and(|s| s.success())
        && Command::new("apt-get").args(["install", "-y", "linux-perf"]).status().is_ok_and(|s| s.success());
    if ok && have("perf") {
        Some("perf".into())
    } else {
        eprintln!("SKIP: perf is missing and `apt-get install -y linux-perf` did not provide it");
        None
    }
}

#[test]
fn stat_agrees_with_perf_stat() {
    let _g = serial();
    let Some(perf) = find_perf() else { return };
    let events = "task-clock,page-faults,context-switches,msr/tsc/";
    let prog = work();
    let args = ["20000", "150"];
    let mut best: Option<(f64, f64)> = None;
    for round in 0..3 {
        let p = Command::new(&perf)
            .args(["stat", "-x,", "-e", events, "--"])
            .arg(&prog)
            .args(args)
            .output()
            .unwrap();
        let perf_err = String::from_utf8_lossy(&p.stderr).to_string();
        if !p.status.success() {
            eprintln!("SKIP: perf stat failed here: {perf_err}");
            return;
        }
        let pv = perf_values(&perf_err);
        let get = |n: &str| pv.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
        let (Some(p_tc), Some(p_pf)) = (get("task-clock"), get("page-faults")) else {
            panic!("cannot parse perf stat output: {perf_err}");
        };
        let o =
            tool("papirus-stat").args(["--json", "-e", events, "--"]).arg(&prog).args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        let ours = |n: &str| {
            j["events"].as_array().unwrap().iter().find(|e| e["name"] == n).unwrap()["value"]
                .as_f64()
                .unwrap()
        };
        // perf prints task-clock in msec; papirus keeps nanoseconds.
        let (tc, pf) = (ours("task-clock") / 1e6, ours("page-faults"));
        let tc_err = (tc - p_tc).abs() / p_tc;
        let pf_err = (pf - p_pf).abs() / p_pf;
        eprintln!(
            "round {round}: task-clock {tc:.2} ms vs perf {p_tc:.2} ms ({:.2}%), page-faults {pf} vs perf {p_pf} ({:.2}%), msr/tsc {} , cs {}",
            tc_err * 100.0,
            pf_err * 100.0,
            ours("msr/tsc/"),
            ours("context-switches")
        );
        assert!(ours("msr/tsc/") > 0.0);
        if best.is_none_or(|(t, f)| tc_err.max(f * 5.0) < t.max(f * 5.0)) {
            best = Some((tc_err, pf_err));
        }
        if tc_err < 0.10 && pf_err < 0.02 {
            break;
        }
    }
    let (tc_err, pf_err) = best.unwrap();
    assert!(pf_err < 0.02, "page-faults differ from perf stat by {:.2}%", pf_err * 100.0);
    assert!(tc_err < 0.10, "task-clock differs from perf stat by {:.2}%", tc_err * 100.0);
}

#[test]
fn stat_counts_a_running_process_and_reports_bad_input() {
    let _g = serial();
    let mut child = Command::new(work()).args(["100", "2000"]).spawn().unwrap();
    // The kernel's own CPU time of the child (ns) around the tool's window.
    let schedstat = |pid: u32| -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    };
    let before = schedstat(child.id());
    let o = tool("papirus-stat")
        .args([
            "--json",
            "-e",
            "task-clock,context-switches",
            "-p",
            &child.id().to_string(),
            "--duration",
            "0.2",
        ])
        .output()
        .unwrap();
    let after = schedstat(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
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
    let mut cmd = tool("papirus-stat");
    cmd.args(["-e", "task-clock", "-p", "1", "--duration", "0.01"]);
    if root {
        // Drop to nobody: it may not trace init.
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not permitted") && err.contains("perf_event_paranoid"), "{err}");
}
