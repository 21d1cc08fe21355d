//! The snapshot API (`--listen`), long-polled by the Wasm poller inside Envoy.
//!
//! - `GET /v1/snapshot` → 200, the current snapshot as JSON.
//! - `GET /v1/snapshot?since=V&wait_ms=W` → 200 at once if the current version is greater than
//!   `V`; otherwise the request is held up to `min(W, --long-poll-max)` and answered 200 as soon
//!   as a newer snapshot is published, or 304 with an empty body at the deadline. Without
//!   `wait_ms` there is no wait.
//!
//! Every answer carries `x-snapshot-version` (on a 304, the current version).
//!
//! The same listener serves EDS for Envoy's REST-JSON xDS: `POST /v3/discovery:endpoints`
//! (see [`crate::eds`]).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Body;
use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::{Method, Request, StatusCode, Uri};
use tokio::net::TcpListener;

use crate::eds;
use crate::http::{self, Reply};
use crate::store::{Counters, Published, Store, Wait};

/// The response header carrying the snapshot version.
pub const VERSION_HEADER: &str = "x-snapshot-version";

/// Serves the snapshot API and EDS on `listener` forever.
pub async fn run(listener: TcpListener, store: Arc<Store>, long_poll_max: Duration) {
    http::serve(listener, "snapshot API", move |request| {
        let store = store.clone();
        async move { route(&store, long_poll_max, request).await }
    })
    .await
}

/// Answers one request: `POST /v3/discovery:endpoints` → EDS, `GET` → [`handle`], anything
/// else → 405.
pub async fn route<B>(store: &Store, long_poll_max: Duration, request: Request<B>) -> Reply
where
    B: Body,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let is_eds = request.uri().path() == eds::PATH;
    match *request.method() {
        Method::POST if is_eds => {
            let body = match Limited::new(request.into_body(), eds::MAX_REQUEST_BYTES)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(e) => {
                    let status = if e.downcast_ref::<LengthLimitError>().is_some() {
                        StatusCode::PAYLOAD_TOO_LARGE
                    } else {
                        StatusCode::BAD_REQUEST
                    };
                    return http::reply(
                        status,
                        http::TEXT,
                        format!("cannot read the request body: {e}\n"),
                    );
                }
            };
            eds::reply(&store.current().snapshot, &body)
        }
        _ if is_eds => http::method_not_allowed("POST"),
        Method::GET => handle(store, long_poll_max, request.uri()).await,
        _ => http::method_not_allowed("GET"),
    }
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
    let wait = Duration::from_millis(wait_ms).min(long_poll_max);
    match store.wait_newer(since, wait).await {
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

fn snapshot_reply(published: &Published) -> Reply {
    with_version(
        http::reply(StatusCode::OK, http::JSON, published.json.clone()),
        published,
    )
}

fn with_version(mut reply: Reply, published: &Published) -> Reply {
    let headers = reply.headers_mut();
    headers.insert(VERSION_HEADER, HeaderValue::from(published.version()));
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
        let reply = route(store, Duration::from_secs(1), request).await;
        let status = reply.status();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
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
