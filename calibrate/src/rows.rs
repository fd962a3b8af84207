//! The rows papirus-calibrate measures, kept in a [`Registry`] that other
//! crates extend: the probe tool registers its trampoline and probe rows
//! with [`Registry::add`] (or [`Registry::add_timed`]) and runs them through
//! the same command line (`papirus_tools::calibrate::main_with`).
//!
//! A row runs once, returns one or more [`Cost`]s, or the reason it cannot
//! run here ([`Unavailable`]).

use serde::{Deserialize, Serialize};

use crate::measure::{Cost, Plan, Ticks, measure, measure_phases};

/// A row that cannot run on this machine, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// The row's name.
    pub name: String,
    /// What it would measure.
    pub description: String,
    /// Why it cannot (the kernel's own reason where there is one).
    pub reason: String,
}

/// What a row's closure returns: its costs, or why it cannot run here.
pub type RowResult = Result<Vec<Cost>, String>;

type RowFn = Box<dyn FnMut(&Bench) -> RowResult>;

/// One row: a name, a description for `--help` and the cost file, and the
/// code that measures it.
pub struct Row {
    name: String,
    description: String,
    run: RowFn,
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row").field("name", &self.name).field("description", &self.description).finish()
    }
}

/// What a row's closure measures with: the tick source, the plan, and the
/// row's own name and description for the costs it returns.
#[derive(Debug, Clone)]
pub struct Bench {
    ticks: Ticks,
    plan: Plan,
    name: String,
    description: String,
}

impl Bench {
    /// A bench for the row `name`.
    pub fn new(ticks: Ticks, plan: Plan, name: &str, description: &str) -> Bench {
        Bench { ticks, plan, name: name.into(), description: description.into() }
    }

    /// The tick source.
    pub fn ticks(&self) -> Ticks {
        self.ticks
    }

    /// The plan.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Times `f` as this row's cost (see [`measure`]); `path` says which
    /// implementation ran.
    pub fn time(&self, path: Option<&str>, f: impl FnMut()) -> Cost {
        measure(self.ticks, self.plan, &self.name, &self.description, path, f)
    }

    /// Times `f` as a cost named `name` (rows that return several costs).
    pub fn time_named(&self, name: &str, description: &str, path: Option<&str>, f: impl FnMut()) -> Cost {
        measure(self.ticks, self.plan, name, description, path, f)
    }

    /// Times two alternating operations over `batch` objects (see
    /// [`measure_phases`]) as the costs `names.0` and `names.1`.
    pub fn phases(
        &self,
        batch: u32,
        names: (&str, &str),
        descriptions: (&str, &str),
        path: Option<&str>,
        first: impl FnMut(usize),
        second: impl FnMut(usize),
    ) -> Vec<Cost> {
        let (a, b) = measure_phases(self.ticks, self.plan, batch, first, second);
        // measure_phases takes at least one sample of each.
        [
            Cost::from_samples(self.ticks, self.plan, names.0, descriptions.0, path, a, batch),
            Cost::from_samples(self.ticks, self.plan, names.1, descriptions.1, path, b, batch),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The rows to run, in order.
#[derive(Debug, Default)]
pub struct Registry {
    rows: Vec<Row>,
}

/// The outcome of running a registry.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every measured cost, in row order.
    pub costs: Vec<Cost>,
    /// Every row that could not run, with its reason.
    pub unavailable: Vec<Unavailable>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Every row papirus itself defines (see [`crate::builtin`]).
    pub fn builtin() -> Registry {
        let mut r = Registry::new();
        crate::builtin::register(&mut r);
        r
    }

    /// Adds a row whose closure returns its costs or why it cannot run.
    /// A cost the closure names itself should start with the row's name.
    pub fn add(
        &mut self,
        name: &str,
        description: &str,
        run: impl FnMut(&Bench) -> RowResult + 'static,
    ) -> &mut Self {
        self.rows.push(Row { name: name.into(), description: description.into(), run: Box::new(run) });
        self
    }

    /// Adds a row that times `f`, taking `path` as its implementation.
    pub fn add_timed(
        &mut self,
        name: &str,
        description: &str,
        path: Option<&str>,
        mut f: impl FnMut() + 'static,
    ) -> &mut Self {
        let path = path.map(str::to_string);
        self.add(name, description, move |b| Ok(vec![b.time(path.as_deref(), &mut f)]))
    }

    /// Adds a row that cannot run here, with the reason.
    pub fn add_unavailable(&mut self, name: &str, description: &str, reason: &str) -> &mut Self {
        let reason = reason.to_string();
        self.add(name, description, move |_| Err(reason.clone()))
    }

    /// `(name, description)` of every row, in order.
    pub fn rows(&self) -> impl Iterator<Item = (&str, &str)> {
        self.rows.iter().map(|r| (r.name.as_str(), r.description.as_str()))
    }

    /// Runs every row whose name contains `filter` (all when `None`),
    /// calling `progress` after each.
    pub fn run(
        &mut self,
        ticks: Ticks,
        plan: Plan,
        filter: Option<&str>,
        mut progress: impl FnMut(&[Cost], Option<&Unavailable>),
    ) -> Report {
        let mut report = Report::default();
        for row in &mut self.rows {
            if filter.is_some_and(|f| !row.name.contains(f)) {
                continue;
            }
            let bench = Bench::new(ticks, plan, &row.name, &row.description);
            match (row.run)(&bench) {
                Ok(costs) => {
                    progress(&costs, None);
                    report.costs.extend(costs);
                }
                Err(reason) => {
                    let u =
                        Unavailable { name: row.name.clone(), description: row.description.clone(), reason };
                    progress(&[], Some(&u));
                    report.unavailable.push(u);
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static FAKE: AtomicU64 = AtomicU64::new(0);
    fn fake() -> u64 {
        FAKE.fetch_add(7, Ordering::Relaxed)
    }

    #[test]
    fn registry_runs_rows_in_order_and_reports_unavailable_ones() {
        let ticks = Ticks { read: fake, per_ns: 1.0 };
        let plan = Plan { samples: 5, sample_cycles: 20, bins: 0 };
        let mut r = Registry::new();
        r.add_timed("a.one", "first", Some("here"), || {});
        r.add_unavailable("b.two", "second", "no PMU");
        r.add("c.three", "third", |b| {
            Ok(b.phases(4, ("c.start", "c.stop"), ("s", "t"), None, |_| {}, |_| {}))
        });
        let names: Vec<_> = r.rows().map(|(n, _)| n.to_string()).collect();
        assert_eq!(names, ["a.one", "b.two", "c.three"]);
        let mut seen = 0;
        let rep = r.run(ticks, plan, None, |_, _| seen += 1);
        assert_eq!(seen, 3);
        let got: Vec<_> = rep.costs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(got, ["a.one", "c.start", "c.stop"]);
        assert_eq!(rep.costs[0].path.as_deref(), Some("here"));
        assert_eq!(rep.costs[1].samples, 5);
        assert_eq!(rep.costs[1].batch, 4);
        assert_eq!(rep.unavailable[0].reason, "no PMU");
        let only = r.run(ticks, plan, Some("b."), |_, _| {});
        assert!(only.costs.is_empty());
        assert_eq!(only.unavailable.len(), 1);
    }
}
