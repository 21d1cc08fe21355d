//! The `flowControl` section and its policy plugins, compiled into the filter's
//! [`FlowControl`] when the `flowControl` feature gate is on (upstream's field names,
//! defaults and quantities: `maxBytes: 1Gi`, `defaultRequestTTL: 30s`).

use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp::flow_control::shortest_job_first_ordering_policy::{self, SjfParams};
use wasm_epp::flow_control::{BandLimits, FlowControl, Ordering};

use super::plugins::{Params, Plugin, Role};
use super::raw::RawOptionalRef;
use super::{ConfigError, Registry};
use crate::duration::parse_duration;

/// `global-strict-fairness-policy`, the only fairness policy (and the default).
pub(crate) const FAIRNESS_POLICY: &str = "global-strict-fairness-policy";
/// `fcfs-ordering-policy`, the default ordering policy.
pub(crate) const ORDERING_POLICY: &str = "fcfs-ordering-policy";
/// `static-usage-limit-policy`, the only usage-limit policy (and the default).
pub(crate) const USAGE_LIMIT_POLICY: &str = "static-usage-limit-policy";

/// Builds a `static-usage-limit-policy` from its parameters (`threshold`, in (0, 1]).
pub(crate) fn usage_limit(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let threshold = params.get::<f64>("threshold")?.unwrap_or(1.0);
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(params.error("threshold", "must be greater than 0 and at most 1"));
    }
    Ok(Plugin::UsageLimit(threshold))
}

/// Builds a `shortest-job-first-ordering-policy` from its parameters (`maxWait`, a duration
/// of at least 1 ms).
pub(crate) fn shortest_job_first(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let mut sjf = SjfParams::default();
    if let Some(value) = params.value("maxWait") {
        let key = "maxWait";
        let text = value
            .as_str()
            .ok_or_else(|| params.error(key, "must be a duration string such as 5s"))?;
        let wait = parse_duration(text).map_err(|e| params.error(key, e))?;
        sjf.max_wait_ms =
            u64::try_from(wait.as_millis()).map_err(|_| params.error(key, "too large"))?;
        if sjf.max_wait_ms == 0 {
            return Err(params.error(key, "must be at least 1ms"));
        }
    }
    Ok(Plugin::Ordering(sjf))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFlowControl {
    max_bytes: Option<Quantity>,
    max_requests: Option<Quantity>,
    #[serde(rename = "defaultRequestTTL")]
    default_request_ttl: Option<String>,
    #[serde(rename = "noEndpointRequestTTL")]
    no_endpoint_request_ttl: Option<String>,
    default_priority_band: Option<RawBand>,
    default_negative_priority_band: Option<RawBand>,
    #[serde(default)]
    priority_bands: Vec<RawBand>,
    usage_limit_policy_plugin_ref: Option<String>,
    saturation_detector: Option<RawOptionalRef>,
    #[serde(default)]
    enable_eviction: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBand {
    priority: Option<i32>,
    max_bytes: Option<Quantity>,
    max_requests: Option<Quantity>,
    fairness_policy_ref: Option<String>,
    ordering_policy_ref: Option<String>,
}

/// A Kubernetes quantity: a number, or a string such as `100`, `1k`, `500M`, `1Gi`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Quantity {
    Number(f64),
    Text(String),
}

impl Quantity {
    fn value(&self, at: &str) -> Result<u64, ConfigError> {
        let invalid = |why: &str| ConfigError::invalid(at, why.to_string());
        let value = match self {
            Quantity::Number(n) => *n,
            Quantity::Text(text) => {
                let text = text.trim();
                let split = text
                    .find(|c: char| c.is_ascii_alphabetic())
                    .unwrap_or(text.len());
                let (number, suffix) = text.split_at(split);
                let multiplier: f64 = match suffix {
                    "" => 1.0,
                    "k" => 1e3,
                    "M" => 1e6,
                    "G" => 1e9,
                    "T" => 1e12,
                    "P" => 1e15,
                    "Ki" => 1024.0,
                    "Mi" => 1024.0 * 1024.0,
                    "Gi" => 1024.0 * 1024.0 * 1024.0,
                    "Ti" => 1024f64.powi(4),
                    "Pi" => 1024f64.powi(5),
                    _ => {
                        return Err(invalid(&format!(
                            "{text:?} is not a quantity (e.g. 100, 1k, 1Gi)"
                        )))
                    }
                };
                let number: f64 = number.parse().map_err(|_| {
                    invalid(&format!("{text:?} is not a quantity (e.g. 100, 1k, 1Gi)"))
                })?;
                number * multiplier
            }
        };
        if !value.is_finite() || value < 0.0 {
            return Err(invalid("must be non-negative"));
        }
        Ok(value.ceil() as u64)
    }
}

/// The parsed section: the saturation detector it names (which applies whether the gate is on
/// or not) and the compiled flow control (gate on only).
pub(super) struct Section {
    pub(super) detector: Option<RawOptionalRef>,
    pub(super) compiled: Option<FlowControl>,
}

/// Compiles `value` (the `flowControl` section); `enabled`: the feature gate is on.
pub(super) fn compile(
    value: &Value,
    enabled: bool,
    registry: &Registry,
    warnings: &mut Vec<String>,
) -> Result<Section, ConfigError> {
    if !matches!(value, Value::Mapping(_) | Value::Null) {
        return Err(ConfigError::invalid("flowControl", "must be a mapping"));
    }
    let raw: Option<RawFlowControl> = serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = e.path().to_string();
        let message = e.into_inner().to_string();
        if message.starts_with("unknown field") {
            path.truncate(path.rfind('.').unwrap_or(0));
        }
        let at = if path.is_empty() || path == "." {
            "flowControl".to_string()
        } else {
            format!("flowControl.{path}")
        };
        ConfigError::invalid(at, message)
    })?;
    let Some(raw) = raw else {
        return Ok(Section {
            detector: None,
            compiled: enabled.then(FlowControl::default),
        });
    };
    let compiled = build(&raw, registry)?;
    let queue_settings = value
        .as_mapping()
        .is_some_and(|map| map.keys().any(|k| k.as_str() != Some("saturationDetector")));
    if !enabled && queue_settings {
        warnings.push(
            "flowControl: only saturationDetector is used; the flowControl feature gate is off"
                .to_string(),
        );
    }
    Ok(Section {
        detector: raw.saturation_detector,
        compiled: enabled.then_some(compiled),
    })
}

fn build(raw: &RawFlowControl, registry: &Registry) -> Result<FlowControl, ConfigError> {
    if raw.enable_eviction {
        return Err(ConfigError::invalid(
            "flowControl.enableEviction",
            "eviction of dispatched requests is not supported by wasm-epp yet",
        ));
    }
    let quantity = |q: &Option<Quantity>, at: &str| -> Result<u64, ConfigError> {
        q.as_ref().map_or(Ok(0), |q| q.value(at))
    };
    let ttl = |text: &Option<String>, at: &str| -> Result<Option<u64>, ConfigError> {
        text.as_deref()
            .map(|t| {
                parse_duration(t)
                    .map(|d| d.as_millis() as u64)
                    .map_err(|e| ConfigError::invalid(at, e.to_string()))
            })
            .transpose()
    };
    let defaults = FlowControl::default();
    let default_ttl = ttl(&raw.default_request_ttl, "flowControl.defaultRequestTTL")?
        .unwrap_or(defaults.default_request_ttl_ms);
    let no_endpoint_ttl = ttl(
        &raw.no_endpoint_request_ttl,
        "flowControl.noEndpointRequestTTL",
    )?
    .unwrap_or(default_ttl);
    let default_band = match &raw.default_priority_band {
        Some(band) => self::band(band, "flowControl.defaultPriorityBand", registry)?,
        None => BandLimits::default(),
    };
    let default_negative_band = match &raw.default_negative_priority_band {
        Some(band) => self::band(band, "flowControl.defaultNegativePriorityBand", registry)?,
        None => default_band,
    };
    let mut priority_bands: Vec<BandLimits> = Vec::new();
    for (i, raw_band) in raw.priority_bands.iter().enumerate() {
        let at = format!("flowControl.priorityBands[{i}]");
        if raw_band.priority.is_none() {
            return Err(ConfigError::invalid(
                format!("{at}.priority"),
                "is required",
            ));
        }
        let band = self::band(raw_band, &at, registry)?;
        if priority_bands.iter().any(|b| b.priority == band.priority) {
            return Err(ConfigError::invalid(
                format!("{at}.priority"),
                format!("duplicate priority level {}", band.priority),
            ));
        }
        priority_bands.push(band);
    }
    let usage_threshold = match raw.usage_limit_policy_plugin_ref.as_deref() {
        None | Some("") => 1.0,
        Some(name) => {
            let at = "flowControl.usageLimitPolicyPluginRef";
            match registry.lookup(name) {
                Some(Plugin::UsageLimit(threshold)) => *threshold,
                Some(_) => {
                    return Err(ConfigError::invalid(
                        at,
                        format!(
                            "plugin {name:?} is not a usage limit policy ({USAGE_LIMIT_POLICY})"
                        ),
                    ))
                }
                None if name == USAGE_LIMIT_POLICY => 1.0,
                None => {
                    return Err(ConfigError::invalid(
                        at,
                        format!("plugin {name:?} not found"),
                    ))
                }
            }
        }
    };
    Ok(FlowControl {
        max_requests: quantity(&raw.max_requests, "flowControl.maxRequests")?,
        max_bytes: quantity(&raw.max_bytes, "flowControl.maxBytes")?,
        default_request_ttl_ms: default_ttl,
        no_endpoint_request_ttl_ms: no_endpoint_ttl,
        priority_bands,
        default_band,
        default_negative_band,
        usage_threshold,
    })
}

/// A band's limits (0 or absent: upstream's defaults, 5,000 requests and 1 GB) after checking
/// its policy references.
fn band(raw: &RawBand, at: &str, registry: &Registry) -> Result<BandLimits, ConfigError> {
    let defaults = BandLimits::default();
    let or_default = |q: &Option<Quantity>, field: &str, default: u64| {
        let value = q
            .as_ref()
            .map_or(Ok(0), |q| q.value(&format!("{at}.{field}")))?;
        Ok::<u64, ConfigError>(if value == 0 { default } else { value })
    };
    let mut ordering = Ordering::Fcfs;
    for (field, reference, role, default) in [
        (
            "fairnessPolicyRef",
            &raw.fairness_policy_ref,
            Role::FairnessPolicy,
            FAIRNESS_POLICY,
        ),
        (
            "orderingPolicyRef",
            &raw.ordering_policy_ref,
            Role::OrderingPolicy,
            ORDERING_POLICY,
        ),
    ] {
        let Some(name) = reference.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        let ordering_field = role == Role::OrderingPolicy;
        match registry.lookup(name) {
            Some(Plugin::Inherent(r)) if *r == role => {}
            Some(Plugin::Ordering(sjf)) if ordering_field => {
                ordering = Ordering::ShortestJobFirst(*sjf);
            }
            Some(_) => {
                let expected = if ordering_field {
                    format!("{default} or {}", shortest_job_first_ordering_policy::TYPE)
                } else {
                    default.to_string()
                };
                return Err(ConfigError::invalid(
                    format!("{at}.{field}"),
                    format!("plugin {name:?} is not a {expected}"),
                ));
            }
            None if name == default => {}
            None if ordering_field && name == shortest_job_first_ordering_policy::TYPE => {
                ordering = Ordering::ShortestJobFirst(SjfParams::default());
            }
            None => {
                return Err(ConfigError::invalid(
                    format!("{at}.{field}"),
                    format!("plugin {name:?} not found"),
                ))
            }
        }
    }
    Ok(BandLimits {
        priority: raw.priority.unwrap_or(0),
        max_requests: or_default(&raw.max_requests, "maxRequests", defaults.max_requests)?,
        max_bytes: or_default(&raw.max_bytes, "maxBytes", defaults.max_bytes)?,
        ordering,
    })
}

#[cfg(test)]
mod tests;
