//! One ext_proc stream (one HTTP request): the messages Envoy sends in, the answers going
//! back. Plain Rust over the generated protobuf types, no gRPC.
//!
//! - FULL_DUPLEX_STREAMED request body (upstream's mode; Envoy says so in the first
//!   message's `protocol_config`): the headers get no answer yet; body chunks are collected
//!   until `end_of_stream` (or trailers), then the server answers the headers with the routing
//!   mutation, streams the body back (Envoy forwards only what the server returns) and answers
//!   trailers if any.
//! - Any other mode (BUFFERED in practice): the headers are answered "continue" at once
//!   (Envoy holds them while it buffers the body) and the routing mutation rides on the answer
//!   to the whole body.
//! - Headers with `end_of_stream` (no body, e.g. `GET /v1/models`): routed at once.
//! - Errors (a bad body, no endpoint, a body over [`MAX_BODY_BYTES`]) are immediate replies.
//! - Response messages, should Envoy be configured to send them, are answered "continue": the
//!   response is not rewritten (a model rewrite's response-side renaming is left out).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use wasm_epp::director::{Controls, Outcome};
use wasm_epp::errors::InferenceError;

use super::picking::{InFlight, PickState};
use super::replies::{self, Routing};

/// Largest request body collected (the Envoy configs buffer at most 16 MiB per connection).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The request headers the pick reads, from ext_proc's header map.
fn controls(map: Option<&HeaderMap>) -> Controls {
    let headers: Vec<(String, String)> = map
        .map(|m| m.headers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|h| {
            // Envoy sends `raw_value`; older builds sent `value`.
            let value = if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            };
            (h.key.to_ascii_lowercase(), value)
        })
        .collect();
    Controls::read(|name| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// Where the routing decision is answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// In the answer to headers that end the request.
    HeadersOnly,
    /// In the answer to the whole buffered body.
    BufferedBody,
    /// Headers answer, then the body streamed back; `trailers_follow` keeps its end open.
    FullDuplex { trailers_follow: bool },
}

/// The state of one stream.
#[derive(Debug)]
pub struct Exchange {
    state: Arc<PickState>,
    full_duplex: bool,
    controls: Controls,
    body: Vec<u8>,
    decided: bool,
    in_flight: Option<InFlight>,
}

impl Exchange {
    /// A new stream deciding with `state`.
    pub fn new(state: Arc<PickState>) -> Exchange {
        Exchange {
            state,
            full_duplex: false,
            controls: Controls::default(),
            body: Vec::new(),
            decided: false,
            in_flight: None,
        }
    }

    /// Handles one message from Envoy; returns the answers to send, in order.
    pub fn handle(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(protocol) = message.protocol_config {
            self.full_duplex =
                protocol.request_body_mode == BodySendMode::FullDuplexStreamed as i32;
        }
        let Some(request) = message.request else {
            return Vec::new();
        };
        match request {
            Request::RequestHeaders(headers) => {
                self.controls = controls(headers.headers.as_ref());
                if headers.end_of_stream {
                    self.decide(Answer::HeadersOnly)
                } else if self.full_duplex {
                    Vec::new()
                } else {
                    vec![replies::continue_request_headers()]
                }
            }
            Request::RequestBody(chunk) => {
                if self.decided {
                    // Nothing more is expected once decided; pass anything late through.
                    return if self.full_duplex {
                        replies::streamed_body(&chunk.body, chunk.end_of_stream)
                    } else {
                        vec![replies::continue_request_body()]
                    };
                }
                if self.body.len() + chunk.body.len() > MAX_BODY_BYTES {
                    self.decided = true;
                    self.body = Vec::new();
                    return vec![replies::reject(&InferenceError::BadRequest(format!(
                        "request body larger than {MAX_BODY_BYTES} bytes"
                    )))];
                }
                self.body.extend_from_slice(&chunk.body);
                match (chunk.end_of_stream, self.full_duplex) {
                    (true, true) => self.decide(Answer::FullDuplex {
                        trailers_follow: false,
                    }),
                    (true, false) => self.decide(Answer::BufferedBody),
                    (false, true) => Vec::new(),
                    (false, false) => vec![replies::continue_request_body()],
                }
            }
            Request::RequestTrailers(_) => {
                let mut out = if self.full_duplex && !self.decided {
                    self.decide(Answer::FullDuplex {
                        trailers_follow: true,
                    })
                } else {
                    Vec::new()
                };
                if !out.iter().any(is_immediate) {
                    out.push(replies::continue_request_trailers());
                }
                out
            }
            Request::ResponseHeaders(_) => vec![replies::continue_response_headers()],
            Request::ResponseBody(_) => vec![replies::continue_response_body()],
            Request::ResponseTrailers(_) => vec![replies::continue_response_trailers()],
        }
    }

    fn decide(&mut self, answer: Answer) -> Vec<ProcessingResponse> {
        self.decided = true;
        let body = std::mem::take(&mut self.body);
        // The time is the pick state's to set.
        let incoming = self.controls.incoming(
            (answer != Answer::HeadersOnly).then_some(body.as_slice()),
            0,
        );
        let route = match self.state.decide(&incoming) {
            Outcome::Route(route) => Some(route),
            Outcome::Unrouted => None,
            Outcome::Reject(error) => return vec![replies::reject(&error)],
            // The baseline runs the benchmark's profiles, which leave flow control off.
            Outcome::Wait(_) => {
                return vec![replies::reject(&InferenceError::Internal(
                    "the ext_proc baseline has no flow control".to_string(),
                ))]
            }
        };
        let destination = route.as_ref().map(|r| r.destination.as_str());
        let new_body = route.as_ref().and_then(|r| r.body.as_deref());
        if let Some(route) = &route {
            self.in_flight = Some(self.state.start_request(route.primary.clone()));
        }
        match answer {
            Answer::HeadersOnly => vec![replies::route_in_headers(&Routing {
                destination,
                ..Routing::default()
            })],
            Answer::BufferedBody => vec![replies::route_in_body(&Routing {
                destination,
                content_length: new_body.map(<[u8]>::len),
                body: new_body,
            })],
            Answer::FullDuplex { trailers_follow } => {
                let forwarded = new_body.unwrap_or(&body);
                let mut out = vec![replies::route_in_headers(&Routing {
                    destination,
                    // Upstream sets the final length whenever there is a body.
                    content_length: (!forwarded.is_empty()).then_some(forwarded.len()),
                    body: None,
                })];
                out.extend(replies::streamed_body(forwarded, !trailers_follow));
                out
            }
        }
    }
}

fn is_immediate(response: &ProcessingResponse) -> bool {
    matches!(response.response, Some(Response::ImmediateResponse(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extproc::picking::tests::snapshot;
    use crate::extproc::replies::tests::{set_headers, streamed};
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        HttpBody, HttpHeaders, HttpTrailers, ProtocolConfiguration,
    };
    use wasm_epp::director::{DESTINATION_HEADER, SUBSET_HEADER};

    fn state(endpoints: u8) -> Arc<PickState> {
        let state = Arc::new(PickState::new(7));
        state.publish(snapshot(1, endpoints), None);
        state
    }

    fn headers(path: &str, end_of_stream: bool, mode: BodySendMode) -> ProcessingRequest {
        ProcessingRequest {
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: mode as i32,
                ..ProtocolConfiguration::default()
            }),
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        HeaderValue {
                            key: ":path".into(),
                            raw_value: path.as_bytes().to_vec(),
                            ..HeaderValue::default()
                        },
                        HeaderValue {
                            key: SUBSET_HEADER.into(),
                            value: "10.0.0.2:8000".into(),
                            ..HeaderValue::default()
                        },
                    ],
                }),
                end_of_stream,
                ..HttpHeaders::default()
            })),
            ..ProcessingRequest::default()
        }
    }

    fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(Request::RequestBody(HttpBody {
                body: bytes.to_vec(),
                end_of_stream,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        }
    }

    fn destination(response: &ProcessingResponse) -> Option<String> {
        let common = match &response.response {
            Some(Response::RequestHeaders(h)) => h.response.as_ref(),
            Some(Response::RequestBody(b)) => b.response.as_ref(),
            _ => None,
        }?;
        set_headers(common)
            .into_iter()
            .find(|(k, _)| k == DESTINATION_HEADER)
            .map(|(_, v)| v)
    }

    const PROMPT: &[u8] = br#"{"model":"m","prompt":"hello there"}"#;

    #[test]
    fn full_duplex_defers_the_headers_and_streams_the_body_back() {
        let state = state(3);
        let mut exchange = Exchange::new(state.clone());
        let mode = BodySendMode::FullDuplexStreamed;
        assert!(exchange
            .handle(headers("/v1/completions", false, mode))
            .is_empty());
        assert!(exchange.handle(body(&PROMPT[..10], false)).is_empty());
        let out = exchange.handle(body(&PROMPT[10..], true));
        assert_eq!(out.len(), 2, "{out:?}");
        // The subset header limits the pick to 10.0.0.2:8000.
        assert_eq!(destination(&out[0]).as_deref(), Some("10.0.0.2:8000"));
        assert!(matches!(
            &out[0].response,
            Some(Response::RequestHeaders(_))
        ));
        assert_eq!(streamed(&out[1..]), vec![(PROMPT.to_vec(), true)]);
        assert_eq!(state.in_flight_of("10.0.0.2:8000"), 1);
        drop(exchange);
        assert_eq!(state.in_flight_of("10.0.0.2:8000"), 0);
    }

    #[test]
    fn full_duplex_with_trailers_decides_at_the_trailers() {
        let mut exchange = Exchange::new(state(2));
        let mode = BodySendMode::FullDuplexStreamed;
        exchange.handle(headers("/v1/completions", false, mode));
        assert!(exchange.handle(body(PROMPT, false)).is_empty());
        let out = exchange.handle(ProcessingRequest {
            request: Some(Request::RequestTrailers(HttpTrailers::default())),
            ..ProcessingRequest::default()
        });
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(streamed(&out[1..2]), vec![(PROMPT.to_vec(), false)]);
        assert!(matches!(
            &out[2].response,
            Some(Response::RequestTrailers(_))
        ));
    }

    #[test]
    fn buffered_continues_the_headers_and_routes_in_the_body_answer() {
        let mut exchange = Exchange::new(state(3));
        let out = exchange.handle(headers("/v1/completions", false, BodySendMode::Buffered));
        assert_eq!(destination(&out[0]), None);
        assert!(matches!(
            &out[0].response,
            Some(Response::RequestHeaders(_))
        ));
        let out = exchange.handle(body(PROMPT, true));
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0].response, Some(Response::RequestBody(_))));
        assert_eq!(destination(&out[0]).as_deref(), Some("10.0.0.2:8000"));
        assert!(streamed(&out).is_empty(), "the body is not sent back");
    }

    #[test]
    fn a_bad_body_is_an_immediate_400() {
        let mut exchange = Exchange::new(state(2));
        exchange.handle(headers(
            "/v1/chat/completions",
            false,
            BodySendMode::FullDuplexStreamed,
        ));
        let out = exchange.handle(body(b"{not json", true));
        let [reply] = out.as_slice() else {
            panic!("{out:?}");
        };
        let Some(Response::ImmediateResponse(reply)) = &reply.response else {
            panic!("{reply:?}");
        };
        assert_eq!(reply.status.map(|s| s.code), Some(400));
        assert!(String::from_utf8_lossy(&reply.body).starts_with("inference error: BadRequest"));
    }

    #[test]
    fn a_request_without_body_is_routed_from_its_headers() {
        let mut exchange = Exchange::new(state(3));
        let out = exchange.handle(headers(
            "/v1/models",
            true,
            BodySendMode::FullDuplexStreamed,
        ));
        let [reply] = out.as_slice() else {
            panic!("{out:?}");
        };
        assert_eq!(destination(reply).as_deref(), Some("10.0.0.2:8000"));
    }

    #[test]
    fn without_a_snapshot_requests_are_refused_with_503() {
        let mut exchange = Exchange::new(Arc::new(PickState::new(1)));
        let out = exchange.handle(headers("/v1/models", true, BodySendMode::Buffered));
        assert!(matches!(
            &out[0].response,
            Some(Response::ImmediateResponse(r)) if r.status.map(|s| s.code) == Some(503)
        ));
    }
}
