//! Helpers shared by the substrate's tests: a serialising lock, clocks, fresh
//! memory, forked children and descriptor counting.

use std::io::{PipeReader, PipeWriter, Read, Write};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::mmap::page_size;
use papirus_substrate::sys::clock_gettime;
use papirus_substrate::{Counter, Error, EventAttr, Kind, Target};
use papirus_testkit::skip;

static LOCK: RwLock<()> = RwLock::new(());

/// Held for its whole run by a test that needs the process to itself
/// (timing, descriptor counts).
pub fn serial() -> RwLockWriteGuard<'static, ()> {
    LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// Held by a test that may run beside others of its kind but not beside
/// a [`serial`] one (the signal-driven sampling tests).
pub fn shared() -> RwLockReadGuard<'static, ()> {
    LOCK.read().unwrap_or_else(|e| e.into_inner())
}

/// A software event by its `PERF_COUNT_SW_*` number.
pub fn software(name: &str, config: u64) -> EventAttr {
    EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, config)
}

/// `PERF_COUNT_SW_TASK_CLOCK`
pub fn task_clock() -> EventAttr {
    software("task-clock", 1)
}
/// `PERF_COUNT_SW_PAGE_FAULTS`
pub fn page_faults() -> EventAttr {
    software("page-faults", 2)
}
/// `PERF_COUNT_SW_CONTEXT_SWITCHES`, with its default domain: all, since
/// the scheduler raises it in kernel context (user only counts 0).
pub fn context_switches() -> EventAttr {
    let mut attr = software("context-switches", 3);
    attr.default_domain("software");
    attr
}

/// CPU time of the calling thread in ns (`CLOCK_THREAD_CPUTIME_ID`).
/// Async-signal-safe, so a forked child may call it.
pub fn thread_cpu_ns() -> u64 {
    clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).expect("clock_gettime(CLOCK_THREAD_CPUTIME_ID)")
}

/// Spins until the calling thread has used `ns` of CPU time; returns the
/// CPU time actually used. Allocation-free, so fit for a forked child.
pub fn spin_cpu(ns: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 0u64;
    loop {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let used = thread_cpu_ns() - start;
        if used >= ns {
            return used;
        }
    }
}

/// Open descriptors of this process, from /proc/self/fd (the directory
/// handle used for the listing is not counted: it is the same in every call).
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// Private anonymous memory that has never been touched, unmapped on drop.
pub struct FreshPages {
    addr: *mut u8,
    len: usize,
}

impl FreshPages {
    /// `pages` pages, not populated, with transparent huge pages off so that
    /// every page takes its own fault.
    pub fn new(pages: usize) -> FreshPages {
        let len = pages * page_size();
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap of {len} bytes failed");
        // SAFETY: the range was just mapped by us.
        let ret = unsafe { libc::madvise(addr, len, libc::MADV_NOHUGEPAGE) };
        assert_eq!(ret, 0, "madvise(MADV_NOHUGEPAGE) failed");
        FreshPages { addr: addr.cast(), len }
    }

    /// Writes one byte in every page: one minor fault each.
    pub fn touch(&self) {
        let step = page_size();
        for off in (0..self.len).step_by(step) {
            // SAFETY: `off < len`, inside our writable mapping.
            unsafe { self.addr.add(off).write_volatile(1) };
        }
    }
}

impl Drop for FreshPages {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` created; nothing borrows it.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// A forked child that waits for [`Child::start`], runs `body` (which
/// returns a number sent back to the parent), and exits.
pub struct Child {
    pub pid: i32,
    go: PipeWriter,
    result: PipeReader,
}

impl Child {
    /// Forks. `body` runs in the child, which has a single thread, so it
    /// must only make async-signal-safe calls (no allocation, no locks).
    pub fn fork(body: fn() -> u64) -> Child {
        let (mut go_r, go_w) = std::io::pipe().expect("pipe");
        let (res_r, mut res_w) = std::io::pipe().expect("pipe");
        // SAFETY: the child only reads and writes pipes, spins, calls
        // clock_gettime/fork/waitpid and _exits: all async-signal-safe.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let mut b = [0u8; 1];
            let ok = go_r.read(&mut b).is_ok_and(|n| n == 1);
            let v = if ok { body() } else { 0 };
            let _ = res_w.write(&v.to_ne_bytes());
            // SAFETY: _exit ends the child without running the parent's
            // atexit handlers or destructors.
            unsafe { libc::_exit(0) };
        }
        drop((go_r, res_w));
        Child { pid, go: go_w, result: res_r }
    }

    /// Lets the child run its body.
    pub fn start(&mut self) {
        self.go.write_all(&[1]).expect("start child");
    }

    /// Waits for the child's result and its exit.
    pub fn finish(mut self) -> u64 {
        let mut b = [0u8; 8];
        self.result.read_exact(&mut b).expect("child result");
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid int.
        let ret = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        assert_eq!(ret, self.pid, "waitpid");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status:#x}");
        self.pid = 0;
        u64::from_ne_bytes(b)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.pid > 0 {
            // A failed test must not leave a child behind.
            // SAFETY: kill and reap our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Runs `f` (which returns a relative error and a description) until the
/// error is within `tolerance`, at most three times, and returns the best
/// attempt: a single measurement on a shared VM can be preempted.
pub fn best_of_three(tolerance: f64, mut f: impl FnMut() -> (f64, String)) -> (f64, String) {
    let mut best = (f64::INFINITY, String::new());
    for attempt in 1..=3 {
        let (err, what) = f();
        println!("attempt {attempt}: {what} (relative error {:.3} %)", err * 100.0);
        if err < best.0 {
            best = (err, what);
        }
        if best.0 <= tolerance {
            break;
        }
    }
    best
}

/// Opens `attr` on `target`, or prints the kernel's refusal and returns
/// `None` when it is a matter of privilege (a non-root run).
pub fn open_or_skip(attr: &EventAttr, target: Target) -> Option<Counter> {
    match attr.open(target) {
        Ok(c) => Some(c),
        Err(e @ Error::Permission { .. }) => {
            skip(format!("`{}`: {e}", attr.name()));
            None
        }
        Err(e) => panic!("opening `{}`: {e}", attr.name()),
    }
}

/// Asserts that `attr` (`syscalls:sys_enter_write`) counts exactly one per
/// write(2) of this thread.
pub fn counts_each_write(attr: &EventAttr) {
    const WRITES: u64 = 1_000;
    let Some(counter) = open_or_skip(attr, Target::ThisThread) else { return };
    let mut null = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
    counter.enable().unwrap();
    for _ in 0..WRITES {
        // One write(2) each: File is unbuffered.
        null.write_all(b"x").unwrap();
    }
    counter.disable().unwrap();
    let n = counter.read().unwrap().raw;
    println!("{}: {n} for {WRITES} writes", attr.name());
    assert_eq!(n, WRITES);
}
