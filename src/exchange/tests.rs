//! The exchange between simulated workers over a fake host: records, counts, notices and
//! membership.

use super::message::SNAPSHOT_NOTICE;
use super::*;
use crate::scheduler::test_support::{endpoint, keys_of};
use crate::shared_data::fake::Host;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// What the tests look at of a worker's side.
impl Exchange {
    /// This worker's id, once claimed.
    fn id(&self) -> Option<&HolderId> {
        self.me.as_ref()
    }

    /// This worker's inbox queue, once registered.
    fn inbox(&self) -> Option<u32> {
        self.inbox
    }

    /// Live peers this worker sends to: all of them, and those that get every decision.
    fn peers(&self) -> (usize, usize) {
        let active = self.peers.iter().filter(|p| p.active).count();
        (self.peers.len(), active)
    }
}

/// The prompt bytes each test decision leaves to prefill.
const PROMPT: i64 = 1_000;

/// `requests` in flight, `prefilling` of them without a first byte yet.
fn in_flight(requests: u64, prefilling: u64) -> InFlight {
    InFlight {
        requests,
        prefill_bytes: prefilling * PROMPT as u64,
    }
}

struct Worker {
    exchange: Exchange,
    index: PrefixIndex,
    in_flight: HashMap<u64, InFlight>,
}

impl Worker {
    fn new() -> Worker {
        Worker {
            exchange: Exchange::new(),
            index: PrefixIndex::new(64),
            in_flight: HashMap::new(),
        }
    }

    fn tick(&mut self, host: &Host, now: u64) {
        self.exchange
            .tick(host, host, now, &mut self.index, &self.in_flight);
    }

    /// Runs this worker's inbox callback, as the host would on its thread.
    fn ready(&mut self, host: &Host, now: u64) -> usize {
        let inbox = self.exchange.inbox().unwrap();
        self.exchange.receive(host, inbox, now, &mut self.index)
    }

    /// A routed decision: records, counts one in flight with [`PROMPT`] bytes to prefill
    /// and sends.
    fn decide(&mut self, host: &Host, key: u64, hashes: &[u64], now: u64) -> u64 {
        self.index.record(key, hashes, now);
        self.change(key, 1, PROMPT);
        self.exchange.send(host, &mut self.index)
    }

    /// The first response byte of a request to `key`: its prompt is prefilled.
    fn prefilled(&mut self, key: u64) {
        self.change(key, 0, -PROMPT);
    }

    /// The end of a prefilled request to `key`.
    fn end(&mut self, key: u64) {
        self.change(key, -1, 0);
    }

    fn change(&mut self, key: u64, requests: i64, prefill_bytes: i64) {
        let entry = self.in_flight.entry(key).or_default();
        entry.requests = entry.requests.checked_add_signed(requests).unwrap();
        entry.prefill_bytes = entry
            .prefill_bytes
            .checked_add_signed(prefill_bytes)
            .unwrap();
        let change = Counts {
            requests,
            prefill_bytes,
        };
        self.exchange.note_in_flight(key, change);
    }
}

fn started(host: &Host, n: usize) -> Vec<Worker> {
    let mut workers: Vec<Worker> = (0..n).map(|_| Worker::new()).collect();
    for w in &mut workers {
        w.tick(host, 1_000);
    }
    for w in &mut workers {
        w.ready(host, 1_000);
    }
    workers
}

#[test]
fn snapshot_notices_reach_every_live_worker_and_nothing_else() {
    let host = Host::default();
    let mut workers = started(&host, 3);
    // Before any notice, nothing to take.
    assert!(workers
        .iter_mut()
        .all(|w| !w.exchange.take_snapshot_notice()));
    // Registry, then per worker: its heartbeat, its inbox, one enqueue.
    assert_eq!(notify_snapshot(&host, &host, 1_500), 1 + 3 * 3);
    for w in &mut workers {
        assert_eq!(w.ready(&host, 1_500), 1);
        assert!(w.exchange.take_snapshot_notice());
        assert!(!w.exchange.take_snapshot_notice());
    }
    // A worker silent for STALE_MS is not told (its heartbeat is old).
    workers[0].tick(&host, 1_000 + STALE_MS);
    assert_eq!(notify_snapshot(&host, &host, 1_000 + STALE_MS), 1 + 3 + 2);
    // A notice is not mistaken for a message, nor a message for a notice.
    workers[0].ready(&host, 1_000 + STALE_MS);
    assert!(workers[0].exchange.take_snapshot_notice());
    assert_eq!(Message::decode(&SNAPSHOT_NOTICE), None);
    // No registry yet: one call, nothing sent.
    assert_eq!(notify_snapshot(&Host::default(), &Host::default(), 1), 1);
}

#[test]
fn records_go_to_the_uplink_only_while_replicas_share() {
    let host = Host::default();
    let mut w = started(&host, 2);
    let uplink = host.register(UPLINK_QUEUE).unwrap();
    // No share flag yet: a decision enqueues to its peer only.
    assert_eq!(w[0].decide(&host, 5, &[11], 1_001), 1);
    assert_eq!(host.dequeue(uplink), None);
    host.set(SHARE_KEY, b"1", None);
    w[0].tick(&host, 2_000);
    w[1].ready(&host, 2_000);
    // Sharing: new records also go to the uplink, records only, once per decision.
    assert_eq!(w[0].decide(&host, 5, &[12, 13], 2_001), 2);
    let sent = Message::decode(&host.dequeue(uplink).unwrap()).unwrap();
    assert_eq!(sent.records, vec![5, 2_001, 2, 12, 13]);
    assert!(sent.counts.is_empty());
    // A decision with nothing new to record costs no uplink enqueue.
    assert_eq!(w[0].decide(&host, 5, &[12, 13], 2_002), 1);
    assert_eq!(host.dequeue(uplink), None);
    // Sharing off again: the uplink is dropped at the next heartbeat.
    host.set(SHARE_KEY, b"0", None);
    w[0].tick(&host, 3_000);
    assert_eq!(w[0].decide(&host, 5, &[14], 3_001), 1);
    assert_eq!(host.dequeue(uplink), None);
}

#[test]
fn the_other_replicas_records_are_learnt_by_every_worker_and_not_republished() {
    let host = Host::default();
    let mut w = started(&host, 2);
    let owned = [endpoint(1, 0, 0.0)];
    let key = owned[0].index_key();
    // Registry, then per worker: its heartbeat, its inbox, one enqueue.
    assert_eq!(
        deliver_replica_records(&host, &host, 1_500, &[key, 1_400, 2, 21, 22]),
        1 + 2 * 3
    );
    assert_eq!(deliver_replica_records(&host, &host, 1_500, &[]), 0);
    for worker in &mut w {
        assert_eq!(worker.ready(&host, 1_500), 1);
        assert_eq!(worker.index.matched_entries(&[key], &[21, 22]), vec![2]);
        assert!(worker.index.take_outbox().is_empty());
        // Not a peer: nobody is sent anything because of it.
        assert_eq!(worker.exchange.peers(), (1, 1));
    }
}

#[test]
fn records_reach_every_other_worker_when_its_inbox_runs() {
    let host = Host::default();
    let mut workers = started(&host, 3);
    let ids: Vec<String> = workers
        .iter()
        .map(|w| w.exchange.id().unwrap().as_str().to_string())
        .collect();
    assert!(ids[0] != ids[1] && ids[1] != ids[2]);
    // The first worker met the later ones through their first heartbeat messages.
    assert!(workers.iter().all(|w| w.exchange.peers() == (2, 2)));
    let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
    let eps = [&owned[0], &owned[1]];
    assert_eq!(
        workers[0].decide(&host, eps[0].index_key(), &[11, 12], 1_001),
        2
    );
    assert_eq!(
        workers[1].decide(&host, eps[1].index_key(), &[11], 1_002),
        2
    );
    for w in &mut workers {
        w.ready(&host, 1_003);
    }
    for w in &workers {
        assert_eq!(
            w.index.matched_entries(&keys_of(&eps), &[11, 12]),
            vec![2, 1]
        );
    }
    // Nothing is learnt twice or sent back: the outboxes are empty.
    for w in &mut workers {
        assert!(w.index.take_outbox().is_empty());
    }
}

#[test]
fn in_flight_counts_follow_the_messages_and_expire_with_their_sender() {
    let host = Host::default();
    let mut w = started(&host, 3);
    w[0].decide(&host, 5, &[1], 1_001);
    w[0].decide(&host, 5, &[2], 1_001);
    w[1].decide(&host, 5, &[3], 1_001);
    w[1].decide(&host, 6, &[4], 1_001);
    for x in &mut w {
        x.ready(&host, 1_002);
    }
    assert_eq!(w[2].exchange.others_in_flight(5), in_flight(3, 3));
    assert_eq!(w[2].exchange.others_in_flight(6), in_flight(1, 1));
    assert_eq!(
        w[0].exchange.others_in_flight(5),
        in_flight(1, 1),
        "not its own"
    );
    // First bytes and ends travel with the next message (or heartbeat).
    w[1].prefilled(5);
    w[1].end(5);
    w[1].prefilled(6);
    w[1].decide(&host, 7, &[5], 1_003);
    w[2].ready(&host, 1_004);
    assert_eq!(
        (0..3)
            .map(|k| w[2].exchange.others_in_flight(5 + k))
            .collect::<Vec<_>>(),
        vec![in_flight(2, 2), in_flight(1, 0), in_flight(1, 1)]
    );
    // A lost message is corrected by the next heartbeat's whole table.
    w[1].prefilled(7);
    w[1].end(7);
    w[1].tick(&host, 2_000);
    w[2].ready(&host, 2_000);
    assert_eq!(w[2].exchange.others_in_flight(7), InFlight::default());
    // Worker 0 goes silent (its VM died): its counts expire, then it leaves the registry.
    let silent = w[0].exchange.id().unwrap().as_str().to_string();
    for now in [1_010 + STALE_MS, 1_020 + PRUNE_MS] {
        w[1].tick(&host, now);
        w[2].ready(&host, now);
        w[2].tick(&host, now);
        w[1].ready(&host, now);
    }
    assert_eq!(w[2].exchange.others_in_flight(5), InFlight::default());
    assert_eq!(w[2].exchange.peers(), (1, 1));
    let registry = host.get(REGISTRY_KEY).unwrap().0.unwrap();
    let registry = String::from_utf8(registry).unwrap();
    assert!(!registry.split(' ').any(|id| id == silent), "{registry}");
    assert_eq!(registry.split(' ').count(), 2, "{registry}");
}

#[test]
fn a_decision_costs_one_enqueue_per_active_peer_whatever_its_records() {
    let host = Host::default();
    let mut w = started(&host, 2);
    let cost = |records: u64, w: &mut Worker, now: u64| {
        let hashes: Vec<u64> = (1..=records).map(|h| h * 7919 + now).collect();
        let before = host.calls();
        let reported = w.decide(&host, 99, &hashes, now);
        assert_eq!(reported as usize, host.calls() - before);
        reported
    };
    assert_eq!(cost(1, &mut w[0], 2_000), 1);
    assert_eq!(cost(2_000, &mut w[0], 3_000), 1);
    // A peer that routes nothing (Envoy's main-thread instance) becomes inactive: it then
    // costs no call per decision and gets the records with the heartbeat.
    let mut idle = Worker::new();
    idle.tick(&host, 3_000);
    w[0].ready(&host, 3_000);
    assert_eq!(w[0].exchange.peers(), (2, 2), "active while young");
    let later = 3_000 + ACTIVE_MS;
    w[1].decide(&host, 1, &[], later - 1);
    w[0].tick(&host, later);
    w[1].tick(&host, later);
    idle.tick(&host, later);
    w[0].ready(&host, later);
    assert_eq!(w[0].exchange.peers(), (2, 1));
    idle.ready(&host, later);
    assert_eq!(cost(5, &mut w[0], later + 1), 1);
    assert_eq!(idle.ready(&host, later + 2), 0);
    w[0].tick(&host, later + 1_000);
    assert_eq!(idle.ready(&host, later + 1_000), 1);
    let hashes: Vec<u64> = (1..=5).map(|h| h * 7919 + later + 1).collect();
    assert!(hashes.iter().all(|&h| idle.index.has_holder(h, 99)));
    // Its next decision makes it active again, at once for every peer.
    assert_eq!(idle.decide(&host, 7, &[1], later + 1_001), 2);
    w[0].ready(&host, later + 1_002);
    assert_eq!(w[0].exchange.peers(), (2, 2));
    // Alone, a decision makes no host call.
    let alone = Host::default();
    let mut solo = started(&alone, 1);
    let before = alone.calls();
    assert_eq!(solo[0].decide(&alone, 1, &[1, 2, 3], 2_000), 0);
    assert_eq!(alone.calls(), before);
}

#[test]
fn garbage_in_the_inbox_and_shared_data_is_ignored() {
    let host = Host::default();
    let mut w = started(&host, 1);
    let inbox = w[0].exchange.inbox().unwrap();
    host.enqueue(inbox, b"garbage!");
    host.enqueue(inbox, &[0xff; 64]);
    assert_eq!(w[0].ready(&host, 1_001), 2);
    host.set(REGISTRY_KEY, b"x 1.1 \xff\xfe", None);
    host.set("wasm-epp.worker.x.alive", b"soon", None);
    w[0].tick(&host, 1_010);
    w[0].tick(&host, 1_020);
    assert_eq!(w[0].exchange.others_in_flight(1), InFlight::default());
    assert_eq!(w[0].exchange.peers(), (0, 0));
}
