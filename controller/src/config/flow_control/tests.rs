use wasm_epp::flow_control::shortest_job_first_ordering_policy::SjfParams;
use wasm_epp::flow_control::{BandLimits, FlowControl, Ordering};
use wasm_epp::scheduler::filters::concurrency_detector::ConcurrencyParams;

use super::super::parse;

fn compile(body: &str) -> Result<super::super::PickerConfig, String> {
    parse(&format!(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{body}"
    ))
    .map_err(|e| e.to_string())
}

#[test]
fn the_gate_alone_turns_on_upstreams_defaults() {
    let config = compile("featureGates: [flowControl]\n").unwrap();
    assert_eq!(config.profile.flow_control, Some(FlowControl::default()));
    let off = compile("featureGates: [flowControl=false]\n").unwrap();
    assert_eq!(off.profile.flow_control, None);
    assert_eq!(compile("").unwrap().profile.flow_control, None);
}

#[test]
fn an_upstream_section_compiles_with_its_quantities_durations_and_bands() {
    let config = compile(
        "featureGates: [flowControl]
plugins:
- type: queue-scorer
- name: limit
  type: static-usage-limit-policy
  parameters: {threshold: 0.8}
- type: fcfs-ordering-policy
- type: global-strict-fairness-policy
- type: utilization-detector
  parameters: {queueDepthThreshold: 8}
flowControl:
  maxBytes: 1Gi
  maxRequests: 1k
  defaultRequestTTL: 30s
  usageLimitPolicyPluginRef: limit
  saturationDetector: {pluginRef: utilization-detector}
  defaultPriorityBand: {maxRequests: 100}
  defaultNegativePriorityBand: {maxRequests: 10, maxBytes: 500M}
  priorityBands:
  - priority: 10
    maxRequests: \"50\"
    fairnessPolicyRef: global-strict-fairness-policy
    orderingPolicyRef: fcfs-ordering-policy
  - priority: 0
",
    )
    .unwrap();
    let fc = config.profile.flow_control.expect("flow control on");
    assert_eq!((fc.max_bytes, fc.max_requests), (1024 * 1024 * 1024, 1_000));
    // The empty-pool TTL follows the default one.
    assert_eq!(
        (fc.default_request_ttl_ms, fc.no_endpoint_request_ttl_ms),
        (30_000, 30_000)
    );
    assert_eq!(fc.usage_threshold, 0.8);
    assert_eq!(
        fc.priority_bands,
        [
            BandLimits {
                priority: 10,
                max_requests: 50,
                max_bytes: 1_000_000_000,
                ordering: Ordering::Fcfs,
            },
            BandLimits {
                priority: 0,
                max_requests: 5_000,
                max_bytes: 1_000_000_000,
                ordering: Ordering::Fcfs,
            },
        ]
    );
    assert_eq!(fc.default_band.max_requests, 100);
    assert_eq!(
        (fc.band(-1).max_requests, fc.band(-1).max_bytes),
        (10, 500_000_000)
    );
    assert_eq!(
        config.profile.saturation_detector.queue_depth_threshold,
        8.0
    );
    // Policies named by their type need no plugin entry (upstream registers them).
    let bare = compile(
        "featureGates: [flowControl]\nflowControl:\n  usageLimitPolicyPluginRef: static-usage-limit-policy\n  noEndpointRequestTTL: 0s\n  priorityBands: [{priority: 1, orderingPolicyRef: fcfs-ordering-policy}]\n",
    )
    .unwrap();
    let fc = bare.profile.flow_control.unwrap();
    assert_eq!(
        (fc.usage_threshold, fc.no_endpoint_request_ttl_ms),
        (1.0, 0)
    );
}

#[test]
fn settings_without_the_gate_are_kept_out_with_a_warning() {
    let config = compile("flowControl: {maxRequests: 10}\n").unwrap();
    assert_eq!(config.profile.flow_control, None);
    assert_eq!(
        config.warnings[0],
        "flowControl: only saturationDetector is used; the flowControl feature gate is off"
    );
}

#[test]
fn errors_name_the_field() {
    for (body, expected) in [
        (
            "flowControl: {maxBytes: -1}\n",
            "flowControl.maxBytes: must be non-negative",
        ),
        (
            "flowControl: {maxBytes: 1Zi}\n",
            "flowControl.maxBytes: \"1Zi\" is not a quantity (e.g. 100, 1k, 1Gi)",
        ),
        (
            "flowControl: {defaultRequestTTL: soon}\n",
            "flowControl.defaultRequestTTL: ",
        ),
        (
            "flowControl: {priorityBands: [{priority: 1}, {priority: 1}]}\n",
            "flowControl.priorityBands[1].priority: duplicate priority level 1",
        ),
        (
            "flowControl: {priorityBands: [{maxRequests: 3}]}\n",
            "flowControl.priorityBands[0].priority: is required",
        ),
        (
            "flowControl: {priorityBands: [{priority: 1, fairnessPolicyRef: fair}]}\n",
            "flowControl.priorityBands[0].fairnessPolicyRef: plugin \"fair\" not found",
        ),
        (
            "plugins: [{type: queue-scorer}]\nflowControl: {priorityBands: [{priority: 1, orderingPolicyRef: queue-scorer}]}\n",
            "flowControl.priorityBands[0].orderingPolicyRef: plugin \"queue-scorer\" is not a fcfs-ordering-policy or shortest-job-first-ordering-policy",
        ),
        (
            "flowControl: {priorityBands: [{priority: 1, weight: 2}]}\n",
            "flowControl.priorityBands[0]: unknown field `weight`",
        ),
        (
            "flowControl: {usageLimitPolicyPluginRef: other}\n",
            "flowControl.usageLimitPolicyPluginRef: plugin \"other\" not found",
        ),
        (
            "plugins: [{type: static-usage-limit-policy, parameters: {threshold: 2}}]\n",
            "plugins[0].parameters.threshold: must be greater than 0 and at most 1",
        ),
        (
            "plugins: [{type: shortest-job-first-ordering-policy, parameters: {maxWait: 0s}}]\n",
            "plugins[0].parameters.maxWait: must be at least 1ms",
        ),
        (
            "plugins: [{type: shortest-job-first-ordering-policy, parameters: {maxWait: 5}}]\n",
            "plugins[0].parameters.maxWait: must be a duration string such as 5s",
        ),
        (
            "plugins: [{type: concurrency-detector, parameters: {mode: tokens}}]\n",
            "plugins[0].parameters.mode: mode \"tokens\" is not supported by wasm-epp yet (only \"requests\")",
        ),
        (
            "plugins: [{type: concurrency-detector, parameters: {maxConcurrency: 0}}]\n",
            "plugins[0].parameters.maxConcurrency: must be at least 1",
        ),
        (
            "plugins: [{type: concurrency-detector, parameters: {headroom: 0.2}}]\n",
            "plugins[0].parameters.headroom: parameter of \"concurrency-detector\" not supported by wasm-epp yet",
        ),
        (
            "plugins: [{type: queue-scorer}, {type: concurrency-detector}]\nschedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}, {pluginRef: concurrency-detector}]}]\n",
            "schedulingProfiles[0].plugins[1].pluginRef: plugin \"concurrency-detector\": a concurrency-detector is used as the saturation detector only",
        ),
        (
            "plugins: [{type: concurrency-detector}, {name: other, type: utilization-detector}]\n",
            "plugins[1]: a second saturation detector (first: \"concurrency-detector\")",
        ),
        (
            "plugins: [{type: round-robin-fairness-policy}]\n",
            "plugins[0].type: plugin type \"round-robin-fairness-policy\" is not supported by wasm-epp yet",
        ),
    ] {
        let error = compile(body).map(|_| ()).unwrap_err();
        assert!(error.contains(expected), "{body}: {error}");
    }
}

#[test]
fn a_concurrency_detector_and_shortest_job_first_bands_compile() {
    let config = compile(
        "featureGates: [flowControl]
plugins:
- type: queue-scorer
- name: slots
  type: concurrency-detector
  parameters: {mode: requests, maxConcurrency: 8}
- name: short-first
  type: shortest-job-first-ordering-policy
  parameters: {maxWait: 2s}
flowControl:
  saturationDetector: {pluginRef: slots}
  defaultPriorityBand: {orderingPolicyRef: short-first}
  priorityBands:
  - {priority: 5, orderingPolicyRef: shortest-job-first-ordering-policy}
  - {priority: 1}
",
    )
    .unwrap();
    assert_eq!(
        config.profile.concurrency_detector,
        Some(ConcurrencyParams { max_concurrency: 8 })
    );
    let fc = config.profile.flow_control.expect("flow control on");
    let sjf = |max_wait_ms| Ordering::ShortestJobFirst(SjfParams { max_wait_ms });
    assert_eq!(fc.band(0).ordering, sjf(2_000));
    // Named by its type without an entry: the defaults.
    assert_eq!(fc.band(5).ordering, sjf(30_000));
    assert_eq!(fc.band(1).ordering, Ordering::Fcfs);
    // The only detector, unreferenced, is the one used; the default detector otherwise.
    let alone = compile("plugins: [{type: concurrency-detector}]\n").unwrap();
    assert_eq!(
        alone.profile.concurrency_detector,
        Some(ConcurrencyParams::default())
    );
    assert_eq!(compile("").unwrap().profile.concurrency_detector, None);
}
