//! How the workers of one Envoy process share what each of them learns — prefix-index records
//! and in-flight counts — pushed through proxy-wasm shared queues as decisions happen, with a
//! slow heartbeat in shared data for membership.
//!
//! Every worker keeps its prefix index and its in-flight counts in its own Wasm memory, so a
//! decision reads them with no host call. A worker:
//!
//! 1. claims an id once (the shared counter [`WORKER_SEQUENCE_KEY`], as the poller lease
//!    does), registers its inbox queue `wasm-epp.inbox.<id>` (the host runs its
//!    `on_queue_ready` on the registering worker's thread), stamps its heartbeat key
//!    `wasm-epp.worker.<id>.alive` and enters the id in the registry [`REGISTRY_KEY`]
//!    (space-separated ids, at most [`MAX_WORKERS`], compare-and-swap);
//! 2. after each routed decision [`send`](Exchange::send)s its new prefix records and its
//!    in-flight changes as one message to each live *active* peer: one enqueue per such peer,
//!    none when it is alone, whatever the prompt length or the pool size. A peer is active
//!    while it routes requests or is younger than [`ACTIVE_MS`]; one that has routed nothing for
//!    that long (Envoy's main-thread instance of the filter never routes) says so in its
//!    heartbeat and then gets records and counts with the heartbeats only, so it costs no
//!    callback per request; its next decision makes it active again;
//! 3. when its inbox is ready, [`receive`](Exchange::receive)s every waiting message: records
//!    are learnt into its index, counts applied to that peer's table;
//! 4. on its heartbeat ([`tick`](Exchange::tick), every [`HEARTBEAT_MS`]) re-stamps its key,
//!    reads the registry and the peers' stamps (resolving a new peer's inbox once), prunes ids
//!    silent for [`PRUNE_MS`], and sends its whole in-flight table, which corrects any drift and
//!    tells the peers it is alive.
//!
//! The snapshot poller uses the same inboxes: after publishing a snapshot it enqueues a short
//! notice ([`notify_snapshot`]) to every live worker, which decodes the new snapshot in that
//! callback, off the request path; so a request makes no host call to learn whether the
//! snapshot changed (the heartbeat still checks, in case a notice was missed).
//!
//! Records also travel between Envoy replicas (see [`crate::replica_records`]): while the
//! controller says replicas share ([`SHARE_KEY`]), a decision that made new records also
//! enqueues them, without counts, to the poller's [`UPLINK_QUEUE`]; the poller hands the
//! other replicas' records to every live worker ([`deliver_replica_records`]), learnt like a
//! peer's but never published again.
//!
//! So a record reaches every other worker as soon as its thread runs the queued callback, a
//! decision costs one enqueue per peer, and an idle worker wakes once per heartbeat (a timer
//! tick costs Envoy about 0.2 ms of CPU on the 2-core benchmark VM, so ticking every 10 ms, as
//! the bulletin exchange before this did, cost more than the requests at 100 req/s). A peer
//! silent for [`STALE_MS`] no longer counts in flight and is sent nothing. Everything received
//! is validated: a malformed message is ignored, never a trap.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::lease::{claim_id_at, HolderId};
use crate::scheduler::prefix::PrefixIndex;
use crate::shared_data::{SharedQueues, SharedStore};

/// Shared counter the worker ids are drawn from.
pub const WORKER_SEQUENCE_KEY: &str = "wasm-epp.worker.sequence";
/// Shared-data key of the registry of worker ids.
pub const REGISTRY_KEY: &str = "wasm-epp.workers";
/// Most ids in the registry; the oldest entry makes room for a new one.
pub const MAX_WORKERS: usize = 64;
/// How often a worker stamps its heartbeat, refreshes its peers and resends its whole table.
pub const HEARTBEAT_MS: u64 = 1_000;
/// A peer not heard from for this long no longer counts in flight and is sent nothing.
pub const STALE_MS: u64 = 5_000;
/// A worker whose heartbeat is this old is removed from the registry.
pub const PRUNE_MS: u64 = 30_000;
/// Most messages one inbox callback takes (each enqueue posts a callback, so the rest are
/// taken by the next ones).
const MAX_MESSAGES_PER_READY: usize = 4_096;
/// First word of a message (`"wasmepq"` and layout 1).
const MAGIC: u64 = u64::from_le_bytes(*b"wasmepq\x01");
/// The whole of a snapshot notice (`"wasmeps"` and layout 1).
const SNAPSHOT_NOTICE: [u8; 8] = *b"wasmeps\x01";
/// Flag: the message's counts are the sender's whole table, not changes.
const WHOLE_TABLE: u64 = 1;
/// Flag: the sender is active (and wants every decision's records and counts at once).
const ACTIVE: u64 = 2;
/// Sender id of the other Envoy replicas' records (no worker id contains `-`).
const REPLICAS_SENDER: &str = "other-replicas";
/// The poller's queue for this Envoy's records, registered only while replicas share them.
pub const UPLINK_QUEUE: &str = "wasm-epp.uplink";
/// Shared-data key: `1` while this Envoy's records go to the other replicas (the poller
/// writes it as the controller says), else `0` or absent.
pub const SHARE_KEY: &str = "wasm-epp.uplink.share";
/// A worker that has routed no request for this long (and is older than this) is inactive.
pub const ACTIVE_MS: u64 = 10_000;
/// Most record words kept for the peers that get them with the heartbeat.
const BACKLOG_MAX_WORDS: usize = crate::scheduler::prefix::index::OUTBOX_MAX_WORDS;

/// The inbox queue name of worker `id`.
fn inbox_name(id: &str) -> String {
    format!("wasm-epp.inbox.{id}")
}

/// The heartbeat key of worker `id`.
fn alive_key(id: &str) -> String {
    format!("wasm-epp.worker.{id}.alive")
}

/// One message between workers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// The sender's worker id.
    pub sender: String,
    /// Whether `counts` is the sender's whole in-flight table (else changes to it).
    pub whole_table: bool,
    /// Whether the sender is active.
    pub active: bool,
    /// In-flight counts (or changes) by endpoint key.
    pub counts: Vec<(u64, i64)>,
    /// Prefix record groups, in [`PrefixIndex::outbox`]'s form.
    pub records: Vec<u64>,
}

impl Message {
    /// Writes the stored form (little-endian 64-bit words) into `out`, replacing its content.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        encode(
            out,
            &self.sender,
            self.whole_table,
            self.active,
            &self.counts,
            &self.records,
        );
    }

    /// Decodes [`encode_into`](Self::encode_into)'s form; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Message> {
        if bytes.len() % 8 != 0 {
            return None;
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        let (&magic, rest) = words.split_first()?;
        let (&id_len, rest) = rest.split_first()?;
        if magic != MAGIC || id_len > 64 {
            return None;
        }
        let id_len = id_len as usize;
        let (id_words, rest) = rest.split_at_checked(id_len.div_ceil(8))?;
        let id_bytes: Vec<u8> = id_words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let sender = String::from_utf8(id_bytes[..id_len].to_vec()).ok()?;
        let (&flags, rest) = rest.split_first()?;
        let (&n, rest) = rest.split_first()?;
        let n = usize::try_from(n).ok().filter(|&n| n <= rest.len() / 2)?;
        let (pairs, records) = rest.split_at(2 * n);
        Some(Message {
            sender,
            whole_table: flags & WHOLE_TABLE != 0,
            active: flags & ACTIVE != 0,
            counts: pairs.chunks_exact(2).map(|p| (p[0], p[1] as i64)).collect(),
            records: records.to_vec(),
        })
    }
}

/// Writes a message from its parts into `out`, replacing its content (no other allocation:
/// a decision sends its records straight from the index's outbox).
fn encode(
    out: &mut Vec<u8>,
    sender: &str,
    whole_table: bool,
    active: bool,
    counts: &[(u64, i64)],
    records: &[u64],
) {
    out.clear();
    let id = sender.as_bytes();
    out.reserve((5 + id.len().div_ceil(8) + 2 * counts.len() + records.len()) * 8);
    let mut put = |word: u64| out.extend_from_slice(&word.to_le_bytes());
    put(MAGIC);
    put(id.len() as u64);
    for chunk in id.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        put(u64::from_le_bytes(word));
    }
    let flag = |on: bool, bit: u64| if on { bit } else { 0 };
    put(flag(whole_table, WHOLE_TABLE) | flag(active, ACTIVE));
    put(counts.len() as u64);
    for &(key, count) in counts {
        put(key);
        put(count as u64);
    }
    records.iter().for_each(|&w| put(w));
}

/// What this worker was told by another one.
#[derive(Debug, Default)]
struct Sender {
    /// Its requests in flight by endpoint key, as its messages built them up.
    counts: HashMap<u64, i64>,
    /// When its last message arrived, ms since the Unix epoch.
    heard_unix_ms: u64,
}

/// A live peer.
#[derive(Debug, Clone)]
struct Peer {
    id: String,
    /// Its inbox queue.
    queue: u32,
    /// It is active: it gets every decision's records and counts at once.
    active: bool,
}

/// One worker's side of the exchange; see the module docs.
#[derive(Debug, Default)]
pub struct Exchange {
    me: Option<HolderId>,
    inbox: Option<u32>,
    registered: bool,
    /// Whether this worker told its peers it is active.
    active: bool,
    /// This worker routed a request since its last heartbeat.
    decided: bool,
    /// When this worker started or last routed a request (at heartbeat precision).
    last_active_unix_ms: u64,
    /// Live peers.
    peers: Vec<Peer>,
    /// Records for the inactive peers, sent with the next heartbeat.
    backlog: Vec<u64>,
    senders: HashMap<String, Sender>,
    /// The live senders' in-flight counts, summed per endpoint key.
    others_in_flight: HashMap<u64, i64>,
    /// This worker's in-flight changes not sent yet.
    pending: Vec<(u64, i64)>,
    /// Reused encoding buffer (a cell, so a message can be encoded from borrowed state).
    buffer: RefCell<Vec<u8>>,
    /// A snapshot notice arrived since [`take_snapshot_notice`](Self::take_snapshot_notice).
    snapshot_notice: bool,
    /// The poller's [`UPLINK_QUEUE`] while records are shared with the other replicas.
    uplink: Option<u32>,
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

    /// This worker's inbox queue, once registered.
    pub fn inbox(&self) -> Option<u32> {
        self.inbox
    }

    /// Live peers this worker sends to: all of them, and those that get every decision.
    pub fn peers(&self) -> (usize, usize) {
        let active = self.peers.iter().filter(|p| p.active).count();
        (self.peers.len(), active)
    }

    /// Requests the other live workers have in flight to the endpoint `key`.
    pub fn others_in_flight(&self, key: u64) -> u32 {
        let sum = self.others_in_flight.get(&key).copied().unwrap_or(0);
        u32::try_from(sum.max(0)).unwrap_or(u32::MAX)
    }

    /// Notes a change of this worker's in-flight count to the endpoint `key`; it travels with
    /// the next message.
    pub fn note_in_flight(&mut self, key: u64, change: i64) {
        match self.pending.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pending)) => *pending += change,
            None => self.pending.push((key, change)),
        }
    }

    /// After a routed decision: sends `index`'s new records and the pending in-flight changes
    /// to every live active peer, as one message each, and keeps the records for the others'
    /// next heartbeat; returns the host calls made (one enqueue per active peer, and one to
    /// the poller's uplink when records are shared with other Envoy replicas and the decision
    /// made new ones). Alone, nothing is sent and nothing kept.
    pub fn send(&mut self, queues: &impl SharedQueues, index: &mut PrefixIndex) -> u64 {
        let woke = !self.active;
        self.active = true;
        self.decided = true;
        let records = index.outbox();
        if self.peers.iter().any(|p| !p.active) {
            if self.backlog.len() + records.len() > BACKLOG_MAX_WORDS {
                self.backlog.clear();
            }
            if records.len() <= BACKLOG_MAX_WORDS {
                self.backlog.extend_from_slice(records);
            }
        }
        let mut sent = 0;
        if let (Some(uplink), false) = (self.uplink, records.is_empty()) {
            // Only the records: the other replicas count their own requests in flight.
            let mut buffer = self.buffer.borrow_mut();
            encode(&mut buffer, REPLICAS_SENDER, false, false, &[], records);
            if !queues.enqueue(uplink, &buffer) {
                self.uplink = None;
            }
            sent += 1;
        }
        if woke || !records.is_empty() || self.pending.iter().any(|c| c.1 != 0) {
            // A worker waking up tells every peer, so they send it everything again.
            sent += self.broadcast(queues, |p| woke || p.active, false, &self.pending, records);
        }
        index.clear_outbox();
        self.pending.clear();
        sent
    }

    /// One heartbeat at `now_unix_ms`: see the module docs, step 4. `in_flight` is this
    /// worker's whole table.
    pub fn tick(
        &mut self,
        store: &impl SharedStore,
        queues: &impl SharedQueues,
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
        if self.inbox.is_none() {
            self.inbox = queues.register(&inbox_name(me.as_str()));
        }
        if self.inbox.is_none() {
            // Without an inbox nothing can reach this worker: stay out of the registry.
            return;
        }
        if self.last_active_unix_ms == 0 || std::mem::take(&mut self.decided) {
            self.last_active_unix_ms = now_unix_ms;
        }
        self.active = now_unix_ms.saturating_sub(self.last_active_unix_ms) < ACTIVE_MS;
        store.set(
            &alive_key(me.as_str()),
            now_unix_ms.to_string().as_bytes(),
            None,
        );
        if !self.registered {
            self.registered = register(store, me.as_str());
        }
        self.refresh_peers(store, queues, me.as_str(), now_unix_ms);
        self.refresh_uplink(store, queues);
        self.expire_senders(now_unix_ms);
        self.pending.clear();
        let table: Vec<(u64, i64)> = in_flight.iter().map(|(&k, &n)| (k, i64::from(n))).collect();
        let records = index.outbox();
        self.broadcast(queues, |p| p.active, true, &table, records);
        let mut backlog = std::mem::take(&mut self.backlog);
        backlog.extend_from_slice(records);
        self.broadcast(queues, |p| !p.active, true, &table, &backlog);
        index.clear_outbox();
    }

    /// Takes the messages waiting in `queue` (if it is this worker's inbox) and learns them into
    /// `index` at `now_unix_ms`; returns how many were taken.
    pub fn receive(
        &mut self,
        queues: &impl SharedQueues,
        queue: u32,
        now_unix_ms: u64,
        index: &mut PrefixIndex,
    ) -> usize {
        if self.inbox != Some(queue) {
            return 0;
        }
        let mut taken = 0;
        while taken < MAX_MESSAGES_PER_READY {
            let Some(bytes) = queues.dequeue(queue) else {
                break;
            };
            taken += 1;
            if bytes == SNAPSHOT_NOTICE {
                self.snapshot_notice = true;
            } else if let Some(message) = Message::decode(&bytes) {
                self.apply(queues, message, now_unix_ms, index);
            }
        }
        taken
    }

    /// Whether a snapshot notice arrived since the last call (and forgets it).
    pub fn take_snapshot_notice(&mut self) -> bool {
        std::mem::take(&mut self.snapshot_notice)
    }

    /// Whether this worker routes requests (see the module docs).
    pub fn is_active(&self) -> bool {
        self.active
    }

    fn apply(
        &mut self,
        queues: &impl SharedQueues,
        message: Message,
        now: u64,
        index: &mut PrefixIndex,
    ) {
        if message.sender == REPLICAS_SENDER {
            index.learn_groups(&message.records);
            return;
        }
        if self
            .me
            .as_ref()
            .is_some_and(|me| me.as_str() == message.sender)
        {
            return;
        }
        match self.peers.iter_mut().find(|p| p.id == message.sender) {
            Some(peer) => peer.active = message.active,
            None => {
                // A worker that started after this one's last heartbeat: answer it from now on.
                if let Some(queue) = queues.resolve(&inbox_name(&message.sender)) {
                    self.peers.push(Peer {
                        id: message.sender.clone(),
                        queue,
                        active: message.active,
                    });
                }
            }
        }
        index.learn_groups(&message.records);
        let sums = &mut self.others_in_flight;
        let sender = self.senders.entry(message.sender).or_default();
        sender.heard_unix_ms = now;
        if message.whole_table {
            for (key, count) in sender.counts.drain() {
                *sums.entry(key).or_default() -= count;
            }
        }
        for (key, count) in message.counts {
            *sender.counts.entry(key).or_default() += count;
            *sums.entry(key).or_default() += count;
        }
        sender.counts.retain(|_, n| *n != 0);
        sums.retain(|_, n| *n != 0);
    }

    /// Forgets the counts of senders silent for [`STALE_MS`].
    fn expire_senders(&mut self, now: u64) {
        let sums = &mut self.others_in_flight;
        self.senders.retain(|_, sender| {
            let live = now.saturating_sub(sender.heard_unix_ms) < STALE_MS;
            if !live {
                for (&key, &count) in &sender.counts {
                    *sums.entry(key).or_default() -= count;
                }
            }
            live
        });
        sums.retain(|_, n| *n != 0);
    }

    /// Follows [`SHARE_KEY`]: resolves the poller's uplink while records are shared, drops it
    /// otherwise (one host call, two when the uplink is new).
    fn refresh_uplink(&mut self, store: &impl SharedStore, queues: &impl SharedQueues) {
        let shared = matches!(store.get(SHARE_KEY), Some((Some(v), _)) if v == b"1");
        self.uplink = if shared {
            self.uplink.or_else(|| queues.resolve(UPLINK_QUEUE))
        } else {
            None
        };
    }

    /// Reads the registry and the peers' heartbeats: live peers are sent to (their inboxes
    /// resolved once), ids silent for [`PRUNE_MS`] are removed from the registry.
    fn refresh_peers(
        &mut self,
        store: &impl SharedStore,
        queues: &impl SharedQueues,
        me: &str,
        now: u64,
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
        let mut live = Vec::new();
        let mut silent = Vec::new();
        for &id in ids.iter().filter(|&&id| id != me) {
            let age = heartbeat_age(store, id, now);
            if age >= PRUNE_MS {
                silent.push(id);
            } else if age < STALE_MS {
                let known = self.peers.iter().find(|p| p.id == id).cloned();
                let peer = known.or_else(|| {
                    queues.resolve(&inbox_name(id)).map(|queue| Peer {
                        id: id.to_string(),
                        queue,
                        // Presumed active until its heartbeat says otherwise.
                        active: true,
                    })
                });
                live.extend(peer);
            }
        }
        self.peers = live;
        if !silent.is_empty() {
            let kept: Vec<&str> = ids.into_iter().filter(|id| !silent.contains(id)).collect();
            // Lost to a concurrent change: tried again next heartbeat.
            store.set(REGISTRY_KEY, kept.join(" ").as_bytes(), token);
        }
    }

    /// Sends one message to every peer `to` selects; returns the enqueues made.
    fn broadcast(
        &self,
        queues: &impl SharedQueues,
        to: impl Fn(&Peer) -> bool,
        whole_table: bool,
        counts: &[(u64, i64)],
        records: &[u64],
    ) -> u64 {
        let Some(me) = &self.me else {
            return 0;
        };
        if !self.peers.iter().any(&to) {
            return 0;
        }
        let mut buffer = self.buffer.borrow_mut();
        encode(
            &mut buffer,
            me.as_str(),
            whole_table,
            self.active,
            counts,
            records,
        );
        let mut sent = 0;
        for peer in self.peers.iter().filter(|p| to(p)) {
            // A failed enqueue (the peer's VM is gone) loses only what its heartbeat resends.
            queues.enqueue(peer.queue, &buffer);
            sent += 1;
        }
        sent
    }
}

/// Tells every live worker of the registry that a new snapshot was published (from the poller,
/// after publishing it); returns the host calls made (see [`to_live_workers`]).
pub fn notify_snapshot(store: &impl SharedStore, queues: &impl SharedQueues, now: u64) -> u64 {
    to_live_workers(store, queues, now, &SNAPSHOT_NOTICE)
}

/// Hands every live worker the prefix records of the other Envoy replicas (from the poller,
/// as the controller passes them on), in [`PrefixIndex::outbox`]'s form; the workers learn
/// them without publishing them again. Returns the host calls made (see [`to_live_workers`]).
pub fn deliver_replica_records(
    store: &impl SharedStore,
    queues: &impl SharedQueues,
    now: u64,
    records: &[u64],
) -> u64 {
    if records.is_empty() {
        return 0;
    }
    let mut message = Vec::new();
    encode(&mut message, REPLICAS_SENDER, false, false, &[], records);
    to_live_workers(store, queues, now, &message)
}

/// Enqueues `message` to every live worker of the registry; returns the host calls made: the
/// registry, and per worker its heartbeat, its inbox and one enqueue (tens of µs each, on the
/// poller's thread, once per snapshot or batch of the other replicas' records).
fn to_live_workers(
    store: &impl SharedStore,
    queues: &impl SharedQueues,
    now: u64,
    message: &[u8],
) -> u64 {
    let Some((Some(registry), _)) = store.get(REGISTRY_KEY) else {
        return 1;
    };
    let mut calls = 1;
    for id in std::str::from_utf8(&registry)
        .unwrap_or("")
        .split_whitespace()
    {
        calls += 1;
        if heartbeat_age(store, id, now) >= STALE_MS {
            continue;
        }
        calls += 1;
        if let Some(queue) = queues.resolve(&inbox_name(id)) {
            calls += 1;
            queues.enqueue(queue, message);
        }
    }
    calls
}

/// How long ago, at `now`, worker `id` last stamped its heartbeat (`u64::MAX` without a
/// readable stamp); one host call.
fn heartbeat_age(store: &impl SharedStore, id: &str, now: u64) -> u64 {
    store
        .get(&alive_key(id))
        .and_then(|(value, _)| value)
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
        .map_or(u64::MAX, |at| now.saturating_sub(at))
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
    use crate::scheduler::test_support::{endpoint, keys_of};
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
                .tick(host, host, now, &mut self.index, &self.in_flight);
        }

        /// Runs this worker's inbox callback, as the host would on its thread.
        fn ready(&mut self, host: &Host, now: u64) -> usize {
            let inbox = self.exchange.inbox().unwrap();
            self.exchange.receive(host, inbox, now, &mut self.index)
        }

        /// A routed decision: records, counts one in flight and sends.
        fn decide(&mut self, host: &Host, key: u64, hashes: &[u64], now: u64) -> u64 {
            self.index.record(key, hashes, now);
            *self.in_flight.entry(key).or_default() += 1;
            self.exchange.note_in_flight(key, 1);
            self.exchange.send(host, &mut self.index)
        }

        fn end(&mut self, key: u64) {
            *self.in_flight.get_mut(&key).unwrap() -= 1;
            self.exchange.note_in_flight(key, -1);
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
    fn messages_round_trip_and_garbage_is_refused() {
        let message = Message {
            sender: "12.345678901".to_string(),
            whole_table: true,
            active: true,
            counts: vec![(1, 2), (3, -4)],
            records: vec![9, 8, 1, 5],
        };
        let mut bytes = Vec::new();
        message.encode_into(&mut bytes);
        assert_eq!(Message::decode(&bytes), Some(message));
        assert_eq!(Message::decode(&bytes[1..]), None);
        assert_eq!(Message::decode(b"not a message!!!"), None);
        assert_eq!(Message::decode(&[]), None);
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // claims a 2^64-byte id
        assert_eq!(Message::decode(&huge), None);
        let mut counts = bytes.clone();
        counts[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // claims 2^64 counts
        assert_eq!(Message::decode(&counts), None);
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
        assert_eq!(w[2].exchange.others_in_flight(5), 3);
        assert_eq!(w[2].exchange.others_in_flight(6), 1);
        assert_eq!(w[0].exchange.others_in_flight(5), 1, "not its own");
        // Ends travel with the next message (or heartbeat).
        w[1].end(5);
        w[1].end(6);
        w[1].decide(&host, 7, &[5], 1_003);
        w[2].ready(&host, 1_004);
        assert_eq!(
            (0..3)
                .map(|k| w[2].exchange.others_in_flight(5 + k))
                .collect::<Vec<_>>(),
            vec![2, 0, 1]
        );
        // A lost message is corrected by the next heartbeat's whole table.
        w[1].end(7);
        w[1].tick(&host, 2_000);
        w[2].ready(&host, 2_000);
        assert_eq!(w[2].exchange.others_in_flight(7), 0);
        // Worker 0 goes silent (its VM died): its counts expire, then it leaves the registry.
        let silent = w[0].exchange.id().unwrap().as_str().to_string();
        for now in [1_010 + STALE_MS, 1_020 + PRUNE_MS] {
            w[1].tick(&host, now);
            w[2].ready(&host, now);
            w[2].tick(&host, now);
            w[1].ready(&host, now);
        }
        assert_eq!(w[2].exchange.others_in_flight(5), 0);
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
        assert_eq!(w[0].exchange.others_in_flight(1), 0);
        assert_eq!(w[0].exchange.peers(), (0, 0));
    }
}
