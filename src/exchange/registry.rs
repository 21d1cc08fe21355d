//! The registry of live workers in shared data: each worker's id (drawn from a shared
//! counter), its heartbeat stamp and its inbox queue's name, and the space-separated list of
//! ids every worker reads to find its peers.

use crate::shared_data::SharedStore;

/// Shared counter the worker ids are drawn from.
pub const WORKER_SEQUENCE_KEY: &str = "wasm-epp.worker.sequence";
/// Shared-data key of the registry of worker ids.
pub const REGISTRY_KEY: &str = "wasm-epp.workers";
/// Most ids in the registry; the oldest entry makes room for a new one.
pub const MAX_WORKERS: usize = 64;

/// The inbox queue name of worker `id`.
pub(super) fn inbox_name(id: &str) -> String {
    format!("wasm-epp.inbox.{id}")
}

/// The heartbeat key of worker `id`.
pub(super) fn alive_key(id: &str) -> String {
    format!("wasm-epp.worker.{id}.alive")
}

/// How long ago, at `now`, worker `id` last stamped its heartbeat (`u64::MAX` without a
/// readable stamp); one host call.
pub(super) fn heartbeat_age(store: &impl SharedStore, id: &str, now: u64) -> u64 {
    store
        .get(&alive_key(id))
        .and_then(|(value, _)| value)
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
        .map_or(u64::MAX, |at| now.saturating_sub(at))
}

/// Adds `me` to the registry (dropping the oldest ids beyond [`MAX_WORKERS`]); whether it is
/// there now.
pub(super) fn register(store: &impl SharedStore, me: &str) -> bool {
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
