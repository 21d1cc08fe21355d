//! The latency model: how long prefill and each decode step take.
//!
//! All parameters are in milliseconds and every result is multiplied by
//! `time_scale`, so a server started with `--time-scale 2` is uniformly twice
//! as slow as one with the defaults.

use std::time::Duration;

/// Timing parameters of one simulated server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyModel {
    /// Fixed part of the time to first token.
    pub ttft_base_ms: f64,
    /// Prefill cost of one prompt token that was not served from the prefix cache.
    pub prefill_ms_per_token: f64,
    /// Time of one decode step (the inter-token latency) with an empty batch.
    pub itl_ms: f64,
    /// Relative slowdown per other request in the running batch.
    pub batch_slowdown: f64,
    /// Extra time to first token when the request's LoRA adapter must be loaded.
    pub lora_load_ms: f64,
    /// Multiplier applied to every duration.
    pub time_scale: f64,
}

impl LatencyModel {
    /// Prefill time of `uncached_tokens` prompt tokens next to `others_running` requests:
    /// `prefill_per_token × uncached × (1 + slowdown × others)`, times `time_scale`.
    pub fn prefill(&self, uncached_tokens: u64, others_running: usize) -> Duration {
        self.scaled(
            self.prefill_ms_per_token * uncached_tokens as f64 * self.batch_factor(others_running),
        )
    }

    /// The part of the time to first token that is not prefill: the base, plus the adapter
    /// load when `lora_load`, times `time_scale`.
    pub fn ttft_overhead(&self, lora_load: bool) -> Duration {
        let load = if lora_load { self.lora_load_ms } else { 0.0 };
        self.scaled(self.ttft_base_ms + load)
    }

    /// Time of one decode step while `others_running` other requests share the batch.
    pub fn itl(&self, others_running: usize) -> Duration {
        self.scaled(self.itl_ms * self.batch_factor(others_running))
    }

    fn batch_factor(&self, others_running: usize) -> f64 {
        1.0 + self.batch_slowdown * others_running as f64
    }

    fn scaled(&self, ms: f64) -> Duration {
        Duration::try_from_secs_f64(ms * self.time_scale / 1000.0).unwrap_or(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> LatencyModel {
        LatencyModel {
            ttft_base_ms: 5.0,
            prefill_ms_per_token: 0.02,
            itl_ms: 4.0,
            batch_slowdown: 0.05,
            lora_load_ms: 20.0,
            time_scale: 1.0,
        }
    }

    fn ttft(m: &LatencyModel, uncached: u64, others: usize, lora_load: bool) -> Duration {
        m.ttft_overhead(lora_load) + m.prefill(uncached, others)
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn ttft_follows_the_formula() {
        let m = model();
        // 5 + 0.02 × 1000 × (1 + 0.05 × 4) = 5 + 24 = 29 ms.
        assert!((ms(ttft(&m, 1000, 4, false)) - 29.0).abs() < 1e-6);
        // Alone, no prompt: just the base.
        assert!((ms(ttft(&m, 0, 0, false)) - 5.0).abs() < 1e-6);
        // Loading an adapter adds its cost.
        assert!((ms(ttft(&m, 0, 0, true)) - 25.0).abs() < 1e-6);
    }

    #[test]
    fn itl_grows_with_the_batch() {
        let m = model();
        assert!((ms(m.itl(0)) - 4.0).abs() < 1e-6);
        // 4 × (1 + 0.05 × 10) = 6 ms.
        assert!((ms(m.itl(10)) - 6.0).abs() < 1e-6);
    }

    #[test]
    fn time_scale_multiplies_everything() {
        let slow = LatencyModel {
            time_scale: 2.0,
            ..model()
        };
        assert!((ms(ttft(&slow, 1000, 4, true)) - 2.0 * 49.0).abs() < 1e-6);
        assert!((ms(slow.itl(10)) - 12.0).abs() < 1e-6);
    }

    #[test]
    fn absurd_values_saturate_instead_of_panicking() {
        let m = LatencyModel {
            time_scale: f64::MAX,
            ..model()
        };
        assert_eq!(m.itl(0), Duration::MAX);
    }
}
