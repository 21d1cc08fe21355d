//! Understanding an inference request body: which API it is, the model, whether it streams,
//! and the prompt bytes the prefix-cache producer hashes.

use serde_json::Value;

use crate::errors::InferenceError;

/// The API a request path selects, by path suffix (longest match wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI `…/chat/completions`.
    ChatCompletions,
    /// OpenAI `…/completions`.
    Completions,
    /// OpenAI `…/responses`.
    Responses,
    /// OpenAI `…/embeddings`.
    Embeddings,
    /// Anthropic `…/messages`.
    Messages,
    /// Any other path (and Anthropic `…/messages/count_tokens`, forwarded raw): the body is not
    /// interpreted and only metric-based scorers apply.
    Passthrough,
}

/// Path suffixes and their APIs, longest first so the longest match wins.
const SUFFIXES: [(&str, Api); 6] = [
    ("messages/count_tokens", Api::Passthrough),
    ("chat/completions", Api::ChatCompletions),
    ("completions", Api::Completions),
    ("embeddings", Api::Embeddings),
    ("responses", Api::Responses),
    ("messages", Api::Messages),
];

impl Api {
    /// Selects the API from a request path (query string ignored).
    pub fn from_path(path: &str) -> Api {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        SUFFIXES
            .iter()
            .find(|(suffix, _)| path.ends_with(suffix))
            .map_or(Api::Passthrough, |&(_, api)| api)
    }

    /// Whether the body names a model that rewrites may change (every parsed API).
    pub fn rewrites_model(self) -> bool {
        self != Api::Passthrough
    }
}

/// What the scheduler needs to know about one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferenceRequest {
    /// The body's `model` (empty for passthrough).
    pub model: String,
    /// The body's `stream` flag.
    pub stream: bool,
    /// Bytes the prefix-cache producer hashes (prompt text, or roles and message texts).
    pub prompt: Vec<u8>,
    /// The body's `cache_salt`, mixed into the prefix hashes.
    pub cache_salt: String,
}

/// Parses a complete request body for the given API.
pub fn parse(api: Api, body: &[u8]) -> Result<InferenceRequest, InferenceError> {
    if api == Api::Passthrough {
        return Ok(InferenceRequest::default());
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| InferenceError::BadRequest(format!("error unmarshaling request body: {e}")))?;
    let Value::Object(map) = value else {
        return Err(InferenceError::BadRequest(
            "error unmarshaling request body: not a JSON object".to_string(),
        ));
    };
    let model = map
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if model.is_empty() {
        return Err(InferenceError::BadRequest(
            "model not found in request body".to_string(),
        ));
    }
    let (prompt, invalid) = match api {
        Api::ChatCompletions => (
            chat_prompt(map.get("messages")),
            "invalid chat completions request: must have valid messages field",
        ),
        Api::Completions => (
            completion_prompt(map.get("prompt")),
            "invalid completions request: must have prompt field",
        ),
        Api::Embeddings => (
            non_empty(map.get("input")).map(json_bytes),
            "invalid embeddings request: must have input field",
        ),
        Api::Responses => (
            map.get("input").map(|_| {
                ["instructions", "tools", "input"]
                    .iter()
                    .filter_map(|k| map.get(*k))
                    .flat_map(json_bytes)
                    .collect()
            }),
            "invalid responses request: must have input field",
        ),
        Api::Messages => (
            anthropic_prompt(&map),
            "invalid messages request: must have valid messages field",
        ),
        Api::Passthrough => (Some(Vec::new()), ""),
    };
    let prompt = prompt.ok_or_else(|| InferenceError::BadRequest(invalid.to_string()))?;
    Ok(InferenceRequest {
        model,
        stream: map.get("stream").and_then(Value::as_bool).unwrap_or(false),
        prompt,
        cache_salt: map
            .get("cache_salt")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

/// Role and text of every message, in order; `None` when there are no valid messages.
fn chat_prompt(messages: Option<&Value>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    push_messages(&mut out, messages)?;
    Some(out)
}

/// Anthropic messages: the tools, the system text, then every message's role and text.
fn anthropic_prompt(map: &serde_json::Map<String, Value>) -> Option<Vec<u8>> {
    let mut out = map.get("tools").map(json_bytes).unwrap_or_default();
    push_text(&mut out, map.get("system"));
    push_messages(&mut out, map.get("messages"))?;
    Some(out)
}

fn push_messages(out: &mut Vec<u8>, messages: Option<&Value>) -> Option<()> {
    let messages = messages?.as_array().filter(|m| !m.is_empty())?;
    for message in messages {
        let message = message.as_object()?;
        out.extend_from_slice(message.get("role")?.as_str()?.as_bytes());
        push_text(out, message.get("content"));
    }
    Some(())
}

/// A string, or the `text` of each block of an array.
fn push_text(out: &mut Vec<u8>, content: Option<&Value>) {
    match content {
        Some(Value::String(text)) => out.extend_from_slice(text.as_bytes()),
        Some(Value::Array(blocks)) => {
            for text in blocks.iter().filter_map(|b| b.get("text")?.as_str()) {
                out.extend_from_slice(text.as_bytes());
            }
        }
        _ => {}
    }
}

fn non_empty(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| match v {
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Null => false,
        _ => true,
    })
}

fn json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// The prompt string(s) or token IDs as bytes; `None` when the prompt is missing or empty.
fn completion_prompt(prompt: Option<&Value>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match prompt? {
        Value::String(text) => out.extend_from_slice(text.as_bytes()),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(text) => out.extend_from_slice(text.as_bytes()),
                    Value::Number(n) => {
                        let id = u32::try_from(n.as_u64()?).ok()?;
                        out.extend_from_slice(&id.to_le_bytes());
                    }
                    _ => return None,
                }
            }
        }
        _ => return None,
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn bad_request(result: Result<InferenceRequest, InferenceError>) -> String {
        match result {
            Err(InferenceError::BadRequest(m)) => m,
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }

    #[test]
    fn api_by_path_suffix() {
        assert_eq!(Api::from_path("/v1/chat/completions"), Api::ChatCompletions);
        assert_eq!(
            Api::from_path("/v1/chat/completions?x=1"),
            Api::ChatCompletions
        );
        assert_eq!(Api::from_path("/v1/completions"), Api::Completions);
        assert_eq!(Api::from_path("/openai/v1/completions/"), Api::Completions);
        assert_eq!(Api::from_path("/v1/models"), Api::Passthrough);
        assert_eq!(Api::from_path("/v1/embeddings"), Api::Embeddings);
        assert_eq!(Api::from_path("/v1/responses"), Api::Responses);
        assert_eq!(Api::from_path("/v1/messages"), Api::Messages);
        assert_eq!(
            Api::from_path("/v1/messages/count_tokens"),
            Api::Passthrough
        );
        assert!(!Api::Passthrough.rewrites_model());
        assert!(Api::Messages.rewrites_model());
    }

    #[test]
    fn completions_body() {
        let r = parse(
            Api::Completions,
            br#"{"model":"m","prompt":"hello","stream":true,"cache_salt":"s"}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream);
        assert_eq!(r.prompt, b"hello");
        assert_eq!(r.cache_salt, "s");
        let r = parse(Api::Completions, br#"{"model":"m","prompt":["a","b"]}"#).unwrap();
        assert_eq!(r.prompt, b"ab");
        let r = parse(Api::Completions, br#"{"model":"m","prompt":[1,2]}"#).unwrap();
        assert_eq!(r.prompt, [1, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn chat_body_roles_and_text_blocks() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"S"},
            {"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{}}]}]}"#;
        let r = parse(Api::ChatCompletions, body).unwrap();
        assert_eq!(r.prompt, b"systemSuserA");
        assert!(!r.stream);
    }

    #[test]
    fn bad_bodies_are_bad_requests() {
        assert!(bad_request(parse(Api::Completions, b"{not json"))
            .starts_with("error unmarshaling request body: "));
        assert!(bad_request(parse(Api::Completions, b"[1]")).contains("not a JSON object"));
        assert_eq!(
            bad_request(parse(Api::Completions, br#"{"prompt":"x"}"#)),
            "model not found in request body"
        );
        assert_eq!(
            bad_request(parse(Api::Completions, br#"{"model":"m","prompt":""}"#)),
            "invalid completions request: must have prompt field"
        );
        assert_eq!(
            bad_request(parse(
                Api::ChatCompletions,
                br#"{"model":"m","messages":[]}"#
            )),
            "invalid chat completions request: must have valid messages field"
        );
        assert!(bad_request(parse(
            Api::ChatCompletions,
            br#"{"model":"m","messages":[3]}"#
        ))
        .contains("messages"));
    }

    #[test]
    fn embeddings_responses_and_anthropic_messages() {
        let r = parse(Api::Embeddings, br#"{"model":"e","input":["a","b"]}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.prompt.as_slice()),
            ("e", br#"["a","b"]"#.as_slice())
        );
        assert_eq!(
            bad_request(parse(Api::Embeddings, br#"{"model":"e","input":""}"#)),
            "invalid embeddings request: must have input field"
        );
        let r = parse(
            Api::Responses,
            br#"{"model":"r","instructions":"be brief","input":"hi"}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, br#""be brief""hi""#);
        assert_eq!(
            bad_request(parse(Api::Responses, br#"{"model":"r"}"#)),
            "invalid responses request: must have input field"
        );
        let body = br#"{"model":"claude","system":"S","messages":[{"role":"user","content":[{"type":"text","text":"Q"}]}]}"#;
        assert_eq!(parse(Api::Messages, body).unwrap().prompt, b"SuserQ");
        assert!(
            bad_request(parse(Api::Messages, br#"{"model":"c","messages":[]}"#))
                .contains("messages")
        );
    }

    #[test]
    fn passthrough_reads_nothing() {
        assert_eq!(
            parse(Api::Passthrough, b"\x00 not json").unwrap(),
            InferenceRequest::default()
        );
    }
}
