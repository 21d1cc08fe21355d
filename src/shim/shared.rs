//! Proxy-wasm shared data, which every worker of the Envoy process sees (namespaced by
//! `vm_id`): the published snapshot with a small identity key, and the keys of the poller
//! lease and the workers' exchange, through [`SharedHost`]. Only the `Result`-returning
//! hostcalls are used, so a host error never traps. Each call takes the host's process-wide
//! shared-data mutex and copies the value (twice: under the lock, then into Wasm memory), so
//! none is made per prompt block or per endpoint.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use crate::shared_data::SharedStore;
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
