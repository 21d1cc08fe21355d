//! A parser for the Prometheus text exposition format (version 0.0.4).
//!
//! Handles metric names, label sets (with `\\`, `\"` and `\n` escapes), values including `NaN`
//! and `±Inf`, optional millisecond timestamps, comments (`# HELP`, `# TYPE`, `# EOF`) and blank
//! lines. A malformed sample line makes the whole exposition invalid, as it does for Prometheus.
//!
//! Kept in the tree rather than taken from a crate because it runs on every scrape of every
//! endpoint: samples borrow from the page (no copy of names or label values unless escaped), and
//! the scrape loop reads only the few families an engine needs.

use std::borrow::Cow;
use std::fmt;

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// The metric name, e.g. `vllm:num_requests_waiting`.
    pub name: &'a str,
    /// Label pairs in the order written; values are unescaped.
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    /// The sample value.
    pub value: f64,
    /// Optional timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: Option<i64>,
}

impl Sample<'_> {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| *label == name)
            .map(|(_, value)| value.as_ref())
    }
}

/// Why an exposition could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with that line.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses a whole exposition into its samples, in order.
pub fn parse(text: &str) -> Result<Vec<Sample<'_>>, ParseError> {
    let mut samples = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = parse_line(line).map_err(|message| ParseError {
            line: index + 1,
            message,
        })?;
        samples.push(sample);
    }
    Ok(samples)
}

/// Parses one non-comment line.
fn parse_line(line: &str) -> Result<Sample<'_>, String> {
    let mut cursor = Cursor { rest: line };
    let name = cursor.take_name();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("invalid metric name at {:?}", truncate(line)));
    }
    cursor.skip_spaces();
    let labels = if cursor.eat('{') {
        parse_labels(&mut cursor)?
    } else {
        Vec::new()
    };
    cursor.skip_spaces();
    let value_text = cursor.take_token();
    if value_text.is_empty() {
        return Err(format!("missing value for {name}"));
    }
    let value = parse_value(value_text)
        .ok_or_else(|| format!("invalid value {value_text:?} for {name}"))?;
    cursor.skip_spaces();
    let timestamp_text = cursor.take_token();
    let timestamp_ms = if timestamp_text.is_empty() {
        None
    } else {
        Some(
            timestamp_text
                .parse::<i64>()
                .map_err(|_| format!("invalid timestamp {timestamp_text:?} for {name}"))?,
        )
    };
    cursor.skip_spaces();
    if !cursor.rest.is_empty() {
        return Err(format!(
            "unexpected text {:?} after the sample of {name}",
            truncate(cursor.rest)
        ));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses `name="value", ...}` after the opening brace.
fn parse_labels<'a>(cursor: &mut Cursor<'a>) -> Result<Vec<(&'a str, Cow<'a, str>)>, String> {
    let mut labels = Vec::new();
    loop {
        cursor.skip_spaces();
        if cursor.eat('}') {
            return Ok(labels);
        }
        let name = cursor.take_name();
        if name.is_empty() {
            return Err(format!("invalid label name at {:?}", truncate(cursor.rest)));
        }
        cursor.skip_spaces();
        if !cursor.eat('=') {
            return Err(format!("expected '=' after label {name}"));
        }
        cursor.skip_spaces();
        if !cursor.eat('"') {
            return Err(format!("expected '\"' to open the value of label {name}"));
        }
        let value = cursor
            .take_quoted()
            .ok_or_else(|| format!("unterminated value of label {name}"))?;
        labels.push((name, value));
        cursor.skip_spaces();
        if cursor.eat(',') {
            continue;
        }
        if cursor.eat('}') {
            return Ok(labels);
        }
        return Err(format!("expected ',' or '}}' after label {name}"));
    }
}

/// Parses a sample value: a float, `NaN`, `+Inf` or `-Inf` (any case, as Prometheus accepts).
fn parse_value(text: &str) -> Option<f64> {
    // Rust's float syntax covers Prometheus's: case-insensitive `nan`, `inf`, `infinity`, signs.
    text.parse::<f64>().ok()
}

/// Shortens text quoted in error messages.
fn truncate(text: &str) -> &str {
    match text.char_indices().nth(40) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// A position in one line.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_spaces(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    /// Consumes `c` if it comes next.
    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// Takes `[A-Za-z0-9_:]*` (callers reject an empty or digit-led name).
    fn take_name(&mut self) -> &'a str {
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(self.rest.len());
        let (name, rest) = self.rest.split_at(end);
        self.rest = rest;
        name
    }

    /// Takes characters up to the next space or tab.
    fn take_token(&mut self) -> &'a str {
        let end = self.rest.find([' ', '\t']).unwrap_or(self.rest.len());
        let (token, rest) = self.rest.split_at(end);
        self.rest = rest;
        token
    }

    /// Takes a label value after its opening quote, through the closing quote, unescaping.
    fn take_quoted(&mut self) -> Option<Cow<'a, str>> {
        let text = self.rest;
        let mut unescaped: Option<String> = None;
        let mut chars = text.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &text[i + 1..];
                    return Some(match unescaped {
                        Some(owned) => Cow::Owned(owned),
                        None => Cow::Borrowed(&text[..i]),
                    });
                }
                '\\' => {
                    let owned = unescaped.get_or_insert_with(|| text[..i].to_string());
                    match chars.next()?.1 {
                        'n' => owned.push('\n'),
                        // `\\`, `\"` and, leniently, any other escaped character stand for
                        // themselves.
                        other => owned.push(other),
                    }
                }
                other => {
                    if let Some(owned) = unescaped.as_mut() {
                        owned.push(other);
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_labels_values_and_timestamps() {
        let text = "# HELP vllm:num_requests_waiting Waiting requests.\n\
                    # TYPE vllm:num_requests_waiting gauge\n\
                    vllm:num_requests_waiting{model_name=\"llama\",engine=\"0\"} 3.0\n\
                    \n\
                    plain_total 42 1700000000123\n\
                    spaced { a = \"1\" , b=\"2\", } -1.5e3\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].name, "vllm:num_requests_waiting");
        assert_eq!(samples[0].label("model_name"), Some("llama"));
        assert_eq!(samples[0].label("engine"), Some("0"));
        assert_eq!(samples[0].label("missing"), None);
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[0].timestamp_ms, None);
        assert_eq!(samples[1].name, "plain_total");
        assert!(samples[1].labels.is_empty());
        assert_eq!(samples[1].timestamp_ms, Some(1_700_000_000_123));
        assert_eq!(samples[2].label("a"), Some("1"));
        assert_eq!(samples[2].label("b"), Some("2"));
        assert_eq!(samples[2].value, -1500.0);
    }

    #[test]
    fn unescapes_label_values() {
        let text = r#"m{path="C:\\dir",quote="say \"hi\"",nl="a\nb",brace="}"} 1"#;
        let samples = parse(text).unwrap();
        assert_eq!(samples[0].label("path"), Some(r"C:\dir"));
        assert_eq!(samples[0].label("quote"), Some(r#"say "hi""#));
        assert_eq!(samples[0].label("nl"), Some("a\nb"));
        assert_eq!(samples[0].label("brace"), Some("}"));
    }

    #[test]
    fn parses_special_values() {
        let samples = parse("a NaN\nb +Inf\nc -Inf\nd 1e-3\n").unwrap();
        assert!(samples[0].value.is_nan());
        assert_eq!(samples[1].value, f64::INFINITY);
        assert_eq!(samples[2].value, f64::NEG_INFINITY);
        assert_eq!(samples[3].value, 0.001);
    }

    #[test]
    fn accepts_empty_and_comment_only_text() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# EOF\n").unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_lines_with_their_number() {
        for (text, line) in [
            ("ok 1\nbroken{a=\"1\" 2\n", 2),
            ("m{a=\"unterminated} 1\n", 1),
            ("m 1 2 3\n", 1),
            ("m notanumber\n", 1),
            ("m\n", 1),
            ("9m 1\n", 1),
            ("m{a=1} 1\n", 1),
            ("m 1 12.5\n", 1),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err}");
        }
    }
}
