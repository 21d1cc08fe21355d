//! `active-request-scorer`: prefers endpoints with fewer requests in flight from this proxy
//! (counted in shared data by every Envoy worker). At most `idleThreshold` in flight → 1, else
//! `(max − count)/max · maxBusyScore` with `max` the largest count among the candidates.

use crate::scheduler::profile::ActiveRequestParams;
use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "active-request-scorer";

/// One score per candidate.
pub fn score(params: &ActiveRequestParams, input: &ScoringInput<'_>) -> Vec<f64> {
    let count = |i: usize| input.in_flight.get(i).map_or(0, |n| n.requests);
    let max = (0..input.endpoints.len()).map(count).max().unwrap_or(0) as f64;
    (0..input.endpoints.len())
        .map(|i| {
            let c = count(i);
            if c <= params.idle_threshold || max == 0.0 {
                1.0
            } else {
                (max - c as f64) / max * params.max_busy_score
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::{InFlight, Request};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn idle_scores_one_busy_scales_down() {
        let endpoints = [
            endpoint(1, 0, 0.0),
            endpoint(2, 0, 0.0),
            endpoint(3, 0, 0.0),
        ];
        let refs: Vec<_> = endpoints.iter().collect();
        let request = Request::default();
        let scoring = ScoringInput {
            prefix: None,
            in_flight: &[0, 2, 4].map(|requests| InFlight {
                requests,
                prefill_bytes: 0,
            }),
            ..input(&refs, &request)
        };
        assert_eq!(
            score(&ActiveRequestParams::default(), &scoring),
            vec![1.0, 0.5, 0.0]
        );
        let params = ActiveRequestParams {
            idle_threshold: 2,
            max_busy_score: 0.5,
        };
        assert_eq!(score(&params, &scoring), vec![1.0, 1.0, 0.0]);
        let none = ScoringInput {
            prefix: None,
            in_flight: &[],
            ..input(&refs, &request)
        };
        assert_eq!(score(&params, &none), vec![1.0, 1.0, 1.0]);
    }
}
