//! Kubernetes discovery end to end against a real API server: the real controller
//! (`--pool-name`, `--kubeconfig`) and a real etcd + `kube-apiserver` ([`crate::real_apiserver`]),
//! with the CRDs of `examples/crds/` and the RBAC the examples ship.
//!
//! Pod IPs are loopback addresses (127.0.0.2, 127.0.0.3, …): the controller scrapes every
//! endpoint, and a scrape that fails does not remove an endpoint from the snapshot, so only the
//! first test runs a metrics server (to show that discovered pods are scraped).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{closed_port, temp_dir, vllm_metrics, Controller, FakeServer};
use crate::k8s_fixtures::{
    endpoint, endpoints, objective, pod, pool, rewrite, start_pool_controller, vllm_pod,
    wait_endpoints, NS, POOL, WAIT,
};
use crate::real_apiserver::RealApiServer;

/// The current API group of objectives and rewrites.
const LLM_D: &str = "llm-d.ai/v1alpha2";

/// Their deprecated group, still watched.
const DEPRECATED: &str = "inference.networking.x-k8s.io/v1alpha2";

/// How long the controller may take to come back after the API server restarts: its retry delay
/// doubles from 0.5 s while the server is down.
const RESTART_WAIT: Duration = Duration::from_secs(40);

/// A real API server for `test` with the CRDs installed and the namespace [`NS`] created.
fn server(test: &str, extra: &[&str]) -> RealApiServer {
    let server = RealApiServer::start(test, extra);
    server.install_crds();
    server.put(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    server
}

/// Starts the controller as the API server's administrator.
fn start_admin_controller(server: &RealApiServer, test: &str) -> Controller {
    start_pool_controller(&server.admin_kubeconfig(&temp_dir(test), NS))
}

/// Two distinct ports with nothing listening on them (most likely).
fn two_ports() -> (u16, u16) {
    let first = closed_port();
    (first, first.checked_add(1).unwrap_or(first - 1))
}

/// The CRD of `examples/crds/` for `plural` moved to the deprecated group.
fn deprecated_crd(server: &RealApiServer, plural: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../examples/crds/llm-d.ai_{plural}.yaml"));
    let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    crd["metadata"]["name"] = json!(format!("{plural}.inference.networking.x-k8s.io"));
    crd["spec"]["group"] = json!("inference.networking.x-k8s.io");
    let text = serde_yaml::to_string(&crd).unwrap();
    let dir = temp_dir(&format!("deprecated-{plural}"));
    let file = dir.join("crd.yaml");
    std::fs::write(&file, text).unwrap();
    server.apply_file(file.to_str().unwrap());
}

#[test]
fn ready_pods_times_target_ports_are_the_endpoints() {
    // Pod `a` runs a metrics server, so the test also sees a discovered pod being scraped.
    let metrics = FakeServer::start_at("127.0.0.2:0", &vllm_metrics(3, 1, 0.5));
    let port = metrics.port;
    let second = closed_port();
    let server = server("ready-pods", &[]);
    server.put(&pool(POOL, json!({"app": "vllm"}), &[port, second]));
    // Another pool of the namespace, selecting the pod that ours does not.
    server.put(&pool("other", json!({"app": "other"}), &[port]));
    server.put(&pod(
        "a",
        json!({"app": "vllm", "role": "decode"}),
        "127.0.0.2",
        true,
    ));
    server.put(&vllm_pod("b", "127.0.0.3"));
    // A pod whose annotation says only its second port serves.
    let mut partial = vllm_pod("c", "127.0.0.4");
    partial["metadata"]["annotations"] = json!({"llm-d.ai/active-ports": second.to_string()});
    server.put(&partial);
    server.put(&pod("stranger", json!({"app": "other"}), "127.0.0.5", true));
    server.put(&pod("unready", json!({"app": "vllm"}), "127.0.0.6", false));
    // Ready but without a pod IP: no address to give.
    let mut pending = vllm_pod("pending", "127.0.0.7");
    pending["status"] =
        json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "True"}]});
    server.put(&pending);

    let controller = start_admin_controller(&server, "k8s-real-ready-pods");
    let (snapshot, _) = wait_endpoints(
        &controller,
        "one endpoint per ready matching pod and target port",
        &[
            endpoint("a", 0, "127.0.0.2", port),
            endpoint("a", 1, "127.0.0.2", second),
            endpoint("b", 0, "127.0.0.3", port),
            endpoint("b", 1, "127.0.0.3", second),
            endpoint("c", 1, "127.0.0.4", second),
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
            "kubernetes: inferencepool llm/pool: selector app=vllm, target ports [{port}, {second}]"
        ))
    });
}

#[test]
fn pod_changes_are_followed() {
    let port = closed_port();
    let server = server("pod-changes", &[]);
    server.put(&pool(POOL, json!({"app": "vllm"}), &[port]));
    server.put(&vllm_pod("a", "127.0.0.2"));
    server.put(&vllm_pod("b", "127.0.0.3"));
    // A finalizer keeps `c` in the API while it terminates, as a kubelet would during its grace
    // period.
    let mut held = vllm_pod("c", "127.0.0.4");
    held["metadata"]["finalizers"] = json!(["wasm-epp.test/hold"]);
    server.put(&held);
    let controller = start_admin_controller(&server, "k8s-real-pod-changes");
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

    // Readiness flips to False: removed.
    server.put(&pod("a", json!({"app": "vllm"}), "127.0.0.2", false));
    let (_, unready) = wait_endpoints(&controller, "a unready", &[b.clone(), c.clone()]);

    // Deleted: removed.
    server.delete(&vllm_pod("b", "127.0.0.3"));
    let (_, deleted) = wait_endpoints(&controller, "b deleted", std::slice::from_ref(&c));

    // Terminating (deletionTimestamp set, still Ready=True): removed.
    server.delete(&held);
    let (_, terminated) = wait_endpoints(&controller, "c terminating", &[]);

    // A new ready pod: appears.
    server.put(&vllm_pod("d", "127.0.0.5"));
    let (_, added) = wait_endpoints(&controller, "d added", std::slice::from_ref(&d));

    // Ready again: appears again.
    server.put(&vllm_pod("a", "127.0.0.2"));
    let (_, ready_again) = wait_endpoints(&controller, "a ready again", &[a, d]);

    eprintln!(
        "kubernetes (real API server): change to snapshot: unready {unready:?}, deleted \
         {deleted:?}, terminating {terminated:?}, new pod {added:?}, ready again {ready_again:?}"
    );
}

#[test]
fn pool_selector_and_port_changes_are_followed() {
    let (first, second) = two_ports();
    let server = server("pool-changes", &[]);
    server.put(&pool(POOL, json!({"app": "one"}), &[first]));
    server.put(&pod("a", json!({"app": "one"}), "127.0.0.2", true));
    server.put(&pod("b", json!({"app": "two"}), "127.0.0.3", true));
    let controller = start_admin_controller(&server, "k8s-real-pool-changes");
    wait_endpoints(
        &controller,
        "pod a",
        &[endpoint("a", 0, "127.0.0.2", first)],
    );

    server.put(&pool(POOL, json!({"app": "two"}), &[first]));
    wait_endpoints(
        &controller,
        "pod b after the selector change",
        &[endpoint("b", 0, "127.0.0.3", first)],
    );

    server.put(&pool(POOL, json!({"app": "two"}), &[second]));
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
fn objectives_and_rewrites_follow_their_pool_ref() {
    let server = server("objectives", &[]);
    deprecated_crd(&server, "inferenceobjectives");
    deprecated_crd(&server, "inferencemodelrewrites");
    server.put(&pool(POOL, json!({"app": "vllm"}), &[8000]));
    server.put(&objective(LLM_D, "batch", -1, POOL));
    server.put(&objective(LLM_D, "elsewhere", 9, "other"));
    server.put(&objective(DEPRECATED, "legacy", 3, POOL));
    // Rewrites are ordered by creation time (whole seconds), oldest first: `old`, of the
    // deprecated group, then `canary`.
    server.put(&rewrite(DEPRECATED, "old", "", "llama", "llama-v1"));
    std::thread::sleep(Duration::from_millis(1100));
    server.put(&rewrite(LLM_D, "canary", "", "llama", "llama-v2"));
    let controller = start_admin_controller(&server, "k8s-real-objectives");
    let canary = json!({"name": "llm/canary", "rules": [
        {"matches": ["llama"], "targets": [{"model": "llama-v2", "weight": 100}]}]});
    let old = json!({"name": "llm/old", "rules": [
        {"matches": ["llama"], "targets": [{"model": "llama-v1", "weight": 100}]}]});
    let snapshot = controller.wait_for_snapshot_within("the objectives and rewrites", WAIT, |s| {
        s["objectives"] == json!({"batch": -1, "legacy": 3})
            && s["rewrites"] == json!([old, canary])
    });
    assert_eq!(snapshot["endpoints"], json!([]));
    controller.wait_for_log("the summary", WAIT, |line| {
        line.contains("kubernetes: applied 2 objectives, 2 rewrites (1 for other pools ignored)")
    });

    // Changes while running: modified, moved to another pool, deleted.
    server.put(&objective(LLM_D, "batch", 5, POOL));
    controller.wait_for_snapshot_within("batch modified", WAIT, |s| {
        s["objectives"] == json!({"batch": 5, "legacy": 3})
    });
    server.put(&objective(DEPRECATED, "legacy", 3, "other"));
    controller.wait_for_snapshot_within("legacy moved to another pool", WAIT, |s| {
        s["objectives"] == json!({"batch": 5})
    });
    server.delete(&rewrite(DEPRECATED, "old", "", "llama", "llama-v1"));
    controller.wait_for_snapshot_within("old deleted", WAIT, |s| s["rewrites"] == json!([canary]));
}

#[test]
fn a_group_that_is_not_installed_is_tolerated() {
    // Only examples/crds/ is installed: the deprecated group's lists get a real 404.
    let port = closed_port();
    let server = server("missing-crd", &[]);
    server.put(&pool(POOL, json!({"app": "vllm"}), &[port]));
    server.put(&vllm_pod("a", "127.0.0.2"));
    server.put(&objective(LLM_D, "batch", -1, POOL));
    let controller = start_admin_controller(&server, "k8s-real-missing-crd");
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
    // Discovery goes on.
    server.put(&vllm_pod("b", "127.0.0.3"));
    wait_endpoints(
        &controller,
        "pod b",
        &[a, endpoint("b", 0, "127.0.0.3", port)],
    );
}

#[test]
fn a_pool_created_later_is_picked_up() {
    let port = closed_port();
    let server = server("pool-later", &[]);
    server.put(&vllm_pod("a", "127.0.0.2"));
    server.put(&vllm_pod("b", "127.0.0.3"));
    let controller = start_admin_controller(&server, "k8s-real-pool-later");
    let not_found = "kubernetes: inferencepool llm/pool not found";
    controller.wait_for_log("pool not found", WAIT, |line| line.contains(not_found));
    assert_eq!(endpoints(&controller.snapshot()), Vec::<String>::new());

    let the_pool = pool(POOL, json!({"app": "vllm"}), &[port]);
    server.put(&the_pool);
    wait_endpoints(
        &controller,
        "the pool's pods",
        &[
            endpoint("a", 0, "127.0.0.2", port),
            endpoint("b", 0, "127.0.0.3", port),
        ],
    );

    // And deleted again: no endpoints, logged again.
    server.delete(&the_pool);
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
fn expired_watches_and_an_api_server_restart_are_survived() {
    // Without the watch cache a watch from a compacted resource version gets etcd's answer:
    // 410 Gone.
    let port = closed_port();
    let mut server = server("restart", &["--watch-cache=false"]);
    server.put(&pool(POOL, json!({"app": "vllm"}), &[port]));
    server.put(&vllm_pod("a", "127.0.0.2"));
    let controller = start_admin_controller(&server, "k8s-real-restart");
    let (a, b, c) = (
        endpoint("a", 0, "127.0.0.2", port),
        endpoint("b", 0, "127.0.0.3", port),
        endpoint("c", 0, "127.0.0.4", port),
    );
    wait_endpoints(&controller, "pod a", std::slice::from_ref(&a));
    let seen = server.put(&vllm_pod("b", "127.0.0.3"));
    wait_endpoints(&controller, "pod b", &[a.clone(), b.clone()]);
    let version = seen["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resource version")
        .to_string();

    // The history up to now is compacted: the controller's last resource version has expired.
    server.compact_etcd(5);
    assert_eq!(
        server.watch_pods_from(NS, &version),
        410,
        "a watch from the compacted version {version}"
    );

    // The API server goes away mid-watch and comes back; what changed after that arrives
    // through a fresh list (the watch cannot resume from the expired version).
    server.restart_apiserver(Duration::from_secs(1));
    server.put(&pod("a", json!({"app": "vllm"}), "127.0.0.2", false));
    server.put(&vllm_pod("c", "127.0.0.4"));
    let started = Instant::now();
    let mut expected = vec![b.clone(), c.clone()];
    expected.sort();
    controller.wait_for_snapshot_within("b and c after the restart", RESTART_WAIT, |s| {
        endpoints(s) == expected
    });
    eprintln!(
        "kubernetes (real API server): snapshot right {:?} after the restart",
        started.elapsed()
    );

    // And it keeps watching.
    server.delete(&vllm_pod("b", "127.0.0.3"));
    wait_endpoints(&controller, "c alone", std::slice::from_ref(&c));
}

/// The RBAC objects of a shipped example file: the service account, roles and bindings.
fn rbac_documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .filter(|document: &Value| {
            matches!(
                document["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "Role"
                        | "RoleBinding"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                )
            )
        })
        .collect()
}

/// The service account the RBAC documents bind their role to.
fn service_account(documents: &[Value]) -> (String, String) {
    let account = documents
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .expect("the example ships a ServiceAccount");
    let name = account["metadata"]["name"].as_str().unwrap().to_string();
    let namespace = account["metadata"]["namespace"]
        .as_str()
        .unwrap()
        .to_string();
    (namespace, name)
}

/// Starts the controller with a TokenRequest token of the service account of `documents`.
fn start_as_service_account(server: &RealApiServer, documents: &[Value], test: &str) -> Controller {
    let (namespace, name) = service_account(documents);
    let token = server.service_account_token(&namespace, &name);
    start_pool_controller(&server.write_kubeconfig_with_token(&temp_dir(test), NS, &token))
}

/// Lines of `controller`'s log that say the API server refused it.
fn refusals(controller: &Controller) -> Vec<String> {
    controller
        .log()
        .into_iter()
        .filter(|line| line.contains(": 403 Forbidden") || line.contains(": 401 Unauthorized"))
        .collect()
}

#[test]
fn the_shipped_rbac_grants_what_the_controller_needs() {
    for file in [
        "examples/envoy-gateway/controller.yaml",
        "examples/sidecar/rbac.yaml",
    ] {
        let test = file.replace('/', "-");
        let server = server(&test, &[]);
        let documents = rbac_documents(file);
        for document in &documents {
            server.put(document);
        }
        let port = closed_port();
        server.put(&pool(POOL, json!({"app": "vllm"}), &[port]));
        server.put(&vllm_pod("a", "127.0.0.2"));
        server.put(&objective(LLM_D, "batch", -1, POOL));
        server.put(&rewrite(LLM_D, "canary", "", "llama", "llama-v2"));
        // The authorizer reads roles through an informer: wait until it grants them.
        let account = service_account(&documents);
        let deadline = Instant::now() + WAIT;
        for (group, resource) in [
            ("", "pods"),
            ("inference.networking.k8s.io", "inferencepools"),
            ("llm-d.ai", "inferenceobjectives"),
            ("llm-d.ai", "inferencemodelrewrites"),
        ] {
            while !server.service_account_may((&account.0, &account.1), "watch", group, resource) {
                assert!(
                    Instant::now() < deadline,
                    "{file}: its service account may not watch {resource} ({group:?} group)"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let controller = start_as_service_account(&server, &documents, &test);
        wait_endpoints(
            &controller,
            &format!("pod a, as {file}'s service account"),
            &[endpoint("a", 0, "127.0.0.2", port)],
        );
        controller.wait_for_snapshot_within("the objective and the rewrite", WAIT, |s| {
            s["objectives"] == json!({"batch": -1})
                && s["rewrites"].as_array().is_some_and(|r| r.len() == 1)
        });
        // Changes arrive too (the watches are allowed, not only the lists).
        server.put(&vllm_pod("b", "127.0.0.3"));
        server.put(&pool(POOL, json!({"app": "vllm"}), &[port, 8000]));
        server.put(&objective(LLM_D, "batch", 4, POOL));
        wait_endpoints(
            &controller,
            "pod b on both ports",
            &[
                endpoint("a", 0, "127.0.0.2", port),
                endpoint("a", 1, "127.0.0.2", 8000),
                endpoint("b", 0, "127.0.0.3", port),
                endpoint("b", 1, "127.0.0.3", 8000),
            ],
        );
        controller.wait_for_snapshot_within("batch modified", WAIT, |s| {
            s["objectives"] == json!({"batch": 4})
        });
        assert_eq!(refusals(&controller), Vec::<String>::new(), "{file}");
    }
}

#[test]
fn every_verb_of_the_shipped_rbac_is_needed() {
    let file = "examples/envoy-gateway/controller.yaml";
    let server = server("every-verb", &[]);
    let documents = rbac_documents(file);
    for document in &documents {
        server.put(document);
    }
    server.put(&pool(POOL, json!({"app": "vllm"}), &[8000]));
    server.put(&vllm_pod("a", "127.0.0.2"));
    let role = documents
        .iter()
        .find(|d| d["kind"] == "Role")
        .expect("the example ships a Role")
        .clone();
    let rules = role["rules"].as_array().unwrap().clone();
    let mut checked = 0;
    for (index, rule) in rules.iter().enumerate() {
        for verb in rule["verbs"].as_array().unwrap() {
            let verb = verb.as_str().unwrap();
            let mut reduced = role.clone();
            reduced["rules"][index]["verbs"] = json!(rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| *v != verb)
                .collect::<Vec<_>>());
            server.put(&reduced);
            // The authorizer reads roles through an informer: wait until it refuses.
            let account = service_account(&documents);
            let (group, resource) = (
                rule["apiGroups"][0].as_str().unwrap(),
                rule["resources"][0].as_str().unwrap(),
            );
            let deadline = Instant::now() + WAIT;
            while server.service_account_may((&account.0, &account.1), verb, group, resource) {
                assert!(Instant::now() < deadline, "the reduced role never applied");
                std::thread::sleep(Duration::from_millis(20));
            }
            let controller = start_as_service_account(&server, &documents, "every-verb");
            let resources: Vec<String> = rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_string())
                .collect();
            let what = format!("the refusal to {verb} {resources:?}");
            controller.wait_for_log(&what, WAIT, |line| {
                line.contains("403 Forbidden")
                    && line.contains("check the controller's credentials and RBAC rules")
                    && resources
                        .iter()
                        .any(|r| line.contains(&format!("cannot {verb} resource \"{r}\"")))
            });
            checked += 1;
        }
    }
    server.put(&role);
    assert!(checked >= 6, "only {checked} verbs checked");
}
