//! How the workers of one Envoy process share what each of them learns — prefix-index records
//! and in-flight counts (requests, and prompt bytes still to prefill) — pushed through proxy-wasm shared queues as decisions happen, with a
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
//!
//! The parts: this module is one worker's side ([`Exchange`]); `message` is the inbox wire
//! format, `registry` the worker ids, heartbeats and inbox names in shared data, and
//! `from_poller` what the poller sends every live worker.

mod from_poller;
mod message;
mod registry;

use std::cell::RefCell;
use std::collections::HashMap;

use crate::lease::{claim_id_at, HolderId};
use crate::scheduler::prefix::PrefixIndex;
use crate::scheduler::InFlight;
use crate::shared_data::{SharedQueues, SharedStore};
pub use from_poller::{deliver_replica_records, notify_snapshot};
use message::{encode, REPLICAS_SENDER, SNAPSHOT_NOTICE};
pub use message::{Counts, Message};
use registry::{alive_key, heartbeat_age, inbox_name, register};
pub use registry::{MAX_WORKERS, REGISTRY_KEY, WORKER_SEQUENCE_KEY};

/// How often a worker stamps its heartbeat, refreshes its peers and resends its whole table.
pub const HEARTBEAT_MS: u64 = 1_000;
/// A peer not heard from for this long no longer counts in flight and is sent nothing.
pub const STALE_MS: u64 = 5_000;
/// A worker whose heartbeat is this old is removed from the registry.
pub const PRUNE_MS: u64 = 30_000;
/// Most messages one inbox callback takes (each enqueue posts a callback, so the rest are
/// taken by the next ones).
const MAX_MESSAGES_PER_READY: usize = 4_096;
/// The poller's queue for this Envoy's records, registered only while replicas share them.
pub const UPLINK_QUEUE: &str = "wasm-epp.uplink";
/// Shared-data key: `1` while this Envoy's records go to the other replicas (the poller
/// writes it as the controller says), else `0` or absent.
pub const SHARE_KEY: &str = "wasm-epp.uplink.share";
/// A worker that has routed no request for this long (and is older than this) is inactive.
pub const ACTIVE_MS: u64 = 10_000;
/// Most record words kept for the peers that get them with the heartbeat.
const BACKLOG_MAX_WORDS: usize = crate::scheduler::prefix::index::OUTBOX_MAX_WORDS;

/// What this worker was told by another one.
#[derive(Debug, Default)]
struct Sender {
    /// What it has in flight by endpoint key, as its messages built them up.
    counts: HashMap<u64, Counts>,
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
    others_in_flight: HashMap<u64, Counts>,
    /// This worker's in-flight changes not sent yet.
    pending: Vec<(u64, Counts)>,
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

    /// What the other live workers have in flight to the endpoint `key` (never negative).
    pub fn others_in_flight(&self, key: u64) -> InFlight {
        let sum = self.others_in_flight.get(&key).copied().unwrap_or_default();
        InFlight {
            requests: u64::try_from(sum.requests).unwrap_or(0),
            prefill_bytes: u64::try_from(sum.prefill_bytes).unwrap_or(0),
        }
    }

    /// Notes a change of this worker's in-flight counts to the endpoint `key`; it travels with
    /// the next message.
    pub fn note_in_flight(&mut self, key: u64, change: Counts) {
        match self.pending.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pending)) => pending.add(change),
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
        if woke || !records.is_empty() || self.pending.iter().any(|c| !c.1.is_zero()) {
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
        in_flight: &HashMap<u64, InFlight>,
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
        let table: Vec<(u64, Counts)> = in_flight
            .iter()
            .map(|(&key, n)| {
                let counts = Counts {
                    requests: i64::try_from(n.requests).unwrap_or(i64::MAX),
                    prefill_bytes: i64::try_from(n.prefill_bytes).unwrap_or(i64::MAX),
                };
                (key, counts)
            })
            .collect();
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
                sums.entry(key).or_default().subtract(count);
            }
        }
        for (key, count) in message.counts {
            sender.counts.entry(key).or_default().add(count);
            sums.entry(key).or_default().add(count);
        }
        sender.counts.retain(|_, n| !n.is_zero());
        sums.retain(|_, n| !n.is_zero());
    }

    /// Forgets the counts of senders silent for [`STALE_MS`].
    fn expire_senders(&mut self, now: u64) {
        let sums = &mut self.others_in_flight;
        self.senders.retain(|_, sender| {
            let live = now.saturating_sub(sender.heard_unix_ms) < STALE_MS;
            if !live {
                for (&key, &count) in &sender.counts {
                    sums.entry(key).or_default().subtract(count);
                }
            }
            live
        });
        sums.retain(|_, n| !n.is_zero());
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
        counts: &[(u64, Counts)],
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

#[cfg(test)]
mod tests;
