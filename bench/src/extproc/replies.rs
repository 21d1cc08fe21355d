//! Building the ext_proc messages the server sends back: "continue" answers, the routing
//! header mutation (with `clear_route_cache` and the `envoy.lb` dynamic metadata upstream
//! EPPs set), streamed body chunks and immediate error replies.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use wasm_epp::director::DESTINATION_HEADER;
use wasm_epp::errors::{InferenceError, DROPPED_REASON_HEADER};

/// Largest body chunk sent back in one message (upstream's margin under 64 KiB).
pub const MAX_BODY_CHUNK: usize = 62_000;
/// Dynamic metadata namespace Envoy's load balancers read.
const LB_NAMESPACE: &str = "envoy.lb";

fn message(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// Continue with the request headers unchanged.
pub fn continue_request_headers() -> ProcessingResponse {
    message(Response::RequestHeaders(HeadersResponse::default()))
}

/// Continue with this request body chunk unchanged.
pub fn continue_request_body() -> ProcessingResponse {
    message(Response::RequestBody(BodyResponse::default()))
}

/// Continue with the request trailers unchanged.
pub fn continue_request_trailers() -> ProcessingResponse {
    message(Response::RequestTrailers(TrailersResponse::default()))
}

/// Continue with the response headers unchanged.
pub fn continue_response_headers() -> ProcessingResponse {
    message(Response::ResponseHeaders(HeadersResponse::default()))
}

/// Continue with this response body chunk unchanged.
pub fn continue_response_body() -> ProcessingResponse {
    message(Response::ResponseBody(BodyResponse::default()))
}

/// Continue with the response trailers unchanged.
pub fn continue_response_trailers() -> ProcessingResponse {
    message(Response::ResponseTrailers(TrailersResponse::default()))
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// What a routing answer changes: the destination header (none when the request goes on
/// unrouted), `content-length` when given, and a replacement body for BUFFERED mode.
#[derive(Debug, Default)]
pub struct Routing<'a> {
    /// `x-gateway-destination-endpoint`.
    pub destination: Option<&'a str>,
    /// The `content-length` to set.
    pub content_length: Option<usize>,
    /// The whole new body (BUFFERED mode, model rewritten).
    pub body: Option<&'a [u8]>,
}

fn routing_response(routing: &Routing<'_>) -> CommonResponse {
    let mut set_headers = Vec::new();
    if let Some(destination) = routing.destination {
        set_headers.push(set_header(DESTINATION_HEADER, destination));
    }
    if let Some(length) = routing.content_length {
        set_headers.push(set_header("content-length", &length.to_string()));
    }
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        body_mutation: routing.body.map(|body| BodyMutation {
            mutation: Some(Mutation::Body(body.to_vec())),
        }),
        clear_route_cache: routing.destination.is_some(),
        ..CommonResponse::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": destination}}`.
fn lb_metadata(destination: &str) -> Struct {
    let value = |kind| Value { kind: Some(kind) };
    let inner = Struct {
        fields: HashMap::from([(
            DESTINATION_HEADER.to_string(),
            value(Kind::StringValue(destination.to_string())),
        )]),
    };
    Struct {
        fields: HashMap::from([(LB_NAMESPACE.to_string(), value(Kind::StructValue(inner)))]),
    }
}

fn with_metadata(mut response: ProcessingResponse, routing: &Routing<'_>) -> ProcessingResponse {
    response.dynamic_metadata = routing.destination.map(lb_metadata);
    response
}

/// The routing decision as the answer to the request headers.
pub fn route_in_headers(routing: &Routing<'_>) -> ProcessingResponse {
    let response = Response::RequestHeaders(HeadersResponse {
        response: Some(routing_response(routing)),
    });
    with_metadata(message(response), routing)
}

/// The routing decision as the answer to the (whole, BUFFERED) request body.
pub fn route_in_body(routing: &Routing<'_>) -> ProcessingResponse {
    let response = Response::RequestBody(BodyResponse {
        response: Some(routing_response(routing)),
    });
    with_metadata(message(response), routing)
}

/// `body` sent back as streamed chunks of at most [`MAX_BODY_CHUNK`] bytes (FULL_DUPLEX_STREAMED
/// mode, where Envoy forwards only what the server returns); the last carries `end_of_stream`.
pub fn streamed_body(body: &[u8], end_of_stream: bool) -> Vec<ProcessingResponse> {
    let chunk = |bytes: &[u8], last: bool| {
        message(Response::RequestBody(BodyResponse {
            response: Some(CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                        body: bytes.to_vec(),
                        end_of_stream: last && end_of_stream,
                        ..StreamedBodyResponse::default()
                    })),
                }),
                ..CommonResponse::default()
            }),
        }))
    };
    if body.is_empty() {
        return vec![chunk(body, true)];
    }
    let count = body.len().div_ceil(MAX_BODY_CHUNK);
    body.chunks(MAX_BODY_CHUNK)
        .enumerate()
        .map(|(i, bytes)| chunk(bytes, i + 1 == count))
        .collect()
}

/// Answers the client with `error` (status, `inference error: …` body, drop reason).
pub fn reject(error: &InferenceError) -> ProcessingResponse {
    let mut set_headers = vec![set_header("content-type", "text/plain; charset=utf-8")];
    if let Some(reason) = error.dropped_reason() {
        set_headers.push(set_header(DROPPED_REASON_HEADER, reason));
    }
    message(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            // envoy.type.v3.StatusCode values are the HTTP codes themselves.
            code: i32::try_from(error.status()).unwrap_or(500),
        }),
        headers: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        body: error.body().into_bytes(),
        ..ImmediateResponse::default()
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The headers a routing answer sets, as (key, value) pairs.
    pub(crate) fn set_headers(common: &CommonResponse) -> Vec<(String, String)> {
        common
            .header_mutation
            .iter()
            .flat_map(|m| &m.set_headers)
            .filter_map(|o| o.header.as_ref())
            .map(|h| {
                (
                    h.key.clone(),
                    String::from_utf8_lossy(&h.raw_value).into_owned(),
                )
            })
            .collect()
    }

    /// The bytes and end-of-stream flags of streamed body answers.
    pub(crate) fn streamed(responses: &[ProcessingResponse]) -> Vec<(Vec<u8>, bool)> {
        responses
            .iter()
            .filter_map(|r| match &r.response {
                Some(Response::RequestBody(BodyResponse {
                    response:
                        Some(CommonResponse {
                            body_mutation:
                                Some(BodyMutation {
                                    mutation: Some(Mutation::StreamedResponse(s)),
                                }),
                            ..
                        }),
                })) => Some((s.body.clone(), s.end_of_stream)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn routing_in_headers_sets_the_destination_clears_the_route_and_adds_lb_metadata() {
        let response = route_in_headers(&Routing {
            destination: Some("10.0.0.1:8000"),
            content_length: Some(12),
            body: None,
        });
        let Some(Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        })) = &response.response
        else {
            panic!("expected a headers response: {response:?}");
        };
        assert!(common.clear_route_cache);
        assert_eq!(
            set_headers(common),
            vec![
                (DESTINATION_HEADER.to_string(), "10.0.0.1:8000".to_string()),
                ("content-length".to_string(), "12".to_string()),
            ]
        );
        let lb = &response.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(inner)) = &lb.kind else {
            panic!("{lb:?}");
        };
        assert_eq!(
            inner.fields[DESTINATION_HEADER].kind,
            Some(Kind::StringValue("10.0.0.1:8000".into()))
        );
    }

    #[test]
    fn unrouted_answers_change_nothing() {
        let response = route_in_body(&Routing::default());
        assert_eq!(response.dynamic_metadata, None);
        let Some(Response::RequestBody(BodyResponse {
            response: Some(common),
        })) = &response.response
        else {
            panic!("{response:?}");
        };
        assert!(!common.clear_route_cache);
        assert!(set_headers(common).is_empty());
        assert_eq!(common.body_mutation, None);
    }

    #[test]
    fn bodies_stream_back_in_bounded_chunks() {
        let body = vec![b'x'; 2 * MAX_BODY_CHUNK + 5];
        let chunks = streamed(&streamed_body(&body, true));
        let sizes: Vec<(usize, bool)> = chunks.iter().map(|(b, e)| (b.len(), *e)).collect();
        assert_eq!(
            sizes,
            vec![(MAX_BODY_CHUNK, false), (MAX_BODY_CHUNK, false), (5, true)]
        );
        let joined: Vec<u8> = chunks.iter().flat_map(|(b, _)| b.clone()).collect();
        assert_eq!(joined, body);
        // Trailers follow: no chunk ends the stream.
        assert_eq!(
            streamed(&streamed_body(b"ab", false)),
            vec![(b"ab".to_vec(), false)]
        );
        assert_eq!(
            streamed(&streamed_body(b"", true)),
            vec![(Vec::new(), true)]
        );
    }

    #[test]
    fn rejections_carry_status_body_and_drop_reason() {
        let error = InferenceError::NoEndpoints("none left".into());
        let Some(Response::ImmediateResponse(reply)) = reject(&error).response else {
            panic!("expected an immediate response");
        };
        assert_eq!(reply.status.map(|s| s.code), Some(503));
        assert_eq!(reply.body, error.body().into_bytes());
        let headers: Vec<String> = reply
            .headers
            .iter()
            .flat_map(|m| &m.set_headers)
            .filter_map(|o| o.header.as_ref())
            .map(|h| format!("{}={}", h.key, String::from_utf8_lossy(&h.raw_value)))
            .collect();
        assert!(headers.contains(&format!("{DROPPED_REASON_HEADER}=rejected-no-endpoints")));
    }
}
