//! `shortest-job-first-ordering-policy` (not an upstream plugin): within a band, the waiting
//! request expected to hold a server's batch slot for the fewest output tokens goes first, so
//! a burst that outruns the fleet delays few requests a lot instead of every request behind a
//! long one. A request's expected length is the output-token limit it gives (`max_tokens`,
//! `max_completion_tokens`, `max_output_tokens`), else the pool's measured mean request length
//! (the controller's moving mean of each server's generated tokens per finished request), else
//! it sorts after every request with one. Ties go oldest first.
//!
//! Long requests are not starved: one that has waited `maxWait` goes before any that has not,
//! and those go oldest first. The limit is an upper bound: a client that sets a loose one is
//! treated as long (FCFS among themselves once past `maxWait`).
//!
//! Per release: one pass over the band's waiting requests, no host call. The queue holds only
//! what the pool has no room for (bounded by the band's `maxRequests`).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::Waiting;
use crate::snapshot::Endpoint;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry.
pub const TYPE: &str = "shortest-job-first-ordering-policy";

/// The policy's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SjfParams {
    /// How long a request may wait before it goes ahead of shorter ones, ms.
    pub max_wait_ms: u64,
}

impl Default for SjfParams {
    fn default() -> Self {
        SjfParams { max_wait_ms: 5_000 }
    }
}

/// The position in `waiting` (oldest first) of the request to release at `now_ms`: the oldest
/// if it has waited `max_wait_ms`, else the one with the fewest expected output tokens (the
/// oldest of those). `None` when nothing waits.
pub fn next(params: &SjfParams, waiting: &VecDeque<Waiting>, now_ms: u64) -> Option<usize> {
    let oldest = waiting.front()?;
    if now_ms.saturating_sub(oldest.since_ms) >= params.max_wait_ms {
        return Some(0);
    }
    waiting
        .iter()
        .enumerate()
        .min_by_key(|(at, w)| (w.output_tokens, *at))
        .map(|(at, _)| at)
}

/// A request's expected output tokens: its own limit, else the mean of the `endpoints`'
/// measured request lengths, else `u64::MAX` (after every request with a length).
pub fn expected_output_tokens(limit: Option<u64>, endpoints: &[&Endpoint]) -> u64 {
    limit.unwrap_or_else(|| {
        let measured = endpoints
            .iter()
            .map(|e| e.metrics.output_tokens_per_request)
            .filter(|t| t.is_finite() && *t > 0.0);
        let (count, sum) = measured.fold((0u32, 0.0), |(n, s), t| (n + 1, s + t));
        if count == 0 {
            u64::MAX
        } else {
            (sum / f64::from(count)).round() as u64
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn queue(items: &[(u64, u64)]) -> VecDeque<Waiting> {
        items
            .iter()
            .enumerate()
            .map(|(i, &(since_ms, output_tokens))| Waiting {
                id: i as u32,
                since_ms,
                bytes: 1,
                output_tokens,
            })
            .collect()
    }

    #[test]
    fn the_shortest_goes_first_until_the_oldest_has_waited_max_wait() {
        let params = SjfParams { max_wait_ms: 1_000 };
        let waiting = queue(&[(100, 500), (200, 40), (300, 40), (400, 700)]);
        // The two shortest tie: the older one.
        assert_eq!(next(&params, &waiting, 1_000), Some(1));
        // The oldest has waited 1 s: it goes, however long.
        assert_eq!(next(&params, &waiting, 1_100), Some(0));
        assert_eq!(next(&params, &VecDeque::new(), 0), None);
    }

    #[test]
    fn a_request_without_a_limit_counts_as_the_pool_mean() {
        let mut a = endpoint(1, 0, 0.0);
        a.metrics.output_tokens_per_request = 40.0;
        let mut b = endpoint(2, 0, 0.0);
        b.metrics.output_tokens_per_request = 61.0;
        let unmeasured = endpoint(3, 0, 0.0);
        assert_eq!(expected_output_tokens(Some(7), &[&a]), 7);
        assert_eq!(expected_output_tokens(None, &[&a, &b, &unmeasured]), 51);
        assert_eq!(expected_output_tokens(None, &[&unmeasured]), u64::MAX);
    }
}
