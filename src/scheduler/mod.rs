//! The scheduler: weighted scorers → picker over the snapshot's endpoints, as one upstream
//! scheduling profile does it. Plain Rust with no proxy-wasm types, tested natively and under
//! wasm-bindgen-test.

pub mod disaggregation;
pub mod filters;
pub mod fixed_scores;
pub mod pickers;
pub mod prefix;
pub mod profile;
pub mod rng;
pub mod scorers;

use crate::errors::InferenceError;
use crate::phases::{Phase, PhaseTimer};
use crate::snapshot::Endpoint;
use fixed_scores::ScoringCache;
use prefix::{PrefixIndex, PrefixMatch};
use profile::{Profile, ScorerSpec, WeightedScorer};
use rng::Rng;
use std::sync::Arc;

/// What the scheduler needs from the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The model the request targets after rewrites (LoRA affinity, prefix hash seed).
    pub model: &'a str,
    /// Prompt bytes for the prefix-cache producer (empty: no prefix scoring).
    pub prompt: &'a [u8],
    /// The body's `cache_salt`.
    pub cache_salt: &'a str,
    /// The endpoint name the request's session token names, if any.
    pub session_endpoint: Option<&'a str>,
    /// Wall-clock time, milliseconds since the Unix epoch (prefix-index records).
    pub now_unix_ms: u64,
    /// The time metrics are aged at ([`Snapshot::metrics_clock`](crate::snapshot::Snapshot::metrics_clock)).
    pub metrics_unix_ms: u64,
}

/// The outcome of scheduling one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Indices into the endpoint slice, primary first, then fallbacks.
    pub picked: Vec<usize>,
    /// Indices of the endpoints that passed the filters, in endpoint order.
    pub candidates: Vec<usize>,
    /// Weighted total per candidate (same order as `candidates`).
    pub totals: Vec<f64>,
    /// Each scorer's clamped, unweighted score per candidate, in the profile's scorer order.
    pub scores: Vec<Scores>,
    /// Prompt tokens the primary pick likely has cached (`None` without a prefix-cache scorer),
    /// for a prefill/decode decider.
    pub primary_cached_tokens: Option<u64>,
    /// Prompt bytes the primary pick is expected to prefill: the prompt less the share of its
    /// blocks the prefix index says the primary holds (the whole prompt without a
    /// prefix-cache scorer).
    pub primary_prefill_bytes: u64,
}

/// What this proxy has in flight to one endpoint (counted by every worker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Requests routed there that have not finished.
    pub requests: u64,
    /// The prompt bytes of those requests that the endpoint still has to prefill: each one's
    /// [`Decision::primary_prefill_bytes`], from its decision until its first response byte.
    pub prefill_bytes: u64,
}

/// One scorer's clamped scores per candidate: shared with the snapshot's cache for a scorer
/// that reads only metrics, this request's own otherwise (neither is copied per request).
#[derive(Debug, Clone, PartialEq)]
pub enum Scores {
    /// From [`fixed_scores`].
    Fixed(Arc<[f64]>),
    /// Computed for this request.
    Request(Vec<f64>),
}

impl std::ops::Deref for Scores {
    type Target = [f64];

    fn deref(&self) -> &[f64] {
        match self {
            Scores::Fixed(scores) => scores,
            Scores::Request(scores) => scores,
        }
    }
}

/// Inputs every scorer may read: the candidates and what producers computed for the request.
pub struct ScoringInput<'a> {
    /// Candidate endpoints.
    pub endpoints: &'a [&'a Endpoint],
    /// The request.
    pub request: &'a Request<'a>,
    /// Prefix-cache match per candidate, when a prefix scorer is configured.
    pub prefix: Option<&'a PrefixMatch>,
    /// What this proxy has in flight per candidate (shared by all workers; empty when no
    /// scorer reads it).
    pub in_flight: &'a [InFlight],
}

/// Schedules one request over `endpoints` with `profile`, then records the decision in the
/// prefix index. `in_flight` holds what this proxy has in flight per endpoint
/// (or is empty). `cache` keeps the scores that depend only on the endpoints' metrics; it
/// belongs to the snapshot `profile` and `endpoints` come from.
#[allow(clippy::too_many_arguments)]
pub fn schedule(
    profile: &Profile,
    cache: &ScoringCache,
    endpoints: &[&Endpoint],
    in_flight: &[InFlight],
    request: &Request<'_>,
    prefix_index: &mut PrefixIndex,
    rng: &mut Rng,
    timer: &mut PhaseTimer,
) -> Result<Decision, InferenceError> {
    if endpoints.is_empty() {
        return Err(InferenceError::NoEndpoints(
            "failed to find endpoint candidates for serving the request".to_string(),
        ));
    }
    let mut candidates: Vec<usize> = (0..endpoints.len()).collect();
    for filter in &profile.filters {
        candidates = filters::apply(filter, endpoints, candidates, request);
        if candidates.is_empty() {
            return Err(InferenceError::FilteredOut);
        }
    }
    // Without narrowing (the common case) the candidates are the endpoints themselves: no copy.
    let chosen_buf: Vec<&Endpoint>;
    let counts_buf: Vec<InFlight>;
    let (chosen, counts) = if candidates.len() == endpoints.len() {
        (endpoints, in_flight)
    } else {
        chosen_buf = candidates
            .iter()
            .filter_map(|&i| endpoints.get(i).copied())
            .collect();
        counts_buf = candidates
            .iter()
            .map(|&i| in_flight.get(i).copied().unwrap_or_default())
            .collect();
        (&chosen_buf[..], &counts_buf[..])
    };
    let without_prefix = ScoringInput {
        endpoints: chosen,
        request,
        prefix: None,
        in_flight: counts,
    };
    let fixed = cache.fixed_scores(profile, &candidates, &without_prefix);
    let prefix = profile.scorers.iter().find_map(|s| match &s.scorer {
        ScorerSpec::PrefixCache(params) => {
            timer.mark(Phase::Score);
            Some(prefix::produce(
                params,
                chosen,
                &fixed.keys,
                request,
                prefix_index,
                timer,
            ))
        }
        _ => None,
    });
    let input = ScoringInput {
        prefix: prefix.as_ref(),
        ..without_prefix
    };
    let mut totals = fixed.totals.clone();
    let mut scores = Vec::with_capacity(profile.scorers.len());
    for (weighted, fixed) in profile.scorers.iter().zip(&fixed.scores) {
        scores.push(match fixed {
            Some(fixed) => Scores::Fixed(Arc::clone(fixed)),
            None => Scores::Request(weigh_into(&mut totals, weighted, &input)),
        });
    }
    let picked: Vec<usize> = pickers::pick(&profile.picker, &totals, rng)
        .into_iter()
        .filter_map(|i| candidates.get(i).copied())
        .collect();
    timer.mark(Phase::Score);
    let position = picked
        .first()
        .and_then(|p| candidates.iter().position(|c| c == p));
    let primary_blocks = prefix.as_ref().map(|prefix| {
        let blocks = position.and_then(|i| prefix.matched_blocks.get(i).copied());
        (blocks.unwrap_or(0), prefix.blocks.total)
    });
    let primary_cached_tokens = prefix
        .as_ref()
        .zip(primary_blocks)
        .map(|(prefix, (blocks, _))| {
            u64::try_from(blocks).unwrap_or(u64::MAX) * prefix.block_size_tokens
        });
    let primary_prefill_bytes = uncached_bytes(request.prompt.len(), primary_blocks);
    if let (Some(prefix), Some(endpoint)) =
        (&prefix, picked.first().and_then(|&i| endpoints.get(i)))
    {
        prefix_index.record(
            endpoint.index_key(),
            &prefix.blocks.hashes,
            request.now_unix_ms,
        );
        timer.mark(Phase::Record);
    }
    Ok(Decision {
        picked,
        candidates,
        totals,
        scores,
        primary_cached_tokens,
        primary_prefill_bytes,
    })
}

/// A measured mean from the snapshot (0 while the controller has none).
pub(crate) fn measured(value: f64) -> Option<f64> {
    (value.is_finite() && value > 0.0).then_some(value)
}

/// The mean of the candidates' measured values (those they have).
#[derive(Default)]
pub(crate) struct Mean {
    sum: f64,
    count: u32,
}

impl Mean {
    /// Counts `value` if it is [`measured`].
    pub(crate) fn add(&mut self, value: f64) {
        if let Some(value) = measured(value) {
            self.sum += value;
            self.count += 1;
        }
    }

    /// The mean of the values counted, if any.
    pub(crate) fn get(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
}

/// The bytes of a `prompt_len`-byte prompt left to prefill where `(matched, total)` of its
/// blocks are cached: the prompt less the matched share (all of it without a match).
pub fn uncached_bytes(prompt_len: usize, blocks: Option<(usize, usize)>) -> u64 {
    let share = blocks
        .filter(|&(_, total)| total > 0)
        .map_or(0.0, |(matched, total)| {
            (matched as f64 / total as f64).min(1.0)
        });
    (prompt_len as f64 * (1.0 - share)).round() as u64
}

/// Scores every candidate with `weighted`'s scorer, clamps the scores and adds them, weighted,
/// to `totals`; returns the clamped scores.
fn weigh_into(totals: &mut [f64], weighted: &WeightedScorer, input: &ScoringInput<'_>) -> Vec<f64> {
    let mut scores = scorers::score(&weighted.scorer, input);
    for (total, score) in totals.iter_mut().zip(&mut scores) {
        *score = clamp_score(*score);
        *total += weighted.weight * *score;
    }
    scores
}

/// Scores are clamped to [0, 1] before weighting; NaN counts as 0.
fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::{Request, ScoringInput};
    use crate::snapshot::{Endpoint, Metrics};

    /// Scoring input over `endpoints` with no producer data and nothing in flight.
    pub fn input<'a>(endpoints: &'a [&'a Endpoint], request: &'a Request<'a>) -> ScoringInput<'a> {
        ScoringInput {
            endpoints,
            request,
            prefix: None,
            in_flight: &[],
        }
    }

    /// The endpoints' prefix-index keys, in order.
    pub fn keys_of(endpoints: &[&Endpoint]) -> Vec<u64> {
        endpoints.iter().map(|e| e.index_key()).collect()
    }

    /// An endpoint on 10.0.0.`i`:8000 with the given waiting queue and KV usage.
    pub fn endpoint(i: u8, waiting: u64, kv: f64) -> Endpoint {
        Endpoint {
            name: format!("pod-{i}"),
            address: format!("10.0.0.{i}"),
            port: 8000,
            ready: true,
            key_cache: Default::default(),
            labels: Default::default(),
            metrics: Metrics {
                waiting_queue_size: waiting,
                kv_cache_usage: kv,
                ..Metrics::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix::PrefixIndex;
    use super::profile::{PickerSpec, WeightedScorer};
    use super::test_support::endpoint;
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn run(
        profile: &Profile,
        endpoints: &[Endpoint],
        request: &Request<'_>,
        store: &mut PrefixIndex,
    ) -> Decision {
        let refs: Vec<&Endpoint> = endpoints.iter().collect();
        schedule(
            profile,
            &ScoringCache::default(),
            &refs,
            &[],
            request,
            store,
            &mut Rng::new(7),
            &mut PhaseTimer::off(),
        )
        .unwrap()
    }

    #[test]
    fn empty_pool_is_no_endpoints() {
        let err = schedule(
            &Profile::default(),
            &ScoringCache::default(),
            &[],
            &[],
            &Request::default(),
            &mut PrefixIndex::new(64),
            &mut Rng::new(1),
            &mut PhaseTimer::off(),
        )
        .unwrap_err();
        assert_eq!(err.dropped_reason(), Some("rejected-no-endpoints"));
    }

    #[test]
    fn default_profile_prefers_short_queue_and_free_kv() {
        let endpoints = [
            endpoint(1, 10, 0.9),
            endpoint(2, 0, 0.1),
            endpoint(3, 5, 0.5),
        ];
        let d = run(
            &Profile::default(),
            &endpoints,
            &Request::default(),
            &mut PrefixIndex::new(64),
        );
        assert_eq!(d.picked, vec![1]);
        // queue: 0, 1, 0.5 (×2); kv: 0.1, 0.9, 0.5 (×2); no prompt → prefix 0.
        let expected = [0.2, 3.8, 2.0];
        for (t, e) in d.totals.iter().zip(expected) {
            assert!((t - e).abs() < 1e-9, "{t} vs {e}");
        }
    }

    #[test]
    fn weights_are_applied_and_not_normalised() {
        let profile = Profile {
            name: "p".into(),
            scorers: vec![WeightedScorer {
                name: "kv".into(),
                weight: 5.0,
                scorer: ScorerSpec::KvCacheUtilization,
            }],
            picker: PickerSpec::MaxScore {
                max_num_of_endpoints: 2,
            },
            ..Profile::default()
        };
        let endpoints = [
            endpoint(1, 0, 0.6),
            endpoint(2, 0, 0.2),
            endpoint(3, 0, 0.4),
        ];
        let d = run(
            &profile,
            &endpoints,
            &Request::default(),
            &mut PrefixIndex::new(64),
        );
        assert_eq!(d.picked, vec![1, 2]);
        assert!((d.totals[1] - 4.0).abs() < 1e-9);
    }

    #[test]
    fn shared_prompt_sticks_to_the_endpoint_that_served_it() {
        let endpoints = [
            endpoint(1, 0, 0.0),
            endpoint(2, 0, 0.0),
            endpoint(3, 0, 0.0),
        ];
        let prompt = vec![b'x'; 4096];
        let request = Request {
            model: "m",
            prompt: &prompt,
            ..Request::default()
        };
        let mut store = PrefixIndex::new(64);
        let first = run(&Profile::default(), &endpoints, &request, &mut store);
        // Nothing was cached: the pick prefills the whole prompt.
        assert_eq!(first.primary_prefill_bytes, 4096);
        let first = first.picked;
        let refs: Vec<&Endpoint> = endpoints.iter().collect();
        for seed in 0..20 {
            let d = schedule(
                &Profile::default(),
                &ScoringCache::default(),
                &refs,
                &[],
                &request,
                &mut store,
                &mut Rng::new(seed),
                &mut PhaseTimer::off(),
            )
            .unwrap();
            assert_eq!(d.picked, first);
            // It holds every block now: nothing is left to prefill.
            assert_eq!(d.primary_prefill_bytes, 0);
        }
    }

    #[test]
    fn uncached_bytes_are_the_unmatched_share_of_the_prompt() {
        assert_eq!(uncached_bytes(1000, None), 1000);
        assert_eq!(uncached_bytes(1000, Some((0, 0))), 1000);
        assert_eq!(uncached_bytes(1000, Some((1, 4))), 750);
        assert_eq!(uncached_bytes(1000, Some((4, 4))), 0);
        assert_eq!(uncached_bytes(1000, Some((9, 4))), 0);
    }
}
