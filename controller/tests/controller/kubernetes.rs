//! Kubernetes discovery against the in-process fake API server of [`crate::fake_apiserver`].
//!
//! Discovery itself is tested against a real API server ([`crate::apiserver`]). The fake stays
//! for what the real one cannot show: the exact requests the controller sends (the pool is listed
//! and watched by name only), and faults injected on purpose — a watch connection reset
//! mid-stream, a watch ended by the server, an outage answered with 503 while the history is
//! compacted behind the controller's back.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{closed_port, temp_dir, Controller};
use crate::fake_apiserver::{FakeApiServer, Recorded, PODS, POOLS};
use crate::k8s_fixtures::{
    endpoint, pool, start_pool_controller, vllm_pod, wait_endpoints, NS, POOL, WAIT,
};

/// Starts the controller for [`POOL`] in [`NS`] against `fake`.
fn start_controller(fake: &FakeApiServer, test: &str) -> Controller {
    start_pool_controller(&fake.write_kubeconfig(&temp_dir(test), NS))
}

/// The requests the fake answered that `which` accepts.
fn count(fake: &FakeApiServer, which: impl Fn(&Recorded) -> bool) -> usize {
    fake.requests().iter().filter(|r| which(r)).count()
}

#[test]
fn the_pool_is_listed_and_watched_by_name() {
    let fake = FakeApiServer::start();
    fake.put(pool(POOL, json!({"app": "vllm"}), &[8000]));
    // Another pool of the namespace: the controller must watch its own pool only.
    fake.put(pool("other", json!({"app": "other"}), &[8000]));
    fake.put(vllm_pod("a", "127.0.0.2"));
    let controller = start_controller(&fake, "k8s-pool-by-name");
    wait_endpoints(&controller, "pod a", &[endpoint("a", 0, "127.0.0.2", 8000)]);
    let deadline = Instant::now() + WAIT;
    while count(&fake, |r| r.path == POOLS.path(NS) && r.watch) == 0 {
        assert!(Instant::now() < deadline, "the pool is not watched");
        std::thread::sleep(Duration::from_millis(10));
    }
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
