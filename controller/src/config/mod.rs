//! The upstream `EndpointPickerConfig` file, compiled into the scheduling [`Profile`] the
//! snapshot carries and the discovery settings.
//!
//! Decoding is strict (unknown fields are rejected) and every error names the field it is
//! about, e.g. `schedulingProfiles[0].plugins[1].pluginRef: no plugin named "foo"`.

mod disaggregation;
mod flow_control;
mod plugins;
mod raw;
pub mod reload;
mod selector;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use thiserror::Error;
use wasm_epp::scheduler::filters::concurrency_detector::{self, ConcurrencyParams};
use wasm_epp::scheduler::filters::utilization_detector;
use wasm_epp::scheduler::profile::{
    FilterSpec, PickerSpec, PrefixCacheParams, Profile, ScorerSpec, UtilizationParams,
    WeightedScorer,
};

use crate::discovery::Source;
use crate::engines::Engines;
use disaggregation::Handler;
use plugins::{Plugin, Role};
use raw::{RawConfig, RawDataLayer, RawOptionalRef, RawPlugin, RawProfile};

/// The current config `apiVersion`.
pub const API_VERSION: &str = "llm-d.ai/v1alpha1";
/// The deprecated `apiVersion`, still accepted.
pub const DEPRECATED_API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
/// The only accepted `kind`.
pub const KIND: &str = "EndpointPickerConfig";

/// Largest config file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Why a config does not load; one line. Most errors are [`ConfigError::Field`], which names
/// the field, e.g. `schedulingProfiles[0].plugins[1].pluginRef: no plugin named "foo"`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The file cannot be read: the I/O error's text.
    #[error("cannot read: {0}")]
    Read(String),
    /// The file is larger than the limit.
    #[error("file is larger than {} bytes", MAX_FILE_BYTES)]
    TooLarge,
    /// Not YAML or JSON, or not shaped like an EndpointPickerConfig (unknown or missing field,
    /// wrong type): serde_yaml's message, which names the field and its position.
    #[error("{0}")]
    Syntax(String),
    /// A field whose value is not accepted.
    #[error("{field}: {message}")]
    Field {
        /// The field's path, e.g. `kind`, `plugins[2].parameters.x` or
        /// `schedulingProfiles[0].plugins[1].pluginRef`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// The value of `field` is not accepted, for `message`.
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Field {
            field: field.into(),
            message: message.into(),
        }
    }
}

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
pub fn load(path: &Path) -> Result<PickerConfig, ConfigError> {
    let size = std::fs::metadata(path)
        .map_err(|e| ConfigError::Read(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(ConfigError::TooLarge);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(e.to_string()))?;
    parse(&text)
}

/// Compiles config text (YAML or JSON).
pub fn parse(text: &str) -> Result<PickerConfig, ConfigError> {
    let raw: RawConfig =
        serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
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
    let (PickerSpec::MaxScore {
        max_num_of_endpoints,
    }
    | PickerSpec::WeightedRandom {
        max_num_of_endpoints,
    }
    | PickerSpec::Random {
        max_num_of_endpoints,
    }) = &profile.picker;
    let picker = format!("{}({max_num_of_endpoints})", profile.picker.type_name());
    let filters = if profile.filters.is_empty() {
        String::new()
    } else {
        let types: Vec<&str> = profile.filters.iter().map(FilterSpec::type_name).collect();
        format!("filters {}; ", types.join(", "))
    };
    let mut summary = format!(
        "profile {:?}: {filters}{}; {picker}",
        profile.name,
        if scorers.is_empty() {
            "no scorers".to_string()
        } else {
            scorers.join(", ")
        }
    );
    if let Some(stage) = &profile.disaggregation {
        summary.push_str(&format!(
            "; prefill stage by {}: {}",
            stage.decider.type_name(),
            profile_summary(&stage.prefill)
        ));
    }
    summary
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
    fn build(raw: Vec<RawPlugin>, warnings: &mut Vec<String>) -> Result<Registry, ConfigError> {
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
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    format!("duplicate plugin name {name:?}"),
                ));
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
    fn apply_prefix_producer(&mut self) -> Result<(), ConfigError> {
        let mut producers = self.plugins.iter().filter_map(|named| match &named.plugin {
            Plugin::PrefixProducer(params) => Some((named, params)),
            _ => None,
        });
        let producer = producers.next();
        if let Some((second, _)) = producers.next() {
            return Err(ConfigError::invalid(
                format!("plugins[{}].type", second.index),
                "only one approx-prefix-cache-producer is supported",
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
                    return Err(ConfigError::invalid(
                        format!(
                            "plugins[{}].parameters.prefixMatchInfoProducerName",
                            named.index
                        ),
                        format!("no approx-prefix-cache-producer named {wanted:?}"),
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
    /// The plugin named `name`, if configured.
    fn lookup(&self, name: &str) -> Option<&Plugin> {
        self.by_name
            .get(name)
            .map(|&index| &self.plugins[index].plugin)
    }

    fn resolve(&self, at: &str, name: &str) -> Result<&Named, ConfigError> {
        self.by_name
            .get(name)
            .map(|&index| &self.plugins[index])
            .ok_or_else(|| ConfigError::invalid(at, format!("no plugin named {name:?}")))
    }

    /// The `disagg-profile-handler` and its name, if one is configured; a second profile
    /// handler of any type is an error.
    fn disaggregation(&self) -> Result<Option<(&str, &Handler)>, ConfigError> {
        let mut handlers = self.plugins.iter().filter(|named| {
            matches!(
                named.plugin,
                Plugin::Disaggregation(_) | Plugin::Inherent(Role::ProfileHandler)
            )
        });
        let first = handlers.next();
        if let (Some(first), Some(second)) = (first, handlers.next()) {
            return Err(ConfigError::invalid(
                format!("plugins[{}].type", second.index),
                format!("a second profile handler (first: {:?})", first.name),
            ));
        }
        Ok(first.and_then(|named| match &named.plugin {
            Plugin::Disaggregation(handler) => Some((named.name.as_str(), handler)),
            _ => None,
        }))
    }

    /// The plugin named `name`, which must be a `utilization-detector`; `at` is the referencing
    /// field.
    fn resolve_detector(&self, at: &str, name: &str) -> Result<Detector, ConfigError> {
        let named = self.resolve(at, name)?;
        Detector::of(&named.plugin).ok_or_else(|| ConfigError::invalid(at, format!("plugin {name:?} has type {:?}; expected a saturation detector (utilization-detector or concurrency-detector)", named.plugin_type)))
    }

    /// The engines of the plugin named `name`, which must be a `core-metrics-extractor`.
    fn resolve_extractor(&self, at: &str, name: &str) -> Result<&Engines, ConfigError> {
        let named = self.resolve(at, name)?;
        match &named.plugin {
            Plugin::Extractor(engines) => Ok(engines),
            _ => Err(ConfigError::invalid(
                at,
                format!(
                    "plugin {name:?} has type {:?}; expected an extractor (core-metrics-extractor)",
                    named.plugin_type
                ),
            )),
        }
    }

    /// The engines of the config: those of its `core-metrics-extractor` (one at most with
    /// settings of its own), or the built-in ones.
    fn engines(&self) -> Result<Engines, ConfigError> {
        let mut configured = self.plugins.iter().filter_map(|named| match &named.plugin {
            Plugin::Extractor(engines) if *engines != Engines::default() => Some((named, engines)),
            _ => None,
        });
        match (configured.next(), configured.next()) {
            (Some(_), Some((second, _))) => Err(ConfigError::invalid("plugins", format!("{:?} is a second core-metrics-extractor with its own engines; wasm-epp reads every endpoint with one", second.name))),
            (Some((_, engines)), None) => Ok(engines.clone()),
            (None, _) => Ok(Engines::default()),
        }
    }

    /// The plugin named `name`, which must be an inherent plugin with `role`.
    fn resolve_role(
        &self,
        at: &str,
        name: &str,
        role: Role,
        expected: &str,
    ) -> Result<(), ConfigError> {
        let named = self.resolve(at, name)?;
        if named.plugin == Plugin::Inherent(role) {
            Ok(())
        } else {
            Err(ConfigError::invalid(
                at,
                format!(
                    "plugin {name:?} has type {:?}; expected {expected}",
                    named.plugin_type
                ),
            ))
        }
    }
}

fn compile(raw: RawConfig) -> Result<PickerConfig, ConfigError> {
    let mut warnings = Vec::new();
    match raw.api_version.as_str() {
        API_VERSION => {}
        DEPRECATED_API_VERSION => warnings.push(format!(
            "apiVersion: {DEPRECATED_API_VERSION:?} is deprecated; use {API_VERSION:?}"
        )),
        other => {
            return Err(ConfigError::invalid(
                "apiVersion",
                format!("unsupported {other:?} (expected {API_VERSION:?})"),
            ))
        }
    }
    if raw.kind != KIND {
        return Err(ConfigError::invalid(
            "kind",
            format!("expected {KIND:?}, got {:?}", raw.kind),
        ));
    }
    let flow_control_on = check_feature_gates(&raw.feature_gates)?;
    let registry = Registry::build(raw.plugins, &mut warnings)?;
    let flow_section = match &raw.flow_control {
        Some(value) => flow_control::compile(value, flow_control_on, &registry, &mut warnings)?,
        None => flow_control::Section {
            detector: None,
            compiled: flow_control_on.then(Default::default),
        },
    };
    let flow_control_detector = flow_section.detector;
    let profiles = raw.scheduling_profiles.filter(|list| !list.is_empty());
    let (mut profile, in_profile) = match (registry.disaggregation()?, profiles) {
        (Some((name, handler)), Some(list)) => {
            disaggregation::compile_profiles(name, handler, &list, &registry, &mut warnings)?
        }
        (Some((name, _)), None) => {
            return Err(ConfigError::invalid(
                "schedulingProfiles",
                format!("{name:?} needs the decode (and prefill) profiles; none is configured"),
            ))
        }
        (None, None) => (default_profile(&registry)?, HashSet::new()),
        (None, Some(list)) if list.len() > 1 => {
            return Err(ConfigError::invalid("schedulingProfiles", format!("{} profiles configured; the single-profile-handler runs exactly one (use disagg-profile-handler for prefill/decode profiles)", list.len())))
        }
        (None, Some(list)) => explicit_profile(0, &list[0], &registry)?,
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
    match saturation_detector(&registry, reference, &in_profile)? {
        Detector::Utilization(params) => profile.saturation_detector = params,
        Detector::Concurrency(params) => profile.concurrency_detector = Some(params),
    }
    profile.flow_control = flow_section.compiled;
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

/// Checks `featureGates` entries (`name`, `name=true`, `name=false`); whether `flowControl` is
/// on (the last entry naming it wins).
fn check_feature_gates(gates: &[String]) -> Result<bool, ConfigError> {
    let mut flow_control = false;
    for (i, gate) in gates.iter().enumerate() {
        let (name, enabled) = match gate.split_once('=') {
            None => (gate.as_str(), true),
            Some((name, "true")) => (name, true),
            Some((name, "false")) => (name, false),
            Some(_) => {
                return Err(ConfigError::invalid(
                    format!("featureGates[{i}]"),
                    format!("invalid entry {gate:?} (expected name, name=true or name=false)"),
                ))
            }
        };
        match name {
            "flowControl" => flow_control = enabled,
            "haPopulateNonLeaderDatastore" => {}
            other => {
                return Err(ConfigError::invalid(
                    format!("featureGates[{i}]"),
                    format!("unknown feature gate {other:?}"),
                ))
            }
        }
    }
    Ok(flow_control)
}

/// A configured saturation detector.
#[derive(Debug, Clone, PartialEq)]
enum Detector {
    Utilization(UtilizationParams),
    Concurrency(ConcurrencyParams),
}

impl Detector {
    /// The detector `plugin` is, if it is one.
    fn of(plugin: &Plugin) -> Option<Detector> {
        match plugin {
            Plugin::Detector(params) => Some(Detector::Utilization(params.clone())),
            Plugin::ConcurrencyDetector(params) => Some(Detector::Concurrency(*params)),
            _ => None,
        }
    }
}

/// The saturation detector. In order: the plugin `reference` names (a `(field, name)` pair);
/// else the plugin named `utilization-detector` (upstream's default reference); else the only
/// detector not used by the explicit profile (indexes in `in_profile`); else a
/// `utilization-detector` with the defaults. Two or more unreferenced detectors are an error.
fn saturation_detector(
    registry: &Registry,
    reference: Option<(&str, &str)>,
    in_profile: &HashSet<usize>,
) -> Result<Detector, ConfigError> {
    if let Some((at, name)) = reference {
        return registry.resolve_detector(at, name);
    }
    let by_default_name = registry
        .by_name
        .get(utilization_detector::TYPE)
        .map(|&index| &registry.plugins[index].plugin);
    if let Some(Plugin::Detector(params)) = by_default_name {
        return Ok(Detector::Utilization(params.clone()));
    }
    let mut unreferenced = registry.plugins.iter().filter_map(|named| {
        let detector = Detector::of(&named.plugin)?;
        (!in_profile.contains(&named.index)).then_some((named, detector))
    });
    let first = unreferenced.next();
    if let (Some((first, _)), Some((second, _))) = (first.as_ref(), unreferenced.next()) {
        return Err(ConfigError::invalid(format!("plugins[{}]", second.index), format!("a second saturation detector (first: {:?}) and no flowControl.saturationDetector.pluginRef to choose between them", first.name)));
    }
    Ok(first.map_or(
        Detector::Utilization(UtilizationParams::default()),
        |(_, d)| d,
    ))
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
fn default_profile(registry: &Registry) -> Result<Profile, ConfigError> {
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
                    return Err(ConfigError::invalid(format!("plugins[{}]", named.index), format!("a second picker (first: {:?}) and no schedulingProfiles to choose between them", first.name)));
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
        concurrency_detector: None,
        disaggregation: None,
        flow_control: None,
    })
}

/// The one configured profile; also returns the indexes of the plugins it uses.
fn explicit_profile(
    index: usize,
    raw: &RawProfile,
    registry: &Registry,
) -> Result<(Profile, HashSet<usize>), ConfigError> {
    if raw.name.is_empty() {
        return Err(ConfigError::invalid(
            format!("schedulingProfiles[{index}].name"),
            "must not be empty",
        ));
    }
    let mut used = HashSet::new();
    let mut filters = Vec::new();
    let mut scorers: Vec<WeightedScorer> = Vec::new();
    let mut picker: Option<(&str, PickerSpec)> = None;
    for (j, entry) in raw.plugins.iter().enumerate() {
        let at = format!("schedulingProfiles[{index}].plugins[{j}]");
        let named = registry.resolve(&format!("{at}.pluginRef"), &entry.plugin_ref)?;
        if let Some(filter) = as_filter(&named.plugin) {
            if used.contains(&named.index) {
                return Err(ConfigError::invalid(
                    format!("{at}.pluginRef"),
                    format!("plugin {:?} is already in this profile", named.name),
                ));
            }
            if entry.weight.is_some() {
                return Err(ConfigError::invalid(
                    format!("{at}.weight"),
                    format!(
                        "not allowed on filter {:?} (type {:?}); only scorers have weights",
                        named.name, named.plugin_type
                    ),
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
                    return Err(ConfigError::invalid(
                        format!("{at}.pluginRef"),
                        format!("plugin {:?} is already in this profile", named.name),
                    ));
                }
                let weight = entry.weight.unwrap_or(1.0);
                if !weight.is_finite() || weight < 0.0 {
                    return Err(ConfigError::invalid(
                        format!("{at}.weight"),
                        "must be a finite number of at least 0",
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
                    return Err(ConfigError::invalid(
                        format!("{at}.pluginRef"),
                        format!(
                            "the profile already has picker {first:?}; only one picker per profile"
                        ),
                    ));
                }
                picker = Some((&named.name, spec.clone()));
            }
            Plugin::ConcurrencyDetector(_) => {
                return Err(ConfigError::invalid(
                    format!("{at}.pluginRef"),
                    format!(
                        "plugin {:?}: a {} is used as the saturation detector only; as a profile filter it is not supported by wasm-epp yet",
                        named.name,
                        concurrency_detector::TYPE
                    ),
                ))
            }
            _ => {
                return Err(ConfigError::invalid(
                    format!("{at}.pluginRef"),
                    format!(
                        "plugin {:?} (type {:?}) is not a filter, scorer or picker",
                        named.name, named.plugin_type
                    ),
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
        concurrency_detector: None,
        disaggregation: None,
        flow_control: None,
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
fn check_data_layer(raw: RawDataLayer, registry: &Registry) -> Result<Option<Source>, ConfigError> {
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
            return Err(ConfigError::invalid(
                format!("dataLayer.{field}"),
                "not supported by wasm-epp yet",
            ));
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
        _ => Err(ConfigError::invalid(
            at,
            format!(
                "plugin {:?} has type {:?}; expected a discovery plugin (file-discovery)",
                named.name, named.plugin_type
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
