//! The plugin types wasm-epp understands, built from `plugins[i]` entries of the config.

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};
use wasm_epp::flow_control::shortest_job_first_ordering_policy::{self, SjfParams};
use wasm_epp::scheduler::disaggregation::{self as pd, Decider};
use wasm_epp::scheduler::filters::concurrency_detector::ConcurrencyParams;
use wasm_epp::scheduler::profile::{
    ActiveRequestParams, FilterSpec, LoadAwareParams, PickerSpec, PrefixCacheParams, ScorerSpec,
    UtilizationParams,
};
use wasm_epp::scheduler::profile::{SessionAffinityParams, SessionStrategy};
use wasm_epp::scheduler::scorers::session_affinity_scorer::{
    SESSION_ID_HEADER, TOKEN_HEADER as SESSION_TOKEN_HEADER,
};
use wasm_epp::scheduler::{filters, pickers, prefix, scorers};

use super::disaggregation::{self, Handler};
use super::flow_control;
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
    /// `concurrency-detector`: a saturation detector counting this proxy's requests in flight.
    ConcurrencyDetector(ConcurrencyParams),
    /// `shortest-job-first-ordering-policy`: a flow-control band's ordering.
    Ordering(SjfParams),
    /// `file-discovery`.
    Discovery(FileSource),
    /// `core-metrics-extractor`: the engines whose metric names it reads.
    Extractor(Engines),
    /// `disagg-profile-handler`.
    Disaggregation(Handler),
    /// A prefill/decode decider.
    Decider(Decider),
    /// `static-usage-limit-policy`: flow control releases requests while the pool saturation
    /// is below its `threshold`.
    UsageLimit(f64),
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
    /// `global-strict-fairness-policy` (a band is one queue, whatever the fairness id).
    FairnessPolicy,
    /// `fcfs-ordering-policy` (oldest first within a band).
    OrderingPolicy,
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
    "edf-ordering-policy",
    "slo-deadline-ordering-policy",
    "round-robin-fairness-policy",
    "program-aware-fairness",
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
        scorers::expected_delay_scorer::TYPE => {
            params(&[], &[])?;
            Ok(scorer(ScorerSpec::ExpectedDelay))
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
            &[
                "strategy",
                "headerName",
                "encodedEndpointHeaderConfig",
                "sessionIdConfig",
            ],
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
        filters::concurrency_detector::TYPE => concurrency_detector(&params(
            &["mode", "maxConcurrency"],
            &["maxTokenConcurrency", "headroom"],
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
        flow_control::FAIRNESS_POLICY => inherent(Role::FairnessPolicy, warnings),
        flow_control::ORDERING_POLICY => inherent(Role::OrderingPolicy, warnings),
        shortest_job_first_ordering_policy::TYPE => {
            flow_control::shortest_job_first(&params(&["maxWait"], &[])?)
        }
        flow_control::USAGE_LIMIT_POLICY => {
            flow_control::usage_limit(&params(&["threshold"], &[])?)
        }
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

/// `sessionIdConfig` of `session-affinity-scorer`.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SessionIdConfig {
    #[serde(default)]
    sources: Vec<SessionSource>,
    eviction_ttl_seconds: Option<f64>,
    eviction_sweep_seconds: Option<f64>,
}

/// One `sessionIdConfig.sources` entry.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionSource {
    header: Option<String>,
    attribute: Option<String>,
    producer: Option<String>,
}

/// `encodedEndpointHeaderConfig` of `session-affinity-scorer`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodedHeaderConfig {
    header: Option<String>,
}

fn session_affinity_scorer(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let mut session = SessionAffinityParams::default();
    match params.get::<String>("strategy")?.as_deref() {
        None | Some("encoded_endpoint_header") => {}
        Some("session_id") => session.strategy = SessionStrategy::SessionId,
        Some(strategy @ "session_id_header") => {
            return Err(params.error(
                "strategy",
                format!(
                "{strategy:?} is not supported by wasm-epp yet (only \"encoded_endpoint_header\" and \"session_id\")"
            ),
            ))
        }
        Some(other) => {
            return Err(params.error(
                "strategy",
                format!("unknown strategy {other:?} (expected \"encoded_endpoint_header\" or \"session_id\")"),
            ))
        }
    }
    // The token header: `encodedEndpointHeaderConfig.header`, or its former name `headerName`.
    let nested = params
        .get::<EncodedHeaderConfig>("encodedEndpointHeaderConfig")?
        .and_then(|c| c.header)
        .map(|h| ("encodedEndpointHeaderConfig.header", h));
    let header = nested.or(params
        .get::<String>("headerName")?
        .map(|h| ("headerName", h)));
    if let Some((key, header)) = header {
        if !header.eq_ignore_ascii_case(SESSION_TOKEN_HEADER) {
            return Err(params.error(
                key,
                format!(
                    "{header:?} is not supported by wasm-epp yet (only the default {SESSION_TOKEN_HEADER:?})"
                ),
            ));
        }
    }
    let config = params
        .get::<SessionIdConfig>("sessionIdConfig")?
        .unwrap_or_default();
    for (i, source) in config.sources.iter().enumerate() {
        let at = format!("sessionIdConfig.sources[{i}]");
        match (&source.header, &source.attribute) {
            (Some(header), None) if header.trim().eq_ignore_ascii_case(SESSION_ID_HEADER) => {}
            (Some(header), None) => {
                return Err(params.error(
                    &format!("{at}.header"),
                    format!("{header:?} is not supported by wasm-epp yet (only the default {SESSION_ID_HEADER:?})"),
                ))
            }
            (None, Some(_)) => {
                return Err(params.error(
                    &format!("{at}.attribute"),
                    "attribute sources are not supported by wasm-epp yet (only the header x-session-id)",
                ))
            }
            _ => {
                return Err(params.error(&at, "exactly one of header or attribute must be set"))
            }
        }
        if source.producer.is_some() {
            return Err(params.error(&format!("{at}.producer"), "not supported by wasm-epp yet"));
        }
    }
    for (key, value) in [
        ("evictionTtlSeconds", config.eviction_ttl_seconds),
        ("evictionSweepSeconds", config.eviction_sweep_seconds),
    ] {
        if value.is_some_and(|v| !v.is_finite() || v < 0.0) {
            return Err(params.error(
                &format!("sessionIdConfig.{key}"),
                "must be a number of seconds of at least 0 (0: the default)",
            ));
        }
    }
    if let Some(ttl) = config.eviction_ttl_seconds.filter(|&t| t > 0.0) {
        session.eviction_ttl_ms = (ttl * 1000.0).round().max(1.0) as u64;
    }
    // `evictionSweepSeconds` is accepted: a binding past its TTL is ignored when read, and its
    // slot is reused, so nothing needs sweeping.
    Ok(scorer(ScorerSpec::SessionAffinity(session)))
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

/// `concurrency-detector` in its `requests` mode (the only one wasm-epp has).
fn concurrency_detector(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    match params.get::<String>("mode")?.as_deref() {
        None | Some("requests") => {}
        Some(mode @ ("tokens" | "hybrid")) => {
            return Err(params.error(
                "mode",
                format!("mode {mode:?} is not supported by wasm-epp yet (only \"requests\")"),
            ))
        }
        Some(other) => {
            return Err(params.error(
                "mode",
                format!("unknown mode {other:?} (known: requests, tokens, hybrid)"),
            ))
        }
    }
    let mut detector = ConcurrencyParams::default();
    if let Some(max) = params.positive("maxConcurrency")? {
        detector.max_concurrency = max;
    }
    Ok(Plugin::ConcurrencyDetector(detector))
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
mod tests;
