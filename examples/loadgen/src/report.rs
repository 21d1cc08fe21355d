//! The results: counted from the outcomes, printed as text or JSON.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::client::{Failure, Outcome};
use crate::run::RunResult;
use crate::stats::Percentiles;

/// The instance name shown for responses without the instance header.
pub const NO_INSTANCE: &str = "(none)";

/// What was run, repeated in the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setup {
    /// The `--label`.
    pub label: Option<String>,
    /// The target URL.
    pub url: String,
    /// `completions` or `chat`.
    pub api: &'static str,
    /// Whether responses were streamed.
    pub stream: bool,
    /// Most requests in flight.
    pub concurrency: u32,
    /// Open-loop rate in requests/s; `None` for closed loop.
    pub rate: Option<f64>,
}

/// Requests answered by one instance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceCount {
    /// The instance header's value, or [`NO_INSTANCE`].
    pub name: String,
    /// Responses (of any status) from it.
    pub count: u32,
    /// `count` over all responses received, in 0..=1.
    pub share: f64,
    /// Time to first content chunk of its OK streamed responses, in ms: where a policy's
    /// slow first tokens come from.
    pub ttft_ms: Option<Percentiles>,
}

/// The numbers of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// What was run.
    #[serde(flatten)]
    pub setup: Setup,
    /// Requests sent.
    pub requests: u32,
    /// Responses with a 2xx status.
    pub ok: u32,
    /// Failed requests by HTTP status code, or `connect`, `timeout`,
    /// `transport` when no complete response came.
    pub errors: BTreeMap<String, u32>,
    /// Wall time of the run in seconds.
    pub wall_s: f64,
    /// OK responses per second of wall time.
    pub requests_per_s: f64,
    /// Sum of `usage.completion_tokens` over OK responses.
    pub output_tokens: u64,
    /// `output_tokens` per second of wall time.
    pub output_tokens_per_s: f64,
    /// End-to-end latency of OK responses, in ms.
    pub latency_ms: Option<Percentiles>,
    /// Time to first content chunk of OK streamed responses, in ms.
    pub ttft_ms: Option<Percentiles>,
    /// Responses per instance, most first.
    pub instances: Vec<InstanceCount>,
}

impl Report {
    /// Counts the outcomes of `result`.
    pub fn new(setup: Setup, result: &RunResult) -> Self {
        let mut ok = 0;
        let mut errors = BTreeMap::new();
        let mut output_tokens = 0;
        let mut latencies = Vec::new();
        let mut ttfts = Vec::new();
        // Per instance: responses, and the time to first token of its OK ones.
        let mut per_instance: BTreeMap<&str, (u32, Vec<f64>)> = BTreeMap::new();
        for outcome in &result.outcomes {
            let response = match outcome {
                Ok(response) => response,
                Err(failure) => {
                    *errors.entry(failure_key(failure).to_string()).or_default() += 1;
                    continue;
                }
            };
            let instance = per_instance
                .entry(response.instance.as_deref().unwrap_or(NO_INSTANCE))
                .or_default();
            instance.0 += 1;
            if !(200..300).contains(&response.status) {
                *errors.entry(response.status.to_string()).or_default() += 1;
                continue;
            }
            ok += 1;
            output_tokens += response.completion_tokens.unwrap_or(0);
            latencies.push(millis(response.latency));
            if let Some(ttft) = response.ttft.map(millis) {
                ttfts.push(ttft);
                instance.1.push(ttft);
            }
        }
        let responses: u32 = per_instance.values().map(|(count, _)| count).sum();
        let mut instances: Vec<InstanceCount> = per_instance
            .into_iter()
            .map(|(name, (count, ttfts))| InstanceCount {
                name: name.to_string(),
                count,
                share: f64::from(count) / f64::from(responses),
                ttft_ms: Percentiles::of(ttfts),
            })
            .collect();
        instances.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
        let wall_s = result.wall.as_secs_f64();
        let per_s = |n: f64| if wall_s > 0.0 { n / wall_s } else { 0.0 };
        Self {
            setup,
            requests: u32::try_from(result.outcomes.len()).unwrap_or(u32::MAX),
            ok,
            errors,
            wall_s,
            requests_per_s: per_s(f64::from(ok)),
            output_tokens,
            output_tokens_per_s: per_s(output_tokens as f64),
            latency_ms: Percentiles::of(latencies),
            ttft_ms: Percentiles::of(ttfts),
            instances,
        }
    }
}

/// The error key of `failure` in the report (and the trace).
pub fn failure_key(failure: &Failure) -> &'static str {
    match failure {
        Failure::Connect(_) => "connect",
        Failure::Timeout => "timeout",
        Failure::Transport(_) => "transport",
    }
}

/// `d` in milliseconds.
pub fn millis(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The report as a screenful of text.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.setup;
        writeln!(
            f,
            "== wasm-epp-loadgen: {} ==",
            s.label.as_deref().unwrap_or("run")
        )?;
        let mode = if s.stream {
            "streaming"
        } else {
            "non-streaming"
        };
        writeln!(f, "target    {} ({}, {mode})", s.url, s.api)?;
        match s.rate {
            Some(rate) => writeln!(
                f,
                "load      open loop at {rate} req/s, at most {} outstanding",
                s.concurrency
            )?,
            None => writeln!(f, "load      closed loop, concurrency {}", s.concurrency)?,
        }
        let failed: u32 = self.errors.values().sum();
        write!(
            f,
            "requests  {} sent, {} ok, {failed} errors",
            self.requests, self.ok
        )?;
        if !self.errors.is_empty() {
            let by_kind: Vec<String> = self
                .errors
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            write!(f, " ({})", by_kind.join(", "))?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "wall      {:.3} s, {:.1} ok req/s, {:.1} output tok/s ({} tokens)",
            self.wall_s, self.requests_per_s, self.output_tokens_per_s, self.output_tokens
        )?;
        writeln!(f, "latency   {}", percentiles(self.latency_ms))?;
        if s.stream {
            writeln!(f, "ttft      {}", percentiles(self.ttft_ms))?;
        }
        if self.instances.is_empty() {
            return writeln!(f, "instances -");
        }
        let width = self
            .instances
            .iter()
            .map(|i| i.name.len())
            .max()
            .unwrap_or(0)
            .max(8);
        writeln!(f, "{:<width$}  {:>6}  {:>6}", "instance", "count", "share")?;
        for i in &self.instances {
            writeln!(
                f,
                "{:<width$}  {:>6}  {:>5.1}%",
                i.name,
                i.count,
                i.share * 100.0
            )?;
        }
        Ok(())
    }
}

fn percentiles(p: Option<Percentiles>) -> String {
    p.map_or_else(
        || "-".to_string(),
        |p| {
            format!(
                "p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms",
                p.p50, p.p90, p.p99
            )
        },
    )
}

/// Whether every request failed to connect; then the first error.
pub fn unreachable(outcomes: &[Outcome]) -> Option<&str> {
    let mut first = None;
    for outcome in outcomes {
        match outcome {
            Err(Failure::Connect(message)) => {
                first.get_or_insert(message.as_str());
            }
            _ => return None,
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::Response;

    fn response(
        status: u16,
        instance: Option<&str>,
        ms: u64,
        ttft: Option<u64>,
        tokens: Option<u64>,
    ) -> Outcome {
        Ok(Response {
            status,
            instance: instance.map(str::to_string),
            latency: Duration::from_millis(ms),
            ttft: ttft.map(Duration::from_millis),
            completion_tokens: tokens,
        })
    }

    fn setup(stream: bool, rate: Option<f64>) -> Setup {
        Setup {
            label: Some("demo".into()),
            url: "http://127.0.0.1:10000/v1/completions".into(),
            api: "completions",
            stream,
            concurrency: 4,
            rate,
        }
    }

    fn sample() -> RunResult {
        RunResult {
            outcomes: vec![
                response(200, Some("sim-a"), 10, Some(2), Some(16)),
                response(200, Some("sim-b"), 20, Some(4), Some(16)),
                response(200, Some("sim-a"), 30, Some(6), Some(16)),
                response(503, Some("sim-b"), 1, None, None),
                response(200, None, 40, Some(8), None),
                Err(Failure::Timeout),
                Err(Failure::Connect("refused".into())),
            ],
            sent: Vec::new(),
            wall: Duration::from_secs(2),
        }
    }

    #[test]
    fn counts() {
        let r = Report::new(setup(true, None), &sample());
        assert_eq!((r.requests, r.ok, r.output_tokens), (7, 4, 48));
        let errors: Vec<(&str, u32)> = r.errors.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        assert_eq!(errors, [("503", 1), ("connect", 1), ("timeout", 1)]);
        assert_eq!(r.requests_per_s, 2.0);
        assert_eq!(r.output_tokens_per_s, 24.0);
        assert_eq!(
            r.latency_ms,
            Some(Percentiles {
                p50: 20.0,
                p90: 40.0,
                p99: 40.0
            })
        );
        assert_eq!(
            r.ttft_ms,
            Some(Percentiles {
                p50: 4.0,
                p90: 8.0,
                p99: 8.0
            })
        );
        let names: Vec<(&str, u32)> = r
            .instances
            .iter()
            .map(|i| (i.name.as_str(), i.count))
            .collect();
        assert_eq!(names, [("sim-a", 2), ("sim-b", 2), (NO_INSTANCE, 1)]);
        assert_eq!(r.instances[0].share, 0.4);
        // Each instance's time to first token counts its OK responses only.
        assert_eq!(r.instances[0].ttft_ms.map(|p| p.p99), Some(6.0));
        assert_eq!(
            r.instances[1].ttft_ms,
            Some(Percentiles {
                p50: 4.0,
                p90: 4.0,
                p99: 4.0
            })
        );
    }

    #[test]
    fn text_report() {
        let text = Report::new(setup(true, None), &sample()).to_string();
        let expected = "\
== wasm-epp-loadgen: demo ==
target    http://127.0.0.1:10000/v1/completions (completions, streaming)
load      closed loop, concurrency 4
requests  7 sent, 4 ok, 3 errors (503: 1, connect: 1, timeout: 1)
wall      2.000 s, 2.0 ok req/s, 24.0 output tok/s (48 tokens)
latency   p50 20.0 ms  p90 40.0 ms  p99 40.0 ms
ttft      p50 4.0 ms  p90 8.0 ms  p99 8.0 ms
instance   count   share
sim-a          2   40.0%
sim-b          2   40.0%
(none)         1   20.0%
";
        assert_eq!(text, expected);
    }

    #[test]
    fn text_report_without_responses_or_streaming() {
        let result = RunResult {
            outcomes: vec![Err(Failure::Transport("reset".into()))],
            sent: Vec::new(),
            wall: Duration::from_millis(5),
        };
        let text = Report::new(setup(false, Some(2.5)), &result).to_string();
        assert!(text.contains("open loop at 2.5 req/s, at most 4 outstanding\n"));
        assert!(text.contains("(completions, non-streaming)"));
        assert!(text.contains("1 sent, 0 ok, 1 errors (transport: 1)\n"));
        assert!(text.contains("latency   -\n"));
        assert!(!text.contains("ttft"));
        assert!(text.ends_with("instances -\n"));
    }

    #[test]
    fn json_fields() {
        let r = Report::new(setup(true, None), &sample());
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["label"], "demo");
        assert_eq!(json["ok"], 4);
        assert_eq!(json["errors"]["503"], 1);
        assert_eq!(json["latency_ms"]["p50"], 20.0);
        assert_eq!(json["instances"][0]["name"], "sim-a");
        assert_eq!(json["instances"][0]["count"], 2);
        assert!(json["instances"][0]["ttft_ms"]["p90"].is_number());
        assert!(json["rate"].is_null());
    }

    #[test]
    fn unreachable_only_when_every_request_failed_to_connect() {
        let refused = || Err(Failure::Connect("refused".into()));
        assert_eq!(unreachable(&[refused(), refused()]), Some("refused"));
        assert_eq!(unreachable(&[refused(), Err(Failure::Timeout)]), None);
        assert_eq!(unreachable(&[]), None);
    }
}
