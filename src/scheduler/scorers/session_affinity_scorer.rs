//! `session-affinity-scorer` (`encoded_endpoint_header` strategy): the endpoint named by the
//! request's session token scores 1, every other endpoint 0. The token is the header
//! [`TOKEN_HEADER`], base64 of the endpoint's name: the picker reads it from the request
//! ([`decode`]) and returns the picked endpoint's ([`encode`]) with the response.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "session-affinity-scorer";

/// Request and response header carrying the session token.
pub const TOKEN_HEADER: &str = "x-session-token";

/// The endpoint name a session token names, if it is base64 of UTF-8 text.
pub fn decode(token: &str) -> Option<String> {
    String::from_utf8(BASE64.decode(token.trim()).ok()?).ok()
}

/// The session token naming the endpoint `name`.
pub fn encode(name: &str) -> String {
    BASE64.encode(name.as_bytes())
}

/// One score per candidate.
pub fn score(input: &ScoringInput<'_>) -> Vec<f64> {
    let session = input.request.session_endpoint;
    input
        .endpoints
        .iter()
        .map(|e| {
            if session == Some(e.name.as_str()) {
                1.0
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::Request;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn tokens_round_trip_and_garbage_names_nobody() {
        assert_eq!(encode("pod-2"), "cG9kLTI=");
        assert_eq!(decode(" cG9kLTI= ").as_deref(), Some("pod-2"));
        assert_eq!(decode("not base64!"), None);
        assert_eq!(decode(&BASE64.encode([0xff, 0xfe])), None, "not UTF-8");
    }

    #[test]
    fn only_the_session_endpoint_scores() {
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let refs: Vec<_> = owned.iter().collect();
        let request = Request {
            session_endpoint: Some("pod-2"),
            ..Request::default()
        };
        assert_eq!(score(&input(&refs, &request)), vec![0.0, 1.0]);
        let request = Request::default();
        assert_eq!(score(&input(&refs, &request)), vec![0.0, 0.0]);
    }
}
