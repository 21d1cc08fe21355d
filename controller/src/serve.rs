//! The snapshot API (`--listen`), long-polled by the Wasm poller inside Envoy.
//!
//! - `GET /v1/snapshot` → 200, the current snapshot as JSON.
//! - `GET /v1/snapshot?since=V&instance=I&wait_ms=W` → 200 at once unless the poller holds
//!   exactly the current snapshot (version `V` of this controller instance `I`); otherwise the
//!   request is held up to `min(W, --long-poll-max)` and answered 200 as soon as a new snapshot
//!   is published, or 304 with an empty body at the deadline. A poller holding another
//!   instance's snapshot, or a version this instance never served, gets the current one at
//!   once. Without `instance`, 200 means a version greater than `V` (pollers from before
//!   instances existed). Without `wait_ms` there is no wait.
//!
//! Every answer carries `x-snapshot-version` and `x-snapshot-instance` (on a 304, the
//! current ones).
//!
//! The same listener serves the prefix-record exchange between Envoy replicas
//! (`/v1/prefix-records`, see [`crate::records`]), EDS for Envoy's REST-JSON xDS: `POST /v3/discovery:endpoints`
//! (see [`crate::eds`]), and, with `--wasm-file`, the filter module itself for Envoy Gateway's
//! remote Wasm fetch: `GET /wasm-epp.wasm` and its SHA-256, `GET /wasm-epp.wasm.sha256`.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Body;
use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::{Method, Request, StatusCode, Uri};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tracing::warn;

use crate::eds;
use crate::http::{self, Reply};
use crate::records::{self, RecordLog, Refusal};
use crate::store::{Counters, Held, Published, Store, Wait};

/// The response header carrying the snapshot version.
pub const VERSION_HEADER: &str = "x-snapshot-version";

/// The response header carrying the controller instance id (also on record answers).
pub const INSTANCE_HEADER: &str = "x-snapshot-instance";

/// Where the filter module is served.
pub const WASM_PATH: &str = "/wasm-epp.wasm";

/// Where the module's SHA-256 (lowercase hex and a newline) is served.
pub const WASM_SHA256_PATH: &str = "/wasm-epp.wasm.sha256";

/// The `--wasm-file` module, read once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WasmModule {
    /// The module's bytes.
    pub bytes: Bytes,
    /// Their SHA-256, lowercase hex.
    pub sha256: String,
}

impl WasmModule {
    /// Reads the module at `path`; it must start with the WebAssembly magic number.
    pub fn load(path: &Path) -> Result<WasmModule, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
        WasmModule::new(bytes)
    }

    /// Checks `bytes` and computes their digest.
    pub fn new(bytes: Vec<u8>) -> Result<WasmModule, String> {
        if !bytes.starts_with(b"\0asm") {
            return Err("not a WebAssembly module (it does not start with \"\\0asm\")".to_string());
        }
        let sha256 =
            Sha256::digest(&bytes)
                .iter()
                .fold(String::with_capacity(64), |mut hex, byte| {
                    let _ = write!(hex, "{byte:02x}");
                    hex
                });
        Ok(WasmModule {
            bytes: Bytes::from(bytes),
            sha256,
        })
    }
}

/// Serves the snapshot API, EDS and the module (if any) on `listener` forever.
pub async fn run(
    listener: TcpListener,
    store: Arc<Store>,
    records: Arc<RecordLog>,
    long_poll_max: Duration,
    wasm: Option<WasmModule>,
) {
    let wasm = wasm.map(Arc::new);
    http::serve(listener, "snapshot API", move |request| {
        let store = store.clone();
        let records = records.clone();
        let wasm = wasm.clone();
        async move { route(&store, &records, long_poll_max, wasm.as_deref(), request).await }
    })
    .await
}

/// Answers one request: `POST /v3/discovery:endpoints` → EDS, `/v1/prefix-records` → the
/// record exchange, `GET` of a module path with a module → the module or its digest, other
/// `GET`s → [`handle`], anything else → 405.
pub async fn route<B>(
    store: &Store,
    records: &RecordLog,
    long_poll_max: Duration,
    wasm: Option<&WasmModule>,
    request: Request<B>,
) -> Reply
where
    B: Body,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let path = request.uri().path();
    let is_eds = path == eds::PATH;
    let is_records = path == records::PATH;
    match *request.method() {
        Method::POST if is_eds => {
            let body = match read_body(request, eds::MAX_REQUEST_BYTES).await {
                Ok(body) => body,
                Err(reply) => return reply,
            };
            eds::reply(&store.current().snapshot, &body)
        }
        _ if is_eds => http::method_not_allowed("POST"),
        Method::POST if is_records => {
            let query = request.uri().query();
            let replica = http::query_value(query, "replica")
                .unwrap_or_default()
                .to_string();
            let relayed_from = http::query_value(query, "relay").map(str::to_string);
            let body = match read_body(request, records::MAX_BATCH_BYTES).await {
                Ok(body) => Ok(body),
                Err(reply) if reply.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    let over = records::MAX_BATCH_BYTES + 1;
                    Err(records.refuse(&replica, Refusal::TooLarge(over), Instant::now()))
                }
                Err(reply) => return reply,
            };
            upload(records, &replica, relayed_from.as_deref(), body)
        }
        Method::GET if is_records => download(records, long_poll_max, request.uri()).await,
        _ if is_records => http::method_not_allowed("GET or POST"),
        Method::GET => match (request.uri().path(), wasm) {
            (WASM_PATH, Some(module)) => http::reply(StatusCode::OK, WASM, module.bytes.clone()),
            (WASM_SHA256_PATH, Some(module)) => {
                http::reply(StatusCode::OK, http::TEXT, format!("{}\n", module.sha256))
            }
            _ => handle(store, long_poll_max, request.uri()).await,
        },
        _ => http::method_not_allowed("GET"),
    }
}

/// The request's body up to `limit` bytes; 413 beyond it, 400 if it cannot be read.
async fn read_body<B>(request: Request<B>, limit: usize) -> Result<Bytes, Reply>
where
    B: Body,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => {
            let status = if e.downcast_ref::<LengthLimitError>().is_some() {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            Err(http::reply(
                status,
                http::TEXT,
                format!("cannot read the request body: {e}\n"),
            ))
        }
    }
}

/// Takes one replica's batch of prefix records: 204, or the refusal's status with its reason
/// (logged with the replica's id, at most once per replica per [`records::LOG_EVERY`]).
fn upload(
    record_log: &RecordLog,
    replica: &str,
    relayed_from: Option<&str>,
    body: Result<Bytes, (Refusal, Option<u64>)>,
) -> Reply {
    match body.and_then(|body| record_log.append(replica, body, relayed_from, Instant::now())) {
        Ok(_) => http::empty(StatusCode::NO_CONTENT),
        Err((refusal, logged)) => {
            if let Some(count) = logged {
                warn!(
                    replica,
                    batches = count,
                    reason = %refusal,
                    "prefix records: refused {count} batch(es) from replica {replica:?}: {refusal}"
                );
            }
            let status = match refusal {
                Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                Refusal::RateLimited => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::BAD_REQUEST,
            };
            http::reply(status, http::TEXT, format!("{refusal}\n"))
        }
    }
}

/// Answers one replica's (long-)poll for the others' records.
async fn download(record_log: &RecordLog, long_poll_max: Duration, uri: &Uri) -> Reply {
    let query = uri.query();
    let (since, wait_ms) = match (
        http::query_u64(query, "since"),
        http::query_u64(query, "wait_ms"),
    ) {
        (Ok(since), Ok(wait_ms)) => (since.unwrap_or(0), wait_ms.unwrap_or(0)),
        (Err(e), _) | (_, Err(e)) => {
            return http::reply(StatusCode::BAD_REQUEST, http::TEXT, format!("{e}\n"))
        }
    };
    let replica = http::query_value(query, "replica").unwrap_or_default();
    // A replica behind a Service reaches either controller replica: it sends the cursor it
    // holds for each (`cursors=<instance>:<cursor>,…`), and this one takes its own.
    let own = record_log.instance();
    let (since, instance) =
        match http::query_value(query, "cursors").and_then(|list| records::cursor_of(list, own)) {
            Some(cursor) => (cursor, Some(own)),
            None => (since, http::query_value(query, "instance")),
        };
    let wait = Duration::from_millis(wait_ms).min(long_poll_max);
    let shares = match http::query_value(query, "share") {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    };
    let answer = record_log
        .wait_since(replica, since, instance, shares, wait)
        .await;
    let mut reply = if answer.body.is_empty() {
        http::empty(StatusCode::NOT_MODIFIED)
    } else {
        http::reply(StatusCode::OK, BINARY, answer.body)
    };
    let headers = reply.headers_mut();
    headers.insert(records::CURSOR_HEADER, HeaderValue::from(answer.cursor));
    headers.insert(
        records::SHARE_HEADER,
        HeaderValue::from_static(if answer.share { "1" } else { "0" }),
    );
    if let Ok(instance) = HeaderValue::from_str(record_log.instance()) {
        headers.insert(INSTANCE_HEADER, instance);
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    reply
}

/// Answers one GET request for `uri`.
pub async fn handle(store: &Store, long_poll_max: Duration, uri: &Uri) -> Reply {
    if uri.path() != "/v1/snapshot" {
        return http::not_found();
    }
    let query = uri.query();
    let (since, wait_ms) = match (
        http::query_u64(query, "since"),
        http::query_u64(query, "wait_ms"),
    ) {
        (Ok(since), Ok(wait_ms)) => (since, wait_ms.unwrap_or(0)),
        (Err(e), _) | (_, Err(e)) => {
            return http::reply(StatusCode::BAD_REQUEST, http::TEXT, format!("{e}\n"))
        }
    };
    let counters = store.counters();
    let Some(since) = since else {
        Counters::bump(&counters.snapshot_immediate);
        return snapshot_reply(&store.current());
    };
    let held = Held {
        version: since,
        instance: http::query_value(query, "instance").map(str::to_string),
    };
    let wait = Duration::from_millis(wait_ms).min(long_poll_max);
    match store.wait_newer(&held, wait).await {
        Wait::Immediate(published) => {
            Counters::bump(&counters.snapshot_immediate);
            snapshot_reply(&published)
        }
        Wait::Changed(published) => {
            Counters::bump(&counters.snapshot_long_poll);
            snapshot_reply(&published)
        }
        Wait::TimedOut(published) => {
            Counters::bump(&counters.snapshot_not_modified);
            with_version(http::empty(StatusCode::NOT_MODIFIED), &published)
        }
    }
}

/// Content type of the module.
const WASM: &str = "application/wasm";
/// Content type of record batches.
const BINARY: &str = "application/octet-stream";

fn snapshot_reply(published: &Published) -> Reply {
    with_version(
        http::reply(StatusCode::OK, http::JSON, published.json.clone()),
        published,
    )
}

fn with_version(mut reply: Reply, published: &Published) -> Reply {
    let headers = reply.headers_mut();
    headers.insert(VERSION_HEADER, HeaderValue::from(published.version()));
    if let Ok(instance) = HeaderValue::from_str(&published.snapshot.instance) {
        headers.insert(INSTANCE_HEADER, instance);
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::time::Instant;
    use wasm_epp::scheduler::profile::Profile;
    use wasm_epp::snapshot::{Endpoint, Snapshot};

    fn store() -> Store {
        Store::new(
            Profile::default(),
            vec![Endpoint {
                name: "a".into(),
                address: "10.0.0.1".into(),
                port: 8000,
                ready: true,
                key_cache: Default::default(),
                labels: Default::default(),
                metrics: Default::default(),
            }],
        )
    }

    async fn get(store: &Store, max: Duration, uri: &str) -> (StatusCode, Option<u64>, Vec<u8>) {
        let reply = handle(store, max, &uri.parse().unwrap()).await;
        let version = reply
            .headers()
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let status = reply.status();
        let body = reply
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, version, body)
    }

    #[tokio::test]
    async fn serves_the_current_snapshot_with_its_version() {
        let store = store();
        let (status, version, body) = get(&store, Duration::from_secs(1), "/v1/snapshot").await;
        assert_eq!(status, StatusCode::OK);
        let snapshot = Snapshot::from_json(&body).unwrap();
        assert_eq!(version, Some(snapshot.version));
        assert_eq!(snapshot.version, store.current().version());
        assert_eq!(snapshot.endpoints[0].name, "a");
        let counters = store.counters();
        assert_eq!(Counters::get(&counters.snapshot_immediate), 1);
    }

    #[tokio::test]
    async fn since_without_wait_answers_at_once() {
        let store = store();
        let current = store.current().version();
        let (status, version, body) = get(
            &store,
            Duration::from_secs(1),
            &format!("/v1/snapshot?since={current}"),
        )
        .await;
        assert_eq!((status, version), (StatusCode::NOT_MODIFIED, Some(current)));
        assert!(body.is_empty());
        let (status, _, _) = get(
            &store,
            Duration::from_secs(1),
            &format!("/v1/snapshot?since={}", current - 1),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_poller_holding_another_instance_or_an_absurd_version_is_answered_at_once() {
        let store = store();
        let current = store.current();
        let (version, instance) = (current.version(), &current.snapshot.instance);
        let wait = Duration::from_secs(10);
        let ours = format!("/v1/snapshot?since={version}&instance={instance}&wait_ms=50");
        assert_eq!(get(&store, wait, &ours).await.0, StatusCode::NOT_MODIFIED);
        for path in [
            format!("/v1/snapshot?since={version}&instance=restarted&wait_ms=10000"),
            format!(
                "/v1/snapshot?since={}&instance={instance}&wait_ms=10000",
                u64::MAX
            ),
        ] {
            let started = Instant::now();
            let (status, answered, body) = get(&store, wait, &path).await;
            assert_eq!(
                (status, answered),
                (StatusCode::OK, Some(version)),
                "{path}"
            );
            assert_eq!(Snapshot::from_json(&body).unwrap().instance, *instance);
            assert!(started.elapsed() < Duration::from_secs(5), "{path}");
        }
    }

    #[tokio::test]
    async fn the_wait_is_capped_by_the_long_poll_maximum() {
        let store = store();
        let current = store.current().version();
        let started = Instant::now();
        let (status, _, _) = get(
            &store,
            Duration::from_millis(100),
            &format!("/v1/snapshot?since={current}&wait_ms=60000"),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(Counters::get(&store.counters().snapshot_not_modified), 1);
    }

    async fn send(store: &Store, method: Method, path: &str, body: &str) -> (StatusCode, Vec<u8>) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap();
        let records = RecordLog::new("test", None);
        let reply = route(store, &records, Duration::from_secs(1), None, request).await;
        let status = reply.status();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
    }

    /// Sends `body` with `method` to `path` through [`route`] with the record log `records`;
    /// the status, the record headers (cursor, share) and the body.
    async fn exchange(
        records: &RecordLog,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Option<String>, Option<String>, Vec<u8>) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let reply = route(&store(), records, Duration::from_secs(1), None, request).await;
        let header = |name| {
            reply
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (cursor, share) = (
            header(records::CURSOR_HEADER),
            header(records::SHARE_HEADER),
        );
        let status = reply.status();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        (status, cursor, share, body.to_vec())
    }

    #[tokio::test]
    async fn prefix_records_go_from_one_replica_to_the_others() {
        let records = RecordLog::new("ctl", None);
        let batch: Vec<u8> = [5u64, 1_000, 1, 42]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let path = |query: &str| format!("{}?{query}", records::PATH);
        let (status, _, _, _) =
            exchange(&records, Method::POST, &path("replica=a"), batch.clone()).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, cursor, share, body) = exchange(
            &records,
            Method::GET,
            &path("replica=b&since=0&instance=ctl&wait_ms=10"),
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, batch);
        assert_eq!(cursor.as_deref(), Some("1"));
        assert_eq!(share.as_deref(), Some("1"), "a and b are both live");
        let (status, _, _, body) = exchange(
            &records,
            Method::GET,
            &path("replica=a&since=0&instance=ctl&wait_ms=10"),
            vec![],
        )
        .await;
        assert_eq!(
            status,
            StatusCode::NOT_MODIFIED,
            "a's own batch is not sent back"
        );
        assert!(body.is_empty());
        // A cursor list: this controller takes its own cursor (b has seen batch 1 here).
        let (status, ..) = exchange(
            &records,
            Method::GET,
            &path("replica=b&cursors=elsewhere:0,ctl:1&share=1&wait_ms=10"),
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        let (status, _, _, body) = exchange(
            &records,
            Method::GET,
            &path("replica=b&cursors=elsewhere:7&share=1&wait_ms=10"),
            vec![],
        )
        .await;
        assert_eq!(
            (status, body),
            (StatusCode::OK, batch.clone()),
            "no cursor here: all"
        );
        for (query, body, expected) in [
            ("replica=a", b"garbage".to_vec(), StatusCode::BAD_REQUEST),
            ("replica=", batch.clone(), StatusCode::BAD_REQUEST),
            (
                "replica=a",
                vec![0; records::MAX_BATCH_BYTES + 8],
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
        ] {
            let (status, _, _, text) = exchange(&records, Method::POST, &path(query), body).await;
            assert_eq!(status, expected, "{query}");
            assert!(!text.is_empty(), "a refusal says why");
        }
        let (status, ..) = exchange(&records, Method::PUT, &path("replica=a"), vec![]).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, ..) = exchange(&records, Method::GET, &path("since=x"), vec![]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn the_listener_routes_eds_posts_and_snapshot_gets() {
        let store = store();
        let (status, body) = send(
            &store,
            Method::POST,
            eds::PATH,
            r#"{"resource_names": ["inference_pool"], "node": {"id": "n"}}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let response: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let address = &response["resources"][0]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["socket_address"];
        assert_eq!(address["address"], "10.0.0.1");
        assert_eq!(address["port_value"], 8000);
        let (status, body) = send(&store, Method::GET, "/v1/snapshot", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(Snapshot::from_json(&body).unwrap().endpoints.len(), 1);

        let (status, _) = send(&store, Method::GET, eds::PATH, "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, _) = send(&store, Method::POST, "/v1/snapshot", "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, _) = send(&store, Method::POST, eds::PATH, "{oops").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let huge = " ".repeat(eds::MAX_REQUEST_BYTES + 1);
        let (status, _) = send(&store, Method::POST, eds::PATH, &huge).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    async fn get_with(
        store: &Store,
        wasm: Option<&WasmModule>,
        path: &str,
    ) -> (StatusCode, String, Vec<u8>) {
        let request = Request::builder()
            .uri(path)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let records = RecordLog::new("test", None);
        let reply = route(store, &records, Duration::from_secs(1), wasm, request).await;
        let status = reply.status();
        let content_type = reply
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        (status, content_type, body.to_vec())
    }

    #[tokio::test]
    async fn serves_the_module_and_its_digest_only_when_configured() {
        let store = store();
        let module = WasmModule::new(b"\0asm\x01\0\0\0".to_vec()).unwrap();
        // sha256 of those 8 bytes (`printf '\0asm\1\0\0\0' | sha256sum`).
        assert_eq!(
            module.sha256,
            "93a44bbb96c751218e4c00d479e4c14358122a389acca16205b1e4d0dc5f9476"
        );
        let (status, content_type, body) = get_with(&store, Some(&module), WASM_PATH).await;
        assert_eq!(
            (status, content_type.as_str()),
            (StatusCode::OK, "application/wasm")
        );
        assert_eq!(body, module.bytes.to_vec());
        let (status, _, body) = get_with(&store, Some(&module), WASM_SHA256_PATH).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            format!("{}\n", module.sha256)
        );
        let (status, _, _) = get_with(&store, Some(&module), "/v1/snapshot").await;
        assert_eq!(status, StatusCode::OK, "the snapshot is still served");
        for path in [WASM_PATH, WASM_SHA256_PATH] {
            let (status, _, _) = get_with(&store, None, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path} without a module");
        }
    }

    #[test]
    fn a_file_that_is_not_wasm_is_refused() {
        let err = WasmModule::new(b"#!/bin/sh\n".to_vec()).unwrap_err();
        assert!(err.contains("not a WebAssembly module"), "{err}");
        assert!(WasmModule::load(Path::new("/nonexistent/wasm-epp.wasm"))
            .unwrap_err()
            .starts_with("cannot read:"));
    }

    #[tokio::test]
    async fn bad_queries_and_paths_are_rejected() {
        let store = store();
        let max = Duration::from_secs(1);
        let (status, _, body) = get(&store, max, "/v1/snapshot?since=x").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).contains("since"));
        let (status, _, _) = get(&store, max, "/v1/snapshot?since=1&wait_ms=-5").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _, _) = get(&store, max, "/v2/snapshot").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}
