//! `running-requests-size-scorer`: prefers endpoints running fewer requests, min-max
//! normalised over the candidates (all equal → 1).

use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "running-requests-size-scorer";

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    super::lower_is_better(
        input
            .endpoints
            .iter()
            .map(|e| e.metrics.running_requests_size as f64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::Request;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn min_max_over_running() {
        let owned: Vec<_> = [2, 6, 4]
            .iter()
            .map(|&r| {
                let mut e = endpoint(1, 0, 0.0);
                e.metrics.running_requests_size = r;
                e
            })
            .collect();
        let refs: Vec<_> = owned.iter().collect();
        let request = Request::default();
        assert_eq!(score(&input(&refs, &request)), vec![1.0, 0.0, 0.5]);
        assert_eq!(score(&input(&refs[..1], &request)), vec![1.0]);
    }
}
