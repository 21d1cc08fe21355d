//! The OpenAI wire format: request bodies, `usage` and SSE stream scanning.

use serde_json::{json, Value};

use crate::prompts::RequestPlan;

/// Which OpenAI API the target URL speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`: a `prompt`, answered with `choices[].text`.
    Completions,
    /// `/v1/chat/completions`: `messages`, answered with `choices[].message`
    /// (`choices[].delta` when streaming).
    Chat,
}

impl Api {
    /// The API of a URL path: chat when it ends in `chat/completions`.
    pub fn of_path(path: &str) -> Self {
        if path.trim_end_matches('/').ends_with("chat/completions") {
            Api::Chat
        } else {
            Api::Completions
        }
    }

    /// The name shown in the report.
    pub fn name(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::Chat => "chat",
        }
    }

    /// The JSON request body of `plan`; `max_tokens` applies unless the plan sets its own.
    pub fn body(self, plan: &RequestPlan, max_tokens: u32, stream: bool) -> Value {
        let mut body = match self {
            Api::Completions => json!({"model": plan.model, "prompt": plan.prompt}),
            Api::Chat => json!({
                "model": plan.model,
                "messages": [{"role": "user", "content": plan.prompt}],
            }),
        };
        body["max_tokens"] = json!(plan.max_tokens.unwrap_or(max_tokens));
        body["stream"] = json!(stream);
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }
}

/// `usage.completion_tokens` of a response or stream chunk.
pub fn completion_tokens(message: &Value) -> Option<u64> {
    message.get("usage")?.get("completion_tokens")?.as_u64()
}

/// Whether a stream chunk carries output text (`choices[].text` or
/// `choices[].delta.content` non-empty).
fn has_content(chunk: &Value) -> bool {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return false;
    };
    choices.iter().any(|choice| {
        let text = choice
            .get("text")
            .or_else(|| choice.get("delta").and_then(|d| d.get("content")));
        text.and_then(Value::as_str).is_some_and(|t| !t.is_empty())
    })
}

/// An incremental scanner of a `text/event-stream` body: it finds the first
/// `data:` event with content and the last `usage`. Malformed events are
/// skipped.
#[derive(Debug, Default)]
pub struct StreamScan {
    line: Vec<u8>,
    seen_content: bool,
    completion_tokens: Option<u64>,
}

impl StreamScan {
    /// Feeds the next piece of the body; true when it holds the first event
    /// with content (the moment of the first token).
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        let before = self.seen_content;
        for &byte in bytes {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
            } else {
                self.line.push(byte);
            }
        }
        !before && self.seen_content
    }

    /// Ends the body, scanning a last line without a newline; returns the
    /// output tokens of the final usage chunk, if one came.
    pub fn finish(mut self) -> Option<u64> {
        let line = std::mem::take(&mut self.line);
        self.line_done(&line);
        self.completion_tokens
    }

    fn line_done(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        self.seen_content |= has_content(&event);
        if let Some(tokens) = completion_tokens(&event) {
            self.completion_tokens = Some(tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RequestPlan {
        RequestPlan {
            model: "m".into(),
            prompt: "hello".into(),
            max_tokens: None,
        }
    }

    #[test]
    fn api_follows_the_path() {
        assert_eq!(Api::of_path("/v1/chat/completions"), Api::Chat);
        assert_eq!(Api::of_path("/v1/chat/completions/"), Api::Chat);
        assert_eq!(Api::of_path("/v1/completions"), Api::Completions);
        assert_eq!(Api::of_path("/"), Api::Completions);
    }

    #[test]
    fn bodies() {
        let body = Api::Completions.body(&plan(), 16, false);
        assert_eq!(
            body,
            json!({"model": "m", "prompt": "hello", "max_tokens": 16, "stream": false})
        );
        let body = Api::Chat.body(&plan(), 4, true);
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": "hello"}])
        );
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        let own = RequestPlan {
            max_tokens: Some(9),
            ..plan()
        };
        assert_eq!(Api::Completions.body(&own, 16, false)["max_tokens"], 9);
    }

    #[test]
    fn usage_of_a_response() {
        assert_eq!(
            completion_tokens(&json!({"usage": {"completion_tokens": 7}})),
            Some(7)
        );
        assert_eq!(
            completion_tokens(&json!({"usage": {"completion_tokens": "7"}})),
            None
        );
        assert_eq!(completion_tokens(&json!({"choices": []})), None);
    }

    #[test]
    fn stream_finds_first_content_and_usage_across_pieces() {
        let mut scan = StreamScan::default();
        // A role-only chat chunk is not content.
        assert!(!scan.push(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"));
        assert!(!scan.push(b"data: {\"choices\":[{\"delta\":{\"con"));
        assert!(scan.push(b"tent\":\"Hi\"}}]}\r\n\r\n"));
        assert!(!scan.push(b"data: {\"choices\":[{\"text\":\"more\"}]}\n\n"));
        assert!(!scan.push(b": keep-alive comment\n\ndata: not json\n\n"));
        assert!(!scan.push(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":5}}\n\n"));
        assert!(!scan.push(b"data: [DONE]"));
        assert_eq!(scan.finish(), Some(5));
    }

    #[test]
    fn completions_stream_text_counts_and_unterminated_last_line_is_read() {
        let mut scan = StreamScan::default();
        assert!(!scan.push(b"data: {\"choices\":[{\"text\":\"\"}]}\n"));
        assert!(scan.push(b"data:{\"choices\":[{\"text\":\"a\"}]}\n"));
        assert!(!scan.push(b"data: {\"usage\":{\"completion_tokens\":2}}"));
        assert_eq!(scan.finish(), Some(2));
    }

    #[test]
    fn stream_without_usage() {
        let mut scan = StreamScan::default();
        assert!(!scan.push(b"garbage\n\n"));
        assert_eq!(scan.finish(), None);
    }
}
