//! Request priority and upstream's legacy admission control (flow control off).
//!
//! A request names an InferenceObjective in `x-llm-d-inference-objective`; the objective's
//! priority (unknown or no objective → 0) decides whether it is *sheddable* (priority < 0).
//! Sheddable requests are rejected with 429 while the pool is saturated, as measured by the
//! `utilization-detector` roofline over the candidate endpoints. Non-sheddable requests are
//! never rejected here. Plain Rust: the caller reads the headers and the clock.

use std::collections::BTreeMap;

use crate::errors::InferenceError;
use crate::scheduler::filters::{concurrency_detector, utilization_detector};
use crate::scheduler::profile::{Profile, UtilizationParams};
use crate::snapshot::Endpoint;

/// Request header naming the InferenceObjective.
pub const OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";

/// Deprecated alias of [`OBJECTIVE_HEADER`], read when the new header is absent.
pub const DEPRECATED_OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// The 429 message for a shed request.
pub const SHED_MESSAGE: &str = "system saturated, sheddable request dropped";

/// The priority of the objective named by the request's objective header: looked up by
/// InferenceObjective name; no header, or a name that is not known → 0.
pub fn objective_priority(
    snapshot_objectives: &BTreeMap<String, i32>,
    header: Option<&str>,
) -> i32 {
    header
        .and_then(|name| snapshot_objectives.get(name))
        .copied()
        .unwrap_or(0)
}

/// One endpoint's roofline saturation: `max(waiting / queueDepthThreshold,
/// kv / kvCacheUtilThreshold)`; metrics that were never scraped, or are older than
/// `metricsStalenessThreshold`, count as fully saturated (1.0).
pub fn endpoint_saturation(
    params: &UtilizationParams,
    endpoint: &Endpoint,
    now_unix_ms: u64,
) -> f64 {
    if !utilization_detector::is_fresh(params, endpoint, now_unix_ms) {
        return 1.0;
    }
    let metrics = &endpoint.metrics;
    let defaults = UtilizationParams::default();
    let queue = positive_or(params.queue_depth_threshold, defaults.queue_depth_threshold);
    let kv = positive_or(
        params.kv_cache_util_threshold,
        defaults.kv_cache_util_threshold,
    );
    let by_queue = metrics.waiting_queue_size as f64 / queue;
    let by_kv = metrics.kv_cache_usage / kv;
    by_queue.max(by_kv)
}

/// Pool saturation: the unweighted average of [`endpoint_saturation`] over the candidate
/// endpoints (after the subset hint); no endpoints → 1.0. Accepts `&[Endpoint]`, `&Vec<Endpoint>`
/// or an iterator of `&Endpoint` (e.g. `refs.iter().copied()` for a `&[&Endpoint]`).
pub fn saturation<'a>(
    params: &UtilizationParams,
    endpoints: impl IntoIterator<Item = &'a Endpoint>,
    now_unix_ms: u64,
) -> f64 {
    let (count, total) =
        endpoints
            .into_iter()
            .fold((0usize, 0.0f64), |(count, total), endpoint| {
                (
                    count + 1,
                    total + endpoint_saturation(params, endpoint, now_unix_ms),
                )
            });
    if count == 0 {
        1.0
    } else {
        total / count as f64
    }
}

/// The pool's saturation by the profile's detector: with a `concurrency-detector`, the
/// `in_flight` requests (asked only then) over the endpoints' capacity; else the utilization
/// roofline, [`saturation`], over the endpoints' metrics at `now_unix_ms`.
pub fn pool_saturation<'a>(
    profile: &Profile,
    endpoints: impl ExactSizeIterator<Item = &'a Endpoint>,
    in_flight: impl FnOnce() -> u64,
    now_unix_ms: u64,
) -> f64 {
    match &profile.concurrency_detector {
        Some(params) => concurrency_detector::saturation(params, endpoints.len(), in_flight()),
        None => saturation(&profile.saturation_detector, endpoints, now_unix_ms),
    }
}

/// Legacy admission: a sheddable request (priority < 0) is rejected with 429
/// `ResourceExhausted` when the pool saturation is ≥ 1.0; everything else is admitted.
pub fn admit(priority: i32, saturation: f64) -> Result<(), InferenceError> {
    if priority < 0 && saturation >= 1.0 {
        Err(InferenceError::ResourceExhausted(SHED_MESSAGE.to_string()))
    } else {
        Ok(())
    }
}

/// A threshold that must be a positive finite number; anything else falls back to `default`
/// (upstream rejects non-positive thresholds; the controller validates them too).
fn positive_or(value: f64, default: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        default
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Metrics;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const NOW: u64 = 1_000_000;

    fn endpoint(waiting: u64, kv: f64, updated: Option<u64>) -> Endpoint {
        Endpoint {
            name: "e".to_string(),
            address: "10.0.0.1".to_string(),
            port: 8000,
            ready: true,
            key_cache: Default::default(),
            labels: BTreeMap::new(),
            metrics: Metrics {
                waiting_queue_size: waiting,
                kv_cache_usage: kv,
                updated_unix_ms: updated,
                ..Metrics::default()
            },
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn objective_priority_by_name() {
        let objectives: BTreeMap<String, i32> = [
            ("critical".to_string(), 10),
            ("batch".to_string(), -1),
            ("plain".to_string(), 0),
        ]
        .into_iter()
        .collect();
        for (header, expected) in [
            (Some("critical"), 10),
            (Some("batch"), -1),
            (Some("plain"), 0),
            (Some("unknown"), 0),
            (Some(""), 0),
            (Some("Critical"), 0),
            (None, 0),
        ] {
            assert_eq!(
                objective_priority(&objectives, header),
                expected,
                "{header:?}"
            );
        }
        assert_eq!(objective_priority(&BTreeMap::new(), Some("critical")), 0);
    }

    #[test]
    fn endpoint_saturation_table() {
        let defaults = UtilizationParams::default();
        let fresh = Some(NOW - 100);
        for (waiting, kv, updated, expected) in [
            // Idle.
            (0, 0.0, fresh, 0.0),
            // Queue only: 2 / 5.
            (2, 0.0, fresh, 0.4),
            // KV only: 0.4 / 0.8.
            (0, 0.4, fresh, 0.5),
            // The larger of the two.
            (1, 0.6, fresh, 0.75),
            (4, 0.2, fresh, 0.8),
            // At and over the thresholds.
            (5, 0.0, fresh, 1.0),
            (0, 0.8, fresh, 1.0),
            (10, 0.9, fresh, 2.0),
            // Exactly at the staleness threshold is still fresh.
            (0, 0.0, Some(NOW - 200), 0.0),
            // Stale or never scraped → saturated, whatever the values.
            (0, 0.0, Some(NOW - 201), 1.0),
            (20, 0.0, Some(NOW - 201), 1.0),
            (0, 0.0, None, 1.0),
            // A timestamp from the future counts as fresh.
            (1, 0.0, Some(NOW + 5_000), 0.2),
        ] {
            let got = endpoint_saturation(&defaults, &endpoint(waiting, kv, updated), NOW);
            assert!(
                close(got, expected),
                "waiting {waiting}, kv {kv}, updated {updated:?}: {got} != {expected}"
            );
        }
    }

    #[test]
    fn custom_thresholds() {
        let params = UtilizationParams {
            queue_depth_threshold: 10.0,
            kv_cache_util_threshold: 0.5,
            metrics_staleness_threshold_ms: 1_000,
            headroom: 0.0,
        };
        let e = endpoint(5, 0.2, Some(NOW - 900));
        assert!(close(endpoint_saturation(&params, &e, NOW), 0.5));
        let e = endpoint(1, 0.4, Some(NOW - 900));
        assert!(close(endpoint_saturation(&params, &e, NOW), 0.8));
        let e = endpoint(1, 0.4, Some(NOW - 1_001));
        assert!(close(endpoint_saturation(&params, &e, NOW), 1.0));
        // Non-positive thresholds fall back to the defaults (5, 0.8).
        let params = UtilizationParams {
            queue_depth_threshold: 0.0,
            kv_cache_util_threshold: -1.0,
            ..params
        };
        let e = endpoint(1, 0.4, Some(NOW));
        assert!(close(endpoint_saturation(&params, &e, NOW), 0.5));
    }

    #[test]
    fn pool_saturation_is_the_unweighted_average() {
        let defaults = UtilizationParams::default();
        let fresh = Some(NOW);
        let pool = vec![
            endpoint(0, 0.0, fresh),  // 0.0
            endpoint(5, 0.0, fresh),  // 1.0
            endpoint(0, 0.4, fresh),  // 0.5
            endpoint(0, 0.0, None),   // 1.0
            endpoint(10, 0.0, fresh), // 2.0
            endpoint(0, 0.16, fresh), // 0.2
        ];
        let cases: Vec<(&[Endpoint], f64)> = vec![
            (&pool[..0], 1.0),
            (&pool[..1], 0.0),
            (&pool[..2], 0.5),
            (&pool[..3], 0.5),
            (&pool[..4], 0.625),
            (&pool[..5], 0.9),
            (&pool[..], 0.7833333333333333),
        ];
        for (endpoints, expected) in cases {
            let got = saturation(&defaults, endpoints, NOW);
            assert!(
                close(got, expected),
                "{} endpoints: {got} != {expected}",
                endpoints.len()
            );
        }
        // A slice of references works through `iter().copied()`.
        let refs: Vec<&Endpoint> = vec![&pool[1], &pool[4]];
        assert!(close(saturation(&defaults, refs.iter().copied(), NOW), 1.5));
        assert!(close(saturation(&defaults, &pool, NOW), 0.7833333333333333));
    }

    #[test]
    fn admission_table() {
        for (priority, saturation, admitted) in [
            (0, 0.0, true),
            (0, 1.0, true),
            (0, 5.0, true),
            (10, 2.0, true),
            (-1, 0.0, true),
            (-1, 0.999, true),
            (-1, 1.0, false),
            (-1, 1.5, false),
            (i32::MIN, 1.0, false),
            (-5, f64::NAN, true),
        ] {
            let got = admit(priority, saturation);
            assert_eq!(
                got.is_ok(),
                admitted,
                "priority {priority}, saturation {saturation}"
            );
            if let Err(e) = got {
                assert_eq!(e.status(), 429);
                assert_eq!(e.dropped_reason(), None);
                assert_eq!(
                    e.body(),
                    "inference error: ResourceExhausted - system saturated, sheddable request dropped"
                );
            }
        }
    }

    #[test]
    fn a_sheddable_request_to_an_empty_pool_is_shed() {
        let sat = saturation(&UtilizationParams::default(), &[] as &[Endpoint], NOW);
        assert!(admit(-1, sat).is_err());
        assert!(admit(0, sat).is_ok());
    }
}
