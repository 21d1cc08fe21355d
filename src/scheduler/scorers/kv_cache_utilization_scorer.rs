//! `kv-cache-utilization-scorer`: prefers endpoints with free KV cache, `1 − usage`.

use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "kv-cache-utilization-scorer";

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    input
        .endpoints
        .iter()
        .map(|e| 1.0 - e.metrics.kv_cache_usage)
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
    fn one_minus_usage_without_normalisation() {
        let endpoints = [
            endpoint(1, 0, 0.0),
            endpoint(2, 0, 0.25),
            endpoint(3, 0, 1.0),
        ];
        let refs: Vec<_> = endpoints.iter().collect();
        let request = Request::default();
        let scoring = ScoringInput {
            prefix: None,
            in_flight: &[],
            ..input(&refs, &request)
        };
        assert_eq!(score(&scoring), vec![1.0, 0.75, 0.0]);
    }
}
