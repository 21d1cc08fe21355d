//! What the snapshot poller sends every live worker of the registry: a notice of each new
//! snapshot and the other Envoy replicas' prefix records.

use super::message::{encode, REPLICAS_SENDER, SNAPSHOT_NOTICE};
use super::registry::{heartbeat_age, inbox_name, REGISTRY_KEY};
use super::STALE_MS;
use crate::shared_data::{SharedQueues, SharedStore};

/// Tells every live worker of the registry that a new snapshot was published (from the poller,
/// after publishing it); returns the host calls made (the registry, and per worker its
/// heartbeat, its inbox and one enqueue).
pub fn notify_snapshot(store: &impl SharedStore, queues: &impl SharedQueues, now: u64) -> u64 {
    to_live_workers(store, queues, now, &SNAPSHOT_NOTICE)
}

/// Hands every live worker the prefix records of the other Envoy replicas (from the poller,
/// as the controller passes them on), in the form of
/// [`PrefixIndex::outbox`](crate::scheduler::prefix::PrefixIndex::outbox); the workers learn
/// them without publishing them again. Returns the host calls made, as [`notify_snapshot`].
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
