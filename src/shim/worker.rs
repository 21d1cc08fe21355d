//! The per-worker state every HTTP context of one Envoy worker shares: the decoded snapshot,
//! the director, this worker's prefix index and in-flight counts, and its side of the exchange
//! with the other workers ([`crate::exchange`]). A decision makes no host call for the
//! snapshot (the poller's notice in the worker's inbox has it decoded there) and, when the
//! worker has peers, enqueues one message to each; the worker's inbox callback learns theirs.

use std::collections::HashMap;
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use super::calls::{self, counted};
use super::flow::Flow;
use super::phase_metrics;
use super::shared::{self, now_ns, now_unix_ms, CountedSharedHost, QueueHost, SharedHost};
use crate::director::{Director, Incoming, Outcome};
use crate::exchange::{Counts, Exchange};
use crate::flow_control::FlowControl;
use crate::plugin_config::FilterConfig;
use crate::request_metrics::{self, Kind, Labels, MetricsHost, RequestMetrics};
use crate::scheduler::prefix::PrefixIndex;
use crate::scheduler::InFlight;
use crate::snapshot::{Endpoint, Snapshot};

/// Envoy metrics the filter defines (shown as `wasmcustom.<name>`).
struct Metrics {
    /// Histogram: time per decision, ns.
    decision_ns: Option<u32>,
    /// Counter: host calls made on the request path by finished requests.
    request_host_calls: Option<u32>,
    /// Counter: finished requests (the divisor of the one above).
    requests: Option<u32>,
}

impl Metrics {
    fn define() -> Metrics {
        let define = |kind, name| hostcalls::define_metric(kind, name).ok();
        Metrics {
            decision_ns: define(MetricType::Histogram, "wasm_epp_decision_ns"),
            request_host_calls: define(MetricType::Counter, "wasm_epp_request_host_calls"),
            requests: define(MetricType::Counter, "wasm_epp_requests"),
        }
    }
}

/// State of one worker's filter, shared by its HTTP contexts.
pub struct Worker {
    config: FilterConfig,
    director: Director,
    index: PrefixIndex,
    /// This worker's requests in flight (and their prompt bytes to prefill) per endpoint key.
    in_flight: HashMap<u64, InFlight>,
    exchange: Exchange,
    queues: QueueHost,
    snapshot: Option<Rc<Snapshot>>,
    /// The published identity text `snapshot` was decoded for (or last failed to decode).
    snapshot_key: Option<Vec<u8>>,
    /// The poller said a new snapshot was published and it is not decoded yet.
    snapshot_notice: bool,
    metrics: Metrics,
    /// Host calls and requests finished since the last report.
    unreported: (u64, u64),
    /// The request metrics (`None` when the configuration turns them off).
    request_metrics: Option<RequestMetrics>,
    /// Flow control's queue and parked streams.
    flow: Flow,
}

/// Envoy's metrics through the Proxy-Wasm host; each call is one host call (about a
/// microsecond), made only from the worker's tick.
struct EnvoyMetrics;

impl MetricsHost for EnvoyMetrics {
    fn define(&mut self, histogram: bool, name: &str) -> Option<u32> {
        let kind = if histogram {
            MetricType::Histogram
        } else {
            MetricType::Counter
        };
        hostcalls::define_metric(kind, name).ok()
    }

    fn increment(&mut self, id: u32, by: u64) {
        let _ = hostcalls::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }

    fn record(&mut self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }
}

impl Worker {
    /// A worker for `config` that has not joined the exchange yet (its first tick does).
    pub fn new(config: FilterConfig) -> Worker {
        Worker {
            index: PrefixIndex::new(config.prefix_index_buckets),
            request_metrics: config.request_metrics.then(RequestMetrics::default),
            config,
            director: match phase_metrics::clock() {
                Some(clock) => Director::with_clock(now_ns(), clock),
                None => Director::new(now_ns()),
            },
            in_flight: HashMap::new(),
            exchange: Exchange::new(),
            queues: QueueHost {
                vm_id: shared::vm_id(),
            },
            snapshot: None,
            snapshot_key: None,
            snapshot_notice: false,
            metrics: Metrics::define(),
            unreported: (0, 0),
            flow: Flow::new(now_ns().wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }

    /// Flow control's side of this worker.
    pub fn flow(&mut self) -> &mut Flow {
        &mut self.flow
    }

    /// The flow-control configuration of the current snapshot, if it turns it on.
    pub fn flow_control(&self) -> Option<FlowControl> {
        self.snapshot.as_ref()?.profile.flow_control.clone()
    }

    /// The requests this proxy (every worker) has in flight to `endpoints`: in memory, no
    /// host call.
    pub fn in_flight_to(&self, endpoints: &[Endpoint]) -> u64 {
        endpoints
            .iter()
            .map(|e| in_flight(&self.in_flight, &self.exchange, e.index_key()).requests)
            .sum()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Option<Rc<Snapshot>> {
        self.snapshot.clone()
    }

    /// The client of the waiting request `id` went away: it leaves the queue.
    pub fn unpark(&mut self, id: u32) {
        self.flow.unpark(id);
    }

    /// A request released from the flow-control queue finished.
    pub fn released_finished(&mut self) {
        self.flow.released_finished();
    }

    /// Decides one request with the newest published snapshot; `started_ns` is the clock read
    /// the request's time came from. Host calls: the clock once more and one histogram
    /// sample; the snapshot's identity and the snapshot only when there is none
    /// yet or a notice of a new one was not acted on (an inactive worker's). The poller's
    /// notice reaches this worker's inbox as soon as a snapshot is published and it is decoded
    /// there, so the metrics stay as fresh as the controller's scrapes with no host call per
    /// request (a full `make bench` with tick-only refreshes, up to 50 ms older metrics, saw
    /// LoRA adapters thrash: 67 loads instead of 29 at 14 req/s, TTFT p90 873 ms instead of
    /// 138 ms).
    pub fn decide(
        &mut self,
        incoming: &Incoming<'_>,
        started_ns: u64,
    ) -> (Outcome, Option<Labels>) {
        if self.snapshot.is_none() || self.snapshot_notice {
            calls::add(self.refresh_snapshot());
        }
        let mut incoming = *incoming;
        if !incoming.flow.released {
            incoming.flow.waiting_top = self.flow.waiting_top();
        }
        let exchange = &self.exchange;
        let local = &self.in_flight;
        let outcome = self.director.decide(
            self.snapshot.as_deref(),
            &self.config,
            &incoming,
            |e| in_flight(local, exchange, e.index_key()),
            &mut self.index,
            Some(&CountedSharedHost),
        );
        if let Some(id) = self.metrics.decision_ns {
            let elapsed = counted(now_ns()).saturating_sub(started_ns);
            let _ = counted(hostcalls::record_metric(id, elapsed));
        }
        phase_metrics::record_decision(&self.director.phases());
        let labels = self.count_request(&outcome, incoming.objective.unwrap_or(""));
        (outcome, labels)
    }

    /// Counts a decided request in the request metrics (in memory, no host call); the labels
    /// the rest of its metrics use.
    fn count_request(&mut self, outcome: &Outcome, objective: &str) -> Option<Labels> {
        if matches!(outcome, Outcome::Wait(_)) {
            // Counted when it is released.
            return None;
        }
        let metrics = self.request_metrics.as_mut()?;
        let labels = match outcome {
            Outcome::Route(route) => metrics.labels(&route.models.0, &route.models.1, objective),
            _ => metrics.labels("", "", objective),
        };
        metrics.count(Kind::Requests, labels);
        match outcome {
            Outcome::Reject(error) => metrics.count(Kind::Errors(error.code()), labels),
            Outcome::Route(route) => {
                let staged = self
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.profile.disaggregation.is_some());
                if staged {
                    let decision = if route.prefill.is_some() {
                        request_metrics::PREFILL_DECODE
                    } else {
                        request_metrics::DECODE_ONLY
                    };
                    metrics.count(Kind::Disaggregation(decision), labels);
                }
            }
            Outcome::Unrouted | Outcome::Wait(_) => {}
        }
        Some(labels)
    }

    /// Records a request's `kind` sample (a time in milliseconds), in memory.
    pub fn sample(&mut self, kind: Kind, labels: Labels, value: u64) {
        if let Some(metrics) = self.request_metrics.as_mut() {
            metrics.sample(kind, labels, value);
        }
    }

    /// Counts a routed request in flight to the endpoint `key` until [`end`](Self::end), with
    /// `prefill_bytes` of its prompt to prefill until [`prefilled`](Self::prefilled), and
    /// sends the decision's prefix records and in-flight changes to the other workers: one
    /// enqueue per peer (counted), none for a worker alone.
    pub fn begin(&mut self, key: u64, prefill_bytes: u64) {
        self.change_in_flight(key, 1, signed(prefill_bytes));
        calls::add(self.exchange.send(&self.queues, &mut self.index));
    }

    /// A request counted by [`begin`](Self::begin) had its first response byte: its
    /// `prefill_bytes` are done. The change reaches the other workers with this worker's next
    /// message or heartbeat.
    pub fn prefilled(&mut self, key: u64, prefill_bytes: u64) {
        self.change_in_flight(key, 0, -signed(prefill_bytes));
    }

    /// Ends a request counted by [`begin`](Self::begin), with the `prefill_bytes` it still
    /// counted (those of a request that ended without a response byte); the change reaches the
    /// other workers with this worker's next message or heartbeat.
    pub fn end(&mut self, key: u64, prefill_bytes: u64) {
        self.change_in_flight(key, -1, -signed(prefill_bytes));
    }

    /// Changes the counts for `key` (never below zero) and notes the change made for the
    /// other workers.
    fn change_in_flight(&mut self, key: u64, requests: i64, prefill_bytes: i64) {
        let count = self.in_flight.entry(key).or_default();
        let before = *count;
        count.requests = count.requests.saturating_add_signed(requests);
        count.prefill_bytes = count.prefill_bytes.saturating_add_signed(prefill_bytes);
        let change = Counts {
            requests: signed(count.requests) - signed(before.requests),
            prefill_bytes: signed(count.prefill_bytes) - signed(before.prefill_bytes),
        };
        if *count == InFlight::default() {
            self.in_flight.remove(&key);
        }
        if !change.is_zero() {
            self.exchange.note_in_flight(key, change);
        }
    }

    /// Learns what the other workers sent to this worker's inbox `queue`; a snapshot notice is
    /// acted on at once by a worker that routes (off the request path), by the others when
    /// they next need the snapshot.
    pub fn on_queue_ready(&mut self, queue: u32) {
        self.exchange
            .receive(&self.queues, queue, now_unix_ms(), &mut self.index);
        if self.exchange.take_snapshot_notice() {
            self.snapshot_notice = true;
            if self.exchange.is_active() {
                let _ = self.refresh_snapshot();
            }
        }
    }

    /// Notes a finished request's host calls, reported with the next heartbeat (two counter
    /// updates per worker per heartbeat rather than per request).
    pub fn finished(&mut self, host_calls: u64) {
        self.unreported.0 += host_calls;
        self.unreported.1 += 1;
    }

    /// Adds the finished requests and their host calls to the filter's counters.
    fn report_finished(&mut self) {
        let (calls, requests) = std::mem::take(&mut self.unreported);
        if requests == 0 {
            return;
        }
        if let (Some(calls_id), Some(requests_id)) =
            (self.metrics.request_host_calls, self.metrics.requests)
        {
            let _ = hostcalls::increment_metric(calls_id, calls as i64);
            let _ = hostcalls::increment_metric(requests_id, requests as i64);
        }
    }

    /// The tick's work: the exchange's heartbeat, then a new snapshot if one was published.
    pub fn on_tick(&mut self) {
        self.report_finished();
        if let Some(metrics) = self.request_metrics.as_mut() {
            metrics.flush(&mut EnvoyMetrics);
        }
        self.exchange.tick(
            &SharedHost,
            &self.queues,
            now_unix_ms(),
            &mut self.index,
            &self.in_flight,
        );
        let _ = self.refresh_snapshot();
    }

    /// Decodes the published snapshot if its identity changed (whatever the poller published:
    /// it decides which snapshot replaces which). Returns the host calls made: one when
    /// unchanged, two when it read a new snapshot.
    fn refresh_snapshot(&mut self) -> u64 {
        self.snapshot_notice = false;
        let published = shared::snapshot_id_text();
        if published.is_none() || published == self.snapshot_key {
            return 1;
        }
        match shared::snapshot_json().map(|json| Snapshot::from_json(&json)) {
            Some(Ok(snapshot)) => {
                self.snapshot = Some(Rc::new(snapshot));
                self.flow.metrics_changed();
            }
            Some(Err(e)) => log::warn!("wasm-epp: keeping the previous snapshot: {e}"),
            None => return 2,
        }
        self.snapshot_key = published;
        2
    }
}

/// `value` as a signed count (counts stay far below `i64::MAX`).
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// What this proxy has in flight to the endpoint `key`: this worker's count (`local`) and the
/// other workers' (as last heard through `exchange`).
fn in_flight(local: &HashMap<u64, InFlight>, exchange: &Exchange, key: u64) -> InFlight {
    let mine = local.get(&key).copied().unwrap_or_default();
    let others = exchange.others_in_flight(key);
    InFlight {
        requests: mine.requests.saturating_add(others.requests),
        prefill_bytes: mine.prefill_bytes.saturating_add(others.prefill_bytes),
    }
}
