//! Scorer plugins, one file each, named like their upstream config `type`, which each holds as
//! `TYPE`. Each returns one raw score per candidate; the scheduler clamps and weights them.

pub mod active_request_scorer;
pub mod expected_delay_scorer;
pub mod kv_cache_utilization_scorer;
pub mod load_aware_scorer;
pub mod lora_affinity_scorer;
pub mod prefix_cache_scorer;
pub mod queue_scorer;
pub mod running_requests_size_scorer;
pub mod session_affinity_scorer;

use super::profile::ScorerSpec;
use super::ScoringInput;

/// Scores every candidate with the given scorer.
pub fn score(spec: &ScorerSpec, input: &ScoringInput<'_>) -> Vec<f64> {
    match spec {
        ScorerSpec::Queue => queue_scorer::score(input),
        ScorerSpec::KvCacheUtilization => kv_cache_utilization_scorer::score(input),
        ScorerSpec::PrefixCache(params) => prefix_cache_scorer::score(params, input),
        ScorerSpec::ActiveRequest(params) => active_request_scorer::score(params, input),
        ScorerSpec::LoraAffinity => lora_affinity_scorer::score(input),
        ScorerSpec::RunningRequestsSize => running_requests_size_scorer::score(input),
        ScorerSpec::LoadAware(params) => load_aware_scorer::score(params, input),
        ScorerSpec::ExpectedDelay => expected_delay_scorer::score(input),
        ScorerSpec::SessionAffinity(_) => session_affinity_scorer::score(input),
    }
}

/// Min-max normalisation where lower is better: `(max − v)/(max − min)`, all equal → 1.
pub(crate) fn lower_is_better(values: impl Iterator<Item = f64> + Clone) -> Vec<f64> {
    let (min, max) = values
        .clone()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if max <= min {
        return values.map(|_| 1.0).collect();
    }
    let per_unit = 1.0 / (max - min);
    values.map(|v| (max - v) * per_unit).collect()
}
