//! The EndpointPickerConfig file as written: serde's typed view, every unknown field an error.
//! [`super::compile`] turns it into the scheduling profile.

use serde::Deserialize;
use serde_yaml::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawConfig {
    pub(super) api_version: String,
    pub(super) kind: String,
    #[serde(default)]
    pub(super) feature_gates: Vec<String>,
    #[serde(default)]
    pub(super) plugins: Vec<RawPlugin>,
    pub(super) scheduling_profiles: Option<Vec<RawProfile>>,
    pub(super) data_layer: Option<RawDataLayer>,
    pub(super) request_handler: Option<RawRequestHandler>,
    pub(super) saturation_detector: Option<RawOptionalRef>,
    pub(super) parser: Option<RawRef>,
    pub(super) flow_control: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugin {
    pub(super) name: Option<String>,
    #[serde(rename = "type", default)]
    pub(super) plugin_type: String,
    pub(super) parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub(super) name: String,
    #[serde(default)]
    pub(super) plugins: Vec<RawProfilePlugin>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawProfilePlugin {
    pub(super) plugin_ref: String,
    pub(super) weight: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawDataLayer {
    pub(super) inject_defaults: Option<bool>,
    #[serde(default)]
    pub(super) sources: Vec<RawSource>,
    pub(super) discovery: Option<RawRef>,
    pub(super) peer_discovery: Option<Value>,
    pub(super) cross_replica_syncer_plugin_ref: Option<Value>,
    pub(super) cross_replica_sync_interval: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawSource {
    pub(super) plugin_ref: String,
    #[serde(default)]
    pub(super) extractors: Vec<RawRef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawRef {
    pub(super) plugin_ref: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawOptionalRef {
    pub(super) plugin_ref: Option<String>,
}

impl RawOptionalRef {
    /// The reference, unless absent or empty (upstream treats both as the default).
    pub(super) fn name(&self) -> Option<&str> {
        self.plugin_ref.as_deref().filter(|name| !name.is_empty())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestHandler {
    #[serde(default)]
    pub(super) parsers: Vec<RawRef>,
}
