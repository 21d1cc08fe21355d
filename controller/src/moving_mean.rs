//! Each server's measured decode speed: the mean time per output token over the last few
//! seconds, from the cumulative `_sum` and `_count` of its inter-token-latency histogram.
//!
//! The mean is an exponentially weighted one with a time constant of [`TIME_CONSTANT_S`]: each
//! scrape adds the seconds and tokens decoded since the previous one, and older ones fade, so a
//! server that slows down (a noisy neighbour, a bigger batch) shows it within seconds. A server
//! that decodes nothing keeps its last estimate. The result is rounded to two significant
//! digits, so that noise in the last digits does not make the controller publish a new snapshot
//! (which costs every Envoy a decode) when nothing else changed.

/// Cumulative totals of an inter-token-latency histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeTotals {
    /// `_sum`: seconds spent on decode steps.
    pub seconds: f64,
    /// `_count`: decode steps, i.e. output tokens after each request's first.
    pub tokens: f64,
}

/// How fast older observations fade, in seconds.
pub const TIME_CONSTANT_S: f64 = 5.0;

/// The running estimate of one server.
#[derive(Debug, Clone, Default)]
pub struct DecodeSpeed {
    /// The totals and the time (ms since the epoch) of the previous scrape.
    previous: Option<(DecodeTotals, u64)>,
    /// Weighted seconds and tokens.
    seconds: f64,
    tokens: f64,
    /// The latest estimate, ms per token (0: none yet).
    estimate: f64,
}

impl DecodeSpeed {
    /// Takes one scrape's totals at `now_unix_ms`; returns the estimate in milliseconds per
    /// output token, or 0 while none is known. A counter that went backwards (a restarted
    /// server) starts the estimate over.
    pub fn observe(&mut self, totals: DecodeTotals, now_unix_ms: u64) -> f64 {
        match self.previous {
            Some((before, at))
                if totals.tokens >= before.tokens && totals.seconds >= before.seconds =>
            {
                let elapsed_s = now_unix_ms.saturating_sub(at) as f64 / 1000.0;
                let keep = (-elapsed_s / TIME_CONSTANT_S).exp();
                self.seconds = self.seconds * keep + (totals.seconds - before.seconds);
                self.tokens = self.tokens * keep + (totals.tokens - before.tokens);
            }
            Some(_) => *self = DecodeSpeed::default(),
            None => {}
        }
        self.previous = Some((totals, now_unix_ms));
        if self.tokens > 0.0 {
            self.estimate = two_significant_digits(self.seconds / self.tokens * 1000.0);
        }
        self.estimate
    }

    /// The current estimate in milliseconds per output token (0 while unknown).
    pub fn ms_per_token(&self) -> f64 {
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

    fn totals(seconds: f64, tokens: f64) -> DecodeTotals {
        DecodeTotals { seconds, tokens }
    }

    #[test]
    fn unknown_until_two_scrapes_show_decoded_tokens() {
        let mut speed = DecodeSpeed::default();
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
        let mut speed = DecodeSpeed::default();
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
        let ms = speed.ms_per_token();
        assert!((70.0..=100.0).contains(&ms), "{ms}");
    }

    #[test]
    fn a_counter_reset_starts_over() {
        let mut speed = DecodeSpeed::default();
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
