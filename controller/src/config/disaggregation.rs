//! Prefill/decode disaggregation in an EndpointPickerConfig: the `disagg-profile-handler`
//! plugin (nested `profiles` / `deciders` parameters, or the deprecated flat ones), its
//! deciders, and the compilation of the decode and prefill profiles into one decode profile
//! that carries the prefill stage ([`Disaggregation`]).

use std::collections::HashSet;

use serde::Deserialize;
use wasm_epp::scheduler::disaggregation::{Decider, Disaggregation, PrefixBasedParams};
use wasm_epp::scheduler::profile::Profile;

use super::plugins::{Params, Plugin};
use super::{explicit_profile, ConfigError, RawProfile, Registry};

/// A configured `disagg-profile-handler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handler {
    /// The decode profile's name (the primary profile: its pick is the destination).
    pub decode_profile: String,
    /// The prefill profile's name.
    pub prefill_profile: String,
    /// The plugin name of the prefill decider; `None` turns the prefill stage off.
    pub prefill_decider: Option<String>,
}

/// `profiles` of the handler.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ProfileNames {
    decode: Option<String>,
    prefill: Option<String>,
    /// Valid, and unused: without an encode decider (refused) the encode stage never runs.
    #[serde(rename = "encode")]
    _encode: Option<String>,
}

/// `deciders` of the handler.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DeciderNames {
    prefill: Option<String>,
    encode: Option<String>,
}

/// Parameters of `disagg-profile-handler`.
pub(super) const HANDLER_PARAMETERS: &[&str] = &[
    "profiles",
    "deciders",
    "stageOrder",
    "decodeProfile",
    "prefillProfile",
    "encodeProfile",
    "prefillDeciderPluginName",
    "encodeDeciderPluginName",
    "deciderPluginName",
];

/// Builds the handler from its parameters: the nested form (`profiles`, `deciders`) or the
/// deprecated flat one (`decodeProfile`, `prefillDeciderPluginName`, …), not both. The encode
/// stage and `stageOrder: prefill-first` are not implemented.
pub(super) fn handler(
    params: &Params<'_>,
    warnings: &mut Vec<String>,
) -> Result<Plugin, ConfigError> {
    let nested: &[&'static str] = &HANDLER_PARAMETERS[..3];
    let flat: &[&'static str] = &HANDLER_PARAMETERS[3..];
    let uses = |keys: &[&'static str]| -> Option<&'static str> {
        keys.iter().find(|k| params.value(k).is_some()).copied()
    };
    if let (Some(new), Some(old)) = (uses(nested), uses(flat)) {
        return Err(params.error(
            old,
            format!("cannot be combined with {new:?}; use the nested profiles/deciders form"),
        ));
    }
    let profiles: ProfileNames = params.get("profiles")?.unwrap_or_default();
    let deciders: DeciderNames = params.get("deciders")?.unwrap_or_default();
    if let Some(old) = uses(flat) {
        warnings.push(format!(
            "{}.{old}: deprecated; use profiles.* and deciders.*",
            params.at()
        ));
    }
    let flat_string = |key: &str| params.get::<String>(key);
    let encode_decider = match deciders.encode {
        Some(name) => Some(("deciders.encode", name)),
        None => flat_string("encodeDeciderPluginName")?.map(|n| ("encodeDeciderPluginName", n)),
    };
    if let Some((key, name)) = encode_decider.filter(|(_, name)| !name.is_empty()) {
        return Err(params.error(
            key,
            format!("{name:?}: the encode stage is not supported by wasm-epp yet"),
        ));
    }
    let ProfileNames {
        decode, prefill, ..
    } = profiles;
    // An encode profile's name is valid; without an encode decider it never runs.
    flat_string("encodeProfile")?;
    if let Some(order) = params.get::<String>("stageOrder")? {
        let normal: String = order
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        match normal.as_str() {
            "decodefirst" | "decode" => {}
            "prefillfirst" | "prefill" => {
                return Err(params.error(
                    "stageOrder",
                    format!("{order:?} is not supported by wasm-epp yet (only \"decode-first\")"),
                ))
            }
            _ => {
                return Err(params.error(
                    "stageOrder",
                    format!(
                        "unknown stage order {order:?} (expected decode-first or prefill-first)"
                    ),
                ))
            }
        }
    }
    let prefill_decider = match deciders.prefill {
        Some(name) => Some(name),
        None => match flat_string("prefillDeciderPluginName")? {
            Some(name) => Some(name),
            None => flat_string("deciderPluginName")?,
        },
    };
    Ok(Plugin::Disaggregation(Handler {
        decode_profile: decode
            .or(flat_string("decodeProfile")?)
            .unwrap_or_else(|| "decode".to_string()),
        prefill_profile: prefill
            .or(flat_string("prefillProfile")?)
            .unwrap_or_else(|| "prefill".to_string()),
        prefill_decider: prefill_decider.filter(|name| !name.is_empty()),
    }))
}

/// Builds `prefix-based-pd-decider` (`nonCachedTokens`, `promptTokens`; both default 0, and 0
/// `nonCachedTokens` never disaggregates).
pub(super) fn prefix_based_decider(params: &Params<'_>) -> Result<Plugin, ConfigError> {
    let mut decider = PrefixBasedParams::default();
    for (key, field) in [
        ("nonCachedTokens", &mut decider.non_cached_tokens),
        ("promptTokens", &mut decider.prompt_tokens),
    ] {
        if let Some(value) = params.get::<i64>(key)? {
            *field = u64::try_from(value).map_err(|_| params.error(key, "must not be negative"))?;
        }
    }
    Ok(Plugin::Decider(Decider::PrefixBased(decider)))
}

/// Compiles the profiles of a config whose profile handler is `handler` (the plugin named
/// `handler_name`): the decode profile, carrying the prefill profile and its decider when both
/// are configured. Returns it with the indexes of the plugins the two profiles use.
pub(super) fn compile_profiles(
    handler_name: &str,
    handler: &Handler,
    list: &[RawProfile],
    registry: &Registry,
    warnings: &mut Vec<String>,
) -> Result<(Profile, HashSet<usize>), ConfigError> {
    let mut seen = HashSet::new();
    for (i, raw) in list.iter().enumerate() {
        if !seen.insert(raw.name.as_str()) {
            return Err(ConfigError::invalid(
                format!("schedulingProfiles[{i}].name"),
                format!("duplicate profile name {:?}", raw.name),
            ));
        }
    }
    let position = |name: &str| list.iter().position(|raw| raw.name == name);
    let Some(decode_at) = position(&handler.decode_profile) else {
        return Err(ConfigError::invalid(
            "schedulingProfiles",
            format!(
                "no profile named {:?}, the decode profile of {handler_name:?}",
                handler.decode_profile
            ),
        ));
    };
    let (mut decode, mut used) = explicit_profile(decode_at, &list[decode_at], registry)?;
    let prefill_at = position(&handler.prefill_profile);
    let decider = match &handler.prefill_decider {
        Some(name) => {
            let at = format!("{handler_name}: deciders.prefill");
            let named = registry.resolve(&at, name)?;
            match &named.plugin {
                Plugin::Decider(decider) => Some(decider.clone()),
                _ => {
                    return Err(ConfigError::invalid(
                        at,
                        format!(
                            "plugin {name:?} has type {:?}; expected a decider (prefix-based-pd-decider, always-disagg-pd-decider)",
                            named.plugin_type
                        ),
                    ))
                }
            }
        }
        None => None,
    };
    match (prefill_at, decider) {
        (Some(at), Some(decider)) => {
            let (prefill, prefill_used) = explicit_profile(at, &list[at], registry)?;
            used.extend(prefill_used);
            decode.disaggregation = Some(Box::new(Disaggregation {
                prefill,
                decider,
                scoring_cache: Default::default(),
            }));
        }
        (Some(at), None) => warnings.push(format!(
            "schedulingProfiles[{at}]: profile {:?} never runs: {handler_name:?} has no prefill decider (deciders.prefill)",
            handler.prefill_profile
        )),
        (None, Some(_)) => warnings.push(format!(
            "{handler_name:?}: no profile named {:?}; requests are never disaggregated",
            handler.prefill_profile
        )),
        (None, None) => {}
    }
    for (i, raw) in list.iter().enumerate() {
        if Some(i) != prefill_at && i != decode_at {
            warnings.push(format!(
                "schedulingProfiles[{i}]: profile {:?} is not run by {handler_name:?} (it runs {:?} and {:?})",
                raw.name, handler.decode_profile, handler.prefill_profile
            ));
        }
    }
    Ok((decode, used))
}

#[cfg(test)]
mod tests {
    use super::super::{parse, PickerConfig};
    use wasm_epp::scheduler::disaggregation::{Decider, PrefixBasedParams};
    use wasm_epp::scheduler::profile::FilterSpec;

    /// Upstream's P/D example (`deploy/config/pd-epp-config.yaml` in llm-d's router), with the
    /// handler parameters given as `handler`.
    fn upstream_example(handler: &str) -> String {
        format!(
            "apiVersion: llm-d.ai/v1alpha1\n\
             kind: EndpointPickerConfig\n\
             plugins:\n\
             - type: approx-prefix-cache-producer\n  parameters: {{maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}}\n\
             - type: prefix-cache-scorer\n\
             - type: queue-scorer\n\
             - type: prefill-filter\n\
             - type: decode-filter\n\
             - type: max-score-picker\n\
             - type: disagg-profile-handler\n  parameters: {handler}\n\
             - type: prefix-based-pd-decider\n  parameters: {{nonCachedTokens: 16}}\n\
             schedulingProfiles:\n\
             - name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n  - pluginRef: max-score-picker\n  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n    weight: 1\n\
             - name: decode\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n    weight: 1\n"
        )
    }

    fn compile(text: &str) -> Result<PickerConfig, String> {
        parse(text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_upstream_example_compiles_to_a_decode_profile_with_a_prefill_stage() {
        let config = compile(&upstream_example(
            "{deciders: {prefill: prefix-based-pd-decider}}",
        ))
        .unwrap();
        let decode = &config.profile;
        assert_eq!(decode.name, "decode");
        assert_eq!(decode.filters, [FilterSpec::Decode]);
        let stage = decode.disaggregation.as_deref().expect("a prefill stage");
        assert_eq!(stage.prefill.name, "prefill");
        assert_eq!(stage.prefill.filters, [FilterSpec::Prefill]);
        assert_eq!(stage.prefill.scorers.len(), 2);
        assert_eq!(
            stage.decider,
            Decider::PrefixBased(PrefixBasedParams {
                non_cached_tokens: 16,
                prompt_tokens: 0,
            })
        );
        // The one warning is about the producer's lruCapacityPerServer (see the README).
        assert!(
            config
                .warnings
                .iter()
                .all(|w| w.contains("lruCapacityPerServer")),
            "{:?}",
            config.warnings
        );
        let summary = super::super::profile_summary(decode);
        assert!(
            summary.contains("prefill stage by prefix-based-pd-decider: profile \"prefill\""),
            "{summary}"
        );
    }

    #[test]
    fn the_deprecated_flat_parameters_still_work_with_a_warning() {
        let config = compile(&upstream_example(
            "{decodeProfile: decode, prefillProfile: prefill, deciderPluginName: prefix-based-pd-decider}",
        ))
        .unwrap();
        assert!(config.profile.disaggregation.is_some());
        assert!(
            config.warnings.iter().any(|w| w.contains("deprecated")),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn without_a_prefill_decider_nothing_is_disaggregated() {
        let config = compile(&upstream_example("{}")).unwrap();
        assert_eq!(config.profile.name, "decode");
        assert!(config.profile.disaggregation.is_none());
        assert!(
            config.warnings.iter().any(|w| w.contains("never runs")),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn errors_name_the_field() {
        let example = upstream_example("{deciders: {prefill: prefix-based-pd-decider}}");
        for (text, expected) in [
            (
                upstream_example("{deciders: {prefill: queue-scorer}}"),
                "disagg-profile-handler: deciders.prefill: plugin \"queue-scorer\" has type \"queue-scorer\"; expected a decider",
            ),
            (
                upstream_example("{deciders: {prefill: nope}}"),
                "disagg-profile-handler: deciders.prefill: no plugin named \"nope\"",
            ),
            (
                upstream_example("{profiles: {decode: main}}"),
                "schedulingProfiles: no profile named \"main\", the decode profile of \"disagg-profile-handler\"",
            ),
            (
                upstream_example("{deciders: {encode: prefix-based-pd-decider}}"),
                "plugins[6].parameters.deciders.encode: \"prefix-based-pd-decider\": the encode stage is not supported by wasm-epp yet",
            ),
            (
                upstream_example("{stageOrder: prefill-first}"),
                "plugins[6].parameters.stageOrder: \"prefill-first\" is not supported by wasm-epp yet",
            ),
            (
                upstream_example("{profiles: {decode: decode}, decodeProfile: decode}"),
                "plugins[6].parameters.decodeProfile: cannot be combined with \"profiles\"",
            ),
            (
                example.replace("{nonCachedTokens: 16}", "{nonCachedTokens: -1}"),
                "plugins[7].parameters.nonCachedTokens: must not be negative",
            ),
            (
                example.replace("- type: max-score-picker\n", "- type: max-score-picker\n- type: single-profile-handler\n"),
                "plugins[7].type: a second profile handler (first: \"single-profile-handler\")",
            ),
            (
                example.replace("- type: disagg-profile-handler\n  parameters: {deciders: {prefill: prefix-based-pd-decider}}\n", ""),
                "schedulingProfiles: 2 profiles configured; the single-profile-handler runs exactly one",
            ),
            (
                example.replace("- name: decode\n", "- name: prefill\n"),
                "schedulingProfiles[1].name: duplicate profile name \"prefill\"",
            ),
        ] {
            let got = compile(&text).unwrap_err();
            assert!(got.starts_with(expected), "got: {got}\nwant: {expected}");
        }
    }
}
