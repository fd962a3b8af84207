//! The text report of a probe run: a flat profile per thread and in total,
//! then the caller → callee table.

use std::collections::BTreeMap;
use std::fmt::Write;

use papirus_probe_abi::{FunctionReport, Report};

/// Column a profile is sorted by (descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Exclusive time.
    #[default]
    Excl,
    /// Inclusive time.
    Incl,
    /// Calls.
    Calls,
}

impl std::str::FromStr for SortKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "excl" => Ok(SortKey::Excl),
            "incl" => Ok(SortKey::Incl),
            "calls" => Ok(SortKey::Calls),
            other => Err(format!("unknown sort key `{other}`: use excl, incl or calls")),
        }
    }
}

fn table(out: &mut String, r: &Report, rows: &[FunctionReport], sort: SortKey) {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|f| {
        std::cmp::Reverse(match sort {
            SortKey::Excl => f.excl_ticks,
            SortKey::Incl => f.incl_ticks,
            SortKey::Calls => f.calls,
        })
    });
    let timed = r.ticks_per_second > 0.0;
    let _ = write!(
        out,
        "  {:<32} {:>10} {:>8} {:>12} {:>12} {:>10} {:>10}",
        "function", "calls", "unwound", "incl ms", "excl ms", "min us", "max us"
    );
    for e in &r.events {
        let _ = write!(out, " {:>16} {:>16}", format!("{e} incl"), format!("{e} excl"));
    }
    let _ = writeln!(out);
    for f in rows {
        let name = r.functions.get(f.id as usize).map_or("?", String::as_str);
        let ms = |t| if timed { format!("{:.3}", r.ns(t) / 1e6) } else { "-".into() };
        let us = |t| if timed { format!("{:.3}", r.ns(t) / 1e3) } else { "-".into() };
        let _ = write!(
            out,
            "  {:<32} {:>10} {:>8} {:>12} {:>12} {:>10} {:>10}",
            name,
            f.calls,
            f.unwound,
            ms(f.incl_ticks),
            ms(f.excl_ticks),
            us(f.min_ticks),
            us(f.max_ticks)
        );
        for i in 0..r.events.len() {
            let get = |v: &[u64]| v.get(i).copied().unwrap_or(0);
            let _ = write!(out, " {:>16} {:>16}", get(&f.counters_incl), get(&f.counters_excl));
        }
        let _ = writeln!(out);
    }
}

/// Formats the report: every thread (or only `thread`), the total over all
/// threads, then the caller → callee table.
pub fn format_report(r: &Report, thread: Option<u32>, sort: SortKey) -> String {
    let mut out = String::new();
    let _ =
        writeln!(out, "papirus-probe report: pid {}, probe {}, {} threads", r.pid, r.probe, r.threads.len());
    let mut edges: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    for t in r.threads.iter().filter(|t| thread.is_none_or(|n| n == t.tid)) {
        if t.exited_threads > 0 {
            let _ = writeln!(out, "\n{} exited threads of pid {}", t.exited_threads, t.pid);
        } else {
            let _ = writeln!(out, "\nthread {}", t.tid);
        }
        table(&mut out, r, &t.functions, sort);
        if t.overflow > 0 {
            let _ =
                writeln!(out, "  ({} calls deeper than the shadow stack: counted, not timed)", t.overflow);
        }
        if t.reentered + t.edge_overflow > 0 {
            let _ = writeln!(
                out,
                "  (uninstrumented: {} calls from signal handlers inside a hook; {} caller pairs dropped)",
                t.reentered, t.edge_overflow
            );
        }
        if let Some(e) = &t.counters_error {
            let _ = writeln!(out, "  (no counters on this thread: {e})");
        }
        for e in &t.callees {
            let v = edges.entry((e.caller, e.callee)).or_default();
            v.0 += e.calls;
            v.1 += e.incl_ticks;
        }
    }
    if thread.is_none() && r.threads.len() > 1 {
        let _ = writeln!(out, "\nall threads");
        let ids: std::collections::BTreeSet<u32> =
            r.threads.iter().flat_map(|t| t.functions.iter().map(|f| f.id)).collect();
        let totals: Vec<FunctionReport> = ids.into_iter().map(|id| r.total(id)).collect();
        table(&mut out, r, &totals, sort);
    }
    let _ = writeln!(out, "\ncaller -> callee (inclusive)");
    let mut edges: Vec<_> = edges.into_iter().collect();
    edges.sort_by_key(|(_, (_, incl))| std::cmp::Reverse(*incl));
    let name = |id: u32| r.functions.get(id as usize).map_or("?", String::as_str);
    for ((caller, callee), (calls, incl)) in edges {
        let ms = if r.ticks_per_second > 0.0 { format!("{:.3} ms", r.ns(incl) / 1e6) } else { "-".into() };
        let _ = writeln!(out, "  {} -> {}: {} calls, {}", name(caller), name(callee), calls, ms);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use papirus_probe_abi::{EdgeReport, FORMAT_VERSION, ThreadReport};

    #[test]
    fn table_sorts_filters_and_names_pairs() {
        let f = |id, calls, excl| FunctionReport {
            id,
            calls,
            exits: calls,
            incl_ticks: 4000,
            excl_ticks: excl,
            ..Default::default()
        };
        let t = |tid| ThreadReport {
            tid,
            functions: vec![f(0, 1, 3000), f(1, 9, 1000)],
            callees: vec![EdgeReport { caller: 0, callee: 1, calls: 9, incl_ticks: 1000 }],
            ..Default::default()
        };
        let r = Report {
            format_version: FORMAT_VERSION,
            probe: "wallclock".into(),
            pid: 7,
            ticks_per_second: 1e9,
            events: vec![],
            functions: vec!["main".into(), "leaf".into()],
            threads: vec![t(7), t(8)],
            window: Default::default(),
            processes: Vec::new(),
            unmeasured_threads: 0,
        };
        let text = format_report(&r, None, SortKey::Excl);
        assert!(text.find("  main ").unwrap() < text.find("  leaf ").unwrap());
        assert!(text.contains("all threads"));
        assert!(text.contains("main -> leaf: 18 calls, 0.002 ms"), "{text}");
        let text = format_report(&r, Some(8), SortKey::Calls);
        assert!(text.find("  leaf ").unwrap() < text.find("  main ").unwrap());
        assert_eq!(text.matches("\nthread ").count(), 1);
        assert!(!text.contains("all threads"));
        assert!("bogus".parse::<SortKey>().is_err());
    }
}
