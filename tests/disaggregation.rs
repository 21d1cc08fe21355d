//! Prefill/decode disaggregation through the real Envoy and controller: upstream's P/D
//! EndpointPickerConfig (`disagg-profile-handler` + `prefix-based-pd-decider`) over simulators
//! labelled `llm-d.ai/role: decode` or `prefill`. The simulators echo the
//! `x-prefiller-host-port` they receive as `x-sim-received-prefiller`. Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::*;

/// Upstream's example P/D config with file discovery of `endpoints`.
fn pd_config(endpoints: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1\n\
         kind: EndpointPickerConfig\n\
         plugins:\n\
         - type: prefix-cache-scorer\n\
         - type: queue-scorer\n\
         - type: prefill-filter\n\
         - type: decode-filter\n\
         - type: max-score-picker\n\
         - type: disagg-profile-handler\n  parameters: {{deciders: {{prefill: prefix-based-pd-decider}}}}\n\
         - type: prefix-based-pd-decider\n  parameters: {{nonCachedTokens: 16}}\n\
         - type: file-discovery\n  parameters: {{path: \"{endpoints}\"}}\n\
         schedulingProfiles:\n\
         - name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n  - pluginRef: max-score-picker\n  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n    weight: 1\n\
         - name: decode\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n    weight: 1\n\
         dataLayer:\n  discovery: {{pluginRef: file-discovery}}\n"
    )
}

#[test]
fn long_uncached_prompts_get_a_prefill_endpoint_and_short_or_cached_ones_do_not() {
    let scratch = Scratch::new("disaggregation");
    let roles = [
        ("decode-a", "decode"),
        ("decode-b", "decode"),
        ("prefill-a", "prefill"),
        ("prefill-b", "prefill"),
    ];
    let sims: Vec<Sim> = roles
        .iter()
        .map(|(name, _)| Sim::start(&scratch, name, &[]))
        .collect();
    let mut listing = String::from("endpoints:\n");
    for ((name, role), sim) in roles.iter().zip(&sims) {
        listing.push_str(&format!(
            "- {{name: {name}, address: 127.0.0.1, port: {}, labels: {{llm-d.ai/role: {role}}}}}\n",
            sim.port
        ));
    }
    let endpoints = scratch.path("endpoints.yaml");
    std::fs::write(&endpoints, listing).expect("write endpoints");
    let config = scratch.path("config.yaml");
    std::fs::write(&config, pd_config(&endpoints.display().to_string())).expect("write config");
    let (_controller, envoy) = configured(&scratch, &config, 1);
    let prefill_ports: Vec<String> = sims[2..]
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();

    // A short prompt (well under 16 pseudo-tokens) stays on one decode server; a prefill
    // endpoint a client names never reaches it.
    let short = envoy.complete("hi", &[("x-prefiller-host-port", "10.9.9.9:1")]);
    assert_eq!(short.status, 200, "{}", short.body);
    assert!(
        short.instance().starts_with("decode-"),
        "{}",
        short.instance()
    );
    assert_eq!(short.header("x-sim-received-prefiller"), None);

    // A long prompt nobody has sent: decoded on a decode server, prefilled on a prefill one.
    let long = format!(
        "{} {}",
        unique("long"),
        "tell me a story about envoy ".repeat(150)
    );
    let first = envoy.complete(&long, &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.instance().starts_with("decode-"),
        "{}",
        first.instance()
    );
    let prefiller = first
        .header("x-sim-received-prefiller")
        .expect("a prefill endpoint for a long uncached prompt");
    assert!(
        prefill_ports.iter().any(|p| p == prefiller),
        "{prefiller} is not a prefill server ({prefill_ports:?})"
    );

    // The same prompt again: its blocks are now cached on the decode server the prefix scorer
    // prefers, so nothing is left to prefill elsewhere.
    let again = envoy.complete(&long, &[]);
    assert_eq!(again.instance(), first.instance(), "prefix affinity");
    assert_eq!(again.header("x-sim-received-prefiller"), None);
}
