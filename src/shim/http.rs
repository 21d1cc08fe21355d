//! The per-request HTTP context: reads and strips the control headers, buffers the body, asks
//! the director, applies the outcome (destination header, rewritten body, or a local error
//! reply), and on the way back adds the response headers and rewrites the model name back.
//!
//! Host calls per request are a fixed handful whatever the prompt and the pool (each is
//! counted, see [`super::calls`]): the request headers read once as a map (one call, one copy
//! of every header), one removal per control header actually present, the body copied into
//! Wasm memory once, the destination header set, the clock twice and the decision histogram,
//! plus a body replacement only for a model rewrite and a local reply only for a rejection.
//! The filter's request counters are reported on the worker's heartbeat, not per request.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use super::calls::{self, counted};
use super::flow;
use super::phase_metrics::{timed, ShimPhase};
use super::request_headers::RequestHeaders;
use super::shared;
use super::worker::Worker;
use crate::director::{
    Controls, Outcome, CONTROL_HEADERS, DECISION_HEADER, DESTINATION_HEADER, SESSION_TOKEN_HEADER,
};
use crate::errors::{InferenceError, DROPPED_REASON_HEADER};
use crate::request_metrics::{Kind, Labels};
use crate::rewrite::ResponseModelRewriter;
use crate::scheduler::disaggregation::PREFILLER_HEADER;

/// One request's HTTP context: its [`Stream`], shared with the worker while the request waits
/// in the flow-control queue (the root context releases it from there).
pub struct PickerHttp(Rc<RefCell<Stream>>);

/// One request's filter state.
pub struct Stream {
    /// The context id (the root context resumes a waiting stream by it).
    id: u32,
    /// This stream's own handle, which the worker keeps while the request waits.
    me: Weak<RefCell<Stream>>,
    worker: Rc<RefCell<Worker>>,
    controls: Controls,
    /// The endpoint key counted in flight for this request, released when the stream ends,
    /// and the prompt bytes counted there as still to prefill (until the first response byte).
    in_flight: Option<(u64, u64)>,
    /// Response headers to add.
    response_headers: Vec<(&'static str, String)>,
    /// Rewrites the model name in the response back to the client's.
    response_rewriter: Option<ResponseModelRewriter>,
    /// A body callback has run (the request has a body, possibly empty).
    body_seen: bool,
    /// The request has been decided; every request is decided exactly once, whichever
    /// callback sees its end (headers, body or trailers).
    decided: bool,
    /// Host calls this request's callbacks made.
    host_calls: u64,
    /// The request-metric labels and the decision's clock reading (ns), while the request
    /// still has a time to first byte or a duration to record.
    timing: Option<(Labels, u64)>,
    /// The first response body byte has been timed.
    first_byte: bool,
    /// The body of a request waiting in the flow-control queue.
    parked_body: Option<Vec<u8>>,
    /// The request waits in the flow-control queue.
    waiting: bool,
    /// The request was released from the flow-control queue and has not finished.
    released: bool,
}

impl PickerHttp {
    /// A context for a new request with context id `id`.
    pub fn new(id: u32, worker: Rc<RefCell<Worker>>) -> PickerHttp {
        PickerHttp(Rc::new_cyclic(|me| {
            RefCell::new(Stream {
                id,
                me: me.clone(),
                worker,
                controls: Controls::default(),
                in_flight: None,
                response_headers: Vec::new(),
                response_rewriter: None,
                body_seen: false,
                decided: false,
                timing: None,
                first_byte: false,
                host_calls: 0,
                parked_body: None,
                waiting: false,
                released: false,
            })
        }))
    }
}

impl Stream {
    /// Runs one callback's work, adding the host calls it made to this request's count.
    fn counting<T>(&mut self, work: impl FnOnce(&mut Stream) -> T) -> T {
        let before = calls::total();
        let result = work(self);
        self.host_calls += calls::total() - before;
        result
    }

    /// Reads the control headers (one host call for the whole map, looked up in place) and
    /// removes those present.
    fn read_controls(&mut self) {
        let read = counted(RequestHeaders::read());
        let headers = read.map();
        self.controls = Controls::read(|name| headers.get_string(name));
        // Control headers never reach a model server; a client's destination never survives
        // (Envoy's config strips it before the filter too; a routed request's is replaced, an
        // unrouted one's removed again).
        for name in CONTROL_HEADERS {
            if headers.contains(name) {
                let _ = counted(hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    name,
                    None,
                ));
            }
        }
    }

    /// Decides the request once, with its whole `body` (`None`: a request without one).
    fn decide(&mut self, body: Option<Vec<u8>>) -> Action {
        if std::mem::replace(&mut self.decided, true) {
            return Action::Continue;
        }
        self.run(body, false)
    }

    fn run(&mut self, body: Option<Vec<u8>>, released: bool) -> Action {
        // One clock read serves as the decision's time and as the start of its timing.
        let started_ns = counted(shared::now_ns());
        let mut incoming = self
            .controls
            .incoming(body.as_deref(), started_ns / 1_000_000);
        incoming.flow.released = released;
        let (outcome, labels) = {
            let mut worker = self.worker.borrow_mut();
            worker.decide(&incoming, started_ns)
        };
        if let Outcome::Wait(wait) = outcome {
            let bytes = body.as_ref().map_or(0, |b| b.len() as u64);
            let parked = match self.me.upgrade() {
                Some(me) => flow::park(&self.worker, me, self.id, wait, bytes, started_ns),
                None => Err(InferenceError::Internal(
                    "internal flow control error: the stream is gone".to_string(),
                )),
            };
            return match parked {
                Ok(()) => {
                    self.parked_body = body;
                    self.waiting = true;
                    Action::Pause
                }
                Err(error) => reject(&error),
            };
        }
        if matches!(outcome, Outcome::Route(_)) {
            self.timing = labels.map(|labels| (labels, started_ns));
        }
        timed(ShimPhase::Apply, || self.apply(outcome, body.as_deref()))
    }

    /// Releases the request from the flow-control queue: schedules it now and lets it go on
    /// (called from the root context with this stream as the effective context).
    pub fn release(&mut self) {
        self.waiting = false;
        self.released = true;
        let body = self.parked_body.take();
        let action = self.counting(|this| this.run(body, true));
        if action == Action::Continue {
            let _ = counted(hostcalls::resume_http_request());
        }
    }

    /// Answers a request whose wait ran out with `error` (from the root context, this stream
    /// being the effective context).
    pub fn expire(&mut self, error: &InferenceError) {
        self.waiting = false;
        self.parked_body = None;
        self.counting(|_| reject(error));
    }

    /// The context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Applies the decision: the destination (and a rewritten body), the in-flight count and
    /// what the response needs, or the local reply.
    fn apply(&mut self, outcome: Outcome, body: Option<&[u8]>) -> Action {
        let route = match outcome {
            Outcome::Route(route) => route,
            Outcome::Unrouted => {
                // Changing the headers makes Envoy pick the route again, which a request let
                // through without a pick relies on (a routed one's destination header does it).
                let _ = counted(hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    DESTINATION_HEADER,
                    None,
                ));
                return Action::Continue;
            }
            Outcome::Reject(error) => return reject(&error),
            // Parked by `run` before it gets here.
            Outcome::Wait(_) => return Action::Pause,
        };
        let headers = MapType::HttpRequestHeaders;
        if let Err(status) = counted(hostcalls::set_map_value(
            headers,
            DESTINATION_HEADER,
            Some(&route.destination),
        )) {
            log::error!("wasm-epp: cannot set {DESTINATION_HEADER}: {status:?}");
            return reject(&InferenceError::Internal(
                "cannot set the destination header".to_string(),
            ));
        }
        if let Some(prefill) = &route.prefill {
            // One more header write (a host call, about a microsecond), only for a request the
            // prefill/decode decider sent to a prefill endpoint.
            if let Err(status) = counted(hostcalls::set_map_value(
                headers,
                PREFILLER_HEADER,
                Some(prefill),
            )) {
                log::error!("wasm-epp: cannot set {PREFILLER_HEADER}: {status:?}");
                return reject(&InferenceError::Internal(
                    "cannot set the prefill header".to_string(),
                ));
            }
        }
        if let (Some(new_body), Some(old)) = (&route.body, body) {
            let length = new_body.len().to_string();
            let replaced = counted(hostcalls::set_buffer(
                BufferType::HttpRequestBody,
                0,
                old.len(),
                new_body,
            ))
            .and_then(|()| {
                counted(hostcalls::set_map_value(
                    headers,
                    "content-length",
                    Some(&length),
                ))
            });
            if let Err(status) = replaced {
                log::error!("wasm-epp: cannot replace the request body: {status:?}");
                return reject(&InferenceError::Internal(
                    "Error marshalling request body".to_string(),
                ));
            }
        }
        self.worker
            .borrow_mut()
            .begin(route.primary_key, route.prefill_bytes);
        self.in_flight = Some((route.primary_key, route.prefill_bytes));
        self.response_rewriter = route
            .model_rewrite()
            .map(|(target, client)| ResponseModelRewriter::new(target, client));
        if let Some(token) = route.session_token {
            self.response_headers.push((SESSION_TOKEN_HEADER, token));
        }
        if let Some(explanation) = route.explanation {
            self.response_headers.push((DECISION_HEADER, explanation));
        }
        Action::Continue
    }

    /// Adds the decision's response headers (and drops the length a body rewrite changes).
    fn add_response_headers(&mut self) -> Action {
        let headers = MapType::HttpResponseHeaders;
        for (name, value) in &self.response_headers {
            let _ = counted(hostcalls::set_map_value(headers, name, Some(value)));
        }
        if self
            .response_rewriter
            .as_ref()
            .is_some_and(|r| !r.is_noop())
        {
            // The rewritten body may differ in length.
            let _ = counted(hostcalls::set_map_value(headers, "content-length", None));
        }
        Action::Continue
    }

    /// Records the milliseconds since the decision as this request's `kind` sample (no-op
    /// without request metrics or for a request that was not routed).
    fn sample_since_decision(&mut self, kind: Kind) {
        if let Some((labels, decided_ns)) = self.timing {
            let elapsed_ms = counted(shared::now_ns()).saturating_sub(decided_ns) / 1_000_000;
            self.worker.borrow_mut().sample(kind, labels, elapsed_ms);
        }
    }

    /// Rewrites the model name in one response body chunk back to the client's.
    fn rewrite_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let chunk = counted(hostcalls::get_buffer(
            BufferType::HttpResponseBody,
            0,
            body_size,
        ))
        .ok()
        .flatten()
        .unwrap_or_default();
        let Some(rewriter) = self.response_rewriter.as_mut() else {
            return Action::Continue;
        };
        let out = rewriter.push(&chunk, end_of_stream);
        if let Err(status) = counted(hostcalls::set_buffer(
            BufferType::HttpResponseBody,
            0,
            body_size,
            &out,
        )) {
            log::warn!("wasm-epp: cannot rewrite the response body: {status:?}");
        }
        Action::Continue
    }
}

/// The buffered request body, up to `size` bytes (one host call and one copy).
fn request_body(size: usize) -> Vec<u8> {
    timed(ShimPhase::BodyCopy, || {
        counted(hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size))
            .ok()
            .flatten()
            .unwrap_or_default()
    })
}

/// Answers the client with `error` and stops the request.
fn reject(error: &InferenceError) -> Action {
    let body = error.body();
    let mut headers = vec![("content-type", "text/plain; charset=utf-8")];
    if let Some(reason) = error.dropped_reason() {
        headers.push((DROPPED_REASON_HEADER, reason));
    }
    if let Err(status) = counted(hostcalls::send_http_response(
        error.status(),
        headers,
        Some(body.as_bytes()),
    )) {
        log::error!("wasm-epp: cannot send local reply: {status:?}");
    }
    Action::Pause
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.0
            .borrow_mut()
            .on_request_headers(headers, end_of_stream)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.0
            .borrow_mut()
            .on_request_body(body_size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, trailers: usize) -> Action {
        self.0.borrow_mut().on_request_trailers(trailers)
    }

    fn on_http_response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.0
            .borrow_mut()
            .on_response_headers(headers, end_of_stream)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.0
            .borrow_mut()
            .on_response_body(body_size, end_of_stream)
    }

    fn on_log(&mut self) {
        let worker = {
            let mut stream = self.0.borrow_mut();
            stream.on_log();
            stream.worker.clone()
        };
        // Last: releasing other streams switches the effective context.
        flow::on_request_end(&worker);
    }
}

/// The stream's callbacks, in the order Envoy calls them.
impl Stream {
    fn on_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.counting(|this| {
            timed(ShimPhase::Headers, || this.read_controls());
            if end_of_stream {
                return this.decide(None);
            }
            // Hold the headers until the whole body is buffered (needs
            // allow_on_headers_stop_iteration in the plugin config).
            Action::Pause
        })
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_seen = true;
        if !end_of_stream {
            // Buffer until the end of the body, or until the trailers end the request.
            return Action::Pause;
        }
        self.counting(|this| {
            let body = request_body(body_size);
            this.decide(Some(body))
        })
    }

    /// A request that ends with trailers (HTTP/2, or chunked HTTP/1.1) never has a body
    /// callback with end of stream: it is decided here, on the buffered body, so trailers
    /// cannot bypass validation, the subset check or fail-close.
    fn on_request_trailers(&mut self, _trailers: usize) -> Action {
        if self.decided {
            return Action::Continue;
        }
        self.counting(|this| {
            if !this.body_seen {
                return this.decide(None);
            }
            // The body buffered so far is the whole body; the host clamps the length to it.
            let body = request_body(usize::MAX);
            this.decide(Some(body))
        })
    }

    fn on_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.counting(|this| timed(ShimPhase::Response, || this.add_response_headers()))
    }

    fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if body_size > 0 && !std::mem::replace(&mut self.first_byte, true) {
            // The server has prefilled the prompt (in memory, no host call).
            if let Some((key, prefill_bytes)) = self.in_flight.as_mut() {
                self.worker
                    .borrow_mut()
                    .prefilled(*key, std::mem::take(prefill_bytes));
            }
            // One clock read (a host call) per routed request, for its time to first byte.
            self.counting(|this| this.sample_since_decision(Kind::TtftMs));
        }
        if self.response_rewriter.as_ref().is_none_or(|r| r.is_noop()) {
            return Action::Continue;
        }
        self.counting(|this| {
            timed(ShimPhase::Response, || {
                this.rewrite_response_body(body_size, end_of_stream)
            })
        })
    }

    fn on_log(&mut self) {
        // One clock read per routed request, for its duration (after the response: no one
        // waits on it).
        self.counting(|this| this.sample_since_decision(Kind::DurationMs));
        let mut worker = self.worker.borrow_mut();
        if let Some((key, prefill_bytes)) = self.in_flight.take() {
            worker.end(key, prefill_bytes);
        }
        if std::mem::take(&mut self.waiting) {
            // The client went away while the request waited.
            worker.unpark(self.id);
        }
        if std::mem::take(&mut self.released) {
            worker.released_finished();
        }
        worker.finished(self.host_calls);
    }
}
