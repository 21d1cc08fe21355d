//! A bounded, deterministic fuzz of the filter's request path (natively, the same code the
//! Wasm filter runs): 20,000 requests built by mutating valid completions, chat, responses,
//! embeddings and messages bodies, with random paths and steering headers, against a snapshot
//! with rewrites, objectives and a saturated pool. Every decision must return (no panic), and
//! be a route to a pool member or an error in the upstream wire format: 4xx for anything the
//! client sent, 503 only for "no candidates" (an unknown subset), never a 500.

#![cfg(not(target_arch = "wasm32"))]

use std::panic::{catch_unwind, AssertUnwindSafe};

use wasm_epp::director::{Director, Incoming, Outcome};
use wasm_epp::plugin_config::FilterConfig;
use wasm_epp::scheduler::prefix::PrefixIndex;
use wasm_epp::scheduler::profile::Profile;
use wasm_epp::scheduler::rng::Rng;
use wasm_epp::scheduler::InFlight;
use wasm_epp::snapshot::{Endpoint, Metrics, ModelRewrite, RewriteRule, RewriteTarget, Snapshot};

const CASES: usize = 20_000;

fn snapshot() -> Snapshot {
    Snapshot {
        instance: "fuzz".into(),
        version: 1,
        generated_unix_ms: 0,
        profile: Profile::default(),
        endpoints: (1..=4)
            .map(|i| Endpoint {
                name: format!("pod-{i}"),
                address: format!("10.0.0.{i}"),
                port: 8000,
                ready: i != 4,
                key_cache: Default::default(),
                labels: Default::default(),
                metrics: Metrics {
                    waiting_queue_size: i * 3,
                    kv_cache_usage: 0.2 * i as f64,
                    active_models: vec!["lora-a".into()],
                    updated_unix_ms: Some(1_000),
                    ..Metrics::default()
                },
            })
            .collect(),
        objectives: [("batch".to_string(), -1), ("vip".to_string(), 5)].into(),
        rewrites: vec![ModelRewrite {
            name: "ns/r".into(),
            rules: vec![RewriteRule {
                matches: vec!["chat".into()],
                targets: vec![
                    RewriteTarget {
                        model: "base".into(),
                        weight: Some(3),
                    },
                    RewriteTarget {
                        model: "lora-a".into(),
                        weight: Some(1),
                    },
                ],
            }],
        }],
        vouched_ms: 0,
        scoring_cache: Default::default(),
    }
}

const SEEDS: [&str; 7] = [
    r#"{"model":"chat","prompt":"hello there","max_tokens":5,"stream":true}"#,
    r#"{"model":"base","prompt":["a","b"],"cache_salt":"s"}"#,
    r#"{"model":"chat","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
    r#"{"model":"base","input":"tell me","instructions":"x","stream":false}"#,
    r#"{"model":"base","input":["one","two"]}"#,
    r#"{"model":"base","max_tokens":10,"system":"s","messages":[{"role":"user","content":"yo"}]}"#,
    r#"{"model":"lora-a","prompt":"\u00e9\ud83d\ude00 unicode","n":2}"#,
];

const PATHS: [&str; 9] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/models",
    "/v1/completions?x=1#f",
    "",
];

const FRAGMENTS: [&str; 16] = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "null",
    "true",
    "1e999",
    "-0",
    "\"model\"",
    "\"prompt\":",
    "\u{0}",
    "\u{feff}",
];

const HEADER_VALUES: [&str; 10] = [
    "",
    "10.0.0.2",
    "10.0.0.4:8000",
    "10.9.9.9",
    "[fd00::1]:80",
    ",,,",
    "batch",
    "vip",
    "lora-a",
    "cG9kLTE=",
];

fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

/// A valid seed body, mutated 0–5 times.
fn body(rng: &mut Rng) -> Vec<u8> {
    let mut body = pick(rng, &SEEDS).as_bytes().to_vec();
    for _ in 0..rng.below(6) {
        let at = rng.below(body.len() + 1);
        match rng.below(6) {
            0 => body.truncate(at),
            1 => body
                .splice(at..at, pick(rng, &FRAGMENTS).bytes())
                .for_each(drop),
            2 if at < body.len() => body[at] = rng.next_u64() as u8,
            3 if at < body.len() => {
                body.remove(at);
            }
            4 => {
                let depth = rng.below(200);
                let nested = "[".repeat(depth) + &"]".repeat(depth);
                body.splice(at..at, nested.bytes()).for_each(drop);
            }
            _ => {
                let copy = body[at..].to_vec();
                body.extend_from_slice(&copy);
            }
        }
    }
    body
}

#[test]
fn every_fuzzed_request_is_decided_with_a_client_error_or_a_member() {
    let snapshot = snapshot();
    let config = FilterConfig::default();
    let mut store = PrefixIndex::new(config.prefix_index_buckets);
    let members: Vec<String> = snapshot.endpoints.iter().map(Endpoint::host_port).collect();
    let mut director = Director::new(7);
    let mut rng = Rng::new(0x5eed);
    let (mut routed, mut rejected) = (0, 0);
    for case in 0..CASES {
        let body = body(&mut rng);
        let path = pick(&mut rng, &PATHS);
        let header = |rng: &mut Rng| (rng.below(4) == 0).then(|| pick(rng, &HEADER_VALUES));
        let incoming = Incoming {
            path,
            body: (rng.below(20) != 0).then_some(&body[..]),
            objective: header(&mut rng),
            model_rewrite: header(&mut rng),
            subset: header(&mut rng),
            session_token: header(&mut rng),
            session_id: header(&mut rng),
            now_unix_ms: 1_000,
            flow: Default::default(),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // Extreme in-flight counts must not overflow a scorer either.
            let in_flight = |_: &Endpoint| InFlight {
                requests: 1,
                prefill_bytes: u64::MAX,
            };
            director.decide(
                Some(&snapshot),
                &config,
                &incoming,
                in_flight,
                &mut store,
                None,
            )
        }))
        .unwrap_or_else(|_| panic!("case {case} panicked: {incoming:?}"));
        match outcome {
            Outcome::Route(route) => {
                routed += 1;
                assert!(
                    route
                        .destination
                        .split(',')
                        .all(|d| members.contains(&d.to_string())),
                    "case {case}: {route:?}"
                );
                // The unready endpoint only when the subset names nothing else.
                let only_unready = incoming.subset == Some("10.0.0.4:8000");
                assert!(
                    only_unready || route.primary != "10.0.0.4:8000",
                    "case {case}: an unready endpoint for {incoming:?}"
                );
            }
            Outcome::Reject(error) => {
                rejected += 1;
                let status = error.status();
                let no_candidates = error.dropped_reason() == Some("rejected-no-endpoints");
                assert!(
                    (400..500).contains(&status) || (status == 503 && no_candidates),
                    "case {case}: {status} {error} for {incoming:?}"
                );
                assert!(error.body().starts_with("inference error: "), "case {case}");
            }
            Outcome::Unrouted => panic!("case {case}: unrouted with a snapshot"),
            Outcome::Wait(_) => panic!("case {case}: waits without flow control"),
        }
    }
    eprintln!("{CASES} fuzzed requests: {routed} routed, {rejected} rejected");
    assert!(
        routed > CASES / 20 && rejected > CASES / 20,
        "{routed} / {rejected}"
    );
}
