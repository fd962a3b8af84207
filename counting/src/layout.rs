//! How a list of events is laid out in perf groups: decided here once, for
//! event sets, regions and the probe runtime.
//!
//! An event is one or more native terms (a derived PAPI preset has several);
//! the terms of one event always share a group, so they share one scaling
//! and a difference of terms cannot turn negative from terms scaled apart.
//!
//! Without multiplexing, events go into at most four groups by [`Role`], in
//! this order:
//!
//! 1. breakpoints: on kernel 6.18 a breakpoint in a group led by a software
//!    event counts 0, and software members of a breakpoint-led group
//!    sometimes do too;
//! 2. hardware counters, led by the first: read by rdpmc where the pages
//!    allow it;
//! 3. the clocks (task-clock, cpu-clock): read from user space on every
//!    machine, so they are kept apart from the events that need `read(2)`;
//!    a clock also must not lead software counters (a group led by
//!    task-clock loses its software members' counts across context
//!    switches: ~2 % of page faults on a busy 2-CPU VM);
//! 4. everything read by `read(2)` only (software counters, tracepoints,
//!    msr and other dynamic PMUs), led by its first event of a PMU other
//!    than the software one (a `msr/tsc/` member of a software-led group read
//!    6 % low here).
//!
//! An event whose terms have different roles goes to the last of their
//! groups. With multiplexing each event is a group of its own, so the
//! kernel can rotate them.

use crate::attr::{EventAttr, Kind};

/// What decides an event's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A hardware breakpoint (`mem:ADDR`).
    Breakpoint,
    /// An event on a hardware counter (cycles, raw, cache, core PMU).
    Counter,
    /// task-clock or cpu-clock.
    Clock,
    /// Counted by the kernel and read by `read(2)` only.
    Kernel,
}

impl Role {
    /// The role of `attr`.
    pub fn of(attr: &EventAttr) -> Role {
        match attr.kind() {
            Kind::Breakpoint => Role::Breakpoint,
            Kind::Hardware => Role::Counter,
            _ if attr.is_clock() => Role::Clock,
            _ => Role::Kernel,
        }
    }
}

/// Where one term of one event goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The event's position in the list.
    pub event: usize,
    /// The term's position in the event.
    pub term: usize,
}

/// The groups for `events` (each a list of terms), each group leader
/// first; every term appears once. See the [module documentation](self).
pub fn plan(events: &[&[EventAttr]], multiplex: bool) -> Vec<Vec<Term>> {
    let terms = |event: usize| (0..events[event].len()).map(move |term| Term { event, term });
    if multiplex {
        return (0..events.len()).map(|e| terms(e).collect()).filter(|g: &Vec<Term>| !g.is_empty()).collect();
    }
    let role = |e: &[EventAttr]| e.iter().map(Role::of).max().unwrap_or(Role::Kernel);
    let mut groups: Vec<Vec<Term>> = Vec::new();
    for r in [Role::Breakpoint, Role::Counter, Role::Clock, Role::Kernel] {
        let mut g: Vec<Term> = (0..events.len()).filter(|&e| role(events[e]) == r).flat_map(terms).collect();
        if g.is_empty() {
            continue;
        }
        let lead = |t: &Term| {
            let a = &events[t.event][t.term];
            match r {
                Role::Counter => a.kind() == Kind::Hardware,
                Role::Clock => a.is_clock(),
                Role::Kernel => a.kind() != Kind::Software,
                Role::Breakpoint => true,
            }
        };
        if let Some(p) = g.iter().position(lead) {
            let leader = g.remove(p);
            g.insert(0, leader);
        }
        groups.push(g);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::consts::{PERF_TYPE_BREAKPOINT, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE};

    fn sw(name: &str, config: u64) -> EventAttr {
        EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, config)
    }

    fn names(events: &[&[EventAttr]], groups: &[Vec<Term>]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| g.iter().map(|t| events[t.event][t.term].name().to_string()).collect())
            .collect()
    }

    #[test]
    fn events_go_to_groups_by_role_and_the_right_event_leads() {
        let tc = [sw("task-clock", 1)];
        let pf = [sw("page-faults", 2)];
        let tsc = [EventAttr::new("msr/tsc/", Kind::Dynamic, 9, 0)];
        let bp = [EventAttr::new("mem:0x1000:x", Kind::Breakpoint, PERF_TYPE_BREAKPOINT, 0)];
        let cyc = [EventAttr::new("cycles", Kind::Hardware, PERF_TYPE_RAW, 0x3c)];
        // A derived event whose terms are a counter and a clock: the clocks' group.
        let mixed = [EventAttr::new("r00c0", Kind::Hardware, PERF_TYPE_RAW, 0xc0), sw("cpu-clock", 0)];
        let events: [&[EventAttr]; 6] = [&tc, &pf, &tsc, &bp, &cyc, &mixed];
        let g = plan(&events, false);
        assert_eq!(
            names(&events, &g),
            [
                vec!["mem:0x1000:x"],
                vec!["cycles"],
                vec!["task-clock", "r00c0", "cpu-clock"],
                vec!["msr/tsc/", "page-faults"]
            ]
        );
        // Every term once.
        assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 7);
        let m = plan(&events, true);
        assert_eq!(m.len(), 6, "multiplexed: one group per event");
        assert_eq!(m[5], [Term { event: 5, term: 0 }, Term { event: 5, term: 1 }]);
        assert!(plan(&[], false).is_empty());
    }

    #[test]
    fn task_clock_and_page_faults_are_read_apart() {
        let tc = [sw("task-clock", 1)];
        let pf = [sw("page-faults", 2)];
        let events: [&[EventAttr]; 2] = [&pf, &tc];
        assert_eq!(names(&events, &plan(&events, false)), [vec!["task-clock"], vec!["page-faults"]]);
    }
}
