//! The compiled scheduling profile: which filters, weighted scorers and picker run.
//!
//! The controller compiles an upstream `EndpointPickerConfig` into this form; it travels in the
//! snapshot, so a configuration change reaches Envoy without a restart. Plugin `type` names and
//! parameter names are the upstream ones; each plugin's module holds its `type` as `TYPE`
//! (serde's `rename` below needs the literal, and a test checks that the two agree).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::disaggregation::Disaggregation;
use super::filters::concurrency_detector::ConcurrencyParams;
use super::filters::{decode_filter, label_selector_filter, prefill_filter, utilization_detector};
use super::pickers::{max_score_picker, random_picker, weighted_random_picker};
use super::scorers::{
    active_request_scorer, expected_delay_scorer, kv_cache_utilization_scorer, load_aware_scorer,
    lora_affinity_scorer, prefix_cache_scorer, queue_scorer, running_requests_size_scorer,
    session_affinity_scorer,
};
use crate::flow_control::FlowControl;

/// One scheduling profile: filters in order, then the weighted sum of scorers, then one picker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Profile name from the config (`default` when the config names none).
    pub name: String,
    /// Filters, applied in order; each sees the previous one's output.
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
    /// Scorers with their weights; an endpoint's total is the sum of weight × clamped score.
    pub scorers: Vec<WeightedScorer>,
    /// The picker that turns totals into a destination.
    pub picker: PickerSpec,
    /// The saturation detector used by admission (sheddable requests are rejected when the
    /// pool is saturated); upstream's default `utilization-detector`.
    #[serde(default)]
    pub saturation_detector: UtilizationParams,
    /// When the configured saturation detector is a `concurrency-detector`: the pool's
    /// saturation comes from this proxy's requests in flight instead of
    /// [`saturation_detector`](Self::saturation_detector)'s metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_detector: Option<ConcurrencyParams>,
    /// The prefill stage, when this is the decode profile of a `disagg-profile-handler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation: Option<Box<Disaggregation>>,
    /// Flow control, when the `flowControl` feature gate is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowControl>,
}

/// Filter plugins by upstream config `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum FilterSpec {
    /// `label-selector-filter`: keeps endpoints whose labels match a Kubernetes label selector.
    #[serde(rename = "label-selector-filter")]
    LabelSelector(LabelSelector),
    /// `utilization-detector` used as a filter: keeps endpoints with fresh metrics under the
    /// thresholds; keeps all when that would leave none.
    #[serde(rename = "utilization-detector")]
    UtilizationDetector(UtilizationParams),
    /// `decode-filter`: keeps endpoints whose `llm-d.ai/role` can decode, or without the label.
    #[serde(rename = "decode-filter")]
    Decode,
    /// `prefill-filter`: keeps endpoints whose `llm-d.ai/role` can prefill.
    #[serde(rename = "prefill-filter")]
    Prefill,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, all ANDed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: LabelSelectorOperator,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Label selector operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelSelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// Parameters of the upstream `utilization-detector` (roofline saturation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UtilizationParams {
    /// Waiting requests at which an endpoint counts as saturated.
    pub queue_depth_threshold: f64,
    /// KV-cache usage (0..1) at which an endpoint counts as saturated.
    pub kv_cache_util_threshold: f64,
    /// Metrics older than this (milliseconds) count as saturated.
    pub metrics_staleness_threshold_ms: u64,
    /// Extra room over the thresholds when used as a filter (0.2 = 20 % more).
    pub headroom: f64,
}

impl Default for UtilizationParams {
    fn default() -> Self {
        UtilizationParams {
            queue_depth_threshold: 5.0,
            kv_cache_util_threshold: 0.8,
            metrics_staleness_threshold_ms: 200,
            headroom: 0.0,
        }
    }
}

/// A scorer plugin instance with its profile weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightedScorer {
    /// The plugin instance name (defaults to its type).
    pub name: String,
    /// Weight from the profile's `pluginRef` entry (upstream default 1).
    pub weight: f64,
    /// Which scorer, with its parameters.
    pub scorer: ScorerSpec,
}

/// Scorer plugins by upstream config `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ScorerSpec {
    /// `queue-scorer`: min-max normalised waiting queue, all equal → 1.
    #[serde(rename = "queue-scorer")]
    Queue,
    /// `kv-cache-utilization-scorer`: 1 − KV-cache usage.
    #[serde(rename = "kv-cache-utilization-scorer")]
    KvCacheUtilization,
    /// `prefix-cache-scorer`: share of the prompt's blocks an endpoint likely has cached.
    #[serde(rename = "prefix-cache-scorer")]
    PrefixCache(PrefixCacheParams),
    /// `active-request-scorer`: fewer requests in flight from this proxy scores higher.
    #[serde(rename = "active-request-scorer")]
    ActiveRequest(ActiveRequestParams),
    /// `lora-affinity-scorer`: 1.0 adapter active, 0.8 room to load it, 0.6 waiting, else 0.
    #[serde(rename = "lora-affinity-scorer")]
    LoraAffinity,
    /// `running-requests-size-scorer`: min-max over running requests, all equal → 1.
    #[serde(rename = "running-requests-size-scorer")]
    RunningRequestsSize,
    /// `load-aware-scorer`: 0.5 for an empty queue, falling linearly to 0 at `threshold`.
    #[serde(rename = "load-aware-scorer")]
    LoadAware(LoadAwareParams),
    /// `session-affinity-scorer`: 1 for the endpoint the request's session is bound to (by its
    /// token, or by its session id), 0 for the others.
    #[serde(rename = "session-affinity-scorer")]
    SessionAffinity(SessionAffinityParams),
    /// `expected-delay-scorer` (ours): least expected time to first token, from each server's
    /// measured speed, its load against the batch limit and the prompt's uncached part.
    #[serde(rename = "expected-delay-scorer")]
    ExpectedDelay,
}

impl ScorerSpec {
    /// Whether the scorer reads this proxy's requests in flight per endpoint, which the
    /// director gathers for it (two in-memory map lookups per endpoint, no host call).
    pub fn reads_in_flight(&self) -> bool {
        matches!(
            self,
            ScorerSpec::ActiveRequest(_) | ScorerSpec::ExpectedDelay
        )
    }
}

/// Parameters of `session-affinity-scorer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SessionAffinityParams {
    /// How a request names its session.
    pub strategy: SessionStrategy,
    /// `session_id`: a binding not used for this long (milliseconds) is forgotten.
    pub eviction_ttl_ms: u64,
}

impl Default for SessionAffinityParams {
    fn default() -> Self {
        SessionAffinityParams {
            strategy: SessionStrategy::EncodedEndpointHeader,
            eviction_ttl_ms: 300_000,
        }
    }
}

/// The session-affinity strategies (upstream names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionStrategy {
    /// The client returns the token (base64 of the endpoint's name) the filter gave it.
    #[default]
    #[serde(rename = "encoded_endpoint_header")]
    EncodedEndpointHeader,
    /// The client names its session in `x-session-id`; the proxy keeps the binding.
    #[serde(rename = "session_id")]
    SessionId,
}

/// Parameters of `load-aware-scorer`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadAwareParams {
    /// Waiting queue length that scores 0.
    pub threshold: u64,
}

impl Default for LoadAwareParams {
    fn default() -> Self {
        LoadAwareParams { threshold: 128 }
    }
}

/// Parameters of `active-request-scorer` (upstream names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ActiveRequestParams {
    /// Endpoints with at most this many requests in flight score 1.
    pub idle_threshold: u64,
    /// The highest score a busy endpoint can get.
    pub max_busy_score: f64,
}

impl Default for ActiveRequestParams {
    fn default() -> Self {
        ActiveRequestParams {
            idle_threshold: 0,
            max_busy_score: 1.0,
        }
    }
}

/// Parameters of the approximate prefix-cache producer and scorer (upstream names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PrefixCacheParams {
    /// Weight of the absolute match length against the match ratio (0 → pure ratio).
    pub match_length_weight: f64,
    /// Match length, in tokens, that counts as a full-length match.
    pub match_length_scale_tokens: u64,
    /// Take the block size and LRU capacity from the servers' `cache_config_info` when reported.
    pub auto_tune: bool,
    /// Tokens per hashed block when no server reports one; the effective size is at least 64.
    pub block_size_tokens: u64,
    /// Longest prefix, in tokens, that is hashed and matched.
    pub max_prefix_tokens_to_match: u64,
}

impl Default for PrefixCacheParams {
    fn default() -> Self {
        PrefixCacheParams {
            match_length_weight: 0.0,
            match_length_scale_tokens: 8192,
            auto_tune: true,
            block_size_tokens: 16,
            max_prefix_tokens_to_match: 131_072,
        }
    }
}

/// Picker plugins by upstream config `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum PickerSpec {
    /// `max-score-picker`: highest total, random tie-break; more than one endpoint becomes a
    /// comma-separated fallback list.
    #[serde(rename = "max-score-picker", rename_all = "camelCase")]
    MaxScore {
        /// How many endpoints to return, best first.
        #[serde(default = "one")]
        max_num_of_endpoints: usize,
    },
    /// `weighted-random-picker`: random with probability growing with the score (A-Res
    /// reservoir sampling, key = U^(1/score)); all scores ≤ 0 → uniform.
    #[serde(rename = "weighted-random-picker", rename_all = "camelCase")]
    WeightedRandom {
        /// How many endpoints to return.
        #[serde(default = "one")]
        max_num_of_endpoints: usize,
    },
    /// `random-picker`: uniformly random among the candidates.
    #[serde(rename = "random-picker", rename_all = "camelCase")]
    Random {
        /// How many endpoints to return.
        #[serde(default = "one")]
        max_num_of_endpoints: usize,
    },
}

fn one() -> usize {
    1
}

impl Default for Profile {
    /// The upstream default profile: queue 2, kv-cache 2, prefix 3, max-score picker.
    fn default() -> Self {
        Profile {
            name: "default".to_string(),
            filters: Vec::new(),
            scorers: vec![
                WeightedScorer {
                    name: queue_scorer::TYPE.to_string(),
                    weight: 2.0,
                    scorer: ScorerSpec::Queue,
                },
                WeightedScorer {
                    name: kv_cache_utilization_scorer::TYPE.to_string(),
                    weight: 2.0,
                    scorer: ScorerSpec::KvCacheUtilization,
                },
                WeightedScorer {
                    name: prefix_cache_scorer::TYPE.to_string(),
                    weight: 3.0,
                    scorer: ScorerSpec::PrefixCache(PrefixCacheParams::default()),
                },
            ],
            picker: PickerSpec::MaxScore {
                max_num_of_endpoints: 1,
            },
            saturation_detector: UtilizationParams::default(),
            concurrency_detector: None,
            disaggregation: None,
            flow_control: None,
        }
    }
}

impl ScorerSpec {
    /// The config `type`: the plugin module's `TYPE` (a new variant does not compile until it
    /// names its module here).
    pub fn type_name(&self) -> &'static str {
        match self {
            ScorerSpec::Queue => queue_scorer::TYPE,
            ScorerSpec::KvCacheUtilization => kv_cache_utilization_scorer::TYPE,
            ScorerSpec::PrefixCache(_) => prefix_cache_scorer::TYPE,
            ScorerSpec::ActiveRequest(_) => active_request_scorer::TYPE,
            ScorerSpec::LoraAffinity => lora_affinity_scorer::TYPE,
            ScorerSpec::RunningRequestsSize => running_requests_size_scorer::TYPE,
            ScorerSpec::LoadAware(_) => load_aware_scorer::TYPE,
            ScorerSpec::SessionAffinity(_) => session_affinity_scorer::TYPE,
            ScorerSpec::ExpectedDelay => expected_delay_scorer::TYPE,
        }
    }
}

impl PickerSpec {
    /// The config `type`: the plugin module's `TYPE`.
    pub fn type_name(&self) -> &'static str {
        match self {
            PickerSpec::MaxScore { .. } => max_score_picker::TYPE,
            PickerSpec::WeightedRandom { .. } => weighted_random_picker::TYPE,
            PickerSpec::Random { .. } => random_picker::TYPE,
        }
    }
}

impl FilterSpec {
    /// The config `type`: the plugin module's `TYPE`.
    pub fn type_name(&self) -> &'static str {
        match self {
            FilterSpec::LabelSelector(_) => label_selector_filter::TYPE,
            FilterSpec::UtilizationDetector(_) => utilization_detector::TYPE,
            FilterSpec::Decode => decode_filter::TYPE,
            FilterSpec::Prefill => prefill_filter::TYPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The `type` tag `value` serialises with.
    fn tag(value: &impl Serialize) -> String {
        let json = serde_json::to_value(value).unwrap();
        json["type"].as_str().unwrap().to_string()
    }

    #[test]
    fn every_variant_is_tagged_with_its_modules_type() {
        let scorers = [
            ScorerSpec::Queue,
            ScorerSpec::KvCacheUtilization,
            ScorerSpec::PrefixCache(PrefixCacheParams::default()),
            ScorerSpec::ActiveRequest(ActiveRequestParams::default()),
            ScorerSpec::LoraAffinity,
            ScorerSpec::RunningRequestsSize,
            ScorerSpec::LoadAware(LoadAwareParams::default()),
            ScorerSpec::SessionAffinity(SessionAffinityParams::default()),
            ScorerSpec::ExpectedDelay,
        ];
        for spec in &scorers {
            assert_eq!(tag(spec), spec.type_name(), "{spec:?}");
        }
        let pickers = [
            PickerSpec::MaxScore {
                max_num_of_endpoints: 1,
            },
            PickerSpec::WeightedRandom {
                max_num_of_endpoints: 1,
            },
            PickerSpec::Random {
                max_num_of_endpoints: 1,
            },
        ];
        for spec in &pickers {
            assert_eq!(tag(spec), spec.type_name(), "{spec:?}");
        }
        let filters = [
            FilterSpec::LabelSelector(LabelSelector::default()),
            FilterSpec::UtilizationDetector(UtilizationParams::default()),
            FilterSpec::Decode,
            FilterSpec::Prefill,
        ];
        for spec in &filters {
            assert_eq!(tag(spec), spec.type_name(), "{spec:?}");
        }
    }
}
