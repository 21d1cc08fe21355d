//! The plugin types wasm-epp understands, built from `plugins[i]` entries of the config.

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};
use wasm_epp::scheduler::disaggregation::{self as pd, Decider};
use wasm_epp::scheduler::profile::{
    ActiveRequestParams, FilterSpec, LoadAwareParams, PickerSpec, PrefixCacheParams, ScorerSpec,
    UtilizationParams,
};
use wasm_epp::scheduler::scorers::session_affinity_scorer::TOKEN_HEADER as SESSION_TOKEN_HEADER;
use wasm_epp::scheduler::{filters, pickers, prefix, scorers};

use super::disaggregation::{self, Handler};
use super::{selector, ConfigError};
use crate::discovery::file::FileSource;
use crate::duration::parse_duration;
use crate::engines::{EngineConfig, Engines};

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
    /// A filter.
    Filter(FilterSpec),
    /// `utilization-detector`: the saturation detector, which a profile may also use as a
    /// filter.
    Detector(UtilizationParams),
    /// `file-discovery`.
    Discovery(FileSource),
    /// `core-metrics-extractor`: the engines whose metric names it reads.
    Extractor(Engines),
    /// `disagg-profile-handler`.
    Disaggregation(Handler),
    /// A prefill/decode decider.
    Decider(Decider),
    /// A plugin whose behaviour wasm-epp has built in; configuring it changes nothing.
    Inherent(Role),
}

/// What an inherent plugin is, for checking the references to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `metrics-data-source`.
    DataSource,
    /// `single-profile-handler`.
    ProfileHandler,
    /// `token-producer`.
    DataProducer,
    /// `openai-parser`, `passthrough-parser`.
    Parser,
}

/// Valid upstream plugin types wasm-epp does not implement yet (named as such in errors).
const NOT_YET_SUPPORTED: &[&str] = &[
    // Scorers.
    "token-load-scorer",
    "no-hit-lru-scorer",
    "context-length-aware",
    "header-label-affinity-scorer",
    "endpoint-attribute-scorer",
    "latency-scorer",
    "mm-embeddings-cache-scorer",
    "topology-affinity-scorer",
    "precise-prefix-cache-scorer",
    // Filters.
    "encode-filter",
    "by-label",
    "prefix-cache-affinity-filter",
    "utilization-filter",
    "endpoint-attribute-filter",
    "session-affinity-filter",
    "slo-headroom-tier-filter",
    "topology-affinity-filter",
    "concurrency-detector",
    "header-based-testing-filter",
    // Profile handlers and deciders.
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
) -> Result<Plugin, ConfigError> {
    let params_at = format!("{at}.parameters");
    let params = |allowed: &[&str], unsupported: &[&str]| {
        Params::new(&params_at, plugin_type, parameters, allowed, unsupported)
    };
    let inherent = |role, warnings: &mut Vec<String>| {
        if parameters.is_some_and(|p| !is_empty(p)) {
            warnings.push(format!(
                "{params_at}: ignored; wasm-epp has no settings for {plugin_type:?}"
            ));
        }
        Ok(Plugin::Inherent(role))
    };
    match plugin_type {
        scorers::queue_scorer::TYPE => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::Queue))
        }
        scorers::kv_cache_utilization_scorer::TYPE => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::KvCacheUtilization))
        }
        scorers::prefix_cache_scorer::TYPE => prefix_scorer(&params(
            &[
                "matchLengthWeight",
                "matchLengthScaleTokens",
                "prefixMatchInfoProducerName",
            ],
            &[],
        )?),
        scorers::active_request_scorer::TYPE => {
            active_request_scorer(&params(&["idleThreshold", "maxBusyScore"], &[])?)
        }
        scorers::lora_affinity_scorer::TYPE => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::LoraAffinity))
        }
        scorers::running_requests_size_scorer::TYPE => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::RunningRequestsSize))
        }
        scorers::load_aware_scorer::TYPE => {
            let params = params(&["threshold"], &[])?;
            let mut load = LoadAwareParams::default();
            if let Some(threshold) = params.positive("threshold")? {
                load.threshold = threshold;
            }
            Ok(scorer(ScorerSpec::LoadAware(load)))
        }
        scorers::session_affinity_scorer::TYPE => session_affinity_scorer(&params(
            &["strategy", "headerName"],
            &[
                "profileName",
                "evictionTtlSeconds",
                "evictionSweepSeconds",
                "missThreshold",
                "algorithm",
            ],
        )?),
        prefix::TYPE => prefix_producer(
            &params(
                &[
                    "autoTune",
                    "blockSizeTokens",
                    "maxPrefixTokensToMatch",
                    "lruCapacityPerServer",
                ],
                &["maxPrefixBlocksToMatch", "blockSize"],
            )?,
            warnings,
        ),
        pickers::max_score_picker::TYPE => Ok(Plugin::Picker(PickerSpec::MaxScore {
            max_num_of_endpoints: max_endpoints(&params(&["maxNumOfEndpoints"], &[])?)?,
        })),
        pickers::random_picker::TYPE => Ok(Plugin::Picker(PickerSpec::Random {
            max_num_of_endpoints: max_endpoints(&params(&["maxNumOfEndpoints"], &[])?)?,
        })),
        pickers::weighted_random_picker::TYPE => Ok(Plugin::Picker(PickerSpec::WeightedRandom {
            max_num_of_endpoints: max_endpoints(&params(&["maxNumOfEndpoints"], &[])?)?,
        })),
        filters::label_selector_filter::TYPE | filters::label_selector_filter::OLD_TYPE => {
            Ok(Plugin::Filter(FilterSpec::LabelSelector(selector::parse(
                &params_at, parameters, warnings,
            )?)))
        }
        filters::decode_filter::TYPE => {
            params(&[], &[])?;
            Ok(Plugin::Filter(FilterSpec::Decode))
        }
        filters::prefill_filter::TYPE => {
            params(&[], &[])?;
            Ok(Plugin::Filter(FilterSpec::Prefill))
        }
        filters::utilization_detector::TYPE => utilization_detector(&params(
            &[
                "queueDepthThreshold",
                "kvCacheUtilThreshold",
                "metricsStalenessThreshold",
                "headroom",
            ],
            &["inFlightLoadProducerName"],
        )?),
        "file-discovery" => file_discovery(&params(&["path", "watchFile"], &[])?),
        "metrics-data-source" => inherent(Role::DataSource, warnings),
        "core-metrics-extractor" => metrics_extractor(&params(
            &["engineLabelKey", "defaultEngine", "engineConfigs"],
            &[],
        )?),
        "single-profile-handler" => inherent(Role::ProfileHandler, warnings),
        pd::TYPE => {
            disaggregation::handler(&params(disaggregation::HANDLER_PARAMETERS, &[])?, warnings)
        }
        pd::PREFIX_BASED_DECIDER_TYPE => disaggregation::prefix_based_decider(&params(
            &["nonCachedTokens", "promptTokens"],
            &[],
        )?),
        pd::ALWAYS_DECIDER_TYPE => {
            params(&[], &[])?;
            Ok(Plugin::Decider(Decider::Always))
        }
        "token-producer" => inherent(Role::DataProducer, warnings),
        "openai-parser" | "passthrough-parser" => inherent(Role::Parser, warnings),
        "" => Err(ConfigError::invalid(
            format!("{at}.type"),
            "must not be empty",
        )),
        other if NOT_YET_SUPPORTED.contains(&other) => Err(ConfigError::invalid(
            format!("{at}.type"),
            format!("plugin type {other:?} is not supported by wasm-epp yet"),
        )),
        other => Err(ConfigError::invalid(
            format!("{at}.type"),
            format!("unknown plugin type {other:?}"),
        )),
    }
}

fn scorer(spec: ScorerSpec) -> Plugin {
    Plugin::Scorer {
        spec,
        producer: None,
    }
}

fn prefix_scorer(params: &Params<'_>) -> Result<Plugin, ConfigError> {
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

fn active_request_scorer(params: &Params<'_>) -> Result<Plugin, ConfigError> {
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

fn session_affinity_scorer(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    match params.get::<String>("strategy")?.as_deref() {
        None | Some("encoded_endpoint_header") => {}
        Some(strategy @ ("session_id" | "session_id_header")) => {
            return Err(params.error(
                "strategy",
                format!(
                "{strategy:?} is not supported by wasm-epp yet (only \"encoded_endpoint_header\")"
            ),
            ))
        }
        Some(other) => {
            return Err(params.error(
                "strategy",
                format!("unknown strategy {other:?} (expected \"encoded_endpoint_header\")"),
            ))
        }
    }
    if let Some(header) = params.get::<String>("headerName")? {
        if !header.eq_ignore_ascii_case(SESSION_TOKEN_HEADER) {
            return Err(params.error(
                "headerName",
                format!(
                    "{header:?} is not supported by wasm-epp yet (only the default {SESSION_TOKEN_HEADER:?})"
                ),
            ));
        }
    }
    Ok(scorer(ScorerSpec::SessionAffinity))
}

fn utilization_detector(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let mut detector = UtilizationParams::default();
    if let Some(depth) = params.positive("queueDepthThreshold")? {
        detector.queue_depth_threshold = depth as f64;
    }
    if let Some(kv) = params.get::<f64>("kvCacheUtilThreshold")? {
        if !(kv > 0.0 && kv <= 1.0) {
            return Err(params.error(
                "kvCacheUtilThreshold",
                "must be greater than 0 and at most 1",
            ));
        }
        detector.kv_cache_util_threshold = kv;
    }
    if let Some(value) = params.value("metricsStalenessThreshold") {
        let key = "metricsStalenessThreshold";
        let Some(text) = value.as_str() else {
            return Err(params.error(key, "must be a duration string such as 200ms"));
        };
        let duration = parse_duration(text).map_err(|e| params.error(key, e))?;
        if duration.is_zero() {
            return Err(params.error(key, "must be greater than 0"));
        }
        if duration.subsec_nanos() % 1_000_000 != 0 {
            return Err(params.error(key, "must be a whole number of milliseconds"));
        }
        detector.metrics_staleness_threshold_ms =
            u64::try_from(duration.as_millis()).map_err(|_| params.error(key, "too large"))?;
    }
    if let Some(headroom) = params.get::<f64>("headroom")? {
        if !(headroom.is_finite() && headroom >= 0.0) {
            return Err(params.error("headroom", "must be a finite number of at least 0"));
        }
        detector.headroom = headroom;
    }
    Ok(Plugin::Detector(detector))
}

fn prefix_producer(params: &Params<'_>, warnings: &mut Vec<String>) -> Result<Plugin, ConfigError> {
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
    if params.positive("lruCapacityPerServer")?.is_some() {
        warnings.push(format!(
            "{}.lruCapacityPerServer: ignored; wasm-epp's prefix index is shared by all Envoy \
             workers and bounded by the filter's prefixIndexBuckets",
            params.at
        ));
    }
    Ok(Plugin::PrefixProducer(prefix))
}

fn max_endpoints(params: &Params<'_>) -> Result<usize, ConfigError> {
    match params.positive("maxNumOfEndpoints")? {
        Some(n) => usize::try_from(n).map_err(|_| params.error("maxNumOfEndpoints", "too large")),
        None => Ok(1),
    }
}

fn file_discovery(params: &Params<'_>) -> Result<Plugin, ConfigError> {
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

/// `core-metrics-extractor`: upstream's engine label key, default engine and `engineConfigs`.
fn metrics_extractor(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let configs: Vec<EngineConfig> = params.get("engineConfigs")?.unwrap_or_default();
    let engines = configs
        .iter()
        .enumerate()
        .map(|(i, config)| {
            config
                .compile()
                .map_err(|e| params.error(&format!("engineConfigs[{i}].{}", e.field), e.problem))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Engines::configured(
        params.get("engineLabelKey")?,
        params.get("defaultEngine")?,
        engines,
    )
    .map(Plugin::Extractor)
    .map_err(|e| params.error(e.field, e.problem))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Mapping(map) => map.is_empty(),
        _ => false,
    }
}

/// A plugin's `parameters` mapping, with the keys checked against the known ones.
pub(super) struct Params<'v> {
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
    ) -> Result<Params<'v>, ConfigError> {
        let map = match value {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(map)) => Some(map),
            Some(_) => return Err(ConfigError::invalid(at, "must be a mapping")),
        };
        for key in map.into_iter().flat_map(Mapping::keys) {
            let Some(key) = key.as_str() else {
                return Err(ConfigError::invalid(at, "parameter names must be strings"));
            };
            if unsupported.contains(&key) {
                return Err(ConfigError::invalid(
                    format!("{at}.{key}"),
                    format!("parameter of {plugin_type:?} not supported by wasm-epp yet"),
                ));
            }
            if !allowed.contains(&key) {
                let known = if allowed.is_empty() {
                    "it takes none".to_string()
                } else {
                    format!("known: {}", allowed.join(", "))
                };
                return Err(ConfigError::invalid(
                    format!("{at}.{key}"),
                    format!("unknown parameter of {plugin_type:?} ({known})"),
                ));
            }
        }
        Ok(Params { at, map })
    }

    /// The parameters' path, e.g. `plugins[2].parameters`.
    pub(super) fn at(&self) -> &str {
        self.at
    }

    /// The parameter `key` as given; `None` when absent or null.
    pub(super) fn value(&self, key: &str) -> Option<&'v Value> {
        self.map
            .and_then(|map| map.get(key))
            .filter(|value| !value.is_null())
    }

    /// The parameter `key`, decoded as `T`.
    pub(super) fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ConfigError> {
        self.value(key)
            .map(|value| serde_yaml::from_value(value.clone()).map_err(|e| self.error(key, e)))
            .transpose()
    }

    /// The parameter `key` as an integer of at least 1.
    fn positive(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.get::<u64>(key)? {
            Some(0) => Err(self.error(key, "must be at least 1")),
            other => Ok(other),
        }
    }

    /// The parameter `key` is not accepted, for `message`.
    pub(super) fn error(&self, key: &str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::invalid(format!("{}.{key}", self.at), message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_yaml(plugin_type: &str, parameters: &str) -> Result<Plugin, ConfigError> {
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
            let err = build_yaml(plugin_type, parameters).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{plugin_type} {parameters}: {err}");
        }
    }

    #[test]
    fn unknown_and_unsupported_types_are_told_apart() {
        let err = build_yaml("token-load-scorer", "{}")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "plugins[0].type: plugin type \"token-load-scorer\" is not supported by wasm-epp yet"
        );
        let err = build_yaml("bar", "{}").unwrap_err().to_string();
        assert_eq!(err, "plugins[0].type: unknown plugin type \"bar\"");
    }

    fn built(plugin_type: &str, parameters: &str) -> Plugin {
        build_yaml(plugin_type, parameters)
            .unwrap_or_else(|e| panic!("{plugin_type} {parameters}: {e}"))
    }

    #[test]
    fn new_scorers_with_defaults_and_parameters() {
        for (plugin_type, spec) in [
            ("lora-affinity-scorer", ScorerSpec::LoraAffinity),
            (
                "running-requests-size-scorer",
                ScorerSpec::RunningRequestsSize,
            ),
            (
                "load-aware-scorer",
                ScorerSpec::LoadAware(LoadAwareParams { threshold: 128 }),
            ),
            ("session-affinity-scorer", ScorerSpec::SessionAffinity),
        ] {
            assert_eq!(
                built(plugin_type, "{}"),
                scorer(spec.clone()),
                "{plugin_type}"
            );
            assert_eq!(built(plugin_type, "~"), scorer(spec), "{plugin_type}");
        }
        assert_eq!(
            built("load-aware-scorer", "{threshold: 16}"),
            scorer(ScorerSpec::LoadAware(LoadAwareParams { threshold: 16 }))
        );
        assert_eq!(
            built(
                "session-affinity-scorer",
                "{strategy: encoded_endpoint_header, headerName: X-Session-Token}"
            ),
            scorer(ScorerSpec::SessionAffinity)
        );
    }

    #[test]
    fn new_filters_and_picker() {
        assert_eq!(
            built("decode-filter", "{}"),
            Plugin::Filter(FilterSpec::Decode)
        );
        assert_eq!(
            built("prefill-filter", "~"),
            Plugin::Filter(FilterSpec::Prefill)
        );
        assert_eq!(
            built("weighted-random-picker", "{}"),
            Plugin::Picker(PickerSpec::WeightedRandom {
                max_num_of_endpoints: 1
            })
        );
        assert_eq!(
            built("weighted-random-picker", "{maxNumOfEndpoints: 3}"),
            Plugin::Picker(PickerSpec::WeightedRandom {
                max_num_of_endpoints: 3
            })
        );
        for plugin_type in ["label-selector-filter", "by-label-selector"] {
            let Plugin::Filter(FilterSpec::LabelSelector(selector)) =
                built(plugin_type, "{matchLabels: {llm-d.ai/role: decode}}")
            else {
                panic!("{plugin_type}: not a label selector filter");
            };
            assert_eq!(selector.match_labels["llm-d.ai/role"], "decode");
        }
    }

    #[test]
    fn utilization_detector_defaults_and_parameters() {
        assert_eq!(
            built("utilization-detector", "{}"),
            Plugin::Detector(UtilizationParams::default())
        );
        assert_eq!(
            built(
                "utilization-detector",
                "{queueDepthThreshold: 10, kvCacheUtilThreshold: 1, metricsStalenessThreshold: 1.5s, headroom: 0.25}"
            ),
            Plugin::Detector(UtilizationParams {
                queue_depth_threshold: 10.0,
                kv_cache_util_threshold: 1.0,
                metrics_staleness_threshold_ms: 1500,
                headroom: 0.25,
            })
        );
        let Plugin::Detector(params) = built(
            "utilization-detector",
            "{metricsStalenessThreshold: 1m30s, headroom: 0}",
        ) else {
            panic!("not a detector");
        };
        assert_eq!(params.metrics_staleness_threshold_ms, 90_000);
        assert_eq!(params.headroom, 0.0);
    }

    #[test]
    fn new_plugin_parameter_errors_name_the_parameter() {
        let at = "plugins[0].parameters";
        for (plugin_type, parameters, expected) in [
            ("lora-affinity-scorer", "{x: 1}", format!("{at}.x: unknown parameter of \"lora-affinity-scorer\" (it takes none)")),
            ("running-requests-size-scorer", "{x: 1}", format!("{at}.x: unknown parameter")),
            ("load-aware-scorer", "{threshold: 0}", format!("{at}.threshold: must be at least 1")),
            ("load-aware-scorer", "{threshold: -3}", format!("{at}.threshold: invalid")),
            ("load-aware-scorer", "{queueThreshold: 3}", format!("{at}.queueThreshold: unknown parameter")),
            ("session-affinity-scorer", "{strategy: session_id}", format!("{at}.strategy: \"session_id\" is not supported by wasm-epp yet")),
            ("session-affinity-scorer", "{strategy: session_id_header}", format!("{at}.strategy: \"session_id_header\" is not supported by wasm-epp yet")),
            ("session-affinity-scorer", "{strategy: sticky}", format!("{at}.strategy: unknown strategy \"sticky\"")),
            ("session-affinity-scorer", "{headerName: x-my-session}", format!("{at}.headerName: \"x-my-session\" is not supported by wasm-epp yet")),
            ("session-affinity-scorer", "{profileName: prefill}", format!("{at}.profileName: parameter of \"session-affinity-scorer\" not supported by wasm-epp yet")),
            ("session-affinity-scorer", "{evictionTtlSeconds: 60}", format!("{at}.evictionTtlSeconds: parameter of \"session-affinity-scorer\" not supported")),
            ("session-affinity-scorer", "{ttl: 60}", format!("{at}.ttl: unknown parameter")),
            ("decode-filter", "{role: x}", format!("{at}.role: unknown parameter of \"decode-filter\"")),
            ("prefill-filter", "[x]", format!("{at}: must be a mapping")),
            ("label-selector-filter", "{matchExpressions: [{key: a, operator: In}]}", format!("{at}.matchExpressions[0].values: must not be empty for operator In")),
            ("weighted-random-picker", "{maxNumOfEndpoints: 0}", format!("{at}.maxNumOfEndpoints: must be at least 1")),
            ("weighted-random-picker", "{seed: 1}", format!("{at}.seed: unknown parameter")),
            ("utilization-detector", "{queueDepthThreshold: 0}", format!("{at}.queueDepthThreshold: must be at least 1")),
            ("utilization-detector", "{queueDepthThreshold: 2.5}", format!("{at}.queueDepthThreshold: invalid type")),
            ("utilization-detector", "{kvCacheUtilThreshold: 0}", format!("{at}.kvCacheUtilThreshold: must be greater than 0 and at most 1")),
            ("utilization-detector", "{kvCacheUtilThreshold: 1.2}", format!("{at}.kvCacheUtilThreshold: must be greater than 0 and at most 1")),
            ("utilization-detector", "{metricsStalenessThreshold: 200}", format!("{at}.metricsStalenessThreshold: must be a duration string such as 200ms")),
            ("utilization-detector", "{metricsStalenessThreshold: soon}", format!("{at}.metricsStalenessThreshold: invalid duration \"soon\"")),
            ("utilization-detector", "{metricsStalenessThreshold: 0s}", format!("{at}.metricsStalenessThreshold: must be greater than 0")),
            ("utilization-detector", "{metricsStalenessThreshold: 0.5ms}", format!("{at}.metricsStalenessThreshold: must be a whole number of milliseconds")),
            ("utilization-detector", "{headroom: -0.1}", format!("{at}.headroom: must be a finite number of at least 0")),
            ("utilization-detector", "{inFlightLoadProducerName: p}", format!("{at}.inFlightLoadProducerName: parameter of \"utilization-detector\" not supported by wasm-epp yet")),
            ("utilization-detector", "{queueDepth: 3}", format!("{at}.queueDepth: unknown parameter")),
        ] {
            let err = build_yaml(plugin_type, parameters).unwrap_err().to_string();
            assert!(err.starts_with(&expected), "{plugin_type} {parameters}\n  gave: {err}\n  want: {expected}");
            assert!(!err.contains('\n'), "{err}");
        }
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
