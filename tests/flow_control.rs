//! Flow control through the real Envoy and controller: while the pool is saturated requests
//! wait inside Envoy, and are released highest priority first as capacity frees; a full band
//! answers 429 at once, a wait past its TTL 429, and a client that goes away leaves nothing
//! behind. The simulators' load is pinned through their metrics override (a real server's
//! queue cannot be set on demand). Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const CONFIG: &str = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- name: limit
  type: static-usage-limit-policy
  parameters: {threshold: 0.9}
- type: file-discovery
  parameters: {path: \"{ENDPOINTS}\"}
flowControl:
  defaultRequestTTL: 2s
  usageLimitPolicyPluginRef: limit
  priorityBands:
  - {priority: 0, maxRequests: 3}
dataLayer:
  discovery: {pluginRef: file-discovery}
";

const MANIFESTS: &str = "\
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: e2e}
spec: {priority: 5, poolRef: {name: pool}}
";

/// Every simulator reports `waiting` requests in its queue; waits until the filter has seen it
/// (its queue scores show in the decision header).
fn load(fleet: &Fleet, waiting: u64) {
    for sim in &fleet.sims {
        sim.report_load(waiting, 0.0);
    }
    // Metrics are stale after 200 ms without a scrape and count as saturated: give the
    // controller two scrapes.
    thread::sleep(Duration::from_millis(4 * INTERVAL_MS));
}

fn queued(fleet: &Fleet, priority: &str) -> f64 {
    prometheus_sample(
        &fleet.envoy.prometheus(),
        "llm_d_epp_flow_control_queue_size",
        &[("priority", priority)],
    )
    .unwrap_or(0.0)
}

fn wait_queued(fleet: &Fleet, priority: &str, n: f64) {
    assert!(
        wait_until(Duration::from_secs(5), || queued(fleet, priority) == n),
        "priority {priority}: {} waiting, expected {n}",
        queued(fleet, priority)
    );
}

fn outcomes(fleet: &Fleet, priority: &str, outcome: &str) -> f64 {
    prometheus_sample(
        &fleet.envoy.prometheus(),
        "llm_d_epp_flow_control_requests_total",
        &[("priority", priority), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

#[test]
fn requests_wait_while_saturated_and_leave_by_priority() {
    scenario(1);
}

/// With two workers the requests land on either; a worker holds its standard band while the
/// other has critical requests waiting, and the band's limit counts both workers' waits.
#[test]
fn priority_and_limits_hold_across_workers() {
    scenario(2);
}

fn scenario(workers: u32) {
    // Each request takes a third of a second, so releases one at a time finish in order.
    let slow: &[&str] = &["--ttft-base-ms", "300"];
    let fleet = fleet_from(
        &format!("flow-control-{workers}"),
        FleetSpec {
            sims: &[("a", slow), ("b", slow)],
            config: Some(CONFIG),
            manifests: Some(MANIFESTS),
            concurrency: workers,
            ..FleetSpec::default()
        },
    );
    fleet.envoy.wait_for_snapshot();

    // Saturated (10 waiting per server, twice the threshold): requests wait in Envoy.
    load(&fleet, 10);
    let (done, finished) = mpsc::channel::<(String, u16)>();
    let send = |name: &str, objective: &str| {
        let url = fleet.envoy.url("/v1/completions");
        let done = done.clone();
        let name = name.to_string();
        let objective = objective.to_string();
        thread::spawn(move || {
            let reply = post(
                &url,
                &completion(&unique(&name)),
                &[("x-llm-d-inference-objective", &objective)],
            );
            let _ = done.send((name, reply.status));
        });
    };
    for (i, name) in ["s1", "s2", "s3"].iter().enumerate() {
        send(name, "standard");
        wait_queued(&fleet, "0", (i + 1) as f64);
    }
    for (i, name) in ["c1", "c2"].iter().enumerate() {
        send(name, "critical");
        wait_queued(&fleet, "5", (i + 1) as f64);
    }
    // The band of priority 0 holds three: a fourth is turned away at once.
    let full = fleet.envoy.complete("one too many", &[]);
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(
        full.header("x-llm-d-request-dropped-reason"),
        Some("rejected-saturated")
    );
    assert_eq!(
        full.body,
        "inference error: ResourceExhausted - request rejected pre-queue: queue at capacity"
    );
    assert!(
        finished.recv_timeout(Duration::from_millis(500)).is_err(),
        "a request left the queue while the pool was saturated"
    );

    // Room for one at a time (saturation 0.8, ceiling 0.9, each release adds 0.1 until the
    // metrics see it): the critical band first, then the standard one, oldest first.
    load(&fleet, 4);
    let order: Vec<(String, u16)> = (0..5)
        .map(|_| {
            finished
                .recv_timeout(Duration::from_secs(10))
                .expect("a waiting request was never released")
        })
        .collect();
    assert!(order.iter().all(|(_, status)| *status == 200), "{order:?}");
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    if workers == 1 {
        assert_eq!(names, ["c1", "c2", "s1", "s2", "s3"]);
    } else {
        // Each worker releases one request per metrics refresh, its own oldest of the highest
        // band while no other worker has a higher one waiting: a critical request leaves
        // first, but one worker's standard request may leave with the other's last critical
        // one and finish before it.
        assert!(names[0].starts_with('c'), "{names:?}");
        assert!(names[4].starts_with('s'), "{names:?}");
    }
    assert_eq!(queued(&fleet, "0") + queued(&fleet, "5"), 0.0);
    assert_eq!(outcomes(&fleet, "5", "Dispatched"), 2.0);
    assert_eq!(outcomes(&fleet, "0", "Dispatched"), 3.0);
    assert_eq!(outcomes(&fleet, "0", "RejectedCapacity"), 1.0);

    // Saturated again: a wait past its TTL (2 s) is answered, the client that gives up first
    // leaves the queue.
    load(&fleet, 10);
    let started = Instant::now();
    let expired = fleet.envoy.complete("too late", &[]);
    let waited = started.elapsed();
    assert_eq!(expired.status, 429, "{}", expired.body);
    assert_eq!(
        expired.header("x-llm-d-request-dropped-reason"),
        Some("rejected-ttl-expired"),
        "{} after {waited:?}",
        expired.body
    );
    assert_eq!(
        expired.body,
        "inference error: ResourceExhausted - request timed out in queue: request evicted from queue: request TTL expired"
    );
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(outcomes(&fleet, "0", "EvictedTTL"), 1.0);

    let impatient = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(500)))
        .build();
    let agent: ureq::Agent = impatient.into();
    let gone = agent
        .post(&fleet.envoy.url("/v1/completions"))
        .header("content-type", "application/json")
        .send(completion("gives up"));
    assert!(gone.is_err(), "the client should have timed out");
    assert!(
        wait_until(Duration::from_secs(5), || outcomes(
            &fleet,
            "0",
            "EvictedContextCancelled"
        ) == 1.0),
        "the abandoned request was not removed"
    );
    assert_eq!(queued(&fleet, "0"), 0.0);

    // Room again: requests go straight through.
    load(&fleet, 0);
    let reply = fleet.envoy.complete("straight through", &[]);
    assert_eq!(reply.status, 200, "{}", reply.body);
}

const SHORTEST_FIRST: &str = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
- type: file-discovery
  parameters: {path: \"{ENDPOINTS}\"}
flowControl:
  defaultRequestTTL: 20s
  defaultPriorityBand: {orderingPolicyRef: shortest-job-first-ordering-policy}
dataLayer:
  discovery: {pluginRef: file-discovery}
";

/// With the `concurrency-detector` the pool is full as soon as this proxy has
/// `maxConcurrency` requests in flight per server, whatever the servers last reported; the
/// requests beyond wait in Envoy, and a `shortest-job-first-ordering-policy` band releases the
/// one that would finish first had it started on arrival: sent a few milliseconds apart, the
/// one asking for the fewest output tokens (at 25 ms or more per token). First come, first
/// served would release them in the order sent.
#[test]
fn in_flight_requests_fill_the_pool_and_the_shortest_job_goes_first() {
    let slow: &[&str] = &["--ttft-base-ms", "400", "--itl-ms", "25"];
    let fleet = fleet_from(
        "flow-control-sjf",
        FleetSpec {
            sims: &[("a", slow)],
            config: Some(SHORTEST_FIRST),
            ..FleetSpec::default()
        },
    );
    fleet.envoy.wait_for_snapshot();
    let (done, finished) = mpsc::channel::<(String, u16)>();
    let send = |name: &str, max_tokens: u32| {
        let url = fleet.envoy.url("/v1/completions");
        let done = done.clone();
        let name = name.to_string();
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": unique(&name),
            "max_tokens": max_tokens,
        })
        .to_string();
        thread::spawn(move || {
            let reply = post(&url, &body, &[]);
            let _ = done.send((name, reply.status));
        });
    };
    // The first takes the server's one slot (the scraped metrics still say idle).
    send("first", 1);
    thread::sleep(Duration::from_millis(100));
    for (i, (name, max_tokens)) in [("long", 40), ("medium", 20), ("short", 2)]
        .into_iter()
        .enumerate()
    {
        send(name, max_tokens);
        wait_queued(&fleet, "0", (i + 1) as f64);
    }
    let names: Vec<String> = (0..4)
        .map(|_| {
            let (name, status) = finished
                .recv_timeout(Duration::from_secs(20))
                .expect("a waiting request was never released");
            assert_eq!(status, 200, "{name}");
            name
        })
        .collect();
    assert_eq!(names, ["first", "short", "medium", "long"]);
    assert_eq!(outcomes(&fleet, "0", "Dispatched"), 3.0);
    assert_eq!(queued(&fleet, "0"), 0.0);
}
