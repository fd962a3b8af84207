//! papirus-probe on the command line, as a user runs it in a pipeline or CI:
//! the target's stdout and exit status are its own, the selection options,
//! and every subcommand facing a full, closed or early-closed output without
//! panicking. Targets are built by each test with gcc into its own temporary
//! directory.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use papirus_testkit::{Cc, target};
use tempfile::TempDir;

use crate::util::probe_run;

const PROBE: &str = env!("CARGO_BIN_EXE_papirus-probe");

/// papirus-probe's own failure, as `--help` documents it.
const EXIT_FAILED: i32 = 125;
/// An output pipe closed by its reader.
const EXIT_BROKEN_PIPE: i32 = 141;

/// The test program and its library, built into a directory of their own.
struct Built {
    dir: TempDir,
    program: PathBuf,
}

fn build() -> Built {
    let dir = tempfile::tempdir().unwrap();
    Cc::new(target("cli_lib.c")).shared().build(dir.path(), "libcli.so");
    let program = Cc::new(target("cli_program.c"))
        .arg(format!("-L{}", dir.path().display()))
        .arg("-lcli")
        .arg(format!("-Wl,-rpath,{}", dir.path().display()))
        .build(dir.path(), "cli_program");
    Built { dir, program }
}

fn probe() -> Command {
    Command::new(PROBE)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts papirus-probe did not panic, whatever else happened.
fn no_panic(what: &str, o: &Output) {
    let all = text(&o.stdout) + &text(&o.stderr);
    assert!(!all.contains("panicked"), "{what}: {all}");
}

/// Runs papirus-probe with `args` under `sh`, after `redirect` (e.g. `>&-`).
fn under_sh(redirect: &str, args: &[&str]) -> Output {
    let script = format!("exec \"$@\" {redirect}");
    Command::new("sh").arg("-c").arg(script).arg("sh").arg(PROBE).args(args).output().unwrap()
}

/// Reads one line of papirus-probe's `stream` and closes it, as `| head -1` does.
fn head_1(args: &[&str], stderr: bool) -> (Option<i32>, String) {
    let mut cmd = probe();
    cmd.args(args);
    if stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    if stderr {
        let mut r = BufReader::new(child.stderr.take().unwrap());
        let _ = r.read_line(&mut line);
        drop(r);
        let status = child.wait().unwrap();
        return (status.code(), line);
    }
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let _ = r.read_line(&mut line);
    drop(r);
    let o = child.wait_with_output().unwrap();
    (o.status.code(), line + &text(&o.stderr))
}

#[test]
fn xz_output_is_byte_identical_under_instrumentation() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    // Compressible text with some variety, so xz does real work.
    let data: Vec<u8> =
        (0u32..400_000).map(|i| b"papirus probe "[(i % 14) as usize] ^ ((i / 977) as u8 & 3)).collect();
    std::fs::write(&input, data).unwrap();
    let plain = Command::new("xz").arg("-c").arg(&input).output().expect("xz runs");
    assert!(plain.status.success());
    let probed = probe()
        .args(["run", "--module", "liblzma.so.5", "--"])
        .arg("xz")
        .arg("-c")
        .arg(&input)
        .output()
        .unwrap();
    no_panic("run xz", &probed);
    let err = text(&probed.stderr);
    assert_eq!(probed.status.code(), Some(0), "{err}");
    assert!(err.contains("instrumented ") && err.contains("lzma_code"), "{err}");
    assert_eq!(probed.stdout.len(), plain.stdout.len(), "{err}");
    assert!(probed.stdout == plain.stdout, "instrumented xz output differs");
}

#[test]
fn exit_status_is_the_programs_own() {
    let b = build();
    for (how, code) in [("0", 0), ("5", 5), ("segv", 128 + libc::SIGSEGV), ("abort", 128 + libc::SIGABRT)] {
        let o = probe().args(["run", "--"]).arg(&b.program).arg(how).output().unwrap();
        no_panic(how, &o);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{how}: {err}");
        // Nothing of papirus on the program's stdout.
        assert_eq!(text(&o.stdout), "cli_program output\n", "{how}: {err}");
        assert!(err.contains("instrumented 3 functions"), "{how}: {err}");
        // papirus-probe reads the results itself, however the program ended.
        assert!(err.contains("main_twice"), "{how}: {err}");
    }
}

#[test]
fn forked_children_are_listed_as_processes() {
    let b = build();
    let o = probe().args(["run", "--"]).arg(&b.program).arg("fork").output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("\n  process: pid ").count(), 2, "{err}");
}

#[test]
fn papirus_failures_have_their_own_statuses() {
    let b = build();
    let missing = b.dir.path().join("no-such-program");
    let o = probe().args(["run", "--"]).arg(&missing).output().unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o.stderr));
    let script = b.dir.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let o = probe().args(["run", "--"]).arg(&script).output().unwrap();
    assert_eq!(o.status.code(), Some(126), "{}", text(&o.stderr));
    // A module pattern matching nothing names the modules there are.
    let o = probe().args(["run", "--module", "libnosuch", "--"]).arg(&b.program).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(EXIT_FAILED), "{err}");
    assert!(err.contains("`libnosuch`") && err.contains("libcli.so") && err.contains("cli_program"), "{err}");
    assert!(!err.contains("of  matches"), "{err}");
    // A glob matching nothing says which modules were searched.
    let o = probe().args(["run", "-f", "nothing_*", "--"]).arg(&b.program).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(EXIT_FAILED), "{err}");
    assert!(err.contains("no function of cli_program matches nothing_*"), "{err}");
    // Bad arguments are papirus' failure too, not a program's status 2.
    let o = probe().args(["run", "--sort", "bogus", "--"]).arg(&b.program).output().unwrap();
    assert_eq!(o.status.code(), Some(EXIT_FAILED), "{}", text(&o.stderr));
}

#[test]
fn exclude_and_several_modules_in_one_run() {
    let b = build();
    let json = b.dir.path().join("report.json");
    // Repeated, and from a file: long lists do not fit one argument.
    let globs = b.dir.path().join("exclude.txt");
    std::fs::write(&globs, "# leave out\nlib_d\n").unwrap();
    let from_file = format!("@{}", globs.display());
    let opts = ["--module", "main", "--module", "libcli.so", "--exclude", "lib_c", "--exclude", &from_file];
    let o = probe_run(&json, &opts, [&b.program]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let names: Vec<&str> = r["functions"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    for want in ["lib_a", "lib_b", "main", "main_work", "main_twice"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(!names.contains(&"lib_c") && !names.contains(&"lib_d"), "{names:?}");
    let calls = |name: &str| -> u64 {
        let id = names.iter().position(|n| *n == name).unwrap() as u64;
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["functions"].as_array().unwrap())
            .filter(|f| f["id"].as_u64() == Some(id))
            .map(|f| f["calls"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((calls("lib_a"), calls("lib_b"), calls("main_work"), calls("main_twice")), (20, 20, 2, 1));
}

#[test]
fn help_and_version_name_the_tool_and_give_examples() {
    let o = probe().arg("--version").output().unwrap();
    assert!(text(&o.stdout).starts_with("papirus-probe "), "{}", text(&o.stdout));
    for sub in ["", "list", "run", "attach", "report", "demo"] {
        let o = probe().args([sub, "--help"].into_iter().filter(|a| !a.is_empty())).output().unwrap();
        let help = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0));
        assert!(help.contains("Examples:") && help.contains("Exit status:"), "{sub}: {help}");
    }
    let o = under_sh(">/dev/full", &["--version"]);
    no_panic("--version >/dev/full", &o);
    assert_eq!(o.status.code(), Some(EXIT_FAILED), "{}", text(&o.stderr));
}

#[test]
fn attach_durations_are_checked() {
    for bad in ["nan", "inf", "-1", "0", "1e30"] {
        let o = probe().args(["attach", "1", "--duration", bad]).output().unwrap();
        no_panic(bad, &o);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(EXIT_FAILED), "{bad}: {err}");
        assert!(err.contains("seconds"), "{bad}: {err}");
    }
}

#[test]
fn list_and_report_survive_full_closed_and_early_closed_stdout() {
    let b = build();
    let program = b.program.to_str().unwrap();
    let libc = "/lib/x86_64-linux-gnu/libc.so.6";
    let json = b.dir.path().join("r.json");
    let o = probe().args(["run", "-o", json.to_str().unwrap(), "--", program]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let json = json.to_str().unwrap();
    for args in [&["list", libc][..], &["report", json][..]] {
        let o = under_sh(">/dev/full", args);
        no_panic("/dev/full", &o);
        assert_eq!(o.status.code(), Some(EXIT_FAILED), "{args:?}: {}", text(&o.stderr));
        assert!(text(&o.stderr).contains("cannot write to stdout"), "{}", text(&o.stderr));
        let o = under_sh(">&-", args);
        no_panic("closed stdout", &o);
        assert_eq!(o.status.code(), Some(EXIT_FAILED), "{args:?}: {}", text(&o.stderr));
        let (code, out) = head_1(args, false);
        assert!(!out.contains("panicked"), "{args:?}: {out}");
        assert!(matches!(code, Some(0 | EXIT_BROKEN_PIPE)), "{args:?}: {code:?} {out}");
    }
    // libc's listing is far beyond a pipe's buffer: the reader closes it early.
    let (code, out) = head_1(&["list", libc], false);
    assert_eq!(code, Some(EXIT_BROKEN_PIPE), "{out}");
}

#[test]
fn run_and_demo_survive_full_and_closed_stderr() {
    let b = build();
    let program = b.program.to_str().unwrap();
    let o = under_sh("2>/dev/full", &["run", "--", program]);
    no_panic("run 2>/dev/full", &o);
    assert_eq!(o.status.code(), Some(EXIT_FAILED));
    let o = under_sh("2>&-", &["run", "--", program, "5"]);
    no_panic("run 2>&-", &o);
    assert_eq!(o.status.code(), Some(EXIT_FAILED));
    // The program's stdout is its own: closed, it fails on its own terms.
    let o = under_sh(">&-", &["run", "--", program, "5"]);
    no_panic("run >&-", &o);
    let (code, line) = head_1(&["run", "--", program], true);
    assert!(!line.contains("panicked"), "{line}");
    assert!(matches!(code, Some(0 | EXIT_BROKEN_PIPE)), "{code:?} {line}");
    let o = under_sh("2>/dev/full", &["demo"]);
    no_panic("demo 2>/dev/full", &o);
    assert_ne!(o.status.code(), Some(0));
    let o = under_sh(">/dev/full", &["demo", "--top", "3"]);
    no_panic("demo >/dev/full", &o);
}

#[test]
fn attach_survives_full_stderr_and_prints_its_summary() {
    let b = build();
    let mut target = Command::new(&b.program).arg("loop").stdout(Stdio::null()).spawn().unwrap();
    let pid = target.id().to_string();
    let o = under_sh("2>/dev/full", &["attach", &pid, "--duration", "0.2"]);
    no_panic("attach 2>/dev/full", &o);
    assert_eq!(o.status.code(), Some(EXIT_FAILED));
    let o = under_sh("2>&-", &["attach", &pid, "--duration", "0.2"]);
    no_panic("attach 2>&-", &o);
    assert_eq!(o.status.code(), Some(EXIT_FAILED));
    let (code, line) = head_1(&["attach", &pid, "--duration", "0.2"], true);
    assert!(!line.contains("panicked"), "{line}");
    assert!(matches!(code, Some(0 | EXIT_BROKEN_PIPE)), "{code:?} {line}");
    let o = probe().args(["attach", &pid, "--duration", "0.2", "--full"]).output().unwrap();
    no_panic("attach", &o);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(err.contains("instrumented ") && err.contains("main_work"), "{err}");
    // Still running after two attachments.
    assert!(target.try_wait().unwrap().is_none());
    target.kill().unwrap();
    target.wait().unwrap();
}

/// Every printed profile row's (inclusive, exclusive) microseconds, for the
/// wallclock probe (no counter columns): the last six fields of a row are
/// calls, unwound, incl, excl, min, max.
fn printed_rows(report: &str) -> Vec<(String, f64, f64)> {
    let value = |s: &str| match s.trim_end_matches('*') {
        "<0.001" => 0.0005,
        v => v.parse::<f64>().unwrap_or_else(|_| panic!("not a time: {s}")),
    };
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in report.lines() {
        if line.starts_with("  function ") {
            in_table = true;
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !in_table
            || !line.starts_with("  ")
            || fields.len() < 7
            || fields[fields.len() - 6].parse::<u64>().is_err()
        {
            in_table = false;
            continue;
        }
        let n = fields.len();
        rows.push((fields[..n - 6].join(" "), value(fields[n - 4]), value(fields[n - 3])));
    }
    rows
}

fn assert_consistent(what: &str, report: &str) {
    assert!(report.contains("times: microseconds (us)"), "{what}: units not stated: {report}");
    let rows = printed_rows(report);
    assert!(!rows.is_empty(), "{what}: no rows in {report}");
    for (name, incl, excl) in &rows {
        assert!(excl <= incl, "{what}: {name} prints exclusive {excl} > inclusive {incl}: {report}");
    }
}

#[test]
fn printed_reports_keep_inclusive_above_exclusive() {
    let dir = tempfile::tempdir().unwrap();
    let program = Cc::new(crate::util::DEMO).arg("-pthread").build(dir.path(), "probe_program");
    // Recursion, longjmp and threads.
    let o = probe().args(["run", "--full", "--wide", "--"]).arg(&program).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_consistent("probe_program", &err);
    assert!(err.contains("all threads (sums across threads"), "{err}");
    assert!(err.contains("fib -> fib:") && err.contains("recursive"), "{err}");
    assert!(err.contains("\n  window: ") && err.contains(" s, Unix time "), "{err}");
    // An attach window: activations open when it begins and ends.
    let b = build();
    let mut target = Command::new(&b.program).arg("loop").stdout(Stdio::null()).spawn().unwrap();
    let o =
        probe().args(["attach", &target.id().to_string(), "--duration", "0.3", "--full"]).output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_consistent("attach window", &err);
    assert!(err.contains("\n  window: ") && err.contains("detached, left running"), "{err}");
}

#[test]
fn probe_cost_is_shown_and_subtracted() {
    let b = build();
    let dir = b.dir.path();
    let costs = dir.join("costs.json");
    // calibrate builds its probe target under TMPDIR and does not always remove it: keep it in ours.
    let o = probe()
        .args(["calibrate", "--quick", "--only", "probe", "--json"])
        .arg(&costs)
        .env("TMPDIR", dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let json = dir.join("r.json");
    let o =
        probe_run(&json, &["--module", "main,libcli.so", "--costs", costs.to_str().unwrap()], [&b.program]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("ns added per instrumented call") && err.contains("predicted"), "{err}");
    let report = |subtract: bool| {
        let mut cmd = probe();
        cmd.arg("report").arg(&json).arg("--costs").arg(&costs);
        if subtract {
            cmd.arg("--subtract-cost");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        assert_consistent("report", &out);
        printed_rows(&out)
    };
    let (kept, subtracted) = (report(false), report(true));
    assert_eq!(kept.len(), subtracted.len());
    let incl = |rows: &[(String, f64, f64)], name: &str| rows.iter().find(|r| r.0 == name).unwrap().1;
    // main_work calls four instrumented functions ten times each, twice.
    assert!(incl(&subtracted, "main_work") < incl(&kept, "main_work"), "{kept:?} {subtracted:?}");
    // One thread, so one row per function: nothing grows by subtracting.
    for k in &kept {
        let s = subtracted.iter().find(|r| r.0 == k.0).unwrap();
        assert!(s.1 <= k.1 && s.2 <= k.2, "{k:?} {s:?}");
    }
}

#[test]
fn libc_summary_is_short_and_printed_before_the_program_runs() {
    let b = build();
    let o = probe().args(["run", "--module", "libc.so.6", "--"]).arg(&b.program).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let refusals = err.lines().filter(|l| l.starts_with("papirus-probe: refused")).count();
    // Thousands of functions, a few dozen refusal reasons at most; aliases are patched once.
    assert!(refusals < 40, "{refusals} refusal lines: {err}");
    assert!(!err.contains("an alias at the same address"), "{err}");
    let count = err.lines().find(|l| l.starts_with("papirus-probe: instrumented ")).expect("count line");
    let n: u64 = count.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(n > 1000, "{count}");
    // Printed while patching, before the program's own output (one stream for both).
    let program = b.program.to_str().unwrap();
    let o = under_sh("2>&1", &["run", "--module", "libc.so.6", "--", program]);
    let both = text(&o.stdout);
    let (count, output) = (both.find("papirus-probe: instrumented "), both.find("cli_program output"));
    assert!(count.is_some() && output.is_some() && count < output, "{both}");
}

#[test]
fn attach_to_another_users_process_without_output_file() {
    // /proc/self belongs to the effective user.
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) != 0 {
        papirus_testkit::skip("starting a process as another user needs root (euid is not 0)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let b = build();
    std::fs::set_permissions(b.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = 65534;
    let mut target =
        Command::new(&b.program).arg("loop").uid(nobody).gid(nobody).stdout(Stdio::null()).spawn().unwrap();
    let o = probe().args(["attach", &target.id().to_string(), "--duration", "0.2"]).output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("main_work"), "{err}");
}
