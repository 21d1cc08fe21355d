//! End-to-end behaviour through the real Envoy with the wasm-epp filter, the real controller
//! and simulated model servers, all on 127.0.0.1. Needs `make build envoy` (see the Makefile's
//! `test-e2e`).

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::time::{Duration, Instant};

use common::*;

fn picks_follow_load(concurrency: u32) {
    let f = fleet("load", &["busy", "medium", "idle"], concurrency);
    let [busy, medium, idle] = &f.sims[..] else {
        unreachable!()
    };
    busy.report_load(8, 0.8);
    medium.report_load(4, 0.4);
    idle.report_load(0, 0.0);
    f.envoy.wait_for_snapshot();
    assert!(
        wait_until(Duration::from_secs(5), || sticky_instance(&f.envoy, 5)
            .as_deref()
            == Some("idle")),
        "requests did not settle on the idle server"
    );
    for _ in 0..20 {
        let reply = f.envoy.complete(&unique("steady"), &[]);
        assert_eq!((reply.status, reply.instance()), (200, "idle"), "{reply:?}");
    }

    // The load moves: the filter follows within about two scrape intervals.
    idle.report_load(10, 0.9);
    busy.report_load(0, 0.0);
    let changed = Instant::now();
    // Unique prompts: a repeated one would rightly stick to whoever served it first.
    let mut last = None;
    let moved = wait_until(Duration::from_secs(5), || {
        let reply = f.envoy.complete(&unique("moved"), &[]);
        let done = reply.instance() == "busy";
        last = Some(reply);
        done
    });
    let followed = changed.elapsed();
    assert!(
        moved,
        "requests never followed the load change; last reply {last:?}; controller sees {}",
        get(
            &format!(
                "http://127.0.0.1:{}/debug/endpoints",
                f.controller.admin_port
            ),
            &[]
        )
        .body
    );
    eprintln!("concurrency {concurrency}: load change followed after {followed:?}");
    assert!(
        followed <= Duration::from_millis(3 * INTERVAL_MS + 200),
        "load change took {followed:?} to reach the picks"
    );
    for _ in 0..10 {
        assert_eq!(f.envoy.complete(&unique("after"), &[]).instance(), "busy");
    }
}

#[test]
fn picks_follow_load_one_worker() {
    picks_follow_load(1);
}

#[test]
fn picks_follow_load_two_workers() {
    picks_follow_load(2);
}

#[test]
fn client_destination_header_is_never_honoured() {
    let f = fleet("header", &["member"], 2);
    let scratch = Scratch::new("outsider");
    let outsider = Sim::start(&scratch, "outsider", &[]);
    f.envoy.wait_for_snapshot();
    let member = &f.sims[0];
    let outside = outsider.addr();
    let with_member_first = format!("{},{}", member.addr(), outside);
    let with_outsider_first = format!("{outside},{}", member.addr());
    for value in [outside.as_str(), &with_outsider_first, &with_member_first] {
        let reply = f
            .envoy
            .complete("spoof", &[("x-gateway-destination-endpoint", value)]);
        assert_eq!(
            (reply.status, reply.instance()),
            (200, "member"),
            "{reply:?}"
        );
        assert_eq!(
            reply.header("x-sim-received-destination"),
            Some(member.addr().as_str())
        );
        let reply = get(
            &f.envoy.url("/v1/models"),
            &[("x-gateway-destination-endpoint", value)],
        );
        assert_eq!(
            (reply.status, reply.instance()),
            (200, "member"),
            "{reply:?}"
        );
    }
    // Requests the filter rejects are not forwarded anywhere either.
    let reply = post(
        &f.envoy.url("/v1/completions"),
        "{",
        &[("x-gateway-destination-endpoint", &outside)],
    );
    assert_eq!(reply.status, 400);
    assert_eq!(outsider.requests_served(), 0);
}

#[test]
fn routing_survives_controller_loss() {
    let mut f = fleet("controller-loss", &["a", "b"], 2);
    f.envoy.wait_for_snapshot();
    f.controller.proc.kill();
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    let mut served = std::collections::BTreeSet::new();
    for i in 0..30 {
        let reply = f.envoy.complete(&format!("after-loss-{i}"), &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        served.insert(reply.instance().to_string());
    }
    assert!(served.iter().all(|s| s == "a" || s == "b"), "{served:?}");
}

#[test]
fn bad_bodies_get_400_and_reach_no_server() {
    let f = fleet("bad-body", &["only"], 1);
    f.envoy.wait_for_snapshot();
    let before = f.sims[0].requests_served();
    let cases = [
        (
            "/v1/completions",
            "{not json",
            "error unmarshaling request body: ",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x"}"#,
            "model not found in request body",
        ),
        (
            "/v1/completions",
            r#"{"model":"m"}"#,
            "invalid completions request: must have prompt field",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[]}"#,
            "invalid chat completions request",
        ),
    ];
    for (path, body, message) in cases {
        let reply = post(&f.envoy.url(path), body, &[]);
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
        assert!(
            reply
                .body
                .starts_with(&format!("inference error: BadRequest - {message}")),
            "{body}: {}",
            reply.body
        );
    }
    assert_eq!(f.sims[0].requests_served(), before);
}

#[test]
fn empty_pool_gets_503_with_drop_reason() {
    let f = fleet("empty", &[], 1);
    // The filter has a snapshot (with no endpoints) as soon as it stops failing closed.
    let mut reply = f.envoy.complete("x", &[]);
    assert!(wait_until(Duration::from_secs(10), || {
        reply = f.envoy.complete("x", &[]);
        reply.header("x-llm-d-request-dropped-reason").is_some()
    }));
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.header("x-llm-d-request-dropped-reason"),
        Some("rejected-no-endpoints")
    );
    assert_eq!(
        reply.body,
        "inference error: ServiceUnavailable - failed to find endpoint candidates for serving the request"
    );
}

#[test]
fn without_a_snapshot_the_filter_fails_closed_unless_configured_open() {
    let scratch = Scratch::new("no-snapshot");
    let fallback = Sim::start(&scratch, "fallback", &[]);
    let no_controller = free_port();
    let closed = Envoy::start(
        &scratch,
        EnvoyOptions {
            fallback_port: fallback.port,
            ..EnvoyOptions::with_controller(no_controller)
        },
    );
    let reply = closed.complete("x", &[]);
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(
        reply
            .body
            .starts_with("inference error: ServiceUnavailable - no endpoint snapshot"),
        "{}",
        reply.body
    );
    assert_eq!(fallback.requests_served(), 0);
    drop(closed);

    let open = Envoy::start(
        &scratch,
        EnvoyOptions {
            fallback_port: fallback.port,
            fail_open: true,
            ..EnvoyOptions::with_controller(no_controller)
        },
    );
    let reply = open.complete("x", &[("x-gateway-destination-endpoint", "127.0.0.1:1")]);
    assert_eq!(
        (reply.status, reply.instance()),
        (200, "fallback"),
        "{reply:?}"
    );
    assert_eq!(reply.header("x-sim-received-destination"), None);
}

#[test]
fn streaming_responses_pass_through() {
    let f = fleet("stream", &["s"], 1);
    f.envoy.wait_for_snapshot();
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "stream please"}],
        "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}
    });
    let reply = post(&f.envoy.url("/v1/chat/completions"), &body.to_string(), &[]);
    assert_eq!((reply.status, reply.instance()), (200, "s"), "{reply:?}");
    assert!(reply
        .header("content-type")
        .unwrap_or("")
        .contains("text/event-stream"));
    assert!(
        reply.body.contains("\"completion_tokens\":4"),
        "{}",
        reply.body
    );
    assert!(
        reply.body.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.body
    );
}

#[test]
fn in_flight_counts_are_shared_by_workers_and_released() {
    let scratch = Scratch::new("in-flight");
    let slow = ["--itl-ms", "40"];
    let sims = [
        Sim::start(&scratch, "a", &slow),
        Sim::start(&scratch, "b", &slow),
    ];
    let file = endpoints_file(&scratch, &sims.iter().collect::<Vec<_>>());
    let config = scratch.path("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
             - type: active-request-scorer\n\
             - type: file-discovery\n  parameters: {{path: {}}}\n\
             schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: active-request-scorer\n\
             dataLayer:\n  discovery: {{pluginRef: file-discovery}}\n",
            file.display()
        ),
    )
    .expect("write config");
    let (_controller, envoy) = configured(&scratch, &config, 2);
    let url = envoy.url("/v1/completions");
    // Three long requests, staggered so each pick sees the earlier ones in flight, each on its
    // own connection (so on either worker).
    let long = serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "long", "max_tokens": 25})
        .to_string();
    let handles: Vec<_> = (0..3)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 250 }));
            let (url, body) = (url.clone(), long.clone());
            std::thread::spawn(move || post(&url, &body, &[]))
        })
        .collect();
    let served: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().expect("request thread").instance().to_string())
        .collect();
    assert_ne!(
        served[0], served[1],
        "the second request ignored the first in flight: {served:?}"
    );
    // Finished requests are released: with no load left, picks tie and spread over both
    // servers (a leaked count would send every request to the server that had fewer).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        seen.insert(envoy.complete(&unique("short"), &[]).instance().to_string());
    }
    assert_eq!(
        seen.len(),
        2,
        "after release, requests went only to {seen:?}"
    );
}
