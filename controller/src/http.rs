//! Small HTTP/1.1 server helpers shared by the snapshot API and the admin server.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

/// The response type both servers produce.
pub type Reply = Response<Full<Bytes>>;

/// Plain-text content type.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// JSON content type.
pub const JSON: &str = "application/json";
/// Prometheus text exposition content type.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A response with `status`, `content_type` and `body`.
pub fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A bodiless response (e.g. 304).
pub fn empty(status: StatusCode) -> Reply {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// 404 with a short text body.
pub fn not_found() -> Reply {
    reply(StatusCode::NOT_FOUND, TEXT, "not found\n")
}

/// The value of `key` in a query string (`a=1&b=2`); no percent-decoding, since every
/// parameter the servers read is numeric.
pub fn query_value<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(name, _)| *name == key)
        .map(|(_, value)| value)
}

/// Reads `key` from a query string as an unsigned integer; `Err` names the parameter.
pub fn query_u64(query: Option<&str>, key: &str) -> Result<Option<u64>, String> {
    query_value(query, key)
        .map(|value| {
            value.parse::<u64>().map_err(|_| {
                format!("query parameter {key}: {value:?} is not a non-negative integer")
            })
        })
        .transpose()
}

/// 405 for a request whose method `path` does not take.
pub fn method_not_allowed(allowed: &str) -> Reply {
    reply(
        StatusCode::METHOD_NOT_ALLOWED,
        TEXT,
        format!("only {allowed} is supported\n"),
    )
}

/// Serves HTTP/1.1 on `listener` forever: every connection gets its own task and every request
/// goes to `handler`.
pub async fn serve<H, F>(listener: TcpListener, name: &'static str, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Typically out of file descriptors; back off instead of spinning.
                warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(request).await) }
            });
            // Connection errors (client went away mid-request) concern only that client.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_query_values() {
        let query = Some("since=12&wait_ms=500&flag");
        assert_eq!(query_value(query, "since"), Some("12"));
        assert_eq!(query_value(query, "flag"), Some(""));
        assert_eq!(query_value(query, "other"), None);
        assert_eq!(query_value(None, "since"), None);
        assert_eq!(query_u64(query, "wait_ms"), Ok(Some(500)));
        assert_eq!(query_u64(query, "other"), Ok(None));
        assert!(query_u64(Some("since=-1"), "since")
            .unwrap_err()
            .contains("since"));
        assert!(query_u64(Some("since=abc"), "since").is_err());
    }
}
