//! Paradyn's time histogram: a metric's value over time in a fixed number of
//! buckets. When time runs past the last bucket, adjacent pairs fold into one
//! and the bucket width doubles, so memory stays bounded for any run length
//! while older data gets coarser.

use serde::{Deserialize, Serialize};

/// A folding time histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeHistogram {
    /// Time of the start of bucket 0, ns.
    pub start_ns: u64,
    /// Current width of one bucket, ns.
    pub width_ns: u64,
    /// How many times the buckets have folded.
    pub folds: u32,
    /// Accumulated value per bucket.
    pub buckets: Vec<f64>,
}

/// A histogram cannot be built with these parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HistogramError {
    /// Folding pairs needs an even, non-zero number of buckets.
    #[error("a time histogram needs an even, non-zero number of buckets (got {0})")]
    Buckets(usize),
    /// Zero-width buckets cannot hold time.
    #[error("a time histogram needs a bucket width above 0 ns")]
    Width,
}

impl TimeHistogram {
    /// `n` buckets of `width_ns` each, starting at `start_ns`.
    pub fn new(n: usize, width_ns: u64, start_ns: u64) -> Result<Self, HistogramError> {
        if n == 0 || !n.is_multiple_of(2) {
            return Err(HistogramError::Buckets(n));
        }
        if width_ns == 0 {
            return Err(HistogramError::Width);
        }
        Ok(TimeHistogram { start_ns, width_ns, folds: 0, buckets: vec![0.0; n] })
    }

    /// The time span the buckets cover now, ns.
    pub fn span_ns(&self) -> u64 {
        self.width_ns.saturating_mul(self.buckets.len() as u64)
    }

    /// Adds `value` at time `t_ns`, folding as often as needed to reach `t_ns`.
    /// Values before the start land in bucket 0.
    pub fn add(&mut self, t_ns: u64, value: f64) {
        let offset = t_ns.saturating_sub(self.start_ns);
        while offset >= self.span_ns() && self.width_ns <= u64::MAX / 2 {
            self.fold();
        }
        let i = ((offset / self.width_ns) as usize).min(self.buckets.len() - 1);
        self.buckets[i] += value;
    }

    /// Merges adjacent pairs and doubles the width.
    pub fn fold(&mut self) {
        let n = self.buckets.len();
        for i in 0..n / 2 {
            self.buckets[i] = self.buckets[2 * i] + self.buckets[2 * i + 1];
        }
        self.buckets[n / 2..].fill(0.0);
        self.width_ns *= 2;
        self.folds += 1;
    }

    /// The sum over all buckets.
    pub fn total(&self) -> f64 {
        self.buckets.iter().sum()
    }
}

impl TimeHistogram {
    /// The histogram as an SVG bar chart: one `<rect>` per bucket with a
    /// value (a `<title>` giving its time span and value), axes labelled
    /// with the bucket width and `unit`, the largest value on the y axis.
    /// Plain SVG 1.1, no script: any browser or image viewer shows it.
    pub fn svg(&self, title: &str, unit: &str) -> String {
        const W: f64 = 960.0;
        const H: f64 = 320.0;
        const LEFT: f64 = 70.0;
        const TOP: f64 = 40.0;
        const BOTTOM: f64 = 50.0;
        let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let n = self.buckets.len().max(1) as f64;
        let plot = (W - LEFT - 20.0, H - TOP - BOTTOM);
        let max = self.buckets.iter().copied().fold(0.0f64, f64::max);
        let bar = plot.0 / n;
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <title>{}</title>\n<rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
             <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
            esc(title),
            W / 2.0,
            esc(title)
        );
        let (x0, y0) = (LEFT, TOP + plot.1);
        for (i, &v) in self.buckets.iter().enumerate().filter(|(_, v)| **v != 0.0) {
            let h = if max > 0.0 { v / max * plot.1 } else { 0.0 };
            let start = self.start_ns.saturating_add(self.width_ns.saturating_mul(i as u64));
            out.push_str(&format!(
                "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"#d9534f\"><title>{} ns to {} ns: {v} {}</title></rect>\n",
                x0 + bar * i as f64,
                y0 - h,
                bar.max(0.5),
                h,
                start,
                start.saturating_add(self.width_ns),
                esc(unit)
            ));
        }
        out.push_str(&format!(
            "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{}\" y2=\"{y0}\" stroke=\"black\"/>\n\
             <line x1=\"{x0}\" y1=\"{TOP}\" x2=\"{x0}\" y2=\"{y0}\" stroke=\"black\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time: {} buckets of {} ns ({} folds)</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max}</text>\n<text x=\"{}\" y=\"{y0}\" text-anchor=\"end\">0</text>\n\
             <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{} per bucket</text>\n</svg>\n",
            x0 + plot.0,
            x0 + plot.0 / 2.0,
            y0 + 32.0,
            self.buckets.len(),
            self.width_ns,
            self.folds,
            x0 - 6.0,
            TOP + 4.0,
            x0 - 6.0,
            TOP + plot.1 / 2.0,
            TOP + plot.1 / 2.0,
            esc(unit)
        ));
        out
    }
}

/// Records a cumulative metric (a timer or counter read over time) into a
/// histogram as the increase since the previous sample.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// The histogram being filled.
    pub histogram: TimeHistogram,
    last: Option<f64>,
}

impl Sampler {
    /// A sampler filling `histogram`.
    pub fn new(histogram: TimeHistogram) -> Self {
        Sampler { histogram, last: None }
    }

    /// Records the metric's cumulative value `value` sampled at `t_ns`.
    pub fn sample(&mut self, t_ns: u64, value: f64) {
        if let Some(prev) = self.last {
            self.histogram.add(t_ns, value - prev);
        }
        self.last = Some(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_bad_shapes() {
        assert_eq!(TimeHistogram::new(0, 10, 0), Err(HistogramError::Buckets(0)));
        assert_eq!(TimeHistogram::new(3, 10, 0), Err(HistogramError::Buckets(3)));
        assert_eq!(TimeHistogram::new(4, 0, 0), Err(HistogramError::Width));
    }

    #[test]
    fn folds_pairs() {
        let mut h = TimeHistogram::new(4, 10, 1000).unwrap();
        for (t, v) in [(1000, 1.0), (1015, 2.0), (1025, 3.0), (1039, 4.0)] {
            h.add(t, v);
        }
        assert_eq!(h.buckets, vec![1.0, 2.0, 3.0, 4.0]);
        h.add(1040, 5.0);
        assert_eq!(h.width_ns, 20);
        assert_eq!(h.buckets, vec![3.0, 7.0, 5.0, 0.0]);
    }

    #[test]
    fn svg_has_a_bar_per_bucket_with_a_value() {
        let mut h = TimeHistogram::new(8, 10, 0).unwrap();
        for (t, v) in [(0, 1.0), (25, 4.0), (79, 2.0)] {
            h.add(t, v);
        }
        let svg = h.svg("page faults <per> bucket", "faults");
        assert_eq!(svg.matches("<rect ").count(), 1 + 3, "the background and three bars");
        assert!(svg.contains("20 ns to 30 ns: 4 faults"), "{svg}");
        assert!(svg.contains("page faults &lt;per&gt; bucket"));
        assert!(svg.contains("8 buckets of 10 ns (0 folds)"));
    }

    #[test]
    fn sampler_records_increases() {
        let mut s = Sampler::new(TimeHistogram::new(4, 10, 0).unwrap());
        s.sample(0, 100.0);
        s.sample(5, 130.0);
        s.sample(25, 131.0);
        assert_eq!(s.histogram.buckets, vec![30.0, 0.0, 1.0, 0.0]);
    }

    proptest! {
        #[test]
        fn folding_keeps_total_and_places_values(
            half in 1usize..32,
            width in 1u64..1000,
            points in proptest::collection::vec((0u64..10_000_000, 0u32..1000), 1..200),
        ) {
            let n = half * 2;
            let mut h = TimeHistogram::new(n, width, 0).unwrap();
            let mut sum = 0.0;
            for (t, v) in &points {
                let before = h.width_ns;
                h.add(*t, f64::from(*v));
                sum += f64::from(*v);
                // Width only ever doubles.
                prop_assert!(h.width_ns == before || (h.width_ns.is_multiple_of(before) && (h.width_ns / before).is_power_of_two()));
            }
            prop_assert_eq!(h.total(), sum);
            prop_assert_eq!(h.width_ns, width << h.folds);
            // With the final width, each point lands in bucket t / width: replay and compare.
            let mut replay = vec![0.0; n];
            for (t, v) in &points {
                replay[(*t / h.width_ns) as usize] += f64::from(*v);
            }
            prop_assert_eq!(&h.buckets, &replay);
        }
    }
}
