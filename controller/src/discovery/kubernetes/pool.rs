//! The InferencePool and its Pods, and the pure mapping from the two to endpoints.
//!
//! A pod is part of the pool when it is in the pool's namespace, carries every label of
//! `spec.selector.matchLabels`, has the condition `Ready=True`, a `status.podIP` and no
//! `deletionTimestamp`. Each `spec.targetPorts[i]` gives one endpoint `podIP:port` named
//! `<namespace>/<pod>-rank-<i>`, as upstream names its data-parallel ranks. The pod annotation
//! `llm-d.ai/active-ports` (or the older `inference.networking.k8s.io/active-ports`), a comma
//! list of port numbers, limits a pod to those of the target ports it lists.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use wasm_epp::snapshot::{Endpoint, Metrics};

/// The pod annotation listing a pod's active target ports.
pub const ACTIVE_PORTS_ANNOTATION: &str = "llm-d.ai/active-ports";

/// The older name of [`ACTIVE_PORTS_ANNOTATION`], read when the new one is absent.
pub const LEGACY_ACTIVE_PORTS_ANNOTATION: &str = "inference.networking.k8s.io/active-ports";

/// `spec` of an `inference.networking.k8s.io/v1` InferencePool: only the fields discovery
/// reads (the others, such as `endpointPickerRef`, are ignored). The CRD is installed by the
/// Gateway API Inference Extension, not by this controller, hence no schema.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    plural = "inferencepools",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Which pods of the namespace belong to the pool.
    #[serde(default)]
    pub selector: Selector,
    /// The model-server ports of each pod; one endpoint per port.
    #[serde(default)]
    pub target_ports: Vec<TargetPort>,
}

/// `spec.selector`: labels only, as the CRD allows.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Every label a member pod must carry, with this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One entry of `spec.targetPorts`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
pub struct TargetPort {
    /// The port number (the CRD allows 1..65535).
    pub number: i32,
}

/// What discovery uses of a pool: its selector and its valid target ports, in rank order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    /// `spec.selector.matchLabels`.
    pub match_labels: BTreeMap<String, String>,
    /// `spec.targetPorts[*].number`; entries outside 1..65535 are left out, and the rank of
    /// each remaining port is still its index in the spec.
    pub target_ports: Vec<(usize, u16)>,
}

impl Pool {
    /// The parts of `pool` that discovery uses.
    pub fn of(pool: &InferencePool) -> Pool {
        Pool {
            match_labels: pool.spec.selector.match_labels.clone(),
            target_ports: pool
                .spec
                .target_ports
                .iter()
                .enumerate()
                .filter_map(|(rank, port)| {
                    u16::try_from(port.number)
                        .ok()
                        .filter(|p| *p != 0)
                        .map(|p| (rank, p))
                })
                .collect(),
        }
    }

    /// `app=vllm,tier=gpu`, for log lines.
    pub fn selector_text(&self) -> String {
        let pairs: Vec<String> = self
            .match_labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        pairs.join(",")
    }

    /// The target ports in rank order, for log lines.
    pub fn ports(&self) -> Vec<u16> {
        self.target_ports.iter().map(|(_, port)| *port).collect()
    }

    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }
}

/// What discovery keeps of a Pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `status.podIP`, if set and valid.
    pub ip: Option<IpAddr>,
    /// Condition `Ready=True` and no `deletionTimestamp`.
    pub ready: bool,
    /// The active-ports annotation, if the pod has one.
    pub active_ports: Option<String>,
}

impl PodInfo {
    /// The parts of `pod` that discovery uses.
    pub fn of(pod: &Pod) -> PodInfo {
        let metadata = &pod.metadata;
        let status = pod.status.as_ref();
        let condition_ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let annotations = metadata.annotations.as_ref();
        PodInfo {
            name: metadata.name.clone().unwrap_or_default(),
            labels: metadata.labels.clone().unwrap_or_default(),
            ip: status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            ready: condition_ready && metadata.deletion_timestamp.is_none(),
            active_ports: annotations
                .and_then(|a| {
                    a.get(ACTIVE_PORTS_ANNOTATION)
                        .or_else(|| a.get(LEGACY_ACTIVE_PORTS_ANNOTATION))
                })
                .cloned(),
        }
    }

    /// Whether the annotation (if any) lets the pod serve on `port`.
    fn is_active(&self, port: u16) -> bool {
        match &self.active_ports {
            None => true,
            Some(list) => list
                .split(',')
                .any(|item| item.trim().parse::<u16>() == Ok(port)),
        }
    }
}

/// The endpoints of `pool` among `pods` (all in `namespace`): member pods in the order given,
/// each with one endpoint per active target port, labelled with the pod's labels.
pub fn endpoints<'p>(
    namespace: &str,
    pool: &Pool,
    pods: impl IntoIterator<Item = &'p PodInfo>,
) -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    for pod in pods {
        let Some(ip) = pod.ip.filter(|_| pod.ready && pool.selects(&pod.labels)) else {
            continue;
        };
        for &(rank, port) in &pool.target_ports {
            if !pod.is_active(port) {
                continue;
            }
            endpoints.push(Endpoint {
                name: format!("{namespace}/{}-rank-{rank}", pod.name),
                address: ip.to_string(),
                port,
                ready: true,
                key_cache: Default::default(),
                labels: pod.labels.clone(),
                metrics: Metrics::default(),
            });
        }
    }
    endpoints
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(labels: serde_json::Value, ports: &[i32]) -> Pool {
        let ports: Vec<_> = ports.iter().map(|p| json!({"number": p})).collect();
        let pool: InferencePool = serde_json::from_value(json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "llm"},
            "spec": {
                "selector": {"matchLabels": labels},
                "targetPorts": ports,
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}
            }
        }))
        .unwrap();
        Pool::of(&pool)
    }

    fn pod(name: &str, labels: serde_json::Value, ready: &str, ip: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "llm", "labels": labels},
            "status": {
                "podIP": ip,
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": ready}
                ]
            }
        }))
        .unwrap()
    }

    fn names(endpoints: &[Endpoint]) -> Vec<String> {
        endpoints
            .iter()
            .map(|e| format!("{} {}", e.name, e.host_port()))
            .collect()
    }

    #[test]
    fn ready_matching_pods_give_one_endpoint_per_target_port() {
        let pool = pool(json!({"app": "vllm"}), &[8000, 8001]);
        let pods = [
            PodInfo::of(&pod(
                "a",
                json!({"app": "vllm", "role": "decode"}),
                "True",
                Some("10.0.0.1"),
            )),
            PodInfo::of(&pod("b", json!({"app": "vllm"}), "True", Some("fd00::2"))),
        ];
        let endpoints = endpoints("llm", &pool, &pods);
        assert_eq!(
            names(&endpoints),
            [
                "llm/a-rank-0 10.0.0.1:8000",
                "llm/a-rank-1 10.0.0.1:8001",
                "llm/b-rank-0 [fd00::2]:8000",
                "llm/b-rank-1 [fd00::2]:8001",
            ]
        );
        assert_eq!(
            endpoints[0].labels.get("role").map(String::as_str),
            Some("decode"),
            "endpoints carry the pod's labels"
        );
        assert_eq!(endpoints[0].metrics, Metrics::default());
    }

    #[test]
    fn unready_unselected_deleting_and_addressless_pods_are_left_out() {
        let pool = pool(json!({"app": "vllm", "tier": "gpu"}), &[8000]);
        let member = json!({"app": "vllm", "tier": "gpu"});
        let mut deleting = pod("deleting", member.clone(), "True", Some("10.0.0.4"));
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
        let mut no_conditions = pod("no-conditions", member.clone(), "True", Some("10.0.0.6"));
        no_conditions.status.as_mut().unwrap().conditions = None;
        let pods: Vec<PodInfo> = [
            pod("ok", member.clone(), "True", Some("10.0.0.1")),
            pod("unready", member.clone(), "False", Some("10.0.0.2")),
            pod(
                "partial-labels",
                json!({"app": "vllm"}),
                "True",
                Some("10.0.0.3"),
            ),
            deleting,
            pod("no-ip", member.clone(), "True", None),
            pod("bad-ip", member.clone(), "True", Some("not-an-ip")),
            no_conditions,
            pod(
                "other-value",
                json!({"app": "vllm", "tier": "cpu"}),
                "True",
                Some("10.0.0.7"),
            ),
        ]
        .iter()
        .map(PodInfo::of)
        .collect();
        assert_eq!(
            names(&endpoints("llm", &pool, &pods)),
            ["llm/ok-rank-0 10.0.0.1:8000"]
        );
    }

    #[test]
    fn a_selector_or_port_change_changes_the_endpoints() {
        let pods: Vec<PodInfo> = [
            pod("a", json!({"app": "one"}), "True", Some("10.0.0.1")),
            pod("b", json!({"app": "two"}), "True", Some("10.0.0.2")),
        ]
        .iter()
        .map(PodInfo::of)
        .collect();
        let one = endpoints("llm", &pool(json!({"app": "one"}), &[8000]), &pods);
        assert_eq!(names(&one), ["llm/a-rank-0 10.0.0.1:8000"]);
        let two = endpoints("llm", &pool(json!({"app": "two"}), &[9000, 9001]), &pods);
        assert_eq!(
            names(&two),
            ["llm/b-rank-0 10.0.0.2:9000", "llm/b-rank-1 10.0.0.2:9001"]
        );
    }

    #[test]
    fn active_ports_annotation_limits_the_ranks() {
        let pool = pool(json!({"app": "vllm"}), &[8000, 8001, 8002]);
        let mut new = pod("new", json!({"app": "vllm"}), "True", Some("10.0.0.1"));
        new.metadata.annotations = Some(
            [(
                ACTIVE_PORTS_ANNOTATION.to_string(),
                " 8002, 8000 ,junk,9999".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        let mut legacy = pod("legacy", json!({"app": "vllm"}), "True", Some("10.0.0.2"));
        legacy.metadata.annotations = Some(
            [(
                LEGACY_ACTIVE_PORTS_ANNOTATION.to_string(),
                "8001".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        let pods = [PodInfo::of(&new), PodInfo::of(&legacy)];
        assert_eq!(
            names(&endpoints("llm", &pool, &pods)),
            [
                "llm/new-rank-0 10.0.0.1:8000",
                "llm/new-rank-2 10.0.0.1:8002",
                "llm/legacy-rank-1 10.0.0.2:8001",
            ]
        );
    }

    #[test]
    fn invalid_target_ports_are_skipped_and_keep_the_ranks_of_the_rest() {
        let pool = pool(json!({"app": "vllm"}), &[0, 8001, 70000]);
        assert_eq!(pool.target_ports, [(1, 8001)]);
        assert_eq!(pool.selector_text(), "app=vllm");
        let pods = [PodInfo::of(&pod(
            "a",
            json!({"app": "vllm"}),
            "True",
            Some("10.0.0.1"),
        ))];
        assert_eq!(
            names(&endpoints("llm", &pool, &pods)),
            ["llm/a-rank-1 10.0.0.1:8001"]
        );
    }
}
