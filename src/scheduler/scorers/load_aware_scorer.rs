//! `load-aware-scorer`: an empty waiting queue scores 0.5, falling linearly to 0 at
//! `threshold` waiting requests and beyond.

use crate::scheduler::profile::LoadAwareParams;
use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "load-aware-scorer";

/// One score per candidate.
pub fn score(params: &LoadAwareParams, input: &ScoringInput<'_>) -> Vec<f64> {
    let threshold = params.threshold.max(1) as f64;
    input
        .endpoints
        .iter()
        .map(|e| {
            let q = e.metrics.waiting_queue_size as f64;
            if q >= threshold {
                0.0
            } else {
                0.5 * (1.0 - q / threshold)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::Request;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn half_at_zero_to_zero_at_threshold() {
        let owned = [
            endpoint(1, 0, 0.0),
            endpoint(2, 64, 0.0),
            endpoint(3, 128, 0.0),
            endpoint(4, 500, 0.0),
        ];
        let refs: Vec<_> = owned.iter().collect();
        let request = Request::default();
        let scores = score(&LoadAwareParams::default(), &input(&refs, &request));
        assert_eq!(scores, vec![0.5, 0.25, 0.0, 0.0]);
        let scores = score(&LoadAwareParams { threshold: 256 }, &input(&refs, &request));
        assert_eq!(scores, vec![0.5, 0.375, 0.25, 0.0]);
    }
}
