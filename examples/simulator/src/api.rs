//! The HTTP front: routing, request bodies and the headers on every response.

use std::convert::Infallible;
use std::error::Error;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::header::HeaderName;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::errors::ApiError;
use crate::metrics::{self, Exposition};
use crate::openai::{self, ChatRequest, CompletionRequest};
use crate::respond::{self, Body};
use crate::{completions, control};

/// Names the instance that answered; on every response.
pub const INSTANCE_HEADER: HeaderName = HeaderName::from_static("x-sim-instance");
/// The endpoint the gateway picked, as Envoy forwards it.
pub const DESTINATION_HEADER: HeaderName =
    HeaderName::from_static("x-gateway-destination-endpoint");
/// Echo of [`DESTINATION_HEADER`], when the request had one.
pub const RECEIVED_DESTINATION_HEADER: HeaderName =
    HeaderName::from_static("x-sim-received-destination");

/// The prefill endpoint a P/D gateway named (`x-prefiller-host-port`; a real decode server's
/// routing sidecar would run the prefill there).
pub const PREFILLER_HEADER: HeaderName = HeaderName::from_static("x-prefiller-host-port");
/// Echo of [`PREFILLER_HEADER`], when the request had one.
pub const RECEIVED_PREFILLER_HEADER: HeaderName =
    HeaderName::from_static("x-sim-received-prefiller");

/// Names (comma-separated, sorted) of the gateway control headers the request arrived with —
/// `x-llm-d-*` and `x-gateway-*` other than the destination — so tests can see what a gateway
/// forwarded. Absent when there were none.
pub const RECEIVED_CONTROL_HEADER: HeaderName = HeaderName::from_static("x-sim-received-control");

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 16 << 20;

/// Answers one request; never fails (errors become OpenAI error bodies).
pub async fn handle<B>(app: Arc<App>, request: Request<B>) -> Result<Response<Body>, Infallible>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let destination = request.headers().get(DESTINATION_HEADER).cloned();
    let prefiller = request.headers().get(PREFILLER_HEADER).cloned();
    let control = control_header_names(request.headers());
    let mut response = route(&app, request)
        .await
        .unwrap_or_else(ApiError::into_response);
    let headers = response.headers_mut();
    headers.insert(INSTANCE_HEADER, app.instance_header.clone());
    if let Some(destination) = destination {
        headers.insert(RECEIVED_DESTINATION_HEADER, destination);
    }
    if let Some(control) = control {
        headers.insert(RECEIVED_CONTROL_HEADER, control);
    }
    if let Some(prefiller) = prefiller {
        headers.insert(RECEIVED_PREFILLER_HEADER, prefiller);
    }
    Ok(response)
}

fn control_header_names(headers: &hyper::HeaderMap) -> Option<hyper::header::HeaderValue> {
    let mut names: Vec<&str> = headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| {
            (k.starts_with("x-llm-d-") || k.starts_with("x-gateway-")) && *k != DESTINATION_HEADER
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    (!names.is_empty())
        .then(|| hyper::header::HeaderValue::from_str(&names.join(",")).ok())
        .flatten()
}

async fn route<B>(app: &Arc<App>, request: Request<B>) -> Result<Response<Body>, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/v1/completions") => {
            let request: CompletionRequest = read_json(body).await?;
            completions::serve(app, request.into()).await
        }
        (&Method::POST, "/v1/chat/completions") => {
            let request: ChatRequest = read_json(body).await?;
            completions::serve(app, request.into()).await
        }
        (&Method::GET, "/v1/models") => {
            let list = openai::model_list(&app.model, &app.adapters, unix_now().trunc() as u64);
            Ok(respond::json(StatusCode::OK, &list))
        }
        (&Method::GET, "/health") => Ok(respond::text(StatusCode::OK, "text/plain", String::new())),
        (&Method::GET, "/metrics") => Ok(metrics_response(app)),
        (&Method::GET, "/get_load") => Ok(load_response(app)),
        (&Method::PUT, "/sim/metrics-override") => {
            control::set_override(app, read_json(body).await?)
        }
        (&Method::DELETE, "/sim/metrics-override") => Ok(control::clear_override(app)),
        (&Method::GET, "/sim/stats") => Ok(control::stats(app)),
        (method, path) => Err(ApiError::not_found(format!(
            "No route for {method} {path}."
        ))),
    }
}

fn metrics_response(app: &App) -> Response<Body> {
    let snapshot = app.engine.snapshot();
    let pinned = *app.metrics_override();
    let text = Exposition {
        names: app.metric_names,
        model: &app.model,
        config: app.engine.config(),
        lora_enabled: !app.adapters.is_empty(),
        snapshot: &snapshot,
        pinned: &pinned,
        now: unix_now(),
    }
    .render();
    respond::text(StatusCode::OK, metrics::CONTENT_TYPE, text)
}

/// SGLang's `GET /get_load`: one entry per data-parallel rank (the simulator has one) with
/// the requests it holds, those waiting and the KV tokens in use. The SGLang router polls it
/// (every 30 s) for `power_of_two`; serving it lets that peer see what a real SGLang gives it.
fn load_response(app: &App) -> Response<Body> {
    let snapshot = app.engine.snapshot();
    let config = app.engine.config();
    let capacity = config.num_gpu_blocks.saturating_mul(config.block_size) as f64;
    let load = serde_json::json!([{
        "dp_rank": 0,
        "num_reqs": snapshot.running + snapshot.waiting,
        "num_waiting_reqs": snapshot.waiting,
        "num_tokens": (snapshot.kv_cache_usage * capacity).round() as u64,
    }]);
    respond::json(StatusCode::OK, &load)
}

/// Reads and parses a JSON request body; any failure is a 400.
async fn read_json<T, B>(body: B) -> Result<T, ApiError>
where
    T: DeserializeOwned,
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let bytes = Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("Could not read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use http_body_util::Full;
    use serde_json::{json, Value};

    use super::*;
    use crate::cli::Cli;

    fn app() -> Arc<App> {
        let cli = Cli::parse_from([
            "vllm-sim",
            "--model",
            "base",
            "--lora-modules",
            "a",
            "--instance-name",
            "unit",
            "--ttft-base-ms",
            "0",
            "--itl-ms",
            "0",
        ]);
        App::new(&cli, "127.0.0.1:1".parse().unwrap()).unwrap()
    }

    async fn call(app: &Arc<App>, method: Method, path: &str, body: &str) -> (Response<()>, Bytes) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(DESTINATION_HEADER, "10.0.0.1:8000")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = handle(Arc::clone(app), request).await.unwrap();
        let (parts, body) = response.into_parts();
        (
            Response::from_parts(parts, ()),
            body.collect().await.unwrap().to_bytes(),
        )
    }

    async fn call_json(
        app: &Arc<App>,
        method: Method,
        path: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let (response, bytes) = call(app, method, path, body).await;
        (response.status(), serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn every_response_names_the_instance_and_echoes_the_destination() {
        let (response, _) = call(&app(), Method::GET, "/nope", "").await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[INSTANCE_HEADER], "unit");
        assert_eq!(
            response.headers()[RECEIVED_DESTINATION_HEADER],
            "10.0.0.1:8000"
        );
        assert!(response.headers().get(RECEIVED_CONTROL_HEADER).is_none());
    }

    #[test]
    fn control_headers_are_listed_by_name() {
        let mut headers = hyper::HeaderMap::new();
        for name in [
            "x-llm-d-inference-objective",
            "x-gateway-destination-endpoint-subset",
            "accept",
        ] {
            headers.insert(HeaderName::from_static(name), "v".parse().unwrap());
        }
        headers.insert(DESTINATION_HEADER, "10.0.0.1:1".parse().unwrap());
        assert_eq!(
            control_header_names(&headers).unwrap(),
            "x-gateway-destination-endpoint-subset,x-llm-d-inference-objective"
        );
    }

    #[tokio::test]
    async fn get_load_reports_an_idle_engine_in_sglang_form() {
        let (status, body) = call_json(&app(), Method::GET, "/get_load", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
        );
    }

    #[tokio::test]
    async fn bad_json_is_a_400() {
        let app = app();
        for body in [
            "{not json",
            r#"{"prompt": "x"}"#,
            r#"{"model": "base", "prompt": 5}"#,
        ] {
            let (status, error) = call_json(&app, Method::POST, "/v1/completions", body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error["error"]["type"], "BadRequestError");
            assert_eq!(error["error"]["code"], 400);
        }
        let zero = r#"{"model": "base", "prompt": "x", "max_tokens": 0}"#;
        assert_eq!(
            call_json(&app, Method::POST, "/v1/completions", zero)
                .await
                .0,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn unknown_model_is_a_404() {
        let body = r#"{"model": "other", "messages": [{"role": "user", "content": "hi"}]}"#;
        let (status, error) = call_json(&app(), Method::POST, "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            error,
            json!({"error": {"message": "The model `other` does not exist.", "type": "NotFoundError", "code": 404}})
        );
    }

    #[tokio::test]
    async fn an_adapter_can_be_used_as_model() {
        let body = r#"{"model": "a", "prompt": "hello", "max_tokens": 2}"#;
        let (status, response) = call_json(&app(), Method::POST, "/v1/completions", body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(response["model"], "a");
        assert_eq!(response["choices"][0]["finish_reason"], "length");
        assert_eq!(response["usage"]["prompt_tokens"], 2);
        assert_eq!(response["usage"]["completion_tokens"], 2);
    }

    #[tokio::test]
    async fn streamed_text_completion_ends_with_done() {
        let body = r#"{"model": "base", "prompt": "hello", "stream": true}"#;
        let (response, bytes) = call(&app(), Method::POST, "/v1/completions", body).await;
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        // Default length (16 tokens), no usage chunk unless asked, then [DONE].
        assert_eq!(events.len(), 17);
        assert_eq!(events[16], "data: [DONE]");
        let last: Value = serde_json::from_str(events[15].trim_start_matches("data: ")).unwrap();
        assert_eq!(last["object"], "text_completion");
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
    }

    #[tokio::test]
    async fn second_identical_prompt_reports_cached_tokens() {
        let app = app();
        let prompt = "x".repeat(400); // 100 tokens, 6 full blocks
        let body = json!({"model": "base", "prompt": prompt, "max_tokens": 1}).to_string();
        let (_, first) = call_json(&app, Method::POST, "/v1/completions", &body).await;
        let (_, second) = call_json(&app, Method::POST, "/v1/completions", &body).await;
        assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            second["usage"]["prompt_tokens_details"]["cached_tokens"],
            96
        );
        let (_, stats) = call_json(&app, Method::GET, "/sim/stats", "").await;
        assert_eq!(stats["requests_total"], 2);
        assert_eq!(stats["cached_prompt_tokens_total"], 96);
        assert_eq!(stats["prompt_tokens_total"], 200);
        assert_eq!(stats["completion_tokens_total"], 2);
    }

    #[tokio::test]
    async fn metrics_override_round_trip() {
        let app = app();
        let (status, _) = call_json(
            &app,
            Method::PUT,
            "/sim/metrics-override",
            r#"{"running": 7}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (response, text) = call(&app, Method::GET, "/metrics", "").await;
        assert_eq!(response.headers()["content-type"], metrics::CONTENT_TYPE);
        let text = String::from_utf8(text.to_vec()).unwrap();
        assert!(text.contains("vllm:num_requests_running{model_name=\"base\"} 7\n"));
        assert!(text.contains("vllm:lora_requests_info{max_lora=\"2\""));
        let bad = r#"{"kv_cache_usage": -1}"#;
        assert_eq!(
            call_json(&app, Method::PUT, "/sim/metrics-override", bad)
                .await
                .0,
            StatusCode::BAD_REQUEST
        );
        call(&app, Method::DELETE, "/sim/metrics-override", "").await;
        let (_, text) = call(&app, Method::GET, "/metrics", "").await;
        assert!(String::from_utf8(text.to_vec())
            .unwrap()
            .contains("vllm:num_requests_running{model_name=\"base\"} 0\n"));
    }

    #[tokio::test]
    async fn models_lists_base_then_adapters() {
        let (_, list) = call_json(&app(), Method::GET, "/v1/models", "").await;
        let ids: Vec<&str> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, ["base", "a"]);
    }
}
