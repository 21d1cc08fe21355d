//! The scheduler: weighted scorers → picker over the snapshot's endpoints, as one upstream
//! scheduling profile does it. Plain Rust with no proxy-wasm types, tested natively and under
//! wasm-bindgen-test.

pub mod pickers;
pub mod prefix;
pub mod profile;
pub mod rng;
pub mod scorers;

use crate::errors::InferenceError;
use crate::snapshot::Endpoint;
use prefix::{PrefixIndex, PrefixMatch};
use profile::{Profile, ScorerSpec};
use rng::Rng;

/// What the scheduler needs from the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The model the request targets (seeds the prefix hashes).
    pub model: &'a str,
    /// Prompt bytes for the prefix-cache producer (empty: no prefix scoring).
    pub prompt: &'a [u8],
    /// The body's `cache_salt`.
    pub cache_salt: &'a str,
}

/// The outcome of scheduling one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Indices into the endpoint slice, primary first, then fallbacks.
    pub picked: Vec<usize>,
    /// Weighted total score per endpoint index (same order as the endpoint slice).
    pub totals: Vec<f64>,
}

/// Inputs every scorer may read: the candidates and what producers computed for the request.
pub struct ScoringInput<'a> {
    /// Candidate endpoints.
    pub endpoints: &'a [Endpoint],
    /// Prefix-cache match per candidate, when a prefix scorer is configured.
    pub prefix: Option<&'a PrefixMatch>,
    /// Requests this proxy has in flight per candidate (shared by all workers).
    pub in_flight: &'a [u64],
}

/// Mutable state the scheduler keeps between requests (learnt prefix index).
#[derive(Debug, Default)]
pub struct SchedulerState {
    /// Which endpoint likely holds which prompt blocks, learnt from our routing decisions.
    pub prefix_index: PrefixIndex,
}

/// Schedules one request over `endpoints` with `profile`, then records the decision in the
/// prefix index. `in_flight` holds this proxy's in-flight count per endpoint (or is empty).
pub fn schedule(
    profile: &Profile,
    endpoints: &[Endpoint],
    in_flight: &[u64],
    request: &Request<'_>,
    state: &mut SchedulerState,
    rng: &mut Rng,
) -> Result<Decision, InferenceError> {
    if endpoints.is_empty() {
        return Err(InferenceError::NoEndpoints(
            "failed to find endpoint candidates for serving the request".to_string(),
        ));
    }
    let prefix = profile.scorers.iter().find_map(|s| match &s.scorer {
        ScorerSpec::PrefixCache(params) => Some(prefix::produce(
            params,
            endpoints,
            request,
            &state.prefix_index,
        )),
        _ => None,
    });
    let input = ScoringInput {
        endpoints,
        prefix: prefix.as_ref(),
        in_flight,
    };
    let mut totals = vec![0.0; endpoints.len()];
    for weighted in &profile.scorers {
        let scores = scorers::score(&weighted.scorer, &input);
        for (total, score) in totals.iter_mut().zip(scores) {
            *total += weighted.weight * clamp_score(score);
        }
    }
    let picked = pickers::pick(&profile.picker, &totals, rng);
    if let (Some(prefix), Some(&primary)) = (&prefix, picked.first()) {
        if let Some(endpoint) = endpoints.get(primary) {
            state
                .prefix_index
                .record(endpoint, &prefix.hashes, prefix.capacity);
        }
    }
    Ok(Decision { picked, totals })
}

/// Scores are clamped to [0, 1] before weighting; NaN counts as 0.
fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::snapshot::{Endpoint, Metrics};

    /// An endpoint on 10.0.0.`i`:8000 with the given waiting queue and KV usage.
    pub fn endpoint(i: u8, waiting: u64, kv: f64) -> Endpoint {
        Endpoint {
            name: format!("pod-{i}"),
            address: format!("10.0.0.{i}"),
            port: 8000,
            labels: Default::default(),
            metrics: Metrics {
                waiting_queue_size: waiting,
                kv_cache_usage: kv,
                ..Metrics::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::profile::{PickerSpec, WeightedScorer};
    use super::test_support::endpoint;
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn run(
        profile: &Profile,
        endpoints: &[Endpoint],
        request: &Request<'_>,
        state: &mut SchedulerState,
    ) -> Decision {
        schedule(profile, endpoints, &[], request, state, &mut Rng::new(7)).unwrap()
    }

    #[test]
    fn empty_pool_is_no_endpoints() {
        let err = schedule(
            &Profile::default(),
            &[],
            &[],
            &Request::default(),
            &mut SchedulerState::default(),
            &mut Rng::new(1),
        )
        .unwrap_err();
        assert_eq!(err.dropped_reason(), Some("rejected-no-endpoints"));
    }

    #[test]
    fn default_profile_prefers_short_queue_and_free_kv() {
        let endpoints = [
            endpoint(1, 10, 0.9),
            endpoint(2, 0, 0.1),
            endpoint(3, 5, 0.5),
        ];
        let d = run(
            &Profile::default(),
            &endpoints,
            &Request::default(),
            &mut SchedulerState::default(),
        );
        assert_eq!(d.picked, vec![1]);
        // queue: 0, 1, 0.5 (×2); kv: 0.1, 0.9, 0.5 (×2); no prompt → prefix 0.
        let expected = [0.2, 3.8, 2.0];
        for (t, e) in d.totals.iter().zip(expected) {
            assert!((t - e).abs() < 1e-9, "{t} vs {e}");
        }
    }

    #[test]
    fn weights_are_applied_and_not_normalised() {
        let profile = Profile {
            name: "p".into(),
            scorers: vec![WeightedScorer {
                name: "kv".into(),
                weight: 5.0,
                scorer: ScorerSpec::KvCacheUtilization,
            }],
            picker: PickerSpec::MaxScore {
                max_num_of_endpoints: 2,
            },
        };
        let endpoints = [
            endpoint(1, 0, 0.6),
            endpoint(2, 0, 0.2),
            endpoint(3, 0, 0.4),
        ];
        let d = run(
            &profile,
            &endpoints,
            &Request::default(),
            &mut SchedulerState::default(),
        );
        assert_eq!(d.picked, vec![1, 2]);
        assert!((d.totals[1] - 4.0).abs() < 1e-9);
    }

    #[test]
    fn shared_prompt_sticks_to_the_endpoint_that_served_it() {
        let endpoints = [
            endpoint(1, 0, 0.0),
            endpoint(2, 0, 0.0),
            endpoint(3, 0, 0.0),
        ];
        let prompt = vec![b'x'; 4096];
        let request = Request {
            model: "m",
            prompt: &prompt,
            cache_salt: "",
        };
        let mut state = SchedulerState::default();
        let first = run(&Profile::default(), &endpoints, &request, &mut state).picked;
        for seed in 0..20 {
            let d = schedule(
                &Profile::default(),
                &endpoints,
                &[],
                &request,
                &mut state,
                &mut Rng::new(seed),
            )
            .unwrap();
            assert_eq!(d.picked, first);
        }
    }
}
