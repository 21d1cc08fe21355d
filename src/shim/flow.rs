//! Flow control's shim side: parks a request that must wait (its stream stays paused in
//! Envoy, its body in Wasm memory), and in release turns — on the root context's tick, when a
//! new snapshot arrives and when a request of this worker ends — answers the requests whose
//! wait ran out and releases those the pool has room for, each by switching the host to that
//! stream (`proxy_set_effective_context`) and scheduling it there. The queue's rules live in
//! [`crate::flow_control`].
//!
//! Host calls: none for a request that does not wait; for one that waits, a board read, one
//! gauge update when it is parked and one when it leaves, a counter and a histogram sample for
//! its outcome, and a board write; per turn with requests waiting, one
//! board read (and a write when the bands changed or once a second).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use super::http::Stream;
use super::shared::{now_unix_ms, SharedHost};
use super::worker::Worker;
use crate::admission;
use crate::director::Wait;
use crate::errors::InferenceError;
use crate::flow_control::{self, Board, FlowControl, FlowQueue, Others, Waiting};
use crate::scheduler::filters::concurrency_detector;
use crate::snapshot::Snapshot;

/// The tick period while requests wait: how often waits are checked for their TTL and the
/// board for other workers' bands (new snapshots and finished requests release at once).
pub const WAITING_TICK: Duration = Duration::from_millis(50);
/// A worker with requests waiting refreshes its board entry this often.
const BOARD_REFRESH_MS: u64 = 1_000;

/// Outcomes of a request that waited, as upstream's `outcome` label.
const DISPATCHED: &str = "Dispatched";
const REJECTED_CAPACITY: &str = "RejectedCapacity";
const EVICTED_TTL: &str = "EvictedTTL";
const EVICTED_NO_ENDPOINTS: &str = "EvictedNoEndpoints";
const EVICTED_CANCELLED: &str = "EvictedContextCancelled";

/// One worker's flow control: its queue, the parked streams, its view of the board.
pub struct Flow {
    queue: FlowQueue,
    board: Board,
    /// What the other workers had waiting at the last turn.
    others: Others,
    /// The waiting streams by context id, with their priority.
    parked: HashMap<u32, (Rc<RefCell<Stream>>, i32)>,
    /// When this worker last wrote its board entry (0: it has none).
    published_ms: u64,
    /// The tick runs at [`WAITING_TICK`].
    pub fast_tick: bool,
    metrics: FlowMetrics,
}

impl Flow {
    /// Flow control for a worker with the random id `worker`.
    pub fn new(worker: u64) -> Flow {
        Flow {
            queue: FlowQueue::default(),
            board: Board::new(worker),
            others: Others::default(),
            parked: HashMap::new(),
            published_ms: 0,
            fast_tick: false,
            metrics: FlowMetrics::default(),
        }
    }

    /// The highest priority waiting in this proxy, as last known (no host call).
    pub fn waiting_top(&self) -> Option<i32> {
        self.queue.top().max(self.others.top())
    }

    /// New metrics arrived: they see the requests released so far.
    pub fn metrics_changed(&mut self) {
        self.queue.metrics_changed();
    }

    /// A request released from the queue finished.
    pub fn released_finished(&mut self) {
        self.queue.released_finished();
    }

    /// Whether a turn has anything to do.
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.published_ms == 0
    }

    /// Parks `stream` (context `id`) in the band of `priority`, or the error to answer.
    fn park(
        &mut self,
        config: &FlowControl,
        stream: Rc<RefCell<Stream>>,
        id: u32,
        priority: i32,
        waiting: Waiting,
    ) -> Result<(), InferenceError> {
        // The limits count the other workers' waits as they are now: a worker that had
        // nothing waiting has not read the board since.
        self.others = self.board.others(&SharedHost, waiting.since_ms);
        if let Err(error) = self
            .queue
            .enqueue(config, &self.others.bands, priority, waiting)
        {
            self.metrics.outcome(priority, REJECTED_CAPACITY, None);
            return Err(error);
        }
        self.parked.insert(id, (stream, priority));
        self.metrics.queue_size(priority, 1);
        // The other workers hold their lower bands from now on, and count this wait in the
        // limits.
        self.publish(waiting.since_ms);
        let _ = self.queue.take_changed();
        Ok(())
    }

    /// The client of the waiting request `id` went away.
    pub fn unpark(&mut self, id: u32) {
        if let Some((_, priority)) = self.parked.remove(&id) {
            self.queue.remove(id);
            self.metrics.queue_size(priority, -1);
            self.metrics.outcome(priority, EVICTED_CANCELLED, None);
        }
    }

    fn publish(&mut self, now_ms: u64) {
        let bands = self.queue.summary();
        let empty = bands.is_empty();
        self.board.publish(&SharedHost, bands, now_ms);
        self.published_ms = if empty { 0 } else { now_ms };
    }

    /// One release turn: the streams to answer (with their error) or to release (`None`).
    /// `in_flight`: the proxy's requests in flight to the snapshot's endpoints.
    fn turn(
        &mut self,
        snapshot: &Snapshot,
        now_ms: u64,
        in_flight: u64,
    ) -> Vec<(Rc<RefCell<Stream>>, Option<InferenceError>)> {
        let mut out = Vec::new();
        if self.idle() {
            return out;
        }
        self.others = self.board.others(&SharedHost, now_ms);
        let off = FlowControl {
            usage_threshold: f64::INFINITY,
            ..FlowControl::default()
        };
        // Flow control turned off by a new configuration: everything waiting goes.
        let (config, others_top) = match &snapshot.profile.flow_control {
            Some(config) => (config, self.others.top()),
            None => (&off, None),
        };
        let endpoints = &snapshot.endpoints;
        let pool_empty = endpoints.is_empty();
        let ttl = if pool_empty {
            config.no_endpoint_request_ttl_ms
        } else {
            config.default_request_ttl_ms
        };
        for (priority, waiting) in self.queue.expire(ttl, now_ms) {
            let outcome = if pool_empty {
                EVICTED_NO_ENDPOINTS
            } else {
                EVICTED_TTL
            };
            if let Some(stream) = self.leave(priority, waiting, outcome, now_ms) {
                out.push((stream, Some(flow_control::expired_error(pool_empty))));
            }
        }
        let profile = &snapshot.profile;
        let saturation = admission::pool_saturation(
            profile,
            endpoints.iter(),
            || in_flight,
            snapshot.metrics_clock(now_ms),
        );
        let step = match &profile.concurrency_detector {
            Some(params) => {
                // The in-flight counts see every request released before this turn.
                self.queue.metrics_changed();
                concurrency_detector::step(params, endpoints.len())
            }
            // A released request is assumed to wait in some server's queue until the metrics
            // see it: it adds 1 / (queue threshold × endpoints) to the average.
            None => {
                let depth = profile.saturation_detector.queue_depth_threshold.max(1.0);
                1.0 / (depth * endpoints.len().max(1) as f64)
            }
        };
        let released = self
            .queue
            .release(config, saturation, step, others_top, now_ms);
        for (priority, waiting) in released {
            if let Some(stream) = self.leave(priority, waiting, DISPATCHED, now_ms) {
                out.push((stream, None));
            }
        }
        if self.queue.take_changed()
            || (self.published_ms > 0
                && now_ms.saturating_sub(self.published_ms) >= BOARD_REFRESH_MS)
        {
            self.publish(now_ms);
        }
        out
    }

    fn leave(
        &mut self,
        priority: i32,
        waiting: Waiting,
        outcome: &'static str,
        now_ms: u64,
    ) -> Option<Rc<RefCell<Stream>>> {
        self.metrics.queue_size(priority, -1);
        let waited = now_ms.saturating_sub(waiting.since_ms);
        self.metrics.outcome(priority, outcome, Some(waited));
        self.parked.remove(&waiting.id).map(|(stream, _)| stream)
    }
}

/// Parks the request `id` of `stream` in its worker's queue, in the band and with the length
/// of `wait` (`bytes`: its body size; `now_ns`: its decision's clock read); the error to answer
/// when there is no room.
pub fn park(
    worker: &Rc<RefCell<Worker>>,
    stream: Rc<RefCell<Stream>>,
    id: u32,
    wait: Wait,
    bytes: u64,
    now_ns: u64,
) -> Result<(), InferenceError> {
    let mut worker = worker.borrow_mut();
    let Some(config) = worker.flow_control() else {
        return Err(InferenceError::Internal(
            "internal flow control error: no flow control configured".to_string(),
        ));
    };
    let waiting = Waiting {
        id,
        since_ms: now_ns / 1_000_000,
        bytes,
        finish_by_ms: wait.finish_by_ms,
    };
    let flow = worker.flow();
    flow.park(&config, stream, id, wait.priority, waiting)?;
    if !flow.fast_tick {
        flow.fast_tick = true;
        // A host call, once per change of pace.
        if let Err(status) = hostcalls::set_tick_period(WAITING_TICK) {
            log::warn!("wasm-epp: cannot set the tick period: {status:?}");
        }
    }
    Ok(())
}

/// A release turn of `worker`'s queue: answers the expired waits and releases what the pool
/// has room for. Switches the host's effective context: call it last in a callback.
pub fn turn(worker: &Rc<RefCell<Worker>>) {
    let streams = {
        let mut worker = worker.borrow_mut();
        let Some(snapshot) = worker.snapshot() else {
            return;
        };
        if worker.flow().idle() {
            return;
        }
        let in_flight = if snapshot.profile.concurrency_detector.is_some() {
            worker.in_flight_to(&snapshot.endpoints)
        } else {
            0
        };
        worker.flow().turn(&snapshot, now_unix_ms(), in_flight)
    };
    for (stream, error) in streams {
        let Ok(mut stream) = stream.try_borrow_mut() else {
            continue;
        };
        if hostcalls::set_effective_context(stream.id()).is_err() {
            continue;
        }
        match error {
            Some(error) => stream.expire(&error),
            None => stream.release(),
        }
    }
}

/// A request of `worker` ended: a turn, if requests wait (it may have freed capacity).
pub fn on_request_end(worker: &Rc<RefCell<Worker>>) {
    let waiting = !worker.borrow_mut().flow().queue.is_empty();
    if waiting {
        turn(worker);
    }
}

/// Envoy stats of the queue, labelled by priority (and outcome), defined on first use. The
/// queue size is a gauge that every worker adds to and subtracts from, so it reads the whole
/// proxy's queue.
#[derive(Default)]
struct FlowMetrics {
    ids: HashMap<String, Option<u32>>,
}

impl FlowMetrics {
    fn id(&mut self, kind: MetricType, name: String) -> Option<u32> {
        *self
            .ids
            .entry(name)
            .or_insert_with_key(|name| hostcalls::define_metric(kind, name).ok())
    }

    fn queue_size(&mut self, priority: i32, by: i64) {
        let name = format!("llm_d_epp_flow_control_queue_size.priority=.={priority};.;");
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcalls::increment_metric(id, by);
        }
    }

    fn outcome(&mut self, priority: i32, outcome: &str, waited_ms: Option<u64>) {
        let labels = format!("priority=.={priority};.;outcome=.={outcome};.;");
        let total = format!("llm_d_epp_flow_control_requests_total.{labels}");
        if let Some(id) = self.id(MetricType::Counter, total) {
            let _ = hostcalls::increment_metric(id, 1);
        }
        if let Some(waited) = waited_ms {
            let name =
                format!("llm_d_epp_flow_control_request_queue_duration_milliseconds.{labels}");
            if let Some(id) = self.id(MetricType::Histogram, name) {
                let _ = hostcalls::record_metric(id, waited);
            }
        }
    }
}
