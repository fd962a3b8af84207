//! papirus-probe without CAP_SYS_ADMIN against a target whose seccomp filter
//! kills on mprotect: refused before anything is touched, the target lives.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use papirus_testkit::scratch;

use crate::util::probe;

#[test]
fn seccomp_target_refused_without_cap_sys_admin() {
    let dir = scratch();
    let exe =
        papirus_testkit::Cc::new(papirus_testkit::target("seccomp_mprotect.c")).build(dir.path(), "seccomp");
    let mut child = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let maps_before = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let report = dir.path().join("report.json");
    let out = Command::new("setpriv")
        .args(["--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"])
        .arg(probe())
        .args(["attach", &pid.to_string(), "--duration", "0.1", "-o"])
        .arg(&report)
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "papirus-probe without CAP_SYS_ADMIN attached: {stderr}");
    assert!(stderr.contains("seccomp") && stderr.contains("CAP_SYS_ADMIN"), "{stderr}");
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap(), maps_before, "nothing mapped");
    assert!(!report.exists());
    stdin.write_all(b"two\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "two");
    drop(stdin);
    let st = child.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}
