//! The compiled scheduling profile: which filters, weighted scorers and picker run.
//!
//! The controller compiles an upstream `EndpointPickerConfig` into this form; it travels in the
//! snapshot, so a configuration change reaches Envoy without a restart. Plugin `type` names and
//! parameter names are the upstream ones.

use serde::{Deserialize, Serialize};

/// One scheduling profile: the weighted sum of scorers, then one picker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name from the config (`default` when the config names none).
    pub name: String,
    /// Scorers with their weights; an endpoint's total is the sum of weight × clamped score.
    pub scorers: Vec<WeightedScorer>,
    /// The picker that turns totals into a destination.
    pub picker: PickerSpec,
}

/// A scorer plugin instance with its profile weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(tag = "type", deny_unknown_fields)]
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
}

/// Parameters of `active-request-scorer` (upstream names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
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
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
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
    /// Blocks remembered per endpoint (least recently used evicted first).
    pub lru_capacity_per_server: u64,
}

impl Default for PrefixCacheParams {
    fn default() -> Self {
        PrefixCacheParams {
            match_length_weight: 0.0,
            match_length_scale_tokens: 8192,
            auto_tune: true,
            block_size_tokens: 16,
            max_prefix_tokens_to_match: 131_072,
            lru_capacity_per_server: 31_250,
        }
    }
}

/// Picker plugins by upstream config `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum PickerSpec {
    /// `max-score-picker`: highest total, random tie-break; more than one endpoint becomes a
    /// comma-separated fallback list.
    #[serde(rename = "max-score-picker", rename_all = "camelCase")]
    MaxScore {
        /// How many endpoints to return, best first.
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
            scorers: vec![
                WeightedScorer {
                    name: "queue-scorer".to_string(),
                    weight: 2.0,
                    scorer: ScorerSpec::Queue,
                },
                WeightedScorer {
                    name: "kv-cache-utilization-scorer".to_string(),
                    weight: 2.0,
                    scorer: ScorerSpec::KvCacheUtilization,
                },
                WeightedScorer {
                    name: "prefix-cache-scorer".to_string(),
                    weight: 3.0,
                    scorer: ScorerSpec::PrefixCache(PrefixCacheParams::default()),
                },
            ],
            picker: PickerSpec::MaxScore {
                max_num_of_endpoints: 1,
            },
        }
    }
}
