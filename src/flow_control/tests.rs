use super::shortest_job_first_ordering_policy::SjfParams;
use super::*;
use crate::shared_data::fake::Host;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn waiting(id: u32, since_ms: u64) -> Waiting {
    Waiting {
        id,
        since_ms,
        bytes: 10,
        finish_by_ms: 0,
    }
}

fn ids(list: &[(i32, Waiting)]) -> Vec<u32> {
    list.iter().map(|(_, w)| w.id).collect()
}

#[test]
fn releases_the_highest_band_first_and_oldest_first_while_below_the_ceiling() {
    let config = FlowControl::default();
    let mut queue = FlowQueue::default();
    for (id, priority) in [(1, 0), (2, -1), (3, 5), (4, 0), (5, 5)] {
        queue
            .enqueue(&config, &Summary::new(), priority, waiting(id, 100))
            .unwrap();
    }
    assert_eq!(queue.top(), Some(5));
    // Saturated: nothing goes.
    assert!(queue.release(&config, 1.0, 0.1, None, 0).is_empty());
    // Room for three (0.7, 0.8, 0.9 are below 1.0; the fourth would start at 1.0).
    let released = queue.release(&config, 0.7, 0.1, None, 0);
    assert_eq!(ids(&released), [3, 5, 1]);
    assert_eq!(released[0].0, 5);
    // The released ones count until the metrics see them or they finish.
    assert!(queue.release(&config, 0.7, 0.1, None, 0).is_empty());
    queue.released_finished();
    assert_eq!(ids(&queue.release(&config, 0.7, 0.1, None, 0)), [4]);
    queue.metrics_changed();
    assert_eq!(ids(&queue.release(&config, 0.0, 0.1, None, 0)), [2]);
    assert!(queue.is_empty());
}

#[test]
fn a_shortest_job_first_band_releases_the_earliest_finish_first() {
    let sjf = Ordering::ShortestJobFirst(SjfParams { max_wait_ms: 1_000 });
    let config = FlowControl {
        priority_bands: vec![BandLimits {
            priority: 1,
            ordering: sjf,
            ..BandLimits::default()
        }],
        ..FlowControl::default()
    };
    let mut queue = FlowQueue::default();
    let none = Summary::new();
    for (id, priority, since_ms, finish_by_ms) in [
        (1, 1, 100, 400),
        (2, 1, 200, 220),
        (3, 1, 300, 390),
        (4, 0, 100, 400),
        (5, 0, 200, 220),
    ] {
        let w = Waiting {
            finish_by_ms,
            ..waiting(id, since_ms)
        };
        queue.enqueue(&config, &none, priority, w).unwrap();
    }
    // Band 1 orders by the earliest finish; the default band stays first come, first served.
    let released = queue.release(&config, 0.0, 0.25, None, 500);
    assert_eq!(ids(&released), [2, 3, 1, 4]);
    // Once the oldest has waited `maxWait`, it goes first.
    let mut queue = FlowQueue::default();
    for (id, since_ms, finish_by_ms) in [(1, 100, 400), (2, 200, 220)] {
        let w = Waiting {
            finish_by_ms,
            ..waiting(id, since_ms)
        };
        queue.enqueue(&config, &none, 1, w).unwrap();
    }
    assert_eq!(ids(&queue.release(&config, 0.0, 0.5, None, 1_100)), [1, 2]);
}

#[test]
fn a_higher_band_waiting_at_another_worker_holds_the_lower_ones_here() {
    let config = FlowControl::default();
    let mut queue = FlowQueue::default();
    queue
        .enqueue(&config, &Summary::new(), 0, waiting(1, 0))
        .unwrap();
    queue
        .enqueue(&config, &Summary::new(), 3, waiting(2, 0))
        .unwrap();
    // Another worker has priority 2 waiting: this worker's 3 goes, its 0 waits.
    assert_eq!(ids(&queue.release(&config, 0.0, 0.0, Some(2), 0)), [2]);
    assert_eq!(queue.top(), Some(0));
    assert!(queue.release(&config, 0.0, 0.0, Some(1), 0).is_empty());
    assert_eq!(ids(&queue.release(&config, 0.0, 0.0, Some(0), 0)), [1]);
}

#[test]
fn expiry_takes_the_waits_past_their_ttl_and_zero_disables_it() {
    let config = FlowControl::default();
    let mut queue = FlowQueue::default();
    for (id, since) in [(1, 0), (2, 500), (3, 900)] {
        queue
            .enqueue(&config, &Summary::new(), 0, waiting(id, since))
            .unwrap();
    }
    assert!(queue.expire(0, 1_000_000).is_empty());
    assert_eq!(ids(&queue.expire(1_000, 1_500)), [1, 2]);
    assert_eq!(queue.summary(), [(0, 1, 10)]);
    let e = expired_error(false);
    assert_eq!(
        (e.status(), e.dropped_reason()),
        (429, Some("rejected-ttl-expired"))
    );
    assert_eq!(
        e.body(),
        "inference error: ResourceExhausted - request timed out in queue: request evicted from queue: request TTL expired"
    );
    let e = expired_error(true);
    assert_eq!(
        (e.status(), e.dropped_reason()),
        (503, Some("rejected-no-endpoints"))
    );
}

#[test]
fn limits_count_the_band_the_whole_queue_and_the_other_workers() {
    let config = FlowControl {
        max_requests: 4,
        priority_bands: vec![BandLimits {
            priority: 1,
            max_requests: 2,
            max_bytes: 0,
            ordering: Ordering::Fcfs,
        }],
        default_negative_band: BandLimits {
            priority: 0,
            max_requests: 1,
            max_bytes: 0,
            ordering: Ordering::Fcfs,
        },
        ..FlowControl::default()
    };
    let mut queue = FlowQueue::default();
    let none = Summary::new();
    queue.enqueue(&config, &none, 1, waiting(1, 0)).unwrap();
    queue.enqueue(&config, &none, 1, waiting(2, 0)).unwrap();
    let full = queue.enqueue(&config, &none, 1, waiting(3, 0)).unwrap_err();
    assert_eq!(
        (full.status(), full.dropped_reason()),
        (429, Some("rejected-saturated"))
    );
    assert_eq!(
        full.body(),
        "inference error: ResourceExhausted - request rejected pre-queue: queue at capacity"
    );
    // The negative default band holds one.
    queue.enqueue(&config, &none, -1, waiting(4, 0)).unwrap();
    assert!(queue.enqueue(&config, &none, -2, waiting(5, 0)).is_ok());
    assert!(queue.enqueue(&config, &none, -2, waiting(6, 0)).is_err());
    // Global: 4 here already.
    assert!(queue.enqueue(&config, &none, 0, waiting(7, 0)).is_err());
    // Another worker's band counts too.
    let mut other = FlowQueue::default();
    let others: Summary = vec![(1, 2, 20)];
    assert!(other.enqueue(&config, &others, 1, waiting(8, 0)).is_err());
    assert!(other.enqueue(&config, &others, 0, waiting(9, 0)).is_ok());
    // Bytes.
    let bytes = FlowControl {
        max_bytes: 15,
        ..FlowControl::default()
    };
    let mut q = FlowQueue::default();
    q.enqueue(&bytes, &none, 0, waiting(1, 0)).unwrap();
    assert!(q.enqueue(&bytes, &none, 0, waiting(2, 0)).is_err());
}

#[test]
fn removal_and_change_tracking() {
    let config = FlowControl::default();
    let mut queue = FlowQueue::default();
    assert!(!queue.take_changed());
    queue
        .enqueue(&config, &Summary::new(), 2, waiting(7, 0))
        .unwrap();
    assert!(queue.take_changed());
    assert!(!queue.remove(8));
    assert!(!queue.take_changed());
    assert!(queue.remove(7));
    assert!(queue.take_changed());
    assert!(queue.is_empty());
    assert_eq!(queue.top(), None);
}

#[test]
fn the_board_shows_each_worker_the_others_live_bands() {
    let host = Host::default();
    let (a, b, c) = (Board::new(1), Board::new(2), Board::new(3));
    a.publish(&host, vec![(0, 3, 30), (4, 1, 5)], 1_000);
    b.publish(&host, vec![(0, 2, 20)], 1_000);
    assert_eq!(
        c.others(&host, 1_500),
        Others {
            bands: vec![(0, 5, 50), (4, 1, 5)]
        }
    );
    assert_eq!(c.others(&host, 1_500).top(), Some(4));
    assert_eq!(a.others(&host, 1_500).bands, vec![(0, 2, 20)]);
    // An empty summary removes the entry; an entry not refreshed fades out.
    a.publish(&host, Vec::new(), 2_000);
    assert_eq!(c.others(&host, 2_000).bands, vec![(0, 2, 20)]);
    assert_eq!(c.others(&host, 1_000 + BOARD_ENTRY_TTL_MS + 1).top(), None);
    // Nothing to remove and nothing to add: a read, no write.
    let calls = host.calls();
    c.publish(&host, Vec::new(), 2_000);
    assert_eq!(host.calls(), calls + 1);
}

#[test]
fn config_json_round_trip_and_defaults() {
    let config: FlowControl = serde_json::from_str("{}").unwrap();
    assert_eq!(config, FlowControl::default());
    assert_eq!(config.default_request_ttl_ms, 60_000);
    assert_eq!(config.band(7).max_requests, 5_000);
    assert_eq!(config.band(-3).max_bytes, 1_000_000_000);
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(serde_json::from_str::<FlowControl>(&json).unwrap(), config);
}
