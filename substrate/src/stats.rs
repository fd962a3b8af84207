//! The one quantile every papirus figure is reported with: a sample that
//! was measured (nearest rank), never an interpolation between two.

/// The `q` quantile of `sorted` (ascending): the sample nearest to rank
/// `q × (n − 1)`; NaN when empty. An HDR histogram would round fractional
/// cycles per call to its buckets and rank differently (its median of
/// 1..=100 is 50, not 51).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    sorted.get((last as f64 * q).round() as usize).copied().unwrap_or(f64::NAN)
}

/// The median of `v` (the upper one of an even count), NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_measured_samples() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(
            (quantile(&v, 0.0), quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 1.0)),
            (1.0, 51.0, 99.0, 100.0)
        );
    }
}
