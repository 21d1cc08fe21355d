//! The per-request trace (`--trace`): one JSON object per line for every request sent, in
//! completion order, so a run can be read request by request (which server answered a slow
//! one, and what else it had in flight when that one was sent).

use serde::Serialize;

use crate::client::Outcome;
use crate::report::{failure_key, millis};
use crate::run::{RunResult, Sent};

/// One request's line.
#[derive(Debug, Serialize)]
struct Line<'a> {
    /// The request's number in this run, from 0 (its prompt starts with `[N] `, N this plus
    /// `--first-index`).
    index: u32,
    /// When it was sent, in seconds from the run's start.
    sent_s: f64,
    /// Bytes of its prompt (or user message).
    prompt_bytes: usize,
    /// Its `max_tokens`.
    max_tokens: u32,
    /// The instance header of the response, if any.
    instance: Option<&'a str>,
    /// The response status, absent when no response came.
    status: Option<u16>,
    /// Time to first token (streaming), ms.
    ttft_ms: Option<f64>,
    /// From sending to the end of the body, ms; absent when no response came.
    latency_ms: Option<f64>,
    /// Why no response came (`connect`, `timeout`, `transport`).
    error: Option<&'static str>,
}

/// The trace of `result`: one JSON line per request (none for a request whose task failed).
pub fn lines(result: &RunResult) -> String {
    let mut text = String::new();
    let requests = result.sent.iter().zip(&result.outcomes);
    for (sent, outcome) in requests.filter_map(|(sent, outcome)| Some((sent.as_ref()?, outcome))) {
        let line = line(sent, outcome);
        // A struct of numbers and strings always serializes.
        if let Ok(json) = serde_json::to_string(&line) {
            text.push_str(&json);
            text.push('\n');
        }
    }
    text
}

fn line<'a>(sent: &Sent, outcome: &'a Outcome) -> Line<'a> {
    let base = Line {
        index: sent.index,
        sent_s: sent.at.as_secs_f64(),
        prompt_bytes: sent.prompt_bytes,
        max_tokens: sent.max_tokens,
        instance: None,
        status: None,
        ttft_ms: None,
        latency_ms: None,
        error: None,
    };
    match outcome {
        Ok(response) => Line {
            instance: response.instance.as_deref(),
            status: Some(response.status),
            ttft_ms: response.ttft.map(millis),
            latency_ms: Some(millis(response.latency)),
            ..base
        },
        Err(failure) => Line {
            error: Some(failure_key(failure)),
            ..base
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::{Failure, Response};

    #[test]
    fn one_line_per_request_with_what_came_of_it() {
        let result = RunResult {
            outcomes: vec![
                Ok(Response {
                    status: 200,
                    instance: Some("server-1".into()),
                    latency: Duration::from_millis(1500),
                    ttft: Some(Duration::from_millis(250)),
                    completion_tokens: Some(48),
                }),
                Err(Failure::Timeout),
                Err(Failure::Transport("request task failed".into())),
            ],
            sent: vec![
                Some(Sent {
                    index: 7,
                    at: Duration::from_millis(2500),
                    prompt_bytes: 1024,
                    max_tokens: 48,
                }),
                Some(Sent {
                    index: 3,
                    at: Duration::from_millis(500),
                    prompt_bytes: 9,
                    max_tokens: 16,
                }),
                None,
            ],
            wall: Duration::from_secs(3),
        };
        let text = lines(&result);
        let parsed: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            parsed[0],
            serde_json::json!({"index": 7, "sent_s": 2.5, "prompt_bytes": 1024,
                "max_tokens": 48, "instance": "server-1", "status": 200, "ttft_ms": 250.0,
                "latency_ms": 1500.0, "error": null})
        );
        assert_eq!(parsed[1]["index"], 3);
        assert_eq!(parsed[1]["error"], "timeout");
        assert_eq!(parsed[1]["latency_ms"], serde_json::Value::Null);
    }
}
