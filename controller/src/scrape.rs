//! Metrics scraping: every refresh interval, `GET http://<address>:<port><path>` on every
//! endpoint concurrently over one shared keep-alive HTTP/1.1 client, then publish.
//!
//! A round starts a scrape for every endpoint that has none in flight and waits for them until
//! the next tick at most; a slow endpoint's result lands in a later round, so it never delays
//! the others. Each scrape is bounded by the scrape timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::MissedTickBehavior;
use wasm_epp::snapshot::Metrics;

use crate::log;
use crate::log::now_unix_ms;
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

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Scrapes rounds forever (until the task is dropped).
pub async fn run(store: Arc<Store>, settings: ScrapeSettings) {
    let client = client(&settings);
    let settings = Arc::new(settings);
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
    job: ScrapeJob,
) {
    let url = format!("http://{}{}", job.host_port, settings.path);
    let result = match tokio::time::timeout(settings.timeout, fetch(&client, &url)).await {
        Ok(result) => result,
        Err(_) => Err(format!("timed out after {:?}", settings.timeout)),
    };
    let failed = result.as_ref().err().cloned();
    if store.record_scrape(&job.key, result, now_unix_ms()) {
        match failed {
            Some(error) => log!("endpoint {} ({url}): scrape failed: {error}", job.key.name),
            None => log!("endpoint {} ({url}): scrape recovered", job.key.name),
        }
    }
}

/// Fetches and extracts one endpoint's metrics.
async fn fetch(client: &HttpClient, url: &str) -> Result<Metrics, String> {
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
    extract::vllm_metrics(&samples)
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
