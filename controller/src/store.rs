//! The controller's state — the profile, the endpoints with their latest metrics and scrape
//! status — and the versioned snapshot built from it.
//!
//! Whenever the state changes in a way the snapshot shows (endpoints, labels, metrics,
//! freshness times, profile, InferenceObjective priorities, InferenceModelRewrite rules), a new
//! snapshot is published on a [`watch`] channel with a new
//! version `max(previous + 1, now_unix_ms)`, strictly increasing within the process. Every
//! snapshot also names the process's instance id, drawn at random at start-up: a consumer
//! compares versions only within one instance, so a restarted controller (whose clock may be
//! behind the previous one's) or a corrupt version held by a consumer never freezes updates.
//! Long-polls wait on that channel, so waiting is cheap and each snapshot is encoded once
//! however many pollers read it.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use wasm_epp::scheduler::profile::{FilterSpec, Profile};
use wasm_epp::snapshot::{Endpoint, Metrics, ModelRewrite, Snapshot};

use crate::engines::{Engine, Engines};
use crate::extract::Scraped;
use crate::moving_mean::MovingMean;

/// A published snapshot with its encoded form.
#[derive(Debug)]
pub struct Published {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// `snapshot.to_json()`, shared by every response that serves it.
    pub json: Bytes,
}

impl Published {
    /// The snapshot version.
    pub fn version(&self) -> u64 {
        self.snapshot.version
    }
}

/// Identity of an endpoint across discovery updates: name, address and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey {
    /// Endpoint name (`namespace/name` or `name`).
    pub name: String,
    /// IP address.
    pub address: String,
    /// Port.
    pub port: u16,
}

impl EndpointKey {
    fn of(endpoint: &Endpoint) -> EndpointKey {
        EndpointKey {
            name: endpoint.name.clone(),
            address: endpoint.address.clone(),
            port: endpoint.port,
        }
    }
}

/// One endpoint to scrape now, as handed out by [`Store::begin_scrapes`].
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    /// Which endpoint.
    pub key: EndpointKey,
    /// `address:port`, IPv6 bracketed.
    pub host_port: String,
    /// The metric names of the endpoint's engine (chosen by its labels when the scrape began).
    pub engine: Arc<Engine>,
}

/// Process-wide counters, shown by the admin `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Successful scrapes.
    pub scrapes_success: AtomicU64,
    /// Failed scrapes (connect error, timeout, bad status, unparsable metrics).
    pub scrapes_error: AtomicU64,
    /// Snapshot requests answered at once with 200.
    pub snapshot_immediate: AtomicU64,
    /// Long-polls answered with 200 after waiting for a new version.
    pub snapshot_long_poll: AtomicU64,
    /// Requests answered 304 (nothing newer within the wait).
    pub snapshot_not_modified: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// What the snapshot carries from the InferenceObjective and InferenceModelRewrite objects
/// (a manifests file or the Kubernetes API; see [`crate::manifests`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifests {
    /// Priority by InferenceObjective name.
    pub objectives: BTreeMap<String, i32>,
    /// InferenceModelRewrite objects, oldest first.
    pub rewrites: Vec<ModelRewrite>,
}

/// An endpoint's state as `/debug/endpoints` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointReport {
    /// Endpoint name.
    pub name: String,
    /// IP address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// `address:port`, IPv6 bracketed.
    #[serde(skip)]
    pub host_port: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Latest metrics.
    pub metrics: Metrics,
    /// Milliseconds since the last successful scrape; `None` if never scraped successfully.
    pub metrics_age_ms: Option<u64>,
    /// The error of the latest scrape, `None` when it succeeded (or none has finished yet).
    pub last_error: Option<String>,
    /// Successful scrapes so far.
    pub scrapes_ok: u64,
    /// Failed scrapes so far.
    pub scrapes_failed: u64,
    /// Failed scrapes since the last success.
    pub consecutive_failures: u32,
    /// Whether the endpoint is a candidate (see [`Endpoint::ready`]).
    pub ready: bool,
}

/// The outcome of [`Store::wait_newer`].
#[derive(Debug)]
pub enum Wait {
    /// A newer snapshot was already there.
    Immediate(Arc<Published>),
    /// A newer snapshot was published while waiting.
    Changed(Arc<Published>),
    /// Nothing newer before the deadline; carries the current snapshot.
    TimedOut(Arc<Published>),
}

/// Consecutive failed scrapes after which an endpoint is unready, unless configured
/// (`--failed-scrapes-before-unready`): two, so one slow scrape never takes an endpoint out.
pub const DEFAULT_FAILED_SCRAPES_BEFORE_UNREADY: u32 = 2;

/// Milliseconds per second: the inter-token-latency histogram counts seconds, the snapshot
/// milliseconds.
const MS_PER_S: f64 = 1000.0;

/// What a poller holds, from its `since` (and `instance`) query parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The version it holds.
    pub version: u64,
    /// The instance it holds; `None` from a poller that does not send one (versions alone
    /// are compared then, as before instances existed).
    pub instance: Option<String>,
}

impl Held {
    /// Whether `published` is news to this poller: anything but exactly what it holds (a
    /// poller holding a version this instance never served is answered at once, so it can
    /// correct itself), or, without an instance, a greater version.
    pub fn wants(&self, published: &Published) -> bool {
        let snapshot = &published.snapshot;
        match &self.instance {
            Some(instance) => *instance != snapshot.instance || self.version != snapshot.version,
            None => snapshot.version > self.version,
        }
    }
}

/// A random instance id (16 hex digits) from the OS-seeded hasher keys.
fn draw_instance_id() -> String {
    let random = RandomState::new().hash_one((std::process::id(), now_unix_ms()));
    format!("{random:016x}")
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The next snapshot version: strictly greater than `previous`, and at least the wall clock.
pub fn next_version(previous: u64, now_unix_ms: u64) -> u64 {
    previous.saturating_add(1).max(now_unix_ms)
}

#[derive(Debug)]
struct Entry {
    endpoint: Endpoint,
    last_error: Option<String>,
    scrapes_ok: u64,
    scrapes_failed: u64,
    consecutive_failures: u32,
    scraping: bool,
    /// The server's decode speed in ms per token, from its inter-token-latency histogram.
    decode_speed: MovingMean,
    /// Its requests' mean length in output tokens, from its generation-tokens histogram.
    output_tokens: MovingMean,
}

#[derive(Debug)]
struct State {
    profile: Profile,
    /// The engines' metric names (the config's `core-metrics-extractor`).
    engines: Engines,
    /// Sorted by key.
    entries: Vec<Entry>,
    /// Objectives and rewrites from `--manifests` (empty without it).
    manifests: Manifests,
    rounds_completed: u64,
}

/// Shared controller state; see the module docs.
#[derive(Debug)]
pub struct Store {
    /// This process's instance id, in every snapshot.
    instance: String,
    /// Consecutive failed scrapes that make an endpoint unready.
    unready_after: u32,
    state: Mutex<State>,
    published: watch::Sender<Arc<Published>>,
    counters: Counters,
}

impl Store {
    /// Creates the store from the profile and the endpoints discovery loaded at startup, and
    /// publishes the first snapshot (endpoints with empty metrics) at once.
    pub fn new(profile: Profile, endpoints: Vec<Endpoint>) -> Store {
        Store::with_manifests(profile, endpoints, Manifests::default())
    }

    /// Like [`new`](Self::new), with the InferenceObjectives and InferenceModelRewrites loaded
    /// at startup in the first snapshot.
    pub fn with_manifests(
        profile: Profile,
        endpoints: Vec<Endpoint>,
        manifests: Manifests,
    ) -> Store {
        let state = State {
            profile,
            engines: Engines::default(),
            entries: entries_from(endpoints, HashMap::new()),
            manifests,
            rounds_completed: 0,
        };
        let instance = draw_instance_id();
        let first = build(&state, &instance, next_version(0, now_unix_ms()));
        let (published, _) = watch::channel(Arc::new(first));
        Store {
            instance,
            unready_after: DEFAULT_FAILED_SCRAPES_BEFORE_UNREADY,
            state: Mutex::new(state),
            published,
            counters: Counters::default(),
        }
    }

    /// Makes endpoints unready after `failures` consecutive failed scrapes (at least one).
    pub fn unready_after(mut self, failures: u32) -> Store {
        self.unready_after = failures.max(1);
        self
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The latest snapshot.
    pub fn current(&self) -> Arc<Published> {
        self.published.borrow().clone()
    }

    /// True once a scrape round has completed (discovery has loaded by construction).
    pub fn is_ready(&self) -> bool {
        self.lock().rounds_completed > 0
    }

    /// Replaces the endpoint list. Endpoints that stay (same name, address and port) keep their
    /// metrics and scrape status; labels are taken from the new list. Publishes a snapshot if
    /// anything changed and returns whether it did.
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) -> bool {
        let mut state = self.lock();
        let previous: HashMap<EndpointKey, Entry> = std::mem::take(&mut state.entries)
            .into_iter()
            .map(|entry| (EndpointKey::of(&entry.endpoint), entry))
            .collect();
        state.entries = entries_from(endpoints, previous);
        self.publish_if_changed(&state)
    }

    /// Replaces the scheduling profile and the engines' metric names (a reloaded config).
    /// Publishes a snapshot if the profile changed and returns whether it did; scrapes that begin
    /// from now on read the new names.
    pub fn set_config(&self, profile: Profile, engines: Engines) -> bool {
        let mut state = self.lock();
        state.profile = profile;
        state.engines = engines;
        self.publish_if_changed(&state)
    }

    /// Replaces the objectives and rewrites. Publishes a snapshot if they changed and returns
    /// whether it did.
    pub fn set_manifests(&self, manifests: Manifests) -> bool {
        let mut state = self.lock();
        state.manifests = manifests;
        self.publish_if_changed(&state)
    }

    /// Hands out every endpoint that has no scrape in flight and marks them in flight.
    pub fn begin_scrapes(&self) -> Vec<ScrapeJob> {
        let state = &mut *self.lock();
        state
            .entries
            .iter_mut()
            .filter(|entry| !entry.scraping)
            .map(|entry| {
                entry.scraping = true;
                ScrapeJob {
                    key: EndpointKey::of(&entry.endpoint),
                    host_port: entry.endpoint.host_port(),
                    engine: state.engines.for_labels(&entry.endpoint.labels).clone(),
                }
            })
            .collect()
    }

    /// Records the result of a scrape started by [`begin_scrapes`](Self::begin_scrapes).
    /// Success replaces the metrics, stamped with `now_unix_ms`, and makes the endpoint ready;
    /// failure keeps the previous metrics, and the configured number of consecutive failures
    /// makes it unready (published with the round). Returns true when the endpoint went from healthy (or unscraped) to failing or back,
    /// so the caller can log the transition. A result for an endpoint that has since been
    /// removed is dropped.
    pub fn record_scrape(
        &self,
        key: &EndpointKey,
        result: Result<Scraped, String>,
        now_unix_ms: u64,
    ) -> bool {
        match &result {
            Ok(_) => Counters::bump(&self.counters.scrapes_success),
            Err(_) => Counters::bump(&self.counters.scrapes_error),
        }
        let mut state = self.lock();
        let Ok(index) = state
            .entries
            .binary_search_by(|entry| EndpointKey::of(&entry.endpoint).cmp(key))
        else {
            return false;
        };
        let entry = &mut state.entries[index];
        entry.scraping = false;
        let was_failing = entry.last_error.is_some();
        match result {
            Ok(Scraped {
                metrics,
                decode,
                output_tokens,
            }) => {
                let decode_ms_per_token = decode.map_or(0.0, |totals| {
                    entry.decode_speed.observe(totals, now_unix_ms)
                });
                let output_tokens_per_request = output_tokens.map_or(0.0, |totals| {
                    entry.output_tokens.observe(totals, now_unix_ms)
                });
                let peak_running_requests = metrics
                    .running_requests_size
                    .max(entry.endpoint.metrics.peak_running_requests);
                entry.endpoint.metrics = Metrics {
                    updated_unix_ms: Some(now_unix_ms),
                    decode_ms_per_token,
                    output_tokens_per_request,
                    peak_running_requests,
                    ..metrics
                };
                entry.scrapes_ok += 1;
                entry.consecutive_failures = 0;
                entry.endpoint.ready = true;
                entry.last_error = None;
                was_failing
            }
            Err(error) => {
                entry.scrapes_failed += 1;
                entry.consecutive_failures = entry.consecutive_failures.saturating_add(1);
                if entry.consecutive_failures >= self.unready_after {
                    entry.endpoint.ready = false;
                }
                entry.last_error = Some(error);
                !was_failing
            }
        }
    }

    /// Marks a scrape round complete and publishes a snapshot if anything changed.
    pub fn finish_round(&self) {
        let mut state = self.lock();
        state.rounds_completed += 1;
        self.publish_if_changed(&state);
    }

    /// Waits up to `max_wait` for a snapshot the poller holding `held` wants
    /// ([`Held::wants`]).
    pub async fn wait_newer(&self, held: &Held, max_wait: Duration) -> Wait {
        let mut receiver = self.published.subscribe();
        let current = receiver.borrow_and_update().clone();
        if held.wants(&current) {
            return Wait::Immediate(current);
        }
        let deadline = Instant::now() + max_wait;
        loop {
            match tokio::time::timeout_at(deadline, receiver.changed()).await {
                Ok(Ok(())) => {
                    let latest = receiver.borrow_and_update().clone();
                    if held.wants(&latest) {
                        return Wait::Changed(latest);
                    }
                }
                // Deadline reached (the sender lives as long as `self`, so `changed` cannot fail).
                _ => return Wait::TimedOut(receiver.borrow().clone()),
            }
        }
    }

    /// Every endpoint's state, in snapshot order, with metric ages relative to `now_unix_ms`.
    pub fn endpoint_reports(&self, now_unix_ms: u64) -> Vec<EndpointReport> {
        self.lock()
            .entries
            .iter()
            .map(|entry| {
                let endpoint = &entry.endpoint;
                EndpointReport {
                    name: endpoint.name.clone(),
                    address: endpoint.address.clone(),
                    port: endpoint.port,
                    host_port: endpoint.host_port(),
                    labels: endpoint.labels.clone(),
                    metrics: endpoint.metrics.clone(),
                    metrics_age_ms: endpoint
                        .metrics
                        .updated_unix_ms
                        .map(|at| now_unix_ms.saturating_sub(at)),
                    last_error: entry.last_error.clone(),
                    scrapes_ok: entry.scrapes_ok,
                    scrapes_failed: entry.scrapes_failed,
                    consecutive_failures: entry.consecutive_failures,
                    ready: endpoint.ready,
                }
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters more than stopping the controller would, so keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes a new snapshot if the state differs from the current one; returns whether it
    /// did. Called with the state locked, so versions are published in order.
    ///
    /// Metrics that only were scraped again, unchanged, are republished only when the current
    /// snapshot is half [`VOUCHED_MS`] old, or at once when an endpoint's metrics became stale
    /// (its scrapes fail) or fresh again: the snapshot vouches for its metric ages for
    /// [`VOUCHED_MS`] ([`Snapshot::vouched_ms`]). Every new version costs each Envoy a poll
    /// round trip, a decode and the notices to its workers (about 1.2 ms of Envoy CPU on the
    /// 2-core benchmark VM), and a quiet pool changed nothing but scrape times 20 times a
    /// second.
    fn publish_if_changed(&self, state: &State) -> bool {
        let current = self.current();
        let now = now_unix_ms();
        let published = &current.snapshot;
        let threshold = staleness_threshold_ms(&state.profile);
        let same_but_scrape_times =
            published.profile == state.profile
                && published.objectives == state.manifests.objectives
                && published.rewrites == state.manifests.rewrites
                && published.endpoints.len() == state.entries.len()
                && published.endpoints.iter().zip(&state.entries).all(
                    |(published_endpoint, entry)| {
                        same_but_scrape_time(published_endpoint, &entry.endpoint)
                            && fresh(published_endpoint, published.generated_unix_ms, threshold)
                                == fresh(&entry.endpoint, now, threshold)
                    },
                );
        let young = now.saturating_sub(published.generated_unix_ms) < VOUCHED_MS / 2;
        let unchanged = same_but_scrape_times
            && (young
                || published
                    .endpoints
                    .iter()
                    .eq(state.entries.iter().map(|entry| &entry.endpoint)));
        if unchanged {
            return false;
        }
        let version = next_version(current.version(), now);
        self.published
            .send_replace(Arc::new(build(state, &self.instance, version)));
        true
    }
}

/// For how long a snapshot vouches for its metric ages ([`Snapshot::vouched_ms`]): the filter
/// ages metrics by the wall clock only when the controller has been silent this long, so a
/// dead controller's last metrics look stale about this much later than its scrapes would.
pub const VOUCHED_MS: u64 = 2_000;

/// The smallest metrics-staleness threshold of the profile (its saturation detector and any
/// `utilization-detector` filter, its prefill stage's included).
fn staleness_threshold_ms(profile: &Profile) -> u64 {
    let prefill = profile.disaggregation.iter().map(|d| &d.prefill);
    let all_filters = std::iter::once(profile)
        .chain(prefill)
        .flat_map(|p| &p.filters);
    let filters = all_filters.filter_map(|filter| match filter {
        FilterSpec::UtilizationDetector(params) => Some(params.metrics_staleness_threshold_ms),
        _ => None,
    });
    filters
        .chain([profile.saturation_detector.metrics_staleness_threshold_ms])
        .min()
        .unwrap_or(0)
}

/// Whether the endpoint's metrics are fresh at `at_unix_ms` under `threshold_ms`, as the
/// filter judges them.
fn fresh(endpoint: &Endpoint, at_unix_ms: u64, threshold_ms: u64) -> bool {
    endpoint
        .metrics
        .updated_unix_ms
        .is_some_and(|t| at_unix_ms.saturating_sub(t) <= threshold_ms)
}

/// Whether two endpoints differ at most in when their metrics were last scraped (a field added
/// to either type must be placed here).
fn same_but_scrape_time(a: &Endpoint, b: &Endpoint) -> bool {
    let Endpoint {
        name,
        address,
        port,
        labels,
        ready,
        metrics,
        key_cache: _,
    } = a;
    let Metrics {
        waiting_queue_size,
        running_requests_size,
        kv_cache_usage,
        decode_ms_per_token,
        peak_running_requests,
        output_tokens_per_request,
        active_models,
        waiting_models,
        max_active_models,
        block_size,
        num_gpu_blocks,
        updated_unix_ms,
    } = metrics;
    let m = &b.metrics;
    *name == b.name
        && *address == b.address
        && *port == b.port
        && *labels == b.labels
        && *ready == b.ready
        && *waiting_queue_size == m.waiting_queue_size
        && *running_requests_size == m.running_requests_size
        && *kv_cache_usage == m.kv_cache_usage
        && *decode_ms_per_token == m.decode_ms_per_token
        && *peak_running_requests == m.peak_running_requests
        && *output_tokens_per_request == m.output_tokens_per_request
        && *active_models == m.active_models
        && *waiting_models == m.waiting_models
        && *max_active_models == m.max_active_models
        && *block_size == m.block_size
        && *num_gpu_blocks == m.num_gpu_blocks
        && updated_unix_ms.is_some() == m.updated_unix_ms.is_some()
}

/// Builds sorted entries from a new endpoint list, carrying over state from `previous`.
fn entries_from(endpoints: Vec<Endpoint>, mut previous: HashMap<EndpointKey, Entry>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = endpoints
        .into_iter()
        .map(
            |endpoint| match previous.remove(&EndpointKey::of(&endpoint)) {
                Some(kept) => Entry {
                    endpoint: Endpoint {
                        labels: endpoint.labels,
                        ..kept.endpoint
                    },
                    ..kept
                },
                None => Entry {
                    endpoint,
                    last_error: None,
                    scrapes_ok: 0,
                    scrapes_failed: 0,
                    consecutive_failures: 0,
                    scraping: false,
                    decode_speed: MovingMean::new(MS_PER_S),
                    output_tokens: MovingMean::new(1.0),
                },
            },
        )
        .collect();
    entries.sort_by_key(|entry| EndpointKey::of(&entry.endpoint));
    entries.dedup_by_key(|entry| EndpointKey::of(&entry.endpoint));
    entries
}

fn build(state: &State, instance: &str, version: u64) -> Published {
    let snapshot = Snapshot {
        instance: instance.to_string(),
        version,
        generated_unix_ms: now_unix_ms(),
        profile: state.profile.clone(),
        endpoints: state
            .entries
            .iter()
            .map(|entry| entry.endpoint.clone())
            .collect(),
        objectives: state.manifests.objectives.clone(),
        rewrites: state.manifests.rewrites.clone(),
        vouched_ms: VOUCHED_MS,
        scoring_cache: Default::default(),
    };
    let json = Bytes::from(snapshot.to_json());
    Published { snapshot, json }
}

#[cfg(test)]
mod tests;
