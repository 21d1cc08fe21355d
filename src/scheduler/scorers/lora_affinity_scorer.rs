//! `lora-affinity-scorer`: prefers endpoints where the request's adapter is already active
//! (1.0), then endpoints with room to load another adapter (0.8), then endpoints where it is
//! waiting (0.6); anything else scores 0.

use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "lora-affinity-scorer";

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    let model = input.request.model;
    input
        .endpoints
        .iter()
        .map(|e| {
            let m = &e.metrics;
            if m.active_models.iter().any(|a| a == model) {
                1.0
            } else if m.active_models.len() + m.waiting_models.len() < m.max_active_models as usize
            {
                0.8
            } else if m.waiting_models.iter().any(|a| a == model) {
                0.6
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
    fn active_room_waiting_none() {
        let with = |active: &[&str], waiting: &[&str], max: u32| {
            let mut e = endpoint(1, 0, 0.0);
            e.metrics.active_models = active.iter().map(|s| s.to_string()).collect();
            e.metrics.waiting_models = waiting.iter().map(|s| s.to_string()).collect();
            e.metrics.max_active_models = max;
            e
        };
        let owned = [
            with(&["sql"], &[], 1),
            with(&["chat"], &[], 2),
            with(&["chat"], &["sql"], 2),
            with(&["chat"], &[], 1),
            with(&[], &[], 0),
        ];
        let refs: Vec<_> = owned.iter().collect();
        let request = Request {
            model: "sql",
            ..Request::default()
        };
        assert_eq!(
            score(&input(&refs, &request)),
            vec![1.0, 0.8, 0.6, 0.0, 0.0]
        );
    }
}
