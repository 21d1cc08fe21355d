//! The Kubernetes objects and snapshot checks shared by the tests against the fake API server
//! ([`crate::kubernetes`]) and against the real one ([`crate::apiserver`]).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::Controller;

/// The pool's namespace.
pub const NS: &str = "llm";

/// The pool the controller serves.
pub const POOL: &str = "pool";

/// How long a change may take to reach the snapshot. Changes normally take milliseconds; this
/// leaves room for a loaded machine.
pub const WAIT: Duration = Duration::from_secs(5);

/// An `inference.networking.k8s.io/v1` InferencePool in [`NS`].
pub fn pool(name: &str, match_labels: Value, ports: &[u16]) -> Value {
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
pub fn pod(name: &str, labels: Value, ip: &str, ready: bool) -> Value {
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
pub fn vllm_pod(name: &str, ip: &str) -> Value {
    pod(name, json!({"app": "vllm"}), ip, true)
}

/// An InferenceObjective of `api_version` for `pool_ref`.
pub fn objective(api_version: &str, name: &str, priority: i32, pool_ref: &str) -> Value {
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
pub fn rewrite(api_version: &str, name: &str, created: &str, from: &str, to: &str) -> Value {
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
pub fn endpoint(pod: &str, rank: usize, ip: &str, port: u16) -> String {
    format!("{NS}/{pod}-rank-{rank} {ip}:{port}")
}

/// A snapshot's endpoints as `name address:port`, sorted.
pub fn endpoints(snapshot: &Value) -> Vec<String> {
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
pub fn wait_endpoints(
    controller: &Controller,
    what: &str,
    expected: &[String],
) -> (Value, Duration) {
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

/// Starts the controller for [`POOL`] in [`NS`] with `kubeconfig`.
pub fn start_pool_controller(kubeconfig: &Path) -> Controller {
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
