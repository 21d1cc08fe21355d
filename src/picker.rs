//! One request's decision, from the snapshot and the request to a destination or an error.
//! Plain Rust: the Proxy-Wasm shell only supplies the inputs and applies the outcome.

use crate::errors::InferenceError;
use crate::request::{self, Api};
use crate::scheduler::profile::ScorerSpec;
use crate::scheduler::rng::Rng;
use crate::scheduler::{self, Request, SchedulerState};
use crate::snapshot::{Endpoint, Snapshot};

/// Request header carrying the chosen endpoint(s), `ip:port[,ip:port…]`.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// What to do with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Forward with `x-gateway-destination-endpoint: destination`; `primary` is in-flight.
    Route {
        /// The header value: primary first, then fallbacks, comma-separated.
        destination: String,
        /// The primary endpoint's `ip:port` (counted in flight until the stream ends).
        primary: String,
    },
    /// Fail-open without a snapshot: forward with no destination header.
    Unrouted,
    /// Answer the client with this error.
    Reject(InferenceError),
}

/// Per-worker picking state: the learnt prefix index and the tie-break generator.
#[derive(Debug)]
pub struct Picker {
    state: SchedulerState,
    rng: Rng,
}

impl Picker {
    /// A picker whose random choices start from `seed`.
    pub fn new(seed: u64) -> Picker {
        Picker {
            state: SchedulerState::default(),
            rng: Rng::new(seed),
        }
    }

    /// Decides one request. `body` is `None` for a request without a body (header-only, such as
    /// `GET /v1/models`): upstream sends those to a random endpoint. `in_flight` reports this
    /// proxy's in-flight count for an endpoint; it is only asked when a scorer needs it.
    pub fn decide(
        &mut self,
        snapshot: Option<&Snapshot>,
        fail_open: bool,
        path: &str,
        body: Option<&[u8]>,
        in_flight: impl Fn(&Endpoint) -> u64,
    ) -> Outcome {
        let Some(snapshot) = snapshot else {
            return if fail_open {
                Outcome::Unrouted
            } else {
                Outcome::Reject(InferenceError::NoSnapshot)
            };
        };
        let endpoints = &snapshot.endpoints;
        let picked = match body {
            None if endpoints.is_empty() => return Outcome::Reject(InferenceError::NoPods),
            None => vec![self.rng.below(endpoints.len())],
            Some(body) => {
                let parsed = match request::parse(Api::from_path(path), body) {
                    Ok(parsed) => parsed,
                    Err(e) => return Outcome::Reject(e),
                };
                let needs_in_flight = snapshot
                    .profile
                    .scorers
                    .iter()
                    .any(|s| matches!(s.scorer, ScorerSpec::ActiveRequest(_)));
                let counts: Vec<u64> = if needs_in_flight {
                    endpoints.iter().map(&in_flight).collect()
                } else {
                    Vec::new()
                };
                let request = Request {
                    model: &parsed.model,
                    prompt: &parsed.prompt,
                    cache_salt: &parsed.cache_salt,
                };
                match scheduler::schedule(
                    &snapshot.profile,
                    endpoints,
                    &counts,
                    &request,
                    &mut self.state,
                    &mut self.rng,
                ) {
                    Ok(decision) => decision.picked,
                    Err(e) => return Outcome::Reject(e),
                }
            }
        };
        let chosen: Vec<String> = picked
            .iter()
            .filter_map(|&i| endpoints.get(i))
            .map(Endpoint::host_port)
            .collect();
        match chosen.first() {
            Some(primary) => Outcome::Route {
                primary: primary.clone(),
                destination: chosen.join(","),
            },
            None => Outcome::Reject(InferenceError::NoEndpoints(
                "failed to find endpoint candidates for serving the request".to_string(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::profile::{ActiveRequestParams, PickerSpec, Profile, WeightedScorer};
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn snapshot(endpoints: Vec<Endpoint>) -> Snapshot {
        Snapshot {
            version: 1,
            generated_unix_ms: 0,
            profile: Profile::default(),
            endpoints,
        }
    }

    const BODY: &[u8] = br#"{"model":"m","prompt":"hi"}"#;

    #[test]
    fn routes_to_the_least_loaded_endpoint() {
        let s = snapshot(vec![endpoint(1, 9, 0.9), endpoint(2, 0, 0.0)]);
        let out = Picker::new(1).decide(Some(&s), false, "/v1/completions", Some(BODY), |_| 0);
        assert_eq!(
            out,
            Outcome::Route {
                destination: "10.0.0.2:8000".into(),
                primary: "10.0.0.2:8000".into()
            }
        );
    }

    #[test]
    fn fallbacks_are_comma_separated() {
        let mut s = snapshot(vec![
            endpoint(1, 9, 0.9),
            endpoint(2, 0, 0.0),
            endpoint(3, 5, 0.5),
        ]);
        s.profile.picker = PickerSpec::MaxScore {
            max_num_of_endpoints: 2,
        };
        let out = Picker::new(1).decide(Some(&s), false, "/v1/completions", Some(BODY), |_| 0);
        let Outcome::Route {
            destination,
            primary,
        } = out
        else {
            panic!("{out:?}")
        };
        assert_eq!(destination, "10.0.0.2:8000,10.0.0.3:8000");
        assert_eq!(primary, "10.0.0.2:8000");
    }

    #[test]
    fn no_snapshot_fails_closed_or_open() {
        let mut p = Picker::new(1);
        assert_eq!(
            p.decide(None, false, "/v1/completions", Some(BODY), |_| 0),
            Outcome::Reject(InferenceError::NoSnapshot)
        );
        assert_eq!(
            p.decide(None, true, "/v1/completions", Some(BODY), |_| 0),
            Outcome::Unrouted
        );
    }

    #[test]
    fn errors_follow_upstream() {
        let mut p = Picker::new(1);
        let empty = snapshot(vec![]);
        let Outcome::Reject(e) =
            p.decide(Some(&empty), false, "/v1/completions", Some(BODY), |_| 0)
        else {
            panic!()
        };
        assert_eq!(
            (e.status(), e.dropped_reason()),
            (503, Some("rejected-no-endpoints"))
        );
        assert_eq!(
            p.decide(Some(&empty), false, "/v1/models", None, |_| 0),
            Outcome::Reject(InferenceError::NoPods)
        );
        let s = snapshot(vec![endpoint(1, 0, 0.0)]);
        let Outcome::Reject(e) = p.decide(Some(&s), false, "/v1/completions", Some(b"{"), |_| 0)
        else {
            panic!()
        };
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn header_only_requests_go_to_a_random_endpoint() {
        let s = snapshot(vec![endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)]);
        let mut p = Picker::new(9);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            if let Outcome::Route { primary, .. } =
                p.decide(Some(&s), false, "/v1/models", None, |_| 0)
            {
                seen.insert(primary);
            }
        }
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn in_flight_counts_feed_the_active_request_scorer() {
        let mut s = snapshot(vec![endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)]);
        s.profile.scorers = vec![WeightedScorer {
            name: "active-request-scorer".into(),
            weight: 1.0,
            scorer: ScorerSpec::ActiveRequest(ActiveRequestParams::default()),
        }];
        let busy_first = |e: &Endpoint| if e.address == "10.0.0.1" { 5 } else { 0 };
        for seed in 0..10 {
            let out = Picker::new(seed).decide(
                Some(&s),
                false,
                "/v1/completions",
                Some(BODY),
                busy_first,
            );
            assert!(
                matches!(out, Outcome::Route { ref primary, .. } if primary == "10.0.0.2:8000")
            );
        }
    }
}
