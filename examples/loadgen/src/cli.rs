//! Command-line flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Uri;

use crate::prompts::LengthDist;

/// A bounded load generator for OpenAI-compatible LLM endpoints: sends a
/// fixed number of completion (or chat) requests and reports where they went
/// and how long they took.
#[derive(Clone, Debug, Parser)]
#[command(name = "wasm-epp-loadgen", version)]
pub struct Cli {
    /// Target URL (http only); a path ending in `chat/completions` sends chat
    /// requests, any other path sends completions. Repeat it to spread the requests
    /// round-robin over several targets (e.g. Envoy replicas), all on the same path.
    #[arg(long, value_parser = http_uri, required = true)]
    pub url: Vec<Uri>,

    /// Model named in every request (unless --lora is given).
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,

    /// Total number of requests to send (a hard bound).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub requests: u32,

    /// Requests in flight at once (closed loop); with --rate, the most
    /// requests outstanding.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// Open-loop pacing: start requests at this many per second.
    #[arg(long, value_parser = positive)]
    pub rate: Option<f64>,

    /// `max_tokens` asked of every request.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,

    /// Bytes of each request's own prompt text (the unique suffix when
    /// --shared-prefix-groups is set).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_bytes: u32,

    /// Length of each request's own prompt text and output: `fixed` (--prompt-bytes,
    /// --max-tokens) or `sharegpt` (heavy-tailed, with those as medians).
    #[arg(long, value_enum, default_value_t = LengthDist::Fixed)]
    pub length_dist: LengthDist,

    /// Number of shared prompt prefixes; each request picks one at random and
    /// appends its own text. 0 makes every prompt unique.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_groups: u32,

    /// Bytes of each shared prefix (with --shared-prefix-groups).
    #[arg(long, default_value_t = 2048)]
    pub prefix_bytes: u32,

    /// Stream responses (SSE) and measure the time to first token.
    #[arg(long)]
    pub stream: bool,

    /// Comma-separated LoRA adapter names; each request names one at random
    /// as its model instead of --model.
    #[arg(long, value_delimiter = ',', value_parser = non_empty)]
    pub lora: Vec<String>,

    /// Per-request timeout in seconds, covering the whole response.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    pub timeout: f64,

    /// Name printed with the report and stored in the JSON.
    #[arg(long)]
    pub label: Option<String>,

    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Also write one JSON line per request to this file: when it was sent, its prompt
    /// bytes and max_tokens, the instance that answered, its status, TTFT and latency.
    #[arg(long)]
    pub trace: Option<PathBuf>,

    /// Response header naming the server instance that answered.
    #[arg(long, default_value = "x-sim-instance")]
    pub instance_header: HeaderName,

    /// Seed for prompts, prefix groups and adapter choice (repeatable runs).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Number this run's requests from N: with the seed of an earlier run that sent N
    /// requests, the new run keeps its prefix groups but repeats none of its prompts.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub first_index: u32,

    /// An extra request header, `name: value` (repeatable), e.g. an InferenceObjective
    /// `x-llm-d-inference-objective: critical`.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Cli {
    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout)
    }
}

fn http_uri(value: &str) -> Result<Uri, String> {
    let uri: Uri = value.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(_)) => Ok(uri),
        (Some(scheme), Some(_)) => Err(format!("scheme `{scheme}` is not supported; use http://")),
        _ => Err("expected an absolute URL such as http://127.0.0.1:10000/v1/completions".into()),
    }
}

fn header(value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, text) = value
        .split_once(':')
        .ok_or_else(|| format!("`{value}` is not `name: value`"))?;
    let name = HeaderName::try_from(name.trim()).map_err(|e| format!("header name: {e}"))?;
    let text = HeaderValue::try_from(text.trim()).map_err(|e| format!("header value: {e}"))?;
    Ok((name, text))
}

fn positive(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{value}` is not a positive number")),
    }
}

fn non_empty(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        Err("adapter names must not be empty".into())
    } else {
        Ok(value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("wasm-epp-loadgen").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let cli = parse(&["--url", "http://127.0.0.1:10000/v1/completions"]).expect("parses");
        assert_eq!(cli.requests, 100);
        assert_eq!(cli.concurrency, 8);
        assert_eq!(cli.max_tokens, 16);
        assert_eq!(cli.prompt_bytes, 1024);
        assert_eq!(cli.prefix_bytes, 2048);
        assert_eq!(cli.instance_header.as_str(), "x-sim-instance");
        assert_eq!(cli.timeout(), Duration::from_secs(60));
        assert!(cli.rate.is_none() && cli.lora.is_empty() && !cli.stream);
        assert_eq!(cli.length_dist, LengthDist::Fixed);
    }

    #[test]
    fn several_urls_are_kept_in_order() {
        let cli = parse(&[
            "--url",
            "http://a/v1/completions",
            "--url",
            "http://b/v1/completions",
        ])
        .expect("parses");
        assert_eq!(cli.url.len(), 2);
        assert_eq!(cli.url[1].host(), Some("b"));
        assert!(parse(&[]).is_err(), "at least one --url");
    }

    #[test]
    fn lora_list_splits_on_commas() {
        let cli = parse(&["--url", "http://h/v1/completions", "--lora", "a, b"]).expect("parses");
        assert_eq!(cli.lora, ["a", "b"]);
    }

    #[test]
    fn headers_are_name_value_pairs() {
        let cli = parse(&[
            "--url",
            "http://h/v1/completions",
            "--header",
            "x-llm-d-inference-objective: critical",
            "--header",
            "x-a:b",
        ])
        .expect("parses");
        let pairs: Vec<(&str, &str)> = cli
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("")))
            .collect();
        assert_eq!(
            pairs,
            [("x-llm-d-inference-objective", "critical"), ("x-a", "b")]
        );
    }

    #[test]
    fn rejects_bad_flags() {
        for args in [
            &["--url", "https://h/v1/completions"][..],
            &["--url", "/v1/completions"],
            &["--url", "http://h/", "--requests", "0"],
            &["--url", "http://h/", "--concurrency", "0"],
            &["--url", "http://h/", "--rate", "0"],
            &["--url", "http://h/", "--timeout", "-1"],
            &["--url", "http://h/", "--lora", "a,,b"],
            &["--url", "http://h/", "--length-dist", "zipf"],
            &["--url", "http://h/", "--header", "no-colon"],
            &["--url", "http://h/", "--header", "bad name: x"],
            &[],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }
}
