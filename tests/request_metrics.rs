//! Request metrics on Envoy's `/stats/prometheus`, through the real Envoy with the shipped
//! configuration (whose `stats_tags` turn the filter's stat names into upstream-style names and
//! labels). Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::time::Duration;

use common::*;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

#[test]
fn requests_errors_and_latencies_appear_with_model_and_objective_labels() {
    let fleet = fleet("request-metrics", &["a", "b"], 1);
    fleet.envoy.wait_for_snapshot();
    // `wait_for_snapshot` may itself have sent requests: count from a page taken now.
    let prometheus = || {
        get(
            &format!(
                "http://127.0.0.1:{}/stats/prometheus",
                fleet.envoy.admin_port
            ),
            &[],
        )
        .body
    };
    let labels = [
        ("model_name", MODEL),
        ("target_model_name", MODEL),
        ("objective", "batch"),
    ];
    for i in 0..3 {
        let reply = fleet.envoy.complete(
            &unique(&format!("metrics {i}")),
            &[("x-llm-d-inference-objective", "batch")],
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let bad = post(
        &fleet.envoy.url("/v1/completions"),
        "{not json",
        &[("x-llm-d-inference-objective", "batch")],
    );
    assert_eq!(bad.status, 400);

    let mut page = String::new();
    let seen = wait_until(Duration::from_secs(15), || {
        page = prometheus();
        // Counters come with the worker's next tick; histograms with Envoy's stats flush.
        prometheus_sample(&page, "llm_d_epp_request_total", &labels) == Some(3.0)
            && prometheus_sample(
                &page,
                "llm_d_epp_request_duration_milliseconds_count",
                &labels,
            ) == Some(3.0)
    });
    assert!(seen, "request metrics never appeared:\n{page}");
    assert_eq!(
        prometheus_sample(
            &page,
            "llm_d_epp_request_error_total",
            &[("error_code", "BadRequest"), ("objective", "batch")]
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        prometheus_sample(&page, "llm_d_epp_request_ttft_milliseconds_count", &labels),
        Some(3.0),
        "{page}"
    );
    assert!(
        !page.contains("envoy_llm_d_epp") && !page.contains("wasmcustom_llm_d_epp"),
        "upstream's names, without a prefix"
    );
    // Every filter metric the example dashboard charts is on the page.
    let dashboard =
        std::fs::read_to_string(repo().join("examples/grafana/wasm-epp-dashboard.json"))
            .expect("the dashboard");
    let mut charted: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("llm_d_epp_request_") || w.starts_with("wasm_epp_"))
        .collect();
    charted.sort_unstable();
    charted.dedup();
    assert!(charted.len() >= 4, "{charted:?}");
    for name in charted {
        assert!(
            page.lines().any(|l| l.starts_with(name)),
            "the dashboard charts {name}, which the filter does not export:\n{page}"
        );
    }
}
