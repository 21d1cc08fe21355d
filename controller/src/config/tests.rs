use super::*;
use crate::discovery::file::FileSource;
use wasm_epp::scheduler::profile::{
    ActiveRequestParams, LabelSelector, LabelSelectorOperator, LabelSelectorRequirement,
    LoadAwareParams,
};

const HEADER: &str = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";

/// Compiles `body` after the header; errors as the one line the user sees.
fn compile_yaml(body: &str) -> Result<PickerConfig, String> {
    parse(&format!("{HEADER}{body}")).map_err(|e| e.to_string())
}

fn weights(profile: &Profile) -> Vec<(&str, f64)> {
    profile
        .scorers
        .iter()
        .map(|s| (s.name.as_str(), s.weight))
        .collect()
}

#[test]
fn no_config_means_the_upstream_default_profile() {
    let config = PickerConfig::default();
    assert_eq!(
        weights(&config.profile),
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0)
        ]
    );
    assert_eq!(config.discovery, None);
}

#[test]
fn the_metrics_extractor_takes_upstream_engine_configs() {
    let config = compile_yaml(
        "plugins:\n\
         - type: metrics-data-source\n\
         - name: extractor\n  type: core-metrics-extractor\n  parameters:\n    defaultEngine: atom\n    engineConfigs:\n\
         \x20   - name: atom\n      queuedRequestsSpec: atom:waiting\n      kvUsageSpec: atom:kv\n      interTokenLatencySpec: atom:itl\n\
         dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: extractor\n",
    )
    .unwrap();
    let atom = config.engines.for_labels(&Default::default());
    assert_eq!(atom.name, "atom");
    assert_eq!(
        atom.families(),
        ["atom:itl_count", "atom:itl_sum", "atom:kv", "atom:waiting"]
    );

    let err = compile_yaml(
        "plugins:\n- type: core-metrics-extractor\n  parameters: {defaultEngine: nope}\n",
    )
    .unwrap_err();
    assert!(
        err.starts_with("plugins[0].parameters.defaultEngine: unknown engine \"nope\""),
        "{err}"
    );
    let err = compile_yaml(
        "plugins:\n- type: core-metrics-extractor\n  parameters:\n    engineConfigs: [{name: x, kvUsageSpec: 'a{'}]\n",
    )
    .unwrap_err();
    assert!(
        err.starts_with("plugins[0].parameters.engineConfigs[0].kvUsageSpec:"),
        "{err}"
    );
}

#[test]
fn the_upstream_default_config_compiles_to_the_default_profile() {
    let config = compile_yaml(
        "plugins:\n\
         - type: queue-scorer\n\
         - type: kv-cache-utilization-scorer\n\
         - type: prefix-cache-scorer\n\
         - type: metrics-data-source\n\
         - type: core-metrics-extractor\n\
         schedulingProfiles:\n\
         - name: default\n  plugins:\n\
         \x20 - pluginRef: queue-scorer\n    weight: 2\n\
         \x20 - pluginRef: kv-cache-utilization-scorer\n    weight: 2\n\
         \x20 - pluginRef: prefix-cache-scorer\n    weight: 3\n\
         dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: core-metrics-extractor\n",
    )
    .unwrap();
    assert_eq!(config.profile, Profile::default());
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn weights_default_to_one_and_a_missing_picker_is_max_score() {
    let config = compile_yaml(
        "plugins:\n- type: queue-scorer\n- name: kv\n  type: kv-cache-utilization-scorer\n\
         schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: kv\n  - pluginRef: queue-scorer\n    weight: 0.5\n",
    )
    .unwrap();
    assert_eq!(config.profile.name, "p");
    assert_eq!(
        weights(&config.profile),
        [("kv", 1.0), ("queue-scorer", 0.5)]
    );
    assert_eq!(
        config.profile.scorers[0].scorer,
        ScorerSpec::KvCacheUtilization
    );
    assert_eq!(config.profile.picker, default_picker());
}

#[test]
fn omitted_profiles_take_every_scorer_at_weight_one_and_the_picker() {
    let config = compile_yaml(
        "plugins:\n- type: queue-scorer\n- type: random-picker\n  parameters: {maxNumOfEndpoints: 2}\n- type: prefix-cache-scorer\n",
    )
    .unwrap();
    assert_eq!(config.profile.name, "default");
    assert_eq!(
        weights(&config.profile),
        [("queue-scorer", 1.0), ("prefix-cache-scorer", 1.0)]
    );
    assert_eq!(
        config.profile.picker,
        PickerSpec::Random {
            max_num_of_endpoints: 2
        }
    );
}

#[test]
fn the_deprecated_api_version_is_accepted_with_a_warning() {
    let config = parse(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n",
    )
    .unwrap();
    assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
    assert!(config.warnings[0].contains("deprecated"));
}

#[test]
fn approx_producer_parameters_merge_into_the_prefix_scorer() {
    let config = compile_yaml(
        "plugins:\n\
         - name: producer\n  type: approx-prefix-cache-producer\n  parameters: {maxPrefixTokensToMatch: 16384, blockSizeTokens: 32, autoTune: false, lruCapacityPerServer: 1000}\n\
         - type: prefix-cache-scorer\n  parameters: {matchLengthWeight: 0.25, prefixMatchInfoProducerName: producer}\n\
         schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: prefix-cache-scorer\n    weight: 3\n",
    )
    .unwrap();
    let ScorerSpec::PrefixCache(params) = &config.profile.scorers[0].scorer else {
        panic!("not a prefix scorer: {:?}", config.profile.scorers[0]);
    };
    let expected = PrefixCacheParams {
        match_length_weight: 0.25,
        auto_tune: false,
        block_size_tokens: 32,
        max_prefix_tokens_to_match: 16384,
        ..PrefixCacheParams::default()
    };
    assert_eq!(params, &expected);
    assert_eq!(config.profile.scorers[0].weight, 3.0);
}

#[test]
fn active_request_scorer_parameters() {
    let config = compile_yaml(
        "plugins:\n- type: active-request-scorer\n  parameters: {idleThreshold: 2, maxBusyScore: 0.5}\n",
    )
    .unwrap();
    assert_eq!(
        config.profile.scorers[0].scorer,
        ScorerSpec::ActiveRequest(ActiveRequestParams {
            idle_threshold: 2,
            max_busy_score: 0.5
        })
    );
    let err =
        compile_yaml("plugins:\n- type: active-request-scorer\n  parameters: {maxBusyScore: 2}\n")
            .unwrap_err();
    assert!(err.contains("plugins[0].parameters.maxBusyScore"), "{err}");
}

#[test]
fn expected_delay_scorer_takes_no_parameters() {
    let config = compile_yaml("plugins:\n- type: expected-delay-scorer\n").unwrap();
    assert_eq!(config.profile.scorers[0].scorer, ScorerSpec::ExpectedDelay);
    let err = compile_yaml("plugins:\n- type: expected-delay-scorer\n  parameters: {horizon: 2}\n")
        .unwrap_err();
    assert!(err.contains("plugins[0].parameters"), "{err}");
}

#[test]
fn file_discovery_is_compiled() {
    let config = compile_yaml(
        "plugins:\n- name: files\n  type: file-discovery\n  parameters: {path: /etc/endpoints.yaml, watchFile: true}\n\
         dataLayer:\n  discovery: {pluginRef: files}\n",
    )
    .unwrap();
    assert_eq!(
        config.discovery,
        Some(Source::File(FileSource {
            path: "/etc/endpoints.yaml".into(),
            watch: true
        }))
    );
}

#[test]
fn accepted_sections_compile() {
    let config = compile_yaml(
        "featureGates: [haPopulateNonLeaderDatastore=false, flowControl=false]\n\
         plugins:\n- type: openai-parser\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 10}\n- type: single-profile-handler\n- type: token-producer\n\
         - type: queue-scorer\n\
         schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer}]\n\
         requestHandler:\n  parsers: [{pluginRef: openai-parser}]\n\
         saturationDetector: {pluginRef: utilization-detector}\n\
         dataLayer: {injectDefaults: false}\n",
    )
    .unwrap();
    assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
    assert!(config.profile.filters.is_empty());
    assert_eq!(
        config.profile.saturation_detector.queue_depth_threshold,
        10.0
    );
    assert_eq!(
        config.warnings,
        ["saturationDetector: deprecated; use flowControl.saturationDetector"]
    );
}

fn yaml_profile(plugins: &str, profile: &str) -> Result<PickerConfig, String> {
    compile_yaml(&format!(
        "plugins:\n{plugins}schedulingProfiles:\n- name: p\n  plugins:\n{profile}"
    ))
}

#[test]
fn new_scorers_and_picker_compile_into_the_profile() {
    let config = yaml_profile(
        "- type: lora-affinity-scorer\n- type: running-requests-size-scorer\n\
         - type: load-aware-scorer\n- name: load16\n  type: load-aware-scorer\n  parameters: {threshold: 16}\n\
         - type: session-affinity-scorer\n  parameters: {strategy: encoded_endpoint_header}\n\
         - type: weighted-random-picker\n  parameters: {maxNumOfEndpoints: 2}\n",
        "  - pluginRef: lora-affinity-scorer\n    weight: 2\n  - pluginRef: running-requests-size-scorer\n\
         \x20 - pluginRef: load-aware-scorer\n  - pluginRef: load16\n    weight: 0.5\n\
         \x20 - pluginRef: session-affinity-scorer\n    weight: 10\n  - pluginRef: weighted-random-picker\n",
    )
    .unwrap();
    let scorers: Vec<(&str, f64, &ScorerSpec)> = config
        .profile
        .scorers
        .iter()
        .map(|s| (s.name.as_str(), s.weight, &s.scorer))
        .collect();
    assert_eq!(
        scorers,
        [
            ("lora-affinity-scorer", 2.0, &ScorerSpec::LoraAffinity),
            (
                "running-requests-size-scorer",
                1.0,
                &ScorerSpec::RunningRequestsSize
            ),
            (
                "load-aware-scorer",
                1.0,
                &ScorerSpec::LoadAware(LoadAwareParams { threshold: 128 })
            ),
            (
                "load16",
                0.5,
                &ScorerSpec::LoadAware(LoadAwareParams { threshold: 16 })
            ),
            (
                "session-affinity-scorer",
                10.0,
                &ScorerSpec::SessionAffinity(Default::default())
            ),
        ]
    );
    assert_eq!(
        config.profile.picker,
        PickerSpec::WeightedRandom {
            max_num_of_endpoints: 2
        }
    );
    assert!(profile_summary(&config.profile).ends_with("; weighted-random-picker(2)"));
}

const FILTER_PLUGINS: &str = "- type: queue-scorer\n\
     - name: gpu\n  type: label-selector-filter\n  parameters:\n    matchLabels: {gpu: h100}\n    matchExpressions: [{key: zone, operator: NotIn, values: [b]}]\n\
     - name: old\n  type: by-label-selector\n  parameters:\n    selector:\n      matchExpressions: [{key: ready, operator: Exists}]\n\
     - type: decode-filter\n- type: prefill-filter\n\
     - name: util\n  type: utilization-detector\n  parameters: {headroom: 0.5, metricsStalenessThreshold: 1s}\n";

fn filter_specs() -> [FilterSpec; 5] {
    let gpu = LabelSelector {
        match_labels: [("gpu".to_string(), "h100".to_string())].into(),
        match_expressions: vec![LabelSelectorRequirement {
            key: "zone".to_string(),
            operator: LabelSelectorOperator::NotIn,
            values: vec!["b".to_string()],
        }],
    };
    let old = LabelSelector {
        match_labels: Default::default(),
        match_expressions: vec![LabelSelectorRequirement {
            key: "ready".to_string(),
            operator: LabelSelectorOperator::Exists,
            values: Vec::new(),
        }],
    };
    let util = UtilizationParams {
        headroom: 0.5,
        metrics_staleness_threshold_ms: 1000,
        ..UtilizationParams::default()
    };
    [
        FilterSpec::LabelSelector(gpu),
        FilterSpec::LabelSelector(old),
        FilterSpec::Decode,
        FilterSpec::Prefill,
        FilterSpec::UtilizationDetector(util),
    ]
}

#[test]
fn filters_keep_the_profile_order() {
    let config = yaml_profile(
        FILTER_PLUGINS,
        "  - pluginRef: util\n  - pluginRef: queue-scorer\n    weight: 2\n  - pluginRef: prefill-filter\n\
         \x20 - pluginRef: gpu\n  - pluginRef: decode-filter\n  - pluginRef: old\n",
    )
    .unwrap();
    let [gpu, old, decode, prefill, util] = filter_specs();
    assert_eq!(config.profile.filters, [util, prefill, gpu, decode, old]);
    assert_eq!(weights(&config.profile), [("queue-scorer", 2.0)]);
    assert_eq!(
        profile_summary(&config.profile),
        "profile \"p\": filters utilization-detector, prefill-filter, label-selector-filter, decode-filter, label-selector-filter; queue-scorer×2; max-score-picker(1)"
    );
    // The detector is used by the profile and has a custom name: the saturation detector
    // keeps the defaults.
    assert_eq!(
        config.profile.saturation_detector,
        UtilizationParams::default()
    );
}

#[test]
fn omitted_profiles_include_every_filter_in_plugin_order() {
    let config = compile_yaml(&format!("plugins:\n{FILTER_PLUGINS}")).unwrap();
    assert_eq!(config.profile.filters, filter_specs());
    assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
    // The only detector is also the saturation detector.
    let [.., FilterSpec::UtilizationDetector(util)] = filter_specs() else {
        unreachable!()
    };
    assert_eq!(config.profile.saturation_detector, util);
}

#[test]
fn saturation_detector_parameters() {
    let detectors = "- name: strict\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 2, kvCacheUtilThreshold: 0.5}\n\
                     - name: loose\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 20, metricsStalenessThreshold: 500ms}\n\
                     - type: queue-scorer\n";
    let strict = UtilizationParams {
        queue_depth_threshold: 2.0,
        kv_cache_util_threshold: 0.5,
        ..UtilizationParams::default()
    };
    let loose = UtilizationParams {
        queue_depth_threshold: 20.0,
        metrics_staleness_threshold_ms: 500,
        ..UtilizationParams::default()
    };
    let profile = "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer}]\n";
    for (section, expected, warnings) in [
        ("saturationDetector: {pluginRef: loose}\n", &loose, 1),
        ("flowControl:\n  saturationDetector: {pluginRef: strict}\n", &strict, 0),
        // The new field wins over the deprecated one.
        (
            "flowControl: {saturationDetector: {pluginRef: loose}}\nsaturationDetector: {pluginRef: strict}\n",
            &loose,
            2,
        ),
    ] {
        let config =
            compile_yaml(&format!("plugins:\n{detectors}{profile}{section}")).unwrap();
        assert_eq!(&config.profile.saturation_detector, expected, "{section}");
        assert!(config.profile.filters.is_empty());
        assert_eq!(config.warnings.len(), warnings, "{section}: {:?}", config.warnings);
    }

    // Unreferenced: the only detector not in the profile.
    let config = yaml_profile(
        "- type: queue-scorer\n- name: a\n  type: utilization-detector\n  parameters: {headroom: 1}\n\
         - name: b\n  type: utilization-detector\n  parameters: {headroom: 2}\n",
        "  - pluginRef: a\n  - pluginRef: queue-scorer\n",
    )
    .unwrap();
    assert_eq!(config.profile.saturation_detector.headroom, 2.0);
    assert_eq!(
        config.profile.filters,
        [FilterSpec::UtilizationDetector(UtilizationParams {
            headroom: 1.0,
            ..UtilizationParams::default()
        })]
    );

    // The default name `utilization-detector` is upstream's default reference, even when the
    // profile uses it as a filter too.
    let config = yaml_profile(
        "- type: queue-scorer\n- type: utilization-detector\n  parameters: {kvCacheUtilThreshold: 0.9}\n",
        "  - pluginRef: utilization-detector\n  - pluginRef: queue-scorer\n",
    )
    .unwrap();
    assert_eq!(
        config.profile.saturation_detector.kv_cache_util_threshold,
        0.9
    );
    assert_eq!(config.profile.filters.len(), 1);

    // No detector configured: the defaults.
    let config = compile_yaml("plugins:\n- type: queue-scorer\n").unwrap();
    assert_eq!(
        config.profile.saturation_detector,
        UtilizationParams::default()
    );
    assert!(config.profile.filters.is_empty());
}

#[test]
fn new_plugin_errors_name_their_field() {
    for (body, expected) in [
        (
            "plugins:\n- type: decode-filter\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: decode-filter\n    weight: 2\n",
            "schedulingProfiles[0].plugins[1].weight: not allowed on filter \"decode-filter\"",
        ),
        (
            "plugins:\n- type: utilization-detector\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: utilization-detector\n    weight: 1\n",
            "schedulingProfiles[0].plugins[0].weight: not allowed on filter \"utilization-detector\" (type \"utilization-detector\")",
        ),
        (
            "plugins:\n- type: prefill-filter\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: prefill-filter\n  - pluginRef: prefill-filter\n",
            "schedulingProfiles[0].plugins[1].pluginRef: plugin \"prefill-filter\" is already in this profile",
        ),
        (
            "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: queue-scorer}\n",
            "saturationDetector.pluginRef: plugin \"queue-scorer\" has type \"queue-scorer\"; expected a saturation detector (utilization-detector or concurrency-detector)",
        ),
        (
            "flowControl: {saturationDetector: {pluginRef: nope}}\n",
            "flowControl.saturationDetector.pluginRef: no plugin named \"nope\"",
        ),
        (
            "plugins:\n- type: utilization-detector\nflowControl: {saturationDetector: {pluginRef: utilization-detector}}\nsaturationDetector: {pluginRef: nope}\n",
            "saturationDetector.pluginRef: no plugin named \"nope\"",
        ),
        (
            "flowControl: {saturationDetector: {pluginRef: x, gateOn: max}}\n",
            "flowControl.saturationDetector: unknown field `gateOn`",
        ),
        (
            "flowControl: {enableEviction: true}\n",
            "flowControl.enableEviction: eviction of dispatched requests is not supported by wasm-epp yet",
        ),
        (
            "flowControl: {maxRequest: 10}\n",
            "flowControl: unknown field `maxRequest`",
        ),
        ("flowControl: [a]\n", "flowControl: must be a mapping"),
        (
            "plugins:\n- name: a\n  type: utilization-detector\n- name: b\n  type: utilization-detector\n",
            "plugins[1]: a second saturation detector (first: \"a\")",
        ),
        (
            "plugins:\n- type: label-selector-filter\n  parameters:\n    matchExpressions: [{key: a, operator: Exists, values: [x]}]\n",
            "plugins[0].parameters.matchExpressions[0].values: must be empty for operator Exists",
        ),
        (
            "plugins:\n- type: session-affinity-scorer\n  parameters: {strategy: session_id_header}\n",
            "plugins[0].parameters.strategy: \"session_id_header\" is not supported by wasm-epp yet",
        ),
        (
            "plugins:\n- type: weighted-random-picker\n- type: max-score-picker\n",
            "plugins[1]: a second picker (first: \"weighted-random-picker\")",
        ),
    ] {
        let err = compile_yaml(body).unwrap_err();
        assert!(err.starts_with(expected), "{body}\n  gave: {err}\n  want: {expected}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn each_error_names_its_field() {
    for (body, expected) in [
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: foo\n",
            "schedulingProfiles[0].plugins[1].pluginRef: no plugin named \"foo\"",
        ),
        (
            "plugins:\n- type: queue-scorer\n- type: queue-scorer\n- type: bar\n",
            "plugins[1].name: duplicate plugin name \"queue-scorer\"",
        ),
        (
            "plugins:\n- type: queue-scorer\n- name: x\n  type: kv-cache-utilization-scorer\n- type: bar\n",
            "plugins[2].type: unknown plugin type \"bar\"",
        ),
        (
            "plugins:\n- type: encode-filter\n",
            "plugins[0].type: plugin type \"encode-filter\" is not supported by wasm-epp yet",
        ),
        (
            "plugins:\n- type: queue-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2, tieBreak: random}\n",
            "plugins[1].parameters.tieBreak: unknown parameter",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: []\n- name: b\n  plugins: []\n",
            "schedulingProfiles: 2 profiles configured",
        ),
        (
            "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: max-score-picker\n  - pluginRef: random-picker\n",
            "schedulingProfiles[0].plugins[1].pluginRef: the profile already has picker \"max-score-picker\"",
        ),
        (
            "plugins:\n- type: max-score-picker\n- type: random-picker\n",
            "plugins[1]: a second picker",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    wieght: 2\n",
            "schedulingProfiles[0].plugins[0]: unknown field `wieght`",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
            "schedulingProfiles[0].plugins[0].weight: must be",
        ),
        (
            "plugins:\n- type: metrics-data-source\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: metrics-data-source\n",
            "schedulingProfiles[0].plugins[0].pluginRef: plugin \"metrics-data-source\" (type \"metrics-data-source\") is not a filter, scorer or picker",
        ),
        (
            "plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: queue-scorer}\n",
            "dataLayer.discovery.pluginRef: plugin \"queue-scorer\" has type \"queue-scorer\"",
        ),
        (
            "plugins:\n- type: queue-scorer\ndataLayer:\n  sources:\n  - pluginRef: queue-scorer\n",
            "dataLayer.sources[0].pluginRef: plugin \"queue-scorer\" has type",
        ),
        (
            "plugins:\n- type: metrics-data-source\ndataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors: [{pluginRef: nope}]\n",
            "dataLayer.sources[0].extractors[0].pluginRef: no plugin named \"nope\"",
        ),
        (
            "dataLayer:\n  peerDiscovery: {pluginRef: x}\n",
            "dataLayer.peerDiscovery: not supported by wasm-epp yet",
        ),
        (
            "requestHandler:\n  parsers: [{pluginRef: openai-parser}]\n",
            "requestHandler.parsers[0].pluginRef: no plugin named \"openai-parser\"",
        ),
        ("featureGates: [fastPath]\n", "featureGates[0]: unknown feature gate \"fastPath\""),
        (
            "plugins:\n- type: approx-prefix-cache-producer\n- name: second\n  type: approx-prefix-cache-producer\n",
            "plugins[1].type: only one approx-prefix-cache-producer",
        ),
        (
            "plugins:\n- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: nope}\n",
            "plugins[0].parameters.prefixMatchInfoProducerName: no approx-prefix-cache-producer named \"nope\"",
        ),
        ("plugins:\n- name: x\n", "plugins[0].type: must not be empty"),
        ("colour: blue\n", "unknown field `colour`"),
    ] {
        let err = compile_yaml(body).unwrap_err();
        assert!(err.starts_with(expected), "{body}\n  gave: {err}\n  want: {expected}");
    }
}

#[test]
fn api_version_and_kind_are_checked() {
    let err = parse("apiVersion: v1\nkind: EndpointPickerConfig\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("apiVersion: unsupported \"v1\""), "{err}");
    let err = parse("apiVersion: llm-d.ai/v1alpha1\nkind: Pod\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("kind: expected"), "{err}");
    let err = parse("kind: EndpointPickerConfig\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("apiVersion"), "{err}");
}

#[test]
fn errors_keep_the_field_apart_from_the_message() {
    let field = |field: &str, message: &str| ConfigError::Field {
        field: field.to_string(),
        message: message.to_string(),
    };
    let compile = |body: &str| parse(&format!("{HEADER}{body}")).unwrap_err();
    assert_eq!(
        compile("schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: foo\n"),
        field(
            "schedulingProfiles[0].plugins[0].pluginRef",
            "no plugin named \"foo\""
        )
    );
    assert_eq!(
        compile(
            "plugins:\n- type: core-metrics-extractor\n  parameters:\n    engineConfigs: [{name: x, kvUsageSpec: 'a{'}]\n"
        ),
        field(
            "plugins[0].parameters.engineConfigs[0].kvUsageSpec",
            "'a{': missing the closing brace"
        )
    );
    assert_eq!(
        compile(
            "plugins:\n- type: utilization-detector\n  parameters: {metricsStalenessThreshold: soon}\n"
        ),
        field(
            "plugins[0].parameters.metricsStalenessThreshold",
            "invalid duration \"soon\" (examples: 50ms, 1s, 2m)"
        )
    );
    assert!(matches!(
        compile("plugins: 3\n"),
        ConfigError::Syntax(message) if message.starts_with("plugins: invalid type")
    ));
    let missing = std::env::temp_dir().join("wasm-epp-config-test-no-such-file.yaml");
    assert!(matches!(load(&missing), Err(ConfigError::Read(_))));
}
