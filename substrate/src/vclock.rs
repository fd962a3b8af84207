//! Virtual time: the CPU time of the calling thread, read at the cost of an
//! `rdtsc` instead of a 400 ns system call.
//!
//! # Definition
//!
//! Virtual time is what `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` returns:
//! the scheduler's `sum_exec_runtime` for the thread. It is the POSIX
//! definition, what PAPI's `get_virt_nsec` returns, and it excludes host
//! steal time on kernels with paravirtual steal accounting. perf's
//! `task-clock` measures nearly the same thing with perf's clock but differs
//! by microseconds per sleep/wake cycle on these KVM guests; a task-clock
//! event is read by [`crate::mapped::MappedCounter`] instead, with its own
//! `read(2)` value as the base.
//!
//! # Methods ([`ReadMethod`], as for counters)
//!
//! - **`PageTime`** — where the kernel offers `cap_user_time` on a
//!   per-thread task-clock page (bare metal, native stable sched clock):
//!   `time_running` plus the TSC time since the page was written, the
//!   documented extrapolation, plus the thread's CPU time before the event
//!   was opened (measured once). No system call after that; from then on
//!   the value advances with the task-clock's running time.
//! - **`ReadPlusTsc`** — otherwise, e.g. on KVM guests whose sched clock is
//!   kvm-clock: the page's times are unusable, but the kernel still rewrites
//!   the page (its `lock` moves) at every context switch of the thread. A
//!   sync takes one `CLOCK_THREAD_CPUTIME_ID` syscall and the TSC around
//!   it; later reads answer `base + TSC delta` as long as the `lock` read
//!   after the `rdtsc` is unchanged (the thread has not been switched out
//!   since) and less than [`MAX_SYNC_INTERVAL`] has passed.
//! - **`Syscall`** — no usable TSC or no perf event: every read is the syscall.
//!
//! # Error bound (ReadPlusTsc)
//!
//! Between syncs the TSC counts time the guest cannot see: host steal time
//! (excluded from `CLOCK_THREAD_CPUTIME_ID` by paravirt steal accounting).
//! The error of one read is therefore at most the steal time inside one sync
//! interval, i.e. at most [`MAX_SYNC_INTERVAL`], plus half the sync
//! syscall's TSC bracket (the base is its midpoint; brackets longer than
//! [`MAX_SYNC_BRACKET`] are retried): [`ERROR_BOUND`] = 202 µs. Reads are
//! monotonic: after a sync that finds the extrapolation ran ahead, values
//! hold until the thread's CPU time catches up. Measured on a loaded 2-vCPU
//! KVM guest (`tests/clocks.rs`, 8 threads × 100,000 bracketed reads, 6
//! runs): at least 99.9 % of each thread's reads within 5 µs, worst 30 µs.
//! With a 500 µs interval the worst was 121 µs and 99.67 %, hence 200 µs.
//!
//! # Caveats
//!
//! - `prctl(PR_TASK_PERF_EVENTS_DISABLE)` stops the reader's own event too;
//!   context switches then go unseen, and until it is re-enabled a
//!   `ReadPlusTsc` read may count up to [`MAX_SYNC_INTERVAL`] of sleep (still within
//!   [`ERROR_BOUND`]).
//! - The page's `lock` rising at every context switch was verified on
//!   kernel 6.18 for non-inherited per-thread events; this reader never
//!   uses `inherit`.
//!
//! # Costs
//!
//! A thread that never asks pays nothing. The first read on a thread opens a
//! task-clock event and maps its page (about 14 µs); the thread-local
//! state closes and unmaps them when the thread exits.

use std::cell::{Cell, OnceCell};
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};

use perf_event_open_sys::bindings as b;

use crate::arch;
use crate::attr::{EventAttr, Kind};
use crate::clock::clock;
use crate::mmap::{Mapping, NativeCpu, page_size};
pub use crate::read::{ERROR_BOUND, MAX_SYNC_BRACKET, MAX_SYNC_INTERVAL, ReadMethod, TscSinceRead};
use crate::sys::{self, Errno, Sys};

/// [`ReadMethod::ReadPlusTsc`] for the thread's CPU time: the last
/// `CLOCK_THREAD_CPUTIME_ID` plus the TSC since, values never going down.
#[derive(Debug)]
struct SinceSyscall {
    tsc: TscSinceRead,
    /// The value at the last sync.
    base: Cell<u64>,
    /// The largest value returned so far.
    last: Cell<u64>,
}

impl SinceSyscall {
    /// One monotonic value: the base plus the time since the sync, syncing
    /// with `sync` when the page's lock moved or the interval ran out.
    #[inline(always)]
    fn read<E>(&self, page: &Mapping, sync: impl FnMut() -> Result<u64, E>) -> Result<u64, E> {
        if let Some(d) = self.tsc.since_sync(page, arch::rdtsc()) {
            self.last.set(self.last.get().max(self.base.get() + d));
            return Ok(self.last.get());
        }
        self.resync(page, sync)
    }

    #[cold]
    fn resync<E>(&self, page: &Mapping, sync: impl FnMut() -> Result<u64, E>) -> Result<u64, E> {
        let value = self.tsc.sync(page, sync)?;
        self.base.set(value);
        self.last.set(self.last.get().max(value));
        Ok(self.last.get())
    }
}

/// Virtual time of the thread that created it. Not `Send`: its event counts
/// that thread only.
#[derive(Debug)]
pub struct ThreadClock {
    imp: Imp,
    _not_send: PhantomData<*const ()>,
}

#[derive(Debug)]
enum Imp {
    Mapped { page: Mapping, _fd: OwnedFd, mode: Mapped },
    Syscall { reason: String },
}

#[derive(Debug)]
enum Mapped {
    /// cap_user_time: the page's running time plus `offset`, the thread's
    /// CPU time before the event was opened (measured once at open).
    PageTime {
        offset: u64,
    },
    ReadPlusTsc(SinceSyscall),
}

/// The task-clock's running time from a cap_user_time page, extrapolated to now.
fn page_time(page: &Mapping) -> Option<u64> {
    let r = page.read(&NativeCpu, true)?;
    Some(r.running.wrapping_add(r.since_update?))
}

fn task_clock_attr() -> b::perf_event_attr {
    // User-only (the default domain) so paranoid 2 allows it; a task-clock
    // counts the thread's whole runtime regardless.
    let task_clock = u64::from(b::PERF_COUNT_SW_TASK_CLOCK);
    let mut attr = EventAttr::new("task-clock", Kind::Software, b::PERF_TYPE_SOFTWARE, task_clock).to_raw();
    // Enabled from the start: the page is only rewritten at the context
    // switches of an enabled event.
    attr.set_disabled(0);
    attr
}

impl ThreadClock {
    /// A reader for the calling thread through the real kernel. Never fails:
    /// when no event can be opened it reads the syscall and says why.
    pub fn new() -> ThreadClock {
        ThreadClock::with_sys(&*sys::kernel())
    }

    /// A reader for the calling thread through `sys` (tests hand in pages).
    pub fn with_sys(sys: &dyn Sys) -> ThreadClock {
        let imp = match Self::open(sys) {
            Ok(imp) => imp,
            Err(reason) => Imp::Syscall { reason },
        };
        ThreadClock { imp, _not_send: PhantomData }
    }

    fn open(sys: &dyn Sys) -> Result<Imp, String> {
        let mut attr = task_clock_attr();
        let fd = sys
            .perf_event_open(&mut attr, 0, -1, None, u64::from(b::PERF_FLAG_FD_CLOEXEC))
            .map_err(|e| format!("perf_event_open(task-clock) failed: {e}"))?;
        let page = sys
            .mmap(fd.as_fd(), page_size())
            .map_err(|e| format!("mmap of the task-clock page failed: {e}"))?;
        let r = page.read(&NativeCpu, true).ok_or("the task-clock page's seqlock never settled")?;
        let mode = if r.caps.user_time {
            // Bracket the page time with the syscall once: the offset makes
            // both count from the thread's start.
            let c0 = thread_cputime_syscall();
            let p = page_time(&page).ok_or("the task-clock page withdrew cap_user_time")?;
            let c1 = thread_cputime_syscall();
            Mapped::PageTime { offset: (c0 + (c1 - c0) / 2).wrapping_sub(p) }
        } else {
            let reason = match clock().info().source {
                crate::clock::Source::Monotonic { reason } => reason,
                crate::clock::Source::Tsc => String::new(),
            };
            let rate = clock().tsc_rate().ok_or(format!("no usable TSC: {reason}"))?;
            Mapped::ReadPlusTsc(SinceSyscall {
                tsc: TscSinceRead::new(rate),
                base: Cell::new(0),
                last: Cell::new(0),
            })
        };
        Ok(Imp::Mapped { page, _fd: fd, mode })
    }

    /// The method this reader uses.
    pub fn method(&self) -> ReadMethod {
        match &self.imp {
            Imp::Mapped { mode: Mapped::PageTime { .. }, .. } => ReadMethod::PageTime,
            Imp::Mapped { mode: Mapped::ReadPlusTsc(_), .. } => ReadMethod::ReadPlusTsc,
            Imp::Syscall { reason } => ReadMethod::Syscall { reason: reason.clone() },
        }
    }

    /// How many syscall syncs [`ReadMethod::ReadPlusTsc`] has made (0 for the others).
    pub fn syncs(&self) -> u64 {
        match &self.imp {
            Imp::Mapped { mode: Mapped::ReadPlusTsc(h), .. } => h.tsc.syncs(),
            _ => 0,
        }
    }

    /// The thread's CPU time in nanoseconds.
    ///
    /// `CLOCK_THREAD_CPUTIME_ID` cannot fail for the calling thread; should
    /// the kernel refuse anyway, the last value is returned (reads stay monotonic).
    #[inline]
    pub fn now(&self) -> u64 {
        match &self.imp {
            Imp::Mapped { page, mode: Mapped::ReadPlusTsc(h), .. } => {
                let last = h.last.get();
                h.read(page, || sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID)).unwrap_or(last)
            }
            Imp::Mapped { page, mode: Mapped::PageTime { offset }, .. } => match page_time(page) {
                Some(t) => t.wrapping_add(*offset),
                None => thread_cputime_syscall(),
            },
            Imp::Syscall { .. } => thread_cputime_syscall(),
        }
    }
}

impl Default for ThreadClock {
    fn default() -> Self {
        ThreadClock::new()
    }
}

fn thread_cputime_syscall() -> u64 {
    sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

thread_local! {
    static THREAD: OnceCell<ThreadClock> = const { OnceCell::new() };
}

/// The calling thread's virtual time in nanoseconds (see the module docs).
/// The first call on a thread sets up its reader.
#[inline]
pub fn thread_cpu_ns() -> u64 {
    // During thread teardown (another TLS destructor asking after ours
    // ran) the syscall answers.
    THREAD.try_with(|c| c.get_or_init(ThreadClock::new).now()).unwrap_or_else(|_| thread_cputime_syscall())
}

/// The method [`thread_cpu_ns`] uses on the calling thread (sets it up).
pub fn thread_method() -> ReadMethod {
    THREAD
        .try_with(|c| c.get_or_init(ThreadClock::new).method())
        .unwrap_or_else(|_| ReadMethod::Syscall { reason: "the thread is exiting".into() })
}

/// The process's CPU time in nanoseconds: `CLOCK_PROCESS_CPUTIME_ID`, one
/// syscall. No user-space path exists: the sum covers threads that exited
/// and threads running elsewhere right now, which only the kernel knows.
pub fn process_cpu_ns() -> Result<u64, Errno> {
    sys::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmap::{Caps, PageImage};
    use crate::sys::mock::MockSys;

    #[test]
    fn kernel_time_method_uses_the_page_extrapolation() {
        // Delta ~0 at the moment of the test, growing with the real TSC.
        let image = PageImage::user_time_now(5_000_000, 4_000_000);
        image.bump_lock(2);
        let k = MockSys::with_page(&image);
        let c = ThreadClock::with_sys(&*k);
        assert_eq!(c.method(), ReadMethod::PageTime);
        // The page says 4 ms of task-clock; the offset measured at open
        // lines that up with the thread's CPU time since its start.
        let c0 = thread_cputime_syscall();
        let v = c.now();
        assert!(v.abs_diff(c0) < 1_000_000, "page time + offset {v} vs CLOCK_THREAD_CPUTIME_ID {c0}");
        let w = c.now();
        assert!(w >= v, "the TSC moved forward, so must the extrapolation");
        assert_eq!(c.syncs(), 0, "no syscall sync in this mode");
        // A page that withdraws cap_user_time is not trusted: the syscall answers.
        image.set_caps(Caps::default());
        image.bump_lock(2);
        let x = c.now();
        let c1 = thread_cputime_syscall();
        assert!(x <= c1 && x >= c0, "{c0} <= {x} <= {c1}");
    }

    #[test]
    fn read_plus_tsc_resyncs_when_the_lock_moves_and_only_then() {
        if !clock().is_tsc() {
            eprintln!("TSC not usable here ({:?}); the hybrid method is not used", clock().info().source);
            return;
        }
        let image = PageImage::new();
        image.bump_lock(2);
        let k = MockSys::with_page(&image);
        let c = ThreadClock::with_sys(&*k);
        assert_eq!(c.method(), ReadMethod::ReadPlusTsc);
        let a = c.now();
        assert_eq!(c.syncs(), 1);
        // Unchanged lock within the interval: no syscall (retried, as a
        // host preemption between two reads can exceed the interval).
        let mut b2 = a;
        let quiet = (0..5).any(|_| {
            let before = c.syncs();
            b2 = c.now();
            c.syncs() == before
        });
        assert!(quiet && b2 >= a, "every read synced: {}", c.syncs());
        let synced = c.syncs();
        // A context switch, as the kernel shows it.
        image.bump_lock(2);
        let d = c.now();
        assert_eq!(c.syncs(), synced + 1);
        assert!(d >= b2);
        // The interval bound forces a sync even with a quiet page.
        std::thread::sleep(MAX_SYNC_INTERVAL * 2);
        c.now();
        assert_eq!(c.syncs(), synced + 2);
    }

    #[test]
    fn reads_stay_monotonic_when_a_sync_finds_the_extrapolation_ahead() {
        let Some(rate) = clock().tsc_rate() else {
            eprintln!("TSC not usable here; skipping");
            return;
        };
        let image = PageImage::new();
        image.bump_lock(2);
        let h = SinceSyscall { tsc: TscSinceRead::new(rate), base: Cell::new(0), last: Cell::new(0) };
        let page = Mapping::from_image(image.clone());
        let v1 = h.read(&page, || Ok::<_, ()>(1_000_000)).unwrap();
        assert_eq!(v1, 1_000_000);
        // Spin a little so the extrapolation runs ahead of a frozen source.
        let t = arch::rdtsc();
        while arch::rdtsc() - t < 20_000 {}
        let v2 = h.read(&page, || Ok::<_, ()>(1_000_000)).unwrap();
        assert!(v2 > v1);
        image.bump_lock(2);
        // The source went "back" to 1_000_001: the reader holds at v2.
        let v3 = h.read(&page, || Ok::<_, ()>(1_000_001)).unwrap();
        assert_eq!(v3, v2);
        // An error from the source is passed through.
        image.bump_lock(2);
        assert_eq!(h.read(&page, || Err::<u64, _>("nope")), Err("nope"));
    }

    #[test]
    fn syscall_method_says_why() {
        let no_perf = MockSys::new();
        no_perf.fail_open(Errno(libc::EACCES));
        let c = ThreadClock::with_sys(&*no_perf);
        match c.method() {
            ReadMethod::Syscall { reason } => assert!(reason.contains("EACCES"), "{reason}"),
            m => panic!("expected the syscall method, got {m:?}"),
        }
        let a = c.now();
        let b2 = c.now();
        assert!(b2 >= a && a > 0);
    }
}
