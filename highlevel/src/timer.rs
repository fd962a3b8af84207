//! Paradyn's counters and timers: the primitives instrumentation performs.
//!
//! A [`Timer`] is started and stopped by one thread (the one running the
//! instrumented code) and sampled by any other. Starts nest: only the
//! outermost start and the matching stop touch the clock. A sampler reads a
//! consistent snapshot through a sequence lock and includes the running
//! interval up to "now", so the values it sees never decrease and never run
//! ahead of the clock.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering, fence};

use crate::clocks::TimeSource;

/// Paradyn's integer counter: set, add, subtract, readable from any thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicI64);

impl Counter {
    /// A counter at `v`.
    pub const fn new(v: i64) -> Self {
        Counter(AtomicI64::new(v))
    }
    /// Sets the value.
    #[inline]
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Adds `v`.
    #[inline]
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    /// Subtracts `v`.
    #[inline]
    pub fn sub(&self, v: i64) {
        self.0.fetch_sub(v, Ordering::Relaxed);
    }
    /// The current value.
    #[inline]
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Misuse of a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimerError {
    /// `stop` without a matching `start`.
    #[error("timer stopped more often than started: every stop needs an earlier start")]
    NotRunning,
}

/// A nesting timer over a [`TimeSource`], single writer, many readers.
#[derive(Debug)]
pub struct Timer<S: TimeSource> {
    source: S,
    /// Even when stable, odd while the owner updates.
    seq: AtomicU32,
    /// Active starts.
    depth: AtomicU32,
    /// Accumulated time of completed intervals, ns.
    total: AtomicU64,
    /// Clock value at the outermost start, ns.
    start: AtomicU64,
}

impl<S: TimeSource> Timer<S> {
    /// A stopped timer reading `source`.
    pub fn new(source: S) -> Self {
        Timer {
            source,
            seq: AtomicU32::new(0),
            depth: AtomicU32::new(0),
            total: AtomicU64::new(0),
            start: AtomicU64::new(0),
        }
    }

    // ATOMICS: the owner is the only writer. It makes `seq` odd before it
    // reads the clock and even after the fields are written (Release), so a
    // reader whose clock read came after the owner's clock read also sees
    // `seq` change and retries; that is what keeps sampled values monotonic.
    fn write(&self, f: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Starts (or nests one level deeper). Call from the owning thread only.
    #[inline]
    pub fn start(&self) {
        let d = self.depth.load(Ordering::Relaxed);
        if d > 0 {
            self.depth.store(d + 1, Ordering::Relaxed);
            return;
        }
        self.write(|| {
            self.start.store(self.source.now_ns(), Ordering::Relaxed);
            self.depth.store(1, Ordering::Relaxed);
        });
    }

    /// Stops one level; the outermost stop adds the interval to the total.
    #[inline]
    pub fn stop(&self) -> Result<(), TimerError> {
        match self.depth.load(Ordering::Relaxed) {
            0 => Err(TimerError::NotRunning),
            1 => {
                self.write(|| {
                    let now = self.source.now_ns();
                    let start = self.start.load(Ordering::Relaxed);
                    let total = self.total.load(Ordering::Relaxed);
                    self.total.store(total + now.saturating_sub(start), Ordering::Relaxed);
                    self.depth.store(0, Ordering::Relaxed);
                });
                Ok(())
            }
            d => {
                self.depth.store(d - 1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Whether at least one start is active.
    pub fn is_running(&self) -> bool {
        self.depth.load(Ordering::Relaxed) > 0
    }

    /// The accumulated time in ns, including the running interval; safe from any thread.
    pub fn sample(&self) -> u64 {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let total = self.total.load(Ordering::Relaxed);
            let depth = self.depth.load(Ordering::Relaxed);
            let start = self.start.load(Ordering::Relaxed);
            let value = if depth > 0 { total + self.source.now_ns().saturating_sub(start) } else { total };
            fence(Ordering::SeqCst);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fake(std::sync::Arc<AtomicU64>);
    impl TimeSource for Fake {
        fn now_ns(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn counter_ops() {
        let c = Counter::new(5);
        c.add(3);
        c.sub(10);
        assert_eq!(c.get(), -2);
        c.set(7);
        assert_eq!(c.get(), 7);
    }

    #[test]
    fn nesting_counts_outermost_interval_only() {
        let clock = std::sync::Arc::new(AtomicU64::new(100));
        let t = Timer::new(Fake(clock.clone()));
        t.start();
        clock.store(150, Ordering::SeqCst);
        t.start();
        clock.store(170, Ordering::SeqCst);
        t.stop().unwrap();
        assert!(t.is_running());
        assert_eq!(t.sample(), 70);
        clock.store(200, Ordering::SeqCst);
        t.stop().unwrap();
        assert!(!t.is_running());
        clock.store(1000, Ordering::SeqCst);
        assert_eq!(t.sample(), 100);
        assert_eq!(t.stop(), Err(TimerError::NotRunning));
    }
}
