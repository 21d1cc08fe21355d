//! EDS over REST-JSON (`POST /v3/discovery:endpoints`): the real `wasm-epp-controller` binary
//! against fake model servers on 127.0.0.1, asked the way Envoy's REST subscription asks.

#[allow(dead_code)]
#[path = "controller/common.rs"]
mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{temp_dir, vllm_metrics, write_endpoints, Controller, FakeServer};
use serde_json::{json, Value};

const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// POSTs `body` to the controller's EDS path: (status, body text).
fn post_eds(controller: &Controller, body: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent
        .post(&format!(
            "http://{}/v3/discovery:endpoints",
            controller.snapshot_addr
        ))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    let mut text = String::new();
    response
        .body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .unwrap();
    (response.status().as_u16(), text)
}

/// A DiscoveryRequest as Envoy sends it (its node has many more fields, all ignored).
fn envoy_request(version_info: &str) -> String {
    json!({
        "version_info": version_info,
        "node": {
            "id": "wasm-epp-envoy",
            "cluster": "wasm-epp",
            "user_agent_name": "envoy",
            "user_agent_build_version": {"version": {"major_number": 1, "minor_number": 40}},
            "extensions": [{"name": "envoy.load_balancing_policies.override_host"}],
        },
        "resource_names": ["inference_pool"],
        "type_url": TYPE_URL,
    })
    .to_string()
}

/// `ip:port` of every lb_endpoint of the first resource.
fn members(response: &Value) -> Vec<String> {
    let mut members: Vec<String> = response["resources"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|locality| locality["lb_endpoints"].as_array().unwrap())
        .map(|lb| {
            let address = &lb["endpoint"]["address"]["socket_address"];
            format!(
                "{}:{}",
                address["address"].as_str().unwrap(),
                address["port_value"]
            )
        })
        .collect();
    members.sort();
    members
}

#[test]
fn eds_serves_the_pool_membership_and_304_for_the_current_version() {
    let a = FakeServer::start(&vllm_metrics(1, 0, 0.1));
    let b = FakeServer::start(&vllm_metrics(2, 0, 0.2));
    let dir = temp_dir("eds");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", a.port)]);
    let controller = Controller::start(&[
        "--endpoints-file",
        file.to_str().unwrap(),
        "--refresh-metrics-interval",
        "20ms",
    ]);

    let (status, text) = post_eds(&controller, &envoy_request(""));
    assert_eq!(status, 200, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["type_url"], TYPE_URL);
    let resource = &response["resources"][0];
    assert_eq!(resource["@type"], TYPE_URL);
    assert_eq!(resource["cluster_name"], "inference_pool");
    assert_eq!(members(&response), [format!("127.0.0.1:{}", a.port)]);
    let version = response["version_info"].as_str().unwrap().to_string();
    assert!(!version.is_empty());

    // Scrapes keep publishing snapshots; the membership, and so the version, stays.
    let snapshot_version = controller.snapshot()["version"].as_u64().unwrap();
    controller.wait_for_snapshot("a newer snapshot", |s| {
        s["version"].as_u64().unwrap() > snapshot_version
    });
    let (status, text) = post_eds(&controller, &envoy_request(&version));
    assert_eq!((status, text.as_str()), (304, ""));

    // A new member changes the version; the next poll gets it.
    write_endpoints(&file, &[("a", a.port), ("b", b.port)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let updated = loop {
        let (status, text) = post_eds(&controller, &envoy_request(&version));
        if status == 200 {
            break serde_json::from_str::<Value>(&text).unwrap();
        }
        assert_eq!(status, 304, "{text}");
        assert!(Instant::now() < deadline, "membership never changed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(updated["version_info"], version.as_str());
    let mut expected = vec![
        format!("127.0.0.1:{}", a.port),
        format!("127.0.0.1:{}", b.port),
    ];
    expected.sort();
    assert_eq!(members(&updated), expected);

    // No resource names: the default cluster name. Garbage: 400. GET: 405.
    let (status, text) = post_eds(&controller, "{}");
    assert_eq!(status, 200);
    let default: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(default["resources"][0]["cluster_name"], "inference_pool");
    let (status, _) = post_eds(&controller, "{\"resource_names\": 3}");
    assert_eq!(status, 400);
    let reply = controller.snapshot_get("/v3/discovery:endpoints");
    assert_eq!(reply.status, 405);
}
