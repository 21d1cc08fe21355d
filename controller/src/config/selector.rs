//! The `label-selector-filter` parameters: a Kubernetes label selector, checked the way
//! Kubernetes checks one (label key and value syntax, operator rules).
//!
//! Upstream decodes the plugin's `parameters` directly as a `metav1.LabelSelector`
//! (`matchLabels`, `matchExpressions`). wasm-epp also accepts the same selector nested under a
//! single `selector:` key.

use std::collections::BTreeMap;

use serde_yaml::{Mapping, Value};
use wasm_epp::scheduler::filters::label_selector_filter::TYPE as PLUGIN_TYPE;
use wasm_epp::scheduler::profile::{
    LabelSelector, LabelSelectorOperator, LabelSelectorRequirement,
};

use super::ConfigError;

/// Parses the selector in `parameters`; `at` is the parameters' path (`plugins[i].parameters`).
/// An empty selector matches every endpoint (as upstream); that is accepted with a warning.
pub(crate) fn parse(
    at: &str,
    parameters: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<LabelSelector, ConfigError> {
    let selector = match mapping(at, parameters)? {
        Some(map) if map.contains_key("selector") => {
            if let Some(other) = map.keys().find(|key| key.as_str() != Some("selector")) {
                return Err(ConfigError::invalid(format!("{at}.{}", key_name(other)), "not allowed next to `selector` (give matchLabels and matchExpressions either directly or under selector)"));
            }
            let nested_at = format!("{at}.selector");
            parse_selector(&nested_at, mapping(&nested_at, map.get("selector"))?, false)?
        }
        map => parse_selector(at, map, true)?,
    };
    if selector.match_labels.is_empty() && selector.match_expressions.is_empty() {
        warnings.push(format!(
            "{at}: empty label selector; the {PLUGIN_TYPE:?} filter keeps every endpoint"
        ));
    }
    Ok(selector)
}

/// `value` as a mapping; null or absent is `None`.
fn mapping<'v>(at: &str, value: Option<&'v Value>) -> Result<Option<&'v Mapping>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Mapping(map)) => Ok(Some(map)),
        Some(_) => Err(ConfigError::invalid(at, "must be a mapping")),
    }
}

fn key_name(key: &Value) -> String {
    match key.as_str() {
        Some(name) => name.to_string(),
        None => format!("{key:?}"),
    }
}

fn parse_selector(
    at: &str,
    map: Option<&Mapping>,
    top_level: bool,
) -> Result<LabelSelector, ConfigError> {
    let mut selector = LabelSelector::default();
    let Some(map) = map else {
        return Ok(selector);
    };
    for (key, value) in map {
        match key.as_str() {
            Some("matchLabels") => {
                selector.match_labels = match_labels(&format!("{at}.matchLabels"), value)?
            }
            Some("matchExpressions") => {
                selector.match_expressions =
                    match_expressions(&format!("{at}.matchExpressions"), value)?
            }
            _ => {
                let known = if top_level {
                    "matchLabels, matchExpressions, selector"
                } else {
                    "matchLabels, matchExpressions"
                };
                return Err(ConfigError::invalid(
                    format!("{at}.{}", key_name(key)),
                    format!("unknown parameter of {PLUGIN_TYPE:?} (known: {known})"),
                ));
            }
        }
    }
    Ok(selector)
}

fn match_labels(at: &str, value: &Value) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut labels = BTreeMap::new();
    let Some(map) = mapping(at, Some(value))? else {
        return Ok(labels);
    };
    for (key, value) in map {
        let Some(key) = key.as_str() else {
            return Err(ConfigError::invalid(at, "label keys must be strings"));
        };
        let field = format!("{at}[{key:?}]");
        check_key(&field, key)?;
        let Some(value) = value.as_str() else {
            return Err(ConfigError::invalid(
                field,
                "the label value must be a string",
            ));
        };
        check_value(&field, value)?;
        labels.insert(key.to_string(), value.to_string());
    }
    Ok(labels)
}

fn match_expressions(
    at: &str,
    value: &Value,
) -> Result<Vec<LabelSelectorRequirement>, ConfigError> {
    let list = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Sequence(list) => list,
        _ => return Err(ConfigError::invalid(at, "must be a list")),
    };
    list.iter()
        .enumerate()
        .map(|(k, entry)| requirement(&format!("{at}[{k}]"), entry))
        .collect()
}

fn requirement(at: &str, entry: &Value) -> Result<LabelSelectorRequirement, ConfigError> {
    let Some(map) = mapping(at, Some(entry))? else {
        return Err(ConfigError::invalid(
            at,
            "must be a mapping with key and operator",
        ));
    };
    for field in map.keys() {
        if !matches!(field.as_str(), Some("key" | "operator" | "values")) {
            return Err(ConfigError::invalid(
                format!("{at}.{}", key_name(field)),
                "unknown field (known: key, operator, values)",
            ));
        }
    }
    let key = match map.get("key") {
        None | Some(Value::Null) => {
            return Err(ConfigError::invalid(format!("{at}.key"), "required"))
        }
        Some(Value::String(key)) => key.clone(),
        Some(_) => {
            return Err(ConfigError::invalid(
                format!("{at}.key"),
                "must be a string",
            ))
        }
    };
    check_key(&format!("{at}.key"), &key)?;
    let operator = match map.get("operator") {
        None | Some(Value::Null) => {
            return Err(ConfigError::invalid(format!("{at}.operator"), "required"))
        }
        Some(Value::String(op)) => match op.as_str() {
            "In" => LabelSelectorOperator::In,
            "NotIn" => LabelSelectorOperator::NotIn,
            "Exists" => LabelSelectorOperator::Exists,
            "DoesNotExist" => LabelSelectorOperator::DoesNotExist,
            other => {
                return Err(ConfigError::invalid(
                    format!("{at}.operator"),
                    format!(
                        "unknown operator {other:?} (expected In, NotIn, Exists or DoesNotExist)"
                    ),
                ))
            }
        },
        Some(_) => {
            return Err(ConfigError::invalid(
                format!("{at}.operator"),
                "must be a string",
            ))
        }
    };
    let values_at = format!("{at}.values");
    let values: Vec<String> = match map.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Sequence(list)) => list
            .iter()
            .enumerate()
            .map(|(v, value)| {
                let field = format!("{values_at}[{v}]");
                let Some(value) = value.as_str() else {
                    return Err(ConfigError::invalid(field, "must be a string"));
                };
                check_value(&field, value)?;
                Ok(value.to_string())
            })
            .collect::<Result<_, ConfigError>>()?,
        Some(_) => return Err(ConfigError::invalid(values_at, "must be a list of strings")),
    };
    match operator {
        LabelSelectorOperator::In | LabelSelectorOperator::NotIn if values.is_empty() => {
            return Err(ConfigError::invalid(
                values_at,
                format!("must not be empty for operator {operator:?}"),
            ))
        }
        LabelSelectorOperator::Exists | LabelSelectorOperator::DoesNotExist
            if !values.is_empty() =>
        {
            return Err(ConfigError::invalid(
                values_at,
                format!("must be empty for operator {operator:?}"),
            ))
        }
        _ => {}
    }
    Ok(LabelSelectorRequirement {
        key,
        operator,
        values,
    })
}

/// A Kubernetes label key: `[prefix/]name`, the prefix a DNS subdomain of at most 253
/// characters, the name at most 63 characters of `[A-Za-z0-9_.-]` starting and ending with a
/// letter or digit.
fn check_key(at: &str, key: &str) -> Result<(), ConfigError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let problem = if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix) {
            Some("the prefix before '/' must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)")
        } else {
            name_problem(name)
        }
    } else {
        name_problem(name)
    };
    match problem {
        Some(problem) => Err(ConfigError::invalid(
            at,
            format!("invalid label key {key:?}: {problem}"),
        )),
        None => Ok(()),
    }
}

fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("the name must not be empty")
    } else if !is_label_token(name) {
        Some("the name must be at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
    } else {
        None
    }
}

/// A Kubernetes label value: empty, or a name as in [`check_key`].
fn check_value(at: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || is_label_token(value) {
        Ok(())
    } else {
        Err(ConfigError::invalid(at, format!("invalid label value {value:?}: must be empty or at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit")))
    }
}

fn is_label_token(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(text: &str) -> bool {
    text.split('.').all(|part| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && is_lower_alnum(bytes[0])
            && is_lower_alnum(bytes[bytes.len() - 1])
            && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
    })
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_yaml(parameters: &str) -> Result<(LabelSelector, Vec<String>), ConfigError> {
        let value: Value = serde_yaml::from_str(parameters).unwrap();
        let mut warnings = Vec::new();
        parse("plugins[0].parameters", Some(&value), &mut warnings).map(|s| (s, warnings))
    }

    fn requirement(
        key: &str,
        operator: LabelSelectorOperator,
        values: &[&str],
    ) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_string(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn direct_and_nested_forms_give_the_same_selector() {
        let direct = "matchLabels: {llm-d.ai/role: decode, tier: ''}\n\
                      matchExpressions:\n\
                      - {key: zone, operator: In, values: [a, b]}\n\
                      - {key: gpu, operator: NotIn, values: [t4]}\n\
                      - {key: ready, operator: Exists}\n\
                      - {key: draining, operator: DoesNotExist, values: []}\n";
        let nested = format!(
            "selector:\n{}",
            direct
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        let (selector, warnings) = parse_yaml(direct).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(
            selector.match_labels,
            BTreeMap::from([
                ("llm-d.ai/role".to_string(), "decode".to_string()),
                ("tier".to_string(), String::new()),
            ])
        );
        assert_eq!(
            selector.match_expressions,
            [
                requirement("zone", LabelSelectorOperator::In, &["a", "b"]),
                requirement("gpu", LabelSelectorOperator::NotIn, &["t4"]),
                requirement("ready", LabelSelectorOperator::Exists, &[]),
                requirement("draining", LabelSelectorOperator::DoesNotExist, &[]),
            ]
        );
        assert_eq!(parse_yaml(&nested).unwrap().0, selector);
    }

    #[test]
    fn an_empty_selector_matches_everything_with_a_warning() {
        for parameters in [
            "{}",
            "~",
            "selector: {}",
            "matchLabels: {}\nmatchExpressions: []",
        ] {
            let (selector, warnings) = parse_yaml(parameters).unwrap();
            assert_eq!(selector, LabelSelector::default());
            assert_eq!(warnings.len(), 1, "{parameters}");
            assert!(warnings[0].starts_with("plugins[0].parameters: empty label selector"));
        }
    }

    #[test]
    fn errors_name_the_field() {
        let at = "plugins[0].parameters";
        for (parameters, expected) in [
            ("[a]", format!("{at}: must be a mapping")),
            ("{matchLables: {a: b}}", format!("{at}.matchLables: unknown parameter of \"label-selector-filter\"")),
            ("{selector: {matchLabels: {a: b}}, matchLabels: {c: d}}", format!("{at}.matchLabels: not allowed next to `selector`")),
            ("{selector: {selector: {}}}", format!("{at}.selector.selector: unknown parameter")),
            ("{selector: [a]}", format!("{at}.selector: must be a mapping")),
            ("{matchLabels: {a: 1}}", format!("{at}.matchLabels[\"a\"]: the label value must be a string")),
            ("{matchLabels: {'-a': b}}", format!("{at}.matchLabels[\"-a\"]: invalid label key \"-a\"")),
            ("{matchLabels: {'Example.com/a': b}}", format!("{at}.matchLabels[\"Example.com/a\"]: invalid label key")),
            ("{matchLabels: {'a/b/c': b}}", format!("{at}.matchLabels[\"a/b/c\"]: invalid label key")),
            ("{matchLabels: {a: 'b c'}}", format!("{at}.matchLabels[\"a\"]: invalid label value \"b c\"")),
            ("{matchExpressions: {key: a}}", format!("{at}.matchExpressions: must be a list")),
            ("{matchExpressions: [a]}", format!("{at}.matchExpressions[0]: must be a mapping")),
            ("{matchExpressions: [{operator: Exists}]}", format!("{at}.matchExpressions[0].key: required")),
            ("{matchExpressions: [{key: a}]}", format!("{at}.matchExpressions[0].operator: required")),
            ("{matchExpressions: [{key: a, operator: Exists}, {key: b, operator: in, values: [x]}]}", format!("{at}.matchExpressions[1].operator: unknown operator \"in\"")),
            ("{matchExpressions: [{key: a, operator: In}]}", format!("{at}.matchExpressions[0].values: must not be empty for operator In")),
            ("{matchExpressions: [{key: a, operator: NotIn, values: []}]}", format!("{at}.matchExpressions[0].values: must not be empty for operator NotIn")),
            ("{matchExpressions: [{key: a, operator: Exists, values: [x]}]}", format!("{at}.matchExpressions[0].values: must be empty for operator Exists")),
            ("{matchExpressions: [{key: a, operator: DoesNotExist, values: [x]}]}", format!("{at}.matchExpressions[0].values: must be empty for operator DoesNotExist")),
            ("{matchExpressions: [{key: a, operator: In, values: x}]}", format!("{at}.matchExpressions[0].values: must be a list of strings")),
            ("{matchExpressions: [{key: a, operator: In, values: [ok, 'not ok']}]}", format!("{at}.matchExpressions[0].values[1]: invalid label value")),
            ("{matchExpressions: [{key: a, operator: In, values: [x], value: y}]}", format!("{at}.matchExpressions[0].value: unknown field")),
            ("{matchExpressions: [{key: '', operator: Exists}]}", format!("{at}.matchExpressions[0].key: invalid label key \"\"")),
        ] {
            let err = parse_yaml(parameters).unwrap_err().to_string();
            assert!(err.starts_with(&expected), "{parameters}\n  gave: {err}\n  want: {expected}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn label_key_syntax() {
        for good in ["a", "A.b-c_d", "llm-d.ai/role", "x.y/z", &"k".repeat(63)] {
            assert_eq!(check_key("k", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "-a",
            "a-",
            "a b",
            "UP.com/a",
            "a..b/c",
            &"k".repeat(64),
        ] {
            assert!(check_key("k", bad).is_err(), "{bad}");
        }
    }
}
