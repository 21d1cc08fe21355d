//! Every Wasm plugin configuration the project ships — in the Envoy configurations of `envoy/`,
//! in the ConfigMaps of `examples/`, and in the Envoy Gateway EnvoyExtensionPolicy — parsed by
//! the filter's real parser, in the role its place gives it: a bootstrap extension is the
//! snapshot poller, an HTTP filter (or an EnvoyExtensionPolicy entry) the filter. And the
//! shipped Envoy configurations are their templates rendered with the default values.

mod common;

use std::path::PathBuf;

use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp::plugin_config::PluginConfig;

use common::{render_template, repo, template_defaults};

/// Files holding Envoy configurations or Kubernetes manifests.
const DIRS: [&str; 5] = [
    "envoy",
    "examples/envoy-gateway",
    "examples/sidecar",
    "examples/plain-envoy",
    "examples/kind",
];

/// Which role a configuration's place gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Filter,
    Poller,
}

/// One plugin configuration found in the tree.
#[derive(Debug)]
struct Found {
    place: String,
    role: Role,
    json: String,
}

fn yaml_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files = Vec::new();
    for dir in DIRS {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Walks `value`; `place` is its path, `in_bootstrap` whether it sits under
/// `bootstrap_extensions`. Strings that are YAML documents (ConfigMap data) are walked too.
fn walk(value: &Value, place: &str, in_bootstrap: bool, found: &mut Vec<Found>) {
    match value {
        Value::Mapping(map) => {
            let configuration = &value["configuration"];
            if !value["vm_config"].is_null() && !configuration.is_null() {
                let role = if in_bootstrap {
                    Role::Poller
                } else {
                    Role::Filter
                };
                let json = configuration["value"].as_str().unwrap_or_else(|| {
                    panic!("{place}.configuration: no StringValue `value`: {configuration:?}")
                });
                found.push(Found {
                    place: format!("{place}.configuration"),
                    role,
                    json: json.to_string(),
                });
            }
            // An EnvoyExtensionPolicy's entries carry the filter configuration as an object.
            if value["kind"] == "EnvoyExtensionPolicy" {
                let entries = value["spec"]["wasm"].as_sequence();
                for (i, entry) in entries.into_iter().flatten().enumerate() {
                    found.push(Found {
                        place: format!("{place}.spec.wasm[{i}].config"),
                        role: Role::Filter,
                        json: serde_json::to_string(&entry["config"]).unwrap(),
                    });
                }
            }
            for (key, child) in map {
                let key = key.as_str().unwrap_or("?");
                let bootstrap = in_bootstrap || key == "bootstrap_extensions";
                walk(child, &format!("{place}.{key}"), bootstrap, found);
            }
        }
        Value::Sequence(items) => {
            for (i, child) in items.iter().enumerate() {
                walk(child, &format!("{place}[{i}]"), in_bootstrap, found);
            }
        }
        Value::String(text) if text.contains('\n') => {
            if let Ok(inner @ Value::Mapping(_)) = serde_yaml::from_str::<Value>(text) {
                walk(&inner, place, false, found);
            }
        }
        _ => {}
    }
}

fn shipped_configurations() -> Vec<Found> {
    let mut found = Vec::new();
    for file in yaml_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for (n, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{name}: document {}: {e}", n + 1));
            walk(&value, &format!("{name}#{}", n + 1), false, &mut found);
        }
    }
    found
}

#[test]
fn every_shipped_plugin_configuration_parses_in_its_role() {
    let found = shipped_configurations();
    let pollers = found.iter().filter(|f| f.role == Role::Poller).count();
    let filters = found.len() - pollers;
    // envoy.yaml, envoy-fallbacks.yaml, the sidecar and the plain-Envoy example each have a
    // poller and a filter; the rendered Envoy Gateway config and the policy a filter each.
    assert!(
        pollers >= 4 && filters >= 6,
        "found {pollers} pollers, {filters} filters: {found:#?}"
    );
    for f in &found {
        match (PluginConfig::parse(f.json.as_bytes()), f.role) {
            (Ok(PluginConfig::Filter(_)), Role::Filter)
            | (Ok(PluginConfig::Poller(_)), Role::Poller) => {}
            (Ok(other), role) => panic!("{}: parses as {other:?}, expected a {role:?}", f.place),
            (Err(e), _) => panic!("{}: the filter rejects {}: {e}", f.place, f.json),
        }
    }
}

#[test]
fn a_misspelt_key_in_a_shipped_configuration_is_rejected() {
    // The parser refuses what the examples must not contain, so the test above can fail.
    for f in shipped_configurations() {
        let mut value: serde_json::Value = serde_json::from_str(&f.json).unwrap();
        value
            .as_object_mut()
            .unwrap()
            .insert("failopen".into(), true.into());
        let err = PluginConfig::parse(value.to_string().as_bytes())
            .expect_err("a misspelt key was accepted");
        assert!(err.contains("failopen"), "{}: {err}", f.place);
    }
}

/// The first line of every rendered, shipped Envoy configuration.
fn rendered_header(name: &str) -> String {
    format!(
        "# Rendered from envoy/{name}.template with envoy/template-defaults.json: edit those, then run\n\
         # `WASM_EPP_BLESS=1 cargo test -p wasm-epp --test examples` to write this file.\n"
    )
}

#[test]
fn shipped_envoy_configs_are_their_templates_rendered() {
    // The tests and the benchmark fill the same templates with their own ports and settings.
    for name in [
        "envoy.yaml",
        "envoy-fallbacks.yaml",
        "envoy-gateway-rendered.yaml",
    ] {
        let rendered = rendered_header(name) + &render_template(name, &template_defaults(name));
        let shipped_path = repo().join("envoy").join(name);
        if std::env::var_os("WASM_EPP_BLESS").is_some() {
            std::fs::write(&shipped_path, &rendered).unwrap();
        }
        let shipped = std::fs::read_to_string(&shipped_path).unwrap();
        assert!(
            shipped == rendered,
            "envoy/{name} is not envoy/{name}.template rendered with its defaults; edit the \
             template and run `WASM_EPP_BLESS=1 cargo test -p wasm-epp --test examples`"
        );
    }
}
