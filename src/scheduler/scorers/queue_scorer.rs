//! `queue-scorer`: prefers endpoints with a shorter waiting queue, min-max normalised over the
//! candidates (all equal → 1).

use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "queue-scorer";

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    super::lower_is_better(
        input
            .endpoints
            .iter()
            .map(|e| e.metrics.waiting_queue_size as f64),
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
    fn min_max_over_candidates() {
        let table: [(&[u64], &[f64]); 4] = [
            (&[0, 5, 10], &[1.0, 0.5, 0.0]),
            (&[3, 3], &[1.0, 1.0]),
            (&[7], &[1.0]),
            (&[2, 6, 4], &[1.0, 0.0, 0.5]),
        ];
        for (queues, expected) in table {
            let endpoints: Vec<_> = queues.iter().map(|&q| endpoint(1, q, 0.0)).collect();
            let refs: Vec<_> = endpoints.iter().collect();
            let request = Request::default();
            assert_eq!(
                score(&input(&refs, &request)),
                expected,
                "queues {queues:?}"
            );
        }
    }
}
