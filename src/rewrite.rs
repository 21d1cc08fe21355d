//! Model-name resolution and rewriting (upstream InferenceModelRewrite and the rewrite header).
//!
//! Request side: the target model is the `x-llm-d-model-name-rewrite` header, else the body's
//! model; then an InferenceModelRewrite rule matching the *incoming* model replaces it with a
//! weighted random pick among the rule's targets ([`target_model`]). When the target differs
//! from the body's model, the body's `model` is replaced ([`rewrite_request_model`]).
//!
//! Response side: `"model":"<target>"` is rewritten back to the client-facing name in the
//! response bytes, for whole bodies and for SSE streams chunk by chunk
//! ([`ResponseModelRewriter`]); byte replacement, not JSON parsing, as upstream does.

use serde_json::Value;

use crate::errors::InferenceError;
use crate::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};

/// Request header forcing the target model.
pub const MODEL_REWRITE_HEADER: &str = "x-llm-d-model-name-rewrite";

/// Deprecated alias of [`MODEL_REWRITE_HEADER`], read when the new header is absent.
pub const DEPRECATED_MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";

/// The 500 message when the rewritten body cannot be encoded.
pub const MARSHAL_ERROR_MESSAGE: &str = "Error marshalling request body";

/// Resolves the target model for a request whose body names `incoming`.
///
/// The header value (when present and non-empty) else `incoming` is the starting target. Then
/// the first InferenceModelRewrite rule matching `incoming` — a rule naming it exactly is
/// preferred over a catch-all rule (no `matches`) in any object; among equals the oldest object
/// (`rewrites` is oldest first), then the first rule in the object — replaces the target with
/// one of its targets, drawn with `random` (a caller-provided uniform random number): weighted
/// targets by cumulative weight (`random % total`), unweighted ones uniformly
/// (`random % count`); in a mixed list targets without a weight are never chosen.
///
/// Returns the target and the name (`namespace/name`) of the rewrite object whose rule was
/// applied, if any.
pub fn target_model(
    incoming: &str,
    header: Option<&str>,
    rewrites: &[ModelRewrite],
    random: u64,
) -> (String, Option<String>) {
    let start = header.filter(|h| !h.is_empty()).unwrap_or(incoming);
    let Some((object, rule)) = matching_rule(incoming, rewrites) else {
        return (start.to_string(), None);
    };
    match pick_target(&rule.targets, random) {
        Some(target) => (target.model.clone(), Some(object.name.clone())),
        None => (start.to_string(), None),
    }
}

/// The rule that applies to `incoming`: exact match first, then catch-all; oldest object first
/// and the first rule within an object.
fn matching_rule<'a>(
    incoming: &str,
    rewrites: &'a [ModelRewrite],
) -> Option<(&'a ModelRewrite, &'a RewriteRule)> {
    let rules = || {
        rewrites
            .iter()
            .flat_map(|object| object.rules.iter().map(move |rule| (object, rule)))
    };
    rules()
        .find(|(_, rule)| rule.matches.iter().any(|m| m == incoming))
        .or_else(|| rules().find(|(_, rule)| rule.matches.is_empty()))
}

/// A weighted random pick; `None` when there is no target to pick.
fn pick_target(targets: &[RewriteTarget], random: u64) -> Option<&RewriteTarget> {
    let total: u64 = targets
        .iter()
        .map(|t| u64::from(t.weight.unwrap_or(0)))
        .sum();
    if total == 0 {
        if targets.is_empty() {
            return None;
        }
        // Fits: the index is below `targets.len()`.
        return targets.get((random % targets.len() as u64) as usize);
    }
    let r = random % total;
    let mut cumulative = 0u64;
    targets.iter().find(|t| {
        cumulative += u64::from(t.weight.unwrap_or(0));
        r < cumulative
    })
}

/// Replaces the top-level `model` of a JSON request body with `target` and re-encodes it (key
/// order and whitespace are not preserved, as upstream). A body that is not a JSON object gives
/// 500 `Error marshalling request body`.
pub fn rewrite_request_model(body: &[u8], target: &str) -> Result<Vec<u8>, InferenceError> {
    let marshal_error = || InferenceError::Internal(MARSHAL_ERROR_MESSAGE.to_string());
    let mut value: Value = serde_json::from_slice(body).map_err(|_| marshal_error())?;
    let Value::Object(map) = &mut value else {
        return Err(marshal_error());
    };
    map.insert("model".to_string(), Value::String(target.to_string()));
    serde_json::to_vec(&value).map_err(|_| marshal_error())
}

/// Rewrites `"model":"<target>"` (with or without one space after the colon) back to
/// `"model":"<client model>"` in response bytes, chunk by chunk.
///
/// A pattern split across chunks is found: up to pattern length − 1 bytes that could start a
/// match are held back until the next chunk or the end of the stream. Bytes are never lost,
/// duplicated or reordered. Names are JSON-escaped when building the patterns; for a name with
/// non-ASCII characters the `\uXXXX`-escaped spelling (Python's default) is matched too.
#[derive(Debug, Clone)]
pub struct ResponseModelRewriter {
    /// (pattern, replacement) pairs, all starting with `"`.
    patterns: Vec<(Vec<u8>, Vec<u8>)>,
    /// Bytes held back from the previous chunk (a prefix of some pattern).
    held: Vec<u8>,
}

impl ResponseModelRewriter {
    /// A rewriter from the model the request was sent with (`target`) back to the name the
    /// client asked for (`client_model`). Equal names make it a pass-through.
    pub fn new(target: &str, client_model: &str) -> ResponseModelRewriter {
        let mut patterns = Vec::new();
        if target != client_model {
            let mut spellings = vec![(json_string(target), json_string(client_model))];
            let ascii = (ascii_json_string(target), ascii_json_string(client_model));
            if ascii.0 != spellings[0].0 {
                spellings.push(ascii);
            }
            for (from, to) in spellings {
                for separator in [":", ": "] {
                    patterns.push((
                        format!("\"model\"{separator}{from}").into_bytes(),
                        format!("\"model\"{separator}{to}").into_bytes(),
                    ));
                }
            }
        }
        ResponseModelRewriter {
            patterns,
            held: Vec::new(),
        }
    }

    /// True when nothing is ever rewritten (target and client name are equal).
    pub fn is_noop(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Rewrites the next chunk. Returns the bytes to send now: the held-back bytes of the
    /// previous chunk plus this chunk, rewritten, minus a new tail that could start a pattern
    /// (kept for the next call). With `end_of_stream` nothing is held back. For a whole
    /// (non-streaming) body call it once with `end_of_stream = true`.
    pub fn push(&mut self, chunk: &[u8], end_of_stream: bool) -> Vec<u8> {
        if self.patterns.is_empty() {
            return chunk.to_vec();
        }
        let mut input = std::mem::take(&mut self.held);
        input.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(input.len() + 16);
        let mut i = 0;
        while i < input.len() {
            // Every pattern starts with a quote: copy everything up to the next one.
            let Some(offset) = input[i..].iter().position(|&b| b == b'"') else {
                out.extend_from_slice(&input[i..]);
                break;
            };
            out.extend_from_slice(&input[i..i + offset]);
            i += offset;
            let rest = &input[i..];
            if let Some((pattern, replacement)) =
                self.patterns.iter().find(|(p, _)| rest.starts_with(p))
            {
                out.extend_from_slice(replacement);
                i += pattern.len();
                continue;
            }
            if !end_of_stream && self.patterns.iter().any(|(p, _)| p.starts_with(rest)) {
                // `rest` is shorter than a pattern and could be its start: wait for more.
                self.held = rest.to_vec();
                break;
            }
            out.push(b'"');
            i += 1;
        }
        out
    }
}

/// `name` as a JSON string literal, quotes included (serde_json's escaping).
fn json_string(name: &str) -> String {
    // Serialising a string cannot fail.
    serde_json::to_string(name).unwrap_or_default()
}

/// `name` as a JSON string literal with every non-ASCII character `\uXXXX`-escaped (UTF-16).
fn ascii_json_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    for c in json_string(name).chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    impl ResponseModelRewriter {
        /// Bytes currently held back.
        fn held_len(&self) -> usize {
            self.held.len()
        }
    }

    /// Rewrites a complete response body in one call.
    fn rewrite_response_body(body: &[u8], target: &str, client_model: &str) -> Vec<u8> {
        ResponseModelRewriter::new(target, client_model).push(body, true)
    }

    fn target(model: &str, weight: Option<u32>) -> RewriteTarget {
        RewriteTarget {
            model: model.to_string(),
            weight,
        }
    }

    fn rule(matches: &[&str], targets: Vec<RewriteTarget>) -> RewriteRule {
        RewriteRule {
            matches: matches.iter().map(|m| m.to_string()).collect(),
            targets,
        }
    }

    fn object(name: &str, rules: Vec<RewriteRule>) -> ModelRewrite {
        ModelRewrite {
            name: name.to_string(),
            rules,
        }
    }

    fn resolve(
        incoming: &str,
        header: Option<&str>,
        rewrites: &[ModelRewrite],
    ) -> (String, Option<String>) {
        target_model(incoming, header, rewrites, 0)
    }

    #[test]
    fn header_then_incoming_without_rules() {
        assert_eq!(resolve("a", None, &[]), ("a".to_string(), None));
        assert_eq!(resolve("a", Some("b"), &[]), ("b".to_string(), None));
        assert_eq!(resolve("a", Some(""), &[]), ("a".to_string(), None));
        assert_eq!(resolve("", None, &[]), (String::new(), None));
    }

    #[test]
    fn rule_precedence() {
        let rewrites = vec![
            object(
                "ns/old-catch-all",
                vec![rule(&[], vec![target("catch", None)])],
            ),
            object(
                "ns/old",
                vec![
                    rule(&["x"], vec![target("old-x-1", None)]),
                    rule(&["x", "y"], vec![target("old-xy", None)]),
                ],
            ),
            object(
                "ns/new",
                vec![
                    rule(&["x"], vec![target("new-x", None)]),
                    rule(&["z"], vec![target("new-z", None)]),
                    rule(&[], vec![target("new-catch", None)]),
                ],
            ),
        ];
        let some = |t: &str, o: &str| (t.to_string(), Some(o.to_string()));
        // Oldest object, first rule.
        assert_eq!(resolve("x", None, &rewrites), some("old-x-1", "ns/old"));
        assert_eq!(resolve("y", None, &rewrites), some("old-xy", "ns/old"));
        // An exact match in a newer object beats an older catch-all.
        assert_eq!(resolve("z", None, &rewrites), some("new-z", "ns/new"));
        // Otherwise the oldest catch-all.
        assert_eq!(
            resolve("other", None, &rewrites),
            some("catch", "ns/old-catch-all")
        );
        // A rule matches the incoming model, not the header, and wins over the header.
        assert_eq!(
            resolve("x", Some("z"), &rewrites),
            some("old-x-1", "ns/old")
        );
        assert_eq!(
            resolve("q", Some("x"), &rewrites[1..2]),
            ("x".to_string(), None)
        );
        // Matching is exact (case-sensitive).
        assert_eq!(resolve("X", None, &rewrites[1..2]), ("X".to_string(), None));
    }

    #[test]
    fn weighted_pick_walks_cumulative_weights() {
        let rewrites = vec![object(
            "ns/split",
            vec![rule(
                &["m"],
                vec![
                    target("a", Some(1)),
                    target("b", Some(3)),
                    target("c", Some(6)),
                ],
            )],
        )];
        for (random, expected) in [
            (0, "a"),
            (1, "b"),
            (3, "b"),
            (4, "c"),
            (9, "c"),
            (10, "a"),
            (13, "b"),
            (u64::MAX, "c"), // u64::MAX % 10 == 5
        ] {
            assert_eq!(
                target_model("m", None, &rewrites, random).0,
                expected,
                "random {random}"
            );
        }
        // Over many draws the split follows the weights exactly.
        let mut counts = [0usize; 3];
        for random in 0..1000u64 {
            let (t, _) = target_model("m", None, &rewrites, random);
            counts[(t.as_bytes()[0] - b'a') as usize] += 1;
        }
        assert_eq!(counts, [100, 300, 600]);
    }

    #[test]
    fn unweighted_pick_is_uniform_and_mixed_lists_skip_unweighted_targets() {
        let uniform = vec![object(
            "ns/u",
            vec![rule(
                &[],
                vec![target("a", None), target("b", None), target("c", None)],
            )],
        )];
        let picks: Vec<String> = (0..6)
            .map(|r| target_model("m", None, &uniform, r).0)
            .collect();
        assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);

        let mixed = vec![object(
            "ns/mixed",
            vec![rule(
                &[],
                vec![
                    target("none", None),
                    target("w", Some(2)),
                    target("none2", None),
                ],
            )],
        )];
        for random in 0..50 {
            assert_eq!(target_model("m", None, &mixed, random).0, "w");
        }
        // A rule without targets changes nothing.
        let empty = vec![object("ns/e", vec![rule(&["m"], vec![])])];
        assert_eq!(
            target_model("m", Some("h"), &empty, 7),
            ("h".to_string(), None)
        );
    }

    #[test]
    fn request_body_model_is_replaced() {
        let body = br#"{"model":"a","prompt":"hi","nested":{"model":"keep"},"n":1}"#;
        let rewritten = rewrite_request_model(body, "b").unwrap();
        let value: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(value["model"], "b");
        assert_eq!(value["nested"]["model"], "keep");
        assert_eq!(value["prompt"], "hi");
        assert_eq!(value["n"], 1);
        // A body without a model gets one.
        let value: Value =
            serde_json::from_slice(&rewrite_request_model(br#"{"prompt":"x"}"#, "b").unwrap())
                .unwrap();
        assert_eq!(value["model"], "b");
        // Names that need escaping survive.
        let value: Value =
            serde_json::from_slice(&rewrite_request_model(body, "we\"ird\\/é").unwrap()).unwrap();
        assert_eq!(value["model"], "we\"ird\\/é");
        for bad in [&b"not json"[..], b"[1,2]", b"\"s\""] {
            let err = rewrite_request_model(bad, "b").unwrap_err();
            assert_eq!(err.status(), 500);
            assert_eq!(
                err.body(),
                "inference error: Internal - Error marshalling request body"
            );
        }
    }

    #[test]
    fn whole_json_body_is_rewritten_back() {
        let body =
            br#"{"id":"x","model":"target-v2","choices":[{"text":"the \"model\":\"target-v2\""}]}"#;
        let out = rewrite_response_body(body, "target-v2", "client");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":"x","model":"client","choices":[{"text":"the \"model\":\"target-v2\""}]}"#
        );
        // With a space after the colon (pretty-printed servers).
        let out = rewrite_response_body(b"{\"model\": \"t\", \"x\": 1}", "t", "c");
        assert_eq!(out, b"{\"model\": \"c\", \"x\": 1}");
        // A longer name that merely starts with the target is left alone.
        let out = rewrite_response_body(br#"{"model":"t-large"}"#, "t", "c");
        assert_eq!(out, br#"{"model":"t-large"}"#);
    }

    #[test]
    fn no_match_and_noop() {
        let body = br#"{"model":"other","text":"""""#;
        assert_eq!(rewrite_response_body(body, "t", "c"), body.to_vec());
        let mut same = ResponseModelRewriter::new("m", "m");
        assert!(same.is_noop());
        assert_eq!(
            same.push(br#"{"model":"m"#, false),
            br#"{"model":"m"#.to_vec()
        );
        assert_eq!(same.held_len(), 0);
        assert_eq!(same.push(br#""}"#, true), br#""}"#.to_vec());
        // Empty input.
        assert!(rewrite_response_body(b"", "t", "c").is_empty());
    }

    fn sse(model: &str) -> Vec<u8> {
        format!(
            "data: {{\"id\":\"1\",\"model\":\"{model}\",\"choices\":[{{\"delta\":{{\"content\":\"He\"}}}}]}}\n\n\
             data: {{\"id\":\"1\",\"model\": \"{model}\",\"choices\":[]}}\n\n\
             data: [DONE]\n\n"
        )
        .into_bytes()
    }

    #[test]
    fn sse_split_at_every_offset_into_two_chunks() {
        let input = sse("target/model");
        let expected = sse("client");
        for split in 0..=input.len() {
            let mut rewriter = ResponseModelRewriter::new("target/model", "client");
            let mut out = rewriter.push(&input[..split], false);
            assert!(rewriter.held_len() < "\"model\": \"target/model\"".len());
            out.extend(rewriter.push(&input[split..], true));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected),
                "split at {split}"
            );
            assert_eq!(rewriter.held_len(), 0);
        }
    }

    #[test]
    fn sse_one_byte_chunks_and_every_pair_of_splits() {
        let input = sse("t");
        let expected = sse("client-name");
        let mut rewriter = ResponseModelRewriter::new("t", "client-name");
        let mut out = Vec::new();
        for byte in &input {
            out.extend(rewriter.push(std::slice::from_ref(byte), false));
        }
        out.extend(rewriter.push(b"", true));
        assert_eq!(out, expected);

        let input = sse("abc");
        let expected = sse("z");
        for first in 0..=input.len() {
            for second in first..=input.len() {
                let mut rewriter = ResponseModelRewriter::new("abc", "z");
                let mut out = rewriter.push(&input[..first], false);
                out.extend(rewriter.push(&input[first..second], false));
                out.extend(rewriter.push(&input[second..], true));
                assert_eq!(out, expected, "splits {first}, {second}");
            }
        }
    }

    #[test]
    fn bytes_are_never_lost_or_duplicated_without_a_match() {
        // Many near-misses: prefixes of the pattern that never complete.
        let input = br#""model":"ta"model":"t" "mod "model": "tb" "model":"#.to_vec();
        for split in 0..=input.len() {
            let mut rewriter = ResponseModelRewriter::new("tx", "c");
            let mut out = rewriter.push(&input[..split], false);
            out.extend(rewriter.push(&input[split..], true));
            assert_eq!(out, input, "split at {split}");
        }
    }

    #[test]
    fn end_of_stream_flushes_a_held_partial_pattern() {
        let mut rewriter = ResponseModelRewriter::new("target", "c");
        let out = rewriter.push(b"data: {\"model\":\"tar", false);
        assert_eq!(out, b"data: {");
        assert_eq!(rewriter.held_len(), "\"model\":\"tar".len());
        // The stream ends without completing the pattern: everything comes out unchanged.
        assert_eq!(rewriter.push(b"", true), b"\"model\":\"tar");
        assert_eq!(rewriter.held_len(), 0);
    }

    #[test]
    fn names_are_json_escaped() {
        let target = "we\"ird\\name";
        let body = serde_json::to_vec(&serde_json::json!({"model": target})).unwrap();
        let out = rewrite_response_body(&body, target, "cli\"ent");
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["model"], "cli\"ent");
        // Non-ASCII, both raw UTF-8 and \u-escaped spellings.
        let out = rewrite_response_body("{\"model\":\"modèle\"}".as_bytes(), "modèle", "m");
        assert_eq!(out, b"{\"model\":\"m\"}");
        let out = rewrite_response_body(br#"{"model":"mod\u00e8le"}"#, "modèle", "m");
        assert_eq!(out, br#"{"model":"m"}"#);
        let out = rewrite_response_body(br#"{"model":"x"}"#, "x", "é");
        assert_eq!(out, "{\"model\":\"é\"}".as_bytes());
    }
}
