//! Every request is decided exactly once, whatever the protocol: HTTP/1.1, HTTP/2 with the
//! body in one or many DATA frames, and HTTP/2 requests that end with a trailers frame (whose
//! body callbacks never see end of stream). Steering, validation, the subset check and
//! fail-close are asserted over each. Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::http2::{self, H2Request};
use common::*;

/// How a request travels to Envoy.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Http1,
    /// HTTP/2, the body in one DATA frame ending the stream.
    H2,
    /// HTTP/2, the body in 7-byte DATA frames.
    H2Chunked,
    /// HTTP/2, the body then a trailers frame ending the stream.
    H2Trailers,
    /// HTTP/2, 7-byte DATA frames then trailers.
    H2ChunkedTrailers,
}

const SHAPES: [Shape; 5] = [
    Shape::Http1,
    Shape::H2,
    Shape::H2Chunked,
    Shape::H2Trailers,
    Shape::H2ChunkedTrailers,
];

/// Sends a request shaped as `shape`; `body: None` is a GET.
fn send(
    shape: Shape,
    port: u16,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Reply {
    let url = format!("http://127.0.0.1:{port}{path}");
    let (chunk, trailers): (usize, &[(&str, &str)]) = match shape {
        Shape::Http1 => {
            return match body {
                Some(body) => post(&url, body, headers),
                None => get(&url, headers),
            }
        }
        Shape::H2 => (0, &[]),
        Shape::H2Chunked => (7, &[]),
        Shape::H2Trailers => (0, &[("x-trailer", "1")]),
        Shape::H2ChunkedTrailers => (7, &[("x-trailer", "1")]),
    };
    http2::send(
        port,
        &H2Request {
            method: if body.is_some() { "POST" } else { "GET" },
            path,
            headers,
            body: body.map(str::as_bytes),
            chunk,
            trailers,
        },
    )
}

#[test]
fn every_request_is_decided_over_http1_and_http2_with_and_without_trailers() {
    let f = fleet("protocols", &["a", "b"], 2);
    let scratch = Scratch::new("protocols-outsider");
    let outsider = Sim::start(&scratch, "outsider", &[]);
    f.envoy.wait_for_snapshot();
    let port = f.envoy.port;
    let (a, b) = (f.sims[0].addr(), f.sims[1].addr());
    let members = [a.as_str(), b.as_str()];
    let outside = outsider.addr();
    let spoofed = format!("{outside},{a}");
    for shape in SHAPES {
        let served_before: u64 = f.sims.iter().map(Sim::requests_served).sum();

        // A valid request is routed to a member, with the control headers left behind.
        let body = completion(&unique("valid"));
        let reply = send(
            shape,
            port,
            "/v1/completions",
            Some(&body),
            &[
                ("x-gateway-destination-endpoint", &spoofed),
                ("x-llm-d-inference-objective", "anything"),
            ],
        );
        assert_eq!(reply.status, 200, "{shape:?}: {reply:?}");
        let destination = reply.header("x-sim-received-destination").unwrap_or("");
        assert!(members.contains(&destination), "{shape:?}: {reply:?}");
        assert_eq!(reply.header("x-sim-received-control"), None, "{shape:?}");

        // Bad JSON is refused by the filter and reaches no server.
        let reply = send(shape, port, "/v1/completions", Some("{not json"), &[]);
        assert_eq!(reply.status, 400, "{shape:?}: {reply:?}");
        assert!(
            reply
                .body
                .starts_with("inference error: BadRequest - error unmarshaling request body"),
            "{shape:?}: {}",
            reply.body
        );

        // The subset hint is enforced: a member is honoured, a non-member gets 503.
        let body = completion(&unique("subset"));
        let reply = send(
            shape,
            port,
            "/v1/completions",
            Some(&body),
            &[("x-gateway-destination-endpoint-subset", &b)],
        );
        assert_eq!((reply.status, reply.instance()), (200, "b"), "{shape:?}");
        let reply = send(
            shape,
            port,
            "/v1/completions",
            Some(&body),
            &[("x-gateway-destination-endpoint-subset", &outside)],
        );
        assert_eq!(reply.status, 503, "{shape:?}: {reply:?}");
        assert_eq!(
            reply.header("x-llm-d-request-dropped-reason"),
            Some("rejected-no-endpoints"),
            "{shape:?}"
        );

        // A request without a body cannot steer either.
        let reply = send(
            shape,
            port,
            "/v1/models",
            None,
            &[("x-gateway-destination-endpoint", &outside)],
        );
        assert_eq!(reply.status, 200, "{shape:?}: {reply:?}");
        assert!(
            members.contains(&reply.header("x-sim-received-destination").unwrap_or("")),
            "{shape:?}: {reply:?}"
        );

        let served: u64 = f.sims.iter().map(Sim::requests_served).sum();
        // The two routed completions (the simulator does not count `/v1/models`).
        assert_eq!(served - served_before, 2, "{shape:?}: only the routed two");
    }

    // HTTP/2 headers then trailers, no DATA: decided as a request without a body.
    let reply = http2::send(
        port,
        &H2Request {
            method: "POST",
            path: "/v1/completions",
            headers: &[("x-gateway-destination-endpoint-subset", &outside)],
            trailers: &[("x-trailer", "1")],
            ..H2Request::default()
        },
    );
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(outsider.requests_served(), 0);
}

#[test]
fn fail_close_holds_for_every_protocol_shape() {
    let scratch = Scratch::new("protocols-no-snapshot");
    let fallback = Sim::start(&scratch, "fallback", &[]);
    let envoy = Envoy::start(
        &scratch,
        EnvoyOptions {
            fallback_port: fallback.port,
            ..EnvoyOptions::with_controller(free_port())
        },
    );
    for shape in SHAPES {
        let body = completion("x");
        let reply = send(shape, envoy.port, "/v1/completions", Some(&body), &[]);
        assert_eq!(reply.status, 503, "{shape:?}: {reply:?}");
        assert!(
            reply
                .body
                .starts_with("inference error: ServiceUnavailable - no endpoint snapshot"),
            "{shape:?}: {}",
            reply.body
        );
    }
    assert_eq!(fallback.requests_served(), 0);
}

#[test]
fn an_oversized_body_gets_413_over_http1_and_http2() {
    let f = fleet("oversized", &["a"], 1);
    f.envoy.wait_for_snapshot();
    // Past the listener's 16 MiB buffer limit. Over HTTP/1.1 Envoy answers 413 and closes the
    // connection; a client still writing a much larger body can see the close (a reset) before
    // the answer, so 20 MiB there.
    let body = completion(&"x".repeat(20 << 20));
    let reply = send(
        Shape::Http1,
        f.envoy.port,
        "/v1/completions",
        Some(&body),
        &[],
    );
    assert_eq!(reply.status, 413, "HTTP/1.1: {}", reply.body);
    // Over HTTP/2 Envoy sends the whole 413 and then resets the stream with NO_ERROR, as
    // HTTP/2 allows when the answer is complete before the request; 64 MiB, the size probed.
    let body = completion(&"x".repeat(64 << 20));
    let length_64 = body.len().to_string();
    for (chunk, trailers, content_length) in [
        (0, &[][..], Some(length_64.as_str())),
        (64 << 10, &[][..], None),
        (0, &[("x-trailer", "1")][..], None),
    ] {
        let headers: Vec<(&str, &str)> = content_length
            .map(|l| ("content-length", l))
            .into_iter()
            .collect();
        let reply = http2::send(
            f.envoy.port,
            &H2Request {
                method: "POST",
                path: "/v1/completions",
                headers: &headers,
                body: Some(body.as_bytes()),
                chunk,
                trailers,
            },
        );
        assert_eq!(
            reply.status, 413,
            "HTTP/2 chunk {chunk}, trailers {trailers:?}: {}",
            reply.body
        );
    }
    assert_eq!(f.sims[0].requests_served(), 1, "only the warm-up");
}
