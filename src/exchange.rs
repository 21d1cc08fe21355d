//! How the workers of one Envoy process share what each of them learns — prefix-index records
//! and in-flight counts — through proxy-wasm shared data, on their timer tick and never on the
//! request path.
//!
//! Every worker keeps its prefix index and its in-flight counts in its own Wasm memory, so a
//! decision makes no host call for them. On each tick a worker:
//!
//! 1. claims an id once (the shared counter [`WORKER_SEQUENCE_KEY`], as the poller lease does)
//!    and enters it in the registry [`REGISTRY_KEY`] (space-separated ids, at most
//!    [`MAX_WORKERS`], compare-and-swap);
//! 2. publishes its *bulletin* when something changed, or at least every [`HEARTBEAT_MS`]:
//!    its current in-flight counts and its last few batches of new prefix records (each batch
//!    one tick's outbox, numbered), under `wasm-epp.worker.<id>`, then bumps the small key
//!    `wasm-epp.worker.<id>.seq`;
//! 3. reads the registry and each other worker's `.seq` key, and only when that changed its
//!    bulletin: batches it has not seen yet are learnt into its own index, the in-flight
//!    counts replace that worker's previous ones.
//!
//! So a tick costs O(workers) host calls whatever the traffic, a record reaches every worker
//! about one tick after the decision, and a request costs none. A worker whose bulletin is
//! older than [`STALE_MS`] (its VM was replaced or its thread is stuck) no longer counts in
//! flight, and after [`PRUNE_MS`] it is removed from the registry. Everything read is
//! validated: a malformed bulletin is ignored, never a trap.

use std::collections::{HashMap, VecDeque};

use crate::lease::{claim_id_at, HolderId};
use crate::scheduler::prefix::PrefixIndex;
use crate::shared_data::SharedStore;

/// Shared counter the worker ids are drawn from.
pub const WORKER_SEQUENCE_KEY: &str = "wasm-epp.worker.sequence";
/// Shared-data key of the registry of worker ids.
pub const REGISTRY_KEY: &str = "wasm-epp.workers";
/// Prefix of a worker's bulletin key (`…<id>`) and its sequence key (`…<id>.seq`).
const BULLETIN_PREFIX: &str = "wasm-epp.worker.";
/// Most ids in the registry; the oldest entry makes room for a new one.
pub const MAX_WORKERS: usize = 64;
/// Record batches a bulletin keeps, so a reader that missed a tick or two still gets them.
const KEPT_BATCHES: usize = 4;
/// Most record words a bulletin carries (older batches are dropped first).
const MAX_BATCH_WORDS: usize = 1 << 17;
/// A bulletin is rewritten at least this often, so readers can tell a live worker.
pub const HEARTBEAT_MS: u64 = 1_000;
/// A bulletin older than this no longer counts in flight.
pub const STALE_MS: u64 = 5_000;
/// A worker silent for this long is removed from the registry.
pub const PRUNE_MS: u64 = 30_000;
/// First word of a bulletin (`"wasmepp"` and layout 1).
const MAGIC: u64 = u64::from_le_bytes(*b"wasmepp\x01");

/// What one worker published.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bulletin {
    /// When it was written, ms since the Unix epoch.
    pub written_unix_ms: u64,
    /// Its requests in flight per endpoint key (sorted by key, no zeros).
    pub in_flight: Vec<(u64, u32)>,
    /// Its recent record batches, oldest first: (batch number, record groups as
    /// [`PrefixIndex::take_outbox`] gives them).
    pub batches: Vec<(u64, Vec<u64>)>,
}

impl Bulletin {
    /// The stored form: little-endian 64-bit words.
    pub fn encode(&self) -> Vec<u8> {
        let words = 4
            + 2 * self.in_flight.len()
            + self.batches.iter().map(|(_, w)| 2 + w.len()).sum::<usize>();
        let mut out = Vec::with_capacity(words * 8);
        let mut put = |word: u64| out.extend_from_slice(&word.to_le_bytes());
        put(MAGIC);
        put(self.written_unix_ms);
        put(self.in_flight.len() as u64);
        for &(key, count) in &self.in_flight {
            put(key);
            put(u64::from(count));
        }
        put(self.batches.len() as u64);
        for (number, words) in &self.batches {
            put(*number);
            put(words.len() as u64);
            words.iter().for_each(|&w| put(w));
        }
        out
    }

    /// Decodes [`encode`](Self::encode)'s form; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Bulletin> {
        if bytes.len() % 8 != 0 {
            return None;
        }
        let mut words = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
        let mut next = || words.next();
        if next()? != MAGIC {
            return None;
        }
        let written_unix_ms = next()?;
        let n = usize::try_from(next()?).ok()?;
        let mut in_flight = Vec::with_capacity(n.min(bytes.len() / 16));
        for _ in 0..n {
            in_flight.push((next()?, u32::try_from(next()?).ok()?));
        }
        let n = usize::try_from(next()?).ok()?;
        let mut batches = Vec::with_capacity(n.min(KEPT_BATCHES));
        for _ in 0..n {
            let number = next()?;
            let len = usize::try_from(next()?).ok()?;
            let mut batch = Vec::with_capacity(len.min(bytes.len() / 8));
            for _ in 0..len {
                batch.push(next()?);
            }
            batches.push((number, batch));
        }
        Some(Bulletin {
            written_unix_ms,
            in_flight,
            batches,
        })
    }
}

/// What this worker knows of another one.
#[derive(Debug, Default)]
struct Peer {
    /// The `.seq` value last read.
    seq: Option<Vec<u8>>,
    /// The newest record batch learnt.
    batch: u64,
    written_unix_ms: u64,
    in_flight: Vec<(u64, u32)>,
}

/// One worker's side of the exchange; see the module docs.
#[derive(Debug, Default)]
pub struct Exchange {
    me: Option<HolderId>,
    registered: bool,
    /// Writes of this worker's bulletin so far.
    seq: u64,
    /// Record batches made so far.
    batch: u64,
    batches: VecDeque<(u64, Vec<u64>)>,
    published_in_flight: Vec<(u64, u32)>,
    last_written_unix_ms: u64,
    peers: HashMap<String, Peer>,
    /// The live peers' in-flight counts, summed per endpoint key.
    others_in_flight: HashMap<u64, u32>,
}

impl Exchange {
    /// A worker that has not claimed its id yet.
    pub fn new() -> Exchange {
        Exchange::default()
    }

    /// This worker's id, once claimed.
    pub fn id(&self) -> Option<&HolderId> {
        self.me.as_ref()
    }

    /// Requests the other live workers have in flight to the endpoint `key`.
    pub fn others_in_flight(&self, key: u64) -> u32 {
        self.others_in_flight.get(&key).copied().unwrap_or(0)
    }

    /// One round at `now_unix_ms`: publishes `index`'s outbox and `in_flight` (this worker's
    /// counts by endpoint key), then learns the other workers' news into `index`.
    pub fn tick(
        &mut self,
        store: &impl SharedStore,
        now_unix_ms: u64,
        index: &mut PrefixIndex,
        in_flight: &HashMap<u64, u32>,
    ) {
        if self.me.is_none() {
            self.me = claim_id_at(store, WORKER_SEQUENCE_KEY);
        }
        let Some(me) = self.me.clone() else {
            return;
        };
        if !self.registered {
            self.registered = register(store, me.as_str());
        }
        self.publish(store, me.as_str(), now_unix_ms, index, in_flight);
        self.read_peers(store, me.as_str(), now_unix_ms, index);
    }

    fn publish(
        &mut self,
        store: &impl SharedStore,
        me: &str,
        now: u64,
        index: &mut PrefixIndex,
        in_flight: &HashMap<u64, u32>,
    ) {
        let mut changed = now.saturating_sub(self.last_written_unix_ms) >= HEARTBEAT_MS;
        let outbox = index.take_outbox();
        if !outbox.is_empty() {
            self.batch += 1;
            self.batches.push_back((self.batch, outbox));
            let mut words: usize = self.batches.iter().map(|(_, w)| w.len()).sum();
            while self.batches.len() > KEPT_BATCHES
                || (words > MAX_BATCH_WORDS && self.batches.len() > 1)
            {
                words -= self.batches.pop_front().map_or(0, |(_, w)| w.len());
            }
            changed = true;
        }
        let mut counts: Vec<(u64, u32)> = in_flight
            .iter()
            .filter(|&(_, &n)| n > 0)
            .map(|(&k, &n)| (k, n))
            .collect();
        counts.sort_unstable();
        if counts != self.published_in_flight {
            self.published_in_flight = counts;
            changed = true;
        }
        if !changed {
            return;
        }
        let bulletin = Bulletin {
            written_unix_ms: now,
            in_flight: self.published_in_flight.clone(),
            batches: self.batches.iter().cloned().collect(),
        };
        let key = format!("{BULLETIN_PREFIX}{me}");
        // The bulletin before its sequence: a reader that sees the new sequence finds it.
        if store.set(&key, &bulletin.encode(), None) {
            self.seq += 1;
            store.set(&format!("{key}.seq"), self.seq.to_string().as_bytes(), None);
            self.last_written_unix_ms = now;
        }
    }

    fn read_peers(
        &mut self,
        store: &impl SharedStore,
        me: &str,
        now: u64,
        index: &mut PrefixIndex,
    ) {
        let Some((registry, token)) = store.get(REGISTRY_KEY) else {
            return;
        };
        let registry = registry.unwrap_or_default();
        let ids: Vec<&str> = std::str::from_utf8(&registry)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        if !ids.contains(&me) {
            self.registered = false;
        }
        let mut silent = Vec::new();
        for &id in ids.iter().filter(|&&id| id != me) {
            let peer = self.peers.entry(id.to_string()).or_default();
            let key = format!("{BULLETIN_PREFIX}{id}");
            let seq = store
                .get(&format!("{key}.seq"))
                .and_then(|(value, _)| value);
            if seq.is_some() && seq != peer.seq {
                if let Some(bulletin) = store
                    .get(&key)
                    .and_then(|(value, _)| Bulletin::decode(&value?))
                {
                    for (number, words) in &bulletin.batches {
                        if *number > peer.batch {
                            index.learn_groups(words);
                            peer.batch = *number;
                        }
                    }
                    peer.written_unix_ms = bulletin.written_unix_ms;
                    peer.in_flight = bulletin.in_flight;
                }
                peer.seq = seq;
            }
            if peer.written_unix_ms == 0 {
                // Never heard from: count its silence from now.
                peer.written_unix_ms = now;
            }
            if now.saturating_sub(peer.written_unix_ms) >= PRUNE_MS {
                silent.push(id.to_string());
            }
        }
        self.peers.retain(|id, _| ids.contains(&id.as_str()));
        if !silent.is_empty() {
            let kept: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| !silent.iter().any(|s| s == id))
                .collect();
            // Lost to a concurrent change: tried again next tick.
            store.set(REGISTRY_KEY, kept.join(" ").as_bytes(), token);
        }
        // Staleness moves with time, so the sums are rebuilt every tick (a few peers).
        self.others_in_flight.clear();
        for peer in self.peers.values() {
            if now.saturating_sub(peer.written_unix_ms) < STALE_MS {
                for &(key, count) in &peer.in_flight {
                    *self.others_in_flight.entry(key).or_default() += count;
                }
            }
        }
    }
}

/// Adds `me` to the registry (dropping the oldest ids beyond [`MAX_WORKERS`]); whether it is
/// there now.
fn register(store: &impl SharedStore, me: &str) -> bool {
    let Some((current, token)) = store.get(REGISTRY_KEY) else {
        return false;
    };
    let current = current.unwrap_or_default();
    let mut ids: Vec<&str> = std::str::from_utf8(&current)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    if ids.contains(&me) {
        return true;
    }
    ids.push(me);
    let skip = ids.len().saturating_sub(MAX_WORKERS);
    store.set(REGISTRY_KEY, ids[skip..].join(" ").as_bytes(), token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::endpoint;
    use crate::shared_data::fake::Host;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    struct Worker {
        exchange: Exchange,
        index: PrefixIndex,
        in_flight: HashMap<u64, u32>,
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
                .tick(host, now, &mut self.index, &self.in_flight);
        }
    }

    #[test]
    fn bulletins_round_trip_and_garbage_is_refused() {
        let bulletin = Bulletin {
            written_unix_ms: 7,
            in_flight: vec![(1, 2), (3, 4)],
            batches: vec![(1, vec![9, 8, 1, 5]), (2, vec![])],
        };
        let bytes = bulletin.encode();
        assert_eq!(Bulletin::decode(&bytes), Some(bulletin));
        assert_eq!(Bulletin::decode(&bytes[..bytes.len() - 8]), None);
        assert_eq!(Bulletin::decode(&bytes[1..]), None);
        assert_eq!(Bulletin::decode(b"not a bulletin!!"), None);
        assert_eq!(Bulletin::decode(&[]), None);
        let mut huge = Bulletin::default().encode();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // claims 2^64 counts
        assert_eq!(Bulletin::decode(&huge), None);
    }

    #[test]
    fn records_reach_every_other_worker_one_tick_later() {
        let host = Host::default();
        let mut workers: Vec<Worker> = (0..3).map(|_| Worker::new()).collect();
        for w in &mut workers {
            w.tick(&host, 1_000);
        }
        let ids: Vec<String> = workers
            .iter()
            .map(|w| w.exchange.id().unwrap().as_str().to_string())
            .collect();
        assert_eq!(ids.len(), 3);
        assert!(ids[0] != ids[1] && ids[1] != ids[2]);
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let eps = [&owned[0], &owned[1]];
        workers[0]
            .index
            .record(eps[0].index_key(), &[11, 12], 1_000);
        workers[1].index.record(eps[1].index_key(), &[11], 1_000);
        for w in &mut workers {
            w.tick(&host, 1_010);
        }
        // Worker 0 ticked before worker 1 published, so it learns worker 1's record a tick later.
        for w in &mut workers {
            w.tick(&host, 1_020);
        }
        for w in &workers {
            assert_eq!(w.index.matched_blocks(&eps, &[11, 12]), vec![2, 1]);
        }
        // Nothing is learnt twice or sent back: the outboxes are empty.
        for w in &mut workers {
            assert!(w.index.take_outbox().is_empty());
        }
    }

    #[test]
    fn in_flight_counts_are_summed_over_live_workers_only() {
        let host = Host::default();
        let (mut a, mut b, mut c) = (Worker::new(), Worker::new(), Worker::new());
        a.in_flight.insert(5, 2);
        b.in_flight.insert(5, 3);
        b.in_flight.insert(6, 1);
        for now in [1_000, 1_010] {
            a.tick(&host, now);
            b.tick(&host, now);
            c.tick(&host, now);
        }
        assert_eq!(c.exchange.others_in_flight(5), 5);
        assert_eq!(c.exchange.others_in_flight(6), 1);
        assert_eq!(a.exchange.others_in_flight(5), 3, "not its own");
        // b's requests end.
        b.in_flight.clear();
        b.tick(&host, 1_020);
        c.tick(&host, 1_020);
        assert_eq!(c.exchange.others_in_flight(5), 2);
        // a goes silent (its VM died): its counts expire, then it leaves the registry.
        c.tick(&host, 1_010 + STALE_MS);
        b.tick(&host, 1_010 + STALE_MS);
        assert_eq!(c.exchange.others_in_flight(5), 0);
        let silent_a = a.exchange.id().unwrap().as_str().to_string();
        for now in [1_020 + PRUNE_MS, 1_030 + PRUNE_MS] {
            b.tick(&host, now);
            c.tick(&host, now);
        }
        let registry = host.get(REGISTRY_KEY).unwrap().0.unwrap();
        let registry = String::from_utf8(registry).unwrap();
        assert!(!registry.split(' ').any(|id| id == silent_a), "{registry}");
        assert_eq!(registry.split(' ').count(), 2, "{registry}");
    }

    #[test]
    fn a_tick_costs_host_calls_per_worker_not_per_record() {
        let host = Host::default();
        let (mut a, mut b) = (Worker::new(), Worker::new());
        a.tick(&host, 1_000);
        b.tick(&host, 1_000);
        let cost = |records: u64, a: &mut Worker, b: &mut Worker, now: u64| {
            let hashes: Vec<u64> = (1..=records).map(|h| h * 7919 + now).collect();
            a.index.record(99, &hashes, now);
            let before = host.calls();
            a.tick(&host, now);
            b.tick(&host, now);
            host.calls() - before
        };
        let small = cost(1, &mut a, &mut b, 2_000);
        let large = cost(2_000, &mut a, &mut b, 4_000);
        assert_eq!(
            small, large,
            "host calls per tick do not grow with the records"
        );
        // Per worker: its two writes, the registry, the other's sequence and bulletin.
        assert!(small <= 2 * 5, "{small}");
        // An idle tick reads the registry and the other worker's sequence only.
        let before = host.calls();
        b.tick(&host, 4_010);
        assert_eq!(host.calls() - before, 2);
    }

    #[test]
    fn a_reader_that_missed_ticks_still_gets_the_kept_batches() {
        let host = Host::default();
        let (mut a, mut b) = (Worker::new(), Worker::new());
        a.tick(&host, 1_000);
        b.tick(&host, 1_000);
        for t in 1..=KEPT_BATCHES as u64 {
            a.index.record(42, &[100 + t], 1_000 + t);
            a.tick(&host, 1_000 + t);
        }
        b.tick(&host, 1_100);
        for t in 1..=KEPT_BATCHES as u64 {
            assert!(b.index.has_holder(100 + t, 42), "batch {t} learnt");
        }
    }

    #[test]
    fn garbage_in_shared_data_is_ignored() {
        let host = Host::default();
        let mut a = Worker::new();
        a.tick(&host, 1_000);
        host.set(REGISTRY_KEY, b"x 1.1 \xff\xfe", None);
        host.set("wasm-epp.worker.x.seq", b"9", None);
        host.set("wasm-epp.worker.x", b"garbage", None);
        a.tick(&host, 1_010);
        a.tick(&host, 1_020);
        assert_eq!(a.exchange.others_in_flight(1), 0);
    }
}
