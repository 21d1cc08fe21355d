//! The decision state every ext_proc stream shares: the newest snapshot, one
//! [`Director`](wasm_epp::director::Director) with an in-memory prefix index, per-endpoint in-flight
//! counts and the time each decision took. The same decision the Wasm filter makes, with the
//! same defaults ([`FilterConfig::default`]: fail-close, 16,384 prefix buckets).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use wasm_epp::director::{Director, Incoming, Outcome};
use wasm_epp::plugin_config::FilterConfig;
use wasm_epp::scheduler;
use wasm_epp::scheduler::prefix::PrefixIndex;
use wasm_epp::snapshot::{Snapshot, SnapshotId};

use super::timing::Durations;

/// The director and the prefix index it reads and updates, used under one lock.
#[derive(Debug)]
struct Scheduling {
    director: Director,
    prefix_index: PrefixIndex,
}

/// State shared by all streams of one server.
#[derive(Debug)]
pub struct PickState {
    config: FilterConfig,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    scheduling: Mutex<Scheduling>,
    in_flight: Mutex<HashMap<String, u64>>,
    durations: Mutex<Durations>,
}

/// Locks `mutex`, recovering the data if a holder panicked (the state stays usable).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl PickState {
    /// State without a snapshot; random choices start from `seed`.
    pub fn new(seed: u64) -> PickState {
        let config = FilterConfig::default();
        PickState {
            scheduling: Mutex::new(Scheduling {
                director: Director::new(seed),
                prefix_index: PrefixIndex::new(config.prefix_index_buckets),
            }),
            config,
            snapshot: RwLock::new(None),
            in_flight: Mutex::new(HashMap::new()),
            durations: Mutex::new(Durations::default()),
        }
    }

    /// The identity of the snapshot in use, if any.
    pub fn snapshot_id(&self) -> Option<SnapshotId> {
        self.current().map(|s| s.id())
    }

    /// The number of endpoints in the snapshot in use, if any.
    pub fn endpoint_count(&self) -> Option<usize> {
        self.current().map(|s| s.endpoints.len())
    }

    /// Uses `snapshot`, the answer to a poll sent while holding `asked`, if it replaces the
    /// one in use ([`SnapshotId::replaces`], as the filter's poller); `true` when it was taken.
    pub fn publish(&self, snapshot: Snapshot, asked: Option<&SnapshotId>) -> bool {
        let mut current = self
            .snapshot
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let held = current.as_ref().map(|s| s.id());
        if !snapshot.id().replaces(held.as_ref(), asked) {
            return false;
        }
        *current = Some(Arc::new(snapshot));
        true
    }

    fn current(&self) -> Option<Arc<Snapshot>> {
        self.snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Decides one request with the newest snapshot and records how long the decision took.
    /// The `request` part of `incoming` (everything but the time) comes from the caller.
    pub fn decide(&self, incoming: &Incoming<'_>) -> Outcome {
        let snapshot = self.current();
        let incoming = Incoming {
            now_unix_ms: now_unix_ms(),
            ..*incoming
        };
        let started = Instant::now();
        let outcome = {
            let mut scheduling = lock(&self.scheduling);
            let Scheduling {
                director,
                prefix_index,
            } = &mut *scheduling;
            director.decide(
                snapshot.as_deref(),
                &self.config,
                &incoming,
                // Requests only: the baseline counts no prompt bytes still to prefill (the
                // overhead benchmark's default profile reads neither).
                |e| scheduler::InFlight {
                    requests: self.in_flight_of(&e.host_port()),
                    prefill_bytes: 0,
                },
                prefix_index,
                // No session_id bindings in the baseline.
                None,
            )
        };
        lock(&self.durations).record(started.elapsed());
        outcome
    }

    /// Counts a request in flight on `endpoint` (`ip:port`) until the guard is dropped.
    pub fn start_request(self: &Arc<Self>, endpoint: String) -> InFlight {
        *lock(&self.in_flight).entry(endpoint.clone()).or_insert(0) += 1;
        InFlight {
            state: self.clone(),
            endpoint,
        }
    }

    /// Requests counted in flight on `endpoint`.
    pub fn in_flight_of(&self, endpoint: &str) -> u64 {
        lock(&self.in_flight).get(endpoint).copied().unwrap_or(0)
    }

    /// A one-line summary of the decision times so far.
    pub fn durations_summary(&self) -> String {
        lock(&self.durations).summary()
    }
}

/// One request counted in flight on an endpoint; dropping it (the ext_proc stream ended)
/// releases the count.
#[derive(Debug)]
pub struct InFlight {
    state: Arc<PickState>,
    endpoint: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = lock(&self.state.in_flight);
        if let Some(count) = counts.get_mut(&self.endpoint) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.endpoint);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wasm_epp::scheduler::profile::Profile;
    use wasm_epp::snapshot::{Endpoint, Metrics};

    /// A snapshot of `version` with endpoints 10.0.0.1:8000 … 10.0.0.n:8000, all idle.
    pub(crate) fn snapshot(version: u64, n: u8) -> Snapshot {
        Snapshot {
            instance: String::new(),
            version,
            generated_unix_ms: 0,
            profile: Profile::default(),
            endpoints: (1..=n)
                .map(|i| Endpoint {
                    name: format!("pod-{i}"),
                    address: format!("10.0.0.{i}"),
                    port: 8000,
                    ready: true,
                    key_cache: Default::default(),
                    labels: Default::default(),
                    metrics: Metrics {
                        updated_unix_ms: Some(now_unix_ms()),
                        ..Metrics::default()
                    },
                })
                .collect(),
            objectives: Default::default(),
            rewrites: Vec::new(),
            vouched_ms: 0,
            scoring_cache: Default::default(),
        }
    }

    #[test]
    fn keeps_the_newest_snapshot() {
        let state = PickState::new(1);
        let version = |state: &PickState| state.snapshot_id().map(|id| id.version);
        assert_eq!(state.snapshot_id(), None);
        assert_eq!(state.endpoint_count(), None);
        assert!(state.publish(snapshot(3, 1), None));
        let asked_older = snapshot(1, 1).id();
        assert!(!state.publish(snapshot(2, 1), Some(&asked_older)));
        assert!(!state.publish(snapshot(3, 1), None));
        assert_eq!(version(&state), Some(3));
        assert!(state.publish(snapshot(4, 2), None));
        assert_eq!(version(&state), Some(4));
        assert_eq!(state.endpoint_count(), Some(2));
        // The controller's answer to a poll for exactly what is held replaces it.
        let held = state.snapshot_id();
        assert!(state.publish(snapshot(2, 1), held.as_ref()));
        assert_eq!(version(&state), Some(2));
    }

    #[test]
    fn decides_fail_close_without_a_snapshot_and_routes_with_one() {
        let state = PickState::new(1);
        let incoming = Incoming {
            path: "/v1/completions",
            body: Some(br#"{"model":"m","prompt":"hi"}"#),
            ..Incoming::default()
        };
        assert!(matches!(state.decide(&incoming), Outcome::Reject(e) if e.status() == 503));
        state.publish(snapshot(1, 2), None);
        let Outcome::Route(route) = state.decide(&incoming) else {
            panic!("expected a route");
        };
        assert!(route.primary.starts_with("10.0.0."), "{route:?}");
        assert!(state.durations_summary().starts_with("count=2 "));
    }

    #[test]
    fn in_flight_counts_follow_the_guards() {
        let state = Arc::new(PickState::new(1));
        let a = state.start_request("10.0.0.1:8000".into());
        let b = state.start_request("10.0.0.1:8000".into());
        assert_eq!(state.in_flight_of("10.0.0.1:8000"), 2);
        drop(a);
        assert_eq!(state.in_flight_of("10.0.0.1:8000"), 1);
        drop(b);
        assert_eq!(state.in_flight_of("10.0.0.1:8000"), 0);
        assert!(lock(&state.in_flight).is_empty());
    }
}
