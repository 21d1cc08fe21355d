//! The versioned snapshot the controller serves and every Envoy worker reads.
//!
//! Decoding ignores fields it does not know, so a filter keeps working with a newer
//! controller during an upgrade (a plugin type it does not know still fails the snapshot,
//! and the filter keeps the previous one).
//!
//! The controller builds it (endpoints, their latest scraped metrics with freshness, and the
//! compiled scheduling profile) and serves it as JSON; the filter's poller stores the JSON in
//! proxy-wasm shared data and each worker decodes it again only when the version changes.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::scheduler::fixed_scores::ScoringCache;
use crate::scheduler::profile::Profile;

/// One complete view of the pool at a point in time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The controller process that built it: a random id drawn at start-up, so a restarted
    /// (or another) controller is recognised whatever its versions and clock say.
    #[serde(default)]
    pub instance: String,
    /// Strictly increasing within one controller instance (see [`SnapshotId`]).
    pub version: u64,
    /// Wall-clock time the snapshot was built, milliseconds since the Unix epoch.
    pub generated_unix_ms: u64,
    /// The compiled scheduling profile every request is scheduled with.
    pub profile: Profile,
    /// Every endpoint of the pool, in a stable order.
    pub endpoints: Vec<Endpoint>,
    /// InferenceObjective priorities by objective name (requests name one in
    /// `x-llm-d-inference-objective`; unknown or none → priority 0).
    #[serde(default)]
    pub objectives: BTreeMap<String, i32>,
    /// InferenceModelRewrite objects, oldest first (the oldest matching object wins).
    #[serde(default)]
    pub rewrites: Vec<ModelRewrite>,
    /// For how long after `generated_unix_ms` the controller vouches for this snapshot's
    /// metric ages: it publishes again within this time, and at once when an endpoint's
    /// metrics become stale or fresh again. Meanwhile metrics are aged as of
    /// `generated_unix_ms`; past it (a silent controller) by the wall clock, from there. So
    /// metrics that were only scraped again need no new snapshot 10 times a second (each one
    /// cost every Envoy about 1.2 ms of CPU, measured idle on the 2-core VM). 0 (older
    /// controllers): aged by the wall clock.
    #[serde(default)]
    pub vouched_ms: u64,
    /// The scores that depend only on this snapshot's metrics, kept between requests (not
    /// serialised).
    #[serde(skip)]
    pub scoring_cache: ScoringCache,
}

/// One InferenceModelRewrite object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRewrite {
    /// `namespace/name` of the object.
    pub name: String,
    /// Rules in list order.
    pub rules: Vec<RewriteRule>,
}

/// One rule: which incoming models it matches and the weighted targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteRule {
    /// Exact model names matched (OR); empty = catch-all.
    #[serde(default)]
    pub matches: Vec<String>,
    /// Targets to rewrite to.
    pub targets: Vec<RewriteTarget>,
}

/// A rewrite target with its optional weight (1..1,000,000).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteTarget {
    /// The model name requests are rewritten to.
    pub model: String,
    /// Relative weight; `None` when the rule's targets are unweighted.
    #[serde(default)]
    pub weight: Option<u32>,
}

/// One model-server endpoint (one `ip:port`; a pod with several target ports is several).
///
/// Laid out for the pick, which reads a few fields of every endpoint: the fields a decision
/// reads of each candidate (`key_cache`, `ready`, then the metrics' queue, running and KV
/// usage, see [`Metrics`]) come first, and each endpoint starts a 64-byte cache line, so a
/// pick over many endpoints touches one line per endpoint (in Envoy, where the pool is cold
/// in the cache between requests, this was measured to matter at 1,000 endpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[repr(C, align(64))]
pub struct Endpoint {
    /// [`Endpoint::index_key`], computed on first use (not serialised).
    #[serde(skip)]
    pub key_cache: KeyCache,
    /// Whether the controller reaches it: false after `--failed-scrapes-before-unready`
    /// consecutive failed scrapes, true again after one success. The filter picks only ready
    /// endpoints while any candidate is ready. Absent (older controllers) means ready.
    #[serde(default = "ready_by_default")]
    pub ready: bool,
    /// Serving port; metrics are scraped from the same port.
    pub port: u16,
    /// The latest scraped metrics.
    #[serde(default)]
    pub metrics: Metrics,
    /// Stable identity, `namespace/name` when a namespace is known, else `name`.
    pub name: String,
    /// IP address (IPv4 or IPv6, without brackets).
    pub address: String,
    /// Endpoint labels (pod labels, or the file-discovery `labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Holds an endpoint's [`Endpoint::index_key`] once computed. It never affects comparisons:
/// two caches are always equal.
#[derive(Debug, Clone, Default)]
pub struct KeyCache(OnceLock<u64>);

impl PartialEq for KeyCache {
    fn eq(&self, _: &KeyCache) -> bool {
        true
    }
}

fn ready_by_default() -> bool {
    true
}

impl Endpoint {
    /// The key the prefix index remembers this endpoint by: a hash of its address and port,
    /// computed once per decoded snapshot (later calls are one atomic load).
    pub fn index_key(&self) -> u64 {
        *self.key_cache.0.get_or_init(|| {
            let mut bytes = Vec::with_capacity(self.address.len() + 2);
            bytes.extend_from_slice(self.address.as_bytes());
            bytes.extend_from_slice(&self.port.to_le_bytes());
            xxh3_64(&bytes)
        })
    }

    /// The `host:port` form used in `x-gateway-destination-endpoint` (IPv6 bracketed).
    pub fn host_port(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }
}

/// Metrics scraped from one endpoint's `/metrics`. A failed scrape keeps the previous values and
/// does not move `updated_unix_ms`; an endpoint never scraped successfully has it `None`.
///
/// The fields every pick reads (queue, running requests, KV usage, decode speed) come first, in
/// this order
/// (see [`Endpoint`]'s layout).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[repr(C)]
pub struct Metrics {
    /// `vllm:num_requests_waiting`.
    pub waiting_queue_size: u64,
    /// `vllm:num_requests_running`.
    pub running_requests_size: u64,
    /// `vllm:kv_cache_usage_perc` (or the older `vllm:gpu_cache_usage_perc`), a fraction 0..1.
    pub kv_cache_usage: f64,
    /// The server's measured time per output token, in milliseconds: the controller's
    /// moving mean over its inter-token-latency histogram (`vllm:inter_token_latency_seconds`).
    /// 0 while unknown (no tokens decoded yet, or an engine that reports no such histogram).
    pub decode_ms_per_token: f64,
    /// The most requests the controller has seen the server run at once: once the server has
    /// been full, its batch limit (`--max-num-seqs`, or fewer when the KV cache binds first).
    pub peak_running_requests: u64,
    /// The mean length of the server's requests, in output tokens: the controller's moving mean
    /// over its histogram of generated tokens per finished request
    /// (`vllm:request_generation_tokens`). 0 while unknown (no request finished yet, or an
    /// engine that reports no such histogram).
    pub output_tokens_per_request: f64,
    /// LoRA adapters running (`running_lora_adapters` of `vllm:lora_requests_info`).
    pub active_models: Vec<String>,
    /// LoRA adapters waiting (`waiting_lora_adapters`).
    pub waiting_models: Vec<String>,
    /// `max_lora`; 0 when the server does not report it.
    pub max_active_models: u32,
    /// `block_size` label of `vllm:cache_config_info`, in tokens.
    pub block_size: Option<u32>,
    /// `num_gpu_blocks` label of `vllm:cache_config_info`.
    pub num_gpu_blocks: Option<u64>,
    /// When a scrape last succeeded, milliseconds since the Unix epoch.
    pub updated_unix_ms: Option<u64>,
}

/// Which snapshot a consumer holds: the controller instance and its version there. Versions
/// compare only within one instance; a snapshot from another instance is always different,
/// never older.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotId {
    /// [`Snapshot::instance`].
    pub instance: String,
    /// [`Snapshot::version`].
    pub version: u64,
}

impl SnapshotId {
    /// The text form stored for workers and sent back in polls: `<version>@<instance>`.
    pub fn to_text(&self) -> String {
        format!("{}@{}", self.version, self.instance)
    }

    /// Parses [`to_text`](Self::to_text)'s form (a bare version is an instance-less id).
    pub fn from_text(text: &str) -> Option<SnapshotId> {
        let (version, instance) = text.split_once('@').unwrap_or((text, ""));
        Some(SnapshotId {
            instance: instance.to_string(),
            version: version.parse().ok()?,
        })
    }

    /// Whether a consumer holding `held` takes `self`, which answered a poll sent while it
    /// held `asked`:
    /// - nothing held, or a different controller instance: yes (a restarted controller whose
    ///   clock is behind is not ignored);
    /// - the same instance and a greater version: yes;
    /// - a smaller version that answered a poll for exactly what is held: yes, the
    ///   controller says what is held is not its own (an absurd version never blocks
    ///   updates);
    /// - otherwise no (a slow answer to an older poll never rolls a consumer back).
    pub fn replaces(&self, held: Option<&SnapshotId>, asked: Option<&SnapshotId>) -> bool {
        match held {
            None => true,
            Some(held) if held == self => false,
            Some(held) => {
                held.instance != self.instance || self.version > held.version || asked == Some(held)
            }
        }
    }
}

impl Snapshot {
    /// The time to age this snapshot's metrics at, at wall-clock time `now_unix_ms` (see
    /// [`vouched_ms`](Self::vouched_ms)).
    pub fn metrics_clock(&self, now_unix_ms: u64) -> u64 {
        if self.vouched_ms == 0 {
            return now_unix_ms;
        }
        self.generated_unix_ms
            .max(now_unix_ms.saturating_sub(self.vouched_ms))
    }

    /// This snapshot's identity.
    pub fn id(&self) -> SnapshotId {
        SnapshotId {
            instance: self.instance.clone(),
            version: self.version,
        }
    }

    /// Decodes a snapshot served by the controller.
    pub fn from_json(bytes: &[u8]) -> Result<Snapshot, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid snapshot: {e}"))
    }

    /// Encodes the snapshot as the controller serves it.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain data structures with string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn metrics_age_with_the_snapshot_while_the_controller_vouches_for_them() {
        let mut snapshot: Snapshot = serde_json::from_value(serde_json::json!({
            "version": 1, "generated_unix_ms": 10_000, "endpoints": [],
            "profile": Profile::default(),
        }))
        .unwrap();
        // Older controllers: the wall clock.
        assert_eq!(snapshot.vouched_ms, 0);
        assert_eq!(snapshot.metrics_clock(12_345), 12_345);
        snapshot.vouched_ms = 2_000;
        // Within the vouch, as of the snapshot; past it, the wall clock from there.
        assert_eq!(snapshot.metrics_clock(10_500), 10_000);
        assert_eq!(snapshot.metrics_clock(12_000), 10_000);
        assert_eq!(snapshot.metrics_clock(12_500), 10_500);
        // A wall clock behind the controller's never ages metrics backwards past the snapshot.
        assert_eq!(snapshot.metrics_clock(9_000), 10_000);
    }

    #[test]
    fn round_trips_and_tolerates_fields_from_newer_controllers() {
        let snapshot = Snapshot {
            instance: "c0ffee".into(),
            version: 7,
            generated_unix_ms: 1,
            profile: Profile::default(),
            endpoints: vec![Endpoint {
                name: "ns/a".into(),
                address: "fd00::1".into(),
                port: 8000,
                ready: true,
                key_cache: Default::default(),
                labels: BTreeMap::new(),
                metrics: Metrics::default(),
            }],
            objectives: BTreeMap::from([("batch".to_string(), -1)]),
            rewrites: Vec::new(),
            vouched_ms: 0,
            scoring_cache: Default::default(),
        };
        assert_eq!(
            Snapshot::from_json(&snapshot.to_json()),
            Ok(snapshot.clone())
        );
        assert_eq!(snapshot.endpoints[0].host_port(), "[fd00::1]:8000");
        let mut value: serde_json::Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
        value["future_field"] = serde_json::json!(1);
        value["endpoints"][0]["metrics"]["future_metric"] = serde_json::json!(2.5);
        let decoded = Snapshot::from_json(&serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(decoded, snapshot);
        assert!(Snapshot::from_json(b"{\"version\": 1}").is_err());
    }

    fn id(instance: &str, version: u64) -> SnapshotId {
        SnapshotId {
            instance: instance.into(),
            version,
        }
    }

    #[test]
    fn identities_round_trip_as_text() {
        let held = id("9f3a", 1_700_000_000_123);
        assert_eq!(SnapshotId::from_text(&held.to_text()), Some(held));
        assert_eq!(SnapshotId::from_text("42"), Some(id("", 42)));
        assert_eq!(SnapshotId::from_text("x@a"), None);
    }

    #[test]
    fn newer_versions_and_other_instances_replace_the_held_snapshot() {
        let held = id("a", 100);
        assert!(id("a", 101).replaces(Some(&held), Some(&held)));
        assert!(id("a", 1).replaces(None, None));
        assert!(!held.replaces(Some(&held), Some(&held)));
        // A restarted controller whose clock is behind the previous one's.
        assert!(id("b", 5).replaces(Some(&held), Some(&held)));
        assert!(id("b", 5).replaces(Some(&held), None));
    }

    #[test]
    fn an_absurd_version_never_blocks_updates() {
        let hostile = id("a", u64::MAX);
        // The controller answered a poll for exactly the hostile snapshot with its own.
        assert!(id("a", 7).replaces(Some(&hostile), Some(&hostile)));
        assert!(id("b", 7).replaces(Some(&hostile), None));
    }

    #[test]
    fn a_slow_answer_to_an_older_poll_never_rolls_back() {
        let (older, held) = (id("a", 5), id("a", 9));
        assert!(!id("a", 6).replaces(Some(&held), Some(&older)));
        assert!(!id("a", 6).replaces(Some(&held), None));
    }
}
