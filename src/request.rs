//! Understanding an inference request body: which API it is, the model, whether it streams,
//! and the prompt bytes the prefix-cache producer hashes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

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

/// What the scheduler needs to know about one request, borrowed from the body wherever the
/// JSON has no escapes: a long prompt string is neither allocated nor copied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferenceRequest<'a> {
    /// The body's `model` (empty for passthrough).
    pub model: Cow<'a, str>,
    /// The body's `stream` flag.
    pub stream: bool,
    /// Bytes the prefix-cache producer hashes (prompt text, or roles and message texts).
    pub prompt: Cow<'a, [u8]>,
    /// The body's `cache_salt`, mixed into the prefix hashes.
    pub cache_salt: Cow<'a, str>,
    /// The most output tokens the client asks for: `max_completion_tokens`, else
    /// `max_tokens`, else `max_output_tokens` (Responses), when a non-negative integer.
    pub max_output_tokens: Option<u64>,
}

/// Top-level fields any API reads; the rest of the body is skipped (still validated).
const FIELDS: [&str; 12] = [
    "model",
    "stream",
    "cache_salt",
    "prompt",
    "messages",
    "input",
    "instructions",
    "tools",
    "system",
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
];

/// Parses a complete request body for the given API: one pass over the body that keeps only
/// the raw extent of the fields above (no tree of values), then reads those.
pub fn parse(api: Api, body: &[u8]) -> Result<InferenceRequest<'_>, InferenceError> {
    if api == Api::Passthrough {
        return Ok(InferenceRequest::default());
    }
    // Validated once here with SIMD; the JSON parser then reads it as text and does not
    // validate each string again.
    let body = simdutf8::compat::from_utf8(body).map_err(|e| {
        InferenceError::BadRequest(format!(
            "error unmarshaling request body: invalid UTF-8 after byte {}",
            e.valid_up_to()
        ))
    })?;
    let [model, stream, cache_salt, prompt, messages, input, instructions, tools, system, max_completion_tokens, max_tokens, max_output_tokens] =
        fields(body, &FIELDS).map_err(|e| {
            let why = if e.is_data() {
                "not a JSON object".to_string()
            } else {
                e.to_string()
            };
            InferenceError::BadRequest(format!("error unmarshaling request body: {why}"))
        })?;
    let model = model.and_then(text).unwrap_or_default();
    if model.is_empty() {
        return Err(InferenceError::BadRequest(
            "model not found in request body".to_string(),
        ));
    }
    let (prompt, invalid) = match api {
        Api::ChatCompletions => (
            messages.and_then(|m| {
                let mut out = Vec::new();
                push_messages(&mut out, m)?;
                Some(Cow::Owned(out))
            }),
            "invalid chat completions request: must have valid messages field",
        ),
        Api::Completions => (
            prompt.and_then(completion_prompt),
            "invalid completions request: must have prompt field",
        ),
        Api::Embeddings => (
            input
                .filter(|raw| non_empty(raw))
                .map(|raw| Cow::Borrowed(raw.get().as_bytes())),
            "invalid embeddings request: must have input field",
        ),
        Api::Responses => (
            input.map(|_| {
                let parts = [instructions, tools, input];
                Cow::Owned(
                    parts
                        .iter()
                        .flatten()
                        .flat_map(|r| r.get().bytes())
                        .collect(),
                )
            }),
            "invalid responses request: must have input field",
        ),
        Api::Messages => (
            messages.and_then(|m| {
                let mut out = tools.map_or_else(Vec::new, |t| t.get().as_bytes().to_vec());
                if let Some(system) = system {
                    push_text(&mut out, system);
                }
                push_messages(&mut out, m)?;
                Some(Cow::Owned(out))
            }),
            "invalid messages request: must have valid messages field",
        ),
        Api::Passthrough => (Some(Cow::Borrowed(&[][..])), ""),
    };
    let prompt = prompt.ok_or_else(|| InferenceError::BadRequest(invalid.to_string()))?;
    Ok(InferenceRequest {
        model,
        stream: stream.is_some_and(|raw| raw.get() == "true"),
        prompt,
        cache_salt: cache_salt.and_then(text).unwrap_or_default(),
        max_output_tokens: [max_completion_tokens, max_tokens, max_output_tokens]
            .into_iter()
            .flatten()
            .find_map(|raw| raw.get().parse().ok()),
    })
}

/// The raw values of the object `json`'s members named in `names` (the last one wins for a
/// repeated name); every other member is skipped. An error when `json` is not exactly one
/// JSON object.
fn fields<'a, const N: usize>(
    json: &'a str,
    names: &'static [&'static str; N],
) -> Result<[Option<&'a RawValue>; N], serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let found = Fields(names).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(found)
}

/// Deserializes an object into the raw values of the named members.
struct Fields<const N: usize>(&'static [&'static str; N]);

impl<'de, const N: usize> DeserializeSeed<'de> for Fields<N> {
    type Value = [Option<&'de RawValue>; N];

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for Fields<N> {
    type Value = [Option<&'de RawValue>; N];

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = [None; N];
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match self.0.iter().position(|name| *name == key.0) {
                Some(i) => found[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A member name, borrowed unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A JSON string's text, borrowed unless it has escapes; `None` for any other value. The raw
/// value was validated when it was captured, so without a backslash its text is exactly what
/// lies between the quotes: one fast (SIMD) search instead of a second parse.
fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    let json = raw.get();
    let inner = json.strip_prefix('"')?.strip_suffix('"')?;
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(json).ok().map(Cow::Owned)
}

/// The elements of a JSON array; `None` for any other value.
fn elements(raw: &RawValue) -> Option<Vec<&RawValue>> {
    serde_json::from_str(raw.get()).ok()
}

/// Role and text of every message, in order; `None` when there are no valid messages.
fn push_messages(out: &mut Vec<u8>, messages: &RawValue) -> Option<()> {
    const MESSAGE: [&str; 2] = ["role", "content"];
    let messages = elements(messages).filter(|m| !m.is_empty())?;
    for message in messages {
        let [role, content] = fields(message.get(), &MESSAGE).ok()?;
        out.extend_from_slice(text(role?)?.as_bytes());
        if let Some(content) = content {
            push_text(out, content);
        }
    }
    Some(())
}

/// A string, or the `text` of each block of an array.
fn push_text(out: &mut Vec<u8>, content: &RawValue) {
    const BLOCK: [&str; 1] = ["text"];
    if let Some(content) = text(content) {
        out.extend_from_slice(content.as_bytes());
        return;
    }
    for block in elements(content).unwrap_or_default() {
        if let Ok([Some(block_text)]) = fields(block.get(), &BLOCK) {
            if let Some(block_text) = text(block_text) {
                out.extend_from_slice(block_text.as_bytes());
            }
        }
    }
}

/// Whether an embeddings `input` has something in it (not `""`, `[]` or `null`).
fn non_empty(raw: &RawValue) -> bool {
    !matches!(raw.get().trim(), "\"\"" | "null") && elements(raw).is_none_or(|a| !a.is_empty())
}

/// The prompt string (borrowed from the body when it has no escapes), or the strings and token
/// IDs of a prompt array as bytes; `None` when the prompt is missing or empty.
fn completion_prompt(raw: &RawValue) -> Option<Cow<'_, [u8]>> {
    if let Some(prompt) = text(raw) {
        return (!prompt.is_empty()).then(|| match prompt {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        });
    }
    let mut out = Vec::new();
    for item in elements(raw)? {
        if let Some(piece) = text(item) {
            out.extend_from_slice(piece.as_bytes());
        } else {
            let id: u32 = serde_json::from_str(item.get()).ok()?;
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    (!out.is_empty()).then_some(Cow::Owned(out))
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
        assert_eq!(r.prompt.as_ref(), b"hello");
        assert_eq!(r.cache_salt, "s");
        let r = parse(Api::Completions, br#"{"model":"m","prompt":["a","b"]}"#).unwrap();
        assert_eq!(r.prompt.as_ref(), b"ab");
        let r = parse(Api::Completions, br#"{"model":"m","prompt":[1,2]}"#).unwrap();
        assert_eq!(r.prompt.as_ref(), [1, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn chat_body_roles_and_text_blocks() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"S"},
            {"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{}}]}]}"#;
        let r = parse(Api::ChatCompletions, body).unwrap();
        assert_eq!(r.prompt.as_ref(), b"systemSuserA");
        assert!(!r.stream);
    }

    #[test]
    fn bad_bodies_are_bad_requests() {
        assert!(bad_request(parse(Api::Completions, b"{not json"))
            .starts_with("error unmarshaling request body: "));
        assert!(bad_request(parse(Api::Completions, b"[1]")).contains("not a JSON object"));
        // Invalid UTF-8 anywhere (here inside the prompt string) is refused before parsing.
        assert_eq!(
            bad_request(parse(
                Api::Completions,
                b"{\"model\":\"m\",\"prompt\":\"ab\xff\"}"
            )),
            "error unmarshaling request body: invalid UTF-8 after byte 25"
        );
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
            (r.model.as_ref(), r.prompt.as_ref()),
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
        assert_eq!(r.prompt.as_ref(), br#""be brief""hi""#);
        assert_eq!(
            bad_request(parse(Api::Responses, br#"{"model":"r"}"#)),
            "invalid responses request: must have input field"
        );
        let body = br#"{"model":"claude","system":"S","messages":[{"role":"user","content":[{"type":"text","text":"Q"}]}]}"#;
        assert_eq!(
            parse(Api::Messages, body).unwrap().prompt.as_ref(),
            b"SuserQ"
        );
        assert!(
            bad_request(parse(Api::Messages, br#"{"model":"c","messages":[]}"#))
                .contains("messages")
        );
    }

    #[test]
    fn prompts_are_borrowed_from_the_body_unless_escaped() {
        let body = br#"{"model":"m","prompt":"a long prompt","extra":{"deep":[1,{"x":null}]}}"#;
        let r = parse(Api::Completions, body).unwrap();
        assert!(matches!(r.prompt, Cow::Borrowed(_)) && matches!(r.model, Cow::Borrowed(_)));
        assert_eq!(r.prompt.as_ref(), b"a long prompt");
        let r = parse(
            Api::Completions,
            br#"{"model":"m","prompt":"tab\there \u00e9"}"#,
        )
        .unwrap();
        assert_eq!(r.prompt.as_ref(), "tab\there \u{e9}".as_bytes());
    }

    #[test]
    fn members_are_read_as_a_json_map_would() {
        // The last of a repeated member wins; members of the wrong type read as absent.
        let r = parse(
            Api::Completions,
            br#"{"model":"a","model":"b","prompt":"p","stream":"yes","cache_salt":5}"#,
        )
        .unwrap();
        assert_eq!(
            (r.model.as_ref(), r.stream, r.cache_salt.as_ref()),
            ("b", false, "")
        );
        assert_eq!(
            bad_request(parse(Api::Completions, br#"{"model":7,"prompt":"p"}"#)),
            "model not found in request body"
        );
        assert!(
            bad_request(parse(Api::Completions, br#"{"model":"m","prompt":"p"} x"#))
                .starts_with("error unmarshaling request body: trailing characters")
        );
        assert!(
            bad_request(parse(Api::Completions, br#"{"model":"m","prompt":[true]}"#))
                .contains("must have prompt field")
        );
    }

    #[test]
    fn the_output_token_limit_is_read_from_any_api_field() {
        let limit = |api, body: &[u8]| parse(api, body).unwrap().max_output_tokens;
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"max_completion_tokens":9}"#;
        assert_eq!(limit(Api::ChatCompletions, chat), Some(9));
        let completion = br#"{"model":"m","prompt":"p","max_tokens":48}"#;
        assert_eq!(limit(Api::Completions, completion), Some(48));
        let responses = br#"{"model":"m","input":"p","max_output_tokens":300}"#;
        assert_eq!(limit(Api::Responses, responses), Some(300));
        // Not a non-negative integer, or absent: unknown.
        for body in [
            &br#"{"model":"m","prompt":"p","max_tokens":"48"}"#[..],
            br#"{"model":"m","prompt":"p","max_tokens":-1}"#,
            br#"{"model":"m","prompt":"p","max_tokens":null}"#,
            br#"{"model":"m","prompt":"p"}"#,
        ] {
            assert_eq!(limit(Api::Completions, body), None);
        }
    }

    #[test]
    fn passthrough_reads_nothing() {
        assert_eq!(
            parse(Api::Passthrough, b"\x00 not json").unwrap(),
            InferenceRequest::default()
        );
    }
}
