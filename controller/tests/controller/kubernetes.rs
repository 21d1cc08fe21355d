//! Kubernetes discovery end to end: the real controller (`--pool-name`, `--kubeconfig`) against
//! the in-process fake API server of [`crate::fake_apiserver`], no cluster needed.
//!
//! Pod IPs are loopback addresses (127.0.0.2, 127.0.0.3, …): the controller scrapes every
//! endpoint, and a scrape that fails does not remove an endpoint from the snapshot, so only the
//! first test runs a metrics server (to show that discovered pods are scraped).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{closed_port, temp_dir, vllm_metrics, Controller, FakeServer};
use crate::fake_apiserver::{
    FakeApiServer, Recorded, DEPRECATED_OBJECTIVES, DEPRECATED_REWRITES, OBJECTIVES, PODS, POOLS,
    REWRITES,
};

/// The pool's namespace.
const NS: &str = "llm";

/// The pool the controller serves.
const POOL: &str = "pool";

/// How long a change may take to reach the snapshot. Changes normally take milliseconds; this
/// leaves room for a loaded machine.
const WAIT: Duration = Duration::from_secs(5);

/// An `inference.networking.k8s.io/v1` InferencePool in [`NS`].
fn pool(name: &str, match_labels: Value, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": match_labels},
            "targetPorts": ports,
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    })
}

/// A running Pod in [`NS`] at `ip`, with the condition `Ready` as given.
fn pod(name: &str, labels: Value, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": if ready { "True" } else { "False" }},
            ],
        },
    })
}

/// A ready pod labelled `app: vllm`.
fn vllm_pod(name: &str, ip: &str) -> Value {
    pod(name, json!({"app": "vllm"}), ip, true)
}

/// An InferenceObjective of `api_version` for `pool_ref`.
fn objective(api_version: &str, name: &str, priority: i32, pool_ref: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "priority": priority,
            "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool_ref},
        },
        "status": {"conditions": [{"type": "Accepted", "status": "True"}]},
    })
}

/// An InferenceModelRewrite of `api_version` for [`POOL`], rewriting `from` to `to`.
fn rewrite(api_version: &str, name: &str, created: &str, from: &str, to: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": created},
        "spec": {
            "poolRef": {"name": POOL},
            "rules": [{
                "matches": [{"model": {"type": "Exact", "value": from}}],
                "targets": [{"modelRewrite": to, "weight": 100}],
            }],
        },
    })
}

/// The snapshot entry `<ns>/<pod>-rank-<rank> <ip>:<port>`.
fn endpoint(pod: &str, rank: usize, ip: &str, port: u16) -> String {
    format!("{NS}/{pod}-rank-{rank} {ip}:{port}")
}

/// A snapshot's endpoints as `name address:port`, sorted.
fn endpoints(snapshot: &Value) -> Vec<String> {
    let mut list: Vec<String> = snapshot["endpoints"]
        .as_array()
        .map(|endpoints| {
            endpoints
                .iter()
                .map(|e| {
                    format!(
                        "{} {}:{}",
                        e["name"].as_str().unwrap_or("?"),
                        e["address"].as_str().unwrap_or("?"),
                        e["port"]
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    list.sort();
    list
}

/// Waits up to [`WAIT`] for the snapshot's endpoints to be exactly `expected` (in any order);
/// returns the snapshot and how long it took.
fn wait_endpoints(controller: &Controller, what: &str, expected: &[String]) -> (Value, Duration) {
    let mut expected = expected.to_vec();
    expected.sort();
    let started = Instant::now();
    let snapshot = controller.wait_for_snapshot_within(
        &format!("{what} (endpoints {expected:?})"),
        WAIT,
        |s| endpoints(s) == expected,
    );
    (snapshot, started.elapsed())
}

/// Starts the controller for [`POOL`] in [`NS`] against `fake`.
fn start_controller(fake: &FakeApiServer, test: &str) -> Controller {
    let dir = temp_dir(test);
    let kubeconfig = fake.write_kubeconfig(&dir, NS);
    Controller::start(&[
        "--pool-name",
        POOL,
        "--pool-namespace",
        NS,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--refresh-metrics-interval",
        "100ms",
    ])
}

/// Two distinct ports with nothing listening on them (most likely).
fn two_ports() -> (u16, u16) {
    let first = closed_port();
    (first, first.checked_add(1).unwrap_or(first - 1))
}

/// The requests the fake answered that `which` accepts.
fn count(fake: &FakeApiServer, which: impl Fn(&Recorded) -> bool) -> usize {
    fake.requests().iter().filter(|r| which(r)).count()
}

#[test]
fn ready_matching_pods_are_the_endpoints() {
    // Pod `a` runs a metrics server, so the test also sees a discovered pod being scraped.
    let metrics = FakeServer::start_at("127.0.0.2:0", &vllm_metrics(3, 1, 0.5));
    let port = metrics.port;
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[port]));
    // Another pool of the namespace, selecting the pod that ours does not: the controller must
    // watch its own pool only.
    fake.put(pool("other", json!({"app": "other"}), &[port]));
    fake.put(pod(
        "a",
        json!({"app": "vllm", "role": "decode"}),
        "127.0.0.2",
        true,
    ));
    fake.put(vllm_pod("b", "127.0.0.3"));
    fake.put(pod("stranger", json!({"app": "other"}), "127.0.0.4", true));
    fake.put(pod("unready", json!({"app": "vllm"}), "127.0.0.5", false));
    // Ready but without a pod IP: no address to give.
    let mut pending = vllm_pod("pending", "127.0.0.6");
    pending["status"] =
        json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "True"}]});
    fake.put(pending);

    let controller = start_controller(&fake, "k8s-ready-pods");
    let (snapshot, _) = wait_endpoints(
        &controller,
        "the ready matching pods",
        &[
            endpoint("a", 0, "127.0.0.2", port),
            endpoint("b", 0, "127.0.0.3", port),
        ],
    );
    let a = snapshot["endpoints"]
        .as_array()
        .and_then(|list| list.iter().find(|e| e["name"] == "llm/a-rank-0"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        a["labels"],
        json!({"app": "vllm", "role": "decode"}),
        "an endpoint carries its pod's labels"
    );
    controller.wait_for_snapshot_within("pod a scraped", WAIT, |s| {
        s["endpoints"].as_array().is_some_and(|list| {
            list.iter()
                .any(|e| e["name"] == "llm/a-rank-0" && e["metrics"]["waiting_queue_size"] == 3)
        })
    });
    assert!(metrics.requests() > 0);
    controller.wait_for_log("the pool's selector and ports", WAIT, |line| {
        line.contains(&format!(
            "kubernetes: inferencepool llm/pool: selector app=vllm, target ports [{port}]"
        ))
    });

    // The pool was listed and watched by name only.
    let pool_requests: Vec<Recorded> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == POOLS.path(NS))
        .collect();
    assert!(
        pool_requests.iter().any(|r| r.watch) && pool_requests.iter().any(|r| !r.watch),
        "{pool_requests:?}"
    );
    for request in &pool_requests {
        assert_eq!(
            request.query.get("fieldSelector").map(String::as_str),
            Some("metadata.name=pool"),
            "{request:?}"
        );
    }
}

#[test]
fn pod_changes_are_followed() {
    let port = closed_port();
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[port]));
    fake.put(vllm_pod("a", "127.0.0.2"));
    fake.put(vllm_pod("b", "127.0.0.3"));
    fake.put(vllm_pod("c", "127.0.0.4"));
    let controller = start_controller(&fake, "k8s-pod-changes");
    let (a, b, c, d) = (
        endpoint("a", 0, "127.0.0.2", port),
        endpoint("b", 0, "127.0.0.3", port),
        endpoint("c", 0, "127.0.0.4", port),
        endpoint("d", 0, "127.0.0.5", port),
    );
    wait_endpoints(
        &controller,
        "the three pods",
        &[a.clone(), b.clone(), c.clone()],
    );

    // MODIFIED to Ready=False: removed.
    fake.put(pod("a", json!({"app": "vllm"}), "127.0.0.2", false));
    let (_, unready) = wait_endpoints(&controller, "a unready", &[b.clone(), c.clone()]);

    // DELETED: removed.
    fake.delete("Pod", "b");
    let (_, deleted) = wait_endpoints(&controller, "b deleted", std::slice::from_ref(&c));

    // Terminating (deletionTimestamp set, still Ready=True): removed.
    let mut terminating = vllm_pod("c", "127.0.0.4");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    terminating["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    fake.put(terminating);
    let (_, terminated) = wait_endpoints(&controller, "c terminating", &[]);

    // ADDED, ready: appears.
    fake.put(vllm_pod("d", "127.0.0.5"));
    let (_, added) = wait_endpoints(&controller, "d added", std::slice::from_ref(&d));

    // MODIFIED back to ready: appears again.
    fake.put(vllm_pod("a", "127.0.0.2"));
    let (_, ready_again) = wait_endpoints(&controller, "a ready again", &[a, d]);

    eprintln!(
        "kubernetes: change to snapshot: unready {unready:?}, deleted {deleted:?}, \
         terminating {terminated:?}, new pod {added:?}, ready again {ready_again:?}"
    );
    assert!(
        added < WAIT,
        "a new ready pod took {added:?} to reach the snapshot"
    );
}

#[test]
fn pool_changes_are_followed() {
    let (first, second) = two_ports();
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "one"}), &[first]));
    fake.put(pod("a", json!({"app": "one"}), "127.0.0.2", true));
    fake.put(pod("b", json!({"app": "two"}), "127.0.0.3", true));
    let controller = start_controller(&fake, "k8s-pool-changes");
    wait_endpoints(
        &controller,
        "pod a",
        &[endpoint("a", 0, "127.0.0.2", first)],
    );

    fake.put(pool(POOL, json!({"app": "two"}), &[first]));
    wait_endpoints(
        &controller,
        "pod b after the selector change",
        &[endpoint("b", 0, "127.0.0.3", first)],
    );

    fake.put(pool(POOL, json!({"app": "two"}), &[second]));
    wait_endpoints(
        &controller,
        "pod b on the new port",
        &[endpoint("b", 0, "127.0.0.3", second)],
    );
    controller.wait_for_log("the new pool logged", WAIT, |line| {
        line.contains(&format!(
            "inferencepool llm/pool: selector app=two, target ports [{second}]"
        ))
    });
}

#[test]
fn each_target_port_is_an_endpoint_named_by_rank() {
    let (first, second) = two_ports();
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[first, second]));
    fake.put(vllm_pod("a", "127.0.0.2"));
    fake.put(vllm_pod("b", "127.0.0.3"));
    // A pod whose annotation says only its second port serves.
    let mut partial = vllm_pod("c", "127.0.0.4");
    partial["metadata"]["annotations"] = json!({"llm-d.ai/active-ports": second.to_string()});
    fake.put(partial);
    let controller = start_controller(&fake, "k8s-ranks");
    wait_endpoints(
        &controller,
        "one endpoint per pod and target port",
        &[
            endpoint("a", 0, "127.0.0.2", first),
            endpoint("a", 1, "127.0.0.2", second),
            endpoint("b", 0, "127.0.0.3", first),
            endpoint("b", 1, "127.0.0.3", second),
            endpoint("c", 1, "127.0.0.4", second),
        ],
    );
}

#[test]
fn objectives_and_rewrites_of_the_pool_reach_the_snapshot() {
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[8000]));
    fake.put(objective(OBJECTIVES.api_version, "batch", -1, POOL));
    fake.put(objective(OBJECTIVES.api_version, "elsewhere", 9, "other"));
    fake.put(objective(
        DEPRECATED_OBJECTIVES.api_version,
        "legacy",
        3,
        POOL,
    ));
    fake.put(rewrite(
        REWRITES.api_version,
        "canary",
        "2026-02-01T00:00:00Z",
        "llama",
        "llama-v2",
    ));
    let controller = start_controller(&fake, "k8s-objectives");
    let canary = json!({"name": "llm/canary", "rules": [
        {"matches": ["llama"], "targets": [{"model": "llama-v2", "weight": 100}]}]});
    let snapshot = controller.wait_for_snapshot_within("the objectives and rewrite", WAIT, |s| {
        s["objectives"] == json!({"batch": -1, "legacy": 3}) && s["rewrites"] == json!([canary])
    });
    assert_eq!(snapshot["endpoints"], json!([]));
    controller.wait_for_log("the summary", WAIT, |line| {
        line.contains("kubernetes: applied 2 objectives, 1 rewrite (1 for other pools ignored)")
    });

    // Changes while running: MODIFIED, DELETED, and an older rewrite of the deprecated group,
    // which goes first.
    fake.put(objective(OBJECTIVES.api_version, "batch", 5, POOL));
    controller.wait_for_snapshot_within("batch modified", WAIT, |s| {
        s["objectives"] == json!({"batch": 5, "legacy": 3})
    });
    fake.delete_object(&objective(
        DEPRECATED_OBJECTIVES.api_version,
        "legacy",
        3,
        POOL,
    ));
    controller.wait_for_snapshot_within("legacy deleted", WAIT, |s| {
        s["objectives"] == json!({"batch": 5})
    });
    fake.put(rewrite(
        DEPRECATED_REWRITES.api_version,
        "old",
        "2025-01-01T00:00:00Z",
        "llama",
        "llama-v1",
    ));
    let old = json!({"name": "llm/old", "rules": [
        {"matches": ["llama"], "targets": [{"model": "llama-v1", "weight": 100}]}]});
    controller.wait_for_snapshot_within("the deprecated group's rewrite", WAIT, |s| {
        s["rewrites"] == json!([old, canary])
    });
    fake.delete("InferenceModelRewrite", "canary");
    controller.wait_for_snapshot_within("canary deleted", WAIT, |s| s["rewrites"] == json!([old]));
}

#[test]
fn a_group_that_is_not_installed_is_tolerated() {
    // The deprecated group's CRDs are not installed: its lists get 404.
    let fake = FakeApiServer::serving(&[PODS, POOLS, OBJECTIVES, REWRITES]);
    let port = closed_port();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[port]));
    fake.put(vllm_pod("a", "127.0.0.2"));
    fake.put(objective(OBJECTIVES.api_version, "batch", -1, POOL));
    let controller = start_controller(&fake, "k8s-missing-crd");
    let a = endpoint("a", 0, "127.0.0.2", port);
    wait_endpoints(&controller, "pod a", std::slice::from_ref(&a));
    controller.wait_for_snapshot_within("the objective", WAIT, |s| {
        s["objectives"] == json!({"batch": -1})
    });
    for plural in ["inferenceobjectives", "inferencemodelrewrites"] {
        let what = format!("{plural}.inference.networking.x-k8s.io in llm: not found");
        controller.wait_for_log(&what, WAIT, |line| {
            line.contains(&what) && line.contains("is its CRD installed?")
        });
    }
    assert!(
        count(&fake, |r| r.status == 404
            && r.is_list_of(&DEPRECATED_OBJECTIVES, NS))
            > 0
    );

    // Discovery goes on.
    fake.put(vllm_pod("b", "127.0.0.3"));
    wait_endpoints(
        &controller,
        "pod b",
        &[a, endpoint("b", 0, "127.0.0.3", port)],
    );
}

#[test]
fn a_pool_created_later_is_picked_up() {
    let port = closed_port();
    let fake = FakeApiServer::start();
    fake.put(vllm_pod("a", "127.0.0.2"));
    fake.put(vllm_pod("b", "127.0.0.3"));
    let controller = start_controller(&fake, "k8s-pool-later");
    let not_found = "kubernetes: inferencepool llm/pool not found";
    controller.wait_for_log("pool not found", WAIT, |line| line.contains(not_found));
    assert_eq!(endpoints(&controller.snapshot()), Vec::<String>::new());

    let with_pool = [
        endpoint("a", 0, "127.0.0.2", port),
        endpoint("b", 0, "127.0.0.3", port),
    ];
    fake.put(pool(POOL, json!({"app": "vllm"}), &[port]));
    wait_endpoints(&controller, "the pool's pods", &with_pool);

    // And deleted again: no endpoints, logged again.
    fake.delete("InferencePool", POOL);
    wait_endpoints(&controller, "no pool, no endpoints", &[]);
    let deadline = Instant::now() + WAIT;
    while controller
        .log()
        .iter()
        .filter(|line| line.contains(not_found))
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the deleted pool is not logged: {:#?}",
            controller.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn broken_watches_are_resumed() {
    let port = closed_port();
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[port]));
    fake.put(vllm_pod("a", "127.0.0.2"));
    let controller = start_controller(&fake, "k8s-rewatch");
    let (a, b, c, d) = (
        endpoint("a", 0, "127.0.0.2", port),
        endpoint("b", 0, "127.0.0.3", port),
        endpoint("c", 0, "127.0.0.4", port),
        endpoint("d", 0, "127.0.0.5", port),
    );
    wait_endpoints(&controller, "pod a", std::slice::from_ref(&a));
    let pod_watches = |fake: &FakeApiServer| count(fake, |r| r.is_watch_of(&PODS, NS));
    let pod_lists =
        |fake: &FakeApiServer| count(fake, |r| r.is_list_of(&PODS, NS) && r.status == 200);
    // The pod list can reach the snapshot before the watch that follows it is sent.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pod_watches(&fake) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (watches, lists) = (pod_watches(&fake), pod_lists(&fake));
    assert!(
        watches >= 1 && lists >= 1,
        "{watches} watches, {lists} lists"
    );

    // The connection breaks mid-stream; a pod added meanwhile still arrives (the watch resumes
    // from the last resource version seen, and the fake replays what came after).
    fake.reset_watches();
    fake.put(vllm_pod("b", "127.0.0.3"));
    wait_endpoints(
        &controller,
        "b after a broken watch",
        &[a.clone(), b.clone()],
    );
    assert!(
        pod_watches(&fake) > watches,
        "the pods were not watched again"
    );

    // The server ends the watches cleanly (as at their timeoutSeconds).
    let watches = pod_watches(&fake);
    fake.end_watches();
    fake.put(vllm_pod("c", "127.0.0.4"));
    wait_endpoints(
        &controller,
        "c after an ended watch",
        &[a.clone(), b.clone(), c.clone()],
    );
    assert!(
        pod_watches(&fake) > watches,
        "the pods were not watched again"
    );
    assert_eq!(pod_lists(&fake), lists, "a resumed watch needs no new list");

    // An outage during which the history is compacted: the watch cannot resume (410 Expired),
    // so the controller lists again, and sees that `a` went away meanwhile.
    fake.set_available(false);
    let deadline = Instant::now() + WAIT;
    while count(&fake, |r| r.status == 503 && r.path == PODS.path(NS)) == 0 {
        assert!(
            Instant::now() < deadline,
            "the controller did not come back during the outage: {:?}",
            fake.requests()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    fake.delete("Pod", "a");
    fake.put(vllm_pod("d", "127.0.0.5"));
    fake.compact();
    fake.set_available(true);
    wait_endpoints(&controller, "the list after the outage", &[b, c, d]);
    assert!(pod_lists(&fake) > lists, "the pods were not listed again");

    // And it keeps watching.
    fake.delete("Pod", "b");
    fake.delete("Pod", "c");
    wait_endpoints(
        &controller,
        "d alone",
        &[endpoint("d", 0, "127.0.0.5", port)],
    );
}
