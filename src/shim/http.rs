//! The per-request HTTP context: strips client-supplied control headers, buffers the body,
//! asks the picker, and applies the outcome (destination header, or a local error reply).

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use super::filter::Worker;
use super::shared;
use crate::errors::{InferenceError, DROPPED_REASON_HEADER};
use crate::picker::{Outcome, DESTINATION_HEADER};

/// One request's filter state.
pub struct PickerHttp {
    worker: Rc<RefCell<Worker>>,
    path: String,
    /// The endpoint counted in flight for this request, released when the stream ends.
    in_flight: Option<String>,
}

impl PickerHttp {
    /// A context for a new request.
    pub fn new(worker: Rc<RefCell<Worker>>) -> PickerHttp {
        PickerHttp {
            worker,
            path: String::new(),
            in_flight: None,
        }
    }

    fn decide(&mut self, body: Option<&[u8]>) -> Action {
        let outcome = {
            let mut worker = self.worker.borrow_mut();
            let snapshot = worker.snapshot();
            let fail_open = worker.config.fail_open;
            worker
                .picker
                .decide(snapshot.as_deref(), fail_open, &self.path, body, |e| {
                    shared::in_flight(&e.host_port())
                })
        };
        match outcome {
            Outcome::Route {
                destination,
                primary,
            } => {
                if let Err(status) = hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    DESTINATION_HEADER,
                    Some(&destination),
                ) {
                    log::error!("wasm-epp: cannot set {DESTINATION_HEADER}: {status:?}");
                    return reject(&InferenceError::NoEndpoints(
                        "cannot set the destination header".to_string(),
                    ));
                }
                shared::add_in_flight(&primary, 1);
                self.in_flight = Some(primary);
                Action::Continue
            }
            Outcome::Unrouted => Action::Continue,
            Outcome::Reject(error) => reject(&error),
        }
    }
}

/// Answers the client with `error` and stops the request.
fn reject(error: &InferenceError) -> Action {
    let body = error.body();
    let mut headers = vec![("content-type", "text/plain; charset=utf-8")];
    if let Some(reason) = error.dropped_reason() {
        headers.push((DROPPED_REASON_HEADER, reason));
    }
    if let Err(status) =
        hostcalls::send_http_response(error.status(), headers, Some(body.as_bytes()))
    {
        log::error!("wasm-epp: cannot send local reply: {status:?}");
    }
    Action::Pause
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        // Envoy's config strips this header before the filter too; never trust a client value.
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, DESTINATION_HEADER, None);
        self.path = hostcalls::get_map_value(MapType::HttpRequestHeaders, ":path")
            .ok()
            .flatten()
            .unwrap_or_default();
        if end_of_stream {
            return self.decide(None);
        }
        // Hold the headers until the whole body is buffered (needs
        // allow_on_headers_stop_iteration in the plugin config).
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        self.decide(Some(&body))
    }

    fn on_log(&mut self) {
        if let Some(endpoint) = self.in_flight.take() {
            shared::add_in_flight(&endpoint, -1);
        }
    }
}
