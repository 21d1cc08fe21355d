//! Proxy-wasm shared data, which every worker of the Envoy process sees (namespaced by
//! `vm_id`): the published snapshot with a small version key, per-endpoint in-flight
//! counters, the prefix index and the poller lease. Only the `Result`-returning hostcalls are
//! used, so a host error never traps.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use crate::lease::LeaseStore;
use crate::scheduler::prefix::BlockStore;
use crate::snapshot::SnapshotId;

/// Key holding the snapshot's identity (`<version>@<instance>`), read on every request.
const VERSION_KEY: &str = "wasm-epp.snapshot.version";
/// Key holding the snapshot JSON, read only when the version changes.
const SNAPSHOT_KEY: &str = "wasm-epp.snapshot";
/// Prefix of the prefix-index bucket keys (`…<bucket>`).
const PREFIX_BUCKET_PREFIX: &str = "wasm-epp.prefix.";
/// Prefix of the in-flight counter keys (`…<ip:port>`).
const IN_FLIGHT_PREFIX: &str = "wasm-epp.inflight.";
/// Attempts at a compare-and-swap update before giving up.
const CAS_ATTEMPTS: usize = 16;

/// The published snapshot's identity in its text form, if any. One host call: the host's
/// shared-data mutex and a copy of a few dozen bytes, on every request.
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

/// This proxy's in-flight requests to `endpoint` (`ip:port`).
pub fn in_flight(endpoint: &str) -> u64 {
    read_u64(&format!("{IN_FLIGHT_PREFIX}{endpoint}"))
        .0
        .unwrap_or(0)
}

/// Adds `delta` to the in-flight counter of `endpoint`, never below zero.
pub fn add_in_flight(endpoint: &str, delta: i64) {
    let key = format!("{IN_FLIGHT_PREFIX}{endpoint}");
    for _ in 0..CAS_ATTEMPTS {
        let (value, cas) = read_u64(&key);
        let next = value.unwrap_or(0).saturating_add_signed(delta);
        match hostcalls::set_shared_data(&key, Some(next.to_string().as_bytes()), cas) {
            Err(Status::CasMismatch) => continue,
            Ok(()) | Err(_) => return,
        }
    }
}

fn read_u64(key: &str) -> (Option<u64>, Option<u32>) {
    match hostcalls::get_shared_data(key) {
        Ok((bytes, cas)) => {
            let value = bytes.and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok());
            (value, cas)
        }
        Err(_) => (None, None),
    }
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

/// The prefix index's buckets in shared data, one key per bucket, updated with CAS.
pub struct SharedPrefixStore {
    buckets: u32,
}

impl SharedPrefixStore {
    /// A store of `buckets` buckets.
    pub fn new(buckets: u32) -> SharedPrefixStore {
        SharedPrefixStore {
            buckets: buckets.max(1),
        }
    }
}

impl BlockStore for SharedPrefixStore {
    fn buckets(&self) -> u32 {
        self.buckets
    }

    fn read(&self, bucket: u32) -> (Vec<u8>, Option<u32>) {
        match hostcalls::get_shared_data(&format!("{PREFIX_BUCKET_PREFIX}{bucket}")) {
            Ok((bytes, cas)) => (bytes.unwrap_or_default(), cas),
            Err(_) => (Vec::new(), None),
        }
    }

    fn write(&self, bucket: u32, bytes: &[u8], token: Option<u32>) -> bool {
        let key = format!("{PREFIX_BUCKET_PREFIX}{bucket}");
        hostcalls::set_shared_data(&key, Some(bytes), token).is_ok()
    }
}

/// The poller lease's keys in shared data.
pub struct SharedLeaseStore;

impl LeaseStore for SharedLeaseStore {
    fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
        hostcalls::get_shared_data(key).ok()
    }

    fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool {
        hostcalls::set_shared_data(key, Some(value), token).is_ok()
    }
}
