//! `utilization-detector`: the upstream roofline saturation detector. As a profile filter it
//! keeps endpoints with fresh metrics below the thresholds (scaled by `1 + headroom`); as the
//! admission detector it gives the pool's saturation (`crate::admission`, which shares the
//! freshness rule).

use crate::scheduler::profile::UtilizationParams;
use crate::snapshot::Endpoint;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "utilization-detector";

/// Whether the endpoint's metrics are younger than the staleness threshold.
pub fn is_fresh(params: &UtilizationParams, endpoint: &Endpoint, now_unix_ms: u64) -> bool {
    endpoint
        .metrics
        .updated_unix_ms
        .is_some_and(|t| now_unix_ms.saturating_sub(t) <= params.metrics_staleness_threshold_ms)
}

/// The filter's test: fresh, and both queue and KV usage strictly below their thresholds
/// scaled by `1 + headroom`.
pub fn has_room(params: &UtilizationParams, endpoint: &Endpoint, now_unix_ms: u64) -> bool {
    let scale = 1.0 + params.headroom;
    let m = &endpoint.metrics;
    is_fresh(params, endpoint, now_unix_ms)
        && (m.waiting_queue_size as f64) < params.queue_depth_threshold * scale
        && m.kv_cache_usage < params.kv_cache_util_threshold * scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::filters::apply;
    use crate::scheduler::profile::FilterSpec;
    use crate::scheduler::test_support::endpoint;
    use crate::scheduler::Request;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const NOW: u64 = 1_000_000;

    fn scraped(i: u8, waiting: u64, kv: f64, age_ms: u64) -> Endpoint {
        let mut e = endpoint(i, waiting, kv);
        e.metrics.updated_unix_ms = Some(NOW - age_ms);
        e
    }

    #[test]
    fn filter_keeps_endpoints_with_room_and_fails_open() {
        let p = UtilizationParams::default();
        let endpoints = [
            scraped(1, 4, 0.79, 0),  // under both thresholds
            scraped(2, 5, 0.0, 0),   // queue at threshold
            scraped(3, 0, 0.8, 0),   // kv at threshold
            scraped(4, 0, 0.0, 500), // stale
        ];
        let endpoints: Vec<&Endpoint> = endpoints.iter().collect();
        let request = Request {
            metrics_unix_ms: NOW,
            ..Request::default()
        };
        let spec = FilterSpec::UtilizationDetector(p.clone());
        assert_eq!(
            apply(&spec, &endpoints, vec![0, 1, 2, 3], &request),
            vec![0]
        );
        let headroom = FilterSpec::UtilizationDetector(UtilizationParams {
            headroom: 0.25,
            ..p
        });
        assert_eq!(
            apply(&headroom, &endpoints, vec![0, 1, 2, 3], &request),
            vec![0, 1, 2]
        );
        assert_eq!(apply(&spec, &endpoints, vec![1, 3], &request), vec![1, 3]);
    }
}
