//! Opening a set's descriptors: limits, the group layout, the groups, their
//! user-space readers, the add-time schedulability check, overflow rings.

use papirus_substrate::layout::{self, Term};
use papirus_substrate::read::{GroupReader, ReadMethod};
use papirus_substrate::ring::RingBuffer;
use papirus_substrate::signal::Route;
use papirus_substrate::{Count, EventAttr, Group, Member, Target};

use super::members::Entry;
use super::{EventSet, Granularity, closed};
use crate::error::{Error, Result, SetOp};
use crate::overflow;

/// Where one native term of an event is read: its group and member.
#[derive(Clone, Copy, Debug)]
pub(super) struct TermAt {
    pub(super) group: usize,
    pub(super) member: Member,
}

/// How `start` finds the zero the values count from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StartBase {
    /// Never enabled: counts and times are 0.
    AllZero,
    /// The values `stop` read: a disabled, uninherited event does not
    /// change, so they are the zero, without a system call.
    ValuesAtStop,
    /// Read the counters (inherited events gain exited children's counts
    /// even while disabled).
    ReadNow,
}

/// The open descriptors of a set and their readers.
#[derive(Debug)]
pub(super) struct OpenGroups {
    /// Per entry, the overflow routing of its sampling descriptor. Declared
    /// first so routes drop before the descriptors close.
    pub(super) routes: Vec<Option<Route>>,
    pub(super) groups: Vec<Group>,
    /// Per group, its user-space reader.
    pub(super) readers: Vec<GroupReader>,
    /// Per entry, where each of its terms is read.
    pub(super) terms: Vec<Vec<TermAt>>,
    /// Per group and member, the reading values count from (start, reset, accum).
    pub(super) base: Vec<Vec<Count>>,
    /// Per group and member, the last reading.
    pub(super) counts: Vec<Vec<Count>>,
    pub(super) target: Target,
    pub(super) start: StartBase,
}

impl OpenGroups {
    /// Per entry, the read method of each term.
    pub(super) fn methods(&self) -> Vec<Vec<ReadMethod>> {
        self.terms
            .iter()
            .map(|terms| {
                terms.iter().map(|t| self.readers[t.group].methods()[t.member.index()].clone()).collect()
            })
            .collect()
    }
}

impl EventSet {
    /// (Re)opens every descriptor for the current entries and options; on
    /// failure nothing is open.
    pub(super) fn reopen(&mut self) -> Result<()> {
        self.opened = None;
        if self.entries.is_empty() {
            return Ok(());
        }
        self.check_counter_limits()?;
        let target = self.target();
        let (groups, attrs, terms) = self.open_groups(target)?;
        let sys = self.lib.sys();
        let readers = match self.no_user_space() {
            Some(reason) => groups.iter().map(|g| GroupReader::unmapped(g, &reason)).collect(),
            None => {
                let rate = papirus_substrate::clock::clock().tsc_rate();
                groups.iter().zip(&attrs).map(|(g, attrs)| GroupReader::map(&*sys, g, attrs, rate)).collect()
            }
        };
        let inherit = self.options.granularity == Granularity::Process;
        let mut opened = OpenGroups {
            routes: self.entries.iter().map(|_| None).collect(),
            base: groups.iter().map(|g| vec![Count::ZERO; g.len()]).collect(),
            counts: groups.iter().map(|g| vec![Count::ZERO; g.len()]).collect(),
            readers,
            groups,
            terms,
            target,
            start: if inherit { StartBase::ReadNow } else { StartBase::AllZero },
        };
        if self.hardware_terms() > 0 && !self.options.multiplex {
            check_schedulable(&opened, &self.entries)?;
            opened.start = StartBase::ReadNow;
        }
        // Rings are mapped after that check: samples of an unmapped event are
        // discarded by the kernel, so the check cannot call a handler.
        self.route_overflows(&mut opened)?;
        self.opened = Some(opened);
        Ok(())
    }

    /// Hardware terms of the set: each needs a counter while it runs.
    pub(super) fn hardware_terms(&self) -> usize {
        self.entries.iter().map(|e| e.hw_terms).sum()
    }

    /// PAPI's add-time check against the CPU's counters: an unmultiplexed
    /// set needs a counter per hardware term, a multiplexed one per term of
    /// its widest event.
    fn check_counter_limits(&self) -> Result<()> {
        let Some(limit) = self.lib.machine().hw_counters.filter(|&n| n > 0) else { return Ok(()) };
        let hw = self.hardware_terms();
        let widest = self.entries.iter().map(|e| e.hw_terms).max().unwrap_or(0);
        if self.options.multiplex && widest > limit {
            let e = self.entries.iter().find(|e| e.hw_terms == widest).map_or("", |e| e.info.name.as_str());
            return Err(Error::Conflict {
                event: e.to_string(),
                reason: format!(
                    "its {widest} terms must be counted together but this CPU has {limit} counters"
                ),
            });
        }
        if !self.options.multiplex && hw > limit {
            let last = self.entries.last().map_or("", |e| e.info.name.as_str());
            return Err(Error::Conflict {
                event: last.to_string(),
                reason: format!(
                    "the set would need {hw} hardware counters and this CPU has {limit}; turn on multiplexing (set_multiplex(true)) or split the events over several sets run one after another"
                ),
            });
        }
        Ok(())
    }

    /// Opens the groups of the substrate's layout on `target`, each leader
    /// pinned unless multiplexed (a pinned leader keeps an unmultiplexed set
    /// on the PMU or in error state). Returns the groups, each group's
    /// attrs as opened, and where each entry's terms are.
    #[allow(clippy::type_complexity)]
    fn open_groups(&self, target: Target) -> Result<(Vec<Group>, Vec<Vec<EventAttr>>, Vec<Vec<TermAt>>)> {
        let sys = self.lib.sys();
        let events: Vec<&[EventAttr]> = self.entries.iter().map(|e| e.attrs.as_slice()).collect();
        let plan = layout::plan(&events, self.options.multiplex);
        let mut groups: Vec<Group> = Vec::with_capacity(plan.len());
        let mut attrs: Vec<Vec<EventAttr>> = Vec::with_capacity(plan.len());
        let mut at: Vec<Vec<Option<TermAt>>> =
            self.entries.iter().map(|e| vec![None; e.attrs.len()]).collect();
        for (g, terms) in plan.iter().enumerate() {
            let mut opened: Option<Group> = None;
            let mut opened_attrs = Vec::with_capacity(terms.len());
            for &Term { event, term } in terms {
                let entry = &self.entries[event];
                let mut a = entry.attrs[term].clone();
                if let Some(d) = self.options.domain {
                    a.domain(d);
                }
                a.inherit(self.options.granularity == Granularity::Process);
                // An overflowing event (one term) is the same descriptor, sampling.
                let sampling = entry.overflow.as_ref().map(|o| overflow::sampling(o.threshold));
                let member = match (&mut opened, &sampling) {
                    (None, _) => {
                        a.pinned(!self.options.multiplex);
                        let group = match &sampling {
                            Some(s) => Group::open_sampling_with(sys.clone(), &a, s, target)?,
                            None => Group::open_with(sys.clone(), &a, target)?,
                        };
                        let leader = group.leader();
                        opened = Some(group);
                        leader
                    }
                    (Some(group), Some(s)) => group.add_sampling(&a, s)?,
                    (Some(group), None) => group.add(&a)?,
                };
                opened_attrs.push(a);
                at[event][term] = Some(TermAt { group: g, member });
            }
            groups.extend(opened);
            attrs.push(opened_attrs);
        }
        let at = at.into_iter().map(|v| v.into_iter().flatten().collect()).collect();
        Ok((groups, attrs, at))
    }

    /// Routes each overflowing event's samples to its handler.
    fn route_overflows(&self, opened: &mut OpenGroups) -> Result<()> {
        let sys = self.lib.sys();
        for (i, e) in self.entries.iter().enumerate() {
            let Some(ov) = &e.overflow else { continue };
            let Some(t) = opened.terms[i].first() else { continue };
            let fd = opened.groups[t.group].fd(&t.member).ok_or_else(|| closed(SetOp::SetOption))?;
            let s = overflow::sampling(ov.threshold);
            let ring = RingBuffer::map(sys.clone(), fd, s.data_pages_value(), s.layout(), &e.info.name)?;
            let callback = overflow::callback(self.id, i, ov.threshold, ov.dispatch.clone());
            let route = Route::attach(&sys, fd, &e.info.name, ring, self.signal, self.owner, callback)?;
            opened.routes[i] = Some(route);
        }
        Ok(())
    }

    /// Why the set's groups are read by `read(2)` whatever their events,
    /// or `None` when each group's pages decide.
    fn no_user_space(&self) -> Option<String> {
        if !self.maps_pages {
            return Some("the set only resolves names: it is never read".into());
        }
        if self.options.multiplex {
            return Some("multiplexed: scaling needs the kernel's enabled and running times".into());
        }
        if self.options.granularity == Granularity::Process {
            return Some("process granularity: inherited events also count children".into());
        }
        if self.entries.iter().any(|e| e.overflow.is_some()) {
            return Some("an event overflows: its descriptor's mapping is the sampling ring".into());
        }
        None
    }

    pub(super) fn opened(&mut self, op: SetOp) -> Result<&mut OpenGroups> {
        self.opened.as_mut().ok_or_else(|| closed(op))
    }
}

pub(super) fn conflict_on_error_state(e: papirus_substrate::Error, group: &Group) -> Error {
    match e {
        papirus_substrate::Error::InErrorState { event } => Error::Conflict {
            event,
            reason: format!(
                "the kernel could not put the set's {} events on the counters together (another pinned group or the NMI watchdog may hold some); turn on multiplexing or use fewer events",
                group.len()
            ),
        },
        e => e.into(),
    }
}

/// PAPI's add-time check: enable the groups briefly and see that the kernel
/// scheduled them, so a set that can never count fails to add.
fn check_schedulable(o: &OpenGroups, entries: &[Entry]) -> Result<()> {
    let mut c = vec![];
    for g in &o.groups {
        g.enable()?;
        let mut spin = 0u64;
        for i in 0..10_000u64 {
            spin = std::hint::black_box(spin.wrapping_add(i));
        }
        g.disable()?;
        c.resize(g.len(), Count::ZERO);
        g.read_counts(&mut c).map_err(|e| conflict_on_error_state(e, g))?;
        if c.first().is_some_and(|l| l.time_enabled > 0 && l.time_running == 0) {
            let last = entries.last().map_or("", |e| e.info.name.as_str());
            return Err(Error::Conflict {
                event: last.to_string(),
                reason: format!(
                    "the kernel could not schedule the set's {} events together on this CPU's counters; turn on multiplexing or use fewer events",
                    g.len()
                ),
            });
        }
    }
    Ok(())
}
