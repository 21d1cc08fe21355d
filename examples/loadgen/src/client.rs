//! One HTTP request and what came of it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::openai::{completion_tokens, Api, StreamScan};
use crate::prompts::RequestPlan;

/// The most response body bytes read per request.
const MAX_BODY_BYTES: usize = 64 << 20;

/// Why a request got no complete response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The connection could not be made.
    Connect(String),
    /// No complete response within the per-request timeout.
    Timeout,
    /// The connection broke, or the response was malformed or too large.
    Transport(String),
}

/// A complete response.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// The value of the instance header, if present and text.
    pub instance: Option<String>,
    /// From sending the request to the end of the body.
    pub latency: Duration,
    /// From sending the request to the first chunk with content (streaming).
    pub ttft: Option<Duration>,
    /// `usage.completion_tokens`, when the response reported it.
    pub completion_tokens: Option<u64>,
}

/// What came of one request.
pub type Outcome = Result<Response, Failure>;

/// A keep-alive HTTP/1 client for one target (or several taken in turn), shared by all
/// requests.
#[derive(Debug)]
pub struct Target {
    client: Client<HttpConnector, Full<Bytes>>,
    urls: Vec<Uri>,
    api: Api,
    stream: bool,
    max_tokens: u32,
    instance_header: HeaderName,
    timeout: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Target {
    /// A client for `urls` (request `i` goes to `urls[i % len]`; at least one, all speaking
    /// the first one's API), pooling up to `connections` idle connections per host; every
    /// request carries `headers`.
    pub fn new(
        urls: Vec<Uri>,
        stream: bool,
        max_tokens: u32,
        instance_header: HeaderName,
        timeout: Duration,
        connections: usize,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build(connector);
        let api = urls
            .first()
            .map_or(Api::Completions, |u| Api::of_path(u.path()));
        Self {
            client,
            urls,
            api,
            stream,
            max_tokens,
            instance_header,
            timeout,
            headers,
        }
    }

    /// The `max_tokens` of a request whose plan sets none.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// The API the target speaks.
    pub fn api(&self) -> Api {
        self.api
    }

    /// Sends `plan` as request `index` and reads the whole response, within the timeout.
    pub async fn send(&self, plan: &RequestPlan, index: u32) -> Outcome {
        let url = self
            .urls
            .get(index as usize % self.urls.len().max(1))
            .cloned()
            .unwrap_or_default();
        let body = self
            .api
            .body(plan, self.max_tokens, self.stream)
            .to_string();
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(CONTENT_TYPE, "application/json");
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Failure::Transport(e.to_string()))?;
        let start = Instant::now();
        tokio::time::timeout(self.timeout, self.exchange(request, start))
            .await
            .unwrap_or(Err(Failure::Timeout))
    }

    async fn exchange(&self, request: Request<Full<Bytes>>, start: Instant) -> Outcome {
        let response = self.client.request(request).await.map_err(|e| {
            let message = error_chain(&e);
            if e.is_connect() {
                Failure::Connect(message)
            } else {
                Failure::Transport(message)
            }
        })?;
        let status = response.status().as_u16();
        let instance = response
            .headers()
            .get(&self.instance_header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = Limited::new(response.into_body(), MAX_BODY_BYTES);
        let mut scan = StreamScan::default();
        let mut whole = Vec::new();
        let mut ttft = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Failure::Transport(format!("reading the body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if self.stream {
                if scan.push(&data) {
                    ttft = Some(start.elapsed());
                }
            } else {
                whole.extend_from_slice(&data);
            }
        }
        let latency = start.elapsed();
        let completion_tokens = if self.stream {
            scan.finish()
        } else {
            serde_json::from_slice(&whole)
                .ok()
                .as_ref()
                .and_then(completion_tokens)
        };
        Ok(Response {
            status,
            instance,
            latency,
            ttft,
            completion_tokens,
        })
    }
}

/// An error and its causes, `: `-separated (hyper's own message is terse).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
