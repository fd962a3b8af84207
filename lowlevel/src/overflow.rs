//! `PAPI_overflow` on perf sampling: call a handler every `threshold`
//! events of an event in a set, on the thread that runs the set.
//!
//! Each overflowing event is a perf sampling event with
//! `sample_period = threshold` whose wakeups are routed to the thread that
//! starts the set by a real-time signal (see
//! [`papirus_substrate::signal`]: which signal, and why re-arming needs no
//! `PERF_EVENT_IOC_REFRESH`). The handler receives the set's id, the
//! interrupted address (the sample's IP), the overflow vector (bit `i` set
//! for the set's event `i`) and the signal context. Unlike PAPI's perf
//! component, which reads only the newest sample and drops older ones, every
//! sample in the ring produces one handler call, so a threshold-1 breakpoint
//! over N calls gives exactly N calls.
//!
//! # What a handler may do
//!
//! Handlers run in signal context: use atomics and memory the handler owns,
//! nothing that allocates, locks or prints (a `Mutex` held by the
//! interrupted code deadlocks; `println!` takes stdout's lock). To do more,
//! use the deferred mode ([`OverflowSet::overflow_deferred`]): samples go
//! into a lock-free [`SampleQueue`] a normal thread drains.
//!
//! # Events in one set
//!
//! Events are opened when the set starts, each on its own descriptor (not a
//! perf group): overflowing events as samplers, the others as counters. A
//! set is started and stopped by the thread that owns it; overflow signals go
//! to that thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use papirus_substrate::names::parse_event;
use papirus_substrate::sample::{Record, SampleType, Sampler, Sampling};
use papirus_substrate::signal::{
    Delivery, MIN_CLOCK_PERIOD_NS, Notifier, NotifierStats, default_signal, gettid,
};

use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;

// perf's software clock events (linux/perf_event.h, perf_sw_ids).
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
use papirus_substrate::{Counter, EventAttr, Target};

use crate::error::{Error, Result, SetOp};
use crate::eventset::EventSet;
use crate::profil::{ProfilFlags, Profile, Region};

/// `PAPI_OVERFLOW_FORCE_SW`: emulate overflow by polling. Not offered: perf
/// samples every event papirus can open.
pub const OVERFLOW_FORCE_SW: u32 = 0x40;
/// `PAPI_OVERFLOW_HARDWARE`: the kernel signals overflows (the only mode).
pub const OVERFLOW_HARDWARE: u32 = 0x80;

/// What a handler receives for one overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverflowInfo {
    /// The event set's id.
    pub event_set: i32,
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

#[derive(Clone)]
enum Dispatch {
    Handler(OverflowHandler),
    Deferred(Arc<SampleQueue>),
    Profile(Arc<Profile>),
}

struct Entry {
    attr: EventAttr,
    threshold: u64,
    dispatch: Option<Dispatch>,
    live: Option<Live>,
    last_stats: Option<NotifierStats>,
}

enum Live {
    Sampling(Notifier),
    Counting(Counter),
}

/// An event set with overflow handlers and profiles.
pub struct OverflowSet {
    id: i32,
    signal: i32,
    entries: Vec<Entry>,
    owner: Option<i32>,
}

impl std::fmt::Debug for OverflowSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverflowSet")
            .field("id", &self.id)
            .field("signal", &self.signal)
            .field("events", &self.entries.iter().map(|e| (e.attr.name(), e.threshold)).collect::<Vec<_>>())
            .field("owner", &self.owner)
            .finish()
    }
}

impl OverflowSet {
    /// An empty set with id `id` (reported to handlers), using the default
    /// overflow signal.
    pub fn new(id: i32) -> Self {
        OverflowSet { id, signal: default_signal(), entries: Vec::new(), owner: None }
    }

    fn stopped(&self, op: SetOp) -> Result<()> {
        if self.owner.is_some() { Err(Error::IsRunning { op }) } else { Ok(()) }
    }

    /// An overflow set with the events of `set`, in the same order, so
    /// indices and overflow-vector bits match the event set's positions;
    /// `id` is reported to handlers.
    ///
    /// The two sets open their events separately (an [`EventSet`] cannot yet
    /// hand its descriptors over): count with one or the other. Derived
    /// presets (several native terms) are refused: perf cannot sample a sum.
    pub fn from_event_set(set: &EventSet, id: i32) -> Result<Self> {
        let mut out = OverflowSet::new(id);
        for e in set.events() {
            match e.terms.as_slice() {
                [one] => {
                    let mut attr = parse_event(one)?;
                    attr.name_as(e.name.clone());
                    out.add_attr(attr)?;
                }
                terms => {
                    return Err(Error::NotSupported {
                        op: SetOp::SetOption,
                        reason: format!(
                            "`{}` is derived from {} native events ({}); overflow and profil need one native event",
                            e.name,
                            terms.len(),
                            terms.join(", ")
                        ),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Uses real-time signal `signal` for this set's overflows.
    pub fn set_signal(&mut self, signal: i32) -> Result<&mut Self> {
        self.stopped(SetOp::SetOption)?;
        if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
            return Err(Error::Invalid {
                what: "overflow signal",
                reason: format!(
                    "{signal} is not a real-time signal ({}..={})",
                    libc::SIGRTMIN(),
                    libc::SIGRTMAX()
                ),
            });
        }
        self.signal = signal;
        Ok(self)
    }

    /// Adds an event by name (perf syntax, `mem:0xADDR:x`, …); returns its index.
    pub fn add(&mut self, name: &str) -> Result<usize> {
        let attr = parse_event(name)?;
        self.add_attr(attr)
    }

    /// Adds a described event; returns its index.
    pub fn add_attr(&mut self, attr: EventAttr) -> Result<usize> {
        self.stopped(SetOp::Add)?;
        if self.entries.len() >= 64 {
            return Err(Error::Invalid {
                what: "event set",
                reason: "an overflow vector has 64 bits: at most 64 events".into(),
            });
        }
        if self.entries.iter().any(|e| e.attr == attr) {
            return Err(Error::Duplicate { event: attr.name().to_string() });
        }
        self.entries.push(Entry { attr, threshold: 0, dispatch: None, live: None, last_stats: None });
        Ok(self.entries.len() - 1)
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn set_dispatch(&mut self, index: usize, threshold: u64, flags: u32, d: Dispatch) -> Result<()> {
        self.stopped(SetOp::SetOption)?;
        if flags & OVERFLOW_FORCE_SW != 0 {
            return Err(Error::NotSupported {
                op: SetOp::SetOption,
                reason: "PAPI_OVERFLOW_FORCE_SW: papirus has no polling overflow; perf sampling (hardware mode) works for every event it can open, software ones included".into(),
            });
        }
        let n = self.entries.len();
        let e = self.entries.get_mut(index).ok_or_else(|| Error::Invalid {
            what: "event index",
            reason: format!("{index} is not in a set of {n} events"),
        })?;
        let clock = e.attr.type_() == PERF_TYPE_SOFTWARE
            && [PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_TASK_CLOCK].contains(&e.attr.config_value());
        if clock && threshold != 0 && threshold < MIN_CLOCK_PERIOD_NS {
            return Err(Error::Invalid {
                what: "overflow threshold",
                reason: format!(
                    "{threshold} ns of `{}`: periods under {MIN_CLOCK_PERIOD_NS} ns are shorter than a signal handler here and would livelock the thread; sample faster with a ring read by a normal thread (papirus_substrate::sample)",
                    e.attr.name()
                ),
            });
        }
        if threshold == 0 {
            e.threshold = 0;
            e.dispatch = None;
        } else {
            e.threshold = threshold;
            e.dispatch = Some(d);
        }
        Ok(())
    }

    /// `PAPI_overflow`: call `handler` every `threshold` events of event
    /// `index`; threshold 0 turns it off. `flags`: [`OVERFLOW_HARDWARE`] or 0.
    /// The set must be stopped.
    pub fn overflow(
        &mut self,
        index: usize,
        threshold: u64,
        flags: u32,
        handler: OverflowHandler,
    ) -> Result<()> {
        self.set_dispatch(index, threshold, flags, Dispatch::Handler(handler))
    }

    /// Like [`OverflowSet::overflow`], but each overflow is queued in `queue`
    /// for a normal thread to drain; a full queue counts the drop.
    pub fn overflow_deferred(&mut self, index: usize, threshold: u64, queue: Arc<SampleQueue>) -> Result<()> {
        self.set_dispatch(index, threshold, 0, Dispatch::Deferred(queue))
    }

    /// `PAPI_profil`: a PC histogram of event `index` sampled every
    /// `threshold` events over one region (see [`crate::profil`]).
    pub fn profil(
        &mut self,
        index: usize,
        region: Region,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Arc<Profile>> {
        self.sprofil(index, vec![region], threshold, flags)
    }

    /// `PAPI_sprofil`: like [`OverflowSet::profil`] over several regions.
    pub fn sprofil(
        &mut self,
        index: usize,
        regions: Vec<Region>,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Arc<Profile>> {
        let profile = Arc::new(Profile::new(regions, flags, threshold)?);
        self.set_dispatch(index, threshold, 0, Dispatch::Profile(profile.clone()))?;
        Ok(profile)
    }

    /// Whether any event has an overflow handler or profile.
    pub fn is_overflowing(&self) -> bool {
        self.entries.iter().any(|e| e.dispatch.is_some())
    }

    /// Opens and starts every event; overflows go to the calling thread.
    pub fn start(&mut self) -> Result<()> {
        self.stopped(SetOp::Start)?;
        if self.entries.is_empty() {
            return Err(Error::EmptySet);
        }
        let owner = gettid();
        let (id, signal) = (self.id, self.signal);
        let mut opened = Vec::with_capacity(self.entries.len());
        for (index, e) in self.entries.iter().enumerate() {
            let live = match &e.dispatch {
                None => Live::Counting(e.attr.open(Target::ThisThread)?),
                Some(d) => {
                    let mut s = Sampling::period(e.threshold);
                    // No PERIOD field: with it the kernel samples software
                    // events (page-faults, …) on every event, ignoring the period.
                    s.sample_type(SampleType::IP | SampleType::TID).wakeup_events(1);
                    let sampler = Sampler::open(&e.attr, &s, 0, -1)?;
                    let cb = callback(id, index, e.threshold, d.clone());
                    Live::Sampling(Notifier::attach(sampler, signal, owner, cb)?)
                }
            };
            opened.push(live);
        }
        for live in &opened {
            match live {
                Live::Counting(c) => c.enable()?,
                Live::Sampling(n) => n.events().enable()?,
            }
        }
        for (e, live) in self.entries.iter_mut().zip(opened) {
            e.live = Some(live);
        }
        self.owner = Some(owner);
        Ok(())
    }

    /// Reads every event's count, in index order.
    pub fn read(&self) -> Result<Vec<u64>> {
        if self.owner.is_none() {
            return Err(Error::NotRunning { op: SetOp::Read });
        }
        self.entries
            .iter()
            .map(|e| match &e.live {
                Some(Live::Counting(c)) => Ok(c.read()?.raw),
                Some(Live::Sampling(n)) => Ok(n.events().read_count()?.value),
                None => Ok(0),
            })
            .collect()
    }

    /// Stops the set, returns the final counts and closes the events.
    pub fn stop(&mut self) -> Result<Vec<u64>> {
        if self.owner.is_none() {
            return Err(Error::NotRunning { op: SetOp::Stop });
        }
        for e in &self.entries {
            match &e.live {
                Some(Live::Counting(c)) => c.disable()?,
                Some(Live::Sampling(n)) => n.events().disable()?,
                None => {}
            }
        }
        let values = self.read()?;
        for e in &mut self.entries {
            if let Some(Live::Sampling(n)) = &e.live {
                e.last_stats = Some(n.stats());
            }
            e.live = None;
        }
        self.owner = None;
        Ok(values)
    }

    /// Signals, samples and losses seen for overflowing event `index`
    /// (live while running, as of the stop afterwards).
    pub fn overflow_stats(&self, index: usize) -> Option<NotifierStats> {
        let e = self.entries.get(index)?;
        match &e.live {
            Some(Live::Sampling(n)) => Some(n.stats()),
            _ => e.last_stats,
        }
    }
}

fn callback(id: i32, index: usize, threshold: u64, d: Dispatch) -> papirus_substrate::signal::Callback {
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
    event_set: AtomicI32,
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
    const fn send<T: Send>() {}
    send_sync::<SampleQueue>();
    send_sync::<Profile>();
    send::<OverflowSet>();
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

    #[test]
    fn thresholds_and_indices_are_checked() {
        let mut s = OverflowSet::new(1);
        let h: OverflowHandler = Arc::new(|_| {});
        assert!(matches!(s.overflow(0, 10, 0, h.clone()), Err(Error::Invalid { .. })));
        let i = s.add("task-clock").unwrap();
        assert!(matches!(s.add("task-clock"), Err(Error::Duplicate { .. })));
        assert!(matches!(s.overflow(i, 10, OVERFLOW_FORCE_SW, h.clone()), Err(Error::NotSupported { .. })));
        assert!(
            matches!(s.overflow(i, 10, OVERFLOW_HARDWARE, h.clone()), Err(Error::Invalid { .. })),
            "10 ns clock period"
        );
        s.overflow(i, 1_000_000, OVERFLOW_HARDWARE, h).unwrap();
        assert!(s.is_overflowing());
        s.overflow(i, 0, 0, Arc::new(|_| {})).unwrap();
        assert!(!s.is_overflowing(), "threshold 0 turns overflow off");
        assert!(matches!(OverflowSet::new(2).start(), Err(Error::EmptySet)));
        assert!(matches!(s.set_signal(libc::SIGUSR1), Err(Error::Invalid { .. })));
    }
}
