//! `expected-delay-scorer` (not an upstream plugin): prefers the endpoint where a new request
//! is expected to reach its first token soonest, on a fleet whose servers run at different
//! speeds.
//!
//! A model server runs up to a batch limit of requests at once and queues the rest, so a new
//! request's delay has two regimes. While the server has room, it starts at once and its delay
//! is its prefill, which grows with its prompt and scales with the server's speed (plus a
//! little for the batch it joins). Once the server is full, it also waits for the requests
//! queued before it to get a slot, each about one request's decode time divided by the batch
//! limit. In units of the server's time per output token:
//!
//! `delay = speed × (prefill + BATCH_COST × load / limit + per_queued × max(0, load + 1 − limit))`
//!
//! - `prefill`: [`BASE_COST`] plus the prompt bytes the server must prefill before this
//!   request's first token, over [`PROMPT_BYTES_PER_TOKEN_TIME`]: this prompt's, less the share
//!   of its blocks the prefix index says the server holds (when the profile has a prefix-cache
//!   scorer), and those of the requests this proxy sent there that have no first token yet
//!   (an engine prefills one prompt after another, so a new request waits for the prefills
//!   ahead of it). So a long prompt goes where it is prefilled fastest or is cached, a short
//!   one may take a slow server's free slot, and requests keep away from a server busy
//!   prefilling a long prompt while the others are free;
//! - `speed`: the controller's moving mean of the server's inter-token-latency histogram
//!   ([`Metrics::decode_ms_per_token`](crate::snapshot::Metrics::decode_ms_per_token)); a
//!   server without one is taken at the mean of the candidates that have one (all equal when
//!   none has);
//! - `load`: the larger of this proxy's requests in flight there (counted by every worker,
//!   current to the request) and the server's own running plus waiting requests (from the last
//!   scrape, which also counts other proxies' and clients' requests);
//! - `limit`: the most requests any candidate has been seen running at once
//!   ([`Metrics::peak_running_requests`](crate::snapshot::Metrics::peak_running_requests)), at
//!   least 1. The servers of one pool run one engine configuration, so they share a batch
//!   limit while their speeds differ. Each server's own peak would undercount the limit of
//!   every server that has not yet been full, and the slowest ones, which get the fewest
//!   requests, would look full at a peak of one or two and be starved while the fast ones
//!   queue. Until some server has been full the fleet's peak is an underestimate too, which
//!   only spreads load earlier; a server sent past it runs more if it can, which raises it.
//! - `per_queued`: how long a queued request waits for each one ahead of it, one request's
//!   decode shared over the limit's slots: the candidates' mean request length in output tokens
//!   (the controller's moving mean of each server's generated tokens per finished request,
//!   [`Metrics::output_tokens_per_request`](crate::snapshot::Metrics::output_tokens_per_request))
//!   over `limit`; [`QUEUED_COST`] while no candidate reports one. So a fleet serving long
//!   answers sends a request to a slower server's free slot sooner than let it queue on a fast
//!   one, and a fleet serving short ones lets it wait where it is cached.
//!
//! So the fast servers fill first, a slower one takes requests when the fast ones would make
//! them queue, and queues, once every server has one, grow in proportion to each server's
//! speed. Count-based scorers (queue, active requests) cannot tell a slow server from a fast
//! one until its queue has grown. Score: the smallest expected delay over this one's (the best
//! candidate scores 1, one expected to take twice as long 0.5).
//!
//! Per request: one pass over the candidates, no host call.

use crate::scheduler::{measured, uncached_bytes, Mean, ScoringInput};

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "expected-delay-scorer";

/// The fixed part of a request's time to first token, in output-token times.
const BASE_COST: f64 = 0.25;

/// Prompt bytes a server prefills in about one output token's time: about 256 tokens (at
/// about 4 bytes each), as an engine on one GPU prefills 10–20 thousand tokens a second
/// while a decode step takes 10–25 ms.
const PROMPT_BYTES_PER_TOKEN_TIME: f64 = 1024.0;

/// What joining a full batch adds, in output-token times: a model server's step slows by a few
/// per cent per running request, and a request that joins a busy batch also waits for the
/// prefills admitted just before it. At 0.5 the fast servers of the benchmark's heterogeneous
/// fleet ran full batches before the slower ones got work; its goodput was 8.4 requests/s
/// (twice) against 9.0 at 2.0 in 15 s-step runs, with the shared-prefix goodput unchanged
/// (24.1 and 24.6). A later full routing run at 2.0 gave 8.4 again: the gain is within this
/// VM's run-to-run spread, and 4.0 gave 8.6.
const BATCH_COST: f64 = 2.0;

/// What each request queued ahead adds, in output-token times, while no candidate reports its
/// requests' mean length: about one request's decode (tens to hundreds of tokens) spread over
/// the batch limit's slots (tens to hundreds), here 32 tokens over 8 slots. A lower cost keeps
/// requests where their prompts are cached for longer; as a constant 8, the shared-prefix
/// benchmark's hit rate near saturation fell from about 70 % to 45–55 %, while its requests'
/// measured length (32 tokens over 8 slots) gives this 4 again.
const QUEUED_COST: f64 = 4.0;

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    let mut speeds = Mean::default();
    let mut lengths = Mean::default();
    let mut peak = 1u64;
    for m in input.endpoints.iter().map(|e| &e.metrics) {
        peak = peak.max(m.peak_running_requests);
        speeds.add(m.decode_ms_per_token);
        lengths.add(m.output_tokens_per_request);
    }
    let limit = peak as f64;
    let fallback = speeds.get().unwrap_or(1.0);
    let per_queued = lengths.get().map_or(QUEUED_COST, |tokens| tokens / limit);
    let mut scores: Vec<f64> = input
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let metrics = &e.metrics;
            let in_flight = input.in_flight.get(i).copied().unwrap_or_default();
            let reported = metrics
                .running_requests_size
                .saturating_add(metrics.waiting_queue_size);
            let load = in_flight.requests.max(reported) as f64;
            let queued = (load + 1.0 - limit).max(0.0);
            let speed = measured(metrics.decode_ms_per_token).unwrap_or(fallback);
            let blocks = input.prefix.map(|p| {
                let matched = p.matched_blocks.get(i).copied().unwrap_or(0);
                (matched, p.blocks.total)
            });
            let own = uncached_bytes(input.request.prompt.len(), blocks);
            let prefill = BASE_COST
                + (own.saturating_add(in_flight.prefill_bytes)) as f64
                    / PROMPT_BYTES_PER_TOKEN_TIME;
            speed * (prefill + BATCH_COST * load / limit + per_queued * queued)
        })
        .collect();
    // The delays become scores in place: one allocation per request, as every scorer's.
    let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
    for score in &mut scores {
        *score = best / *score;
    }
    scores
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::{InFlight, Request};
    use crate::snapshot::Endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// An endpoint with `running` requests at `ms` per output token and a batch limit of 8.
    fn server(i: u8, running: u64, ms: f64) -> Endpoint {
        let mut e = endpoint(i, 0, 0.0);
        e.metrics.running_requests_size = running;
        e.metrics.decode_ms_per_token = ms;
        e.metrics.peak_running_requests = 8;
        e
    }

    /// A 768-byte prompt: prefill 0.25 + 0.75 = 1 output-token time.
    const PROMPT: [u8; 768] = [b'x'; 768];

    fn scores(endpoints: &[Endpoint], in_flight: &[u64]) -> Vec<f64> {
        scores_for(&PROMPT, endpoints, in_flight)
    }

    fn scores_for(prompt: &[u8], endpoints: &[Endpoint], in_flight: &[u64]) -> Vec<f64> {
        let in_flight: Vec<InFlight> = in_flight
            .iter()
            .map(|&requests| InFlight {
                requests,
                prefill_bytes: 0,
            })
            .collect();
        scores_with(prompt, endpoints, &in_flight)
    }

    fn scores_with(prompt: &[u8], endpoints: &[Endpoint], in_flight: &[InFlight]) -> Vec<f64> {
        let refs: Vec<_> = endpoints.iter().collect();
        let request = Request {
            prompt,
            ..Request::default()
        };
        score(&ScoringInput {
            in_flight,
            ..input(&refs, &request)
        })
    }

    fn delays_ratio(scores: &[f64]) -> f64 {
        scores[1] / scores[0]
    }

    #[test]
    fn fast_servers_fill_before_a_slow_one_takes_requests() {
        // Idle: the 4× slower server expects 4× the delay.
        let fleet = [server(1, 0, 25.0), server(2, 0, 100.0)];
        assert_eq!(scores(&fleet, &[]), [1.0, 0.25]);
        // 7 running of 8 on the fast one: 25 × (1 + 2 × 7/8) = 68.75 < 100.
        let fleet = [server(1, 7, 25.0), server(2, 0, 100.0)];
        let s = scores(&fleet, &[]);
        assert_eq!(s[0], 1.0);
        assert!((s[1] - 68.75 / 100.0).abs() < 1e-12);
        // Full (8 running): a new request would queue, 25 × (1 + 2 + 4) = 175 > 100.
        let fleet = [server(1, 8, 25.0), server(2, 0, 100.0)];
        let s = scores(&fleet, &[]);
        assert_eq!(s[1], 1.0);
        assert!((s[0] - 100.0 / 175.0).abs() < 1e-12);
    }

    #[test]
    fn a_long_prompt_queues_on_a_fast_server_rather_than_prefill_on_a_slow_one() {
        let fleet = [server(1, 8, 25.0), server(2, 0, 100.0)];
        // 12 KB: 25 × (0.25 + 12 + 2 + 4) = 456.25 against 100 × 12.25 = 1225.
        let long = vec![b'x'; 12 * 1024];
        let s = scores_for(&long, &fleet, &[]);
        assert_eq!(s[0], 1.0);
        assert!((s[1] - 456.25 / 1225.0).abs() < 1e-12);
        // A short one takes the slow server's free slot.
        assert_eq!(scores(&fleet, &[])[1], 1.0);
    }

    #[test]
    fn a_cached_prompt_saves_its_prefill() {
        use crate::scheduler::prefix::{PrefixMatch, PromptBlocks};
        // 8 KB, all 4 blocks cached on the first server (which is full), none on the second.
        let prompt = vec![b'x'; 8 * 1024];
        let prefix = PrefixMatch {
            blocks: PromptBlocks {
                total: 4,
                hashes: vec![1, 2, 3, 4],
            },
            matched_blocks: vec![4, 0],
            block_size_tokens: 512,
        };
        let fleet = [server(1, 8, 25.0), server(2, 4, 25.0)];
        let refs: Vec<_> = fleet.iter().collect();
        let request = Request {
            prompt: &prompt,
            ..Request::default()
        };
        let s = score(&ScoringInput {
            prefix: Some(&prefix),
            ..input(&refs, &request)
        });
        // Cached: 0.25 + 0 + 2 + 4 (one queued) = 6.25 beats not cached, with room:
        // 0.25 + 8 + 2 × 4/8 = 9.25.
        assert_eq!(s[0], 1.0);
        assert!((s[1] - 6.25 / 9.25).abs() < 1e-12, "{s:?}");
        // Half cached on the first: 0.25 + 4 + 2 + 4 = 10.25.
        let half = PrefixMatch {
            matched_blocks: vec![2, 0],
            ..prefix
        };
        let s = score(&ScoringInput {
            prefix: Some(&half),
            ..input(&refs, &request)
        });
        assert!((s[0] - 9.25 / 10.25).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn once_all_queue_queues_follow_speed() {
        // Both full; the fast one has 4 queued ahead of a new request, the 4× slower one 1.
        let fleet = [server(1, 11, 25.0), server(2, 8, 100.0)];
        let s = scores(&fleet, &[]);
        let fast = 25.0 * (1.0 + 2.0 * 11.0 / 8.0 + 4.0 * 4.0);
        let slow = 100.0 * (1.0 + 2.0 + 4.0);
        assert!((delays_ratio(&s) - fast / slow).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn long_answers_make_a_queue_cost_more() {
        // The fast server is full, the 4× slower one runs 4 of its 8.
        let fleet = |tokens_per_request: f64| {
            let mut fleet = [server(1, 8, 25.0), server(2, 4, 100.0)];
            for e in &mut fleet {
                e.metrics.output_tokens_per_request = tokens_per_request;
            }
            fleet
        };
        let slow = 100.0 * (1.0 + 2.0 * 4.0 / 8.0);
        // Unmeasured, a request queued ahead costs 4: 25 × (1 + 2 + 4) = 175 < 200, it waits
        // on the fast server; measured 32-token requests over 8 slots cost the same.
        for unmeasured_or_short in [0.0, 32.0] {
            let s = scores(&fleet(unmeasured_or_short), &[]);
            assert_eq!(s[0], 1.0);
            assert!((s[1] - 175.0 / slow).abs() < 1e-12, "{s:?}");
        }
        // 96-token requests free a fast slot only every 12 token times:
        // 25 × (1 + 2 + 12) = 375 > 200, the slow server's free slot is sooner.
        let s = scores(&fleet(96.0), &[]);
        assert_eq!(s[1], 1.0);
        assert!((s[0] - slow / 375.0).abs() < 1e-12, "{s:?}");
        // The mean is over the candidates that report one.
        let mut mixed = fleet(192.0);
        mixed[1].metrics.output_tokens_per_request = 0.0;
        assert_eq!(scores(&mixed, &[]), scores(&fleet(192.0), &[]));
    }

    #[test]
    fn prompts_still_to_prefill_ahead_add_their_prefill() {
        // Equal and idle, but this proxy sent the first one a 3,072-byte prompt that has no
        // first token yet: 25 × (1 + 3 + 2 × 1/8) against 25 × (1 + 2 × 1/8) on the second,
        // which has a prefilled request.
        let fleet = [server(1, 0, 25.0), server(2, 0, 25.0)];
        let in_flight = [
            InFlight {
                requests: 1,
                prefill_bytes: 3072,
            },
            InFlight {
                requests: 1,
                prefill_bytes: 0,
            },
        ];
        let s = scores_with(&PROMPT, &fleet, &in_flight);
        assert_eq!(s[1], 1.0);
        assert!((s[0] - 1.25 / 4.25).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn load_is_the_larger_of_in_flight_and_reported() {
        let fleet = [server(1, 1, 10.0), server(2, 1, 10.0)];
        // This proxy knows of 9 in flight on the first (one queued past the limit of 8); its
        // scrape said 1.
        let s = scores(&fleet, &[9, 0]);
        assert_eq!(s[1], 1.0);
        assert!(
            (s[0] - 10.0 * (1.0 + 2.0 / 8.0) / (10.0 * (1.0 + 2.0 * 9.0 / 8.0 + 8.0))).abs()
                < 1e-12
        );
        // Another proxy's requests: the second reports 8 running and 2 waiting while this
        // proxy has none there.
        let mut busy = server(2, 8, 10.0);
        busy.metrics.waiting_queue_size = 2;
        let fleet = [server(1, 1, 10.0), busy];
        let s = scores(&fleet, &[1, 0]);
        assert_eq!(s[0], 1.0);
        assert!(s[1] < 0.1, "{s:?}");
    }

    #[test]
    fn a_server_never_seen_full_shares_the_fleets_batch_limit() {
        // The 4× slower server has run at most one request at once (it got little traffic);
        // the fast one has run 8 and has 7 now. Counted against its own peak of 1, the slow
        // server with one running would look full (100 × (1 + 2 + 4) = 700 against
        // 25 × (1 + 2 × 7/8) = 68.75) and the fast one would take the request into its last
        // slot; against the fleet's 8 it has room: 100 × (1 + 2/8) = 125.
        let slow = || {
            let mut e = server(2, 1, 100.0);
            e.metrics.peak_running_requests = 1;
            e
        };
        let fleet = [server(1, 7, 25.0), slow()];
        let s = scores(&fleet, &[]);
        assert_eq!(s[0], 1.0);
        assert!((s[1] - 68.75 / 125.0).abs() < 1e-12, "{s:?}");
        // Full, the fast one would queue it (25 × (1 + 2 + 4) = 175): the slow one takes it.
        let fleet = [server(1, 8, 25.0), slow()];
        let s = scores(&fleet, &[]);
        assert_eq!(s[1], 1.0);
        assert!((s[0] - 125.0 / 175.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn unknown_speeds_and_limits_have_defaults() {
        // Unknown speed (0) is taken at the mean of 20 and 60 = 40.
        let fleet = [server(1, 0, 20.0), server(2, 0, 60.0), server(3, 0, 0.0)];
        assert_eq!(scores(&fleet, &[]), [1.0, 20.0 / 60.0, 0.5]);
        // No speed and no limit known: every request beyond the first counts as queued, so
        // this is in-flight balancing.
        let mut fleet = [server(1, 0, 0.0), server(2, 0, 0.0)];
        for e in &mut fleet {
            e.metrics.peak_running_requests = 0;
        }
        let s = scores(&fleet, &[1, 3]);
        assert_eq!(s[0], 1.0);
        assert!((s[1] - (1.0 + 2.0 + 4.0) / (1.0 + 6.0 + 12.0)).abs() < 1e-12);
    }
}
