//! `papirus-probe run`, `report` and `attach` on programs built from the
//! shared targets: exact counts, untouched output, C++ exceptions, repeated attaches.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use std::path::Path;

use papirus_probe_abi as rt;
use papirus_testkit::{Built, Cc};

fn exe(src: &str, out: &str, extra: &[&str]) -> Built {
    Cc::new(crate::util::source(src)).args(extra).built(out)
}

fn probe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
}

fn report(path: &Path) -> rt::Report {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// (calls, exits, unwound) of `name` in one thread.
fn counts(r: &rt::Report, t: &rt::ThreadReport, name: &str) -> [u64; 3] {
    let id = r.id(name).unwrap_or_else(|| panic!("{name} not in the session"));
    t.functions
        .iter()
        .find(|f| f.id == id)
        .map_or([0; 3], |f| [f.figures.calls, f.figures.exits, f.figures.unwound])
}

/// Runs `program` plain and under `papirus-probe run`; returns the report.
fn run_both(program: &Path, json: &str) -> rt::Report {
    run_both_with(program, json, &[])
}

fn run_both_with(program: &Path, json: &str, opts: &[&str]) -> rt::Report {
    let plain = Command::new(program).output().unwrap();
    assert!(plain.status.success());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(json);
    let probed = probe()
        .args(["run", "--per-thread"])
        .args(opts)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(program)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&probed.stdout);
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(stdout, plain, "output changed: nothing of papirus may reach the program's stdout");
    assert!(stderr.contains("papirus-probe report:"), "the profile goes to stderr");
    // Refusals may only be compiler-split cold parts here.
    for line in stderr.lines().filter(|l| l.contains("refused ") && l.contains(" at 0x")) {
        assert!(line.contains(".cold"), "{line}");
    }
    report(&out)
}

#[test]
fn run_counts_every_call_and_keeps_the_output() {
    let program = exe("probe_program.c", "probe_program", &["-pthread"]);
    let r = run_both(&program, "probe_program.json");
    assert_eq!(r.format_version, rt::FORMAT_VERSION);
    assert_eq!(r.threads.len(), 5);
    let main = r.threads.iter().find(|t| i64::from(t.tid) == i64::from(r.pid)).expect("main thread");
    let workers: Vec<_> = r.threads.iter().filter(|t| t.tid != r.pid).collect();
    for w in &workers {
        assert_eq!(counts(&r, w, "f"), [1, 1, 0]);
        assert_eq!(counts(&r, w, "g"), [1000, 1000, 0]);
        assert_eq!(counts(&r, w, "worker"), [1, 1, 0]);
    }
    assert_eq!(counts(&r, main, "main"), [1, 1, 0]);
    assert_eq!(counts(&r, main, "f"), [1, 1, 0]);
    assert_eq!(counts(&r, main, "g"), [1000, 1000, 0]);
    assert_eq!(counts(&r, main, "fib"), [21891, 21891, 0]);
    assert_eq!(counts(&r, main, "three"), [4, 4, 0]);
    assert_eq!(counts(&r, main, "tail_caller"), [1, 1, 0]);
    assert_eq!(counts(&r, main, "tail_callee"), [1, 1, 0]);
    assert_eq!(counts(&r, main, "many"), [1, 1, 0]);
    for n in ["lj1", "lj2", "lj3"] {
        assert_eq!(counts(&r, main, n), [1, 0, 1], "{n} closed by the longjmp");
    }
    let (f, g) = (r.total(r.id("f").unwrap()), r.total(r.id("g").unwrap()));
    assert!(f.figures.incl_ticks >= f.figures.excl_ticks);
    let (calls, incl) = r.edge(r.id("f").unwrap(), r.id("g").unwrap());
    assert_eq!(calls, 5000);
    assert!(f.figures.incl_ticks >= incl && incl == g.figures.incl_ticks);
    assert_eq!(
        r.edge(r.id("main").unwrap(), r.id("three").unwrap()).0,
        4,
        "after the longjmp, main calls three"
    );
    assert_eq!(r.edge(r.id("lj1").unwrap(), r.id("three").unwrap()).0, 0);
    assert!(r.ticks_per_second > 1e8);
}

#[test]
fn counters_probe_reads_the_events_per_function() {
    let program = exe("probe_program.c", "probe_program_counters", &["-pthread"]);
    let r = run_both_with(
        &program,
        "probe_program_counters.json",
        &["--probe", "counters", "--events", "task-clock,page-faults"],
    );
    assert_eq!(r.probe, "counters");
    assert_eq!(r.events, ["task-clock", "page-faults"]);
    let main = r.threads.iter().find(|t| t.tid == r.pid).unwrap();
    if let Some(e) = &main.counters_error {
        papirus_testkit::skip(format!("the kernel refused the counters: {e}"));
        return;
    }
    let get = |n: &str| main.functions.iter().find(|f| f.id == r.id(n).unwrap()).unwrap().clone();
    let touch = get("touch_pages");
    assert!(
        touch.figures.counters_incl[1] >= 400,
        "512 fresh pages touched: {:?}",
        touch.figures.counters_incl
    );
    let m = get("main");
    assert!(
        m.figures.counters_incl[1] >= touch.figures.counters_incl[1],
        "main includes its callees' faults"
    );
    for f in [get("f"), get("fib"), m] {
        assert!(f.figures.counters_incl[0] > 0, "task-clock counted");
        assert!(
            f.figures.counters_excl[0] <= f.figures.counters_incl[0]
                && f.figures.counters_excl[1] <= f.figures.counters_incl[1]
        );
        // Thread CPU time cannot exceed the real time around it (2 ms slack for the reads).
        assert!(f.figures.counters_incl[0] as f64 <= r.ns(f.figures.incl_ticks) + 2e6, "{f:?}");
    }
    for w in r.threads.iter().filter(|t| t.tid != r.pid) {
        let g = w.functions.iter().find(|f| f.id == r.id("g").unwrap()).unwrap();
        assert_eq!(g.figures.calls, 1000);
        assert!(g.figures.counters_incl[0] > 0, "worker threads read their own counters");
    }
}

/// `--events` takes what `papirus-stat -e` takes, resolved the same way:
/// a PAPI preset or spelling the machine counts is counted, one it cannot
/// count fails before the program runs with papirus-stat's own reason.
#[test]
fn counters_probe_events_resolve_as_papirus_stat_resolves_them() {
    let program = exe("probe_program.c", "probe_program_presets", &["-pthread"]);
    let dir = tempfile::tempdir().unwrap();
    for name in ["PAPI_TOT_CYC", "PAPI_TOT_INS", "perf::TASK-CLOCK"] {
        let stat = Command::new(env!("CARGO_BIN_EXE_papirus-stat"))
            .args(["-e", name, "--", "true"])
            .output()
            .unwrap();
        let out = dir.path().join(format!("presets-{name}.json"));
        let probed = probe()
            .args(["run", "--probe", "counters", "--events", name, "-o"])
            .arg(&out)
            .arg("--")
            .arg(&program)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&probed.stderr);
        if stat.status.success() {
            assert!(probed.status.success(), "{name}: papirus-stat counts it, papirus-probe failed: {err}");
            assert_eq!(report(&out).events, [name], "{name}: the report names the event as given");
        } else {
            let stat_err = String::from_utf8_lossy(&stat.stderr);
            let reason = stat_err.trim().trim_start_matches("papirus-stat: ");
            assert!(!reason.is_empty(), "{name}: papirus-stat failed without a reason");
            assert_eq!(probed.status.code(), Some(125), "{name}: {err}");
            assert!(err.contains(reason), "{name}: papirus-stat says `{reason}`, papirus-probe `{err}`");
            assert!(!out.exists(), "{name}: nothing ran, no report");
        }
    }
}

#[test]
fn run_cxx_exceptions_reach_their_catch() {
    let program = exe("probe_program_exc.cpp", "probe_program_exc", &[]);
    let r = run_both(&program, "probe_program_exc.json");
    let t = &r.threads[0];
    assert_eq!(r.threads.len(), 1);
    for n in ["ex1(int)", "ex2(int)", "ex3(int)"] {
        assert_eq!(counts(&r, t, n), [6, 2, 4], "{n}: 4 of 6 calls threw");
    }
    assert_eq!(counts(&r, t, "run_exc(int)"), [6, 6, 0]);
    assert_eq!(counts(&r, t, "main"), [1, 1, 0]);
}

#[test]
fn report_sorts_and_filters() {
    let program = exe("probe_program.c", "probe_program_report", &["-pthread"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probe_report.json");
    let ok = probe()
        .args(["run", "--functions", "fib,three", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&program)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let r = report(&out);
    assert_eq!(r.functions, ["fib", "three"]);
    let text = probe()
        .arg("report")
        .arg(&out)
        .args(["--sort", "calls", "--thread"])
        .arg(r.pid.to_string())
        .output()
        .unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let (fib, three) = (text.find("  fib ").unwrap(), text.find("  three ").unwrap());
    assert!(fib < three, "sorted by calls:\n{text}");
    assert_eq!(text.matches("\nthread ").count(), 1, "one thread:\n{text}");
    let bad = probe().args(["report", "/nonexistent.json"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent.json"));
}

/// Issue 9, acceptance 3: attach for 2 s and detach, 20 times on the
/// same process (PAPIRUS_ATTACH_ROUNDS / PAPIRUS_ATTACH_SECS override).
#[test]
fn attach_repeatedly_then_the_program_finishes_correctly() {
    let rounds: usize =
        std::env::var("PAPIRUS_ATTACH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let secs: f64 = std::env::var("PAPIRUS_ATTACH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(2.0);
    let program = exe("probe_loop.c", "probe_loop", &[]);
    let plain = Command::new(&program).arg("10").output().unwrap();
    let expected_per_round: i64 = String::from_utf8_lossy(&plain.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("total="))
        .unwrap()
        .parse::<i64>()
        .unwrap()
        / 10;
    // Enough rounds to outlast every attach.
    let n = ((rounds as f64 * (secs + 0.5)) / 0.006) as i64 + 200;
    let mut child = Command::new(&program).arg(n.to_string()).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probe_attach.json");
    for round in 0..rounds {
        let st = crate::util::probe_attach(child.id(), &[], &secs.to_string(), &out);
        assert!(st.status.success(), "round {round}: {}", String::from_utf8_lossy(&st.stderr));
        let r = report(&out);
        let f = r.total(r.id("f").unwrap());
        let g = r.total(r.id("g").unwrap());
        assert!(f.figures.calls > 0, "round {round}: f was called while attached");
        // g's calls are f's, give or take the f activations cut by attach and detach.
        assert!(
            g.figures.calls.abs_diff(1000 * f.figures.calls) <= 2000,
            "round {round}: f {} g {}",
            f.figures.calls,
            g.figures.calls
        );
    }
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success());
    assert_eq!(rest, [format!("total={}", expected_per_round * n)]);
}
