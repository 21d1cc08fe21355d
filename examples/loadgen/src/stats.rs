//! Latency percentiles.

use serde::Serialize;

/// The nearest-rank `p`th percentile (`p` in 0..=100) of ascending `sorted`
/// values: the smallest value with at least `p`% of the values at or below
/// it. `None` for no values.
pub fn percentile(sorted: &[f64], p: u32) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.min(100) as usize * n).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

/// The percentiles reported for a set of durations, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `values` (in any order); `None` when empty.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        values.sort_by(f64::total_cmp);
        Some(Self {
            p50: percentile(&values, 50)?,
            p90: percentile(&values, 90)?,
            p99: percentile(&values, 99)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50), Some(5.0));
        assert_eq!(percentile(&v, 90), Some(9.0));
        assert_eq!(percentile(&v, 91), Some(10.0));
        assert_eq!(percentile(&v, 99), Some(10.0));
        assert_eq!(percentile(&v, 100), Some(10.0));
        assert_eq!(percentile(&v, 0), Some(1.0));
        assert_eq!(percentile(&v, 10), Some(1.0));
        assert_eq!(percentile(&v, 11), Some(2.0));
    }

    #[test]
    fn hundred_values_and_single_value() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99), Some(99.0));
        assert_eq!(percentile(&[7.5], 50), Some(7.5));
        assert_eq!(percentile(&[7.5], 99), Some(7.5));
    }

    #[test]
    fn empty_input() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(Percentiles::of(Vec::new()), None);
    }

    #[test]
    fn percentiles_sort_their_input() {
        let p = Percentiles::of(vec![3.0, 1.0, 2.0, 4.0]).expect("non-empty");
        assert_eq!(
            p,
            Percentiles {
                p50: 2.0,
                p90: 4.0,
                p99: 4.0
            }
        );
    }
}
