//! papirus-hwinfo's two outputs and its refusal of a bad option.

use std::process::Command;

#[test]
fn hwinfo_tool_prints_json_and_a_table() {
    let exe = env!("CARGO_BIN_EXE_papirus-hwinfo");
    let out = Command::new(exe).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["format_version"], 1);
    assert!(v["vendor"].is_string() && v["counters"]["general_purpose"].is_u64());
    let out = Command::new(exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("vendor") && text.contains("TSC frequency") && text.contains("hardware counters"));
    let bad = Command::new(exe).arg("--bogus").output().unwrap();
    assert!(!bad.status.success());
}
