//! The Proxy-Wasm plugin configuration (the JSON string in Envoy's `configuration`).
//!
//! One module serves two roles: the HTTP filter (`"role": "filter"`, the default) and the
//! snapshot poller (`"role": "poller"`), run once per Envoy process as a bootstrap singleton
//! with the filter's `vm_id`, so both see the same shared data.
//!
//! Where no bootstrap singleton can be configured (Envoy Gateway renders each
//! EnvoyExtensionPolicy Wasm entry as an HTTP filter only), the filter configuration itself may
//! carry the poller's keys (`controllerCluster`, and optionally `controllerAuthority`,
//! `snapshotPath`, `longPollMs`, `retryMs`): every worker's filter then competes for a lease in
//! shared data and only the holder polls (see [`crate::lease`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A parsed plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginConfig {
    /// The per-request picker.
    Filter(FilterConfig),
    /// The snapshot poller.
    Poller(PollerConfig),
}

/// Settings of the HTTP filter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FilterConfig {
    /// With no snapshot yet: `false` (default, fail-close) answers 503; `true` (fail-open) lets
    /// the request continue without a destination, to whatever the route does without one.
    pub fail_open: bool,
    /// Add a response header explaining the pick (chosen endpoint, top candidates with
    /// per-scorer scores).
    pub explain_decisions: bool,
    /// Buckets of the shared prefix index (each holds up to 8 blocks); bounds its memory.
    pub prefix_index_buckets: u32,
    /// Emit the request metrics (`llm_d_epp_request_*`, see [`crate::request_metrics`]).
    pub request_metrics: bool,
    /// Filter-side polling: present when the configuration names `controllerCluster` (the
    /// poller's keys sit in the same JSON object). Absent, the snapshot comes from a bootstrap
    /// poller.
    #[serde(skip)]
    pub controller: Option<PollerConfig>,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            fail_open: false,
            explain_decisions: false,
            prefix_index_buckets: 16_384,
            request_metrics: true,
            controller: None,
        }
    }
}

/// Settings of the snapshot poller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PollerConfig {
    /// The Envoy cluster that reaches the controller's snapshot API.
    pub controller_cluster: String,
    /// `:authority` sent to the controller.
    pub controller_authority: String,
    /// Path of the snapshot API.
    pub snapshot_path: String,
    /// How long the controller may hold a long-poll, in milliseconds.
    pub long_poll_ms: u64,
    /// Delay before retrying after a failed poll, in milliseconds.
    pub retry_ms: u64,
    /// Path of the controller's prefix-record exchange between Envoy replicas.
    pub records_path: String,
    /// Whether this Envoy shares prefix records with the other replicas (while the controller
    /// says there are others); `false` keeps each replica's index to its own traffic.
    pub share_prefix_records: bool,
}

impl Default for PollerConfig {
    fn default() -> Self {
        PollerConfig {
            controller_cluster: "wasm_epp_controller".to_string(),
            controller_authority: "wasm-epp-controller".to_string(),
            snapshot_path: "/v1/snapshot".to_string(),
            long_poll_ms: 25_000,
            retry_ms: 250,
            records_path: "/v1/prefix-records".to_string(),
            share_prefix_records: true,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    Filter,
    Poller,
}

impl PluginConfig {
    /// Parses the configuration; empty means the default filter.
    pub fn parse(bytes: &[u8]) -> Result<PluginConfig, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(PluginConfig::Filter(FilterConfig::default()));
        }
        let mut value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("plugin configuration: {e}"))?;
        let role = match value.as_object_mut().and_then(|m| m.remove("role")) {
            None => Role::Filter,
            Some(role) => serde_json::from_value(role)
                .map_err(|e| format!("plugin configuration: role: {e}"))?,
        };
        let result = match role {
            Role::Filter => {
                let controller = take_controller(&mut value)?;
                serde_json::from_value(value).map(|config| {
                    PluginConfig::Filter(FilterConfig {
                        controller,
                        ..config
                    })
                })
            }
            Role::Poller => serde_json::from_value(value).map(PluginConfig::Poller),
        };
        result.map_err(|e| format!("plugin configuration: {e}"))
    }
}

/// Moves the poller's keys out of a filter configuration object and parses them: `None` when
/// there are none, an error naming the keys when `controllerCluster` is not among them.
fn take_controller(value: &mut Value) -> Result<Option<PollerConfig>, String> {
    let Some(object) = value.as_object_mut() else {
        return Ok(None);
    };
    let names = match serde_json::to_value(PollerConfig::default()) {
        Ok(Value::Object(defaults)) => defaults.into_iter().map(|(name, _)| name),
        _ => return Err("plugin configuration: poller keys unavailable".to_string()),
    };
    let keys: Map<String, Value> = names
        .filter_map(|name| object.remove(&name).map(|v| (name, v)))
        .collect();
    if keys.is_empty() {
        return Ok(None);
    }
    if !keys.contains_key("controllerCluster") {
        let named: Vec<&str> = keys.keys().map(String::as_str).collect();
        return Err(format!(
            "plugin configuration: {} needs controllerCluster (filter-side polling)",
            named.join(", ")
        ));
    }
    serde_json::from_value(Value::Object(keys))
        .map(Some)
        .map_err(|e| format!("plugin configuration: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn roles_and_defaults() {
        assert_eq!(
            PluginConfig::parse(b"").unwrap(),
            PluginConfig::Filter(FilterConfig::default())
        );
        assert_eq!(
            PluginConfig::parse(br#"{"failOpen": true, "explainDecisions": true}"#).unwrap(),
            PluginConfig::Filter(FilterConfig {
                fail_open: true,
                explain_decisions: true,
                ..FilterConfig::default()
            })
        );
        let PluginConfig::Poller(p) =
            PluginConfig::parse(br#"{"role":"poller","longPollMs":1000}"#).unwrap()
        else {
            panic!("expected poller")
        };
        assert_eq!(p.long_poll_ms, 1000);
        assert_eq!(p.controller_cluster, "wasm_epp_controller");
    }

    #[test]
    fn mistakes_are_named() {
        let e = PluginConfig::parse(br#"{"failopen": true}"#).unwrap_err();
        assert!(e.contains("failopen"), "{e}");
        let e = PluginConfig::parse(br#"{"role":"feeder"}"#).unwrap_err();
        assert!(e.contains("role"), "{e}");
        assert!(PluginConfig::parse(b"{").is_err());
        assert!(PluginConfig::parse(br#"{"role":"poller","failOpen":true}"#).is_err());
    }

    #[test]
    fn a_filter_with_a_controller_cluster_polls_itself() {
        let PluginConfig::Filter(f) = PluginConfig::parse(
            br#"{"failOpen": true, "controllerCluster": "ctl", "longPollMs": 5000}"#,
        )
        .unwrap() else {
            panic!("expected filter")
        };
        assert!(f.fail_open);
        assert_eq!(
            f.controller,
            Some(PollerConfig {
                controller_cluster: "ctl".to_string(),
                long_poll_ms: 5000,
                ..PollerConfig::default()
            })
        );
        let PluginConfig::Filter(f) = PluginConfig::parse(br#"{"failOpen": true}"#).unwrap() else {
            panic!("expected filter")
        };
        assert_eq!(f.controller, None);
    }

    #[test]
    fn poller_keys_in_a_filter_need_the_cluster_and_valid_values() {
        let e = PluginConfig::parse(br#"{"retryMs": 100, "snapshotPath": "/x"}"#).unwrap_err();
        assert!(e.contains("retryMs") && e.contains("snapshotPath"), "{e}");
        assert!(e.contains("needs controllerCluster"), "{e}");
        let e = PluginConfig::parse(br#"{"controllerCluster": "c", "longPollMs": "soon"}"#)
            .unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = PluginConfig::parse(br#"{"controllerCluster": "c", "longpollms": 1}"#).unwrap_err();
        assert!(e.contains("longpollms"), "{e}");
    }
}
