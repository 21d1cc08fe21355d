//! One pick with the default profile (queue 2, kv-cache 2, prefix 3; max-score picker) over
//! 8, 100 and 1,000 endpoints, natively, with an in-memory prefix index; then one decision
//! over 3 endpoints with unique 1 KB, 100 KB and 1 MB prompts (body parsing and prompt hashing
//! dominate). Bounded: a fixed number of decisions per size. Run with `make bench-pick`
//! (`cargo bench --bench pick`).

use std::time::Instant;

use wasm_epp::director::{Director, Incoming, Outcome};
use wasm_epp::plugin_config::FilterConfig;
use wasm_epp::scheduler::prefix::PrefixIndex;
use wasm_epp::scheduler::profile::Profile;
use wasm_epp::snapshot::{Endpoint, Metrics, Snapshot};

const PICKS: usize = 2_000;

fn snapshot(n: usize) -> Snapshot {
    let endpoints = (0..n)
        .map(|i| Endpoint {
            name: format!("pod-{i}"),
            address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
            port: 8000,
            ready: true,
            key_cache: Default::default(),
            labels: Default::default(),
            metrics: Metrics {
                waiting_queue_size: (i % 7) as u64,
                running_requests_size: (i % 5) as u64,
                kv_cache_usage: (i % 10) as f64 / 10.0,
                updated_unix_ms: Some(0),
                ..Metrics::default()
            },
        })
        .collect();
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

/// p50, p90 and p99 of `samples` (µs), sorted in place.
fn quantiles(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.5), at(0.9), at(0.99))
}

/// Times one decision per body over `snapshot` with a fresh director and prefix index (each
/// body is built just before its decision, outside the timed part).
fn time_decisions(snapshot: &Snapshot, bodies: impl Iterator<Item = String>) -> (f64, f64, f64) {
    let config = FilterConfig::default();
    let mut store = PrefixIndex::new(config.prefix_index_buckets);
    let mut director = Director::new(1);
    let mut samples = Vec::new();
    for body in bodies {
        let incoming = Incoming {
            path: "/v1/completions",
            body: Some(body.as_bytes()),
            ..Incoming::default()
        };
        let start = Instant::now();
        let outcome = director.decide(
            Some(snapshot),
            &config,
            &incoming,
            |_| Default::default(),
            &mut store,
            None,
        );
        samples.push(start.elapsed().as_nanos() as f64 / 1000.0);
        assert!(matches!(outcome, Outcome::Route(_)), "{outcome:?}");
    }
    quantiles(&mut samples)
}

/// Decisions over 3 endpoints with unique prompts of each size.
fn decisions_by_prompt_size() {
    for (label, bytes, count) in [
        ("1kb", 1 << 10, 2_000),
        ("100kb", 100 << 10, 200),
        ("1mb", 1 << 20, 40),
    ] {
        let bodies = (0..count).map(|i| {
            let prompt = format!("{i:08} {}", "lorem ipsum ".repeat(bytes / 12));
            serde_json::json!({"model": "m", "prompt": prompt}).to_string()
        });
        let (p50, p90, p99) = time_decisions(&snapshot(3), bodies);
        println!("DECIDE prompt={label:<6} p50_us={p50:.1} p90_us={p90:.1} p99_us={p99:.1}");
    }
}

fn main() {
    // 1 KB chat-like prompts in 16 groups sharing a 768-byte prefix.
    let bodies: Vec<String> = (0..PICKS)
        .map(|i| {
            let prompt = format!(
                "group {} {} request {i:0>248}",
                i % 16,
                "system prompt ".repeat(54)
            );
            serde_json::json!({"model": "m", "prompt": prompt}).to_string()
        })
        .collect();
    println!("pick latency, default profile, 1 KB prompts, {PICKS} picks per size (native, this machine)");
    for n in [8, 100, 1000] {
        let (p50, p90, p99) = time_decisions(&snapshot(n), bodies.iter().cloned());
        println!("PICK endpoints={n:<5} p50_us={p50:.1} p90_us={p90:.1} p99_us={p99:.1}");
    }
    decisions_by_prompt_size();
}
