//! Each thread's regions as the report writer reads them: statistics behind
//! a sequence lock written only by the owning thread.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard};

use papirus_lowlevel::Tid;

/// One region of one thread, as the report writer reads it.
#[derive(Debug)]
pub(crate) struct RegionCell {
    pub(crate) name: Box<str>,
    pub(crate) id: u32,
    pub(crate) parent: Option<u32>,
    /// Even when stable, odd while the owner writes.
    seq: AtomicU32,
    /// Open instances (begun, not ended).
    open: AtomicU32,
    calls: AtomicU64,
    /// Per metric: total, min, max.
    values: Box<[AtomicI64]>,
}

/// A consistent copy of a region's statistics.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RegionSample {
    pub(crate) calls: u64,
    pub(crate) open: u32,
    /// Per metric: (total, min, max).
    pub(crate) metrics: Vec<(i64, i64, i64)>,
}

impl RegionCell {
    pub(super) fn new(name: &str, id: u32, parent: Option<u32>, metrics: usize) -> RegionCell {
        let values =
            (0..metrics * 3).map(|i| AtomicI64::new(if i % 3 == 1 { i64::MAX } else { 0 })).collect();
        RegionCell {
            name: name.into(),
            id,
            parent,
            seq: AtomicU32::new(0),
            open: AtomicU32::new(0),
            calls: AtomicU64::new(0),
            values,
        }
    }

    // ATOMICS: the owning thread is the only writer. `seq` goes odd before
    // the fields change and even (Release) after; a reader retries while it
    // is odd or moved across its loads, so it sees one call's update whole.
    fn write(&self, f: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    pub(super) fn record(&self, deltas: &[i64]) {
        self.write(|| {
            self.calls.store(self.calls.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            self.open.store(self.open.load(Ordering::Relaxed).saturating_sub(1), Ordering::Relaxed);
            for (m, &d) in self.values.chunks_exact(3).zip(deltas) {
                m[0].store(m[0].load(Ordering::Relaxed).saturating_add(d), Ordering::Relaxed);
                m[1].store(m[1].load(Ordering::Relaxed).min(d), Ordering::Relaxed);
                m[2].store(m[2].load(Ordering::Relaxed).max(d), Ordering::Relaxed);
            }
        });
    }

    pub(super) fn opened(&self) {
        self.write(|| self.open.store(self.open.load(Ordering::Relaxed) + 1, Ordering::Relaxed));
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn sample(&self) -> RegionSample {
        let mut metrics = Vec::with_capacity(self.values.len() / 3);
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                metrics.clear();
                let calls = self.calls.load(Ordering::Relaxed);
                let open = self.open.load(Ordering::Relaxed);
                for m in self.values.chunks_exact(3) {
                    let (t, lo, hi) = (
                        m[0].load(Ordering::Relaxed),
                        m[1].load(Ordering::Relaxed),
                        m[2].load(Ordering::Relaxed),
                    );
                    // No call yet: min is still its identity.
                    metrics.push(if calls == 0 { (0, 0, 0) } else { (t, lo, hi) });
                }
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return RegionSample { calls, open, metrics };
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// A thread that used regions, as the report writer sees it.
#[derive(Debug)]
pub(crate) struct ThreadShared {
    pub(crate) tid: Tid,
    pub(crate) name: String,
    /// Set when the thread exits; its statistics stay.
    pub(crate) exited: AtomicBool,
    /// Guards dropped with an error (they cannot return it).
    pub(crate) guard_errors: AtomicU64,
    pub(super) regions: Mutex<Vec<Arc<RegionCell>>>,
}

impl ThreadShared {
    pub(crate) fn regions(&self) -> MutexGuard<'_, Vec<Arc<RegionCell>>> {
        // Each update is one push; a poisoned lock holds a consistent list.
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn threads() -> MutexGuard<'static, Vec<Arc<ThreadShared>>> {
    static THREADS: Mutex<Vec<Arc<ThreadShared>>> = Mutex::new(Vec::new());
    THREADS.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_min_max_total() {
        let c = RegionCell::new("r", 0, None, 2);
        assert_eq!(c.sample().metrics, vec![(0, 0, 0); 2]);
        c.opened();
        assert!(c.is_open());
        c.record(&[5, -1]);
        c.opened();
        c.record(&[3, 7]);
        let s = c.sample();
        assert_eq!((s.calls, s.open), (2, 0));
        assert_eq!(s.metrics, vec![(8, 3, 5), (6, -1, 7)]);
    }
}
