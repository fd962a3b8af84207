use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Held by every test of this binary for its whole run.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

const WORK_C: &str = r#"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
/* work PAGES SPIN_MS [wait]: optionally wait for a byte on stdin, touch
   PAGES fresh pages, then burn SPIN_MS of CPU time. */
int main(int argc, char **argv) {
    long pages = atol(argv[1]), ms = atol(argv[2]);
    if (argc > 3) { char c; if (read(0, &c, 1) < 0) return 3; }
    char *p = mmap(0, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 4;
    madvise(p, pages * 4096, MADV_NOHUGEPAGE); /* one fault per 4 KiB page */
    for (long i = 0; i < pages; i++) p[i * 4096] = 1;
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    volatile unsigned long x = 0;
    do {
        for (int i = 0; i < 100000; i++) x += i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
    return 0;
}
"#;

/// The `work` test program, built once with gcc.
pub fn work() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lowlevel-work");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("work.c");
        std::fs::write(&src, WORK_C).unwrap();
        let bin = dir.join("work");
        let out = Command::new("gcc").args(["-O2", "-o"]).arg(&bin).arg(&src).output().expect("gcc runs");
        assert!(out.status.success(), "gcc failed: {}", String::from_utf8_lossy(&out.stderr));
        bin
    })
    .clone()
}

/// Touches `pages` fresh pages of a new mapping (each a minor fault).
pub fn touch_pages(pages: usize) {
    // Above 32 MiB glibc maps fresh zero pages (calloc leaves them
    // untouched); writing one byte of each faults it in.
    let mut v = vec![0u8; pages * 4096];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::hint::black_box(&v);
}

/// Burns about `ms` of this thread's CPU time.
pub fn spin_ms(ms: u64) {
    let t0 = papirus_lowlevel::virt_nsec();
    let mut x = 0u64;
    while papirus_lowlevel::virt_nsec() - t0 < ms * 1_000_000 {
        for i in 0..10_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}

/// Open descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The fewest faults touching `pages` pages of a >32 MiB allocation can
/// take: one per page, unless transparent huge pages are always on.
pub fn min_faults(pages: usize) -> usize {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[always]") {
        eprintln!("transparent huge pages are always on: one fault may map 512 pages");
        pages / 512
    } else {
        pages
    }
}

/// The calling thread's minor faults so far, as the kernel's own
/// accounting reports them (`/proc/thread-self/stat` field 10).
pub fn minflt() -> i64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(7).unwrap().parse().unwrap()
}
