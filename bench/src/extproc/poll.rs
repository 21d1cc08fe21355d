//! Following the controller's snapshot API the way the filter's poller does: long-poll
//! `GET /v1/snapshot?since=<version>&instance=<id>&wait_ms=<hold>`; 200 publishes the
//! snapshot when it replaces the one in use ([`SnapshotId::replaces`]), 304
//! polls again, anything else waits [`RETRY_AFTER`] and retries. Each call is bounded by the
//! hold plus [`CALL_MARGIN`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use wasm_epp::snapshot::{Snapshot, SnapshotId};

use super::picking::PickState;

/// How long the controller may hold a poll (the filter's default).
pub const LONG_POLL: Duration = Duration::from_secs(25);
/// Extra time a call may take beyond the hold.
const CALL_MARGIN: Duration = Duration::from_secs(5);
/// Pause after a failed poll.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// Largest snapshot read.
const MAX_SNAPSHOT_BYTES: usize = 64 << 20;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The controller's base URL, checked: `http://host:port` with no path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerUrl(String);

impl std::str::FromStr for ControllerUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<ControllerUrl, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("invalid controller URL {text:?}: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "invalid controller URL {text:?}: expected http://host:port"
            ));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "invalid controller URL {text:?}: no path or query expected"
            ));
        }
        Ok(ControllerUrl(text.trim_end_matches('/').to_string()))
    }
}

impl ControllerUrl {
    /// The long-poll URL for a consumer holding `held`.
    pub fn poll_url(&self, held: Option<&SnapshotId>, hold: Duration) -> String {
        let (since, instance) = held.map_or((0, ""), |id| (id.version, id.instance.as_str()));
        format!(
            "{}/v1/snapshot?since={since}&instance={instance}&wait_ms={}",
            self.0,
            hold.as_millis()
        )
    }
}

/// What one poll brought.
#[derive(Debug)]
enum Polled {
    Snapshot(Box<Snapshot>),
    NotModified,
}

/// Polls forever (until the task is dropped), publishing every newer snapshot to `state`.
pub async fn run(controller: ControllerUrl, state: Arc<PickState>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CALL_MARGIN));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut failing = false;
    loop {
        let asked = state.snapshot_id();
        let url = controller.poll_url(asked.as_ref(), LONG_POLL);
        let result = match tokio::time::timeout(LONG_POLL + CALL_MARGIN, poll(&client, &url)).await
        {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", LONG_POLL + CALL_MARGIN)),
        };
        match result {
            Ok(Polled::Snapshot(snapshot)) => {
                let endpoints = snapshot.endpoints.len();
                let before = state.endpoint_count();
                // Logged when the pool size changes, not on every metrics refresh.
                if state.publish(*snapshot, asked.as_ref()) && before != Some(endpoints) {
                    eprintln!("wasm-epp-extproc: snapshot with {endpoints} endpoints");
                }
                failing = false;
            }
            Ok(Polled::NotModified) => failing = false,
            Err(e) => {
                if !failing {
                    eprintln!("wasm-epp-extproc: snapshot poll failed (retrying): {e}");
                }
                failing = true;
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

async fn poll(client: &HttpClient, url: &str) -> Result<Polled, String> {
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {url}: {e}"))?;
    let request = Request::get(uri)
        .body(Empty::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    match response.status() {
        StatusCode::OK => {}
        StatusCode::NOT_MODIFIED => return Ok(Polled::NotModified),
        other => return Err(format!("GET {url}: HTTP {other}")),
    }
    let body = Limited::new(response.into_body(), MAX_SNAPSHOT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("GET {url}: reading the body: {e}"))?
        .to_bytes();
    Snapshot::from_json(&body).map(|s| Polled::Snapshot(Box::new(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_urls_are_checked_and_build_long_poll_urls() {
        let url: ControllerUrl = "http://127.0.0.1:9002/".parse().unwrap();
        let held = SnapshotId {
            instance: "c0ffee".into(),
            version: 7,
        };
        assert_eq!(
            url.poll_url(Some(&held), Duration::from_secs(25)),
            "http://127.0.0.1:9002/v1/snapshot?since=7&instance=c0ffee&wait_ms=25000"
        );
        assert_eq!(
            url.poll_url(None, Duration::from_secs(1)),
            "http://127.0.0.1:9002/v1/snapshot?since=0&instance=&wait_ms=1000"
        );
        for bad in [
            "127.0.0.1:9002",
            "https://127.0.0.1:9002",
            "http://127.0.0.1:9002/v1",
            "http://h:1?x=1",
            "",
        ] {
            assert!(bad.parse::<ControllerUrl>().is_err(), "{bad}");
        }
    }
}
