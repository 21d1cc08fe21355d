use super::*;
use wasm_epp::scheduler::scorers::session_affinity_scorer;

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
fn session_affinity_takes_upstream_session_id_config() {
    let session = |parameters: &str| build_yaml(session_affinity_scorer::TYPE, parameters);
    assert_eq!(
        session(
            "{strategy: session_id, sessionIdConfig: {sources: [{header: X-Session-Id}], evictionTtlSeconds: 60, evictionSweepSeconds: 5}}"
        )
        .unwrap(),
        scorer(ScorerSpec::SessionAffinity(SessionAffinityParams {
            strategy: SessionStrategy::SessionId,
            eviction_ttl_ms: 60_000,
        }))
    );
    // Defaults: the x-session-id header, 300 s.
    assert_eq!(
        session("{strategy: session_id}").unwrap(),
        scorer(ScorerSpec::SessionAffinity(SessionAffinityParams {
            strategy: SessionStrategy::SessionId,
            eviction_ttl_ms: 300_000,
        }))
    );
    // The token strategy's header under its current name.
    assert!(session("{encodedEndpointHeaderConfig: {header: x-session-token}}").is_ok());
    let err = session("{sessionIdConfig: {sources: [{header: a, attribute: b}]}}")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "plugins[0].parameters.sessionIdConfig.sources[0]: exactly one of header or attribute must be set"
    );
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
        (
            "session-affinity-scorer",
            ScorerSpec::SessionAffinity(SessionAffinityParams::default()),
        ),
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
        scorer(ScorerSpec::SessionAffinity(SessionAffinityParams::default()))
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
        ("session-affinity-scorer", "{strategy: session_id, sessionIdConfig: {sources: [{header: x-user}]}}", format!("{at}.sessionIdConfig.sources[0].header: \"x-user\" is not supported by wasm-epp yet")),
        ("session-affinity-scorer", "{strategy: session_id, sessionIdConfig: {sources: [{attribute: agent-identity}]}}", format!("{at}.sessionIdConfig.sources[0].attribute: attribute sources are not supported")),
        ("session-affinity-scorer", "{strategy: session_id, sessionIdConfig: {evictionTtlSeconds: -1}}", format!("{at}.sessionIdConfig.evictionTtlSeconds: must be a number")),
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
