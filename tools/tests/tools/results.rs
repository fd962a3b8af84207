//! The results segment end to end: `papirus-probe run` and `attach` on a
//! target built here, the report written by the tool however the target
//! ends, bounded memory with many threads, forks, and nothing of papirus left
//! in a target after detach.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use papirus_probe_abi::{FORMAT_VERSION, Report};
use papirus_testkit::{Built, Cc};

use crate::util::{probe_attach, probe_run};

/// The target, built for one test into a directory of its own.
fn target() -> Built {
    Cc::new(papirus_testkit::target("results_target.c"))
        .args(["-pthread", "-fcf-protection=none"])
        .built("results_target")
}

fn probe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
}

fn read(path: &Path) -> Report {
    let r: Report = serde_json::from_reader(std::fs::File::open(path).unwrap()).unwrap();
    assert_eq!(r.format_version, FORMAT_VERSION);
    r
}

fn calls(r: &Report, name: &str) -> u64 {
    r.total(r.id(name).unwrap_or_else(|| panic!("{name} not in the report"))).figures.calls
}

/// Runs the target `exe` under `run` with a stale report in place; returns
/// the new report and the tool's stderr.
fn run(exe: &Path, dir: &Path, args: &[&str]) -> (Report, String) {
    let out = dir.join("report.json");
    std::fs::write(&out, "stale").unwrap();
    let o = probe_run(
        &out,
        &["-f", "leaf,calls,worker,exiter,spawn_child"],
        [exe.as_os_str()].into_iter().chain(args.iter().map(OsStr::new)),
    );
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    // The target's own status passes on; 125–127 are papirus-probe's failures.
    assert!(!matches!(o.status.code(), None | Some(125..=127)), "{stderr}");
    (read(&out), stderr)
}

#[test]
fn every_end_gets_a_report_of_what_ran() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    for (mode, ended) in [
        ("exit0", "exit code 0"),
        ("exit5", "exit code 5"),
        ("_exit4", "exit code 4"),
        ("abort", "killed by SIGABRT"),
        ("segv", "killed by SIGSEGV"),
        ("exec", "execve, then exit code 0"),
    ] {
        let (r, _) = run(&exe, dir.path(), &[mode]);
        assert_eq!(calls(&r, "leaf"), 1000, "{mode}");
        assert_eq!(calls(&r, "calls"), 1, "{mode}");
        assert_eq!(r.processes.len(), 1, "{mode}");
        assert_eq!(r.processes[0].pid, r.pid);
        assert_eq!(r.processes[0].ended, ended, "{mode}");
        assert!(r.window.duration_ns > 0 && r.window.end_unix_ns >= r.window.start_unix_ns);
    }
}

#[test]
fn sigkill_from_outside_gets_a_report() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    std::fs::write(&out, "stale").unwrap();
    let mut tool = probe()
        .args(["run", "-f", "leaf,calls", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("pause")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(tool.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid: i32 = line.trim().strip_prefix("ready ").expect("the target's first line").parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    // The program's own output: read to its end.
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let o = tool.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + libc::SIGKILL), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read(&out);
    assert_eq!(r.pid as i32, pid);
    assert_eq!(calls(&r, "leaf"), 1000);
    assert_eq!(r.processes[0].ended, "killed by SIGKILL");
}

#[test]
fn forked_children_are_processes_of_their_own() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = run(&exe, dir.path(), &["fork"]);
    assert_eq!(calls(&r, "leaf"), 4 * 1000);
    assert_eq!(calls(&r, "calls"), 4);
    // Called three times in the parent, returned from in the parent and in each child.
    assert_eq!(calls(&r, "spawn_child"), 3);
    assert_eq!(r.total(r.id("spawn_child").unwrap()).figures.exits, 3);
    assert_eq!(r.processes.len(), 4, "{:?}", r.processes);
    for child in &r.processes[1..] {
        assert_eq!(child.parent, r.pid);
        let leaf = r.id("leaf").unwrap();
        let n: u64 = r
            .threads
            .iter()
            .filter(|t| t.pid == child.pid)
            .flat_map(|t| &t.functions)
            .filter(|f| f.id == leaf)
            .map(|f| f.figures.calls)
            .sum();
        assert_eq!(n, 1000, "child {}", child.pid);
    }
}

#[test]
fn thousands_of_short_threads_stay_bounded() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let (r, stderr) = run(&exe, dir.path(), &["threads", "2000"]);
    assert_eq!(calls(&r, "leaf"), 1000 + 2000 * 10);
    assert_eq!(calls(&r, "worker") + calls(&r, "exiter"), 2000);
    // pthread_exit leaves its frames unwound, not open.
    let exiter = r.total(r.id("exiter").unwrap());
    assert_eq!((exiter.figures.exits, exiter.figures.unwound), (0, 1000));
    let folded: u64 = r.threads.iter().map(|t| t.exited_threads).sum();
    assert!(folded >= 2000, "{folded} threads folded");
    let size = std::fs::metadata(dir.path().join("report.json")).unwrap().len();
    let line = stderr.lines().find(|l| l.contains("report written")).unwrap_or("(no write time)");
    eprintln!("2,000 threads under run: report {size} bytes; {line}");
    assert!(size < 1 << 20, "report of {size} bytes");
}

#[test]
fn thread_rss_growth_under_run_is_bounded() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    let o = probe_run(
        &out,
        &["-f", "leaf,calls,worker,exiter"],
        [exe.as_os_str(), "threads".as_ref(), "2000".as_ref()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rss = |stdout: &[u8]| -> Vec<i64> {
        let text = String::from_utf8_lossy(stdout).to_string();
        let line =
            text.lines().find_map(|l| l.strip_prefix("rss ")).expect("the target prints its RSS").to_string();
        line.split(' ').map(|v| v.parse().unwrap()).collect()
    };
    let kb = rss(&o.stdout);
    let plain = rss(&Command::new(&exe).args(["threads", "2000"]).output().unwrap().stdout);
    eprintln!(
        "target RSS over 2,000 threads: {} kB -> {} kB under run; {} kB -> {} kB uninstrumented",
        kb[0], kb[1], plain[0], plain[1]
    );
    assert!(kb[1] - kb[0] < 64 << 10, "RSS grew by {} kB", kb[1] - kb[0]);
}

/// A `loop` target, started plain.
struct Looper(std::process::Child);

impl Looper {
    fn start(exe: &Path) -> Looper {
        let mut c = Command::new(exe).arg("loop").stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        Looper(c)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn maps(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid())).unwrap()
    }
}

/// kB of trampoline pages an attach's summary (its stderr) says stay mapped.
fn stay_kb(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| l.split("unmapped, ").nth(1)?.split(" kB stay").next()?.parse::<u64>().ok())
        .sum()
}

/// kB mapped by papirus' trampoline arenas among `lines` (maps lines).
fn arena_kb(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.contains("/memfd:papirus-probe-trampolines"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?) / 1024)
        })
        .sum()
}

/// The lines of a maps text that are papirus' or could be: anonymous
/// executable mappings and files named papirus (the runtime, the results
/// segment, the trampoline arenas' memfd).
fn papirus_lines(maps: &str) -> Vec<String> {
    maps.lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[1].contains('x')) || l.contains("papirus")
        })
        .map(str::to_string)
        .collect()
}

impl Drop for Looper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn attach(pid: i32, out: &Path, secs: &str) -> std::process::Output {
    probe_attach(pid, &["-f", "leaf,calls"], secs, out)
}

#[test]
fn nothing_stays_after_detach() {
    let dir = tempfile::tempdir().unwrap();
    let exe = target();
    let t = Looper::start(&exe);
    let before = papirus_lines(&t.maps());
    for round in 0..3 {
        let out = dir.path().join(format!("attach{round}.json"));
        let o = attach(t.pid(), &out, "0.5");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r = read(&out);
        assert!(calls(&r, "leaf") > 0);
        assert_eq!(r.processes[0].ended, "detached");
        let maps = t.maps();
        assert!(!maps.contains("papirus-probe-results"), "segment still mapped:\n{maps}");
        // The trampoline arenas are gone but for the pages the summary says
        // stay (a word of a stack points into them), and so is the runtime
        // library: nothing else of papirus is left.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(" kB unmapped"), "{err}");
        assert!(err.contains("probe runtime: unloaded"), "{err}");
        let stays = stay_kb(&err);
        let left: Vec<String> = papirus_lines(&maps).into_iter().filter(|l| !before.contains(l)).collect();
        let (arenas, other): (Vec<String>, Vec<String>) =
            left.into_iter().partition(|l| l.contains("/memfd:papirus-probe-trampolines"));
        assert!(other.is_empty(), "{other:#?}\n{err}");
        assert_eq!(arena_kb(&arenas), stays, "{arenas:#?}\n{err}");
    }
    // Its later end writes nothing anywhere we can see.
    let before: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    drop(t);
    let after: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(before, after);
}

/// A target that already has the runtime (preloaded): each attach takes a
/// reference of its own and gives it back, the loader keeps the library for
/// the preload, the summary says so, and every attach measures.
#[test]
fn a_preloaded_runtime_stays_and_serves_every_attach() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Path::new(env!("CARGO_BIN_EXE_papirus-probe"))
        .parent()
        .unwrap()
        .join("deps/libpapirus_probe_runtime.so");
    let exe = target();
    let mut c =
        Command::new(&exe).arg("loop").env("LD_PRELOAD", &runtime).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let t = Looper(c);
    for round in 0..2 {
        let out = dir.path().join(format!("attach{round}.json"));
        let o = attach(t.pid(), &out, "0.3");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "round {round}: {err}");
        assert!(calls(&read(&out), "leaf") > 0, "round {round}");
        assert!(err.contains("probe runtime: stays loaded: the loader keeps it"), "round {round}: {err}");
        let maps = t.maps();
        assert!(maps.contains("libpapirus_probe_runtime.so"), "the preload went: {maps}");
        assert!(!maps.contains("papirus-probe-results"), "segment still mapped:\n{maps}");
    }
}

/// A stack word that points into a trampoline keeps its page mapped at
/// detach, as the summary says; the next detach, once the word is gone,
/// unmaps it and nothing of the trampolines stays.
#[test]
fn a_page_a_stack_word_points_into_stays_until_the_word_goes() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(&exe).arg("hold").stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let t = Looper(c);
    assert!(lines.next().unwrap().unwrap().starts_with("ready"));
    let before = papirus_lines(&t.maps());
    let new_lines =
        || -> Vec<String> { papirus_lines(&t.maps()).into_iter().filter(|l| !before.contains(l)).collect() };
    let o = attach(t.pid(), &dir.path().join("first.json"), "0.5");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    let held = lines.next().unwrap().unwrap();
    let held = u64::from_str_radix(held.strip_prefix("held ").unwrap(), 16).unwrap();
    let left = new_lines();
    assert!(stay_kb(&err) > 0, "{err}");
    assert_eq!(arena_kb(&left), stay_kb(&err), "{left:#?}\n{err}");
    assert!(left.iter().all(|l| l.contains("/memfd:papirus-probe-trampolines")), "{left:#?}\n{err}");
    let covers = |l: &String| {
        let (a, b) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
        (u64::from_str_radix(a, 16).unwrap()..u64::from_str_radix(b, 16).unwrap()).contains(&held)
    };
    assert!(left.iter().any(covers), "{held:#x} not kept: {left:#?}");
    // The word goes; the next detach unmaps the page as well as its own arenas.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(t.pid()), nix::sys::signal::Signal::SIGUSR1).unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "cleared");
    let o = attach(t.pid(), &dir.path().join("second.json"), "0.5");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert_eq!(stay_kb(&err), 0, "{err}");
    let left = new_lines();
    assert!(left.is_empty(), "{left:#?}\n{err}");
    assert!(calls(&read(&dir.path().join("second.json")), "leaf") > 0, "the target runs on");
}

#[test]
fn a_second_attach_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let exe = target();
    let t = Looper::start(&exe);
    let out1 = dir.path().join("first.json");
    let mut first = probe()
        .args(["attach", &t.pid().to_string(), "-f", "leaf,calls", "--duration", "3", "-o"])
        .arg(&out1)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first session is in place.
    let start = Instant::now();
    while !t.maps().contains("papirus-probe-results") {
        assert!(start.elapsed() < Duration::from_secs(20), "the first attach never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = attach(t.pid(), &dir.path().join("second.json"), "0.2");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(err.contains(&format!("papirus-probe pid {}", first.id())), "{err}");
    assert!(!dir.path().join("second.json").exists());
    let st = first.wait().unwrap();
    assert!(st.success());
    assert!(calls(&read(&out1), "leaf") > 0);
    assert!(!t.maps().contains("papirus-probe-results"));
}

#[test]
fn per_thread_keeps_a_bounded_number_of_ended_threads() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = run(&exe, dir.path(), &["threads", "2000"]);
    let folded_by_default = r.threads.len();
    let out = dir.path().join("per-thread.json");
    let o = probe_run(
        &out,
        &["--per-thread", "-f", "leaf,calls,worker,exiter"],
        [exe.as_os_str(), "threads".as_ref(), "2000".as_ref()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read(&out);
    assert_eq!(calls(&r, "leaf"), 1000 + 2000 * 10);
    let kept = r.threads.iter().filter(|t| t.ended).count();
    let folded: u64 = r.threads.iter().map(|t| t.exited_threads).sum();
    assert_eq!(kept as u64 + folded, 2000, "every ended thread kept or folded");
    assert!(kept > 0 && kept <= 256, "{kept} ended threads kept");
    eprintln!(
        "threads in the report: {folded_by_default} folded (default), {} with --per-thread",
        r.threads.len()
    );
}

fn rss_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn attaches_to_a_thread_churning_target_stay_bounded() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(&exe).arg("churn").stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let t = Looper(c);
    std::thread::sleep(Duration::from_millis(300));
    let start = rss_kb(t.pid());
    for round in 0..3 {
        let out = dir.path().join(format!("churn{round}.json"));
        let o = probe()
            .args(["attach", &t.pid().to_string(), "-f", "leaf,calls,worker,exiter", "--duration", "2", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        let r = read(&out);
        let size = std::fs::metadata(&out).unwrap().len();
        let threads: u64 = r.threads.iter().map(|t| t.exited_threads.max(1)).sum();
        let written = stderr.lines().find(|l| l.contains("report written")).unwrap_or("");
        eprintln!(
            "attach {round}: {threads} threads, report {size} bytes, RSS {} kB; {written}",
            rss_kb(t.pid())
        );
        assert!(threads > 100, "the target made threads meanwhile");
        assert!(size < 1 << 20, "report of {size} bytes");
    }
    let end = rss_kb(t.pid());
    eprintln!("target RSS {start} kB before the attaches, {end} kB after");
    assert!(end < start + (64 << 10), "RSS grew from {start} to {end} kB");
}

#[test]
fn children_forked_during_attach_are_restored() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(&exe).args(["forkloop", "4"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid = c.id() as i32;
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.path().join("fork.json");
    let o = attach(pid, &out, "1");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let r = read(&out);
    eprintln!(
        "{} processes in the report; {}",
        r.processes.len(),
        stderr.lines().filter(|l| l.contains("child")).count()
    );
    assert!(r.processes.len() > 1, "children forked in the window are reported: {:?}", r.processes);
    assert!(r.processes[1..].iter().all(|p| p.parent == pid as u32));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(c.wait().unwrap().success());
    assert!(rest.contains(" bad 0"), "every child computed its sums: {rest}");
}

/// `forkloop` with its children kept up to 50 ms inside the runtime's fork
/// handler's call into libc, after the handler published the child's
/// record (`results_target.c` makes that call wait in its own code while
/// the runtime stays mapped): the children caught there at detach are
/// restored only once they are out of the handler, so every child ends well.
#[test]
fn children_held_inside_the_fork_handler_are_restored_after_it() {
    let exe = Cc::new(papirus_testkit::target("results_target.c"))
        .args(["-pthread", "-fcf-protection=none", "-rdynamic"])
        .built("results_target");
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(&exe).args(["forkloop", "2", "hold"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid = c.id() as i32;
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path().join("hold.json");
    let o = attach(pid, &out, "0.5");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(read(&out).processes.len() > 1, "children forked in the window are reported");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(c.wait().unwrap().success());
    assert!(rest.contains(" bad 0"), "every child ended well: {rest}");
}

#[test]
fn calls_deeper_than_the_shadow_stack_are_counted_and_said() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deep.json");
    let o =
        probe().args(["run", "-f", "rec", "-o"]).arg(&out).arg("--").arg(&exe).arg("deep").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read(&out);
    // The tree holds the 4,096 levels the shadow stack tracks; deeper calls
    // are counted per thread only, so flat figures stay the tree's sums.
    let rec = r.total(r.id("rec").unwrap());
    assert_eq!((rec.figures.calls, rec.figures.exits), (4096, 4096));
    let untimed: u64 = r.threads.iter().map(|t| t.overflow).sum();
    assert_eq!(untimed, 5001 - 4096);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains(&format!(
            "{untimed} calls deeper than the shadow stack: not timed, not in the figures"
        )),
        "{text}"
    );
}

/// Resident kB of a process in papirus' trampoline arenas (unmapped at
/// detach but for pages a word of a stack points into).
fn trampoline_kb(pid: i32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut arena, mut kb) = (false, 0);
    for l in smaps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first().is_some_and(|a| a.contains('-') && a.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            arena = l.contains("/memfd:papirus-probe-trampolines");
        } else if arena && f.first() == Some(&"Rss:") {
            kb += f[1].parse::<u64>().unwrap();
        }
    }
    kb
}

/// A loopback `python3 -m http.server` under a bounded client (one request
/// at a time), attached and detached 10 times with every function of
/// libpython instrumented: no request fails and the server's RSS, counting
/// everything (the runtime library loaded by the first cycle and any
/// trampoline page that stays included), ends within 10 % of where it
/// started; the trampoline pages that stay are exactly those the last
/// summary said stay.
#[test]
fn http_server_survives_ten_attaches_of_libpython() {
    let python = Path::new("/root/.pyenv/versions/3.11.7/bin/python3.11");
    if !python.exists() {
        papirus_testkit::skip(format!("{} is not installed", python.display()));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "papirus\n").unwrap();
    let mut server = Command::new(python)
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.split("port ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    let server = Looper(server);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut ok, mut failed) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let got = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")?;
                    let mut text = String::new();
                    s.read_to_string(&mut text)?;
                    Ok(text)
                });
                match got {
                    Ok(t) if t.starts_with("HTTP/1.0 200") && t.ends_with("papirus\n") => ok += 1,
                    _ => failed += 1,
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (ok, failed)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let start = rss_kb(server.pid());
    let before = papirus_lines(&server.maps());
    let mut stays = 0;
    let mut after_first = 0;
    let mut notes = Vec::new();
    for round in 0..10 {
        let out = dir.path().join("python.json");
        let o = probe_attach(server.pid(), &["-m", "libpython3.11.so.1.0"], "1", &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "round {round}: {err}");
        assert!(read(&out).functions.len() > 1000);
        stays = stay_kb(&err);
        notes.extend(
            err.lines()
                .filter(|l| l.contains("trampolines:") || l.contains("probe runtime:"))
                .map(|l| format!("round {round}: {}", l.trim())),
        );
        assert!(err.contains("probe runtime: unloaded"), "round {round}: {err}");
        if round == 0 {
            after_first = rss_kb(server.pid());
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.join().unwrap();
    let trampolines = trampoline_kb(server.pid());
    let end = rss_kb(server.pid());
    eprintln!(
        "http.server: {ok} requests served, {failed} failed; RSS (everything counted) {start} kB at the start, \
         {after_first} kB after the first cycle, {end} kB after the tenth; of it in trampoline pages {trampolines} kB"
    );
    assert_eq!(failed, 0);
    assert!(ok > 100);
    // Nothing of papirus is left but what the last summary said stays of
    // the trampolines (each detach checks again what the ones before left).
    let left: Vec<String> =
        papirus_lines(&server.maps()).into_iter().filter(|l| !before.contains(l)).collect();
    eprintln!("{notes:#?}\nleft: {left:#?}");
    let (arenas, other): (Vec<String>, Vec<String>) =
        left.into_iter().partition(|l| l.contains("/memfd:papirus-probe-trampolines"));
    assert!(other.is_empty(), "{notes:#?}\n{other:#?}");
    assert_eq!(arena_kb(&arenas), stays, "{notes:#?}\n{arenas:#?}");
    assert!(trampolines <= stays);
    assert!(end * 10 <= start * 11, "RSS grew from {start} to {end} kB over ten cycles");
}

#[test]
fn run_kills_what_it_cannot_instrument() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let static_exe = match Cc::from_text(dir.path(), "static.c", "int main(void) { for (;;) ; }\n")
        .arg("-static")
        .try_build(dir.path(), "static")
    {
        Ok(static_exe) => static_exe,
        Err(e) => {
            papirus_testkit::skip(format!("gcc cannot link a static program here (no static libc): {e}"));
            return;
        }
    };
    let out = dir.path().join("r.json");
    // A static program cannot load the runtime: refused before it is started.
    let o = probe().args(["run", "-f", "main", "-o"]).arg(&out).arg("--").arg(&static_exe).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("statically linked"), "{err}");
    assert!(!out.exists(), "no report for a run that measured nothing");
    // A selection that matches nothing: the program started is killed.
    let o = probe()
        .args(["run", "-f", "no_such_function*", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("was killed"), "{err}");
    assert!(!out.exists(), "no report for a run that measured nothing");
    let pid: i32 = err.split("(pid ").nth(1).and_then(|s| s.split(')').next()).unwrap().parse().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} left running");
}

#[test]
fn a_target_ending_during_attach_still_gets_its_report() {
    let exe = target();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(&exe).args(["forkloop", "1"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let out = dir.path().join("ended.json");
    let o = attach(c.id() as i32, &out, "30");
    let _ = c.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read(&out);
    assert_eq!(r.processes[0].ended, "ended during the measurement");
    assert!(calls(&r, "leaf") > 0);
}
