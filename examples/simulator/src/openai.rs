//! The OpenAI wire format: request bodies in, response and chunk JSON out.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The endpoint a generation request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// A generation request, whichever endpoint it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Generate {
    /// Where it came from (decides the response format).
    pub endpoint: Endpoint,
    /// The requested model: the base model or a LoRA adapter.
    pub model: String,
    /// The prompt text the simulator tokenizes.
    pub prompt: String,
    /// Requested output length, if any.
    pub max_tokens: Option<u64>,
    /// Whether to answer with server-sent events.
    pub stream: bool,
    /// Whether a streamed answer ends with a usage chunk.
    pub include_usage: bool,
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    model: String,
    prompt: Prompt,
    max_tokens: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

/// A completion prompt. The simulator serves one sequence per request, so an
/// array of prompts is treated as their concatenation.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Batch(Vec<String>),
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    model: String,
    messages: Vec<Message>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

/// Message content: a string or a list of parts, of which text parts count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

fn include_usage(options: Option<&StreamOptions>) -> bool {
    options.and_then(|o| o.include_usage).unwrap_or(false)
}

impl From<CompletionRequest> for Generate {
    fn from(request: CompletionRequest) -> Self {
        let prompt = match request.prompt {
            Prompt::Text(text) => text,
            Prompt::Batch(texts) => texts.concat(),
        };
        Self {
            endpoint: Endpoint::Completions,
            include_usage: include_usage(request.stream_options.as_ref()),
            model: request.model,
            prompt,
            max_tokens: request.max_tokens,
            stream: request.stream.unwrap_or(false),
        }
    }
}

impl From<ChatRequest> for Generate {
    fn from(request: ChatRequest) -> Self {
        let mut prompt = String::new();
        for message in &request.messages {
            prompt.push_str(&message.role);
            match &message.content {
                Some(Content::Text(text)) => prompt.push_str(text),
                Some(Content::Parts(parts)) => parts
                    .iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text.as_deref())
                    .for_each(|text| prompt.push_str(text)),
                None => {}
            }
        }
        Self {
            endpoint: Endpoint::Chat,
            include_usage: include_usage(request.stream_options.as_ref()),
            model: request.model,
            prompt,
            max_tokens: request.max_completion_tokens.or(request.max_tokens),
            stream: request.stream.unwrap_or(false),
        }
    }
}

/// The `usage` object of a response.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// Prefix-cache detail.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The `usage.prompt_tokens_details` object.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
}

impl Usage {
    /// Usage of a request with these token counts.
    pub fn new(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// Builds the response objects of one request.
#[derive(Clone, Debug)]
pub struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    /// Replies for request `sequence` of server `instance`, created at Unix
    /// time `created`, naming `model` as requested.
    pub fn new(
        endpoint: Endpoint,
        instance: &str,
        sequence: u64,
        created: u64,
        model: String,
    ) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{instance}-{sequence}"),
            created,
            model,
        }
    }

    /// The non-streaming response carrying all of `text`.
    pub fn complete(&self, text: &str, finish_reason: &str, usage: &Usage) -> Value {
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}),
            ),
            Endpoint::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": finish_reason,
                }),
            ),
        };
        let mut response = self.envelope(object, vec![choice]);
        response["usage"] = json!(usage);
        response
    }

    /// The streamed chunk of one output token; the first chat chunk also
    /// names the role, the last carries the finish reason.
    pub fn token_chunk(&self, token: &str, first: bool, finish_reason: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": token, "logprobs": null, "finish_reason": finish_reason,
            }),
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": token})
                } else {
                    json!({"content": token})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        self.envelope(self.chunk_object(), vec![choice])
    }

    /// The final streamed chunk with the usage and no choices.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let mut chunk = self.envelope(self.chunk_object(), Vec::new());
        chunk["usage"] = json!(usage);
        chunk
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        }
    }

    fn envelope(&self, object: &str, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// The `GET /v1/models` list: the base model, then its adapters.
pub fn model_list(base: &str, adapters: &[String], created: u64) -> Value {
    let entry = |id: &str, parent: Option<&str>| {
        json!({
            "id": id, "object": "model", "created": created, "owned_by": "vllm",
            "root": id, "parent": parent,
        })
    };
    let data: Vec<Value> = std::iter::once(entry(base, None))
        .chain(adapters.iter().map(|a| entry(a, Some(base))))
        .collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Generate {
        serde_json::from_value::<ChatRequest>(body).unwrap().into()
    }

    #[test]
    fn chat_prompt_is_role_and_content_of_each_message() {
        let request = chat(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
                {"role": "assistant", "content": null},
            ],
            "max_tokens": 3,
            "max_completion_tokens": 7,
            "stream": true,
            "stream_options": {"include_usage": true},
        }));
        assert_eq!(request.prompt, "systembe briefuserhiassistant");
        assert_eq!(request.max_tokens, Some(7));
        assert!(request.stream && request.include_usage);
    }

    #[test]
    fn completion_prompt_may_be_an_array() {
        let request: Generate = serde_json::from_value::<CompletionRequest>(
            json!({"model": "m", "prompt": ["ab", "cd"]}),
        )
        .unwrap()
        .into();
        assert_eq!(request.prompt, "abcd");
        assert_eq!(request.max_tokens, None);
        assert!(!request.stream && !request.include_usage);
    }

    #[test]
    fn missing_fields_are_errors() {
        assert!(serde_json::from_value::<CompletionRequest>(json!({"prompt": "x"})).is_err());
        assert!(serde_json::from_value::<ChatRequest>(json!({"model": "m"})).is_err());
        assert!(
            serde_json::from_value::<ChatRequest>(json!({"model": "m", "messages": "x"})).is_err()
        );
    }

    #[test]
    fn chat_chunks_carry_deltas() {
        let reply = Reply::new(Endpoint::Chat, "sim-1", 7, 100, "m".into());
        let first = reply.token_chunk(" the", true, None);
        assert_eq!(first["id"], "chatcmpl-sim-1-7");
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": " the"})
        );
        let last = reply.token_chunk(" end", false, Some("length"));
        assert_eq!(last["choices"][0]["delta"], json!({"content": " end"}));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        let usage = reply.usage_chunk(&Usage::new(10, 2, 4));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 12);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    }

    #[test]
    fn complete_responses_follow_the_endpoint() {
        let usage = Usage::new(3, 2, 0);
        let text =
            Reply::new(Endpoint::Completions, "s", 1, 5, "m".into()).complete("ab", "stop", &usage);
        assert_eq!(text["object"], "text_completion");
        assert_eq!(text["choices"][0]["text"], "ab");
        assert_eq!(text["model"], "m");
        let chat =
            Reply::new(Endpoint::Chat, "s", 1, 5, "m".into()).complete("ab", "length", &usage);
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(chat["choices"][0]["message"]["content"], "ab");
        assert_eq!(chat["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn model_list_names_base_and_adapters() {
        let list = model_list("base", &["a".into()], 1);
        assert_eq!(list["data"][0]["id"], "base");
        assert_eq!(list["data"][1]["id"], "a");
        assert_eq!(list["data"][1]["parent"], "base");
    }
}
