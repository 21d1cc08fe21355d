//! The snapshot API: endpoints with metrics, long-polling, versions, config → profile.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{endpoint, temp_dir, vllm_metrics, write_endpoints, Controller, FakeServer};

#[test]
fn the_snapshot_lists_the_endpoints_with_their_metrics() {
    let a = FakeServer::start(&vllm_metrics(3, 5, 0.25));
    let b = FakeServer::start(&vllm_metrics(1, 2, 0.5));
    let dir = temp_dir("lists");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", a.port), ("b", b.port)]);
    let controller = Controller::start(&["--endpoints-file", file.to_str().unwrap()]);

    let snapshot = controller.wait_for_snapshot("both endpoints scraped", |s| {
        ["test/a", "test/b"].iter().all(|name| {
            endpoint(s, name).is_some_and(|e| !e["metrics"]["updated_unix_ms"].is_null())
        })
    });
    let a_json = endpoint(&snapshot, "test/a").unwrap();
    assert_eq!(a_json["address"], "127.0.0.1");
    assert_eq!(a_json["port"], a.port);
    assert_eq!(a_json["labels"]["app"], "fake");
    assert_eq!(a_json["metrics"]["waiting_queue_size"], 3);
    assert_eq!(a_json["metrics"]["running_requests_size"], 5);
    assert_eq!(a_json["metrics"]["kv_cache_usage"], 0.25);
    assert_eq!(a_json["metrics"]["block_size"], 16);
    assert_eq!(a_json["metrics"]["num_gpu_blocks"], 1000);
    let b_json = endpoint(&snapshot, "test/b").unwrap();
    assert_eq!(b_json["metrics"]["waiting_queue_size"], 1);
    assert_eq!(b_json["metrics"]["kv_cache_usage"], 0.5);
    // No config file: the upstream default profile.
    let weights: Vec<f64> = snapshot["profile"]["scorers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["weight"].as_f64().unwrap())
        .collect();
    assert_eq!(weights, [2.0, 2.0, 3.0]);

    let reply = controller.snapshot_get("/v1/snapshot");
    assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(reply.version, body["version"].as_u64());
    // Scrapes reuse keep-alive connections: many requests over very few connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.requests() < 20 {
        assert!(Instant::now() < deadline, "only {} scrapes", a.requests());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        a.connections() <= 2,
        "{} connections for {} requests",
        a.connections(),
        a.requests()
    );
}

#[test]
fn a_metric_change_reaches_a_long_poll_within_a_few_intervals() {
    let server = FakeServer::start(&vllm_metrics(1, 0, 0.1));
    let dir = temp_dir("change");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", server.port)]);
    let controller = Controller::start(&[
        "--endpoints-file",
        file.to_str().unwrap(),
        "--refresh-metrics-interval",
        "50ms",
    ]);
    let before = controller.wait_for_snapshot("the first scrape", |s| {
        endpoint(s, "test/a").is_some_and(|e| e["metrics"]["waiting_queue_size"] == 1)
    });
    let mut version = before["version"].as_u64().unwrap();

    server.set(&vllm_metrics(9, 0, 0.1));
    let changed = Instant::now();
    loop {
        let reply = controller.snapshot_get(&format!("/v1/snapshot?since={version}&wait_ms=2000"));
        assert_eq!(reply.status, 200, "metrics are refreshed every round");
        let snapshot: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        let new_version = snapshot["version"].as_u64().unwrap();
        assert!(
            new_version > version,
            "versions increase: {new_version} after {version}"
        );
        assert_eq!(reply.version, Some(new_version));
        version = new_version;
        if endpoint(&snapshot, "test/a").unwrap()["metrics"]["waiting_queue_size"] == 9 {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(5),
            "change never seen"
        );
    }
    // Nominally two 50 ms intervals; allow for a loaded test machine.
    let took = changed.elapsed();
    assert!(took < Duration::from_millis(1500), "took {took:?}");
}

#[test]
fn a_long_poll_with_nothing_new_answers_304_at_the_deadline() {
    // A pool with no endpoints never changes after startup.
    let dir = temp_dir("not-modified");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[]);
    let controller = Controller::start(&["--endpoints-file", file.to_str().unwrap()]);
    let version = controller.snapshot()["version"].as_u64().unwrap();

    let started = Instant::now();
    let reply = controller.snapshot_get(&format!("/v1/snapshot?since={version}&wait_ms=300"));
    let waited = started.elapsed();
    assert_eq!(reply.status, 304);
    assert!(reply.body.is_empty());
    assert_eq!(reply.version, Some(version));
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");

    let reply =
        controller.snapshot_get(&format!("/v1/snapshot?since={}&wait_ms=5000", version - 1));
    assert_eq!(
        reply.status, 200,
        "an older version gets the snapshot at once"
    );

    assert_eq!(controller.snapshot_get("/v1/other").status, 404);
    assert_eq!(
        controller.snapshot_get("/v1/snapshot?since=abc").status,
        400
    );
}

#[test]
fn the_config_file_sets_the_profile_and_discovery() {
    let server = FakeServer::start(&vllm_metrics(0, 0, 0.0));
    let (controller, _) = start_with_config(
        "config",
        &server,
        "plugins:\n\
         - type: queue-scorer\n\
         - name: picker\n  type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}\n\
         - name: files\n  type: file-discovery\n  parameters: {path: {ENDPOINTS}}\n\
         schedulingProfiles:\n\
         - name: only\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 4\n  - pluginRef: picker\n\
         dataLayer:\n  discovery: {pluginRef: files}\n",
    );
    let snapshot = controller.snapshot();
    let profile = &snapshot["profile"];
    assert_eq!(profile["name"], "only");
    assert_eq!(profile["scorers"].as_array().unwrap().len(), 1);
    assert_eq!(profile["scorers"][0]["name"], "queue-scorer");
    assert_eq!(profile["scorers"][0]["weight"], 4.0);
    assert_eq!(profile["picker"]["type"], "max-score-picker");
    assert_eq!(profile["picker"]["maxNumOfEndpoints"], 2);
    assert!(
        endpoint(&snapshot, "test/a").is_some(),
        "the first snapshot lists the pool"
    );
}

#[test]
fn a_custom_engine_of_the_config_is_scraped_by_its_names() {
    // A server that speaks neither vLLM's nor any built-in engine's names, described by the
    // config's `core-metrics-extractor` and made the default engine.
    let server = FakeServer::start(
        "# TYPE atom:waiting gauge\natom:waiting{model=\"m\"} 6\n\
         atom:running 2\natom:kv 0.4\n\
         atom:cache{block_size=\"32\",num_gpu_blocks=\"77\"} 1\n",
    );
    let (controller, _) = start_with_config(
        "custom-engine",
        &server,
        "plugins:\n\
         - type: file-discovery\n  parameters: {path: {ENDPOINTS}}\n\
         - type: core-metrics-extractor\n  parameters:\n    defaultEngine: atom\n    engineConfigs:\n\
         \x20   - name: atom\n      queuedRequestsSpec: atom:waiting\n      runningRequestsSpec: atom:running\n\
         \x20     kvUsageSpec: atom:kv\n      cacheInfoSpec: atom:cache\n\
         dataLayer:\n  discovery: {pluginRef: file-discovery}\n",
    );
    let snapshot = controller.wait_for_snapshot("the custom engine's metrics", |s| {
        endpoint(s, "test/a").is_some_and(|e| !e["metrics"]["updated_unix_ms"].is_null())
    });
    let metrics = &endpoint(&snapshot, "test/a").unwrap()["metrics"];
    assert_eq!(metrics["waiting_queue_size"], 6);
    assert_eq!(metrics["running_requests_size"], 2);
    assert_eq!(metrics["kv_cache_usage"], 0.4);
    assert_eq!(metrics["block_size"], 32);
    assert_eq!(metrics["num_gpu_blocks"], 77);
}

/// Starts the controller with an EndpointPickerConfig of `body` (what follows its `apiVersion`
/// and `kind`), where `{ENDPOINTS}` is an endpoints file listing `server` as `test/a`; returns
/// it and the directory holding `config.yaml` and `endpoints.yaml`.
fn start_with_config(test: &str, server: &FakeServer, body: &str) -> (Controller, PathBuf) {
    let dir = temp_dir(test);
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", server.port)]);
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{}",
            body.replace("{ENDPOINTS}", &file.display().to_string())
        ),
    )
    .unwrap();
    let controller = Controller::start(&["--config-file", config.to_str().unwrap()]);
    (controller, dir)
}

#[test]
fn a_changed_config_file_is_reloaded_and_a_broken_one_is_not() {
    // The server speaks a custom engine's names, which the first config does not know.
    let server = FakeServer::start("atom:waiting 6\natom:running 2\natom:kv 0.4\n");
    let profile = |weight: u32, extractor: &str| {
        format!(
            "plugins:\n\
             - type: queue-scorer\n\
             - name: files\n  type: file-discovery\n  parameters: {{path: {{ENDPOINTS}}}}\n\
             {extractor}\
             schedulingProfiles:\n- name: only\n  plugins:\n  - pluginRef: queue-scorer\n    weight: {weight}\n\
             dataLayer:\n  discovery: {{pluginRef: files}}\n"
        )
    };
    let (controller, dir) = start_with_config("reload", &server, &profile(4, ""));
    let (config, endpoints) = (dir.join("config.yaml"), dir.join("endpoints.yaml"));
    let weight = |s: &serde_json::Value| s["profile"]["scorers"][0]["weight"].as_f64();
    assert_eq!(weight(&controller.snapshot()), Some(4.0));
    controller.wait_for_log("the unknown names", Duration::from_secs(5), |line| {
        line.contains("no vllm metrics in the response")
    });

    // A new profile and a custom engine: both apply without a restart.
    let write = |body: &str| {
        let text = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{}",
            body.replace("{ENDPOINTS}", &endpoints.display().to_string())
        );
        let staging = config.with_extension("tmp");
        std::fs::write(&staging, text).unwrap();
        std::fs::rename(&staging, &config).unwrap();
    };
    write(&profile(
        7,
        "- type: core-metrics-extractor\n  parameters:\n    defaultEngine: atom\n    engineConfigs:\n\
         \x20   - {name: atom, queuedRequestsSpec: atom:waiting, runningRequestsSpec: atom:running, kvUsageSpec: atom:kv}\n",
    ));
    let snapshot = controller.wait_for_snapshot("the reloaded profile and engine", |s| {
        weight(s) == Some(7.0)
            && endpoint(s, "test/a").is_some_and(|e| e["metrics"]["waiting_queue_size"] == 6)
    });
    assert_eq!(
        endpoint(&snapshot, "test/a").unwrap()["metrics"]["kv_cache_usage"],
        0.4
    );
    controller.wait_for_log("the reload", Duration::from_secs(5), |line| {
        line.contains("config.yaml: reloaded; profile \"only\": queue-scorer×7")
    });

    // A broken file: one line, the running config kept.
    write("plugins:\n- type: no-such-plugin\n");
    controller.wait_for_log("the refusal", Duration::from_secs(5), |line| {
        line.contains("unknown plugin type \"no-such-plugin\"")
            && line.contains("keeping the running config")
    });
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(weight(&controller.snapshot()), Some(7.0));
    let refusals = controller
        .log()
        .iter()
        .filter(|line| line.contains("keeping the running config"))
        .count();
    assert_eq!(refusals, 1, "logged once: {:#?}", controller.log());
}
