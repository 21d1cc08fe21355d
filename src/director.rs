//! The director (upstream's name for it): one request's decision, from the snapshot and the
//! request to a destination or an error: subset hint → body parsing → model rewrite →
//! admission → scheduling. Plain Rust: the Proxy-Wasm shell only supplies the inputs and
//! applies the outcome.

use crate::admission;
use crate::decision_header;
use crate::errors::InferenceError;
use crate::flow_control::shortest_job_first_ordering_policy::finish_by_ms;
use crate::phases::{Phase, PhaseTimer, Phases};
use crate::plugin_config::FilterConfig;
use crate::request::{self, Api};
use crate::rewrite;
use crate::scheduler::disaggregation::{self, ENCODER_HEADER, PREFILLER_HEADER};
use crate::scheduler::prefix::PrefixIndex;
use crate::scheduler::profile::{ScorerSpec, SessionAffinityParams, SessionStrategy};
use crate::scheduler::rng::Rng;
use crate::scheduler::scorers::session_affinity_scorer;
use crate::scheduler::{self, InFlight, Request};
use crate::shared_data::SharedStore;
use crate::snapshot::{Endpoint, Snapshot};
use crate::subset::{candidates, no_candidates};

/// Request header carrying the chosen endpoint(s), `ip:port[,ip:port…]`.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
pub use crate::decision_header::DECISION_HEADER;
/// Request and response header of the session-affinity scorer (its home:
/// [`session_affinity_scorer`]).
pub use crate::scheduler::scorers::session_affinity_scorer::TOKEN_HEADER as SESSION_TOKEN_HEADER;
pub use crate::subset::SUBSET_HEADER;
/// Request header of upstream flow-control fairness (and its deprecated alias); not used by
/// wasm-epp, removed like the other control headers.
const FAIRNESS_HEADERS: [&str; 2] = [
    "x-llm-d-inference-fairness-id",
    "x-gateway-inference-fairness-id",
];
/// Headers that steer the picker: read by the filter, never forwarded to a model server.
pub const CONTROL_HEADERS: [&str; 10] = [
    DESTINATION_HEADER,
    SUBSET_HEADER,
    admission::OBJECTIVE_HEADER,
    admission::DEPRECATED_OBJECTIVE_HEADER,
    rewrite::MODEL_REWRITE_HEADER,
    rewrite::DEPRECATED_MODEL_REWRITE_HEADER,
    FAIRNESS_HEADERS[0],
    FAIRNESS_HEADERS[1],
    PREFILLER_HEADER,
    ENCODER_HEADER,
];

/// What the filter saw of one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Incoming<'a> {
    /// `:path`.
    pub path: &'a str,
    /// The whole body; `None` for a request without one (such as `GET /v1/models`).
    pub body: Option<&'a [u8]>,
    /// The objective header's value.
    pub objective: Option<&'a str>,
    /// The model-rewrite header's value.
    pub model_rewrite: Option<&'a str>,
    /// The subset header's value.
    pub subset: Option<&'a str>,
    /// The session token header's value.
    pub session_token: Option<&'a str>,
    /// The session id header's value (`session_id` strategy).
    pub session_id: Option<&'a str>,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// Where the request stands with flow control.
    pub flow: FlowState,
}

/// Where a request stands with flow control (used only when the snapshot turns it on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowState {
    /// It waited and is being released: it is scheduled now, whatever the saturation.
    pub released: bool,
    /// The highest priority waiting in this proxy, as last known: a request of that priority
    /// or lower waits behind it.
    pub waiting_top: Option<i32>,
}

/// The request headers a decision reads, copied out before the control headers are removed
/// from the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Controls {
    /// `:path`.
    pub path: String,
    /// The objective header (or its deprecated alias).
    pub objective: Option<String>,
    /// The model-rewrite header (or its deprecated alias).
    pub model_rewrite: Option<String>,
    /// The subset header.
    pub subset: Option<String>,
    /// The session token header.
    pub session_token: Option<String>,
    /// The session id header.
    pub session_id: Option<String>,
}

impl Controls {
    /// Reads the headers through `header` (lowercase name → value); a current header name wins
    /// over its deprecated alias.
    pub fn read(header: impl Fn(&str) -> Option<String>) -> Controls {
        let either =
            |current: &str, deprecated: &str| header(current).or_else(|| header(deprecated));
        Controls {
            path: header(":path").unwrap_or_default(),
            objective: either(
                admission::OBJECTIVE_HEADER,
                admission::DEPRECATED_OBJECTIVE_HEADER,
            ),
            model_rewrite: either(
                rewrite::MODEL_REWRITE_HEADER,
                rewrite::DEPRECATED_MODEL_REWRITE_HEADER,
            ),
            subset: header(SUBSET_HEADER),
            session_token: header(SESSION_TOKEN_HEADER),
            session_id: header(session_affinity_scorer::SESSION_ID_HEADER),
        }
    }

    /// The decision's input: these headers with `body` at `now_unix_ms`.
    pub fn incoming<'a>(&'a self, body: Option<&'a [u8]>, now_unix_ms: u64) -> Incoming<'a> {
        Incoming {
            path: &self.path,
            body,
            objective: self.objective.as_deref(),
            model_rewrite: self.model_rewrite.as_deref(),
            subset: self.subset.as_deref(),
            session_token: self.session_token.as_deref(),
            session_id: self.session_id.as_deref(),
            now_unix_ms,
            flow: FlowState::default(),
        }
    }
}

/// A routing decision to apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    /// The destination header's value: primary first, then fallbacks, comma-separated.
    pub destination: String,
    /// The primary endpoint's `ip:port`.
    pub primary: String,
    /// The primary endpoint's [`Endpoint::index_key`] (counted in flight until the stream
    /// ends).
    pub primary_key: u64,
    /// Prompt bytes the primary is expected to prefill (counted in flight until the first
    /// response byte): none when a prefill endpoint does it.
    pub prefill_bytes: u64,
    /// A replacement request body (the model was rewritten).
    pub body: Option<Vec<u8>>,
    /// The prefill endpoint's `ip:port` for [`PREFILLER_HEADER`] (a disaggregated request).
    pub prefill: Option<String>,
    /// The model the client asked for and the one the request goes out with (empty for a
    /// request without a body); when they differ, responses are rewritten back.
    pub models: (String, String),
    /// The session token to return to the client.
    pub session_token: Option<String>,
    /// The decision header's value.
    pub explanation: Option<String>,
}

impl Route {
    /// `(target, client)` model names when the model was rewritten and responses must be
    /// rewritten back.
    pub fn model_rewrite(&self) -> Option<(&str, &str)> {
        let (client, target) = &self.models;
        (client != target).then_some((target.as_str(), client.as_str()))
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Forward it as decided.
    Route(Route),
    /// Fail-open without a snapshot: forward with no destination header.
    Unrouted,
    /// Answer the client with this error.
    Reject(InferenceError),
    /// Flow control: the pool is saturated (or others wait ahead); wait in the band of this
    /// priority.
    Wait(Wait),
}

/// Where a request waits in flow control, and what its band's ordering needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The band: the request's priority.
    pub priority: i32,
    /// When it would finish had it started now ([`finish_by_ms`]).
    pub finish_by_ms: u64,
}

/// A scheduled request, or one that waits. Returned once per decision and unwrapped at once,
/// so the route stays inline: boxing it would add an allocation to every request.
#[allow(clippy::large_enum_variant)]
enum Routed {
    Go(Route),
    Wait(Wait),
}

/// Per-worker decision state: the random generator for tie-breaks and weighted choices, and
/// the timer that splits decisions into phases when given a clock.
#[derive(Debug)]
pub struct Director {
    rng: Rng,
    timer: PhaseTimer,
}

impl Director {
    /// A director whose random choices start from `seed`.
    pub fn new(seed: u64) -> Director {
        Director {
            rng: Rng::new(seed),
            timer: PhaseTimer::off(),
        }
    }

    /// Like [`new`](Self::new), timing each decision's phases with `clock` (nanoseconds).
    pub fn with_clock(seed: u64, clock: fn() -> u64) -> Director {
        Director {
            rng: Rng::new(seed),
            timer: PhaseTimer::with_clock(clock),
        }
    }

    /// The last decision's phases (zero without a clock).
    pub fn phases(&self) -> Phases {
        self.timer.phases()
    }

    /// Decides one request. `in_flight` reports what this proxy has in flight to an endpoint
    /// (only asked when a scorer or the concurrency detector needs it); `prefix_index` is this
    /// worker's prefix index; `sessions` holds the `session_id` strategy's bindings (`None`:
    /// nothing is bound).
    pub fn decide(
        &mut self,
        snapshot: Option<&Snapshot>,
        config: &FilterConfig,
        incoming: &Incoming<'_>,
        in_flight: impl Fn(&Endpoint) -> InFlight,
        prefix_index: &mut PrefixIndex,
        sessions: Option<&dyn SharedStore>,
    ) -> Outcome {
        let Some(snapshot) = snapshot else {
            return if config.fail_open {
                Outcome::Unrouted
            } else {
                Outcome::Reject(InferenceError::NoSnapshot)
            };
        };
        self.timer.start();
        let routed = self.route(
            snapshot,
            config,
            incoming,
            in_flight,
            prefix_index,
            sessions,
        );
        self.timer.mark(Phase::Score);
        match routed {
            Ok(Routed::Go(route)) => Outcome::Route(route),
            Ok(Routed::Wait(wait)) => Outcome::Wait(wait),
            Err(e) => Outcome::Reject(e),
        }
    }

    fn route(
        &mut self,
        snapshot: &Snapshot,
        config: &FilterConfig,
        incoming: &Incoming<'_>,
        in_flight: impl Fn(&Endpoint) -> InFlight,
        prefix_index: &mut PrefixIndex,
        sessions: Option<&dyn SharedStore>,
    ) -> Result<Routed, InferenceError> {
        let endpoints = candidates(&snapshot.endpoints, incoming.subset)?;
        let Some(body) = incoming.body else {
            // Upstream sends requests without a body to a random endpoint.
            if endpoints.is_empty() {
                return Err(InferenceError::NoPods);
            }
            let endpoint = endpoints[self.rng.below(endpoints.len())];
            return Ok(Routed::Go(Route {
                destination: endpoint.host_port(),
                primary: endpoint.host_port(),
                primary_key: endpoint.index_key(),
                ..Route::default()
            }));
        };
        let api = Api::from_path(incoming.path);
        let parsed = request::parse(api, body)?;
        let mut route = Route::default();
        let mut target = parsed.model.to_string();
        if api.rewrites_model() {
            let random = self.rng.next_u64();
            target = rewrite::target_model(
                &parsed.model,
                incoming.model_rewrite,
                &snapshot.rewrites,
                random,
            )
            .0;
            if target != parsed.model {
                route.body = Some(rewrite::rewrite_request_model(body, &target)?);
            }
        }
        route.models = (parsed.model.to_string(), target.clone());
        let metrics_unix_ms = snapshot.metrics_clock(incoming.now_unix_ms);
        let priority = admission::objective_priority(&snapshot.objectives, incoming.objective);
        let flow_control = snapshot.profile.flow_control.as_ref();
        // This proxy's in-flight counts (in memory, no host call), once, for the scorers and
        // the concurrency detector that read them.
        let counts: Vec<InFlight> = if uses(snapshot, ScorerSpec::reads_in_flight)
            || snapshot.profile.concurrency_detector.is_some()
        {
            endpoints.iter().map(|e| in_flight(e)).collect()
        } else {
            Vec::new()
        };
        if priority < 0 || flow_control.is_some() {
            // A pass over the candidates' metrics (or counts), only for a sheddable request or
            // with flow control on.
            let saturation = admission::pool_saturation(
                &snapshot.profile,
                endpoints.iter().copied(),
                || counts.iter().map(|c| c.requests).sum(),
                metrics_unix_ms,
            );
            if !incoming.flow.released {
                // A sheddable request is shed while the pool is saturated, flow control or not.
                admission::admit(priority, saturation)?;
                let waits = flow_control.is_some_and(|fc| {
                    saturation >= fc.usage_threshold
                        || incoming.flow.waiting_top.is_some_and(|top| top >= priority)
                });
                if waits {
                    return Ok(Routed::Wait(Wait {
                        priority,
                        finish_by_ms: finish_by_ms(
                            incoming.now_unix_ms,
                            parsed.max_output_tokens,
                            &endpoints,
                        ),
                    }));
                }
            }
        }
        // `session_id` strategy: the request's session and its binding (one shared-data read).
        let session_id = session_id_strategy(snapshot)
            .zip(
                incoming
                    .session_id
                    .map(str::trim)
                    .filter(|id| !id.is_empty()),
            )
            .zip(sessions);
        let bound = session_id.and_then(|((params, id), store)| {
            session_affinity_scorer::lookup(store, id, incoming.now_unix_ms, params.eviction_ttl_ms)
        });
        let session = incoming
            .session_token
            .and_then(session_affinity_scorer::decode)
            .or_else(|| bound.as_ref().map(|(endpoint, _)| endpoint.clone()));
        self.timer.mark(Phase::Parse);
        let request = Request {
            model: &target,
            prompt: &parsed.prompt,
            cache_salt: &parsed.cache_salt,
            session_endpoint: session.as_deref(),
            now_unix_ms: incoming.now_unix_ms,
            metrics_unix_ms,
        };
        let decision = scheduler::schedule(
            &snapshot.profile,
            &snapshot.scoring_cache,
            &endpoints,
            &counts,
            &request,
            prefix_index,
            &mut self.rng,
            &mut self.timer,
        )?;
        let chosen: Vec<&Endpoint> = decision
            .picked
            .iter()
            .filter_map(|&i| endpoints.get(i).copied())
            .collect();
        let Some(primary) = chosen.first() else {
            return Err(no_candidates());
        };
        route.primary = primary.host_port();
        route.primary_key = primary.index_key();
        route.destination = chosen
            .iter()
            .map(|e| e.host_port())
            .collect::<Vec<_>>()
            .join(",");
        if let Some(stage) = &snapshot.profile.disaggregation {
            let prefill = disaggregation::prefill_pick(
                stage,
                &decision,
                &endpoints,
                &counts,
                &request,
                prefix_index,
                &mut self.rng,
                &mut self.timer,
            );
            route.prefill = prefill.map(Endpoint::host_port);
        }
        if route.prefill.is_none() {
            route.prefill_bytes = decision.primary_prefill_bytes;
        }
        if let Some(((_, id), store)) = session_id {
            let bound_was_candidate = bound.as_ref().is_some_and(|(name, _)| {
                decision
                    .candidates
                    .iter()
                    .any(|&i| endpoints.get(i).is_some_and(|e| e.name == *name))
            });
            session_affinity_scorer::settle(
                store,
                id,
                bound.as_ref(),
                bound_was_candidate,
                &primary.name,
                incoming.now_unix_ms,
            );
        }
        if uses(
            snapshot,
            |s| matches!(s, ScorerSpec::SessionAffinity(p) if p.strategy == SessionStrategy::EncodedEndpointHeader),
        ) {
            route.session_token = Some(session_affinity_scorer::encode(&primary.name));
        }
        if config.explain_decisions {
            let mut explanation =
                decision_header::explain(&snapshot.profile, &decision, &endpoints);
            if let Some(prefill) = &route.prefill {
                explanation.push_str(&format!("; prefill={prefill}"));
            }
            route.explanation = Some(explanation);
        }
        Ok(Routed::Go(route))
    }
}

/// The primary profile's `session-affinity-scorer` with the `session_id` strategy, if any.
fn session_id_strategy(snapshot: &Snapshot) -> Option<&SessionAffinityParams> {
    snapshot
        .profile
        .scorers
        .iter()
        .find_map(|s| match &s.scorer {
            ScorerSpec::SessionAffinity(params)
                if params.strategy == SessionStrategy::SessionId =>
            {
                Some(params)
            }
            _ => None,
        })
}

/// Whether a scorer of the decode profile (or of its prefill stage) is `which`.
fn uses(snapshot: &Snapshot, which: impl Fn(&ScorerSpec) -> bool) -> bool {
    let profile = &snapshot.profile;
    let prefill = profile.disaggregation.iter().map(|d| &d.prefill);
    std::iter::once(profile)
        .chain(prefill)
        .any(|p| p.scorers.iter().any(|s| which(&s.scorer)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::filters::concurrency_detector::ConcurrencyParams;
    use crate::scheduler::prefix::PrefixIndex;
    use crate::scheduler::profile::{ActiveRequestParams, PickerSpec, Profile, WeightedScorer};
    use crate::scheduler::test_support::endpoint;
    use crate::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn snapshot(endpoints: Vec<Endpoint>) -> Snapshot {
        Snapshot {
            instance: String::new(),
            version: 1,
            generated_unix_ms: 0,
            profile: Profile::default(),
            endpoints,
            objectives: Default::default(),
            rewrites: Vec::new(),
            vouched_ms: 0,
            scoring_cache: Default::default(),
        }
    }

    const BODY: &[u8] = br#"{"model":"m","prompt":"hi"}"#;

    fn completion() -> Incoming<'static> {
        Incoming {
            path: "/v1/completions",
            body: Some(BODY),
            ..Incoming::default()
        }
    }

    fn decide(s: Option<&Snapshot>, config: &FilterConfig, incoming: &Incoming<'_>) -> Outcome {
        Director::new(1).decide(
            s,
            config,
            incoming,
            |_| InFlight::default(),
            &mut PrefixIndex::new(64),
            None,
        )
    }

    fn route(outcome: Outcome) -> Route {
        match outcome {
            Outcome::Route(route) => route,
            other => panic!("expected a route, got {other:?}"),
        }
    }

    fn rejection(outcome: Outcome) -> InferenceError {
        match outcome {
            Outcome::Reject(e) => e,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn controls_prefer_current_header_names_over_deprecated_ones() {
        let headers = [
            (":path", "/v1/completions"),
            (admission::DEPRECATED_OBJECTIVE_HEADER, "old"),
            (rewrite::MODEL_REWRITE_HEADER, "new-model"),
            (rewrite::DEPRECATED_MODEL_REWRITE_HEADER, "old-model"),
            (SUBSET_HEADER, "10.0.0.1"),
        ];
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let controls = Controls::read(get);
        assert_eq!(controls.objective.as_deref(), Some("old"));
        assert_eq!(controls.model_rewrite.as_deref(), Some("new-model"));
        assert_eq!(controls.session_token, None);
        let incoming = controls.incoming(Some(BODY), 42);
        assert_eq!(
            (
                incoming.path,
                incoming.subset,
                incoming.body,
                incoming.now_unix_ms
            ),
            ("/v1/completions", Some("10.0.0.1"), Some(BODY), 42)
        );
        assert_eq!(Controls::read(|_| None), Controls::default());
    }

    #[test]
    fn routes_to_the_least_loaded_endpoint() {
        let s = snapshot(vec![endpoint(1, 9, 0.9), endpoint(2, 0, 0.0)]);
        let r = route(decide(Some(&s), &FilterConfig::default(), &completion()));
        assert_eq!(
            (r.destination.as_str(), r.primary.as_str()),
            ("10.0.0.2:8000", "10.0.0.2:8000")
        );
        assert_eq!((r.body, r.explanation, r.session_token), (None, None, None));
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
        let r = route(decide(Some(&s), &FilterConfig::default(), &completion()));
        assert_eq!(r.destination, "10.0.0.2:8000,10.0.0.3:8000");
        assert_eq!(r.primary, "10.0.0.2:8000");
    }

    #[test]
    fn no_snapshot_fails_closed_or_open() {
        let closed = FilterConfig::default();
        assert_eq!(
            rejection(decide(None, &closed, &completion())),
            InferenceError::NoSnapshot
        );
        let open = FilterConfig {
            fail_open: true,
            ..FilterConfig::default()
        };
        assert_eq!(decide(None, &open, &completion()), Outcome::Unrouted);
    }

    #[test]
    fn errors_follow_upstream() {
        let config = FilterConfig::default();
        let empty = snapshot(vec![]);
        let e = rejection(decide(Some(&empty), &config, &completion()));
        assert_eq!(
            (e.status(), e.dropped_reason()),
            (503, Some("rejected-no-endpoints"))
        );
        let models = Incoming {
            path: "/v1/models",
            ..Incoming::default()
        };
        assert_eq!(
            rejection(decide(Some(&empty), &config, &models)),
            InferenceError::NoPods
        );
        let s = snapshot(vec![endpoint(1, 0, 0.0)]);
        let bad = Incoming {
            body: Some(b"{"),
            ..completion()
        };
        assert_eq!(rejection(decide(Some(&s), &config, &bad)).status(), 400);
    }

    #[test]
    fn header_only_requests_go_to_a_random_endpoint() {
        let s = snapshot(vec![endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)]);
        let mut p = Director::new(9);
        let mut store = PrefixIndex::new(4);
        let models = Incoming {
            path: "/v1/models",
            ..Incoming::default()
        };
        let seen: std::collections::BTreeSet<String> = (0..50)
            .map(|_| {
                route(p.decide(
                    Some(&s),
                    &FilterConfig::default(),
                    &models,
                    |_| InFlight::default(),
                    &mut store,
                    None,
                ))
                .primary
            })
            .collect();
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
        assert_avoids_the_busy_first_endpoint(&s, 5);
    }

    /// With this proxy's `in_flight` requests on the first of two endpoints (none on the
    /// second), every seed picks the second.
    fn assert_avoids_the_busy_first_endpoint(s: &Snapshot, in_flight: u64) {
        let busy_first = |e: &Endpoint| {
            let requests = if e.address == "10.0.0.1" {
                in_flight
            } else {
                0
            };
            InFlight {
                requests,
                prefill_bytes: 0,
            }
        };
        for seed in 0..10 {
            let out = Director::new(seed).decide(
                Some(s),
                &FilterConfig::default(),
                &completion(),
                busy_first,
                &mut PrefixIndex::new(4),
                None,
            );
            assert_eq!(route(out).primary, "10.0.0.2:8000");
        }
    }

    #[test]
    fn a_route_counts_its_prompt_as_still_to_prefill() {
        let s = snapshot(vec![endpoint(1, 0, 0.0)]);
        let r = route(decide(Some(&s), &FilterConfig::default(), &completion()));
        assert_eq!(r.prefill_bytes, "hi".len() as u64);
    }

    #[test]
    fn in_flight_counts_feed_the_expected_delay_scorer() {
        // Both scraped idle and equally fast; this proxy has since sent the first one more
        // requests than it has ever run at once, which only the in-flight count shows.
        let servers = [1, 2].map(|i| {
            let mut e = endpoint(i, 0, 0.0);
            e.metrics.decode_ms_per_token = 25.0;
            e.metrics.peak_running_requests = 4;
            e
        });
        let mut s = snapshot(servers.to_vec());
        s.profile.scorers = vec![WeightedScorer {
            name: "expected-delay-scorer".into(),
            weight: 1.0,
            scorer: ScorerSpec::ExpectedDelay,
        }];
        assert_avoids_the_busy_first_endpoint(&s, 6);
    }

    #[test]
    fn unready_endpoints_are_skipped_while_any_candidate_is_ready() {
        // The unready endpoint looks best (idle), as a dead server's last metrics do.
        let mut dead = endpoint(1, 0, 0.0);
        dead.ready = false;
        let s = snapshot(vec![dead, endpoint(2, 5, 0.5), endpoint(3, 9, 0.9)]);
        let config = FilterConfig::default();
        for _ in 0..20 {
            let r = route(decide(Some(&s), &config, &completion()));
            assert_ne!(r.primary, "10.0.0.1:8000", "{r:?}");
            let no_body = Incoming {
                body: None,
                ..completion()
            };
            assert_ne!(
                route(decide(Some(&s), &config, &no_body)).primary,
                "10.0.0.1:8000"
            );
        }
        // A subset of unready endpoints only, or a pool with none ready, is still served.
        let only_dead = Incoming {
            subset: Some("10.0.0.1"),
            ..completion()
        };
        assert_eq!(
            route(decide(Some(&s), &config, &only_dead)).primary,
            "10.0.0.1:8000"
        );
        let mut none_ready = s.clone();
        none_ready
            .endpoints
            .iter_mut()
            .for_each(|e| e.ready = false);
        let r = route(decide(Some(&none_ready), &config, &completion()));
        assert_eq!(
            r.primary, "10.0.0.1:8000",
            "the best of an all-unready pool"
        );
    }

    #[test]
    fn subset_header_restricts_the_pick_by_ip() {
        let s = snapshot(vec![
            endpoint(1, 0, 0.0),
            endpoint(2, 9, 0.9),
            endpoint(3, 9, 0.9),
        ]);
        let config = FilterConfig::default();
        let subset = Incoming {
            subset: Some("10.0.0.2:9999, 10.0.0.3"),
            ..completion()
        };
        let r = route(decide(Some(&s), &config, &subset));
        assert!(
            r.primary == "10.0.0.2:8000" || r.primary == "10.0.0.3:8000",
            "{r:?}"
        );
        let outside = Incoming {
            subset: Some("10.9.9.9"),
            ..completion()
        };
        let e = rejection(decide(Some(&s), &config, &outside));
        assert_eq!(e.dropped_reason(), Some("rejected-no-endpoints"));
        let empty = Incoming {
            subset: Some(""),
            ..completion()
        };
        assert_eq!(rejection(decide(Some(&s), &config, &empty)).status(), 503);
    }

    #[test]
    fn sheddable_requests_are_rejected_when_saturated() {
        let now = 1_000_000;
        let mut busy = endpoint(1, 9, 0.9);
        busy.metrics.updated_unix_ms = Some(now);
        let mut s = snapshot(vec![busy]);
        s.objectives.insert("batch".into(), -1);
        s.objectives.insert("chat".into(), 10);
        let config = FilterConfig::default();
        let shed = Incoming {
            objective: Some("batch"),
            now_unix_ms: now,
            ..completion()
        };
        let e = rejection(decide(Some(&s), &config, &shed));
        assert_eq!((e.status(), e.code()), (429, "ResourceExhausted"));
        for objective in [Some("chat"), Some("unknown"), None] {
            let kept = Incoming {
                objective,
                now_unix_ms: now,
                ..completion()
            };
            assert!(
                matches!(decide(Some(&s), &config, &kept), Outcome::Route(_)),
                "{objective:?}"
            );
        }
        s.endpoints[0].metrics.waiting_queue_size = 0;
        s.endpoints[0].metrics.kv_cache_usage = 0.1;
        assert!(matches!(
            decide(Some(&s), &config, &shed),
            Outcome::Route(_)
        ));
    }

    #[test]
    fn model_rewrites_change_the_body_and_are_undone_on_the_way_back() {
        let mut s = snapshot(vec![endpoint(1, 0, 0.0)]);
        s.rewrites = vec![ModelRewrite {
            name: "ns/r".into(),
            rules: vec![RewriteRule {
                matches: vec!["m".into()],
                targets: vec![RewriteTarget {
                    model: "m-lora".into(),
                    weight: None,
                }],
            }],
        }];
        let r = route(decide(Some(&s), &FilterConfig::default(), &completion()));
        let body: serde_json::Value =
            serde_json::from_slice(r.body.as_deref().unwrap_or_default()).unwrap();
        assert_eq!(body["model"], "m-lora");
        assert_eq!(body["prompt"], "hi");
        assert_eq!(r.model_rewrite(), Some(("m-lora", "m")));
        // The header forces a target when no rule matches.
        s.rewrites.clear();
        let forced = Incoming {
            model_rewrite: Some("other"),
            ..completion()
        };
        let r = route(decide(Some(&s), &FilterConfig::default(), &forced));
        assert_eq!(r.model_rewrite(), Some(("other", "m")));
    }

    #[test]
    fn session_tokens_round_trip() {
        let mut s = snapshot(vec![endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)]);
        s.profile.scorers = vec![WeightedScorer {
            name: "session-affinity-scorer".into(),
            weight: 1.0,
            scorer: ScorerSpec::SessionAffinity(SessionAffinityParams::default()),
        }];
        let token = session_affinity_scorer::encode("pod-2");
        for seed in 0..10 {
            let incoming = Incoming {
                session_token: Some(&token),
                ..completion()
            };
            let r = route(Director::new(seed).decide(
                Some(&s),
                &FilterConfig::default(),
                &incoming,
                |_| InFlight::default(),
                &mut PrefixIndex::new(4),
                None,
            ));
            assert_eq!(r.primary, "10.0.0.2:8000");
            assert_eq!(r.session_token.as_deref(), Some(token.as_str()));
        }
    }

    #[test]
    fn explanations_list_the_pick_and_per_scorer_scores() {
        let s = snapshot(vec![endpoint(1, 9, 0.9), endpoint(2, 0, 0.0)]);
        let config = FilterConfig {
            explain_decisions: true,
            ..FilterConfig::default()
        };
        let r = route(decide(Some(&s), &config, &completion()));
        assert_eq!(
            r.explanation.as_deref(),
            Some(
                "picked=10.0.0.2:8000; \
                 10.0.0.2:8000 total=4.000 queue-scorer=1.000 kv-cache-utilization-scorer=1.000 prefix-cache-scorer=0.000; \
                 10.0.0.1:8000 total=0.200 queue-scorer=0.000 kv-cache-utilization-scorer=0.100 prefix-cache-scorer=0.000"
            )
        );
    }

    /// A wait in the band of `priority` for the test completion (no token limit, and its
    /// endpoints report no request lengths).
    fn wait(priority: i32) -> Outcome {
        Outcome::Wait(Wait {
            priority,
            finish_by_ms: u64::MAX,
        })
    }

    #[test]
    fn the_concurrency_detector_holds_requests_by_this_proxys_in_flight_counts() {
        // Scraped idle; this proxy has 3 requests in flight to each of two endpoints of 4 slots.
        let mut s = snapshot(vec![endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)]);
        s.profile.flow_control = Some(Default::default());
        s.profile.concurrency_detector = Some(ConcurrencyParams { max_concurrency: 4 });
        let body = br#"{"model":"m","prompt":"hi","max_tokens":12}"#;
        let incoming = Incoming {
            body: Some(body),
            ..completion()
        };
        let decide_with = |requests| {
            Director::new(1).decide(
                Some(&s),
                &FilterConfig::default(),
                &incoming,
                |_| InFlight {
                    requests,
                    prefill_bytes: 0,
                },
                &mut PrefixIndex::new(64),
                None,
            )
        };
        assert!(matches!(decide_with(3), Outcome::Route(_)));
        // Every slot taken: the request waits, its own token limit as its length, at the
        // default 25 ms per token (no server reports its speed).
        let expected = Outcome::Wait(Wait {
            priority: 0,
            finish_by_ms: incoming.now_unix_ms + 12 * 25,
        });
        assert_eq!(decide_with(4), expected);
    }

    #[test]
    fn flow_control_holds_requests_while_saturated_or_behind_others() {
        let fresh = |i, waiting| {
            let mut e = endpoint(i, waiting, 0.0);
            e.metrics.updated_unix_ms = Some(0);
            e
        };
        let mut s = snapshot(vec![fresh(1, 10), fresh(2, 10)]);
        s.objectives.insert("batch".to_string(), -1);
        s.objectives.insert("chat".to_string(), 2);
        let config = FilterConfig::default();
        let chat = Incoming {
            objective: Some("chat"),
            ..completion()
        };
        // Without flow control a saturated pool still routes (only sheddable requests shed).
        assert!(matches!(
            decide(Some(&s), &config, &chat),
            Outcome::Route(_)
        ));
        s.profile.flow_control = Some(Default::default());
        assert_eq!(decide(Some(&s), &config, &chat), wait(2));
        // A sheddable request keeps legacy admission's 429.
        let batch = Incoming {
            objective: Some("batch"),
            ..completion()
        };
        assert_eq!(rejection(decide(Some(&s), &config, &batch)).status(), 429);
        // A released request is scheduled whatever the saturation.
        let released = Incoming {
            flow: FlowState {
                released: true,
                waiting_top: None,
            },
            ..chat
        };
        assert!(matches!(
            decide(Some(&s), &config, &released),
            Outcome::Route(_)
        ));
        // Room in the pool: it goes, unless a request of its priority or higher waits.
        s.endpoints = vec![fresh(1, 0), fresh(2, 0)];
        assert!(matches!(
            decide(Some(&s), &config, &chat),
            Outcome::Route(_)
        ));
        let behind = |top| Incoming {
            flow: FlowState {
                released: false,
                waiting_top: Some(top),
            },
            ..chat
        };
        assert_eq!(decide(Some(&s), &config, &behind(2)), wait(2));
        assert!(matches!(
            decide(Some(&s), &config, &behind(1)),
            Outcome::Route(_)
        ));
    }
}
