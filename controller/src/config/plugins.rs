//! The plugin types wasm-epp understands, built from `plugins[i]` entries of the config.

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};
use wasm_epp::scheduler::profile::{
    ActiveRequestParams, PickerSpec, PrefixCacheParams, ScorerSpec,
};

use crate::discovery::file::FileSource;

/// A built plugin instance.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plugin {
    /// A scorer. A `prefix-cache-scorer` may name its producer (`prefixMatchInfoProducerName`).
    Scorer {
        spec: ScorerSpec,
        producer: Option<String>,
    },
    /// `approx-prefix-cache-producer`: its parameters, completed with the defaults.
    PrefixProducer(PrefixCacheParams),
    /// A picker.
    Picker(PickerSpec),
    /// `file-discovery`.
    Discovery(FileSource),
    /// A plugin whose behaviour wasm-epp has built in; configuring it changes nothing.
    Inherent(Role),
}

/// What an inherent plugin is, for checking the references to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `metrics-data-source`.
    DataSource,
    /// `core-metrics-extractor`.
    Extractor,
    /// `single-profile-handler`.
    ProfileHandler,
    /// `token-producer`.
    DataProducer,
    /// `openai-parser`, `passthrough-parser`.
    Parser,
    /// `utilization-detector`.
    SaturationDetector,
}

/// Valid upstream plugin types wasm-epp does not implement yet (named as such in errors).
const NOT_YET_SUPPORTED: &[&str] = &[
    // Scorers.
    "lora-affinity-scorer",
    "running-requests-size-scorer",
    "load-aware-scorer",
    "token-load-scorer",
    "no-hit-lru-scorer",
    "context-length-aware",
    "session-affinity-scorer",
    "header-label-affinity-scorer",
    "endpoint-attribute-scorer",
    "latency-scorer",
    "mm-embeddings-cache-scorer",
    "topology-affinity-scorer",
    "precise-prefix-cache-scorer",
    // Filters.
    "decode-filter",
    "prefill-filter",
    "encode-filter",
    "label-selector-filter",
    "by-label-selector",
    "by-label",
    "prefix-cache-affinity-filter",
    "utilization-filter",
    "endpoint-attribute-filter",
    "session-affinity-filter",
    "slo-headroom-tier-filter",
    "topology-affinity-filter",
    "concurrency-detector",
    "header-based-testing-filter",
    // Pickers.
    "weighted-random-picker",
    // Profile handlers and deciders.
    "disagg-profile-handler",
    "prefix-based-pd-decider",
    "always-disagg-pd-decider",
    "always-disagg-multimodal-decider",
    "header-profile-handler",
    "data-parallel-profile-handler",
    "pd-profile-handler",
    "disagg-headers-handler",
    "prefill-header-handler",
    // Producers, admitters and other request-control plugins.
    "precise-prefix-cache-producer",
    "burst-prefix-cache-producer",
    "p2p-source-producer",
    "inflight-load-producer",
    "session-id-producer",
    "mm-embeddings-cache-producer",
    "predicted-latency-producer",
    "agent-identity",
    "latency-slo-admitter",
    "probabilistic-admitter",
    "disaggregatedset-rollout-screener",
    "request-attribute-reporter",
    "destination-endpoint-served-verifier",
    // Parsers.
    "anthropic-parser",
    "vllmhttp-parser",
    "sglanghttp-parser",
    "vllmgrpc-parser",
    "vertexai-parser",
    // Data layer.
    "models-data-source",
    "models-data-extractor",
    "multicluster-file-discovery",
    // Flow control.
    "fcfs-ordering-policy",
    "edf-ordering-policy",
    "slo-deadline-ordering-policy",
    "global-strict-fairness-policy",
    "round-robin-fairness-policy",
    "program-aware-fairness",
    "static-usage-limit-policy",
    "priority-holdback-policy",
    "soft-reflective-ceiling",
    "eviction-sheddable-filter",
    "eviction-priority-then-time-ordering",
];

/// Builds the plugin of type `plugin_type` from its `parameters`. `at` is the entry's path,
/// e.g. `plugins[2]`; errors name the field (`plugins[2].type`, `plugins[2].parameters.x`).
/// Parameters given to an inherent plugin are ignored, with a note in `warnings`.
pub(crate) fn build(
    at: &str,
    plugin_type: &str,
    parameters: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<Plugin, String> {
    let params_at = format!("{at}.parameters");
    let params = |allowed: &[&str], unsupported: &[&str]| {
        Params::new(&params_at, plugin_type, parameters, allowed, unsupported)
    };
    let mut inherent = |role| {
        if parameters.is_some_and(|p| !is_empty(p)) {
            warnings.push(format!(
                "{params_at}: ignored; wasm-epp has no settings for {plugin_type:?}"
            ));
        }
        Ok(Plugin::Inherent(role))
    };
    match plugin_type {
        "queue-scorer" => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::Queue))
        }
        "kv-cache-utilization-scorer" => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::KvCacheUtilization))
        }
        "prefix-cache-scorer" => prefix_scorer(&params(
            &[
                "matchLengthWeight",
                "matchLengthScaleTokens",
                "prefixMatchInfoProducerName",
            ],
            &[],
        )?),
        "active-request-scorer" => {
            active_request_scorer(&params(&["idleThreshold", "maxBusyScore"], &[])?)
        }
        "approx-prefix-cache-producer" => prefix_producer(&params(
            &[
                "autoTune",
                "blockSizeTokens",
                "maxPrefixTokensToMatch",
                "lruCapacityPerServer",
            ],
            &["maxPrefixBlocksToMatch", "blockSize"],
        )?),
        "max-score-picker" => Ok(Plugin::Picker(PickerSpec::MaxScore {
            max_num_of_endpoints: max_endpoints(&params(&["maxNumOfEndpoints"], &[])?)?,
        })),
        "random-picker" => Ok(Plugin::Picker(PickerSpec::Random {
            max_num_of_endpoints: max_endpoints(&params(&["maxNumOfEndpoints"], &[])?)?,
        })),
        "file-discovery" => file_discovery(&params(&["path", "watchFile"], &[])?),
        "metrics-data-source" => inherent(Role::DataSource),
        "core-metrics-extractor" => inherent(Role::Extractor),
        "single-profile-handler" => inherent(Role::ProfileHandler),
        "token-producer" => inherent(Role::DataProducer),
        "openai-parser" | "passthrough-parser" => inherent(Role::Parser),
        "utilization-detector" => inherent(Role::SaturationDetector),
        "" => Err(format!("{at}.type: must not be empty")),
        other if NOT_YET_SUPPORTED.contains(&other) => Err(format!(
            "{at}.type: plugin type {other:?} is not supported by wasm-epp yet"
        )),
        other => Err(format!("{at}.type: unknown plugin type {other:?}")),
    }
}

fn scorer(spec: ScorerSpec) -> Plugin {
    Plugin::Scorer {
        spec,
        producer: None,
    }
}

fn prefix_scorer(params: &Params<'_>) -> Result<Plugin, String> {
    let mut prefix = PrefixCacheParams::default();
    if let Some(weight) = params.get::<f64>("matchLengthWeight")? {
        if !(0.0..=1.0).contains(&weight) {
            return Err(params.error("matchLengthWeight", "must be between 0 and 1"));
        }
        prefix.match_length_weight = weight;
    }
    if let Some(scale) = params.positive("matchLengthScaleTokens")? {
        prefix.match_length_scale_tokens = scale;
    }
    Ok(Plugin::Scorer {
        spec: ScorerSpec::PrefixCache(prefix),
        producer: params.get("prefixMatchInfoProducerName")?,
    })
}

fn active_request_scorer(params: &Params<'_>) -> Result<Plugin, String> {
    let mut active = ActiveRequestParams::default();
    if let Some(threshold) = params.get::<u64>("idleThreshold")? {
        active.idle_threshold = threshold;
    }
    if let Some(score) = params.get::<f64>("maxBusyScore")? {
        if !(0.0..=1.0).contains(&score) {
            return Err(params.error("maxBusyScore", "must be between 0 and 1"));
        }
        active.max_busy_score = score;
    }
    Ok(scorer(ScorerSpec::ActiveRequest(active)))
}

fn prefix_producer(params: &Params<'_>) -> Result<Plugin, String> {
    let mut prefix = PrefixCacheParams::default();
    if let Some(auto_tune) = params.get("autoTune")? {
        prefix.auto_tune = auto_tune;
    }
    if let Some(size) = params.positive("blockSizeTokens")? {
        prefix.block_size_tokens = size;
    }
    if let Some(tokens) = params.positive("maxPrefixTokensToMatch")? {
        prefix.max_prefix_tokens_to_match = tokens;
    }
    if let Some(capacity) = params.positive("lruCapacityPerServer")? {
        prefix.lru_capacity_per_server = capacity;
    }
    Ok(Plugin::PrefixProducer(prefix))
}

fn max_endpoints(params: &Params<'_>) -> Result<usize, String> {
    match params.positive("maxNumOfEndpoints")? {
        Some(n) => usize::try_from(n).map_err(|_| params.error("maxNumOfEndpoints", "too large")),
        None => Ok(1),
    }
}

fn file_discovery(params: &Params<'_>) -> Result<Plugin, String> {
    let path: String = params
        .get("path")?
        .ok_or_else(|| params.error("path", "required"))?;
    if path.trim().is_empty() {
        return Err(params.error("path", "must not be empty"));
    }
    Ok(Plugin::Discovery(FileSource {
        path: path.into(),
        watch: params.get("watchFile")?.unwrap_or(false),
    }))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Mapping(map) => map.is_empty(),
        _ => false,
    }
}

/// A plugin's `parameters` mapping, with the keys checked against the known ones.
struct Params<'v> {
    at: &'v str,
    map: Option<&'v Mapping>,
}

impl<'v> Params<'v> {
    /// Checks that `value` is a mapping whose keys are all in `allowed`; keys in `unsupported`
    /// are valid upstream but not implemented.
    fn new(
        at: &'v str,
        plugin_type: &str,
        value: Option<&'v Value>,
        allowed: &[&str],
        unsupported: &[&str],
    ) -> Result<Params<'v>, String> {
        let map = match value {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(map)) => Some(map),
            Some(_) => return Err(format!("{at}: must be a mapping")),
        };
        for key in map.into_iter().flat_map(Mapping::keys) {
            let Some(key) = key.as_str() else {
                return Err(format!("{at}: parameter names must be strings"));
            };
            if unsupported.contains(&key) {
                return Err(format!(
                    "{at}.{key}: parameter of {plugin_type:?} not supported by wasm-epp yet"
                ));
            }
            if !allowed.contains(&key) {
                let known = if allowed.is_empty() {
                    "it takes none".to_string()
                } else {
                    format!("known: {}", allowed.join(", "))
                };
                return Err(format!(
                    "{at}.{key}: unknown parameter of {plugin_type:?} ({known})"
                ));
            }
        }
        Ok(Params { at, map })
    }

    /// The parameter `key`, decoded as `T`.
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        self.map
            .and_then(|map| map.get(key))
            .filter(|value| !value.is_null())
            .map(|value| {
                serde_yaml::from_value(value.clone()).map_err(|e| self.error(key, &e.to_string()))
            })
            .transpose()
    }

    /// The parameter `key` as an integer of at least 1.
    fn positive(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get::<u64>(key)? {
            Some(0) => Err(self.error(key, "must be at least 1")),
            other => Ok(other),
        }
    }

    fn error(&self, key: &str, message: &str) -> String {
        format!("{}.{key}: {message}", self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_yaml(plugin_type: &str, parameters: &str) -> Result<Plugin, String> {
        let value: Value = serde_yaml::from_str(parameters).unwrap();
        build("plugins[0]", plugin_type, Some(&value), &mut Vec::new())
    }

    #[test]
    fn builds_scorers_and_pickers_with_parameters() {
        assert_eq!(
            build_yaml("random-picker", "maxNumOfEndpoints: 3").unwrap(),
            Plugin::Picker(PickerSpec::Random {
                max_num_of_endpoints: 3
            })
        );
        let Plugin::Scorer {
            spec: ScorerSpec::PrefixCache(params),
            producer,
        } = build_yaml(
            "prefix-cache-scorer",
            "{matchLengthWeight: 0.5, matchLengthScaleTokens: 512, prefixMatchInfoProducerName: p}",
        )
        .unwrap()
        else {
            panic!("not a prefix scorer");
        };
        assert_eq!(params.match_length_weight, 0.5);
        assert_eq!(params.match_length_scale_tokens, 512);
        assert_eq!(producer.as_deref(), Some("p"));
    }

    #[test]
    fn parameter_errors_name_the_parameter() {
        for (plugin_type, parameters, expected) in [
            ("queue-scorer", "{foo: 1}", "plugins[0].parameters.foo: unknown parameter"),
            ("max-score-picker", "{maxNumOfEndpoints: 0}", "plugins[0].parameters.maxNumOfEndpoints: must be at least 1"),
            ("max-score-picker", "{maxNumOfEndpoints: many}", "plugins[0].parameters.maxNumOfEndpoints: invalid type"),
            ("prefix-cache-scorer", "{matchLengthWeight: 2}", "plugins[0].parameters.matchLengthWeight: must be between 0 and 1"),
            ("approx-prefix-cache-producer", "{maxPrefixBlocksToMatch: 4}", "plugins[0].parameters.maxPrefixBlocksToMatch: parameter of \"approx-prefix-cache-producer\" not supported"),
            ("approx-prefix-cache-producer", "{autoTune: maybe}", "plugins[0].parameters.autoTune:"),
            ("file-discovery", "{watchFile: true}", "plugins[0].parameters.path: required"),
            ("file-discovery", "[a]", "plugins[0].parameters: must be a mapping"),
        ] {
            let err = build_yaml(plugin_type, parameters).unwrap_err();
            assert!(err.starts_with(expected), "{plugin_type} {parameters}: {err}");
        }
    }

    #[test]
    fn unknown_and_unsupported_types_are_told_apart() {
        let err = build_yaml("lora-affinity-scorer", "{}").unwrap_err();
        assert_eq!(
            err,
            "plugins[0].type: plugin type \"lora-affinity-scorer\" is not supported by wasm-epp yet"
        );
        let err = build_yaml("bar", "{}").unwrap_err();
        assert_eq!(err, "plugins[0].type: unknown plugin type \"bar\"");
    }

    #[test]
    fn inherent_plugins_ignore_parameters_with_a_warning() {
        let value: Value = serde_yaml::from_str("{path: /custom}").unwrap();
        let mut warnings = Vec::new();
        let plugin = build(
            "plugins[4]",
            "metrics-data-source",
            Some(&value),
            &mut warnings,
        );
        assert_eq!(plugin, Ok(Plugin::Inherent(Role::DataSource)));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("plugins[4].parameters: ignored"));
    }
}
