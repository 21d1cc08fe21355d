//! `concurrency-detector`: upstream's saturation detector that counts requests in flight
//! instead of reading the servers' metrics. Each endpoint holds `maxConcurrency` requests; the
//! pool's saturation is the requests this proxy has in flight to the candidates over their
//! capacity together, so it moves with every request sent and finished, not a scrape later.
//! Flow control with this detector keeps the requests beyond the servers' batches waiting in
//! the proxy, where its ordering policy can choose which goes next, instead of in the
//! servers' own first-come queues.
//!
//! Only its `requests` mode; as a profile filter it is not supported (the controller says so).
//! Per request: a sum over the candidates' in-flight counts, no host call.

use serde::{Deserialize, Serialize};

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "concurrency-detector";

/// Parameters of `concurrency-detector` in its `requests` mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConcurrencyParams {
    /// Requests each endpoint serves at once (its engine's batch limit, e.g. vLLM's
    /// `--max-num-seqs`).
    pub max_concurrency: u64,
}

impl Default for ConcurrencyParams {
    fn default() -> Self {
        ConcurrencyParams {
            max_concurrency: 100,
        }
    }
}

/// The pool's saturation: `in_flight` requests over `endpoints` × `maxConcurrency`; a pool
/// without endpoints is saturated (1.0), as with the utilization detector.
pub fn saturation(params: &ConcurrencyParams, endpoints: usize, in_flight: u64) -> f64 {
    let capacity = params
        .max_concurrency
        .max(1)
        .saturating_mul(endpoints as u64);
    if capacity == 0 {
        return 1.0;
    }
    in_flight as f64 / capacity as f64
}

/// What one more request in flight adds to [`saturation`].
pub fn step(params: &ConcurrencyParams, endpoints: usize) -> f64 {
    1.0 / params
        .max_concurrency
        .max(1)
        .saturating_mul(endpoints.max(1) as u64) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn saturation_is_in_flight_over_the_pool_capacity() {
        let params = ConcurrencyParams { max_concurrency: 8 };
        assert_eq!(saturation(&params, 4, 0), 0.0);
        assert_eq!(saturation(&params, 4, 16), 0.5);
        assert_eq!(saturation(&params, 4, 32), 1.0);
        assert_eq!(saturation(&params, 4, 40), 1.25);
        assert_eq!(saturation(&params, 0, 0), 1.0);
        assert_eq!(step(&params, 4), 1.0 / 32.0);
        // A zero capacity counts as one request per endpoint.
        let zero = ConcurrencyParams { max_concurrency: 0 };
        assert_eq!(saturation(&zero, 2, 1), 0.5);
    }
}
