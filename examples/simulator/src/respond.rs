//! Response builders and the body type every handler returns.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Serialize;

/// The body of every response: a full buffer or an event stream.
pub type Body = BoxBody<Bytes, Infallible>;

/// A response with `body` of media type `content_type`.
pub fn with_body(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON response.
pub fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    // Serializing our own response types cannot fail; an empty body would
    // only ever show a bug, never bad input.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    with_body(status, "application/json", full(bytes))
}

/// A plain-text response of media type `content_type`.
pub fn text(status: StatusCode, content_type: &'static str, text: String) -> Response<Body> {
    with_body(status, content_type, full(text))
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}
