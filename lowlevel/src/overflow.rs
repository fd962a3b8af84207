//! `PAPI_overflow` on perf sampling: call a handler every `threshold`
//! events of an event in an [`EventSet`](crate::EventSet), on the thread
//! the set counts. Set it with [`EventSet::overflow`](crate::EventSet::overflow),
//! [`EventSet::overflow_deferred`](crate::EventSet::overflow_deferred),
//! [`EventSet::profil`](crate::EventSet::profil) or
//! [`EventSet::sprofil`](crate::EventSet::sprofil); this module has what
//! those hand out.
//!
//! An overflowing event keeps its one descriptor in the set's group, opened
//! as a sampling event with `sample_period = threshold`; its ring is mapped
//! and its wakeups are routed to the set's owner thread by a real-time
//! signal (see [`papirus_substrate::signal`]: which signal, and why
//! re-arming needs no `PERF_EVENT_IOC_REFRESH`). The event is never paused
//! or refreshed, so its count, read with the rest of the set, is exact. The
//! handler receives the set's id, the interrupted address (the sample's
//! IP), the overflow vector (bit `i` set for the set's event `i`) and the
//! signal context. Unlike PAPI's perf component, which reads only the
//! newest sample and drops older ones, every sample in the ring produces
//! one handler call, so a threshold-1 breakpoint over N calls gives exactly
//! N calls.
//!
//! # What a handler may do
//!
//! Handlers run in signal context: use atomics and memory the handler owns,
//! nothing that allocates, locks or prints (a `Mutex` held by the
//! interrupted code deadlocks; `println!` takes stdout's lock). To do more,
//! use the deferred mode: samples go into a lock-free [`SampleQueue`] a
//! normal thread drains.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use papirus_substrate::EventAttr;
use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::sample::{Record, SampleType, Sampling};
use papirus_substrate::signal::{Delivery, MIN_CLOCK_PERIOD_NS};

use crate::error::{Error, Result, SetOp};
use crate::profil::Profile;

// perf's software clock events (linux/perf_event.h, perf_sw_ids).
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;

/// `PAPI_OVERFLOW_FORCE_SW`: emulate overflow by polling. Not offered: perf
/// samples every event papirus can open.
pub const OVERFLOW_FORCE_SW: u32 = 0x40;
/// `PAPI_OVERFLOW_HARDWARE`: the kernel signals overflows (the only mode).
pub const OVERFLOW_HARDWARE: u32 = 0x80;

/// What a handler receives for one overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverflowInfo {
    /// The event set's id ([`EventSet::id`](crate::EventSet::id)).
    pub event_set: u64,
    /// The interrupted instruction address (the sample IP).
    pub address: u64,
    /// Bit `i` set for the set's event `i` that overflowed.
    pub vector: u64,
    /// The interrupted context (`ucontext_t *`) as an address; valid during the call only.
    pub context: usize,
    /// The thread the handler runs on.
    pub tid: i32,
    /// The sample period the kernel reports (the threshold).
    pub period: u64,
}

/// An overflow handler; it runs in signal context (see the module docs).
pub type OverflowHandler = Arc<dyn Fn(&OverflowInfo) + Send + Sync + 'static>;

/// The indices of the events set in an overflow vector, lowest first
/// (`PAPI_get_overflow_event_index`).
pub fn overflow_event_indices(vector: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| vector & (1u64 << i) != 0)
}

/// What an overflowing event does with each sample.
#[derive(Clone)]
pub(crate) enum Dispatch {
    /// Calls the user's handler in the signal handler.
    Handler(OverflowHandler),
    /// Queues the sample for a normal thread.
    Deferred(Arc<SampleQueue>),
    /// Adds the sample to a histogram.
    Profile(Arc<Profile>),
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dispatch::Handler(_) => f.write_str("Handler"),
            Dispatch::Deferred(q) => f.debug_tuple("Deferred").field(&q.capacity()).finish(),
            Dispatch::Profile(p) => f.debug_tuple("Profile").field(p).finish(),
        }
    }
}

/// Checks `flags` and a non-zero `threshold` for overflow on `attr`.
pub(crate) fn check_request(attr: &EventAttr, threshold: u64, flags: u32) -> Result<()> {
    if flags & OVERFLOW_FORCE_SW != 0 {
        return Err(Error::NotSupported {
            op: SetOp::SetOption,
            reason: "PAPI_OVERFLOW_FORCE_SW: papirus has no polling overflow; perf sampling (hardware mode) works for every event it can open, software ones included".into(),
        });
    }
    if flags & !OVERFLOW_HARDWARE != 0 {
        return Err(Error::Invalid {
            what: "overflow flags",
            reason: format!("unknown bits {:#x}: pass 0 or OVERFLOW_HARDWARE", flags & !OVERFLOW_HARDWARE),
        });
    }
    let clock = attr.pmu_type() == PERF_TYPE_SOFTWARE
        && [PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_TASK_CLOCK].contains(&attr.config_value());
    if clock && threshold < MIN_CLOCK_PERIOD_NS {
        return Err(Error::Invalid {
            what: "overflow threshold",
            reason: format!(
                "{threshold} ns of `{}`: periods under {MIN_CLOCK_PERIOD_NS} ns are shorter than a signal handler here and would livelock the thread; sample faster with a ring read by a normal thread (papirus_substrate::sample)",
                attr.name()
            ),
        });
    }
    Ok(())
}

/// How an overflowing event samples: every `threshold` events, a wakeup
/// (and so a signal) per sample.
pub(crate) fn sampling(threshold: u64) -> Sampling {
    let mut s = Sampling::period(threshold);
    // No PERIOD field: with it the kernel samples software events
    // (page-faults, …) on every event, ignoring the period.
    s.sample_type(SampleType::IP | SampleType::TID).wakeup_events(1);
    s
}

/// The signal-handler callback of event `index` of set `id`.
pub(crate) fn callback(
    id: u64,
    index: usize,
    threshold: u64,
    d: Dispatch,
) -> papirus_substrate::signal::Callback {
    let vector = 1u64 << index;
    Box::new(move |rec: &Record<'_>, del: &Delivery| {
        let Record::Sample(s) = rec else { return };
        let info = OverflowInfo {
            event_set: id,
            address: s.ip.unwrap_or(0),
            vector,
            context: del.ucontext,
            tid: del.tid,
            period: s.period.unwrap_or(threshold),
        };
        match &d {
            Dispatch::Handler(h) => h(&info),
            Dispatch::Deferred(q) => {
                q.push(&info);
            }
            Dispatch::Profile(p) => p.record(info.address, info.period),
        }
    })
}

/// A bounded lock-free queue of overflows: pushed from signal handlers,
/// popped by any thread. Slots carry a sequence number (a Vyukov bounded
/// queue), so any number of producers and consumers may share it; a push
/// never waits and never allocates.
#[derive(Debug)]
pub struct SampleQueue {
    slots: Box<[QueueSlot]>,
    head: AtomicU64,
    tail: AtomicU64,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct QueueSlot {
    seq: AtomicU64,
    address: AtomicU64,
    vector: AtomicU64,
    context: AtomicU64,
    period: AtomicU64,
    event_set: AtomicU64,
    tid: AtomicI32,
}

impl SampleQueue {
    /// A queue of `capacity` samples (at least 1).
    pub fn new(capacity: usize) -> Self {
        let slots: Box<[QueueSlot]> = (0..capacity.max(1) as u64)
            .map(|i| QueueSlot { seq: AtomicU64::new(i), ..QueueSlot::default() })
            .collect();
        SampleQueue { slots, head: AtomicU64::new(0), tail: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    fn slot(&self, pos: u64) -> &QueueSlot {
        &self.slots[(pos % self.slots.len() as u64) as usize]
    }

    /// Queues one overflow; false (and a counted drop) when full.
    pub fn push(&self, info: &OverflowInfo) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            // ATOMICS: Acquire pairs with the consumer's Release of seq, so
            // the slot's old contents were read before we overwrite them.
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos {
                match self.tail.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        slot.address.store(info.address, Ordering::Relaxed);
                        slot.vector.store(info.vector, Ordering::Relaxed);
                        slot.context.store(info.context as u64, Ordering::Relaxed);
                        slot.period.store(info.period, Ordering::Relaxed);
                        slot.event_set.store(info.event_set, Ordering::Relaxed);
                        slot.tid.store(info.tid, Ordering::Relaxed);
                        // ATOMICS: Release publishes the fields to the consumer's Acquire.
                        slot.seq.store(pos + 1, Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if seq < pos {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest queued overflow. `context` is stale by then (the
    /// handler has returned) and is reported as 0.
    pub fn pop(&self) -> Option<OverflowInfo> {
        let cap = self.slots.len() as u64;
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            // ATOMICS: Acquire pairs with the producer's Release of seq.
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos + 1 {
                match self.head.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        let info = OverflowInfo {
                            event_set: slot.event_set.load(Ordering::Relaxed),
                            address: slot.address.load(Ordering::Relaxed),
                            vector: slot.vector.load(Ordering::Relaxed),
                            context: 0,
                            tid: slot.tid.load(Ordering::Relaxed),
                            period: slot.period.load(Ordering::Relaxed),
                        };
                        // ATOMICS: Release hands the slot back to producers.
                        slot.seq.store(pos + cap, Ordering::Release);
                        return Some(info);
                    }
                    Err(now) => pos = now,
                }
            } else if seq < pos + 1 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Overflows dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<SampleQueue>();
    send_sync::<Profile>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn info(a: u64) -> OverflowInfo {
        OverflowInfo { event_set: 3, address: a, vector: 1 << 2, context: 99, tid: 7, period: 10 }
    }

    #[test]
    fn vector_to_indices() {
        assert_eq!(overflow_event_indices(0b1010_0001).collect::<Vec<_>>(), vec![0, 5, 7]);
        assert_eq!(overflow_event_indices(1 << 63).collect::<Vec<_>>(), vec![63]);
        assert_eq!(overflow_event_indices(0).count(), 0);
    }

    #[test]
    fn queue_is_fifo_bounded_and_counts_drops() {
        let q = SampleQueue::new(4);
        for a in 0..6 {
            let ok = q.push(&info(a));
            assert_eq!(ok, a < 4);
        }
        assert_eq!(q.dropped(), 2);
        let got: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|i| i.address).collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        let i = {
            q.push(&info(9));
            q.pop().unwrap()
        };
        assert_eq!((i.event_set, i.vector, i.tid, i.period, i.context), (3, 4, 7, 10, 0));
        assert!(q.pop().is_none());
    }

    #[test]
    fn queue_survives_concurrent_producers_and_consumers() {
        let q = Arc::new(SampleQueue::new(64));
        let total = 4 * 20_000u64;
        let producers: Vec<_> = (0..4u64)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        while !q.push(&info(p * 1_000_000 + i)) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        while (seen.len() as u64) < total {
            match q.pop() {
                Some(i) => seen.push(i.address),
                None => std::thread::yield_now(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        // Each producer's items arrive in its order, none lost or duplicated.
        for p in 0..4u64 {
            let mine: Vec<u64> = seen.iter().copied().filter(|a| a / 1_000_000 == p).collect();
            assert_eq!(mine, (0..20_000).map(|i| p * 1_000_000 + i).collect::<Vec<_>>());
        }
        assert!(q.pop().is_none());
    }
}
