//! The clocks timers read.
//!
//! * [`Wall`]: real time from the TSC with the kernel's conversion
//!   ([`papirus_substrate::clock`]), no system call (about 10 ns here).
//! * [`ProcessTime`]: the CPU time of the whole process
//!   (`CLOCK_PROCESS_CPUTIME_ID`), readable from any thread; one system
//!   call a read (about 400 ns here), because only the kernel knows the
//!   time of threads running elsewhere right now.

use std::sync::atomic::{AtomicU64, Ordering};

use papirus_substrate::{arch, clock, vclock};

/// A monotonic clock in nanoseconds, readable from any thread.
pub trait TimeSource: Send + Sync + std::fmt::Debug {
    /// The current time in ns from an arbitrary origin.
    fn now_ns(&self) -> u64;
}

impl<T: TimeSource + ?Sized> TimeSource for &T {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// Wall-clock (real) time: the TSC scaled to ns by the substrate's clock,
/// which falls back to `CLOCK_MONOTONIC` where the TSC is unusable.
///
/// The read is fenced on both sides (`lfence; rdtsc; lfence`): a plain
/// `rdtsc` may execute before the loads ahead of it or after the loads
/// behind it, and a timer's sampler that reads the clock inside its
/// sequence-lock window then sees values decrease (measured here: 45 ns
/// backwards within 10 million start/stop pairs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Wall;

impl TimeSource for Wall {
    #[inline]
    fn now_ns(&self) -> u64 {
        let c = clock::clock();
        let raw = c.raw_ordered();
        arch::lfence();
        c.scaled(raw)
    }
}

/// The process's CPU time (all its threads, live and exited).
///
/// `clock_gettime` cannot fail for this clock on Linux; should it ever, the
/// last value read is returned so timers built on it never go backwards.
#[derive(Debug, Default)]
pub struct ProcessTime {
    last: AtomicU64,
}

impl ProcessTime {
    /// A process-time clock.
    pub const fn new() -> Self {
        ProcessTime { last: AtomicU64::new(0) }
    }
}

impl TimeSource for ProcessTime {
    fn now_ns(&self) -> u64 {
        match vclock::process_cpu_ns() {
            Ok(t) => {
                // ATOMICS: a max over all readers, so no reader hands out
                // less than a value another reader already returned.
                let prev = self.last.fetch_max(t, Ordering::Relaxed);
                prev.max(t)
            }
            Err(_) => self.last.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_time_counts_other_threads_and_never_decreases() {
        let p = ProcessTime::new();
        let before = p.now_ns();
        // The other thread spins until the kernel says it used 30 ms of CPU.
        let used = std::thread::spawn(|| {
            let cpu = || papirus_substrate::sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap();
            let t0 = cpu();
            while cpu() - t0 < 30_000_000 {
                std::hint::black_box(0u64);
            }
            cpu() - t0
        })
        .join()
        .unwrap();
        let after = p.now_ns();
        assert!(after - before >= used, "process time grew {} ns, the thread used {used} ns", after - before);
    }
}
