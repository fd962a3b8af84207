//! papirus-profile on real programs: the shares of known hot functions,
//! its pprof output read by `go tool pprof` and speedscope, the flame
//! graph rendered by Chromium, `-p PID` on a running program, lost samples
//! under a tiny buffer, and bad input.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use papirus_testkit::{scratch, shared_scratch};

use crate::util::tool;

/// The hot-function target, built once: -O0 with frame pointers (see the source).
fn hot() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        papirus_testkit::Cc::new(papirus_testkit::target("profile_hot.c"))
            .opt("-O0")
            .args(["-fno-omit-frame-pointer", "-pthread"])
            .build(shared_scratch(), "profile_hot")
    })
    .clone()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("papirus-profile runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One recording of the hot target, shared by the tests that read it:
/// `papirus-profile -e task-clock -F 1000 -g -- profile_hot 900` (about a
/// second of CPU time, so about 1,000 samples).
struct Recorded {
    file: PathBuf,
    status: Option<i32>,
    stderr: String,
}

fn recorded() -> &'static Recorded {
    static REC: OnceLock<Recorded> = OnceLock::new();
    REC.get_or_init(|| {
        let file = shared_scratch().join("hot.json");
        let o = run(tool("papirus-profile")
            .args(["-e", "task-clock", "-F", "1000", "-g", "-o"])
            .arg(&file)
            .arg("--")
            .arg(hot())
            .arg("900"));
        Recorded { file, status: o.status.code(), stderr: text(&o.stderr) }
    })
}

fn report(file: &Path, args: &[&str]) -> Output {
    let o = run(tool("papirus-profile").arg("report").arg(file).args(args));
    assert!(o.status.success(), "report {args:?}: {}", text(&o.stderr));
    o
}

/// Leaf function → share of all samples (%), from folded stacks.
fn leaf_shares(folded: &str) -> (HashMap<String, f64>, u64) {
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').expect("count after the last space");
        let n: u64 = n.parse().expect("an integer count");
        *counts.entry(stack.rsplit(';').next().unwrap().to_string()).or_default() += n;
        total += n;
    }
    (counts.into_iter().map(|(k, v)| (k, 100.0 * v as f64 / total as f64)).collect(), total)
}

/// Acceptance 5: with -e task-clock -F 1000 -g, hot_a, hot_b and hot_c carry
/// 60, 30 and 10 % of the samples (±5), under main; the command's exit
/// status passes through; the text report agrees.
#[test]
fn profile_finds_the_known_shares_of_hot_functions() {
    let r = recorded();
    assert_eq!(r.status, Some(3), "the command's own status: {}", r.stderr);
    assert!(r.stderr.contains("samples of task-clock"), "{}", r.stderr);
    let folded = text(&report(&r.file, &["--format", "folded"]).stdout);
    let (shares, total) = leaf_shares(&folded);
    assert!(total >= 500, "about 1,000 samples expected at 1 kHz over a second of CPU, got {total}");
    for (f, want) in [("hot_a", 60.0), ("hot_b", 30.0), ("hot_c", 10.0)] {
        let got = shares.get(f).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= 5.0,
            "{f}: {got:.1} % of {total} samples, expected {want} ± 5\n{folded}"
        );
    }
    // Call chains by frame pointers: every hot function is reached from main.
    for line in folded.lines().filter(|l| l.contains(";hot_")) {
        assert!(line.starts_with("profile_hot;") && line.contains(";main;run;hot_"), "{line}");
    }
    let t = text(&report(&r.file, &[]).stdout);
    assert!(t.contains("# event: task-clock (user+kernel), 1000 Hz, call chains"), "{t}");
    assert!(t.contains("# lost: 0 samples"), "{t}");
    let row = t.lines().find(|l| l.trim_end().ends_with(" hot_a")).expect("a hot_a row");
    let self_pct: f64 = row.split_whitespace().nth(1).unwrap().trim_end_matches('%').parse().unwrap();
    assert!((self_pct - 60.0).abs() <= 5.0, "{row}");
    assert!(t.contains("# Call graph"), "{t}");
    let sorted = text(&report(&r.file, &["--sort", "sym"]).stdout);
    assert!(sorted.lines().any(|l| l.split_whitespace().skip(3).eq(["hot_b"])), "{sorted}");
}

/// Acceptance 5: the pprof file is read by `go tool pprof -top` (Debian's
/// golang-go, installed here) with the same top functions and shares.
#[test]
fn profile_pprof_is_read_by_go_tool_pprof() {
    if let Err(why) =
        papirus_testkit::debian_package("golang-go", || papirus_testkit::runs("go", &["version"]))
    {
        return papirus_testkit::skip(format!("no go tool pprof: {why}"));
    }
    let r = recorded();
    let dir = scratch();
    let pb = dir.path().join("hot.pb.gz");
    report(&r.file, &["--format", "pprof", "-o", pb.to_str().unwrap()]);
    let o = run(Command::new("go")
        .args(["tool", "pprof", "-top", "-symbolize=none", "-sample_index=samples"])
        .arg(&pb)
        .env("HOME", dir.path())
        .env("GOCACHE", dir.path().join("gocache"))
        .env("PPROF_TMPDIR", dir.path()));
    let out = text(&o.stdout);
    assert!(o.status.success(), "go tool pprof: {}{out}", text(&o.stderr));
    // Rows: flat flat% sum% cum cum% name.
    let flat = |name: &str| -> f64 {
        let row = out
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name}: {out}"));
        row.split_whitespace().nth(1).unwrap().trim_end_matches('%').parse().unwrap()
    };
    for (f, want) in [("hot_a", 60.0), ("hot_b", 30.0), ("hot_c", 10.0)] {
        assert!((flat(f) - want).abs() <= 5.0, "{f}: {out}");
    }
    assert!(out.contains("Type: samples"), "{out}");
    // The cpu column carries task-clock's nanoseconds.
    let o = run(Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&pb)
        .env("HOME", dir.path())
        .env("GOCACHE", dir.path().join("gocache")));
    let raw = text(&o.stdout);
    assert!(raw.contains("samples/count cpu/nanoseconds") && raw.contains("thread:[profile_hot]"), "{raw}");
}

/// Acceptance 5: the same pprof file and the folded stacks load in
/// speedscope in headless Chromium with no warning, error or "Unrecognized
/// format" dialog, and the flame graph SVG renders without page errors,
/// one frame per node — all in one browser launch.
#[test]
fn profile_outputs_open_in_speedscope_and_chromium() {
    let r = recorded();
    let dir = scratch();
    let pb = dir.path().join("hot.pb.gz");
    let folded = dir.path().join("hot.collapsedstack.txt");
    let svg = dir.path().join("hot.svg");
    report(&r.file, &["--format", "pprof", "-o", pb.to_str().unwrap()]);
    report(&r.file, &["--format", "folded", "-o", folded.to_str().unwrap()]);
    report(&r.file, &["--format", "flamegraph", "-o", svg.to_str().unwrap()]);
    // Every node of the call tree: each distinct prefix of a folded stack.
    let mut nodes = std::collections::HashSet::new();
    for l in std::fs::read_to_string(&folded).unwrap().lines() {
        let frames: Vec<&str> = l.rsplit_once(' ').unwrap().0.split(';').collect();
        for i in 1..=frames.len() {
            nodes.insert(frames[..i].join(";"));
        }
    }
    let cache = crate::util::viewers();
    let loaded = match papirus_testkit::browser::open(&cache, &[pb.clone(), folded.clone(), svg.clone()]) {
        Ok(l) => l,
        Err(why) => return papirus_testkit::skip(format!("no speedscope/chromium: {why}")),
    };
    for l in &loaded {
        assert!(l.clean(), "{l:?}");
    }
    assert_eq!(loaded[0].title, "hot.pb.gz - speedscope", "{:?}", loaded[0]);
    assert_eq!(loaded[1].title, "hot.collapsedstack.txt - speedscope", "{:?}", loaded[1]);
    assert_eq!(loaded[2].svg_frames, Some(nodes.len() + 1), "one frame per node, and the root `all`");
}

/// Acceptance 5: `-p PID` on a running program with two threads records
/// both threads (by name) and their hot functions, ends after -d, and
/// leaves the program running. (How many samples 2 s give depends on how
/// much CPU the threads get on a shared machine, so no count is asserted;
/// the shares are the command test's.)
#[test]
fn profile_attaches_to_a_running_process() {
    let dir = scratch();
    let mut child = Command::new(hot()).args(["0", "2"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let file = dir.path().join("p.json");
    let o = run(tool("papirus-profile")
        .args(["-F", "1000", "-g", "-d", "2", "-p", &child.id().to_string(), "-o"])
        .arg(&file));
    let alive = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(alive, "the process keeps running after papirus-profile ends");
    let folded = text(&report(&file, &["--format", "folded", "--per-thread"]).stdout);
    let pid = child.id();
    for thread in ["profile_hot", "worker-1"] {
        assert!(
            folded.lines().any(|l| l.starts_with(&format!("{thread}-{pid}/")) && l.contains(";hot_a ")),
            "{thread}: {folded}"
        );
    }
}

/// Acceptance 5: a one-page ring at a high sampling rate loses samples, and
/// papirus-profile says how many (stderr and report), instead of hiding it.
#[test]
fn profile_reports_lost_samples_under_a_tiny_buffer() {
    let dir = scratch();
    let file = dir.path().join("lost.json");
    let o = run(tool("papirus-profile")
        // 1 KiB of stack per sample: three samples fill the 4 KiB ring.
        .args(["-m", "1", "-F", "20000", "--call-graph", "dwarf,1024", "-o"])
        .arg(&file)
        .arg("--")
        .arg(hot())
        .args(["150", "2"]));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let t = text(&report(&file, &[]).stdout);
    let lost: u64 = t
        .lines()
        .find_map(|l| l.strip_prefix("# lost: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{t}"));
    assert!(lost > 0, "a 4 KiB ring at 20 kHz with 1 KiB samples overflows: {t}");
    assert!(err.contains(&format!("{lost} samples lost")), "{err}");
    assert!(t.contains("rings of 1 data pages"), "{t}");
}

/// papirus-profile exits with the command's status, 128+N for signal N.
#[test]
fn profile_exits_with_the_commands_status() {
    let dir = scratch();
    let out = dir.path().join("s.json");
    for (script, code) in [("exit 5", 5), ("kill -SEGV $$", 128 + 11)] {
        let o = run(tool("papirus-profile").arg("-o").arg(&out).args(["--", "sh", "-c", script]));
        assert_eq!(o.status.code(), Some(code), "{script}: {}", text(&o.stderr));
        let t = text(&report(&out, &[]).stdout);
        let how = if code > 128 { "killed by signal 11".to_string() } else { format!("exit status {code}") };
        assert!(t.lines().next().unwrap().ends_with(&format!("{how})")), "{t}");
    }
}

/// The recording replaces a link planted at its name; the link's target is
/// never written.
#[test]
fn profile_never_writes_through_a_link() {
    let dir = scratch();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.path().join("papirus-profile.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let o = run(tool("papirus-profile").current_dir(dir.path()).args(["--", "true"]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    report(&link, &[]);
}

/// Bad input gets a clear error and status 2, never a panic; a hardware
/// event fails with the kernel's reason where no PMU exists.
#[test]
fn profile_refuses_bad_input() {
    let dir = scratch();
    let out = dir.path().join("x.json");
    let fail = |args: &[&str], want: &str| {
        let o = run(tool("papirus-profile").args(args));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    let o = out.to_str().unwrap();
    fail(&["-e", "task-clok", "-o", o, "--", "true"], "task-clock");
    fail(&["-m", "3", "-o", o, "--", "true"], "power of two");
    fail(&["-o", o], "give a command");
    fail(&["-p", "999999999", "-o", o], "no process");
    fail(&["-o", o, "--", "/nonexistent/papirus"], "cannot run");
    fail(&["-e", "task-clock/0", "-o", o, "--", "true"], "≥ 1");
    fail(&["--call-graph", "lbr", "-o", o, "--", "true"], "fp, dwarf or dwarf,SIZE");
    fail(&["--call-graph", "dwarf,12", "-o", o, "--", "true"], "multiple of 8");
    let not_json = dir.path().join("bad.json");
    std::fs::write(&not_json, "{}").unwrap();
    fail(&["report", not_json.to_str().unwrap()], "not a papirus-profile recording");
    fail(&["report", "/dev/zero"], "not a regular file");
    let o2 = run(tool("papirus-profile").args(["-e", "cycles", "-o", o, "--", "true"]));
    if o2.status.success() {
        eprintln!("cycles opened: this machine has a hardware PMU");
    } else {
        let err = text(&o2.stderr);
        assert!(err.contains("PMU") || err.contains("cycles"), "{err}");
        papirus_testkit::skip(format!("hardware sampling: {}", err.trim()));
    }
}
