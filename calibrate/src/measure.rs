//! Timing one primitive: warm up, then many samples, each a batch of calls
//! timed with the TSC, reported as min / median / p99 / max per call.

use papirus_substrate::stats::quantile;
use serde::{Deserialize, Serialize};

/// Statistics of one quantity over the samples, per call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    /// Statistics of `v` (sorted in place); `None` when empty.
    pub fn of(v: &mut [f64]) -> Option<Self> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let at = |q| quantile(v, q);
        Some(Stats { min: v[0], median: at(0.5), p99: at(0.99), max: v[v.len() - 1] })
    }

    fn scaled(&self, k: f64) -> Self {
        Stats { min: self.min * k, median: self.median * k, p99: self.p99 * k, max: self.max * k }
    }
}

/// One bin of a cost histogram (papi_cost's `-d`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    /// Lower edge, cycles per call.
    pub from_cycles: f64,
    /// Upper edge, cycles per call.
    pub to_cycles: f64,
    /// Samples in the bin.
    pub count: u64,
}

/// The measured cost of one primitive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Stable row name, e.g. `real_time_ns`.
    pub name: String,
    /// What was measured, for people.
    pub description: String,
    /// Which implementation ran (e.g. `user-space`, `read()`, `vdso`), when it matters.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
    /// TSC cycles per call.
    pub cycles: Stats,
    /// Nanoseconds per call.
    pub ns: Stats,
    /// Number of samples.
    pub samples: u32,
    /// Calls per sample.
    pub batch: u32,
    /// Distribution of the per-call cost, when asked for.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub histogram: Option<Vec<Bin>>,
}

/// How to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Samples taken after warm-up.
    pub samples: u32,
    /// Target TSC cycles per sample: cheap primitives are batched up to this.
    pub sample_cycles: u64,
    /// Bins of the histogram, 0 for none.
    pub bins: usize,
}

impl Plan {
    /// The default plan: 2,000 samples of about 20 µs each.
    pub const DEFAULT: Plan = Plan { samples: 2_000, sample_cycles: 50_000, bins: 0 };
    /// The `--quick` plan.
    pub const QUICK: Plan = Plan { samples: 300, sample_cycles: 20_000, bins: 0 };
}

/// A tick source and its rate: the TSC in papirus-calibrate.
#[derive(Debug, Clone, Copy)]
pub struct Ticks {
    /// Reads the counter (ordered, so work cannot leak across the read).
    pub read: fn() -> u64,
    /// Ticks per nanosecond.
    pub per_ns: f64,
}

/// Measures `f` under `plan`, subtracting nothing: the loop overhead is its own row.
pub fn measure(
    ticks: Ticks,
    plan: Plan,
    name: &str,
    description: &str,
    path: Option<&str>,
    mut f: impl FnMut(),
) -> Cost {
    // Warm up: first calls may set up lazily (a clock calibrating, a
    // thread's reader opening its event), which must not size the batch.
    let warm = (ticks.read)();
    for i in 0u32.. {
        f();
        if i >= 16 && (ticks.read)().saturating_sub(warm) >= plan.sample_cycles {
            break;
        }
    }
    // Size the batch so one sample spans about sample_cycles.
    let mut batch = 1u32;
    loop {
        let t0 = (ticks.read)();
        for _ in 0..batch {
            f();
        }
        let dt = (ticks.read)().saturating_sub(t0);
        if dt >= plan.sample_cycles / 4 || batch >= 1 << 20 {
            let per = (dt as f64 / f64::from(batch)).max(1.0);
            batch = ((plan.sample_cycles as f64 / per) as u32).clamp(1, 1 << 20);
            break;
        }
        batch *= 2;
    }
    let per_call: Vec<f64> = (0..plan.samples.max(1))
        .map(|_| {
            let t0 = (ticks.read)();
            for _ in 0..batch {
                f();
            }
            (ticks.read)().saturating_sub(t0) as f64 / f64::from(batch)
        })
        .collect();
    Cost::from_samples(ticks, plan, name, description, path, per_call, batch).expect("at least one sample")
}

/// Times two operations that must alternate (a timer's start and stop):
/// each sample runs `first(i)` for `i` in `0..batch`, then `second(i)` for
/// each `i`, timing the two loops apart. Returns the per-call cycles of
/// `first` and of `second`, one value per sample, after one warm-up sample.
pub fn measure_phases(
    ticks: Ticks,
    plan: Plan,
    batch: u32,
    mut first: impl FnMut(usize),
    mut second: impl FnMut(usize),
) -> (Vec<f64>, Vec<f64>) {
    let batch = batch.max(1);
    let n = batch as usize;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for s in 0..=plan.samples.max(1) {
        let t0 = (ticks.read)();
        for i in 0..n {
            first(i);
        }
        let t1 = (ticks.read)();
        for i in 0..n {
            second(i);
        }
        let t2 = (ticks.read)();
        if s > 0 {
            a.push(t1.saturating_sub(t0) as f64 / f64::from(batch));
            b.push(t2.saturating_sub(t1) as f64 / f64::from(batch));
        }
    }
    (a, b)
}

impl Cost {
    /// A cost from per-call cycle samples (`batch` calls each), with the
    /// histogram `plan` asks for; `None` when there are no samples.
    pub fn from_samples(
        ticks: Ticks,
        plan: Plan,
        name: &str,
        description: &str,
        path: Option<&str>,
        mut per_call: Vec<f64>,
        batch: u32,
    ) -> Option<Cost> {
        let histogram = (plan.bins > 0 && !per_call.is_empty()).then(|| histogram(&per_call, plan.bins));
        let samples = per_call.len() as u32;
        let cycles = Stats::of(&mut per_call)?;
        Some(Cost {
            name: name.to_string(),
            description: description.to_string(),
            path: path.map(str::to_string),
            cycles,
            ns: cycles.scaled(1.0 / ticks.per_ns),
            samples,
            batch: batch.max(1),
            histogram,
        })
    }
}

fn histogram(v: &[f64], bins: usize) -> Vec<Bin> {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let width = ((hi - lo) / bins as f64).max(f64::MIN_POSITIVE);
    let mut out: Vec<Bin> = (0..bins)
        .map(|i| Bin { from_cycles: lo + width * i as f64, to_cycles: lo + width * (i + 1) as f64, count: 0 })
        .collect();
    for x in v {
        let i = (((x - lo) / width) as usize).min(bins - 1);
        out[i].count += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static FAKE: AtomicU64 = AtomicU64::new(0);

    /// A clock that advances 10 ticks per read, so every call costs 0 and
    /// every sample 10 ticks: the arithmetic is checkable exactly.
    fn fake() -> u64 {
        FAKE.fetch_add(10, Ordering::Relaxed)
    }

    #[test]
    fn stats_order() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        let s = Stats::of(&mut v).unwrap();
        assert_eq!((s.min, s.median, s.p99, s.max), (1.0, 51.0, 99.0, 100.0));
        assert!(Stats::of(&mut []).is_none());
    }

    #[test]
    fn measures_with_batches_and_bins() {
        let ticks = Ticks { read: fake, per_ns: 2.0 };
        let plan = Plan { samples: 50, sample_cycles: 40, bins: 4 };
        let mut calls = 0u64;
        let c = measure(ticks, plan, "x", "fake", Some("test"), || calls += 1);
        assert_eq!(c.samples, 50);
        assert!(c.batch >= 1);
        // Each sample is exactly 10 ticks over `batch` calls.
        assert_eq!(c.cycles.median, 10.0 / f64::from(c.batch));
        assert_eq!(c.ns.median, c.cycles.median / 2.0);
        let h = c.histogram.unwrap();
        assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), 50);
        assert!(calls >= 50 * u64::from(c.batch));
    }
}
