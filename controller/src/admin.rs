//! The admin server (`--metrics-listen`): health, readiness, Prometheus metrics and a debug view
//! of the endpoints.
//!
//! - `GET /healthz` → 200 `ok`.
//! - `GET /readyz` → 200 once discovery has loaded and a scrape round has completed, else 503.
//! - `GET /metrics` → the controller's own metrics and the pool gauges (upstream EPP names).
//! - `GET /debug/endpoints` → JSON array of every endpoint's metrics and scrape status.
//!
//! The metrics page is written here, not through a metrics crate: it is a few dozen lines
//! rebuilt from the store on each scrape, and its names must match upstream's exactly
//! (`prometheus-client` would render OpenMetrics and rename counters).

use std::fmt::Write as _;
use std::sync::Arc;

use hyper::{Method, StatusCode, Uri};
use tokio::net::TcpListener;

use crate::http::{self, Reply};
use crate::store::now_unix_ms;
use crate::store::{Counters, EndpointReport, Store};

/// Metrics younger than this count as fresh for the pool gauges (upstream
/// `--metrics-staleness-threshold` default).
pub const FRESH_WITHIN_MS: u64 = 2_000;

/// Serves the admin endpoints on `listener` forever.
pub async fn run(listener: TcpListener, store: Arc<Store>) {
    http::serve(listener, "admin", move |request| {
        let store = store.clone();
        async move {
            if request.method() == Method::GET {
                handle(&store, request.uri())
            } else {
                http::method_not_allowed("GET")
            }
        }
    })
    .await
}

/// Answers one GET request for `uri`.
pub fn handle(store: &Store, uri: &Uri) -> Reply {
    match uri.path() {
        "/healthz" => http::reply(StatusCode::OK, http::TEXT, "ok\n"),
        "/readyz" if store.is_ready() => http::reply(StatusCode::OK, http::TEXT, "ok\n"),
        "/readyz" => http::reply(
            StatusCode::SERVICE_UNAVAILABLE,
            http::TEXT,
            "not ready: the first scrape round has not completed\n",
        ),
        "/metrics" => http::reply(
            StatusCode::OK,
            http::PROMETHEUS,
            metrics_text(store, now_unix_ms()),
        ),
        "/debug/endpoints" => match serde_json::to_vec(&store.endpoint_reports(now_unix_ms())) {
            Ok(json) => http::reply(StatusCode::OK, http::JSON, json),
            Err(e) => http::reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                http::TEXT,
                format!("cannot encode the endpoints: {e}\n"),
            ),
        },
        _ => http::not_found(),
    }
}

/// Renders the Prometheus exposition at time `now_unix_ms`.
pub fn metrics_text(store: &Store, now_unix_ms: u64) -> String {
    let counters = store.counters();
    let endpoints = store.endpoint_reports(now_unix_ms);
    let fresh: Vec<&EndpointReport> = endpoints
        .iter()
        .filter(|e| e.metrics_age_ms.is_some_and(|age| age <= FRESH_WITHIN_MS))
        .collect();
    let average = |value: fn(&EndpointReport) -> f64| {
        if fresh.is_empty() {
            0.0
        } else {
            fresh.iter().map(|e| value(e)).sum::<f64>() / fresh.len() as f64
        }
    };

    let mut out = Exposition::default();
    out.family(
        "wasm_epp_controller_snapshot_version",
        "gauge",
        "Version of the latest published snapshot.",
        &[(String::new(), store.current().version() as f64)],
    );
    out.family(
        "wasm_epp_controller_endpoints",
        "gauge",
        "Endpoints currently discovered.",
        &[(String::new(), endpoints.len() as f64)],
    );
    out.family(
        "wasm_epp_controller_scrapes_total",
        "counter",
        "Metrics scrapes by result.",
        &[
            (
                r#"result="success""#.to_string(),
                Counters::get(&counters.scrapes_success) as f64,
            ),
            (
                r#"result="error""#.to_string(),
                Counters::get(&counters.scrapes_error) as f64,
            ),
        ],
    );
    out.family(
        "wasm_epp_controller_snapshot_requests_total",
        "counter",
        "Snapshot API requests by how they were answered.",
        &[
            (
                r#"kind="immediate""#.to_string(),
                Counters::get(&counters.snapshot_immediate) as f64,
            ),
            (
                r#"kind="long_poll""#.to_string(),
                Counters::get(&counters.snapshot_long_poll) as f64,
            ),
            (
                r#"kind="not_modified""#.to_string(),
                Counters::get(&counters.snapshot_not_modified) as f64,
            ),
        ],
    );
    out.family(
        "llm_d_epp_average_kv_cache_utilization",
        "gauge",
        "Average KV-cache utilization (0..1) over endpoints with fresh metrics.",
        &[(String::new(), average(|e| e.metrics.kv_cache_usage))],
    );
    out.family(
        "llm_d_epp_average_queue_size",
        "gauge",
        "Average waiting-queue size over endpoints with fresh metrics.",
        &[(
            String::new(),
            average(|e| e.metrics.waiting_queue_size as f64),
        )],
    );
    out.family(
        "llm_d_epp_average_running_requests",
        "gauge",
        "Average running requests over endpoints with fresh metrics.",
        &[(
            String::new(),
            average(|e| e.metrics.running_requests_size as f64),
        )],
    );
    out.family(
        "llm_d_epp_ready_endpoints",
        "gauge",
        "Endpoints with metrics scraped in the last 2 s.",
        &[(String::new(), fresh.len() as f64)],
    );
    let per_endpoint: Vec<(String, f64)> = fresh
        .iter()
        .map(|e| {
            (
                format!(
                    r#"model_server_endpoint="{}",name="{}""#,
                    escape_label(&e.host_port),
                    escape_label(&e.name)
                ),
                e.metrics.waiting_queue_size as f64,
            )
        })
        .collect();
    out.family(
        "llm_d_epp_per_endpoint_queue_size",
        "gauge",
        "Waiting-queue size per endpoint with fresh metrics.",
        &per_endpoint,
    );
    out.family(
        "llm_d_epp_datalayer_poll_errors_total",
        "counter",
        "Failed metrics polls.",
        &[(
            r#"source_type="metrics-data-source""#.to_string(),
            Counters::get(&counters.scrapes_error) as f64,
        )],
    );
    out.text
}

/// Escapes a Prometheus label value.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// Builds a text exposition family by family.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    /// Writes `# HELP`, `# TYPE` and one line per `(labels, value)`; `labels` is the inside of
    /// the braces, empty for none.
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            if labels.is_empty() {
                let _ = writeln!(self.text, "{name} {value}");
            } else {
                let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus;
    use wasm_epp::scheduler::profile::Profile;
    use wasm_epp::snapshot::{Endpoint, Metrics};

    fn endpoint(name: &str, port: u16) -> Endpoint {
        Endpoint {
            name: name.to_string(),
            address: "10.0.0.1".to_string(),
            port,
            ready: true,
            key_cache: Default::default(),
            labels: Default::default(),
            metrics: Metrics::default(),
        }
    }

    fn value(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        prometheus::parse(text)
            .unwrap()
            .into_iter()
            .find(|s| {
                s.name == name
                    && match label {
                        Some((key, wanted)) => s.label(key) == Some(wanted),
                        None => true,
                    }
            })
            .map(|s| s.value)
    }

    #[test]
    fn pool_gauges_average_fresh_endpoints_only() {
        let store = Store::new(
            Profile::default(),
            vec![
                endpoint("fresh-1", 1),
                endpoint("fresh-2", 2),
                endpoint("stale", 3),
            ],
        );
        let jobs = store.begin_scrapes();
        let metrics = |queue, running, kv| Metrics {
            waiting_queue_size: queue,
            running_requests_size: running,
            kv_cache_usage: kv,
            ..Metrics::default()
        };
        store.record_scrape(&jobs[0].key, Ok(metrics(2, 4, 0.2).into()), 10_000);
        store.record_scrape(&jobs[1].key, Ok(metrics(6, 8, 0.6).into()), 10_000);
        store.record_scrape(&jobs[2].key, Ok(metrics(100, 100, 1.0).into()), 1_000);
        store.record_scrape(&jobs[2].key, Err("refused".into()), 9_000);
        store.finish_round();

        let text = metrics_text(&store, 10_500);
        let v = |name, label| value(&text, name, label);
        assert_eq!(v("llm_d_epp_ready_endpoints", None), Some(2.0));
        assert_eq!(v("llm_d_epp_average_queue_size", None), Some(4.0));
        assert_eq!(v("llm_d_epp_average_running_requests", None), Some(6.0));
        let kv = v("llm_d_epp_average_kv_cache_utilization", None).unwrap();
        assert!((kv - 0.4).abs() < 1e-9, "{kv}");
        assert_eq!(
            v(
                "llm_d_epp_per_endpoint_queue_size",
                Some(("name", "fresh-2"))
            ),
            Some(6.0)
        );
        assert_eq!(
            v(
                "llm_d_epp_per_endpoint_queue_size",
                Some(("model_server_endpoint", "10.0.0.1:1"))
            ),
            Some(2.0)
        );
        assert_eq!(
            v("llm_d_epp_per_endpoint_queue_size", Some(("name", "stale"))),
            None
        );
        assert_eq!(v("wasm_epp_controller_endpoints", None), Some(3.0));
        assert_eq!(
            v(
                "wasm_epp_controller_scrapes_total",
                Some(("result", "success"))
            ),
            Some(3.0)
        );
        assert_eq!(
            v(
                "wasm_epp_controller_scrapes_total",
                Some(("result", "error"))
            ),
            Some(1.0)
        );
        assert_eq!(v("llm_d_epp_datalayer_poll_errors_total", None), Some(1.0));
        assert_eq!(
            v("wasm_epp_controller_snapshot_version", None),
            Some(store.current().version() as f64)
        );
    }

    #[test]
    fn an_empty_pool_reports_zero_averages() {
        let store = Store::new(Profile::default(), vec![]);
        let text = metrics_text(&store, now_unix_ms());
        assert_eq!(
            value(&text, "llm_d_epp_average_queue_size", None),
            Some(0.0)
        );
        assert_eq!(value(&text, "llm_d_epp_ready_endpoints", None), Some(0.0));
    }

    #[test]
    fn readiness_follows_the_first_round() {
        let store = Store::new(Profile::default(), vec![]);
        let readyz: Uri = "/readyz".parse().unwrap();
        assert_eq!(
            handle(&store, &readyz).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        store.finish_round();
        assert_eq!(handle(&store, &readyz).status(), StatusCode::OK);
        assert_eq!(
            handle(&store, &"/healthz".parse().unwrap()).status(),
            StatusCode::OK
        );
        assert_eq!(
            handle(&store, &"/nope".parse().unwrap()).status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
