//! `session-affinity-scorer`: the endpoint the request's session is bound to scores 1, every
//! other endpoint 0. Two strategies, as upstream:
//!
//! - `encoded_endpoint_header` (the default): the session token is the header
//!   [`TOKEN_HEADER`], base64 of the endpoint's name; the director reads it from the request
//!   ([`decode`]) and returns the picked endpoint's ([`encode`]) with the response.
//! - `session_id`: the client names its session in [`SESSION_ID_HEADER`]; the binding session →
//!   endpoint lives in Envoy's shared data, so every worker sees it ([`lookup`], [`settle`]). It
//!   is created by the first pick, refreshed while requests go to the bound endpoint, moved when
//!   that endpoint is no longer a candidate (not when another scorer outweighs it), and forgotten
//!   after the TTL without use. The bindings occupy a fixed set of [`SLOTS`] keys chosen by the
//!   session id's hash, so their memory is bounded; two live sessions on one slot take turns
//!   (the later one evicts the earlier, which then binds again). Each is one host call: a
//!   request with a session id reads its slot once and writes it only when the binding changes
//!   or is refreshed.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use xxhash_rust::xxh3::xxh3_64;

use crate::scheduler::ScoringInput;
use crate::shared_data::SharedStore;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "session-affinity-scorer";

/// Request and response header carrying the session token.
pub const TOKEN_HEADER: &str = "x-session-token";
/// Request header naming the session (`session_id` strategy).
pub const SESSION_ID_HEADER: &str = "x-session-id";
/// Shared-data keys holding session bindings.
pub const SLOTS: u64 = 4096;
/// A binding is written again at most this often while it is used (milliseconds), so a busy
/// session costs one read per request, not a write too.
const REFRESH_MS: u64 = 1_000;

/// The binding of `session` in `store`, if it is younger than `ttl_ms` at `now_ms`: the
/// endpoint's name and when the binding was last written.
pub fn lookup(
    store: &dyn SharedStore,
    session: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Option<(String, u64)> {
    let (value, _) = store.get(&slot_key(session))?;
    let text = String::from_utf8(value?).ok()?;
    let mut parts = text.splitn(3, '\n');
    let (owner, endpoint, seen) = (parts.next()?, parts.next()?, parts.next()?);
    let seen: u64 = seen.parse().ok()?;
    (owner == session && now_ms.saturating_sub(seen) <= ttl_ms)
        .then(|| (endpoint.to_string(), seen))
}

/// Updates `session`'s binding after a pick of `picked`: `bound` is what [`lookup`] found and
/// `bound_was_candidate` whether that endpoint was among the candidates. Returns whether it
/// wrote.
pub fn settle(
    store: &dyn SharedStore,
    session: &str,
    bound: Option<&(String, u64)>,
    bound_was_candidate: bool,
    picked: &str,
    now_ms: u64,
) -> bool {
    let write = match bound {
        None => true,
        Some((endpoint, seen)) if endpoint == picked => now_ms.saturating_sub(*seen) >= REFRESH_MS,
        // Outweighed by other scorers while still a candidate: the binding stays, unrefreshed.
        Some(_) => !bound_was_candidate,
    };
    write
        && store.set(
            &slot_key(session),
            format!("{session}\n{picked}\n{now_ms}").as_bytes(),
            None,
        )
}

fn slot_key(session: &str) -> String {
    format!("wasm-epp.session.{}", xxh3_64(session.as_bytes()) % SLOTS)
}

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
    fn a_session_binds_refreshes_and_moves_only_when_its_endpoint_is_gone() {
        let store = crate::shared_data::fake::Host::default();
        let ttl = 300_000;
        assert_eq!(lookup(&store, "s1", 0, ttl), None);
        assert!(settle(&store, "s1", None, false, "pod-1", 1_000));
        let bound = lookup(&store, "s1", 2_000, ttl).unwrap();
        assert_eq!(bound, ("pod-1".to_string(), 1_000));
        // Same endpoint within the refresh interval: nothing written.
        assert!(!settle(&store, "s1", Some(&bound), true, "pod-1", 1_500));
        // Outweighed while still a candidate: stays.
        assert!(!settle(&store, "s1", Some(&bound), true, "pod-2", 3_000));
        assert_eq!(lookup(&store, "s1", 3_000, ttl).unwrap().0, "pod-1");
        // Its endpoint gone: moves.
        assert!(settle(&store, "s1", Some(&bound), false, "pod-2", 4_000));
        assert_eq!(lookup(&store, "s1", 4_000, ttl).unwrap().0, "pod-2");
        // Unused past the TTL: forgotten.
        assert_eq!(lookup(&store, "s1", 4_000 + ttl + 1, ttl), None);
        // Another session on the same slot is not this one.
        let other = (0..100_000)
            .map(|i| format!("other-{i}"))
            .find(|s| slot_key(s) == slot_key("s1"))
            .unwrap();
        assert_eq!(lookup(&store, &other, 4_000, ttl), None);
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
