//! Proxy-wasm shared data, which every worker of the Envoy process sees (namespaced by
//! `vm_id`): the published snapshot with a small identity key, and the keys of the poller
//! lease and the workers' exchange, through [`SharedHost`]. Only the `Result`-returning
//! hostcalls are used, so a host error never traps. Each call takes the host's process-wide
//! shared-data mutex and copies the value (twice: under the lock, then into Wasm memory), so
//! none is made per prompt block or per endpoint.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use super::calls::counted;
use crate::shared_data::{SharedQueues, SharedStore};
use crate::snapshot::SnapshotId;

/// Key holding the snapshot's identity (`<version>@<instance>`).
const VERSION_KEY: &str = "wasm-epp.snapshot.version";
/// Key holding the snapshot JSON, read only when the identity changes.
const SNAPSHOT_KEY: &str = "wasm-epp.snapshot";

/// The published snapshot's identity in its text form, if any (one host call, a few dozen
/// bytes).
pub fn snapshot_id_text() -> Option<Vec<u8>> {
    hostcalls::get_shared_data(VERSION_KEY).ok()?.0
}

/// The published snapshot's identity, if any (and readable).
pub fn snapshot_id() -> Option<SnapshotId> {
    let text = snapshot_id_text()?;
    SnapshotId::from_text(std::str::from_utf8(&text).ok()?)
}

/// The published snapshot JSON.
pub fn snapshot_json() -> Option<Vec<u8>> {
    hostcalls::get_shared_data(SNAPSHOT_KEY).ok()?.0
}

/// Publishes a snapshot: the JSON first, then its identity, so a reader that sees the new
/// identity also finds the JSON.
pub fn publish_snapshot(id: &SnapshotId, json: &[u8]) -> Result<(), Status> {
    hostcalls::set_shared_data(SNAPSHOT_KEY, Some(json), None)?;
    hostcalls::set_shared_data(VERSION_KEY, Some(id.to_text().as_bytes()), None)
}

/// Wall-clock time from the host, nanoseconds since the Unix epoch (0 if unavailable).
pub fn now_ns() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Wall-clock time from the host, milliseconds since the Unix epoch (0 if unavailable).
pub fn now_unix_ms() -> u64 {
    now_ns() / 1_000_000
}

/// This plugin's `vm_id` (the namespace of its shared data and queues), read once.
pub fn vm_id() -> String {
    hostcalls::get_property(vec!["plugin_vm_id"])
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_default()
}

/// Shared data through the host calls, for the plain modules (lease, exchange).
pub struct SharedHost;

impl SharedStore for SharedHost {
    fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
        hostcalls::get_shared_data(key).ok()
    }

    fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool {
        hostcalls::set_shared_data(key, Some(value), token).is_ok()
    }
}

/// [`SharedHost`] on the request path: each call is counted in the request's host calls.
pub struct CountedSharedHost;

impl SharedStore for CountedSharedHost {
    fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
        counted(hostcalls::get_shared_data(key)).ok()
    }

    fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool {
        counted(hostcalls::set_shared_data(key, Some(value), token)).is_ok()
    }
}

/// Shared queues through the host calls, for the exchange between workers: a queue is resolved
/// within this plugin's `vm_id`. An enqueue takes the host's queue mutex, copies the message
/// and posts a callback to the registering worker's event loop.
pub struct QueueHost {
    /// The plugin's `vm_id`.
    pub vm_id: String,
}

impl SharedQueues for QueueHost {
    fn register(&self, name: &str) -> Option<u32> {
        hostcalls::register_shared_queue(name).ok()
    }

    fn resolve(&self, name: &str) -> Option<u32> {
        hostcalls::resolve_shared_queue(&self.vm_id, name)
            .ok()
            .flatten()
    }

    fn enqueue(&self, queue: u32, message: &[u8]) -> bool {
        hostcalls::enqueue_shared_queue(queue, Some(message)).is_ok()
    }

    fn dequeue(&self, queue: u32) -> Option<Vec<u8>> {
        hostcalls::dequeue_shared_queue(queue).ok().flatten()
    }
}
