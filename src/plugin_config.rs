//! The Proxy-Wasm plugin configuration (the JSON string in Envoy's `configuration`).
//!
//! One module serves two roles: the HTTP filter (`"role": "filter"`, the default) and the
//! snapshot poller (`"role": "poller"`), run once per Envoy process as a bootstrap singleton
//! with the filter's `vm_id`, so both see the same shared data.

use serde::Deserialize;

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
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            fail_open: false,
            explain_decisions: false,
            prefix_index_buckets: 16_384,
        }
    }
}

/// Settings of the snapshot poller.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
}

impl Default for PollerConfig {
    fn default() -> Self {
        PollerConfig {
            controller_cluster: "wasm_epp_controller".to_string(),
            controller_authority: "wasm-epp-controller".to_string(),
            snapshot_path: "/v1/snapshot".to_string(),
            long_poll_ms: 25_000,
            retry_ms: 250,
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
            Role::Filter => serde_json::from_value(value).map(PluginConfig::Filter),
            Role::Poller => serde_json::from_value(value).map(PluginConfig::Poller),
        };
        result.map_err(|e| format!("plugin configuration: {e}"))
    }
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
}
