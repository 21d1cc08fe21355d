//! Each server's measured means from a histogram's cumulative `_sum` and `_count`: its decode
//! speed (the mean time per output token, from its inter-token-latency histogram) and its
//! requests' mean length (output tokens per finished request, from its generation-tokens
//! histogram).
//!
//! The mean is an exponentially weighted one with a time constant of [`TIME_CONSTANT_S`]: each
//! scrape adds the sum and count observed since the previous one, and older ones fade, so a
//! server that slows down (a noisy neighbour, a bigger batch) or gets longer requests shows it
//! within seconds. A server that observes nothing keeps its last estimate. The result is
//! rounded to two significant digits, so that noise in the last digits does not make the
//! controller publish a new snapshot (which costs every Envoy a decode) when nothing else
//! changed.

/// Cumulative totals of a histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistogramTotals {
    /// `_sum`: the observations added up (seconds of decode steps, or output tokens).
    pub sum: f64,
    /// `_count`: observations (decode steps, or finished requests).
    pub count: f64,
}

/// How fast older observations fade, in seconds.
pub const TIME_CONSTANT_S: f64 = 5.0;

/// The running estimate of one histogram of one server.
#[derive(Debug, Clone)]
pub struct MovingMean {
    /// What the mean is multiplied by (1000 turns seconds into milliseconds).
    scale: f64,
    /// The totals and the time (ms since the epoch) of the previous scrape.
    previous: Option<(HistogramTotals, u64)>,
    /// Weighted sum and count.
    sum: f64,
    count: f64,
    /// The latest estimate, scaled (0: none yet).
    estimate: f64,
}

impl MovingMean {
    /// A mean reported times `scale`, unknown until observed.
    pub fn new(scale: f64) -> MovingMean {
        MovingMean {
            scale,
            previous: None,
            sum: 0.0,
            count: 0.0,
            estimate: 0.0,
        }
    }

    /// Takes one scrape's totals at `now_unix_ms`; returns the estimate (times the scale), or 0
    /// while none is known. A counter that went backwards (a restarted server) starts the
    /// estimate over.
    pub fn observe(&mut self, totals: HistogramTotals, now_unix_ms: u64) -> f64 {
        match self.previous {
            Some((before, at)) if totals.count >= before.count && totals.sum >= before.sum => {
                let elapsed_s = now_unix_ms.saturating_sub(at) as f64 / 1000.0;
                let keep = (-elapsed_s / TIME_CONSTANT_S).exp();
                self.sum = self.sum * keep + (totals.sum - before.sum);
                self.count = self.count * keep + (totals.count - before.count);
            }
            Some(_) => *self = MovingMean::new(self.scale),
            None => {}
        }
        self.previous = Some((totals, now_unix_ms));
        if self.count > 0.0 {
            self.estimate = two_significant_digits(self.sum / self.count * self.scale);
        }
        self.estimate
    }
}

fn two_significant_digits(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 0.0;
    }
    let scale = 10f64.powi(1 - value.log10().floor() as i32);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(sum: f64, count: f64) -> HistogramTotals {
        HistogramTotals { sum, count }
    }

    /// A decode speed: seconds per token, in milliseconds.
    fn speed() -> MovingMean {
        MovingMean::new(1000.0)
    }

    #[test]
    fn unknown_until_two_scrapes_show_decoded_tokens() {
        let mut speed = speed();
        // The first scrape only sets the baseline: lifetime totals may predate a restart of ours.
        assert_eq!(speed.observe(totals(10.0, 100.0), 1_000), 0.0);
        assert_eq!(speed.observe(totals(10.0, 100.0), 2_000), 0.0);
        // 40 tokens in 1 s of decode steps: 25 ms per token.
        assert_eq!(speed.observe(totals(11.0, 140.0), 3_000), 25.0);
        // Idle: the estimate stays.
        assert_eq!(speed.observe(totals(11.0, 140.0), 60_000), 25.0);
    }

    #[test]
    fn follows_a_slowdown_within_seconds() {
        let mut speed = speed();
        let (mut seconds, mut tokens) = (0.0, 0.0);
        speed.observe(totals(seconds, tokens), 0);
        // 10 s at 25 ms per token, scraped every 100 ms (4 tokens each).
        for step in 1..=100 {
            seconds += 0.1;
            tokens += 4.0;
            assert_eq!(speed.observe(totals(seconds, tokens), step * 100), 25.0);
        }
        // Then four times slower: after 10 s (two time constants) mostly the new speed.
        for step in 101..=200 {
            seconds += 0.1;
            tokens += 1.0;
            speed.observe(totals(seconds, tokens), step * 100);
        }
        let ms = speed.estimate;
        assert!((70.0..=100.0).contains(&ms), "{ms}");
    }

    #[test]
    fn a_mean_request_length_is_unscaled() {
        let mut length = MovingMean::new(1.0);
        length.observe(totals(0.0, 0.0), 0);
        // Two requests of 30 and 66 tokens finished.
        assert_eq!(length.observe(totals(96.0, 2.0), 1_000), 48.0);
        // 2 s later one of 48: the older two have faded to e^(-2/5) of their weight, and the
        // mean stays 48 because they averaged 48 too.
        assert_eq!(length.observe(totals(144.0, 3.0), 3_000), 48.0);
    }

    #[test]
    fn a_counter_reset_starts_over() {
        let mut speed = speed();
        speed.observe(totals(0.0, 0.0), 0);
        assert_eq!(speed.observe(totals(1.0, 10.0), 1_000), 100.0);
        assert_eq!(speed.observe(totals(0.1, 2.0), 2_000), 0.0);
        assert_eq!(speed.observe(totals(0.2, 12.0), 3_000), 10.0);
    }

    #[test]
    fn rounds_to_two_significant_digits() {
        assert_eq!(two_significant_digits(33.74), 34.0);
        assert_eq!(two_significant_digits(137.0), 140.0);
        assert_eq!(two_significant_digits(0.01234), 0.012);
        assert_eq!(two_significant_digits(f64::NAN), 0.0);
    }
}
