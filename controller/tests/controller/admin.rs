//! The admin server: health, readiness, metrics and the debug view.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{
    black_hole, closed_port, endpoint, temp_dir, vllm_metrics, write_endpoints, Controller,
    FakeServer,
};

#[test]
fn debug_endpoints_show_scrape_status_and_a_hung_server_delays_no_one() {
    let good = FakeServer::start(&vllm_metrics(2, 1, 0.3));
    let refused = closed_port();
    let hung = black_hole();
    let dir = temp_dir("debug");
    let file = dir.join("endpoints.yaml");
    write_endpoints(
        &file,
        &[("good", good.port), ("refused", refused), ("hung", hung)],
    );
    let controller = Controller::start(&[
        "--endpoints-file",
        file.to_str().unwrap(),
        "--scrape-timeout",
        "500ms",
    ]);

    let deadline = Instant::now() + Duration::from_secs(10);
    let reports = loop {
        let reply = controller.admin_get("/debug/endpoints");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.content_type.as_deref(), Some("application/json"));
        let reports: Value = serde_json::from_str(&reply.body).unwrap();
        let by_name = |name: &str| {
            reports
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .cloned()
                .unwrap()
        };
        if by_name("test/good")["scrapes_ok"].as_u64().unwrap() >= 3
            && by_name("test/refused")["scrapes_failed"].as_u64().unwrap() >= 1
            && by_name("test/hung")["scrapes_failed"].as_u64().unwrap() >= 1
        {
            break reports;
        }
        assert!(
            Instant::now() < deadline,
            "scrapes did not settle: {reports}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let report = |name: &str| {
        reports
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
    };
    let good_report = report("test/good");
    assert_eq!(good_report["address"], "127.0.0.1");
    assert_eq!(good_report["port"], good.port);
    assert_eq!(good_report["labels"]["app"], "fake");
    assert_eq!(good_report["metrics"]["waiting_queue_size"], 2);
    assert!(good_report["last_error"].is_null());
    assert!(good_report["metrics_age_ms"].as_u64().unwrap() < 2_000);
    let refused_report = report("test/refused");
    assert!(refused_report["metrics_age_ms"].is_null());
    assert!(refused_report["last_error"]
        .as_str()
        .unwrap()
        .contains("request failed"));
    assert_eq!(refused_report["scrapes_ok"], 0);
    let hung_report = report("test/hung");
    assert!(hung_report["last_error"]
        .as_str()
        .unwrap()
        .contains("timed out"));

    // The hung server's 500 ms timeouts do not hold back the good endpoint's scrapes (read
    // from the controller's state: unchanged metrics reach the snapshot only once a second).
    let good_updated = || {
        let reply = controller.admin_get("/debug/endpoints");
        let reports: Value = serde_json::from_str(&reply.body).unwrap();
        reports
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "test/good")
            .unwrap()["metrics"]["updated_unix_ms"]
            .as_u64()
            .unwrap()
    };
    let first = good_updated();
    std::thread::sleep(Duration::from_millis(300));
    let second = good_updated();
    assert!(
        second > first,
        "good endpoint refreshed while hung one waits"
    );
}

#[test]
fn readiness_waits_for_the_first_scrape_round() {
    // One hung endpoint makes the first round last the whole scrape timeout.
    let hung = black_hole();
    let dir = temp_dir("ready");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("hung", hung)]);
    let controller = Controller::start(&[
        "--endpoints-file",
        file.to_str().unwrap(),
        "--refresh-metrics-interval",
        "10s",
        "--scrape-timeout",
        "3s",
    ]);
    assert_eq!(controller.admin_get("/healthz").status, 200);
    assert_eq!(controller.admin_get("/healthz").body, "ok\n");
    assert_eq!(controller.admin_get("/readyz").status, 503);
    let deadline = Instant::now() + Duration::from_secs(10);
    while controller.admin_get("/readyz").status != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(controller.admin_get("/nope").status, 404);
}

#[test]
fn metrics_expose_controller_and_pool_gauges() {
    let server = FakeServer::start(&vllm_metrics(5, 3, 0.5));
    let refused = closed_port();
    let dir = temp_dir("metrics");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", server.port), ("down", refused)]);
    let controller = Controller::start(&["--endpoints-file", file.to_str().unwrap()]);
    controller.wait_for_snapshot("a scraped", |s| {
        endpoint(s, "test/a").is_some_and(|e| e["metrics"]["waiting_queue_size"] == 5)
    });
    let version = controller.snapshot_get("/v1/snapshot").version.unwrap();
    let reply = controller.admin_get("/metrics");
    assert_eq!(reply.status, 200);
    let text = reply.body;
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(value("wasm_epp_controller_snapshot_version ") >= version as f64);
    assert_eq!(value("wasm_epp_controller_endpoints "), 2.0);
    assert!(value("wasm_epp_controller_scrapes_total{result=\"success\"}") >= 1.0);
    assert!(value("wasm_epp_controller_scrapes_total{result=\"error\"}") >= 1.0);
    assert!(value("wasm_epp_controller_snapshot_requests_total{kind=\"immediate\"}") >= 1.0);
    assert!(value("wasm_epp_controller_snapshot_requests_total{kind=\"long_poll\"}") >= 0.0);
    assert!(value("wasm_epp_controller_snapshot_requests_total{kind=\"not_modified\"}") >= 0.0);
    assert_eq!(value("llm_d_epp_ready_endpoints "), 1.0);
    assert_eq!(value("llm_d_epp_average_queue_size "), 5.0);
    assert_eq!(value("llm_d_epp_average_running_requests "), 3.0);
    assert_eq!(value("llm_d_epp_average_kv_cache_utilization "), 0.5);
    assert_eq!(
        value(&format!(
            "llm_d_epp_per_endpoint_queue_size{{model_server_endpoint=\"127.0.0.1:{}\",name=\"test/a\"}}",
            server.port
        )),
        5.0
    );
    assert!(
        value("llm_d_epp_datalayer_poll_errors_total{source_type=\"metrics-data-source\"}") >= 1.0
    );
}
