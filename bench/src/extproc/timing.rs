//! Decision times: a bounded sample of durations and their nearest-rank percentiles.

use std::time::Duration;

/// Durations kept at most; later ones are counted but not kept.
const MAX_SAMPLES: usize = 1 << 20;

/// Recorded decision durations, in nanoseconds.
#[derive(Debug, Default)]
pub struct Durations {
    count: u64,
    samples_ns: Vec<u64>,
}

impl Durations {
    /// Records one duration.
    pub fn record(&mut self, elapsed: Duration) {
        self.count += 1;
        if self.samples_ns.len() < MAX_SAMPLES {
            self.samples_ns
                .push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        }
    }

    /// `count=N p50_us=… p90_us=… p99_us=…` (percentiles of the kept samples; `-` when none).
    pub fn summary(&self) -> String {
        let mut sorted = self.samples_ns.clone();
        sorted.sort_unstable();
        let at = |q: f64| -> String {
            if sorted.is_empty() {
                return "-".to_string();
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            format!("{:.1}", sorted[rank - 1] as f64 / 1000.0)
        };
        format!(
            "count={} p50_us={} p90_us={} p99_us={}",
            self.count,
            at(0.50),
            at(0.90),
            at(0.99)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_nearest_rank_percentiles_in_microseconds() {
        let mut d = Durations::default();
        assert_eq!(d.summary(), "count=0 p50_us=- p90_us=- p99_us=-");
        for us in 1..=100 {
            d.record(Duration::from_micros(us));
        }
        assert_eq!(d.summary(), "count=100 p50_us=50.0 p90_us=90.0 p99_us=99.0");
    }
}
