//! `session-affinity-scorer` (`encoded_endpoint_header` strategy): the endpoint named by the
//! request's session token scores 1, every other endpoint 0.

use crate::scheduler::ScoringInput;

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    let session = input.request.session_endpoint;
    input
        .endpoints
        .iter()
        .map(|e| {
            if session == Some(e.name.as_str()) {
                1.0
            } else {
                0.0
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
    fn only_the_session_endpoint_scores() {
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let refs: Vec<_> = owned.iter().collect();
        let request = Request {
            session_endpoint: Some("pod-2"),
            ..Request::default()
        };
        assert_eq!(score(&input(&refs, &request)), vec![0.0, 1.0]);
        let request = Request::default();
        assert_eq!(score(&input(&refs, &request)), vec![0.0, 0.0]);
    }
}
