//! The counters a thread's regions read: the setup's events laid out in
//! groups by the counting core ([`papirus_substrate::layout`]), opened on
//! the thread, each group read by its [`GroupReader`](papirus_substrate::read::GroupReader)
//! (from user space where exact: task-clock, rdpmc), and each event's change
//! between two readings by the core's estimator.

use std::ops::Range;
use std::sync::Arc;

use papirus_lowlevel::derived::Derivation;
use papirus_substrate::layout::{self, Term};
use papirus_substrate::mapped::MappedGroup;
use papirus_substrate::read::TscRate;
use papirus_substrate::sys::{self, Sys};
use papirus_substrate::{Count, EventAttr, Target, clock, vclock};

/// One group of the thread and the term each of its members reads.
#[derive(Debug)]
struct TermGroup {
    group: MappedGroup,
    /// Term index of each member, in group order.
    terms: Vec<usize>,
    buf: Vec<Count>,
}

/// The perf events of a thread's regions, opened on that thread (not `Send`:
/// user-space reads describe the opening thread).
#[derive(Debug)]
pub struct ThreadCounters {
    groups: Vec<TermGroup>,
    /// Term range of each event.
    events: Vec<Range<usize>>,
    derivations: Vec<Derivation>,
    /// Each term's estimate of the last [`deltas`](Self::deltas).
    scratch: Vec<i64>,
}

/// One reading of a thread's counters: the TSC, the thread's CPU time and
/// every event's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    ticks: u64,
    virtual_ns: u64,
    terms: Vec<Count>,
}

impl Reading {
    /// The TSC at the reading (PAPI's `cycles`).
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// Each metric's change since `earlier`, in the order of the setup's
    /// metrics: real ns, virtual ns, then each event (its terms' counts by
    /// the counting core's estimator, derived presets computed from them).
    /// Empty before regions are set up.
    pub fn since(&self, earlier: &Reading) -> Vec<i64> {
        let Some(setup) = super::config::current() else { return vec![] };
        let mut events = Vec::with_capacity(setup.plans.len());
        let mut at = 0;
        for (attrs, _) in &setup.plans {
            events.push(at..at + attrs.len());
            at += attrs.len();
        }
        let derivations: Vec<Derivation> = setup.plans.iter().map(|(_, d)| d.clone()).collect();
        let mut out = vec![0; 2 + events.len()];
        metric_deltas(&events, &derivations, earlier, self, &mut vec![0; at], &mut out);
        out
    }
}

/// Real ns, virtual ns, then each event's change from `then` to `now`.
fn metric_deltas(
    events: &[Range<usize>],
    derivations: &[Derivation],
    then: &Reading,
    now: &Reading,
    terms: &mut [i64],
    out: &mut [i64],
) {
    out[0] = clock::clock().delta_ns(then.ticks, now.ticks) as i64;
    out[1] = now.virtual_ns.saturating_sub(then.virtual_ns) as i64;
    for ((t, a), b) in terms.iter_mut().zip(&then.terms).zip(&now.terms) {
        *t = i64::try_from(b.since(a).value).unwrap_or(i64::MAX);
    }
    for ((o, range), d) in out[2..].iter_mut().zip(events).zip(derivations) {
        *o = d.eval(&terms[range.clone()]);
    }
}

impl ThreadCounters {
    /// Opens `events` (each its native terms and derivation) on the calling
    /// thread in the real kernel, with this process' TSC rate, and enables them.
    pub fn open(events: &[(Vec<EventAttr>, Derivation)]) -> Result<ThreadCounters, papirus_substrate::Error> {
        ThreadCounters::open_with(sys::kernel(), clock::clock().tsc_rate(), events)
    }

    /// Like [`open`](Self::open), through `sys` with TSC rate `rate`.
    pub fn open_with(
        sys: Arc<dyn Sys>,
        rate: Option<TscRate>,
        events: &[(Vec<EventAttr>, Derivation)],
    ) -> Result<ThreadCounters, papirus_substrate::Error> {
        let terms: Vec<&[EventAttr]> = events.iter().map(|(a, _)| a.as_slice()).collect();
        let mut ranges = Vec::with_capacity(events.len());
        let mut at = 0;
        for t in &terms {
            ranges.push(at..at + t.len());
            at += t.len();
        }
        let term_index = |t: &Term| ranges[t.event].start + t.term;
        let mut groups = vec![];
        for planned in layout::plan(&terms, false) {
            let attrs: Vec<EventAttr> = planned.iter().map(|t| terms[t.event][t.term].clone()).collect();
            let indices: Vec<usize> = planned.iter().map(term_index).collect();
            match MappedGroup::open_with(sys.clone(), &attrs, Target::ThisThread, rate) {
                Ok(group) => {
                    groups.push(TermGroup { group, buf: vec![Count::ZERO; attrs.len()], terms: indices })
                }
                Err(_) => {
                    // Some PMUs refuse to share a group: one group per term.
                    for (a, i) in attrs.iter().zip(indices) {
                        let group = MappedGroup::open_with(
                            sys.clone(),
                            std::slice::from_ref(a),
                            Target::ThisThread,
                            rate,
                        )?;
                        groups.push(TermGroup { group, buf: vec![Count::ZERO], terms: vec![i] });
                    }
                }
            }
        }
        for g in &groups {
            g.group.enable()?;
        }
        Ok(ThreadCounters {
            groups,
            events: ranges,
            derivations: events.iter().map(|(_, d)| d.clone()).collect(),
            scratch: vec![0; at],
        })
    }

    /// A reading of the right size, all zero.
    pub fn reading(&self) -> Reading {
        Reading { ticks: 0, virtual_ns: 0, terms: vec![Count::ZERO; self.scratch.len()] }
    }

    /// Reads the TSC, the thread's CPU time and every counter into `into`.
    /// `tsc_last` takes the TSC after the counters (at a region's begin)
    /// rather than before (at its end), so a region's time excludes most of
    /// the reading itself.
    pub fn read(&mut self, into: &mut Reading, tsc_last: bool) -> Result<(), papirus_substrate::Error> {
        let c = clock::clock();
        if !tsc_last {
            into.ticks = c.raw();
        }
        into.virtual_ns = vclock::thread_cpu_ns();
        self.read_terms(&mut into.terms)?;
        if tsc_last {
            into.ticks = c.raw();
        }
        Ok(())
    }

    /// Reads every counter into `terms` (one per term, in event order).
    pub fn read_terms(&mut self, terms: &mut [Count]) -> Result<(), papirus_substrate::Error> {
        for g in &mut self.groups {
            g.group.read_into(&mut g.buf)?;
            for (c, &t) in g.buf.iter().zip(&g.terms) {
                if let Some(slot) = terms.get_mut(t) {
                    *slot = *c;
                }
            }
        }
        Ok(())
    }

    /// Each metric's change from `then` to `now` into `out` (2 + one per
    /// event): real ns, virtual ns, then each event.
    pub fn deltas(&mut self, then: &Reading, now: &Reading, out: &mut [i64]) {
        metric_deltas(&self.events, &self.derivations, then, now, &mut self.scratch, out);
    }
}
