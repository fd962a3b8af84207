use std::sync::{Mutex, MutexGuard};

use papirus_testkit::{Built, Cc, target};

/// Held by every test of this binary for its whole run.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `work` target (`testkit/targets/work.c`), built for one test.
pub fn work() -> Built {
    Cc::new(target("work.c")).built("work")
}

/// Touches `pages` fresh pages of a new mapping (each a minor fault).
pub fn touch_pages(pages: usize) {
    // A mapping of its own, never huge pages: each page written faults
    // once (memory from the allocator may already be resident, and a huge
    // page maps 512 at one fault).
    let mut m = memmap2::MmapMut::map_anon(pages * 4096).unwrap();
    m.advise(memmap2::Advice::NoHugePage).unwrap();
    for i in (0..m.len()).step_by(4096) {
        m[i] = 1;
    }
    std::hint::black_box(&m);
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
