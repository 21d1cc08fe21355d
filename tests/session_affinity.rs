//! `session-affinity-scorer` with the `session_id` strategy through the real Envoy (two
//! workers, so the bindings must be shared between them) and controller. Needs
//! `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::time::Duration;

use common::*;

fn config(endpoints: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1\n\
         kind: EndpointPickerConfig\n\
         plugins:\n\
         - type: session-affinity-scorer\n  parameters:\n    strategy: session_id\n    sessionIdConfig: {{sources: [{{header: x-session-id}}], evictionTtlSeconds: 300}}\n\
         - type: queue-scorer\n\
         - type: file-discovery\n  parameters: {{path: \"{endpoints}\", watchFile: true}}\n\
         schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: session-affinity-scorer\n    weight: 10\n  - pluginRef: queue-scorer\n    weight: 1\n\
         dataLayer:\n  discovery: {{pluginRef: file-discovery}}\n"
    )
}

#[test]
fn a_session_stays_on_its_endpoint_across_workers_until_the_endpoint_leaves() {
    let scratch = Scratch::new("session-id");
    let sims = [
        Sim::start(&scratch, "a", &[]),
        Sim::start(&scratch, "b", &[]),
    ];
    let file = endpoints_file(&scratch, &[&sims[0], &sims[1]]);
    let config_path = scratch.path("config.yaml");
    std::fs::write(&config_path, config(&file.display().to_string())).expect("write config");
    let (_controller, envoy) = configured(&scratch, &config_path, 2);
    let session = |id: &str| {
        let reply = envoy.complete(&unique("session"), &[("x-session-id", id)]);
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            reply.header("x-session-token"),
            None,
            "no token for session_id"
        );
        reply.instance().to_string()
    };
    let first = session("user-1");
    let (bound, other) = if first == "a" { (0, 1) } else { (1, 0) };
    // The bound server gets busy: the queue scorer now prefers the other one, the session
    // (weight 10) keeps its server, on whichever worker its requests land.
    sims[bound].report_load(20, 0.9);
    assert!(
        wait_until(Duration::from_secs(10), || sticky_instance(&envoy, 3)
            .as_deref()
            == Some(sims[other].name.as_str())),
        "requests without a session never moved to the idle server"
    );
    for _ in 0..10 {
        assert_eq!(session("user-1"), first);
    }
    // The bound server leaves the pool: the session moves, and stays moved when it returns.
    let _ = endpoints_file(&scratch, &[&sims[other]]);
    assert!(
        wait_until(Duration::from_secs(10), || session("user-1")
            == sims[other].name),
        "the session never moved off the server that left"
    );
    sims[bound].report_load(0, 0.0);
    sims[other].report_load(20, 0.9);
    let _ = endpoints_file(&scratch, &[&sims[0], &sims[1]]);
    assert!(
        wait_until(Duration::from_secs(10), || sticky_instance(&envoy, 3)
            .as_deref()
            == Some(sims[bound].name.as_str())),
        "the returning server never got the sessionless requests"
    );
    for _ in 0..10 {
        assert_eq!(
            session("user-1"),
            sims[other].name,
            "the binding moved for good"
        );
    }
}
