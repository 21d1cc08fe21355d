use super::*;
use crate::moving_mean::HistogramTotals;

fn endpoint(name: &str, port: u16) -> Endpoint {
    Endpoint {
        name: name.to_string(),
        address: "127.0.0.1".to_string(),
        port,
        ready: true,
        key_cache: Default::default(),
        labels: BTreeMap::new(),
        metrics: Metrics::default(),
    }
}

fn key(name: &str, port: u16) -> EndpointKey {
    EndpointKey::of(&endpoint(name, port))
}

fn queue(n: u64) -> Metrics {
    Metrics {
        waiting_queue_size: n,
        ..Metrics::default()
    }
}

#[test]
fn next_version_is_strictly_increasing_and_follows_the_clock() {
    assert_eq!(next_version(0, 1_000), 1_000);
    assert_eq!(next_version(1_000, 1_000), 1_001);
    assert_eq!(
        next_version(5_000, 1_000),
        5_001,
        "a clock step back never lowers it"
    );
    assert_eq!(
        next_version(1_000, 9_000),
        9_000,
        "a restart continues above the old one"
    );
    assert_eq!(next_version(u64::MAX, 0), u64::MAX);
}

#[test]
fn the_first_snapshot_is_published_at_once_with_sorted_endpoints() {
    let store = Store::new(Profile::default(), vec![endpoint("b", 2), endpoint("a", 1)]);
    let first = store.current();
    assert!(first.version() >= now_unix_ms() - 60_000);
    let names: Vec<_> = first.snapshot.endpoints.iter().map(|e| &e.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(Snapshot::from_json(&first.json).unwrap(), first.snapshot);
    assert!(!store.is_ready());
}

#[test]
fn every_change_publishes_a_strictly_greater_version() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let mut versions = vec![store.current().version()];
    for n in 1..=20 {
        for job in store.begin_scrapes() {
            store.record_scrape(&job.key, Ok(queue(n).into()), now_unix_ms());
        }
        store.finish_round();
        versions.push(store.current().version());
    }
    assert!(
        versions.windows(2).all(|pair| pair[1] > pair[0]),
        "{versions:?}"
    );
    assert!(store.is_ready());
}

#[test]
fn an_unchanged_state_publishes_nothing() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let before = store.current().version();
    assert!(!store.set_endpoints(vec![endpoint("a", 1)]));
    store.finish_round();
    assert_eq!(store.current().version(), before);
}

#[test]
fn metrics_scraped_again_unchanged_are_republished_only_when_the_vouch_runs_out_or_they_go_stale() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    assert_eq!(staleness_threshold_ms(&Profile::default()), 200);
    let round = |result: Result<Metrics, String>| {
        for job in store.begin_scrapes() {
            store.record_scrape(&job.key, result.clone().map(Scraped::from), now_unix_ms());
        }
        store.finish_round();
        store.current().version()
    };
    let first = round(Ok(queue(1)));
    assert_eq!(store.current().snapshot.vouched_ms, VOUCHED_MS);
    // Scraped again, unchanged: nothing new to poll, well past the staleness threshold.
    assert_eq!(round(Ok(queue(1))), first);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(round(Ok(queue(1))), first);
    // A real change is published at once.
    let changed = round(Ok(queue(2)));
    assert!(changed > first);
    // Failing scrapes change nothing until the metrics would look stale; then at once.
    assert_eq!(round(Err("down".into())), changed);
    std::thread::sleep(Duration::from_millis(250));
    let stale = round(Err("down".into()));
    assert!(stale > changed);
    let published = store.current().snapshot.clone();
    assert!(!fresh(
        &published.endpoints[0],
        published.generated_unix_ms,
        200
    ));
    // Fresh again: published at once.
    let recovered = round(Ok(queue(2)));
    assert!(recovered > stale);
    // Once the snapshot is half the vouch old, the new scrape times go out.
    std::thread::sleep(Duration::from_millis(VOUCHED_MS / 2 + 10));
    assert!(round(Ok(queue(2))) > recovered);
}

#[test]
fn failures_keep_metrics_and_report_transitions() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let a = key("a", 1);
    assert!(!store.record_scrape(&a, Ok(queue(4).into()), 1_000));
    assert!(
        store.record_scrape(&a, Err("down".into()), 2_000),
        "ok → failing"
    );
    assert!(!store.record_scrape(&a, Err("still down".into()), 3_000));
    let report = &store.endpoint_reports(3_500)[0];
    assert_eq!(report.metrics.waiting_queue_size, 4);
    assert_eq!(report.metrics.updated_unix_ms, Some(1_000));
    assert_eq!(report.metrics_age_ms, Some(2_500));
    assert_eq!(report.last_error.as_deref(), Some("still down"));
    assert_eq!((report.scrapes_ok, report.scrapes_failed), (1, 2));
    assert!(
        store.record_scrape(&a, Ok(queue(1).into()), 4_000),
        "failing → ok"
    );
    assert_eq!(store.endpoint_reports(4_000)[0].last_error, None);
    let counters = store.counters();
    assert_eq!(Counters::get(&counters.scrapes_success), 2);
    assert_eq!(Counters::get(&counters.scrapes_error), 2);
}

#[test]
fn consecutive_failures_make_an_endpoint_unready_and_one_success_brings_it_back() {
    let store =
        Store::new(Profile::default(), vec![endpoint("a", 1), endpoint("b", 2)]).unready_after(3);
    let (a, b) = (key("a", 1), key("b", 2));
    let ready = |store: &Store| -> Vec<bool> {
        store.finish_round();
        store
            .current()
            .snapshot
            .endpoints
            .iter()
            .map(|e| e.ready)
            .collect()
    };
    store.record_scrape(&a, Ok(queue(0).into()), 1_000);
    store.record_scrape(&b, Ok(queue(0).into()), 1_000);
    assert_eq!(ready(&store), [true, true]);
    for at in [2_000, 3_000] {
        store.record_scrape(&a, Err("refused".into()), at);
        assert_eq!(ready(&store), [true, true], "one slow scrape is not enough");
    }
    // A success in between starts the count again.
    store.record_scrape(&a, Ok(queue(0).into()), 3_500);
    for at in [4_000, 5_000] {
        store.record_scrape(&a, Err("refused".into()), at);
    }
    assert_eq!(ready(&store), [true, true]);
    store.record_scrape(&a, Err("refused".into()), 6_000);
    assert_eq!(ready(&store), [false, true], "the third failure in a row");
    let report = &store.endpoint_reports(6_000)[0];
    assert_eq!((report.ready, report.consecutive_failures), (false, 3));
    // Rediscovery keeps the state; one success brings it back.
    store.set_endpoints(vec![endpoint("a", 1), endpoint("b", 2)]);
    assert_eq!(ready(&store), [false, true]);
    store.record_scrape(&a, Ok(queue(0).into()), 7_000);
    assert_eq!(ready(&store), [true, true]);
    assert_eq!(store.endpoint_reports(7_000)[0].consecutive_failures, 0);
}

#[test]
fn endpoints_that_stay_keep_their_metrics() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1), endpoint("b", 2)]);
    store.record_scrape(&key("a", 1), Ok(queue(7).into()), 1_000);
    store.record_scrape(&key("b", 2), Ok(queue(8).into()), 1_000);
    let mut relabelled = endpoint("a", 1);
    relabelled.labels.insert("role".into(), "decode".into());
    // b moves to another port: a different endpoint, so it starts empty.
    assert!(store.set_endpoints(vec![relabelled, endpoint("b", 3), endpoint("c", 4)]));
    let snapshot = &store.current().snapshot;
    let by_name: Vec<_> = snapshot
        .endpoints
        .iter()
        .map(|e| (e.name.as_str(), e.port, e.metrics.waiting_queue_size))
        .collect();
    assert_eq!(by_name, [("a", 1, 7), ("b", 3, 0), ("c", 4, 0)]);
    assert_eq!(snapshot.endpoints[0].labels["role"], "decode");
    // A late result for the removed endpoint is dropped.
    assert!(!store.record_scrape(&key("b", 2), Ok(queue(9).into()), 2_000));
}

#[test]
fn at_most_one_scrape_per_endpoint_is_in_flight() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1), endpoint("b", 2)]);
    let jobs = store.begin_scrapes();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].host_port, "127.0.0.1:1");
    store.record_scrape(&jobs[0].key, Ok(queue(1).into()), 1_000);
    let again: Vec<_> = store.begin_scrapes().into_iter().map(|j| j.key).collect();
    assert_eq!(again, [key("a", 1)], "b is still in flight");
}

fn manifests(priority: i32, rewrite_to: &str) -> Manifests {
    use wasm_epp::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};
    Manifests {
        objectives: [("batch".to_string(), priority)].into_iter().collect(),
        rewrites: vec![ModelRewrite {
            name: "default/r".to_string(),
            rules: vec![RewriteRule {
                matches: vec!["m".to_string()],
                targets: vec![RewriteTarget {
                    model: rewrite_to.to_string(),
                    weight: None,
                }],
            }],
        }],
    }
}

#[test]
fn manifests_are_in_the_first_snapshot_and_changes_publish() {
    let store = Store::with_manifests(
        Profile::default(),
        vec![endpoint("a", 1)],
        manifests(-1, "x"),
    );
    let first = store.current();
    assert_eq!(first.snapshot.objectives["batch"], -1);
    assert_eq!(first.snapshot.rewrites[0].rules[0].targets[0].model, "x");
    assert_eq!(Snapshot::from_json(&first.json).unwrap(), first.snapshot);

    assert!(!store.set_manifests(manifests(-1, "x")), "unchanged");
    assert_eq!(store.current().version(), first.version());
    assert!(store.set_manifests(manifests(5, "x")));
    let second = store.current();
    assert!(second.version() > first.version());
    assert_eq!(second.snapshot.objectives["batch"], 5);
    assert!(store.set_manifests(manifests(5, "y")));
    assert_eq!(
        store.current().snapshot.rewrites[0].rules[0].targets[0].model,
        "y"
    );
    assert!(store.set_manifests(Manifests::default()));
    let cleared = store.current();
    assert!(cleared.snapshot.objectives.is_empty() && cleared.snapshot.rewrites.is_empty());
    assert_eq!(
        cleared.snapshot.endpoints.len(),
        1,
        "endpoints are untouched"
    );
}

/// A poller holding `version` of this store's instance.
fn held(store: &Store, version: u64) -> Held {
    Held {
        version,
        instance: Some(store.current().snapshot.instance.clone()),
    }
}

#[test]
fn every_process_draws_its_own_instance_id() {
    let (a, b) = (
        Store::new(Profile::default(), vec![]),
        Store::new(Profile::default(), vec![]),
    );
    let id = a.current().snapshot.instance.clone();
    assert_eq!(id.len(), 16);
    assert_ne!(id, b.current().snapshot.instance);
    a.set_endpoints(vec![endpoint("a", 1)]);
    assert_eq!(a.current().snapshot.instance, id, "stable within a process");
}

#[tokio::test]
async fn pollers_holding_what_this_instance_never_served_are_answered_at_once() {
    let store = Store::new(Profile::default(), vec![]);
    let version = store.current().version();
    let hostile = held(&store, u64::MAX);
    let other_instance = Held {
        version,
        instance: Some("another-controller".into()),
    };
    for position in [hostile, other_instance] {
        match store.wait_newer(&position, Duration::from_secs(10)).await {
            Wait::Immediate(p) => assert_eq!(p.version(), version),
            other => panic!("expected Immediate for {position:?}, got {other:?}"),
        }
    }
    // A poller that sends no instance compares versions only.
    let legacy = Held {
        version: u64::MAX,
        instance: None,
    };
    assert!(matches!(
        store.wait_newer(&legacy, Duration::from_millis(20)).await,
        Wait::TimedOut(_)
    ));
}

#[tokio::test]
async fn long_poll_returns_at_once_when_a_newer_version_exists() {
    let store = Store::new(Profile::default(), vec![]);
    let version = store.current().version();
    let started = Instant::now();
    match store
        .wait_newer(&held(&store, version - 1), Duration::from_secs(10))
        .await
    {
        Wait::Immediate(p) => assert_eq!(p.version(), version),
        other => panic!("expected Immediate, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn long_poll_times_out_at_the_deadline() {
    let store = Store::new(Profile::default(), vec![]);
    let version = store.current().version();
    let started = Instant::now();
    match store
        .wait_newer(&held(&store, version), Duration::from_millis(150))
        .await
    {
        Wait::TimedOut(p) => assert_eq!(p.version(), version),
        other => panic!("expected TimedOut, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

#[tokio::test]
async fn long_poll_returns_as_soon_as_a_change_is_published() {
    let store = Arc::new(Store::new(Profile::default(), vec![]));
    let version = store.current().version();
    let publisher = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.set_endpoints(vec![endpoint("a", 1)]);
        })
    };
    let started = Instant::now();
    match store
        .wait_newer(&held(&store, version), Duration::from_secs(10))
        .await
    {
        Wait::Changed(p) => {
            assert!(p.version() > version);
            assert_eq!(p.snapshot.endpoints.len(), 1);
        }
        other => panic!("expected Changed, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    publisher.await.unwrap();
}

/// A scrape of a server with the given (sum, count) histogram totals.
fn histograms(
    decode: Option<(f64, f64)>,
    output_tokens: Option<(f64, f64)>,
) -> Result<Scraped, String> {
    let totals = |(sum, count)| HistogramTotals { sum, count };
    Ok(Scraped {
        metrics: queue(0),
        decode: decode.map(totals),
        output_tokens: output_tokens.map(totals),
    })
}

/// Records `scraped` for the endpoint ("a", 1) at `at`, publishes the round and returns the
/// first endpoint's metrics as published.
fn published_after(store: &Store, scraped: Result<Scraped, String>, at: u64) -> Metrics {
    store.record_scrape(&key("a", 1), scraped, at);
    store.finish_round();
    store.current().snapshot.endpoints[0].metrics.clone()
}

#[test]
fn decode_speed_from_the_histogram_reaches_the_snapshot() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let speed = |seconds, tokens, at| {
        published_after(&store, histograms(Some((seconds, tokens)), None), at).decode_ms_per_token
    };
    assert_eq!(
        speed(1.0, 10.0, 1_000),
        0.0,
        "one scrape is only a baseline"
    );
    // 1 s over 40 tokens since the baseline.
    assert_eq!(speed(2.0, 50.0, 2_000), 25.0);
    // The endpoint moving to a new label set keeps its estimate.
    let mut relabelled = endpoint("a", 1);
    relabelled.labels.insert("role".into(), "decode".into());
    store.set_endpoints(vec![relabelled]);
    assert_eq!(speed(2.0, 50.0, 3_000), 25.0);
    // A server that stops reporting the histogram has no speed.
    let stopped = published_after(&store, Ok(queue(0).into()), 4_000);
    assert_eq!(stopped.decode_ms_per_token, 0.0);
}

#[test]
fn mean_request_length_from_the_histogram_reaches_the_snapshot() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let first = published_after(&store, histograms(None, Some((6_400.0, 100.0))), 1_000);
    assert_eq!(
        first.output_tokens_per_request, 0.0,
        "one scrape is only a baseline"
    );
    // 4 requests of 48 tokens since the baseline (not the lifetime mean of 64).
    let second = published_after(&store, histograms(None, Some((6_592.0, 104.0))), 2_000);
    assert_eq!(second.output_tokens_per_request, 48.0);
    assert_eq!(
        second.decode_ms_per_token, 0.0,
        "the two means are kept apart"
    );
}

#[test]
fn the_peak_of_running_requests_is_kept() {
    let store = Store::new(Profile::default(), vec![endpoint("a", 1)]);
    let a = key("a", 1);
    let peak = |store: &Store| {
        store.current().snapshot.endpoints[0]
            .metrics
            .peak_running_requests
    };
    for (at, running) in [(1_000, 3), (2_000, 8), (3_000, 5)] {
        let metrics = Metrics {
            running_requests_size: running,
            ..Metrics::default()
        };
        store.record_scrape(&a, Ok(metrics.into()), at);
        store.finish_round();
    }
    assert_eq!(peak(&store), 8);
    // A failed scrape keeps it.
    store.record_scrape(&a, Err("refused".into()), 4_000);
    store.finish_round();
    assert_eq!(peak(&store), 8);
}
