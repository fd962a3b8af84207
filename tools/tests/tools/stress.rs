//! The probe tool against a target that creates threads, forks, execs, switches
//! coroutines, longjmps, takes a 1 kHz SIGALRM (also on a sigaltstack) and
//! sleeps and reads while being attached and detached over and over
//! (`tests/targets/stress.c`; each mode verifies its own values and reports any
//! EINTR and any sleep cut short). Then the tool is killed at random moments
//! during attach: the target must survive, and after SIGINT, SIGTERM or SIGHUP
//! its code must be byte-identical to its file.
//!
//! `PAPIRUS_STRESS_ROUNDS` (default 3) sets the attach/detach rounds per mode
//! (`PAPIRUS_STRESS_MODES=fork,exec` runs only those modes),
//! `PAPIRUS_KILL_ROUNDS` (default 4) the kills per signal and kind of attach.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use papirus_testkit::{Cc, target};

const PROBE: &str = env!("CARGO_BIN_EXE_papirus-probe");

fn rounds(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn build(dir: &Path) -> PathBuf {
    Cc::new(target("stress.c")).opt("-O1").arg("-pthread").build(dir, "stress")
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
    let only = std::env::var("PAPIRUS_STRESS_MODES").unwrap_or_default();
    let modes = ["threads", "fork", "vfork", "exec", "coro", "longjmp", "alarm", "altstack", "sleep", "read"];
    for mode in modes.into_iter().filter(|m| only.is_empty() || only.split(',').any(|o| o == *m)) {
        let s = Stress::start(&exe, &[mode]);
        let mut raced = 0;
        for round in 0..n {
            let image = image_of(s.pid());
            let out = attach_cmd(s.pid(), &report, Some("0.02")).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("panicked"), "{mode} round {round}: {err}");
            // An exec while attached is noticed and said (whatever phase it
            // overtook: no timeout, no other error) and leaves the new image
            // alone; the verdict below checks the target came out whole.
            let exec_seen = mode == "exec" && err.contains("called execve") && image_of(s.pid()) != image;
            raced += usize::from(exec_seen && !out.status.success());
            assert!(out.status.success() || exec_seen, "{mode} round {round}: papirus-probe failed:\n{err}");
        }
        if raced > 0 {
            println!("{mode}: {raced} of {n} attaches overtaken by an execve stopped, saying so");
        }
        let (verdict, status) = s.finish();
        assert_all_ok(&[mode], &verdict, status, &format!("{mode} after {n} attaches"));
    }
    println!("{n} attach/detach rounds per mode: {:.1} s", t0.elapsed().as_secs_f64());
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

/// `main` and a coroutine function switched to with `swapcontext`, both
/// instrumented under `run`. When `main` returns, the innermost shadow-stack
/// activation is the suspended coroutine's (its slot lies on the coroutine's
/// stack, beyond the runtime's reap window); the exit hook must close `main`'s
/// own activation, found by its return slot, not the coroutine's, whose real
/// return address (`__start_context`) would call `setcontext` on garbage.
#[test]
fn run_swapcontext_main_and_coroutine_instrumented() {
    let dir = tempfile::tempdir().unwrap();
    let exe = Cc::from_text(
        dir.path(),
        "coro.c",
        r#"#include <stdio.h>
#include <ucontext.h>
static ucontext_t mc, cc;
static long v;
__attribute__((noinline)) void coro(void) { for (long i = 0;; i++) { v = i * 2; swapcontext(&cc, &mc); } }
int main(void) {
    static char stack[65536];
    getcontext(&cc);
    cc.uc_stack.ss_sp = stack;
    cc.uc_stack.ss_size = sizeof stack;
    cc.uc_link = 0;
    makecontext(&cc, coro, 0);
    long sum = 0;
    for (int i = 0; i < 1000; i++) { swapcontext(&mc, &cc); sum += v; }
    printf("sum %ld\n", sum);
    return sum == 999000 ? 0 : 1;
}
"#,
    )
    .opt("-O1")
    .build(dir.path(), "coro");
    let out = Command::new(PROBE)
        .args(["run", "-f", "main,coro", "-o"])
        .arg(dir.path().join("report.json"))
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(String::from_utf8_lossy(&out.stdout).contains("sum 999000"), "{err}");
    assert!(err.contains("exit code 0"), "{err}");
}

/// The image process `pid` runs: its AT_RANDOM bytes' address and the start of
/// its auxiliary vector, new at every execve.
fn image_of(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/auxv")).unwrap_or_default()
}

/// The main program's executable mapping in `pid` compared with the same bytes
/// of its file: `None` when identical, else the first differing address.
fn text_differs(pid: i32, exe: &Path) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let file = std::fs::read(exe).unwrap();
    let exe_name = exe.to_str().unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    for line in maps.lines().filter(|l| l.ends_with(exe_name)) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if !f[1].contains('x') {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
        let off = u64::from_str_radix(f[2], 16).unwrap() as usize;
        let len = ((end - start) as usize).min(file.len().saturating_sub(off));
        let mut live = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut live, start).unwrap();
        if let Some(i) = live.iter().zip(&file[off..off + len]).position(|(a, b)| a != b) {
            return Some(start + i as u64);
        }
    }
    None
}

/// Each thread's id, state and where it is (`/proc/PID/task/TID/stat` and `syscall`).
fn task_states(pid: i32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return "none".into() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let tid = e.file_name().to_string_lossy().to_string();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map_or("?", |(_, r)| &r[..1]).to_string();
        let sys = std::fs::read_to_string(e.path().join("syscall")).unwrap_or_default();
        out.push(format!("{tid} {state} [{}]", sys.trim()));
    }
    out.join(", ")
}

fn gone_now(pid: i32) -> bool {
    status_field(pid, "State").is_none_or(|s| s.starts_with('Z'))
}

fn status_field(pid: i32, name: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

/// Alive, not a zombie, and (within a second) no longer traced. When it has
/// ended, says how (exit status or signal) and what it printed last.
fn assert_alive_untraced(s: &mut Stress, what: &str) {
    let pid = s.pid();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let state = status_field(pid, "State").unwrap_or_default();
        if state.is_empty() || state.starts_with('Z') {
            // A zombie leader may be alone (its process ended) or outlived by its threads.
            std::thread::sleep(Duration::from_millis(200));
            let tasks = task_states(pid);
            let status = match s.child.try_wait() {
                Ok(Some(st)) => {
                    let mut rest = String::new();
                    let _ = s.out.read_to_string(&mut rest);
                    format!("process ended: {st}; its last output:\n{rest}")
                }
                Ok(None) => "process still running".to_string(),
                Err(e) => e.to_string(),
            };
            panic!("{what}: target gone ({state:?}); threads {tasks}; {status}");
        }
        if status_field(pid, "TracerPid").as_deref() == Some("0") {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still traced");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the tool, killing it after 30 s (a hang is a failure).
fn wait_tool(mut tool: Child, what: &str) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = tool.try_wait().unwrap() {
            let mut err = String::new();
            tool.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (st, err);
        }
        if Instant::now() > deadline {
            let _ = tool.kill();
            panic!("{what}: papirus-probe hangs");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A small xorshift generator: random kill moments, the seed printed for replay.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// SIGINT, SIGTERM, SIGHUP (with and without --duration) and SIGKILL sent to
/// papirus-probe at random moments of an attach: the target always survives
/// and computes correctly; after the catchable ones its code equals its file.
#[test]
fn killing_the_tool_never_harms_the_target() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let report = dir.path().join("report.json");
    let n = rounds("PAPIRUS_KILL_ROUNDS", 4);
    let modes = ["threads", "longjmp", "sleep", "read"];
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("kill moments seed {seed:#x}");
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let mut s = Stress::start(&exe, &modes);
    let pid = s.pid();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        for duration in [Some("0.2"), None] {
            for round in 0..n {
                let what = format!("{sig} round {round} duration {duration:?}");
                let tool = attach_cmd(pid, &report, duration).spawn().unwrap();
                // Up to 0.6 s: from before the tool blocks signals to past the end of --duration 0.2.
                std::thread::sleep(Duration::from_micros(rng.below(600_000)));
                let _ = kill(Pid::from_raw(tool.id() as i32), sig);
                let (st, err) = wait_tool(tool, &what);
                assert!(!err.contains("panicked"), "{what}: {err}");
                if gone_now(pid) {
                    eprintln!("{what}: tool ended {st}: {err}");
                }
                assert_alive_untraced(&mut s, &what);
                assert_eq!(
                    text_differs(pid, &exe),
                    None,
                    "{what}: code left changed; tool ended {st}: {err}"
                );
            }
        }
    }
    let (verdict, status) = s.finish();
    assert_all_ok(&modes, &verdict, status, "after catchable signals");
    // SIGKILL: a fresh target each time, since a killed tool may leave its patches.
    for round in 0..n {
        let what = format!("SIGKILL round {round}");
        let mut s = Stress::start(&exe, &modes);
        let pid = s.pid();
        let tool = attach_cmd(pid, &report, None).spawn().unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(600_000)));
        let _ = kill(Pid::from_raw(tool.id() as i32), Signal::SIGKILL);
        wait_tool(tool, &what);
        assert_alive_untraced(&mut s, &what);
        // Let it run on whatever the tool left, then check its values.
        std::thread::sleep(Duration::from_millis(100));
        let (verdict, status) = s.finish();
        assert_all_ok(&modes, &verdict, status, &what);
    }
    println!(
        "{} kills ({n} each of SIGINT, SIGTERM, SIGHUP with and without --duration, {n} SIGKILL): \
         the target survived every one with correct values, its code the file's after each catchable one; {:.1} s",
        7 * n,
        t0.elapsed().as_secs_f64()
    );
}

/// A thread's first instrumented call registers it, and registering calls
/// into libc (`__cxa_thread_atexit_impl`, which waits for the loader's lock)
/// before the hook uses its new slot. Here that lock is held by a library
/// constructor that sleeps while the thread registers, so the thread sits in
/// libc, with the runtime's frames below it, when papirus detaches: the
/// session must not end (its segment unmapped) until the thread has left the
/// runtime, or the thread faults on its slot once the lock is free.
#[test]
fn detach_waits_for_a_thread_registering_inside_libc() {
    let dir = tempfile::tempdir().unwrap();
    let slow = "#include <time.h>\n__attribute__((constructor)) static void slow(void) {\n    struct timespec d = {0, 400 * 1000 * 1000};\n    while (nanosleep(&d, &d)) {}\n}\n";
    let lib = Cc::from_text(dir.path(), "slow.c", slow).shared().build(dir.path(), "libslow.so");
    let exe = Cc::from_text(
        dir.path(),
        "late.c",
        r#"#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
__attribute__((noinline)) long first_call(long x) { return x * 3 + 1; }
static void *loader(void *lib) { return dlopen(lib, RTLD_NOW); }
static void *late(void *a) { return (void *)first_call((long)a); }
int main(int argc, char **argv) {
    char line[16];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    pthread_t a, b;
    pthread_create(&a, 0, loader, argv[1]);
    struct timespec d = {0, 30 * 1000 * 1000};
    nanosleep(&d, 0);
    /* Registers on its first call while the constructor holds the loader's lock. */
    pthread_create(&b, 0, late, (void *)13);
    void *r, *h;
    pthread_join(b, &r);
    pthread_join(a, &h);
    printf("%s %ld\n", h ? "loaded" : "not loaded", (long)r);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    return (long)r == 40 ? 0 : 1;
}
"#,
    )
    .opt("-O1")
    .args(["-pthread", "-ldl"])
    .build(dir.path(), "late");
    let report = dir.path().join("report.json");
    for round in 0..3 {
        let mut child =
            Command::new(&exe).arg(&lib).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let pid = child.id() as i32;
        let mut tool = attach_cmd(pid, &report, Some("0.1"));
        tool.args(["-f", "first_call"]);
        let mut tool = tool.spawn().unwrap();
        // Patched once the tool prints what it instrumented; then start the threads.
        let mut err = BufReader::new(tool.stderr.take().unwrap());
        let mut said = String::new();
        while err.read_line(&mut said).unwrap() > 0 && !said.contains("instrumented") {}
        std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        let st = tool.wait().unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        drop(stdin);
        let status = child.wait().unwrap();
        assert!(
            status.success() && line.trim() == "loaded 40",
            "round {round}: target ended with {status} ({line:?}); tool ended {st}:\n{said}{rest}"
        );
    }
}

/// The counters probe reads an event without a user-space path
/// (`page-faults`) with `read(2)`, from the hooks: the thread's PC is then
/// in libc while it will still write its slot. Here `read` is the program's
/// own, slow for every descriptor but stdin, so the thread sits in it when
/// papirus detaches: the session must not end until the thread is back out
/// of the runtime.
#[test]
fn detach_waits_for_a_thread_reading_its_counters_in_libc() {
    let dir = tempfile::tempdir().unwrap();
    let exe = Cc::from_text(
        dir.path(),
        "slowread.c",
        r#"#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* Every read but stdin's takes 60 ms (the counters reader's read(2) lands here). */
ssize_t read(int fd, void *buf, size_t n) {
    if (fd > 2) {
        struct timespec d = {0, 60 * 1000 * 1000};
        while (nanosleep(&d, &d)) {}
    }
    return syscall(SYS_read, fd, buf, n);
}
__attribute__((noinline)) long first_call(long x) { return x * 3 + 1; }
static volatile int stop;
static void *caller(void *a) {
    long sum = 0;
    for (long i = 0; !stop; i++) sum += first_call(i) - (i * 3 + 1);
    return (void *)sum;
}
int main(void) {
    char line[16];
    printf("ready\n");
    fflush(stdout);
    pthread_t t;
    pthread_create(&t, 0, caller, 0);
    while (fgets(line, sizeof line, stdin)) {}
    stop = 1;
    void *r;
    pthread_join(t, &r);
    printf("%s\n", r ? "wrong" : "right");
    return r != 0;
}
"#,
    )
    .opt("-O1")
    .args(["-pthread", "-rdynamic"])
    .build(dir.path(), "slowread");
    let report = dir.path().join("report.json");
    for round in 0..2 {
        let mut child = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let mut tool = attach_cmd(child.id() as i32, &report, Some("0.2"));
        tool.args(["-f", "first_call", "--probe", "counters", "--events", "page-faults"]);
        let out_tool = tool.output().unwrap();
        let err = String::from_utf8_lossy(&out_tool.stderr);
        assert!(out_tool.status.success(), "round {round}: {err}");
        drop(stdin);
        line.clear();
        out.read_line(&mut line).unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success() && line.trim() == "right",
            "round {round}: target ended with {status} ({line:?}); tool said:\n{err}"
        );
    }
}
