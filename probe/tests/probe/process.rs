//! Process control against real processes: spawn at entry, attach/detach under
//! load, remote mmap, library injection, and bad input. Target programs are
//! built here with gcc.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::mman::ProtFlags;
use papirus_probe::Error;
use papirus_probe::error::PermissionReason;
use papirus_probe::process::{Exit, Injection, Process, Spawn};
use papirus_substrate::elf::ElfFile;
use papirus_substrate::maps;

const CTOR: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void ctor(void) { write(1, "ctor\n", 5); }
int main(int argc, char **argv) {
    const char *e = getenv("PAPIRUS_T");
    printf("main argc=%d arg1=%s env=%s\n", argc, argc > 1 ? argv[1] : "", e ? e : "");
    return 7;
}
"#;

const PRELOAD: &str = r#"
#include <unistd.h>
__attribute__((constructor)) static void pre(void) { write(1, "preload\n", 8); }
"#;

/// Four threads summing disjoint ranges of 0..4N; main waits for stdin EOF, then prints.
const THREADS: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#define N 300000000UL
static void *work(void *arg) {
    unsigned long k = (unsigned long)arg;
    volatile unsigned long acc = 0;
    for (unsigned long i = k * N; i < (k + 1) * N; i++) acc += i;
    return (void *)acc;
}
int main(void) {
    pthread_t t[4];
    unsigned long total = 0;
    printf("ready\n");
    fflush(stdout);
    for (unsigned long k = 0; k < 4; k++) pthread_create(&t[k], 0, work, (void *)k);
    for (int k = 0; k < 4; k++) { void *r; pthread_join(t[k], &r); total += (unsigned long)r; }
    char c;
    while (read(0, &c, 1) > 0) {}
    printf("sum %lu\n", total);
    return 0;
}
"#;
const THREADS_N: u64 = 300_000_000;

/// Keeps creating short-lived threads until stdin reaches EOF.
const SPAWNER: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static volatile int stop;
static void *tiny(void *a) { return a; }
static void *reader(void *a) { char c; while (read(0, &c, 1) > 0) {} stop = 1; return a; }
int main(void) {
    pthread_t r, t[4];
    unsigned long n = 0;
    pthread_create(&r, 0, reader, 0);
    printf("ready\n");
    fflush(stdout);
    while (!stop) {
        for (int k = 0; k < 4; k++) pthread_create(&t[k], 0, tiny, 0);
        for (int k = 0; k < 4; k++) pthread_join(t[k], 0);
        n += 4;
    }
    pthread_join(r, 0);
    printf("created %s\n", n > 0 ? "threads" : "none");
    return 0;
}
"#;

/// Counts real-time signals it sends itself; queued signals do not merge, so every one counts.
const SIGNALS: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#define N 2000
static int got, sent;
static void on(int s) { (void)s; __atomic_add_fetch(&got, 1, __ATOMIC_RELAXED); }
/* sigqueue, not kill: when the user's queued-signal quota (shared by all of root's processes)
   is full, kill() silently merges real-time signals, sigqueue() fails with EAGAIN. */
static void *sender(void *a) {
    union sigval v = {0};
    for (int i = 0; i < N; i++) {
        for (int try = 0; try < 1000; try++) {
            if (sigqueue(getpid(), SIGRTMIN, v) == 0) { sent++; break; }
            usleep(100);
        }
        usleep(100);
    }
    return a;
}
int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on;
    sigaction(SIGRTMIN, &sa, 0);
    pthread_t t;
    pthread_create(&t, 0, sender, 0);
    printf("ready\n");
    fflush(stdout);
    pthread_join(t, 0);
    for (int i = 0; i < 2000 && __atomic_load_n(&got, __ATOMIC_RELAXED) < sent; i++) usleep(1000);
    printf("got %d of %d\n", got, sent);
    return 0;
}
"#;

struct Built {
    dir: tempfile::TempDir,
}

impl Built {
    fn new() -> Built {
        Built { dir: tempfile::tempdir().expect("temp dir") }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Builds the shared target `source` (`testkit/targets`) into `name`.
    fn target(&self, name: &str, source: &str) -> PathBuf {
        papirus_testkit::Cc::new(papirus_testkit::target(source))
            .opt("-O1")
            .arg("-pthread")
            .build(self.dir.path(), name)
    }

    /// Compiles C source into `name` with extra gcc flags.
    fn cc(&self, name: &str, src: &str, flags: &[&str]) -> PathBuf {
        papirus_testkit::Cc::from_text(self.dir.path(), &format!("{name}.c"), src)
            .opt("-O1")
            .arg("-pthread")
            .args(flags)
            .build(self.dir.path(), name)
    }
}

/// A running target with a pipe to its stdin and a reader on its stdout.
struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Target {
    fn start(exe: &Path) -> Target {
        let mut child =
            Command::new(exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start target");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut t = Target { child, stdin, out };
        assert_eq!(t.line(), "ready");
        t
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim_end().to_string()
    }

    fn send(&mut self, s: &str) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(s.as_bytes()).unwrap();
        w.flush().unwrap();
    }

    /// Closes stdin, collects the rest of stdout and the exit status.
    fn finish(mut self) -> (String, std::process::ExitStatus) {
        drop(self.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        (rest, self.child.wait().unwrap())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The State letter of /proc/PID/status ('S', 'R', 't', 'T', 'Z'), or None when gone.
fn state(tid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("State:")).and_then(|v| v.trim().chars().next())
}

fn tasks(pid: i32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

/// Waits until the target's main thread sleeps in read(2) (syscall 0 in /proc/PID/syscall).
fn wait_in_read(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if sc.starts_with("0 ") && state(pid) == Some('S') {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("pid {pid} never blocked in read(2)");
}

fn assert_not_stopped(pid: i32) {
    for tid in tasks(pid) {
        let st = state(tid);
        assert!(st != Some('t') && st != Some('T'), "tid {tid} of {pid} left stopped ({st:?})");
    }
}

/// The executable mapping of the module whose file name starts with `prefix`.
fn text_of(pid: i32, prefix: &str) -> maps::Mapping {
    maps::read(pid)
        .unwrap()
        .into_iter()
        .find(|m| m.perms.exec && m.name.rsplit('/').next().is_some_and(|b| b.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no executable mapping of {prefix} in {pid}"))
}

#[test]
fn spawn_stops_at_entry_before_constructors() {
    let b = Built::new();
    let exe = b.cc("ctor", CTOR, &[]);
    let expected = Command::new(&exe).arg("hello").env("PAPIRUS_T", "x").output().unwrap();
    assert_eq!(expected.status.code(), Some(7));

    let out_path = b.path("ctor.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let p = Spawn::new(&exe).arg("hello").env("PAPIRUS_T", "x").stdout(out).spawn().unwrap();
    let pid = p.pid();
    assert!(p.is_child());
    assert_eq!(p.threads(), vec![pid]);

    // rip is e_entry plus the load bias of the executable's first mapping.
    let elf = ElfFile::open(&exe).unwrap();
    let exe_canon = std::fs::canonicalize(&exe).unwrap();
    let first = maps::read(pid)
        .unwrap()
        .into_iter()
        .find(|m| m.file().as_deref() == Some(exe_canon.as_path()))
        .unwrap();
    let entry = elf.entry().wrapping_add(elf.load_bias(first.start, first.offset).unwrap());
    assert_eq!(p.regs(pid).unwrap().rip, entry);
    assert_eq!(p.entry_point().unwrap(), entry);
    // The int3 is gone: the entry bytes equal the file's.
    assert_eq!(p.read_vec(entry, 16).unwrap(), elf.bytes_at(elf.entry(), 16).unwrap());
    assert_eq!(state(pid), Some('t'));
    // The constructor has not run.
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "");

    let d = p.detach().unwrap();
    assert_eq!(d.wait(Duration::from_secs(10)).unwrap(), Exit::Code(7));
    assert_eq!(std::fs::read(&out_path).unwrap(), expected.stdout);
}

#[test]
fn spawn_with_preload_runs_library_constructors_first() {
    let b = Built::new();
    let exe = b.cc("ctor", CTOR, &[]);
    let lib = b.cc("libpre.so", PRELOAD, &["-shared", "-fPIC"]);
    let out_path = b.path("pre.out");
    let mut p =
        Spawn::new(&exe).preload(&lib).stdout(std::fs::File::create(&out_path).unwrap()).spawn().unwrap();
    // Libraries' constructors run before the entry point, the program's after it.
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "preload\n");
    // Injecting at the entry point runs the library's constructor, not the program.
    let again = b.cc("libagain.so", &PRELOAD.replace("preload", "injectd"), &["-shared", "-fPIC"]);
    p.inject(&again).unwrap();
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "preload\ninjectd\n");
    assert_eq!(p.regs(p.pid()).unwrap().rip, p.entry_point().unwrap());
    assert_eq!(p.detach().unwrap().wait(Duration::from_secs(10)).unwrap(), Exit::Code(7));
    assert_eq!(
        std::fs::read_to_string(&out_path).unwrap(),
        "preload\ninjectd\nctor\nmain argc=1 arg1= env=\n"
    );
}

#[test]
fn attach_detach_100_times_under_load() {
    let b = Built::new();
    let exe = b.cc("threads", THREADS, &["-O0"]);
    let mut t = Target::start(&exe);
    let pid = t.pid();
    let deadline = Instant::now() + Duration::from_secs(5);
    while tasks(pid).len() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    // A wait cut short by its timeout leaves seized, running threads: dropping still releases them.
    let mut p = Process::attach(pid).unwrap();
    p.set_timeout(Duration::ZERO);
    match p.run_for(Duration::from_millis(1)) {
        Ok(()) | Err(Error::Timeout { .. }) => {}
        Err(e) => panic!("run_for: {e}"),
    }
    drop(p);
    assert_not_stopped(pid);
    for tid in tasks(pid) {
        let tracer = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
        assert!(tracer.contains("TracerPid:\t0\n"), "tid {tid} still traced");
    }
    let mut saw_all = 0;
    for _ in 0..100 {
        let p = Process::attach(pid).unwrap();
        let held = {
            let mut v = p.threads();
            v.sort();
            v
        };
        // Every thread of the process is ours and in a tracing stop.
        assert_eq!(held, tasks(pid));
        for &tid in &held {
            assert_eq!(state(tid), Some('t'), "tid {tid} not stopped");
        }
        if held.len() == 5 {
            saw_all += 1;
        }
        drop(p);
    }
    assert!(saw_all > 0, "never caught the 4 workers running");
    // A thread id is not a process id.
    if let Some(&worker) = tasks(pid).iter().find(|&&tid| tid != pid) {
        let e = Process::attach(worker).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(&format!("attach to {pid}")),
            "{e}"
        );
    }
    eprintln!("{saw_all} of 100 attaches caught all 4 workers running");
    // Run a moment and stop again: still every thread held.
    let mut p = Process::attach(pid).unwrap();
    p.run_for(Duration::from_millis(5)).unwrap();
    let mut held = p.threads();
    held.sort();
    assert_eq!(held, tasks(pid));
    assert!(held.iter().all(|&tid| state(tid) == Some('t')));
    drop(p);

    assert_not_stopped(pid);
    t.send("x");
    let (rest, status) = t.finish();
    let n = 4 * THREADS_N;
    assert_eq!(rest, format!("sum {}\n", n * (n - 1) / 2));
    assert!(status.success());
}

#[test]
fn signals_arriving_during_attach_are_delivered() {
    let b = Built::new();
    let exe = b.cc("signals", SIGNALS, &[]);
    let mut t = Target::start(&exe);
    let pid = t.pid();
    let mut rounds = 0;
    // Attach, run a system call, detach, until the sender thread is done.
    while tasks(pid).len() > 1 {
        let Ok(mut p) = Process::attach(pid) else { break };
        assert_eq!(p.syscall(libc::SYS_getpid, &[]).unwrap(), pid as i64);
        drop(p);
        rounds += 1;
    }
    assert!(rounds > 5, "only {rounds} attaches while signals flowed");
    let line = t.line();
    let (got, sent) = line.strip_prefix("got ").and_then(|r| r.split_once(" of ")).expect("got G of S");
    assert_eq!(got, sent, "signals lost across attaches");
    assert!(sent.parse::<u32>().unwrap() > 1000, "{line}: the sender could not queue signals");
}

#[test]
fn a_stopped_process_stays_stopped() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let mut t = Target::start(&exe);
    let pid = t.pid();
    let target = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while state(pid) != Some('T') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut p = Process::attach(pid).unwrap();
    assert_eq!(p.syscall(libc::SYS_getpid, &[]).unwrap(), pid as i64);
    drop(p);
    // Job control still holds it: detaching re-arms the group stop, which the
    // thread enters as soon as it is scheduled; it stays there until SIGCONT.
    let deadline = Instant::now() + Duration::from_secs(5);
    while state(pid) != Some('T') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(state(pid), Some('T'));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(state(pid), Some('T'));
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGCONT).unwrap();
    t.send("cont\n");
    assert_eq!(t.line(), "cont");
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn attach_catches_threads_created_meanwhile() {
    let b = Built::new();
    let exe = b.cc("spawner", SPAWNER, &[]);
    let t = Target::start(&exe);
    let pid = t.pid();
    let mut seen = std::collections::BTreeSet::new();
    let mut attaches = 0;
    // At least 30 attaches, and until short-lived threads have come and gone (a loaded VM may be slow).
    while attaches < 30 || (seen.len() <= 10 && attaches < 500) {
        attaches += 1;
        let p = Process::attach(pid).unwrap();
        let mut held = p.threads();
        held.sort();
        assert_eq!(held, tasks(pid), "a thread escaped the attach");
        for &tid in &held {
            assert_eq!(state(tid), Some('t'), "tid {tid} not stopped");
        }
        seen.extend(held);
        drop(p);
        std::thread::sleep(Duration::from_millis(2));
    }
    // Short-lived threads came and went between attaches.
    assert!(seen.len() > 10, "only {} distinct threads seen", seen.len());
    assert_not_stopped(pid);
    let (rest, status) = t.finish();
    assert_eq!(rest, "created threads\n");
    assert!(status.success());
}

#[test]
fn remote_mmap_near_text_and_registers_restored() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let mut t = Target::start(&exe);
    let pid = t.pid();
    wait_in_read(pid);
    let mut p = Process::attach(pid).unwrap();
    let tid = p.worker();
    let regs = p.regs(tid).unwrap();
    let xstate = p.xstate(tid).unwrap();
    // Blocked in read(2): the kernel will restart it after we leave.
    assert_eq!(regs.orig_rax, libc::SYS_read as u64);

    for module in ["sleeper", "libc.so"] {
        let text = text_of(pid, module);
        let len = 64 * 1024;
        let a = p.mmap_near(text.start..text.end, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE).unwrap();
        assert!(
            (a + len).abs_diff(text.start) < 1 << 31 && text.end.abs_diff(a) < 1 << 31,
            "{a:#x} out of reach of {module}"
        );
        let m = maps::read(pid).unwrap().into_iter().find(|m| m.start <= a && a < m.end).unwrap();
        assert!(m.perms.read && m.perms.write && !m.perms.exec && m.inode == 0, "{m:?}");
        p.write_memory(a, b"papirus").unwrap();
        assert_eq!(p.read_vec(a, 7).unwrap(), b"papirus");
        p.mprotect(a, len, ProtFlags::PROT_READ | ProtFlags::PROT_EXEC).unwrap();
        let m = maps::read(pid).unwrap().into_iter().find(|m| m.start <= a && a < m.end).unwrap();
        assert!(m.perms.exec && !m.perms.write);
        p.munmap(a, len).unwrap();
        assert!(maps::read(pid).unwrap().iter().all(|m| a + len <= m.start || a >= m.end));
    }
    let after = p.regs(tid).unwrap();
    assert_eq!(format!("{regs:?}"), format!("{after:?}"));
    assert_eq!(p.xstate(tid).unwrap(), xstate);
    drop(p);
    assert_not_stopped(pid);
    // read(2) was restarted, not failed with EINTR.
    t.send("after\n");
    assert_eq!(t.line(), "after");
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn text_write_breaks_cow_and_leaves_the_file_alone() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let on_disk = std::fs::read(&exe).unwrap();
    let t = Target::start(&exe);
    let mut p = Process::attach(t.pid()).unwrap();
    let elf = ElfFile::open(&exe).unwrap();
    let text = text_of(t.pid(), "sleeper");
    let bias = elf.load_bias(text.start, text.offset).unwrap();
    let main = bias + elf.lookup_function("main").unwrap().address;
    let orig = p.read_vec(main, 4).unwrap();
    p.write_memory(main, &[0xcc, 0x90, 0x90, 0xcc]).unwrap();
    assert_eq!(p.read_vec(main, 4).unwrap(), [0xcc, 0x90, 0x90, 0xcc]);
    assert_eq!(std::fs::read(&exe).unwrap(), on_disk, "the executable on disk changed");
    p.write_memory(main, &orig).unwrap();
    assert_eq!(p.read_vec(main, 4).unwrap(), orig);
    drop(p);
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn vector_registers_round_trip() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let t = Target::start(&exe);
    let mut p = Process::attach(t.pid()).unwrap();
    let tid = p.worker();
    let orig = p.xstate(tid).unwrap();
    assert!(orig.as_bytes().len() >= 576, "XSAVE area of {} bytes", orig.as_bytes().len());
    let mut x = orig.clone();
    let pattern: [u8; 16] = std::array::from_fn(|i| 0xa0 + i as u8);
    assert!(x.set_xmm(7, pattern));
    p.set_xstate(tid, &x).unwrap();
    assert_eq!(p.xstate(tid).unwrap().xmm(7), Some(pattern));
    assert_eq!(p.fpregs(tid).unwrap().xmm_space[28..32], [0xa3a2a1a0, 0xa7a6a5a4, 0xabaaa9a8, 0xafaeadac]);
    p.set_xstate(tid, &orig).unwrap();
    assert_eq!(p.xstate(tid).unwrap(), orig);
    drop(p);
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn inject_library_and_call_it() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let mark = b.path("marked.txt");
    let lib_src = format!(
        "#include <stdio.h>\nint papirus_mark(int v) {{ FILE *f = fopen(\"{}\", \"w\"); if (!f) return -1; fprintf(f, \"marked %d\\n\", v); fclose(f); return v + 1; }}\n",
        mark.display()
    );
    let lib = b.cc("libmark.so", &lib_src, &["-shared", "-fPIC"]);
    let mark2 = b.path("marked2.txt");
    let lib2 = b.cc("libmark2.so", &lib_src.replace("marked.txt", "marked2.txt"), &["-shared", "-fPIC"]);
    let mut t = Target::start(&exe);
    let pid = t.pid();
    assert!(!maps::read(pid).unwrap().iter().any(|m| m.name.contains("libdl")), "target linked libdl");

    wait_in_read(pid);
    let mut p = Process::attach(pid).unwrap();
    let regs = p.regs(p.worker()).unwrap();
    let lib_handle = p.inject_with(&lib, Injection::FreshThread).unwrap();
    assert_ne!(lib_handle.handle, 0);
    assert!(maps::read(pid).unwrap().iter().any(|m| m.name.ends_with("libmark.so")));
    let f = p.dlsym(&lib_handle, "papirus_mark").unwrap();
    assert_eq!(p.call(f, &[41]).unwrap(), 42);
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), "marked 41\n");
    // Errors from the loader come back as text, and leave the process fine.
    match p.dlsym(&lib_handle, "no_such_function") {
        Err(Error::NotFound { detail, .. }) => assert!(detail.contains("undefined symbol"), "{detail}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // The other way: dlopen on a stopped thread.
    let lib2_handle = p.inject_with(&lib2, Injection::StoppedThread).unwrap();
    let f2 = p.dlsym(&lib2_handle, "papirus_mark").unwrap();
    assert_ne!(f2, f);
    assert_eq!(p.call(f2, &[7]).unwrap(), 8);
    assert_eq!(std::fs::read_to_string(&mark2).unwrap(), "marked 7\n");
    // The fresh thread is gone, its start routine unmapped.
    assert_eq!(tasks(pid), vec![pid]);
    for how in [Injection::FreshThread, Injection::StoppedThread] {
        // A C source, not a library.
        match p.inject_with(&papirus_testkit::target("sleeper.c"), how) {
            Err(Error::Dlopen { message, .. }) => {
                assert!(message.contains("sleeper.c"), "{how:?}: {message}")
            }
            other => panic!("expected Dlopen, got {other:?}"),
        }
    }
    let anon_exec = |pid| {
        maps::read(pid).unwrap().iter().filter(|m| m.perms.exec && m.inode == 0 && m.name.is_empty()).count()
    };
    // At most the page of the self-restoring stub, which goes at release.
    assert!(anon_exec(pid) <= 1, "a start routine page was left mapped");
    // The process ran during the fresh-thread loads; its main thread is back in read(2).
    assert_eq!(format!("{:?}", p.regs(p.worker()).unwrap()), format!("{regs:?}"));
    // A call that faults is reported and undone.
    let regs = p.regs(p.worker()).unwrap();
    match p.call(0x1000, &[]) {
        Err(Error::RemoteFault { signal, rip, .. }) => assert_eq!((signal, rip), (libc::SIGSEGV, 0x1000)),
        other => panic!("expected RemoteFault, got {other:?}"),
    }
    assert_eq!(format!("{:?}", p.regs(p.worker()).unwrap()), format!("{regs:?}"));
    drop(p);
    assert_not_stopped(pid);
    assert_eq!(anon_exec(pid), 0, "a page of papirus' code was left mapped");
    t.send("still here\n");
    assert_eq!(t.line(), "still here");
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn fresh_thread_injection_survives_a_lock_held_by_another_thread() {
    let b = Built::new();
    let exe = b.target("locker", "loader_lock.c");
    let lib = b.cc("libempty.so", "int papirus_empty(void) { return 5; }\n", &["-shared", "-fPIC"]);

    // A stopped thread cannot take the lock the (stopped) locker holds: a clear timeout.
    let mut t = Target::start(&exe);
    let pid = t.pid();
    wait_in_read(pid);
    let locker = *tasks(pid).iter().find(|&&tid| tid != pid).unwrap();
    // Stopped while the locker sleeps in its callback (clock_nanosleep), so it holds the lock.
    let mut p = (0..1000)
        .find_map(|_| {
            let p = Process::attach(pid).unwrap();
            let sc =
                std::fs::read_to_string(format!("/proc/{pid}/task/{locker}/syscall")).unwrap_or_default();
            sc.starts_with(&format!("{} ", libc::SYS_clock_nanosleep)).then_some(p)
        })
        .expect("never caught the locker inside its callback");
    p.set_timeout(Duration::from_millis(500));
    match p.inject_with(&lib, Injection::StoppedThread) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(p);
    assert_not_stopped(pid);
    t.send("alive\n");
    assert_eq!(t.line(), "alive");
    drop(t);

    // A fresh thread waits while the locker runs on and lets the lock go.
    let mut t = Target::start(&exe);
    let mut p = Process::attach(t.pid()).unwrap();
    let l = p.inject_with(&lib, Injection::FreshThread).unwrap();
    let f = p.dlsym(&l, "papirus_empty").unwrap();
    assert_eq!(p.call(f, &[]).unwrap(), 5);
    drop(p);
    t.send("alive\n");
    assert_eq!(t.line(), "alive");
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

#[test]
fn target_exiting_during_a_call_is_an_error_not_a_hang() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let t = Target::start(&exe);
    let pid = t.pid();
    let mut p = Process::attach(pid).unwrap();
    let exit = p.module_function("libc.so", "_exit").unwrap();
    match p.call(exit, &[3]) {
        Err(Error::TargetExited { status, .. }) => assert_eq!(status, Exit::Code(3)),
        other => panic!("expected TargetExited, got {other:?}"),
    }
    drop(p);
    let (_, status) = t.finish();
    assert_eq!(status.code(), Some(3));
}

#[test]
fn bad_input_gives_clear_errors() {
    let b = Built::new();
    // No such process: a child we reaped.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id() as i32;
    gone.wait().unwrap();
    if state(gone_pid).is_none() {
        assert!(matches!(Process::attach(gone_pid), Err(Error::NoSuchProcess { .. })));
    }
    assert!(matches!(Process::attach(-5), Err(Error::NoSuchProcess { .. })));
    assert!(matches!(Process::attach(std::process::id() as i32), Err(Error::SelfTrace { .. })));

    // A zombie: exited, not yet reaped.
    let mut z = Command::new("true").spawn().unwrap();
    let zpid = z.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(5);
    while state(zpid) != Some('Z') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = Process::attach(zpid).unwrap_err();
    assert!(matches!(e, Error::Zombie { .. }), "{e}");
    assert_eq!(state(zpid), Some('Z'));
    z.wait().unwrap();

    // A kernel thread.
    let e = Process::attach(2).unwrap_err();
    assert!(matches!(e, Error::KernelThread { .. }), "{e}");
    assert!(e.to_string().contains("kthreadd"), "{e}");
    assert_not_stopped(2);

    // A missing program, a script, a data file.
    assert!(matches!(Spawn::new("/nonexistent/papirus").spawn(), Err(Error::MissingProgram { .. })));
    assert!(matches!(Spawn::new("papirus-no-such-program").spawn(), Err(Error::MissingProgram { .. })));
    let script = b.path("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let data = b.path("data.bin");
    std::fs::write(&data, [1u8, 2, 3, 4, 5]).unwrap();
    for f in [&script, &data] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = Spawn::new(f).spawn().unwrap_err();
        assert!(matches!(e, Error::NotElf { .. }), "{e}");
    }
    // A program whose loader fails (missing library) ends before the entry point.
    let lib = b.cc("libgone.so", "int gone(void) { return 1; }\n", &["-shared", "-fPIC"]);
    let needs = b.cc(
        "needs",
        "int gone(void); int main(void) { return gone(); }\n",
        &[&format!("-L{}", b.dir.path().display()), "-lgone"],
    );
    std::fs::remove_file(lib).unwrap();
    match Spawn::new(&needs).stderr(std::fs::File::create(b.path("needs.err")).unwrap()).spawn() {
        Err(Error::TargetExited { status, .. }) => assert_eq!(status, Exit::Code(127)),
        other => panic!("expected TargetExited, got {other:?}"),
    }
}

/// Attaching to a process of another user from an unprivileged tracer.
#[test]
fn permission_denied_for_another_users_process() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let t = Target::start(&exe);
    let pid = t.pid();
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) != 0 {
        // Already unprivileged: pid 1 belongs to root.
        let e = Process::attach(1).unwrap_err();
        assert!(matches!(e, Error::PermissionDenied { .. }), "{e}");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&me)
        .args([
            "--exact",
            "process::unprivileged_attach",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PAPIRUS_ATTACH_PID", pid.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "unprivileged attach run failed:\n{text}");
    assert!(text.contains("attach refused: may not trace pid"), "{text}");
    assert!(text.contains("belongs to uid 0"), "{text}");
    assert_not_stopped(pid);
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success());
}

/// Run by `permission_denied_for_another_users_process` as uid 65534.
#[test]
#[ignore = "run as an unprivileged user by permission_denied_for_another_users_process"]
fn unprivileged_attach() {
    let pid: i32 = std::env::var("PAPIRUS_ATTACH_PID").expect("PAPIRUS_ATTACH_PID").parse().unwrap();
    let e = Process::attach(pid).unwrap_err();
    println!("attach refused: {e}");
    match e {
        Error::PermissionDenied { reason: PermissionReason::NotOurs { owner: 0, us: 65534 }, .. } => {}
        other => panic!("expected NotOurs, got {other:?}"),
    }
}

/// `run`'s spawn side of every execve refusal: the kernel's error at once, a
/// static program refused before anything starts, nothing left behind.
#[test]
fn spawn_failures_are_immediate_and_leave_nothing() {
    let b = Built::new();
    let hello = "int main(void) { return 0; }\n";
    let children = || {
        let me = std::process::id();
        std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default()
    };
    let before = children();
    let timed = |s: &Spawn| {
        let t = Instant::now();
        let r = s.spawn();
        (r, t.elapsed())
    };
    // No exec bit: execve's EACCES, not a hang.
    let noexec = b.cc("noexec", hello, &[]);
    std::fs::set_permissions(&noexec, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (r, took) = timed(&Spawn::new(&noexec));
    match r {
        Err(Error::Spawn { op: "execve", errno, .. }) => assert_eq!(errno, nix::errno::Errno::EACCES),
        other => panic!("expected execve EACCES, got {other:?}"),
    }
    // Far below the 5 s wait bound: the error pipe is read, not waited on to EOF.
    assert!(took < Duration::from_secs(4), "non-executable file took {took:?}");
    // Another machine: refused before fork, naming it.
    let arm = b.cc("arm", hello, &[]);
    let mut bytes = std::fs::read(&arm).unwrap();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(&arm, &bytes).unwrap();
    let e = Spawn::new(&arm).spawn().unwrap_err();
    assert!(matches!(e, Error::NotElf { .. }) && e.to_string().contains("183"), "{e}");
    // A missing program interpreter: ENOENT on an existing file, named as such.
    let nointerp = b.cc("nointerp", hello, &["-Wl,--dynamic-linker=/nonexistent/papirus-ld.so"]);
    let e = Spawn::new(&nointerp).spawn().unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { .. }) && e.to_string().contains("/nonexistent/papirus-ld.so"),
        "{e}"
    );
    // A static program: refused with the reason when a library must be preloaded.
    let st = b.cc("static", hello, &["-static"]);
    let e = Spawn::new(&st).preload("/nonexistent/libx.so").spawn().unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("LD_PRELOAD"), "{e}");
    // Without a preload it starts normally.
    let p = Spawn::new(&st).spawn().unwrap();
    let d = p.detach().unwrap();
    assert_eq!(d.wait(Duration::from_secs(5)).unwrap(), Exit::Code(0));
    assert_eq!(children(), before, "a child was left behind");
}

/// Spins in the first bytes of `spin_entry` until SIGALRM arrives; the handler
/// (on a `sigaltstack` when given an argument) then blocks in read(2), so the
/// only trace of `spin_entry` is the saved PC of the signal frame.
const IN_HANDLER: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
void spin_entry(void);
__asm__(".text\n.globl spin_entry\n.type spin_entry,@function\nspin_entry:\n"
        "nop\n1: jmp 1b\n.size spin_entry, .-spin_entry\n");
static int fds[2];
static void on_alarm(int s) {
    char c;
    (void)s;
    write(1, "in handler\n", 11);
    read(fds[0], &c, 1);
    _exit(0);
}
int main(int argc, char **argv) {
    (void)argv;
    if (pipe(fds)) return 1;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    if (argc > 1) {
        stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16};
        if (sigaltstack(&ss, 0)) return 1;
        sa.sa_flags = SA_ONSTACK;
    }
    sigaction(SIGALRM, &sa, 0);
    printf("ready\n%p\n", (void *)spin_entry);
    fflush(stdout);
    ualarm(20000, 0);
    spin_entry();
    return 0;
}
"#;

#[test]
fn resume_pcs_include_the_saved_pc_of_signal_frames() {
    let b = Built::new();
    let exe = b.cc("in_handler", IN_HANDLER, &[]);
    for altstack in [false, true] {
        let mut cmd = Command::new(&exe);
        if altstack {
            cmd.arg("alt");
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut next = || {
            line.clear();
            out.read_line(&mut line).unwrap();
            line.trim().to_string()
        };
        assert_eq!(next(), "ready");
        let entry = u64::from_str_radix(next().trim_start_matches("0x"), 16).unwrap();
        assert_eq!(next(), "in handler");
        let pid = child.id() as i32;
        wait_in_read(pid);
        let p = Process::attach(pid).unwrap();
        let pcs = p.resume_pcs(pid).unwrap();
        let rip = p.regs(pid).unwrap().rip;
        drop(p);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(pcs[0], rip);
        assert!(!(entry..entry + 3).contains(&rip), "the thread itself is in read(2), not at {entry:#x}");
        assert!(
            pcs.iter().any(|pc| (entry..entry + 3).contains(pc)),
            "altstack {altstack}: no saved PC in spin_entry {entry:#x}: {pcs:x?}"
        );
    }
}

/// A remote mprotect in a target whose filter kills on mprotect: done with the
/// filter suspended when papirus may suspend it, refused with a typed error
/// when it may not. The target lives either way (the tool's refusal without
/// CAP_SYS_ADMIN is tested with the tool).
#[test]
fn seccomp_target_is_never_killed() {
    let b = Built::new();
    let exe = b.target("seccomp", "seccomp_mprotect.c");
    let mut t = Target::start(&exe);
    let pid = t.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{status}");
    wait_in_read(pid);
    match Process::attach(pid) {
        Ok(mut p) => {
            let page = p.mmap_anywhere(4096, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE).unwrap();
            p.mprotect(page, 4096, ProtFlags::PROT_READ).unwrap();
            p.munmap(page, 4096).unwrap();
            drop(p);
        }
        Err(e @ Error::Seccomp { .. }) => println!("papirus may not suspend seccomp here: {e}"),
        Err(e) => panic!("{e}"),
    }
    t.send("one\n");
    assert_eq!(t.line(), "one");
    t.send("two\n");
    assert_eq!(t.line(), "two");
    let (_, st) = t.finish();
    assert!(st.success(), "target ended with {st}");
}

/// Prints ready, then execs itself whenever it reads "exec".
const EXECER: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (!strcmp(line, "exec\n")) execv("/proc/self/exe", argv);
        fputs(line, stdout);
        fflush(stdout);
    }
    return 0;
}
"#;

/// execve while papirus is detached or while it holds the process: a typed
/// error, nothing written into the new image, the new program runs on.
#[test]
fn exec_is_noticed_and_nothing_is_written_into_the_new_image() {
    let b = Built::new();
    let exe = b.cc("execer", EXECER, &[]);
    let mut t = Target::start(&exe);
    let pid = t.pid();
    wait_in_read(pid);
    let p = Process::attach(pid).unwrap();
    let image = p.image().unwrap();
    p.check_image(&image).unwrap();
    drop(p);
    t.send("exec\n");
    assert_eq!(t.line(), "ready");
    wait_in_read(pid);
    let p = Process::attach(pid).unwrap();
    let e = p.check_image(&image).unwrap_err();
    assert!(matches!(e, Error::Exec { .. }), "{e}");
    drop(p);
    // While held: the exec event itself.
    let mut p = Process::attach(pid).unwrap();
    // Maps papirus' stub page in the old image: released with it, never unmapped in the new one.
    assert_eq!(p.syscall(libc::SYS_getpid, &[]).unwrap(), pid as i64);
    t.send("exec\n");
    let e = p.run_for(Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, Error::Exec { .. }), "{e}");
    drop(p);
    assert_eq!(t.line(), "ready");
    t.send("still here\n");
    assert_eq!(t.line(), "still here");
    assert_not_stopped(pid);
    let (_, st) = t.finish();
    assert!(st.success());
}

/// papirus killed while the target runs a remote function for it: the target
/// finishes the function, restores itself and goes on (no fault, trap or
/// signal of ours left behind).
#[test]
fn target_survives_papirus_killed_during_a_remote_call() {
    let b = Built::new();
    let exe = b.target("sleeper", "sleeper.c");
    let mut t = Target::start(&exe);
    let pid = t.pid();
    wait_in_read(pid);
    // SAFETY: the forked child of this multi-threaded test only attaches, calls and
    // _exits; the allocator it uses (glibc malloc) is made fork-safe by glibc.
    let child = match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = Process::attach(pid)
                .and_then(|mut p| {
                    let usleep = p.module_function("libc.so", "usleep")?;
                    p.call(usleep, &[400_000])
                })
                .map_or(3, |_| 0);
            // SAFETY: _exit ends the forked child without running the parent's atexit state.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    // Wait until the target is inside usleep for the child, then kill the child.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if sc.starts_with("230 ") || sc.starts_with("35 ") {
            break;
        }
        assert!(Instant::now() < deadline, "the remote usleep never started: {sc}");
        std::thread::sleep(Duration::from_millis(1));
    }
    nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).unwrap();
    nix::sys::wait::waitpid(child, None).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    t.send("still here\n");
    assert_eq!(t.line(), "still here");
    let (rest, status) = t.finish();
    assert_eq!(rest, "bye\n");
    assert!(status.success(), "target ended with {status}");
}

/// Sleeps 1 s four times, printing how each sleep ended and how long it took.
const NANOSLEEPER: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 4; i++) {
        struct timespec d = {1, 0}, a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int r = nanosleep(&d, 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double t = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        printf("%s %s\n", r ? strerror(errno) : "ok", t >= 1.0 ? "full" : "short");
        fflush(stdout);
    }
    return 0;
}
"#;

/// Remote work on a process whose only thread sleeps in nanosleep (restarted
/// through the kernel's restart block): system calls, a function, and a
/// function that itself sleeps. Each sleep of the target ends normally and
/// lasts its full length.
#[test]
fn a_sleeping_target_sleeps_its_full_length() {
    let b = Built::new();
    let exe = b.cc("nanosleeper", NANOSLEEPER, &[]);
    let mut t = Target::start(&exe);
    let pid = t.pid();
    for op in 0..4 {
        std::thread::sleep(Duration::from_millis(300));
        let mut p = Process::attach(pid).unwrap();
        let r = p.regs(pid).unwrap();
        assert_eq!(r.rax as i64, -516, "op {op}: not asleep through the restart block");
        match op {
            0 => drop(p.syscall(libc::SYS_getpid, &[]).unwrap()),
            1 => {
                let a = p.mmap_anywhere(4096, ProtFlags::PROT_READ).unwrap();
                p.munmap(a, 4096).unwrap();
            }
            2 => drop(p.call(p.module_function("libc.so", "getpid").unwrap(), &[]).unwrap()),
            _ => drop(p.call(p.module_function("libc.so", "usleep").unwrap(), &[1000]).unwrap()),
        }
        drop(p);
        assert_eq!(t.line(), "ok full", "op {op}");
    }
}
