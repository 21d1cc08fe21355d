//! Filter plugins, one file each, named like their upstream config `type`, which each holds as
//! `TYPE`. A filter narrows the candidate list (indices into the snapshot's endpoints), keeping
//! their order.

pub mod concurrency_detector;
pub mod decode_filter;
pub mod label_selector_filter;
pub mod prefill_filter;
pub mod utilization_detector;

use super::profile::FilterSpec;
use super::Request;
use crate::snapshot::Endpoint;

/// Label naming an endpoint's disaggregation role.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// Applies one filter to `candidates`.
pub fn apply(
    spec: &FilterSpec,
    endpoints: &[&Endpoint],
    candidates: Vec<usize>,
    request: &Request<'_>,
) -> Vec<usize> {
    let keep = |pred: &dyn Fn(&Endpoint) -> bool| -> Vec<usize> {
        candidates
            .iter()
            .copied()
            .filter(|&i| endpoints.get(i).is_some_and(|e| pred(e)))
            .collect()
    };
    match spec {
        FilterSpec::LabelSelector(selector) => {
            keep(&|e| label_selector_filter::matches(selector, &e.labels))
        }
        FilterSpec::Decode => keep(&decode_filter::keeps),
        FilterSpec::Prefill => keep(&prefill_filter::keeps),
        FilterSpec::UtilizationDetector(params) => {
            let kept =
                keep(&|e| utilization_detector::has_room(params, e, request.metrics_unix_ms));
            // Fail open: a filter that would leave nothing keeps everything.
            if kept.is_empty() {
                candidates
            } else {
                kept
            }
        }
    }
}

/// The endpoint's role label, if any.
fn role(endpoint: &Endpoint) -> Option<&str> {
    endpoint.labels.get(ROLE_LABEL).map(String::as_str)
}
