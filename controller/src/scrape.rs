//! Metrics scraping: every refresh interval, `GET http://<address>:<port><path>` on every
//! endpoint concurrently over one shared keep-alive HTTP/1.1 client, then publish.
//!
//! A round starts a scrape for every endpoint that has none in flight and waits for them until
//! the next tick at most; a slow endpoint's result lands in a later round, so it never delays
//! the others. Each scrape is bounded by the scrape timeout.
//!
//! Each endpoint's metrics are read with the names of its engine ([`crate::engines`]), and only
//! those families are asked for: `?name[]=…` is the filter of `prometheus_client`'s exposition.
//! A real vLLM 0.32's `/metrics` answers about 53 KB, 1.9 KB filtered; at the 50 ms default the
//! whole page cost an idle server 10–12 % of its core, the filtered scrape 2.3–2.6 % (0.8 % with
//! nobody scraping; `bench/run.py --only vllm`). vLLM routes
//! the exact path `/metrics` to an exposition without the filter and `/metrics/` to one with it,
//! so the path with a trailing slash is tried first, then the path as given, then the path
//! without a filter; the first that works is kept for the endpoint, and tried first again after
//! it fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use crate::engines::Engine;
use crate::extract::Scraped;
use crate::store::now_unix_ms;
use crate::store::{ScrapeJob, Store};
use crate::{extract, prometheus};

/// Largest metrics response read from a model server.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How scraping is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeSettings {
    /// Time between rounds (`--refresh-metrics-interval`).
    pub interval: Duration,
    /// Limit for one scrape, connect to last byte (`--scrape-timeout`, capped; see the CLI).
    pub timeout: Duration,
    /// Path of the metrics page (`--metrics-path`), starting with `/`.
    pub path: String,
    /// Consecutive failed scrapes after which an endpoint is unready
    /// (`--failed-scrapes-before-unready`).
    pub failures_before_unready: u32,
}

/// The ways of asking an endpoint for its metrics, best first (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    /// `<path>/?name[]=…`.
    FilteredSlash,
    /// `<path>?name[]=…`.
    Filtered,
    /// `<path>`.
    Plain,
}

const QUERIES: [Query; 3] = [Query::FilteredSlash, Query::Filtered, Query::Plain];

impl Query {
    /// The path and query for `engine`'s families under `path`.
    fn path_and_query(self, path: &str, engine: &Engine) -> String {
        let filter = || {
            engine
                .families()
                .iter()
                .map(|name| format!("name%5B%5D={}", name.replace(':', "%3A")))
                .collect::<Vec<_>>()
                .join("&")
        };
        let join = |path: &str| {
            let separator = if path.contains('?') { '&' } else { '?' };
            format!("{path}{separator}{}", filter())
        };
        match self {
            Query::FilteredSlash if path.ends_with('/') || path.contains('?') => join(path),
            Query::FilteredSlash => join(&format!("{path}/")),
            Query::Filtered => join(path),
            Query::Plain => path.to_string(),
        }
    }
}

/// The query that last worked for each endpoint (`address:port`).
type Working = Arc<Mutex<HashMap<String, Query>>>;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Scrapes rounds forever (until the task is dropped).
pub async fn run(store: Arc<Store>, settings: ScrapeSettings) {
    let client = client(&settings);
    let settings = Arc::new(settings);
    let working: Working = Arc::default();
    let mut ticker = tokio::time::interval(settings.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let tick = ticker.tick().await;
        let handles: Vec<_> = store
            .begin_scrapes()
            .into_iter()
            .map(|job| {
                tokio::spawn(scrape_and_record(
                    client.clone(),
                    settings.clone(),
                    store.clone(),
                    working.clone(),
                    job,
                ))
            })
            .collect();
        // Wait for this round's scrapes until the next tick; stragglers keep running (one per
        // endpoint at most) and are published by a later round.
        let _ = tokio::time::timeout_at(tick + settings.interval, async {
            for handle in handles {
                let _ = handle.await;
            }
        })
        .await;
        store.finish_round();
    }
}

fn client(settings: &ScrapeSettings) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(settings.timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(2)
        .build(connector)
}

async fn scrape_and_record(
    client: HttpClient,
    settings: Arc<ScrapeSettings>,
    store: Arc<Store>,
    working: Working,
    job: ScrapeJob,
) {
    let engine = &job.engine;
    let base = format!("http://{}{}", job.host_port, settings.path);
    let result = tokio::time::timeout(
        settings.timeout,
        scrape(&client, &settings.path, &job.host_port, engine, &working),
    )
    .await
    .unwrap_or_else(|_| Err(format!("timed out after {:?}", settings.timeout)));
    let failed = result.as_ref().err().cloned();
    if store.record_scrape(&job.key, result, now_unix_ms()) {
        match failed {
            Some(error) => {
                warn!(endpoint = %job.key.name, url = %base, %error, "endpoint {} ({base}): scrape failed: {error}", job.key.name)
            }
            None => {
                info!(endpoint = %job.key.name, url = %base, "endpoint {} ({base}): scrape recovered", job.key.name)
            }
        }
    }
}

/// Scrapes `host_port` with the query that last worked for it, or each query in turn; records
/// which one worked. The error is the last query's.
async fn scrape(
    client: &HttpClient,
    path: &str,
    host_port: &str,
    engine: &Engine,
    working: &Working,
) -> Result<Scraped, String> {
    let known = working.lock().ok().and_then(|w| w.get(host_port).copied());
    let mut error = String::new();
    for query in known
        .into_iter()
        .chain(QUERIES.into_iter().filter(|q| Some(*q) != known))
    {
        let url = format!("http://{host_port}{}", query.path_and_query(path, engine));
        match fetch(client, &url, engine).await {
            Ok(metrics) => {
                if known != Some(query) {
                    if let Ok(mut working) = working.lock() {
                        working.insert(host_port.to_string(), query);
                    }
                }
                return Ok(metrics);
            }
            Err(e) => error = e,
        }
    }
    Err(error)
}

/// Fetches and extracts one endpoint's metrics.
async fn fetch(client: &HttpClient, url: &str, engine: &Engine) -> Result<Scraped, String> {
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {url}: {e}"))?;
    let request = Request::get(uri)
        .header("accept", "text/plain")
        .body(Empty::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
    if response.status() != StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the response failed: {e}"))?
        .to_bytes();
    let text = std::str::from_utf8(&body).map_err(|e| format!("response is not UTF-8: {e}"))?;
    let samples = prometheus::parse(text).map_err(|e| format!("invalid metrics: {e}"))?;
    Ok(Scraped {
        metrics: extract::metrics(engine, &samples)?,
        decode: extract::histogram_totals(&engine.inter_token_latency, &samples),
        output_tokens: extract::histogram_totals(&engine.request_output_tokens, &samples),
    })
}

/// `error: cause: cause…`, since hyper's top-level client errors say little on their own.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engines::Engines;

    #[test]
    fn queries_ask_for_the_engine_families() {
        let engines = Engines::default();
        let sglang = engines.get("sglang").unwrap();
        let filter = "name%5B%5D=sglang%3Acache_config_info\
                      &name%5B%5D=sglang%3Ainter_token_latency_seconds_count\
                      &name%5B%5D=sglang%3Ainter_token_latency_seconds_sum\
                      &name%5B%5D=sglang%3Anum_queue_reqs&name%5B%5D=sglang%3Anum_running_reqs\
                      &name%5B%5D=sglang%3Atime_per_output_token_seconds_count\
                      &name%5B%5D=sglang%3Atime_per_output_token_seconds_sum\
                      &name%5B%5D=sglang%3Atoken_usage";
        assert_eq!(
            Query::FilteredSlash.path_and_query("/metrics", sglang),
            format!("/metrics/?{filter}")
        );
        assert_eq!(
            Query::Filtered.path_and_query("/metrics", sglang),
            format!("/metrics?{filter}")
        );
        assert_eq!(Query::Plain.path_and_query("/metrics", sglang), "/metrics");
        assert_eq!(
            Query::FilteredSlash.path_and_query("/stats?format=prom", sglang),
            format!("/stats?format=prom&{filter}")
        );
    }
}
