//! The upstream `EndpointPickerConfig` file, compiled into the scheduling [`Profile`] the
//! snapshot carries and the discovery settings.
//!
//! Decoding is strict (unknown fields are rejected) and every error names the field it is
//! about, e.g. `schedulingProfiles[0].plugins[1].pluginRef: no plugin named "foo"`.

mod plugins;
pub mod reload;
mod selector;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp::scheduler::profile::{
    FilterSpec, PickerSpec, PrefixCacheParams, Profile, ScorerSpec, UtilizationParams,
    WeightedScorer,
};

use crate::discovery::Source;
use crate::engines::Engines;
use plugins::{Plugin, Role};

/// The current config `apiVersion`.
pub const API_VERSION: &str = "llm-d.ai/v1alpha1";
/// The deprecated `apiVersion`, still accepted.
pub const DEPRECATED_API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
/// The only accepted `kind`.
pub const KIND: &str = "EndpointPickerConfig";

/// Largest config file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A compiled config.
#[derive(Debug, Clone, PartialEq)]
pub struct PickerConfig {
    /// The scheduling profile.
    pub profile: Profile,
    /// `dataLayer.discovery`, when set.
    pub discovery: Option<Source>,
    /// The engines' metric names (`core-metrics-extractor`'s `engineConfigs`).
    pub engines: Engines,
    /// Things accepted but worth telling the user (ignored settings, deprecated names).
    pub warnings: Vec<String>,
}

impl Default for PickerConfig {
    /// No config file: the upstream default profile and no discovery.
    fn default() -> Self {
        PickerConfig {
            profile: Profile::default(),
            discovery: None,
            engines: Engines::default(),
            warnings: Vec::new(),
        }
    }
}

/// Reads and compiles a config file.
pub fn load(path: &Path) -> Result<PickerConfig, String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read: {e}"))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(format!("file is larger than {MAX_FILE_BYTES} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    parse(&text)
}

/// Compiles config text (YAML or JSON).
pub fn parse(text: &str) -> Result<PickerConfig, String> {
    let raw: RawConfig = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    compile(raw)
}

/// A one-line summary for the startup log:
/// `profile "default": filters decode-filter; queue-scorer×2, …; max-score-picker(1)`
/// (the filters part only when there are filters).
pub fn profile_summary(profile: &Profile) -> String {
    let scorers: Vec<String> = profile
        .scorers
        .iter()
        .map(|s| format!("{}×{}", s.name, s.weight))
        .collect();
    let picker = match &profile.picker {
        PickerSpec::MaxScore {
            max_num_of_endpoints,
        } => format!("max-score-picker({max_num_of_endpoints})"),
        PickerSpec::WeightedRandom {
            max_num_of_endpoints,
        } => format!("weighted-random-picker({max_num_of_endpoints})"),
        PickerSpec::Random {
            max_num_of_endpoints,
        } => format!("random-picker({max_num_of_endpoints})"),
    };
    let filters = if profile.filters.is_empty() {
        String::new()
    } else {
        let types: Vec<&str> = profile.filters.iter().map(filter_type).collect();
        format!("filters {}; ", types.join(", "))
    };
    format!(
        "profile {:?}: {filters}{}; {picker}",
        profile.name,
        if scorers.is_empty() {
            "no scorers".to_string()
        } else {
            scorers.join(", ")
        }
    )
}

/// The upstream `type` of a filter.
fn filter_type(filter: &FilterSpec) -> &'static str {
    match filter {
        FilterSpec::LabelSelector(_) => "label-selector-filter",
        FilterSpec::UtilizationDetector(_) => "utilization-detector",
        FilterSpec::Decode => "decode-filter",
        FilterSpec::Prefill => "prefill-filter",
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    feature_gates: Vec<String>,
    #[serde(default)]
    plugins: Vec<RawPlugin>,
    scheduling_profiles: Option<Vec<RawProfile>>,
    data_layer: Option<RawDataLayer>,
    request_handler: Option<RawRequestHandler>,
    saturation_detector: Option<RawOptionalRef>,
    parser: Option<RawRef>,
    flow_control: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    name: Option<String>,
    #[serde(rename = "type", default)]
    plugin_type: String,
    parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: String,
    #[serde(default)]
    plugins: Vec<RawProfilePlugin>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProfilePlugin {
    plugin_ref: String,
    weight: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDataLayer {
    inject_defaults: Option<bool>,
    #[serde(default)]
    sources: Vec<RawSource>,
    discovery: Option<RawRef>,
    peer_discovery: Option<Value>,
    cross_replica_syncer_plugin_ref: Option<Value>,
    cross_replica_sync_interval: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSource {
    plugin_ref: String,
    #[serde(default)]
    extractors: Vec<RawRef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRef {
    plugin_ref: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOptionalRef {
    plugin_ref: Option<String>,
}

impl RawOptionalRef {
    /// The reference, unless absent or empty (upstream treats both as the default).
    fn name(&self) -> Option<&str> {
        self.plugin_ref.as_deref().filter(|name| !name.is_empty())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestHandler {
    #[serde(default)]
    parsers: Vec<RawRef>,
}

/// A configured plugin instance.
struct Named {
    /// Index in `plugins`, for error paths.
    index: usize,
    name: String,
    plugin_type: String,
    plugin: Plugin,
}

/// The configured plugins by name.
struct Registry {
    plugins: Vec<Named>,
    by_name: HashMap<String, usize>,
}

impl Registry {
    /// Builds every plugin, checks names, and completes prefix scorers with the producer's
    /// parameters.
    fn build(raw: Vec<RawPlugin>, warnings: &mut Vec<String>) -> Result<Registry, String> {
        let mut registry = Registry {
            plugins: Vec::with_capacity(raw.len()),
            by_name: HashMap::new(),
        };
        for (index, entry) in raw.into_iter().enumerate() {
            let at = format!("plugins[{index}]");
            let plugin =
                plugins::build(&at, &entry.plugin_type, entry.parameters.as_ref(), warnings)?;
            let name = entry
                .name
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| entry.plugin_type.clone());
            if registry.by_name.contains_key(&name) {
                return Err(format!("{at}.name: duplicate plugin name {name:?}"));
            }
            registry.by_name.insert(name.clone(), index);
            registry.plugins.push(Named {
                index,
                name,
                plugin_type: entry.plugin_type,
                plugin,
            });
        }
        registry.apply_prefix_producer()?;
        Ok(registry)
    }

    /// Merges the `approx-prefix-cache-producer` parameters (defaults when none is configured)
    /// into every `prefix-cache-scorer`, checking `prefixMatchInfoProducerName`.
    fn apply_prefix_producer(&mut self) -> Result<(), String> {
        let mut producers = self.plugins.iter().filter_map(|named| match &named.plugin {
            Plugin::PrefixProducer(params) => Some((named, params)),
            _ => None,
        });
        let producer = producers.next();
        if let Some((second, _)) = producers.next() {
            return Err(format!(
                "plugins[{}].type: only one approx-prefix-cache-producer is supported",
                second.index
            ));
        }
        let producer_name = producer.map(|(named, _)| named.name.clone());
        let producer_params = producer
            .map(|(_, params)| params.clone())
            .unwrap_or_default();
        for named in &mut self.plugins {
            let Plugin::Scorer {
                spec: ScorerSpec::PrefixCache(params),
                producer,
            } = &mut named.plugin
            else {
                continue;
            };
            if let Some(wanted) = producer {
                if producer_name.as_deref() != Some(wanted.as_str()) {
                    return Err(format!(
                        "plugins[{}].parameters.prefixMatchInfoProducerName: no approx-prefix-cache-producer named {wanted:?}",
                        named.index
                    ));
                }
            }
            *params = PrefixCacheParams {
                auto_tune: producer_params.auto_tune,
                block_size_tokens: producer_params.block_size_tokens,
                max_prefix_tokens_to_match: producer_params.max_prefix_tokens_to_match,
                ..params.clone()
            };
        }
        Ok(())
    }

    /// The plugin named `name`; `at` is the referencing field.
    fn resolve(&self, at: &str, name: &str) -> Result<&Named, String> {
        self.by_name
            .get(name)
            .map(|&index| &self.plugins[index])
            .ok_or_else(|| format!("{at}: no plugin named {name:?}"))
    }

    /// The plugin named `name`, which must be a `utilization-detector`; `at` is the referencing
    /// field.
    fn resolve_detector(
        &self,
        at: &str,
        name: &str,
    ) -> Result<(&Named, &UtilizationParams), String> {
        let named = self.resolve(at, name)?;
        match &named.plugin {
            Plugin::Detector(params) => Ok((named, params)),
            _ => Err(format!(
                "{at}: plugin {name:?} has type {:?}; expected a saturation detector (utilization-detector)",
                named.plugin_type
            )),
        }
    }

    /// The engines of the plugin named `name`, which must be a `core-metrics-extractor`.
    fn resolve_extractor(&self, at: &str, name: &str) -> Result<&Engines, String> {
        let named = self.resolve(at, name)?;
        match &named.plugin {
            Plugin::Extractor(engines) => Ok(engines),
            _ => Err(format!(
                "{at}: plugin {name:?} has type {:?}; expected an extractor (core-metrics-extractor)",
                named.plugin_type
            )),
        }
    }

    /// The engines of the config: those of its `core-metrics-extractor` (one at most with
    /// settings of its own), or the built-in ones.
    fn engines(&self) -> Result<Engines, String> {
        let mut configured = self.plugins.iter().filter_map(|named| match &named.plugin {
            Plugin::Extractor(engines) if *engines != Engines::default() => Some((named, engines)),
            _ => None,
        });
        match (configured.next(), configured.next()) {
            (Some(_), Some((second, _))) => Err(format!(
                "plugins: {:?} is a second core-metrics-extractor with its own engines; wasm-epp reads every endpoint with one",
                second.name
            )),
            (Some((_, engines)), None) => Ok(engines.clone()),
            (None, _) => Ok(Engines::default()),
        }
    }

    /// The plugin named `name`, which must be an inherent plugin with `role`.
    fn resolve_role(&self, at: &str, name: &str, role: Role, expected: &str) -> Result<(), String> {
        let named = self.resolve(at, name)?;
        if named.plugin == Plugin::Inherent(role) {
            Ok(())
        } else {
            Err(format!(
                "{at}: plugin {name:?} has type {:?}; expected {expected}",
                named.plugin_type
            ))
        }
    }
}

fn compile(raw: RawConfig) -> Result<PickerConfig, String> {
    let mut warnings = Vec::new();
    match raw.api_version.as_str() {
        API_VERSION => {}
        DEPRECATED_API_VERSION => warnings.push(format!(
            "apiVersion: {DEPRECATED_API_VERSION:?} is deprecated; use {API_VERSION:?}"
        )),
        other => {
            return Err(format!(
                "apiVersion: unsupported {other:?} (expected {API_VERSION:?})"
            ))
        }
    }
    if raw.kind != KIND {
        return Err(format!("kind: expected {KIND:?}, got {:?}", raw.kind));
    }
    check_feature_gates(&raw.feature_gates)?;
    let flow_control_detector = match &raw.flow_control {
        Some(value) => check_flow_control(value)?,
        None => None,
    };
    let registry = Registry::build(raw.plugins, &mut warnings)?;
    let (mut profile, in_profile) = match raw.scheduling_profiles.filter(|list| !list.is_empty()) {
        None => (default_profile(&registry)?, HashSet::new()),
        Some(list) if list.len() > 1 => {
            return Err(format!(
                "schedulingProfiles: {} profiles configured; wasm-epp supports exactly one (multi-profile handlers are not supported yet)",
                list.len()
            ))
        }
        Some(list) => explicit_profile(&list[0], &registry)?,
    };
    // `flowControl.saturationDetector` wins over the deprecated top-level field (as upstream).
    let new_ref = flow_control_detector
        .as_ref()
        .and_then(RawOptionalRef::name);
    let old_ref = raw
        .saturation_detector
        .as_ref()
        .and_then(RawOptionalRef::name);
    if raw.saturation_detector.is_some() {
        warnings
            .push("saturationDetector: deprecated; use flowControl.saturationDetector".to_string());
    }
    let reference = match (new_ref, old_ref) {
        (Some(new), old) => {
            if let Some(old) = old.filter(|&old| old != new) {
                registry.resolve_detector("saturationDetector.pluginRef", old)?;
                warnings.push(format!(
                    "saturationDetector.pluginRef: ignored; flowControl.saturationDetector.pluginRef ({new:?}) is used"
                ));
            }
            Some(("flowControl.saturationDetector.pluginRef", new))
        }
        (None, Some(old)) => Some(("saturationDetector.pluginRef", old)),
        (None, None) => None,
    };
    profile.saturation_detector = saturation_detector(&registry, reference, &in_profile)?;
    if profile.scorers.is_empty() {
        warnings.push(format!(
            "profile {:?} has no scorers; endpoints are picked at random",
            profile.name
        ));
    }
    let discovery = match raw.data_layer {
        Some(data_layer) => check_data_layer(data_layer, &registry)?,
        None => None,
    };
    if let Some(handler) = &raw.request_handler {
        for (i, parser) in handler.parsers.iter().enumerate() {
            registry.resolve_role(
                &format!("requestHandler.parsers[{i}].pluginRef"),
                &parser.plugin_ref,
                Role::Parser,
                "a parser (openai-parser, passthrough-parser)",
            )?;
        }
    }
    if let Some(parser) = &raw.parser {
        registry.resolve_role(
            "parser.pluginRef",
            &parser.plugin_ref,
            Role::Parser,
            "a parser (openai-parser, passthrough-parser)",
        )?;
        warnings.push("parser: deprecated; use requestHandler.parsers".to_string());
    }
    let engines = registry.engines()?;
    Ok(PickerConfig {
        profile,
        discovery,
        engines,
        warnings,
    })
}

/// Checks `featureGates` entries (`name`, `name=true`, `name=false`).
fn check_feature_gates(gates: &[String]) -> Result<(), String> {
    for (i, gate) in gates.iter().enumerate() {
        let (name, enabled) = match gate.split_once('=') {
            None => (gate.as_str(), true),
            Some((name, "true")) => (name, true),
            Some((name, "false")) => (name, false),
            Some(_) => {
                return Err(format!(
                    "featureGates[{i}]: invalid entry {gate:?} (expected name, name=true or name=false)"
                ))
            }
        };
        match name {
            "flowControl" if enabled => {
                return Err(format!(
                    "featureGates[{i}]: \"flowControl\" is not supported by wasm-epp yet"
                ))
            }
            "flowControl" | "haPopulateNonLeaderDatastore" => {}
            other => return Err(format!("featureGates[{i}]: unknown feature gate {other:?}")),
        }
    }
    Ok(())
}

/// Checks `flowControl`: only `saturationDetector` is supported; returns it.
fn check_flow_control(value: &Value) -> Result<Option<RawOptionalRef>, String> {
    let map = match value {
        Value::Null => return Ok(None),
        Value::Mapping(map) => map,
        _ => return Err("flowControl: must be a mapping".to_string()),
    };
    let mut detector = None;
    for (key, value) in map {
        match key.as_str() {
            Some("saturationDetector") => {
                detector = Some(
                    serde_yaml::from_value::<Option<RawOptionalRef>>(value.clone())
                        .map_err(|e| format!("flowControl.saturationDetector: {e}"))?
                        .unwrap_or(RawOptionalRef { plugin_ref: None }),
                )
            }
            Some(other) => {
                return Err(format!(
                    "flowControl.{other}: not supported by wasm-epp yet"
                ))
            }
            None => return Err("flowControl: field names must be strings".to_string()),
        }
    }
    Ok(detector)
}

/// The saturation detector's parameters. In order: the plugin `reference` names (a
/// `(field, name)` pair); else the plugin named `utilization-detector` (upstream's default
/// reference); else the only `utilization-detector` not used by the explicit profile (indexes in
/// `in_profile`); else the defaults. Two or more unreferenced detectors are an error.
fn saturation_detector(
    registry: &Registry,
    reference: Option<(&str, &str)>,
    in_profile: &HashSet<usize>,
) -> Result<UtilizationParams, String> {
    if let Some((at, name)) = reference {
        return Ok(registry.resolve_detector(at, name)?.1.clone());
    }
    let by_default_name = registry
        .by_name
        .get("utilization-detector")
        .map(|&index| &registry.plugins[index].plugin);
    if let Some(Plugin::Detector(params)) = by_default_name {
        return Ok(params.clone());
    }
    let mut unreferenced = registry
        .plugins
        .iter()
        .filter_map(|named| match &named.plugin {
            Plugin::Detector(params) if !in_profile.contains(&named.index) => Some((named, params)),
            _ => None,
        });
    let first = unreferenced.next();
    if let (Some((first, _)), Some((second, _))) = (first, unreferenced.next()) {
        return Err(format!(
            "plugins[{}]: a second utilization-detector (first: {:?}) and no flowControl.saturationDetector.pluginRef to choose between them",
            second.index, first.name
        ));
    }
    Ok(first.map(|(_, params)| params.clone()).unwrap_or_default())
}

/// The filter a plugin is in a profile, if it is one.
fn as_filter(plugin: &Plugin) -> Option<FilterSpec> {
    match plugin {
        Plugin::Filter(spec) => Some(spec.clone()),
        Plugin::Detector(params) => Some(FilterSpec::UtilizationDetector(params.clone())),
        _ => None,
    }
}

/// No `schedulingProfiles`: one `default` profile with every filter (in plugin order, a
/// `utilization-detector` included, as upstream), every scorer (weight 1) and the picker.
fn default_profile(registry: &Registry) -> Result<Profile, String> {
    let mut filters = Vec::new();
    let mut scorers = Vec::new();
    let mut picker: Option<(&Named, PickerSpec)> = None;
    for named in &registry.plugins {
        if let Some(filter) = as_filter(&named.plugin) {
            filters.push(filter);
            continue;
        }
        match &named.plugin {
            Plugin::Scorer { spec, .. } => scorers.push(WeightedScorer {
                name: named.name.clone(),
                weight: 1.0,
                scorer: spec.clone(),
            }),
            Plugin::Picker(spec) => {
                if let Some((first, _)) = &picker {
                    return Err(format!(
                        "plugins[{}]: a second picker (first: {:?}) and no schedulingProfiles to choose between them",
                        named.index, first.name
                    ));
                }
                picker = Some((named, spec.clone()));
            }
            _ => {}
        }
    }
    Ok(Profile {
        name: "default".to_string(),
        filters,
        scorers,
        picker: picker.map_or_else(default_picker, |(_, spec)| spec),
        saturation_detector: Default::default(),
    })
}

/// The one configured profile; also returns the indexes of the plugins it uses.
fn explicit_profile(
    raw: &RawProfile,
    registry: &Registry,
) -> Result<(Profile, HashSet<usize>), String> {
    if raw.name.is_empty() {
        return Err("schedulingProfiles[0].name: must not be empty".to_string());
    }
    let mut used = HashSet::new();
    let mut filters = Vec::new();
    let mut scorers: Vec<WeightedScorer> = Vec::new();
    let mut picker: Option<(&str, PickerSpec)> = None;
    for (j, entry) in raw.plugins.iter().enumerate() {
        let at = format!("schedulingProfiles[0].plugins[{j}]");
        let named = registry.resolve(&format!("{at}.pluginRef"), &entry.plugin_ref)?;
        if let Some(filter) = as_filter(&named.plugin) {
            if used.contains(&named.index) {
                return Err(format!(
                    "{at}.pluginRef: plugin {:?} is already in this profile",
                    named.name
                ));
            }
            if entry.weight.is_some() {
                return Err(format!(
                    "{at}.weight: not allowed on filter {:?} (type {:?}); only scorers have weights",
                    named.name, named.plugin_type
                ));
            }
            used.insert(named.index);
            filters.push(filter);
            continue;
        }
        used.insert(named.index);
        match &named.plugin {
            Plugin::Scorer { spec, .. } => {
                if scorers.iter().any(|s| s.name == named.name) {
                    return Err(format!(
                        "{at}.pluginRef: plugin {:?} is already in this profile",
                        named.name
                    ));
                }
                let weight = entry.weight.unwrap_or(1.0);
                if !weight.is_finite() || weight < 0.0 {
                    return Err(format!(
                        "{at}.weight: must be a finite number of at least 0"
                    ));
                }
                scorers.push(WeightedScorer {
                    name: named.name.clone(),
                    weight,
                    scorer: spec.clone(),
                });
            }
            Plugin::Picker(spec) => {
                if let Some((first, _)) = picker {
                    return Err(format!(
                        "{at}.pluginRef: the profile already has picker {first:?}; only one picker per profile"
                    ));
                }
                picker = Some((&named.name, spec.clone()));
            }
            _ => {
                return Err(format!(
                    "{at}.pluginRef: plugin {:?} (type {:?}) is not a filter, scorer or picker",
                    named.name, named.plugin_type
                ))
            }
        }
    }
    let profile = Profile {
        name: raw.name.clone(),
        filters,
        scorers,
        picker: picker.map_or_else(default_picker, |(_, spec)| spec),
        saturation_detector: Default::default(),
    };
    Ok((profile, used))
}

/// The picker a profile without one gets (upstream injects the same).
fn default_picker() -> PickerSpec {
    PickerSpec::MaxScore {
        max_num_of_endpoints: 1,
    }
}

/// Checks the `dataLayer` references; returns the discovery source if one is set.
fn check_data_layer(raw: RawDataLayer, registry: &Registry) -> Result<Option<Source>, String> {
    // `injectDefaults` changes nothing: the vLLM metrics source is built in.
    let _ = raw.inject_defaults;
    for (field, value) in [
        ("peerDiscovery", &raw.peer_discovery),
        (
            "crossReplicaSyncerPluginRef",
            &raw.cross_replica_syncer_plugin_ref,
        ),
        ("crossReplicaSyncInterval", &raw.cross_replica_sync_interval),
    ] {
        if value.is_some() {
            return Err(format!("dataLayer.{field}: not supported by wasm-epp yet"));
        }
    }
    for (i, source) in raw.sources.iter().enumerate() {
        registry.resolve_role(
            &format!("dataLayer.sources[{i}].pluginRef"),
            &source.plugin_ref,
            Role::DataSource,
            "a data source (metrics-data-source)",
        )?;
        for (j, extractor) in source.extractors.iter().enumerate() {
            registry.resolve_extractor(
                &format!("dataLayer.sources[{i}].extractors[{j}].pluginRef"),
                &extractor.plugin_ref,
            )?;
        }
    }
    let Some(discovery) = raw.discovery else {
        return Ok(None);
    };
    let at = "dataLayer.discovery.pluginRef";
    let named = registry.resolve(at, &discovery.plugin_ref)?;
    match &named.plugin {
        Plugin::Discovery(source) => Ok(Some(Source::File(source.clone()))),
        _ => Err(format!(
            "{at}: plugin {:?} has type {:?}; expected a discovery plugin (file-discovery)",
            named.name, named.plugin_type
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::file::FileSource;
    use wasm_epp::scheduler::profile::{
        ActiveRequestParams, LabelSelector, LabelSelectorOperator, LabelSelectorRequirement,
        LoadAwareParams,
    };

    const HEADER: &str = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";

    fn compile_yaml(body: &str) -> Result<PickerConfig, String> {
        parse(&format!("{HEADER}{body}"))
    }

    fn weights(profile: &Profile) -> Vec<(&str, f64)> {
        profile
            .scorers
            .iter()
            .map(|s| (s.name.as_str(), s.weight))
            .collect()
    }

    #[test]
    fn no_config_means_the_upstream_default_profile() {
        let config = PickerConfig::default();
        assert_eq!(
            weights(&config.profile),
            [
                ("queue-scorer", 2.0),
                ("kv-cache-utilization-scorer", 2.0),
                ("prefix-cache-scorer", 3.0)
            ]
        );
        assert_eq!(config.discovery, None);
    }

    #[test]
    fn the_metrics_extractor_takes_upstream_engine_configs() {
        let config = compile_yaml(
            "plugins:\n\
             - type: metrics-data-source\n\
             - name: extractor\n  type: core-metrics-extractor\n  parameters:\n    defaultEngine: atom\n    engineConfigs:\n\
             \x20   - name: atom\n      queuedRequestsSpec: atom:waiting\n      kvUsageSpec: atom:kv\n\
             dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: extractor\n",
        )
        .unwrap();
        let atom = config.engines.for_labels(&Default::default());
        assert_eq!(atom.name, "atom");
        assert_eq!(atom.families(), ["atom:kv", "atom:waiting"]);

        let err = compile_yaml(
            "plugins:\n- type: core-metrics-extractor\n  parameters: {defaultEngine: nope}\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("plugins[0].parameters.defaultEngine: unknown engine \"nope\""),
            "{err}"
        );
        let err = compile_yaml(
            "plugins:\n- type: core-metrics-extractor\n  parameters:\n    engineConfigs: [{name: x, kvUsageSpec: 'a{'}]\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("plugins[0].parameters.engineConfigs[0].kvUsageSpec:"),
            "{err}"
        );
    }

    #[test]
    fn the_upstream_default_config_compiles_to_the_default_profile() {
        let config = compile_yaml(
            "plugins:\n\
             - type: queue-scorer\n\
             - type: kv-cache-utilization-scorer\n\
             - type: prefix-cache-scorer\n\
             - type: metrics-data-source\n\
             - type: core-metrics-extractor\n\
             schedulingProfiles:\n\
             - name: default\n  plugins:\n\
             \x20 - pluginRef: queue-scorer\n    weight: 2\n\
             \x20 - pluginRef: kv-cache-utilization-scorer\n    weight: 2\n\
             \x20 - pluginRef: prefix-cache-scorer\n    weight: 3\n\
             dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: core-metrics-extractor\n",
        )
        .unwrap();
        assert_eq!(config.profile, Profile::default());
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn weights_default_to_one_and_a_missing_picker_is_max_score() {
        let config = compile_yaml(
            "plugins:\n- type: queue-scorer\n- name: kv\n  type: kv-cache-utilization-scorer\n\
             schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: kv\n  - pluginRef: queue-scorer\n    weight: 0.5\n",
        )
        .unwrap();
        assert_eq!(config.profile.name, "p");
        assert_eq!(
            weights(&config.profile),
            [("kv", 1.0), ("queue-scorer", 0.5)]
        );
        assert_eq!(
            config.profile.scorers[0].scorer,
            ScorerSpec::KvCacheUtilization
        );
        assert_eq!(config.profile.picker, default_picker());
    }

    #[test]
    fn omitted_profiles_take_every_scorer_at_weight_one_and_the_picker() {
        let config = compile_yaml(
            "plugins:\n- type: queue-scorer\n- type: random-picker\n  parameters: {maxNumOfEndpoints: 2}\n- type: prefix-cache-scorer\n",
        )
        .unwrap();
        assert_eq!(config.profile.name, "default");
        assert_eq!(
            weights(&config.profile),
            [("queue-scorer", 1.0), ("prefix-cache-scorer", 1.0)]
        );
        assert_eq!(
            config.profile.picker,
            PickerSpec::Random {
                max_num_of_endpoints: 2
            }
        );
    }

    #[test]
    fn the_deprecated_api_version_is_accepted_with_a_warning() {
        let config = parse(
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n",
        )
        .unwrap();
        assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
        assert!(config.warnings[0].contains("deprecated"));
    }

    #[test]
    fn approx_producer_parameters_merge_into_the_prefix_scorer() {
        let config = compile_yaml(
            "plugins:\n\
             - name: producer\n  type: approx-prefix-cache-producer\n  parameters: {maxPrefixTokensToMatch: 16384, blockSizeTokens: 32, autoTune: false, lruCapacityPerServer: 1000}\n\
             - type: prefix-cache-scorer\n  parameters: {matchLengthWeight: 0.25, prefixMatchInfoProducerName: producer}\n\
             schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: prefix-cache-scorer\n    weight: 3\n",
        )
        .unwrap();
        let ScorerSpec::PrefixCache(params) = &config.profile.scorers[0].scorer else {
            panic!("not a prefix scorer: {:?}", config.profile.scorers[0]);
        };
        let expected = PrefixCacheParams {
            match_length_weight: 0.25,
            auto_tune: false,
            block_size_tokens: 32,
            max_prefix_tokens_to_match: 16384,
            ..PrefixCacheParams::default()
        };
        assert_eq!(params, &expected);
        assert_eq!(config.profile.scorers[0].weight, 3.0);
    }

    #[test]
    fn active_request_scorer_parameters() {
        let config = compile_yaml(
            "plugins:\n- type: active-request-scorer\n  parameters: {idleThreshold: 2, maxBusyScore: 0.5}\n",
        )
        .unwrap();
        assert_eq!(
            config.profile.scorers[0].scorer,
            ScorerSpec::ActiveRequest(ActiveRequestParams {
                idle_threshold: 2,
                max_busy_score: 0.5
            })
        );
        let err = compile_yaml(
            "plugins:\n- type: active-request-scorer\n  parameters: {maxBusyScore: 2}\n",
        )
        .unwrap_err();
        assert!(err.contains("plugins[0].parameters.maxBusyScore"), "{err}");
    }

    #[test]
    fn file_discovery_is_compiled() {
        let config = compile_yaml(
            "plugins:\n- name: files\n  type: file-discovery\n  parameters: {path: /etc/endpoints.yaml, watchFile: true}\n\
             dataLayer:\n  discovery: {pluginRef: files}\n",
        )
        .unwrap();
        assert_eq!(
            config.discovery,
            Some(Source::File(FileSource {
                path: "/etc/endpoints.yaml".into(),
                watch: true
            }))
        );
    }

    #[test]
    fn accepted_sections_compile() {
        let config = compile_yaml(
            "featureGates: [haPopulateNonLeaderDatastore=false, flowControl=false]\n\
             plugins:\n- type: openai-parser\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 10}\n- type: single-profile-handler\n- type: token-producer\n\
             - type: queue-scorer\n\
             schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer}]\n\
             requestHandler:\n  parsers: [{pluginRef: openai-parser}]\n\
             saturationDetector: {pluginRef: utilization-detector}\n\
             dataLayer: {injectDefaults: false}\n",
        )
        .unwrap();
        assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
        assert!(config.profile.filters.is_empty());
        assert_eq!(
            config.profile.saturation_detector.queue_depth_threshold,
            10.0
        );
        assert_eq!(
            config.warnings,
            ["saturationDetector: deprecated; use flowControl.saturationDetector"]
        );
    }

    fn yaml_profile(plugins: &str, profile: &str) -> Result<PickerConfig, String> {
        compile_yaml(&format!(
            "plugins:\n{plugins}schedulingProfiles:\n- name: p\n  plugins:\n{profile}"
        ))
    }

    #[test]
    fn new_scorers_and_picker_compile_into_the_profile() {
        let config = yaml_profile(
            "- type: lora-affinity-scorer\n- type: running-requests-size-scorer\n\
             - type: load-aware-scorer\n- name: load16\n  type: load-aware-scorer\n  parameters: {threshold: 16}\n\
             - type: session-affinity-scorer\n  parameters: {strategy: encoded_endpoint_header}\n\
             - type: weighted-random-picker\n  parameters: {maxNumOfEndpoints: 2}\n",
            "  - pluginRef: lora-affinity-scorer\n    weight: 2\n  - pluginRef: running-requests-size-scorer\n\
             \x20 - pluginRef: load-aware-scorer\n  - pluginRef: load16\n    weight: 0.5\n\
             \x20 - pluginRef: session-affinity-scorer\n    weight: 10\n  - pluginRef: weighted-random-picker\n",
        )
        .unwrap();
        let scorers: Vec<(&str, f64, &ScorerSpec)> = config
            .profile
            .scorers
            .iter()
            .map(|s| (s.name.as_str(), s.weight, &s.scorer))
            .collect();
        assert_eq!(
            scorers,
            [
                ("lora-affinity-scorer", 2.0, &ScorerSpec::LoraAffinity),
                (
                    "running-requests-size-scorer",
                    1.0,
                    &ScorerSpec::RunningRequestsSize
                ),
                (
                    "load-aware-scorer",
                    1.0,
                    &ScorerSpec::LoadAware(LoadAwareParams { threshold: 128 })
                ),
                (
                    "load16",
                    0.5,
                    &ScorerSpec::LoadAware(LoadAwareParams { threshold: 16 })
                ),
                (
                    "session-affinity-scorer",
                    10.0,
                    &ScorerSpec::SessionAffinity
                ),
            ]
        );
        assert_eq!(
            config.profile.picker,
            PickerSpec::WeightedRandom {
                max_num_of_endpoints: 2
            }
        );
        assert!(profile_summary(&config.profile).ends_with("; weighted-random-picker(2)"));
    }

    const FILTER_PLUGINS: &str = "- type: queue-scorer\n\
         - name: gpu\n  type: label-selector-filter\n  parameters:\n    matchLabels: {gpu: h100}\n    matchExpressions: [{key: zone, operator: NotIn, values: [b]}]\n\
         - name: old\n  type: by-label-selector\n  parameters:\n    selector:\n      matchExpressions: [{key: ready, operator: Exists}]\n\
         - type: decode-filter\n- type: prefill-filter\n\
         - name: util\n  type: utilization-detector\n  parameters: {headroom: 0.5, metricsStalenessThreshold: 1s}\n";

    fn filter_specs() -> [FilterSpec; 5] {
        let gpu = LabelSelector {
            match_labels: [("gpu".to_string(), "h100".to_string())].into(),
            match_expressions: vec![LabelSelectorRequirement {
                key: "zone".to_string(),
                operator: LabelSelectorOperator::NotIn,
                values: vec!["b".to_string()],
            }],
        };
        let old = LabelSelector {
            match_labels: Default::default(),
            match_expressions: vec![LabelSelectorRequirement {
                key: "ready".to_string(),
                operator: LabelSelectorOperator::Exists,
                values: Vec::new(),
            }],
        };
        let util = UtilizationParams {
            headroom: 0.5,
            metrics_staleness_threshold_ms: 1000,
            ..UtilizationParams::default()
        };
        [
            FilterSpec::LabelSelector(gpu),
            FilterSpec::LabelSelector(old),
            FilterSpec::Decode,
            FilterSpec::Prefill,
            FilterSpec::UtilizationDetector(util),
        ]
    }

    #[test]
    fn filters_keep_the_profile_order() {
        let config = yaml_profile(
            FILTER_PLUGINS,
            "  - pluginRef: util\n  - pluginRef: queue-scorer\n    weight: 2\n  - pluginRef: prefill-filter\n\
             \x20 - pluginRef: gpu\n  - pluginRef: decode-filter\n  - pluginRef: old\n",
        )
        .unwrap();
        let [gpu, old, decode, prefill, util] = filter_specs();
        assert_eq!(config.profile.filters, [util, prefill, gpu, decode, old]);
        assert_eq!(weights(&config.profile), [("queue-scorer", 2.0)]);
        assert_eq!(
            profile_summary(&config.profile),
            "profile \"p\": filters utilization-detector, prefill-filter, label-selector-filter, decode-filter, label-selector-filter; queue-scorer×2; max-score-picker(1)"
        );
        // The detector is used by the profile and has a custom name: the saturation detector
        // keeps the defaults.
        assert_eq!(
            config.profile.saturation_detector,
            UtilizationParams::default()
        );
    }

    #[test]
    fn omitted_profiles_include_every_filter_in_plugin_order() {
        let config = compile_yaml(&format!("plugins:\n{FILTER_PLUGINS}")).unwrap();
        assert_eq!(config.profile.filters, filter_specs());
        assert_eq!(weights(&config.profile), [("queue-scorer", 1.0)]);
        // The only detector is also the saturation detector.
        let [.., FilterSpec::UtilizationDetector(util)] = filter_specs() else {
            unreachable!()
        };
        assert_eq!(config.profile.saturation_detector, util);
    }

    #[test]
    fn saturation_detector_parameters() {
        let detectors = "- name: strict\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 2, kvCacheUtilThreshold: 0.5}\n\
                         - name: loose\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 20, metricsStalenessThreshold: 500ms}\n\
                         - type: queue-scorer\n";
        let strict = UtilizationParams {
            queue_depth_threshold: 2.0,
            kv_cache_util_threshold: 0.5,
            ..UtilizationParams::default()
        };
        let loose = UtilizationParams {
            queue_depth_threshold: 20.0,
            metrics_staleness_threshold_ms: 500,
            ..UtilizationParams::default()
        };
        let profile = "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer}]\n";
        for (section, expected, warnings) in [
            ("saturationDetector: {pluginRef: loose}\n", &loose, 1),
            ("flowControl:\n  saturationDetector: {pluginRef: strict}\n", &strict, 0),
            // The new field wins over the deprecated one.
            (
                "flowControl: {saturationDetector: {pluginRef: loose}}\nsaturationDetector: {pluginRef: strict}\n",
                &loose,
                2,
            ),
        ] {
            let config =
                compile_yaml(&format!("plugins:\n{detectors}{profile}{section}")).unwrap();
            assert_eq!(&config.profile.saturation_detector, expected, "{section}");
            assert!(config.profile.filters.is_empty());
            assert_eq!(config.warnings.len(), warnings, "{section}: {:?}", config.warnings);
        }

        // Unreferenced: the only detector not in the profile.
        let config = yaml_profile(
            "- type: queue-scorer\n- name: a\n  type: utilization-detector\n  parameters: {headroom: 1}\n\
             - name: b\n  type: utilization-detector\n  parameters: {headroom: 2}\n",
            "  - pluginRef: a\n  - pluginRef: queue-scorer\n",
        )
        .unwrap();
        assert_eq!(config.profile.saturation_detector.headroom, 2.0);
        assert_eq!(
            config.profile.filters,
            [FilterSpec::UtilizationDetector(UtilizationParams {
                headroom: 1.0,
                ..UtilizationParams::default()
            })]
        );

        // The default name `utilization-detector` is upstream's default reference, even when the
        // profile uses it as a filter too.
        let config = yaml_profile(
            "- type: queue-scorer\n- type: utilization-detector\n  parameters: {kvCacheUtilThreshold: 0.9}\n",
            "  - pluginRef: utilization-detector\n  - pluginRef: queue-scorer\n",
        )
        .unwrap();
        assert_eq!(
            config.profile.saturation_detector.kv_cache_util_threshold,
            0.9
        );
        assert_eq!(config.profile.filters.len(), 1);

        // No detector configured: the defaults.
        let config = compile_yaml("plugins:\n- type: queue-scorer\n").unwrap();
        assert_eq!(
            config.profile.saturation_detector,
            UtilizationParams::default()
        );
        assert!(config.profile.filters.is_empty());
    }

    #[test]
    fn new_plugin_errors_name_their_field() {
        for (body, expected) in [
            (
                "plugins:\n- type: decode-filter\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: decode-filter\n    weight: 2\n",
                "schedulingProfiles[0].plugins[1].weight: not allowed on filter \"decode-filter\"",
            ),
            (
                "plugins:\n- type: utilization-detector\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: utilization-detector\n    weight: 1\n",
                "schedulingProfiles[0].plugins[0].weight: not allowed on filter \"utilization-detector\" (type \"utilization-detector\")",
            ),
            (
                "plugins:\n- type: prefill-filter\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: prefill-filter\n  - pluginRef: prefill-filter\n",
                "schedulingProfiles[0].plugins[1].pluginRef: plugin \"prefill-filter\" is already in this profile",
            ),
            (
                "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: queue-scorer}\n",
                "saturationDetector.pluginRef: plugin \"queue-scorer\" has type \"queue-scorer\"; expected a saturation detector (utilization-detector)",
            ),
            (
                "flowControl: {saturationDetector: {pluginRef: nope}}\n",
                "flowControl.saturationDetector.pluginRef: no plugin named \"nope\"",
            ),
            (
                "plugins:\n- type: utilization-detector\nflowControl: {saturationDetector: {pluginRef: utilization-detector}}\nsaturationDetector: {pluginRef: nope}\n",
                "saturationDetector.pluginRef: no plugin named \"nope\"",
            ),
            (
                "flowControl: {saturationDetector: {pluginRef: x, gateOn: max}}\n",
                "flowControl.saturationDetector: unknown field `gateOn`",
            ),
            (
                "flowControl: {maxRequests: 10}\n",
                "flowControl.maxRequests: not supported by wasm-epp yet",
            ),
            ("flowControl: [a]\n", "flowControl: must be a mapping"),
            (
                "plugins:\n- name: a\n  type: utilization-detector\n- name: b\n  type: utilization-detector\n",
                "plugins[1]: a second utilization-detector (first: \"a\")",
            ),
            (
                "plugins:\n- type: label-selector-filter\n  parameters:\n    matchExpressions: [{key: a, operator: Exists, values: [x]}]\n",
                "plugins[0].parameters.matchExpressions[0].values: must be empty for operator Exists",
            ),
            (
                "plugins:\n- type: session-affinity-scorer\n  parameters: {strategy: session_id}\n",
                "plugins[0].parameters.strategy: \"session_id\" is not supported by wasm-epp yet",
            ),
            (
                "plugins:\n- type: weighted-random-picker\n- type: max-score-picker\n",
                "plugins[1]: a second picker (first: \"weighted-random-picker\")",
            ),
        ] {
            let err = compile_yaml(body).unwrap_err();
            assert!(err.starts_with(expected), "{body}\n  gave: {err}\n  want: {expected}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn each_error_names_its_field() {
        for (body, expected) in [
            (
                "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: foo\n",
                "schedulingProfiles[0].plugins[1].pluginRef: no plugin named \"foo\"",
            ),
            (
                "plugins:\n- type: queue-scorer\n- type: queue-scorer\n- type: bar\n",
                "plugins[1].name: duplicate plugin name \"queue-scorer\"",
            ),
            (
                "plugins:\n- type: queue-scorer\n- name: x\n  type: kv-cache-utilization-scorer\n- type: bar\n",
                "plugins[2].type: unknown plugin type \"bar\"",
            ),
            (
                "plugins:\n- type: encode-filter\n",
                "plugins[0].type: plugin type \"encode-filter\" is not supported by wasm-epp yet",
            ),
            (
                "plugins:\n- type: queue-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2, tieBreak: random}\n",
                "plugins[1].parameters.tieBreak: unknown parameter",
            ),
            (
                "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: []\n- name: b\n  plugins: []\n",
                "schedulingProfiles: 2 profiles configured",
            ),
            (
                "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: max-score-picker\n  - pluginRef: random-picker\n",
                "schedulingProfiles[0].plugins[1].pluginRef: the profile already has picker \"max-score-picker\"",
            ),
            (
                "plugins:\n- type: max-score-picker\n- type: random-picker\n",
                "plugins[1]: a second picker",
            ),
            (
                "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    wieght: 2\n",
                "schedulingProfiles[0].plugins[0]: unknown field `wieght`",
            ),
            (
                "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
                "schedulingProfiles[0].plugins[0].weight: must be",
            ),
            (
                "plugins:\n- type: metrics-data-source\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: metrics-data-source\n",
                "schedulingProfiles[0].plugins[0].pluginRef: plugin \"metrics-data-source\" (type \"metrics-data-source\") is not a filter, scorer or picker",
            ),
            (
                "plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: queue-scorer}\n",
                "dataLayer.discovery.pluginRef: plugin \"queue-scorer\" has type \"queue-scorer\"",
            ),
            (
                "plugins:\n- type: queue-scorer\ndataLayer:\n  sources:\n  - pluginRef: queue-scorer\n",
                "dataLayer.sources[0].pluginRef: plugin \"queue-scorer\" has type",
            ),
            (
                "plugins:\n- type: metrics-data-source\ndataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors: [{pluginRef: nope}]\n",
                "dataLayer.sources[0].extractors[0].pluginRef: no plugin named \"nope\"",
            ),
            (
                "dataLayer:\n  peerDiscovery: {pluginRef: x}\n",
                "dataLayer.peerDiscovery: not supported by wasm-epp yet",
            ),
            (
                "requestHandler:\n  parsers: [{pluginRef: openai-parser}]\n",
                "requestHandler.parsers[0].pluginRef: no plugin named \"openai-parser\"",
            ),
            ("featureGates: [flowControl]\n", "featureGates[0]: \"flowControl\" is not supported"),
            ("featureGates: [fastPath]\n", "featureGates[0]: unknown feature gate \"fastPath\""),
            (
                "plugins:\n- type: approx-prefix-cache-producer\n- name: second\n  type: approx-prefix-cache-producer\n",
                "plugins[1].type: only one approx-prefix-cache-producer",
            ),
            (
                "plugins:\n- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: nope}\n",
                "plugins[0].parameters.prefixMatchInfoProducerName: no approx-prefix-cache-producer named \"nope\"",
            ),
            ("plugins:\n- name: x\n", "plugins[0].type: must not be empty"),
            ("colour: blue\n", "unknown field `colour`"),
        ] {
            let err = compile_yaml(body).unwrap_err();
            assert!(err.starts_with(expected), "{body}\n  gave: {err}\n  want: {expected}");
        }
    }

    #[test]
    fn api_version_and_kind_are_checked() {
        let err = parse("apiVersion: v1\nkind: EndpointPickerConfig\n").unwrap_err();
        assert!(err.starts_with("apiVersion: unsupported \"v1\""), "{err}");
        let err = parse("apiVersion: llm-d.ai/v1alpha1\nkind: Pod\n").unwrap_err();
        assert!(err.starts_with("kind: expected"), "{err}");
        let err = parse("kind: EndpointPickerConfig\n").unwrap_err();
        assert!(err.contains("apiVersion"), "{err}");
    }
}
