//! `shortest-job-first-ordering-policy` (not an upstream plugin): within a band, the waiting
//! request that would finish first had it started when it arrived goes first: the smallest
//! arrival time plus expected decode time (its expected output tokens × the pool's measured time
//! per output token). So a burst that outruns the fleet delays few requests a lot instead of
//! every request behind a long one, and a waiting request gains one token of priority for every
//! token time it waits: a long one goes ahead of the short ones that arrived a decode of it
//! later. Past the fleet's capacity the queue's age dominates and the order approaches first
//! come, first served.
//!
//! A request's expected length is the output-token limit it gives (`max_tokens`,
//! `max_completion_tokens`, `max_output_tokens`), else the pool's measured mean request length
//! (the controller's moving mean of each server's generated tokens per finished request), else
//! it sorts after every request with one. The limit is an upper bound: a client that sets a
//! loose one is treated as long. One that has waited `maxWait` (default 30 s) goes before any
//! that has not (oldest first), which bounds the wait a huge limit could add. The bound is a
//! safety net, not a second ordering: past the fleet's capacity a short one would make every
//! request that waited that long go oldest first, i.e. first come, first served at that wait
//! (one screening run of the benchmark's ShareGPT-like workload at 14 requests/s, past the
//! fleet's capacity: TTFT p90 3.2 s with a 5 s bound, 2.8 s with 30 s).
//!
//! Per release: one pass over the band's waiting requests, no host call. The queue holds only
//! what the pool has no room for (bounded by the band's `maxRequests`).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::Waiting;
use crate::scheduler::Mean;
use crate::snapshot::Endpoint;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry.
pub const TYPE: &str = "shortest-job-first-ordering-policy";

/// The time per output token while no candidate reports its own (a decode step on one GPU
/// takes 10–50 ms).
const DEFAULT_MS_PER_TOKEN: f64 = 25.0;

/// The policy's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SjfParams {
    /// How long a request may wait before it goes ahead of any that has waited less, ms
    /// (default 30 s).
    pub max_wait_ms: u64,
}

impl Default for SjfParams {
    fn default() -> Self {
        SjfParams {
            max_wait_ms: 30_000,
        }
    }
}

/// The position in `waiting` (oldest first) of the request to release at `now_ms`: the oldest
/// if it has waited `max_wait_ms`, else the one with the earliest
/// [`finish_by_ms`](Waiting::finish_by_ms) (the oldest of those). `None` when nothing waits.
pub fn next(params: &SjfParams, waiting: &VecDeque<Waiting>, now_ms: u64) -> Option<usize> {
    let oldest = waiting.front()?;
    if now_ms.saturating_sub(oldest.since_ms) >= params.max_wait_ms {
        return Some(0);
    }
    waiting
        .iter()
        .enumerate()
        .min_by_key(|(at, w)| (w.finish_by_ms, *at))
        .map(|(at, _)| at)
}

/// When a request that arrived at `since_ms` would finish had it started then: its expected
/// output tokens (its `limit`, else the mean of the `endpoints`' measured request lengths)
/// times their mean measured time per output token ([`DEFAULT_MS_PER_TOKEN`] while none
/// reports one). `u64::MAX` when its length is unknown.
pub fn finish_by_ms(since_ms: u64, limit: Option<u64>, endpoints: &[&Endpoint]) -> u64 {
    let (mut lengths, mut speeds) = (Mean::default(), Mean::default());
    for m in endpoints.iter().map(|e| &e.metrics) {
        lengths.add(m.output_tokens_per_request);
        speeds.add(m.decode_ms_per_token);
    }
    let Some(tokens) = limit.map(|t| t as f64).or_else(|| lengths.get()) else {
        return u64::MAX;
    };
    let ms_per_token = speeds.get().unwrap_or(DEFAULT_MS_PER_TOKEN);
    // Saturating float-to-integer conversion: a huge limit sorts last.
    since_ms.saturating_add((tokens * ms_per_token).round() as u64)
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
            .map(|(i, &(since_ms, finish_by_ms))| Waiting {
                id: i as u32,
                since_ms,
                bytes: 1,
                finish_by_ms,
            })
            .collect()
    }

    #[test]
    fn the_earliest_finish_goes_first_until_the_oldest_has_waited_max_wait() {
        let params = SjfParams { max_wait_ms: 1_000 };
        let waiting = queue(&[(100, 600), (200, 240), (300, 240), (400, 1_100)]);
        // The two earliest tie: the older one.
        assert_eq!(next(&params, &waiting, 1_000), Some(1));
        // The oldest has waited 1 s: it goes, however long.
        assert_eq!(next(&params, &waiting, 1_100), Some(0));
        assert_eq!(next(&params, &VecDeque::new(), 0), None);
    }

    #[test]
    fn a_request_finishes_by_its_arrival_plus_its_tokens_at_the_pools_speed() {
        let mut a = endpoint(1, 0, 0.0);
        a.metrics.output_tokens_per_request = 40.0;
        a.metrics.decode_ms_per_token = 20.0;
        let mut b = endpoint(2, 0, 0.0);
        b.metrics.output_tokens_per_request = 60.0;
        b.metrics.decode_ms_per_token = 40.0;
        let unmeasured = endpoint(3, 0, 0.0);
        // Its own limit at the mean speed (30 ms).
        assert_eq!(finish_by_ms(1_000, Some(7), &[&a, &b, &unmeasured]), 1_210);
        // No limit: the mean length (50 tokens).
        assert_eq!(finish_by_ms(1_000, None, &[&a, &b, &unmeasured]), 2_500);
        // Nothing measured: the default speed; no length at all: last.
        assert_eq!(finish_by_ms(0, Some(4), &[&unmeasured]), 100);
        assert_eq!(finish_by_ms(0, None, &[&unmeasured]), u64::MAX);
        assert_eq!(finish_by_ms(5, Some(u64::MAX), &[&a]), u64::MAX);
    }
}
